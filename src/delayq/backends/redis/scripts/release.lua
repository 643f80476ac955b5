-- release.lua: undo a claim that nobody received (an async reserve cancelled while
-- its claim ran): each message goes back to exactly what it was, if its lease is still
-- the claim's.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: id1, token1, id2, token2, ...
-- Returns how many were released.
local released = 0
for i = 1, #ARGV, 2 do
  local r = load(ARGV[i])
  if r and r.state == ACTIVE and r.lease == ARGV[i + 1] then
    unindex(r)
    r.state, r.attempts, r.lease, r.lease_until = SCHEDULED, r.attempts - 1, nil, nil
    store(r)
    released = released + 1
  end
end
if released > 0 then wake() end
return released
