-- reschedule.lua: apply_reschedule(): a scheduled (or ready) message moves to a new due
-- time (resolve_due()), never before now, with a new seq.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: id; ARGV[2]: delay_ms or ''; ARGV[3]: at_ms or ''; ARGV[4] (optional, sharded
-- queues): the new seq, from the queue-wide counter.
-- Returns 1 when moved, 0 when unknown, in flight or dead (nothing changed).
local now, ceil = clock()
local r = load_settled(ARGV[1], now)
if r == nil or r.state ~= SCHEDULED then return 0 end
local before = next_event()
unindex(r)
r.due, r.seq = resolve_due(ARGV[2], ARGV[3], now, ceil), tonumber(ARGV[4] or '') or redis.call('INCR', K_SEQ)
store(r)
if not before or r.due < before then wake() end
return 1
