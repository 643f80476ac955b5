-- put.lua: apply_put() for a batch of requests, all or nothing.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: n, the number of requests; then 8 values per request:
--   id, on_conflict ('i' ignore, 'r' replace, 'e' error; 'n' in the uniform form: ids
--   the client drew, read as 'i' and not looked up), delay_ms or '', at_ms or '',
--   max_attempts, encoding ('' for json), headers (JSON or ''), payload. Or, the uniform
--   form of a batch whose requests share all but their id and payload: ARGV[1] is -n,
--   then the six shared values once (on_conflict, delay_ms or '', at_ms or '',
--   max_attempts, encoding, headers), then id and payload per request; when the shared
--   delay_ms and at_ms are both '*', each request carries its own: id, delay_ms or '',
--   at_ms or '', payload per request. Then, optional
--   (sharded queues): 'c' to only check the batch (write nothing, return {0, 0} or the
--   error), or 's' followed by one seq per request (given by the client's queue-wide
--   counter instead of this shard's), then optionally 'x': each request's at_ms is its
--   exact due time, resolved by the client against one now of the whole batch
--   (take_seqs.lua), kept as is even when it is before this shard's now (the message
--   is due at once; only ordering and the lag see it).
-- Returns {0, woke, kept...} when stored (woke: 1 if the marker was pushed, else 0; kept:
-- the 0-based positions, ascending, of the requests that kept an existing message, where
-- apply_put() returns None: 'i' of a stored id or of one an earlier request stored; none
-- in check mode); {1, id} when id exists and on_conflict is 'e'; {2, id} when 'r' would
-- replace a message in flight. Nothing is written unless it returns {0, woke, ...}.
local now, ceil = clock()
local n = tonumber(ARGV[1])
local uniform = n < 0
if uniform then n = -n end
-- Request i (from 0): its id is ARGV[at(i)], its payload ARGV[at(i) + PAYLOAD] and its
-- other values ARGV[opts(i) + 1] (on_conflict) to ARGV[opts(i) + 6] (headers).
-- Its delay_ms and at_ms are ARGV[due_at(i)] and ARGV[due_at(i) + 1].
local ID, STRIDE, PAYLOAD = 2, 8, 7
local own_due = uniform and ARGV[3] == '*' and ARGV[4] == '*'
if own_due then
  ID, STRIDE, PAYLOAD = 8, 4, 3
elseif uniform then
  ID, STRIDE, PAYLOAD = 8, 2, 1
end
local function at(i) return ID + i * STRIDE end
local function opts(i)
  if uniform then return 1 end
  return 2 + i * 8
end
local function due_at(i)
  if own_due then return at(i) + 1 end
  return opts(i) + 2
end
local tail = at(n)
local mode = ARGV[tail] or ''
local exact = mode == 's' and ARGV[tail + 1 + n] == 'x'
-- The positions of the kept requests, appended to the reply {0, woke}.
local kept = {}
local function with_kept(reply)
  for k = 1, #kept do reply[k + 2] = kept[k] end
  return reply
end
-- Every request of the batch on_conflict 'i', not sharded (mode '').
local function all_ignore()
  if mode ~= '' then return false end
  for i = 0, n - 1 do
    local c = ARGV[opts(i) + 1]
    if c ~= 'i' and c ~= 'n' then return false end
  end
  return true
end

