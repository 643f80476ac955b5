-- peek.lua: up to limit messages in one observed state, without their lease tokens (read
-- only: an expired lease is settled in the reply, never written; the function is no-writes).
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: '' (waiting: scheduled and ready), 'ready', 'scheduled', 'active' or 'dead';
-- ARGV[2]: limit.
-- Returns a list of records (see reply() in lib.lua): waiting, ready and scheduled ones
-- by (due_at, seq), active ones by (lease_until, seq) with their lease's expiry (the
-- caller merges shards by it), dead ones by seq (as dead.lua).
local now = clock()
local state, limit = ARGV[1], tonumber(ARGV[2])
local found = {}

local function add(id)
  local r = load(id)
  if r then found[#found + 1] = r end
end

-- Up to limit scheduled messages due in [low, high], in (due_at, seq) order.
local function from_due(low, high)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', K_DUE, low, high, 'LIMIT', 0, limit)) do
    add(string.sub(member, 9))
  end
end

-- What settle() makes of the expired leases not yet settled (few: reserve, stats and
-- dead settle them), when that is the state wanted.
local function expired_into(wanted)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_LEASE, '-inf', now)) do
    local r = load(id)
    if r then
      local s = settle(r, now)
      if s.state == wanted then found[#found + 1] = s end
    end
  end
end

local order = function(a, b)
  if a.due ~= b.due then return a.due < b.due end
  return a.seq < b.seq
end

if state == '' or state == 'ready' then
  from_due('-inf', state == '' and '+inf' or now)
  expired_into(SCHEDULED)
elseif state == 'scheduled' then
  from_due('(' .. now, '+inf')
elseif state == 'active' then
  local ids = redis.call('ZRANGEBYSCORE', K_LEASE, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
  local seen = {}
  for i = 1, #ids, 2 do seen[ids[i]] = true; add(ids[i]) end
  if #ids == 2 * limit then
    -- the other messages of the last expiry too, so the seq order among them is exact
    local last = ids[#ids]
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_LEASE, last, last)) do
      if not seen[id] then add(id) end
    end
  end
  order = function(a, b)
    if a.lease_until ~= b.lease_until then return a.lease_until < b.lease_until end
    return a.seq < b.seq
  end
elseif state == 'dead' then
  for _, id in ipairs(redis.call('ZRANGE', K_DEAD, 0, limit - 1)) do add(id) end
  expired_into(DEAD)
  order = function(a, b) return a.seq < b.seq end
end

table.sort(found, order)
local out = {}
for i = 1, math.min(limit, #found) do out[i] = reply(found[i], now, false) end
return out
