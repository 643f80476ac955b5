-- cancel.lua: can_cancel(): delete a message that is not in flight.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: id.
-- Returns 1 when deleted, 0 when unknown or in flight (nothing changed).
local now = clock()
local r = load_settled(ARGV[1], now)
if r == nil or r.state == ACTIVE then return 0 end
unindex(r)
redis.call('HDEL', K_MSG, r.id)
return 1
