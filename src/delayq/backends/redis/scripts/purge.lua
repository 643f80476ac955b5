-- purge.lua: delete every message in one observed state (or all), after settling
-- expired leases; purged leases become stale. Purging all deletes every key of the queue.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: '' (all), 'scheduled', 'ready', 'active' or 'dead'.
-- Returns how many messages were deleted.
local now = clock()
settle_expired(now)
local state = ARGV[1]
if state == '' then
  local n = redis.call('HLEN', K_MSG)
  redis.call('DEL', K_MSG, K_DUE, K_LEASE, K_DEAD, K_SEQ, K_WAKE)
  return n
end
local ids = {}
if state == 'scheduled' or state == 'ready' then
  local low, high = '(' .. now, '+inf'
  if state == 'ready' then low, high = '-inf', now end
  local members = redis.call('ZRANGEBYSCORE', K_DUE, low, high)
  for i, member in ipairs(members) do ids[i] = string.sub(member, 9) end
  redis.call('ZREMRANGEBYSCORE', K_DUE, low, high)
elseif state == 'active' then
  ids = redis.call('ZRANGE', K_LEASE, 0, -1)
  redis.call('DEL', K_LEASE)
elseif state == 'dead' then
  ids = redis.call('ZRANGE', K_DEAD, 0, -1)
  redis.call('DEL', K_DEAD)
end
remove_all(K_MSG, 'HDEL', ids)
return #ids
