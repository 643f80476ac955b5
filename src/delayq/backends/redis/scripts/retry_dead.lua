-- retry_dead.lua: apply_retry_dead(): dead messages become due now with attempts 0 and a
-- new seq (last_error kept), after settling expired leases.
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: '1' for every dead message (oldest seq first), '0' for the ids that follow;
-- ARGV[2..]: ids. A sharded queue sends ARGV[1] as '1:<base>' or '0:<base>': seqs then
-- start after base, from the queue-wide counter.
-- Returns how many were revived.
local now = clock()
settle_expired(now)
local chosen = {}
local all, given = string.sub(ARGV[1], 1, 1) == '1', tonumber(string.sub(ARGV[1], 3))
if all then
  chosen = redis.call('ZRANGE', K_DEAD, 0, -1)
else
  local seen = {}
  for i = 2, #ARGV do
    local id = ARGV[i]
    if not seen[id] and redis.call('ZSCORE', K_DEAD, id) then
      seen[id] = true
      chosen[#chosen + 1] = id
    end
  end
end
if #chosen == 0 then return 0 end
local base = given or (redis.call('INCRBY', K_SEQ, #chosen) - #chosen)
remove_all(K_DEAD, 'ZREM', chosen)
for i, id in ipairs(chosen) do
  local r = load(id)
  r.state, r.due, r.seq, r.attempts = SCHEDULED, now, base + i, 0
  store(r)
end
wake()
return #chosen
