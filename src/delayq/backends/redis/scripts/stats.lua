-- stats.lua: compute_stats(), after settling expired leases.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: none.
-- Returns {scheduled, ready, active, dead, next_due or false, now_ms}.
local now = clock()
settle_expired(now)
local waiting = redis.call('ZCARD', K_DUE)
local ready = redis.call('ZCOUNT', K_DUE, '-inf', text(now))
local head = redis.call('ZRANGE', K_DUE, '0', '0', 'WITHSCORES')
local next_due = false
if head[2] then next_due = tonumber(head[2]) end
return {waiting - ready, ready, redis.call('ZCARD', K_LEASE), redis.call('ZCARD', K_DEAD),
  next_due, now}
