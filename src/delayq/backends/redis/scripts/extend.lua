-- extend.lua: apply_extend(): a held lease now expires at ceil + lease_ms.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: id; ARGV[2]: lease token; ARGV[3]: lease_ms.
-- Returns the new expiry (epoch ms), or 0 when the lease is lost (nothing changed).
local now, ceil = clock()
local r = load_settled(ARGV[1], now)
if not held(r, ARGV[2]) then return 0 end
r.lease_until = ceil + tonumber(ARGV[3])
store(r)
return r.lease_until
