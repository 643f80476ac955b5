-- ack_many.lua: apply_ack_many(): apply_ack() for each (id, token) pair, in order, in one
-- script: a held message is deleted; any other pair changes nothing and is reported.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: id1, token1, id2, token2, ...
-- Returns the positions (1-based pair numbers) of the pairs whose lease was lost, in
-- order; an empty list when all were acked. An id acked earlier in the same call is gone,
-- so a duplicate pair is lost. Settling an expired lease on the way wakes as ack.lua does.
local now = clock()
local lost, acked = {}, {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local r = load_settled(id, now)
  if held(r, ARGV[i + 1]) then
    redis.call('HDEL', K_MSG, id)
    acked[#acked + 1] = id
  else
    lost[#lost + 1] = (i + 1) / 2
  end
end
if #acked > 0 then remove_all(K_LEASE, 'ZREM', acked) end
return lost
