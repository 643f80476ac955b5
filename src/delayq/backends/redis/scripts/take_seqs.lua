-- take_seqs.lua: take queue-wide sequence numbers and read the server's clock in one
-- step: a sharded put resolves every due time of its batch against this one now, so
-- its parts on other shards keep put order (see put.lua's 'x' flag).
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua); only seq (shard 0's) is used.
-- ARGV[1]: count, how many seqs to take.
-- Returns {base, now, ceil}: the seqs taken are base + 1 .. base + count; now and ceil
-- are this server's TIME as clock() reads it (message.Now: floor and ceiling, epoch ms).
local now, ceil = clock()
local count = tonumber(ARGV[1])
return {redis.call('INCRBY', K_SEQ, count) - count, now, ceil}
