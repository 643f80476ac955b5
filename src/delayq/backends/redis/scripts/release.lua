-- release.lua: apply_release(): each held message goes back to exactly what it was before
-- its claim: scheduled, one attempt less, no lease; due, seq and last_error kept (so it
-- keeps its place). release() sends one pair; a cancelled async reserve gives back what
-- its claim took (nobody received it) with one pair per claimed message.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: id1, token1, id2, token2, ...
-- Returns how many were released; a pair whose token does not hold the unexpired lease
-- changes nothing.
local now = clock()
local released = 0
for i = 1, #ARGV, 2 do
  local r = load_settled(ARGV[i], now)
  if held(r, ARGV[i + 1]) then
    unindex(r)
    r.state, r.attempts, r.lease, r.lease_until = SCHEDULED, r.attempts - 1, nil, nil
    store(r)
    released = released + 1
  end
end
if released > 0 then wake() end
return released
