-- reserve.lua: settle expired leases, then apply_reserve() to up to limit due messages,
-- earliest due first, FIFO (by seq) among equal due times, each leased until ceil + lease_ms.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: limit; ARGV[2]: lease_ms; ARGV[3]: a random token base (unique per call).
-- Returns {now_ms, now_us, next_event or false, record...}: next_event (the earliest
-- due time or lease expiry, epoch ms) only when nothing was claimed.
local now, ceil, us = clock()
settle_expired(now)
local limit, lease_ms, token = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local members = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', now, 'LIMIT', 0, limit)
local out = {now, us, false}
if #members == 0 then
  out[3] = next_event()
  return out
end
remove_all(K_DUE, 'ZREM', members)
for i, member in ipairs(members) do
  local r = load(string.sub(member, 9))
  r.state, r.attempts = ACTIVE, r.attempts + 1
  r.lease, r.lease_until = token .. i, ceil + lease_ms
  store(r)
  out[#out + 1] = reply(r, now, true)
end
-- Pass the baton: another consumer learns of what is left and of the new leases.
wake()
return out
