-- dead.lua: up to limit dead messages, oldest seq first, after settling expired leases.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: limit; ARGV[2]: '' or a seq: only the dead messages of a greater seq (the
-- next page; the dead set's score is the seq).
-- Returns a list of records (see reply() in lib.lua).
local now = clock()
settle_expired(now)
local limit = tonumber(ARGV[1])
local ids
if ARGV[2] == '' then
  ids = redis.call('ZRANGE', K_DEAD, 0, limit - 1)
else
  ids = redis.call('ZRANGEBYSCORE', K_DEAD, '(' .. ARGV[2], '+inf', 'LIMIT', 0, limit)
end
local out = {}
for _, id in ipairs(ids) do
  local r = load(id)
  if r then out[#out + 1] = reply(r, now, false) end
end
return out
