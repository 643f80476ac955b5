-- wake.lua: put the wake-up marker back (a listener that took it had no one to wake).
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: none.
-- Returns 1.
wake()
return 1