-- The common batch, all 'i': what the two passes below do, without staging a record. A
-- request is stored when its id is neither stored (one HMGET per CHUNK requests) nor
-- taken by an earlier request of the batch; every other is ignored. Seqs as below: one
-- per request, in order, taken only when something is stored. A uniform batch whose ids
-- the client drew (on_conflict 'n': delayq._fork.new_id, which no stored message and no
-- other request has) stores every request without looking. Each chunk is written as
-- soon as it is built (its tables then hold the next one), after known_before().
if all_ignore() then
  local fresh = uniform and ARGV[2] == 'n'
  local base, earliest, count = false, false, 0
  local seen, records, entries = {}, {}, {}
  -- Scores as text, formatted once per distinct due time (most batches share one):
  -- redis.call() would format each number itself, and with digits to spare.
  local last_due, last_score = false, false
  -- What the uniform form shares, worked out once rather than per request: the due time
  -- (unless each has its own), and the record's flags byte and its bytes after the seq
  -- (pack_new() of seq 0, whose cmsgpack is the one byte 0: cmsgpack.pack of several
  -- values is their packs end to end).
  local shared_due = uniform and not own_due and resolve_due(ARGV[3], ARGV[4], now, ceil)
  local flags, after_seq = false, false
  if uniform then
    local zero = pack_new(0, tonumber(ARGV[5]), ARGV[6], ARGV[7], '')
    flags, after_seq = string.sub(zero, 1, 1), string.sub(zero, 3)
  end
  -- A seq's bytes, cmsgpack.pack(seq) in the record and struct.pack('>I8', seq) in its
  -- entry, both end with seq % 256, and from seq 256 on, the bytes before it are the
  -- same for the 256 seqs from a multiple of 256 (cmsgpack's forms change at 2^8, 2^16
  -- and 2^32): they are packed once per 256 seqs, and the last byte is one of CHARS.
  local block, mp_head, be_head = -1, false, false
  if fresh then base = redis.call('INCRBY', K_SEQ, n) - n end
  local pending, before = known_before()
  for first = 0, n - 1, CHUNK do
    local last = math.min(first + CHUNK, n) - 1
    local found = false
    count = 0
    if not fresh then
      local ids = {}
      for i = first, last do ids[i - first + 1] = ARGV[ID + i * STRIDE] end
      found = redis.call('HMGET', K_MSG, unpack(ids))
    end
    for i = first, last do
      local a = ID + i * STRIDE
      local id = ARGV[a]
      if fresh or not (found[i - first + 1] or seen[id]) then
        if not fresh then
          seen[id] = true
          if not base then base = redis.call('INCRBY', K_SEQ, n) - n end
        end
        local seq, due, payload = base + i + 1, shared_due, ARGV[a + PAYLOAD]
        if not due then
          local d = due_at(i)
          due = resolve_due(ARGV[d], ARGV[d + 1], now, ceil)
        end
        local low = seq % 256
        if seq - low ~= block or seq < 256 then
          block = seq - low
          mp_head = string.sub(cmsgpack.pack(seq), 1, -2)
          be_head = string.sub(struct.pack('>I8', seq), 1, -2)
        end
        local char = CHARS[low]
        if not char then
          char = string.char(low)
          CHARS[low] = char
        end
        records[count + 1] = id
        if after_seq then
          records[count + 2] = flags .. mp_head .. char .. after_seq .. payload
        else
          local o = opts(i)
          records[count + 2] = pack_new(seq, tonumber(ARGV[o + 4]), ARGV[o + 5], ARGV[o + 6],
            payload)
        end
        if due ~= last_due then last_due, last_score = due, string.format('%d', due) end
        entries[count + 1], entries[count + 2] = last_score, be_head .. char .. id
        count = count + 2
        if not earliest or due < earliest then earliest = due end
      else
        kept[#kept + 1] = i
      end
    end
    if count > 0 then
      redis.call('HSET', K_MSG, unpack(records, 1, count))
      redis.call('ZADD', K_DUE, unpack(entries, 1, count))
    end
  end
  if not base then return with_kept({0, 0}) end
  return with_kept(announce(earliest, pending, before))
end

-- Which ids exist, one HMGET per CHUNK requests: only those are loaded.
local exists = {}
for first = 0, n - 1, CHUNK do
  local ids = {}
  for i = first, math.min(first + CHUNK, n) - 1 do ids[#ids + 1] = ARGV[at(i)] end
  local found = redis.call('HMGET', K_MSG, unpack(ids))
  for j = 1, #ids do
    if found[j] then exists[ids[j]] = true end
  end
end
local staged, original, order = {}, {}, {}
-- First pass: decide every request (later ones see earlier ones), write nothing.
for i = 0, n - 1 do
  local b = opts(i)
  local id, mode = ARGV[at(i)], ARGV[b + 1]
  local current = staged[id]
  if current == nil then
    current = exists[id] and load(id) or false
    original[id] = current
    staged[id] = current
  end
  local keep = false
  if current then
    local settled = settle(current, now)
    if mode == 'i' or mode == 'n' then
      keep = true
      kept[#kept + 1] = i
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
    local d = due_at(i)
    if exact then
      due = tonumber(ARGV[d + 1])
    else
      due = resolve_due(ARGV[d], ARGV[d + 1], now, ceil)
    end
    staged[id] = {id = id, state = SCHEDULED, due = due, index = i, attempts = 0,
      max = tonumber(ARGV[b + 4]), enc = enc, headers = headers, payload = ARGV[at(i) + PAYLOAD],
      fresh = true}
  end
end
if mode == 'c' then return {0, 0} end
if #order == 0 then return with_kept({0, 0}) end
-- Second pass: one seq per request, as if each had taken the next one; the records and
-- index entries are written in chunks (store() one by one, batched).
local base = 0
if mode ~= 's' then base = redis.call('INCRBY', K_SEQ, n) - n end
local pending, before = known_before()
local earliest, last_due, last_score = false, false, false
local records, entries = {}, {}
for _, id in ipairs(order) do
  local r = staged[id]
  if mode == 's' then r.seq = tonumber(ARGV[tail + 1 + r.index]) else r.seq = base + r.index + 1 end
  r.index, r.fresh = nil, nil
  if original[id] then unindex(original[id]) end
  records[#records + 1], records[#records + 2] = id, pack(r)
  if r.due ~= last_due then last_due, last_score = r.due, string.format('%d', r.due) end
  entries[#entries + 1], entries[#entries + 2] = last_score, due_member(r.seq, id)
  if not earliest or r.due < earliest then earliest = r.due end
end
add_all(K_MSG, 'HSET', records)
add_all(K_DUE, 'ZADD', entries)
return with_kept(announce(earliest, pending, before))
