-- ack_many.lua: apply_ack_many(): apply_ack() for each (id, token) pair, in order, in one
-- script: a held message is deleted; any other pair changes nothing and is reported.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: id1, token1, id2, token2, ...
-- Returns the positions (1-based pair numbers) of the pairs whose lease was lost, in
-- order; an empty list when all were acked. An id acked earlier in the same call is gone,
-- so a duplicate pair is lost. Settling an expired lease on the way wakes as ack.lua does.
local now = clock()
local ids = {}
for i = 1, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
-- Read in one HMGET (per CHUNK) and deleted in one HDEL at the end; a record under an
-- unexpired lease is not decoded (held_stored()). An id met again is read again, as the
-- earlier pair may have settled it; if the earlier pair acked it, it is gone for this
-- one.
local raws = read_all(ids)
local lost, acked, met = {}, {}, {}
for n, id in ipairs(ids) do
  local ok = false
  if met[id] == nil then
    ok = held_stored(id, raws[n], ARGV[2 * n], now)
  elseif met[id] == false then
    ok = held(load_settled(id, now), ARGV[2 * n])
  end
  if ok then
    acked[#acked + 1] = id
    met[id] = true
  else
    lost[#lost + 1] = n
    if met[id] == nil then met[id] = false end
  end
end
if #acked > 0 then
  remove_all(K_MSG, 'HDEL', acked)
  remove_all(K_LEASE, 'ZREM', acked)
end
return lost
