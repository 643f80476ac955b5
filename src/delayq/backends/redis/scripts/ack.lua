-- ack.lua: apply_ack(): delete the message if the token holds its unexpired lease.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: id; ARGV[2]: lease token.
-- Returns 1 when acked, 0 when the lease is lost (nothing changed).
local now = clock()
local id = ARGV[1]
local raw = redis.call('HGET', K_MSG, id)
if not held_stored(id, raw, ARGV[2], now) then return 0 end
redis.call('HDEL', K_MSG, id)
redis.call('ZREM', K_LEASE, id)
return 1
