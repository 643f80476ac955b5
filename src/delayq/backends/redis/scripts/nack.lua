-- nack.lua: apply_nack(): a held message is scheduled at resolve_due(delay_ms) with a new
-- seq, or dead (due kept, a new seq) when asked or once attempts reached max_attempts;
-- last_error set, lease dropped.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: id; ARGV[2]: lease token; ARGV[3]: delay_ms; ARGV[4]: '1' when an error
-- text is given, else '0'; ARGV[5]: the error text; ARGV[6]: '1' for dead at once, else '0';
-- ARGV[7] (optional, sharded queues): the new seq, from the queue-wide counter.
-- Returns 1 (scheduled), 3 (dead), or 0 when the lease is lost (nothing changed).
local now, ceil = clock()
local r = load_settled(ARGV[1], now)
if not held(r, ARGV[2]) then return 0 end
local before = next_event()
unindex(r)
r.seq = tonumber(ARGV[7] or '') or redis.call('INCR', K_SEQ)
r.lease, r.lease_until = nil, nil
r.err = nil
if ARGV[4] == '1' then r.err = ARGV[5] end
if ARGV[6] == '1' or r.attempts >= r.max then
  r.state = DEAD
else
  r.state, r.due = SCHEDULED, resolve_due(ARGV[3], '', now, ceil)
end
store(r)
if r.state == SCHEDULED and (not before or r.due < before) then wake() end
return r.state
