-- get.lua: observe() one message, without its lease (read only).
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: id.
-- Returns the record (see reply() in lib.lua), or nil when unknown.
local now = clock()
local r = load(ARGV[1])
if not r then return false end
return reply(settle(r, now), now, false)
