-- dead.lua: up to limit dead messages, oldest seq first, after settling expired leases.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: limit.
-- Returns a list of records (see reply() in lib.lua).
local now = clock()
settle_expired(now)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[1]) - 1)) do
  local r = load(id)
  if r then out[#out + 1] = reply(r, now, false) end
end
return out
