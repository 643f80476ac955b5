-- put_one.lua: put.lua's most common case, one request with on_conflict 'ignore' on a
-- queue that is not sharded, with no staging: the id is stored only if it is free
-- (HSETNX, so no separate look-up), and an id that exists is left as it is.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV: id, delay_ms or '', at_ms or '', max_attempts, payload, then optionally
--   encoding ('' for json) and headers (JSON or '').
-- Returns {0, woke} as put.lua does (woke: 1 if the marker was pushed, else 0), and
-- {0, 0, 0} when the id exists: request 0 kept it (apply_put() returns None).
local now, ceil = clock()
local id = ARGV[1]
-- A seq taken for an id that exists is skipped: gaps in the counter are harmless.
local seq = redis.call('INCR', K_SEQ)
local record = pack_new(seq, tonumber(ARGV[4]), ARGV[6] or '', ARGV[7] or '', ARGV[5])
if redis.call('HSETNX', K_MSG, id, record) == 0 then return {0, 0, 0} end
local due = resolve_due(ARGV[2], ARGV[3], now, ceil)
local pending, before = known_before()
redis.call('ZADD', K_DUE, string.format('%d', due), due_member(seq, id))
return announce(due, pending, before)
