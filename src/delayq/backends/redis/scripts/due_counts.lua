-- due_counts.lua: how many scheduled messages fall due in each of `buckets` windows of
-- `width` ms from the server's now (read only; the function is no-writes).
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: width (ms, >= 1); ARGV[2]: buckets (>= 1); ARGV[3] (optional): now in epoch
-- ms, given by a sharded queue so that every shard counts from one now (else TIME).
-- Returns {now_ms, {count of bucket 1, ...}}: bucket i (from 0) counts due times in
-- [now + i*width, now + (i+1)*width), except those <= now (due already: ready).
local now = tonumber(ARGV[3] or '') or clock()
local width, buckets = tonumber(ARGV[1]), tonumber(ARGV[2])
local counts = {}
for i = 0, buckets - 1 do
  local low = '' .. (now + i * width)
  if i == 0 then low = '(' .. now end
  counts[i + 1] = redis.call('ZCOUNT', K_DUE, low, '(' .. (now + (i + 1) * width))
end
return {now, counts}
