-- reserve.lua: settle expired leases, then apply_reserve() to up to limit due messages,
-- earliest due first, FIFO (by seq) among equal due times, each leased until ceil + lease_ms.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: limit (0 only looks); ARGV[2]: lease_ms; ARGV[3]: a random token base (unique
-- per call); ARGV[4], ARGV[5] (optional, sharded queues): a due time and a seq: claim only
-- messages before them in (due, seq) order. ARGV[6] (optional, a reserve that fires
-- ahead; ARGV[4], ARGV[5] then a bound or empty): ahead_ms: when nothing is due, the
-- messages of the earliest due time, if it is at most ahead_ms after now (and not after
-- the bound), are claimed (up to limit), each leased until its due + lease_ms (the
-- holder hands it over at its due time).
-- Returns {now_ms, now_us, next_event or false, next_seq or false, lease_until or false,
-- claimed...}: next_event is the earliest due time or lease expiry (epoch ms) left after
-- the claim, now_us the microseconds past now_ms, next_seq the seq of the first due
-- message when it is due at next_event (the tie-break across shards; false: next_event
-- is a lease expiry, which a reserve that fires ahead waits for itself, not ahead_ms
-- before), lease_until the lease expiry of every claimed message (false when they were
-- claimed ahead: each one's due + lease_ms). Then CLAIMED values per claimed message,
-- flat: id, payload, enc or false, due, seq, attempts, max, headers or false, err or
-- false; its state is active and its lease token the token base .. its position among
-- the claimed (1, 2...): what the client knows it need not read (reply() has it all).
local now, ceil, us = clock()
settle_expired(now)
local lease_ms, token = tonumber(ARGV[2]), ARGV[3]
local ahead = tonumber(ARGV[6] or '0') or 0
-- The bound's seq only matters at its own due time: a bound due after now takes all due.
local high, edge, upto = now, nil, nil
if ARGV[4] and ARGV[4] ~= '' and tonumber(ARGV[4]) <= now then
  high, edge, upto = tonumber(ARGV[4]), struct.pack('>I8', tonumber(ARGV[5])), ARGV[4]
end
local scored = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', upto or text(now), 'WITHSCORES', 'LIMIT',
  '0', ARGV[1])
local members, dues = {}, {}
-- Each score read as a number once for a run of messages that share it.
local last, score = false, false
for i = 1, #scored, 2 do
  local member = scored[i]
  if scored[i + 1] ~= last then last, score = scored[i + 1], tonumber(scored[i + 1]) end
  if edge and (score > high or (score == high and string.sub(member, 1, 8) > edge)) then break end
  members[#members + 1], dues[#dues + 1] = member, score
end
local held = false  -- claimed ahead: leased from the due time
if #members == 0 and ahead > 0 then
  local d = redis.call('ZRANGE', K_DUE, '0', '0', 'WITHSCORES')
  local at, bound = tonumber(d[2] or ''), tonumber(ARGV[4] or '')
  if at and at <= now + ahead and not (bound and bound < at) then
    local last = nil
    if bound == at then last = struct.pack('>I8', tonumber(ARGV[5])) end
    scored = redis.call('ZRANGEBYSCORE', K_DUE, d[2], d[2], 'WITHSCORES', 'LIMIT', '0', ARGV[1])
    for i = 1, #scored, 2 do
      if last and string.sub(scored[i], 1, 8) > last then break end
      members[#members + 1], dues[#dues + 1] = scored[i], at
    end
    held = true
  end
end
local out = {now, us, false, false, false}
local function head()
  local d
  out[3], d = next_event()
  if d[2] and tonumber(d[2]) == out[3] then out[4] = struct.unpack('>I8', d[1]) end
end
if #members == 0 then
  head()
  return out
end
remove_all(K_DUE, 'ZREM', members)
local ids = {}
for i, member in ipairs(members) do ids[i] = string.sub(member, 9) end
-- Read in one HMGET and written in one HSET and one ZADD (per CHUNK), not one of each
-- per message (measured: a few percent less server time for a claim of 100; decoding,
-- packing and the reply take most of it).
local records, claimed = load_all(ids, dues), {}
if not held then out[5] = ceil + lease_ms end
for i = 1, #ids do
  local r = records[i]
  if r then  -- always: an index entry without its record is dropped (it was removed)
    r.state, r.attempts = ACTIVE, r.attempts + 1
    local k = #claimed + 1
    local position = POSITIONS[k]
    if not position then
      position = text(k)
      POSITIONS[k] = position
    end
    r.lease, r.lease_until = token .. position, ceil + lease_ms
    if held then r.lease_until = dues[i] + lease_ms end
    claimed[k] = r
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] =
      r.id, r.payload, r.enc or false, r.due, r.seq
    out[n + 6], out[n + 7], out[n + 8], out[n + 9] =
      r.attempts, r.max, r.headers or false, r.err or false
  end
end
store_all(claimed)
-- Pass the baton: another consumer learns of what is left and of the new leases.
wake()
head()
return out
