-- peek.lua: up to limit messages in one observed state, without their lease tokens (read
-- only: an expired lease is settled in the reply, never written; the function is no-writes).
-- KEYS: msg, due, lease, dead, seq, wake (see lib.lua).
-- ARGV[1]: '' (waiting: scheduled and ready), 'ready', 'scheduled', 'active' or 'dead';
-- ARGV[2]: limit; ARGV[3], ARGV[4]: '' and '', or the position to page after: the
-- key (due_at; lease_until for active; seq for dead) and the seq of the last record of
-- the previous page (only records after it in the order below are returned).
-- Returns a list of records (see reply() in lib.lua): waiting, ready and scheduled ones
-- by (due_at, seq), active ones by (lease_until, seq) with their lease's expiry (the
-- caller merges shards by it), dead ones by seq (as dead.lua).
local now = clock()
local state, limit = ARGV[1], tonumber(ARGV[2])
local paged = ARGV[3] ~= ''
local after_key, after_seq = tonumber(ARGV[3]), tonumber(ARGV[4])
local found = {}

local function add(id)
  local r = load(id)
  if r then found[#found + 1] = r end
end

-- The low end of a range by score (low, whose value is low_value), moved to the
-- paging key (so that what came before it is not read; the key as sent: a Lua number
-- would print as 2.5340230079999e+14), and whether it was: then the members of that
-- very score, some of them on earlier pages, are read on top of limit.
local function paged_low(low, low_value)
  if not paged or after_key < low_value then return low, false end
  if after_key == low_value and string.sub(low, 1, 1) == '(' then return low, false end
  return ARGV[3], true
end

-- Up to limit scheduled messages due in [low, high], in (due_at, seq) order (after the
-- paging position: what the caller drops).
local function from_due(low, high, low_value)
  local start, moved = paged_low(low, low_value)
  local extra = moved and redis.call('ZCOUNT', K_DUE, ARGV[3], ARGV[3]) or 0
  local members = redis.call('ZRANGEBYSCORE', K_DUE, start, high, 'LIMIT', 0, limit + extra)
  for _, member in ipairs(members) do
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
  from_due('-inf', state == '' and '+inf' or now, -math.huge)
  expired_into(SCHEDULED)
elseif state == 'scheduled' then
  from_due('(' .. now, '+inf', now)
elseif state == 'active' then
  local start, moved = paged_low('(' .. now, now)
  local extra = moved and redis.call('ZCOUNT', K_LEASE, ARGV[3], ARGV[3]) or 0
  local ids = redis.call('ZRANGEBYSCORE', K_LEASE, start, '+inf', 'WITHSCORES', 'LIMIT', 0, limit + extra)
  local seen = {}
  for i = 1, #ids, 2 do seen[ids[i]] = true; add(ids[i]) end
  if #ids == 2 * (limit + extra) then
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
  local ids
  if paged then
    ids = redis.call('ZRANGEBYSCORE', K_DEAD, '(' .. ARGV[4], '+inf', 'LIMIT', 0, limit)
  else
    ids = redis.call('ZRANGE', K_DEAD, 0, limit - 1)
  end
  for _, id in ipairs(ids) do add(id) end
  expired_into(DEAD)
  order = function(a, b) return a.seq < b.seq end
end

-- The paging position as a record of the order: what sorts after it is kept.
local kept = found
if paged then
  local mark = {due = after_key, lease_until = after_key, seq = after_seq}
  kept = {}
  for _, r in ipairs(found) do
    if state == 'dead' then
      if r.seq > after_seq then kept[#kept + 1] = r end
    elseif order(mark, r) then
      kept[#kept + 1] = r
    end
  end
end
table.sort(kept, order)
local out = {}
for i = 1, math.min(limit, #kept) do out[i] = reply(kept[i], now, false) end
return out
