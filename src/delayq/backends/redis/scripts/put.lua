-- put.lua: apply_put() for a batch of requests, all or nothing.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: n, the number of requests; then 8 values per request:
--   id, on_conflict ('i' ignore, 'r' replace, 'e' error), delay_ms or '', at_ms or '',
--   max_attempts, encoding ('' for json), headers (JSON or ''), payload; then, optional
--   (sharded queues): 'c' to only check the batch (write nothing, return {0, 0} or the
--   error), or 's' followed by one seq per request (given by the client's queue-wide
--   counter instead of this shard's), then optionally 'x': each request's at_ms is its
--   exact due time, resolved by the client against one now of the whole batch
--   (take_seqs.lua), kept as is even when it is before this shard's now (the message
--   is due at once; only ordering and the lag see it).
-- Returns {0, woke} when stored (woke: 1 if the marker was pushed, else 0); {1, id} when
-- id exists and on_conflict is 'e'; {2, id} when 'r' would replace a message in flight.
-- Nothing is written unless it returns {0, woke}.
local now, ceil = clock()
local n = tonumber(ARGV[1])
local mode = ARGV[2 + n * 8] or ''
local exact = mode == 's' and ARGV[3 + n * 9] == 'x'
-- Whether anything is due before `earliest` that waiting consumers know of: a marker
-- that waits for them already, else the earliest due time or lease expiry (see below).
local function known_before()
  if redis.call('LLEN', K_WAKE) > 0 then return true, true end
  return false, next_event()
end

-- Push the marker when `earliest` comes before every event a consumer may sleep until.
local function announce(earliest, pending, before)
  if pending then return {0, 1} end
  if not before or earliest < before then
    redis.call('RPUSH', K_WAKE, 1)
    return {0, 1}
  end
  return {0, 0}
end

-- The common case, one request with on_conflict 'i': HSETNX stores it only if the id is
-- free, so no separate look-up (a seq taken for an id that exists is skipped: harmless).
if n == 1 and ARGV[3] == 'i' and mode == '' then
  local id, enc, headers = ARGV[2], ARGV[7], ARGV[8]
  if enc == '' then enc = nil end
  if headers == '' then headers = nil end
  local r = {id = id, state = SCHEDULED, seq = redis.call('INCR', K_SEQ), attempts = 0,
    max = tonumber(ARGV[6]), enc = enc, headers = headers, payload = ARGV[9],
    due = resolve_due(ARGV[4], ARGV[5], now, ceil)}
  if redis.call('HSETNX', K_MSG, id, pack(r)) == 0 then return {0, 0} end
  local pending, before = known_before()
  redis.call('ZADD', K_DUE, r.due, due_member(r.seq, id))
  return announce(r.due, pending, before)
end

-- Which ids exist, one HMGET per CHUNK requests: only those are loaded.
local exists = {}
for first = 0, n - 1, CHUNK do
  local ids = {}
  for i = first, math.min(first + CHUNK, n) - 1 do ids[#ids + 1] = ARGV[2 + i * 8] end
  local found = redis.call('HMGET', K_MSG, unpack(ids))
  for j = 1, #ids do
    if found[j] then exists[ids[j]] = true end
  end
end
local staged, original, order = {}, {}, {}
-- First pass: decide every request (later ones see earlier ones), write nothing.
for i = 0, n - 1 do
  local b = 2 + i * 8
  local id, mode = ARGV[b], ARGV[b + 1]
  local current = staged[id]
  if current == nil then
    current = exists[id] and load(id) or false
    original[id] = current
    staged[id] = current
  end
  local keep = false
  if current then
    local settled = settle(current, now)
    if mode == 'i' then
      keep = true
    elseif mode == 'e' then
      return {1, id}
    elseif settled.state == ACTIVE then
      return {2, id}
    end
  end
  if not keep then
    local headers, enc = ARGV[b + 6], ARGV[b + 5]
    if headers == '' then headers = nil end
    if enc == '' then enc = nil end
    if current == false or current.fresh == nil then order[#order + 1] = id end
    local due
    if exact then
      due = tonumber(ARGV[b + 3])
    else
      due = resolve_due(ARGV[b + 2], ARGV[b + 3], now, ceil)
    end
    staged[id] = {id = id, state = SCHEDULED, due = due, index = i, attempts = 0,
      max = tonumber(ARGV[b + 4]), enc = enc, headers = headers, payload = ARGV[b + 7],
      fresh = true}
  end
end
if #order == 0 or mode == 'c' then return {0, 0} end
-- Second pass: one seq per request, as if each had taken the next one; the records and
-- index entries are written in chunks (store() one by one, batched).
local base = 0
if mode ~= 's' then base = redis.call('INCRBY', K_SEQ, n) - n end
local pending, before = known_before()
local earliest = false
local records, entries = {}, {}
for _, id in ipairs(order) do
  local r = staged[id]
  if mode == 's' then r.seq = tonumber(ARGV[3 + n * 8 + r.index]) else r.seq = base + r.index + 1 end
  r.index, r.fresh = nil, nil
  if original[id] then unindex(original[id]) end
  records[#records + 1], records[#records + 2] = id, pack(r)
  entries[#entries + 1], entries[#entries + 2] = r.due, due_member(r.seq, id)
  if not earliest or r.due < earliest then earliest = r.due end
end
add_all(K_MSG, 'HSET', records)
add_all(K_DUE, 'ZADD', entries)
return announce(earliest, pending, before)
