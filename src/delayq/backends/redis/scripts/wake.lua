-- wake.lua: put the wake-up marker back (a listener that took it had no one to wake),
-- unless the queue holds nothing a waiter could claim or see expire: a purge may have
-- deleted the marker since it was taken, and an empty queue leaves no key.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: none.
-- Returns 1 when the marker was put back, else 0.
if redis.call('ZCARD', K_DUE) == 0 and redis.call('ZCARD', K_LEASE) == 0 then return 0 end
wake()
return 1
