-- lib.lua: the prelude prepended to every script below (not a script of its own).
-- KEYS, the same six in this order for every script, all under one hash tag
-- ("<prefix>:{<queue>:<shard>}:..."), so a queue shard lives in one cluster slot:
--   KEYS[1] msg    hash   id -> the packed record (see pack())
--   KEYS[2] due    zset   scheduled messages: score due_at ms, member seq (8 bytes BE) .. id
--   KEYS[3] lease  zset   active messages: score lease_until ms, member id
--   KEYS[4] dead   zset   dead messages: score seq, member id
--   KEYS[5] seq    string the queue's sequence counter (INCRBY)
--   KEYS[6] wake   list   the wake-up marker (at most one element) consumers BLPOP
-- ARGV: per script. "Now" is always the server's TIME, read once per script by clock()
-- as its floor and ceiling in ms (message.Now): every check ("is it due", "has the lease
-- expired") and "due now" use the floor; a time computed as now + a positive duration
-- (a due time from delay_ms, a lease expiry) starts from the ceiling, so nothing is ever
-- early. Each function mirrors the function of the same name in delayq/durable/message.py. Writing after TIME needs
-- effects replication: the default since Redis 5.

local K_MSG, K_DUE, K_LEASE, K_DEAD, K_SEQ, K_WAKE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local SCHEDULED, ACTIVE, DEAD = 1, 2, 3
local LEASE_EXPIRED = @LEASE_EXPIRED@
local CHUNK = 500
-- string.char(b) by byte b, each made when first needed and kept (in the library, for
-- every later call): a look-up here costs a small part of a call of string.char.
local CHARS = {}
-- The text of each position n of a claimed message in its claim (its lease token's
-- tail), kept the same way: Lua's own number to text goes through sprintf.
local POSITIONS = {}

-- Now.of_seconds(): the server's epoch ms floored, the same rounded up, and the
-- microseconds past the floor (0 to 999).
local function clock()
  local t = redis.call('TIME')
  local usec = tonumber(t[2])
  local now, sub = tonumber(t[1]) * 1000 + math.floor(usec / 1000), usec % 1000
  local ceil = now
  if sub > 0 then ceil = now + 1 end
  return now, ceil, sub
end

-- A whole number (a score, at most 2^53) as the text Redis reads: redis.call() would
-- format a Lua number itself, with snprintf("%.17g") (~2,000 instructions), and Lua's
-- own tostring() keeps only 14 digits.
local function text(n)
  return string.format('%d', n)
end

local function due_member(seq, id)
  return struct.pack('>I8', seq) .. id
end

-- The record, format 2: one byte of flags, then cmsgpack values, then the payload as is.
--   flags = 128 + state + 4 * enc_code + 16 * (1 when the extra values follow), where
--   enc_code is 0 for json (the default), 1 for 'bytes', 2 for a name in the extras;
--   values: seq, attempts, max [, enc or '', headers, err, lease, lease_until, due]
--   (false for an absent extra). A scheduled record leaves its due time out: it is its
--   score in K_DUE (load() reads it there, or takes it from the caller).
-- Format 1, written by earlier versions and still read: cmsgpack of state, due, seq,
-- attempts, max, enc, payload[, headers[, err[, lease, lease_until]]]. Its first byte
-- is the state (1 to 3), never 128 or more, so the two cannot be mistaken; a format 1
-- record is written in format 2 by its next change.
local RAW_ENCODING = @RAW_ENCODING@

local function pack(r)
  local code, extra = 0, r.state ~= SCHEDULED or r.headers or r.err or r.lease
  if r.enc == RAW_ENCODING then
    code = 1
  elseif r.enc then
    code, extra = 2, true
  end
  local flags = 128 + r.state + 4 * code
  if not extra then
    return string.char(flags) .. cmsgpack.pack(r.seq, r.attempts, r.max) .. r.payload
  end
  local due = false
  if r.state ~= SCHEDULED then due = r.due end
  return string.char(flags + 16) .. cmsgpack.pack(r.seq, r.attempts, r.max,
    code == 2 and r.enc or '', r.headers or false, r.err or false, r.lease or false,
    r.lease_until or false, due) .. r.payload
end

-- pack() of a new scheduled record (attempts 0, no error, no lease), from its values as
-- put.lua's ARGV gives them ('' for no encoding name or no headers). The flags byte of
-- such a record without extras, 128 + SCHEDULED, is a literal: a library is loaded
-- without the string module.
local PACKED_SCHEDULED = '\129'

local function pack_new(seq, max, enc, headers, payload)
  if enc == '' and headers == '' then
    return PACKED_SCHEDULED .. cmsgpack.pack(seq, 0, max) .. payload
  end
  if enc == '' then enc = nil end
  if headers == '' then headers = nil end
  return pack({state = SCHEDULED, seq = seq, attempts = 0, max = max, enc = enc,
    headers = headers, payload = payload})
end

-- The record of id stored as raw (nil when unknown: raw is nil or false); due: its score
-- in K_DUE when the caller has it.
local function decode(id, raw, due)
  if not raw then return nil end
  local flags = string.byte(raw, 1)
  if flags < 128 then
    local st, d, seq, att, max, enc, payload, headers, err, lease, lu = cmsgpack.unpack(raw)
    return {id = id, state = st, due = d, seq = seq, attempts = att, max = max, enc = enc,
      payload = payload, headers = headers, err = err, lease = lease, lease_until = lu}
  end
  flags = flags - 128
  local code = (flags - flags % 4) / 4 % 4
  local off, seq, att, max, enc, headers, err, lease, lu, d
  if flags >= 16 then
    off, seq, att, max, enc, headers, err, lease, lu, d = cmsgpack.unpack_limit(raw, 9, 1)
  else
    off, seq, att, max = cmsgpack.unpack_limit(raw, 3, 1)
  end
  if code == 1 then enc = RAW_ENCODING elseif code ~= 2 then enc = nil end
  local payload = ''
  if off >= 0 then payload = string.sub(raw, off + 1) end
  -- One constructor sizes the table for every field (a field added later may grow it,
  -- rehashing them all). An absent extra is stored as false.
  local r = {id = id, state = flags % 4, seq = seq, attempts = att, max = max, enc = enc,
    headers = headers or nil, err = err or nil, lease = lease or nil, lease_until = lu or nil,
    due = d or nil, payload = payload}
  if r.state == SCHEDULED then
    r.due = due or tonumber(redis.call('ZSCORE', K_DUE, due_member(r.seq, id)))
  end
  return r
end

-- The record of id (nil when unknown); due: its score in K_DUE when the caller has it.
local function load(id, due)
  return decode(id, redis.call('HGET', K_MSG, id), due)
end

-- The stored record of every id of ids (false where unknown), one HMGET per CHUNK ids.
local function read_all(ids)
  local raws = {}
  for first = 1, #ids, CHUNK do
    local got = redis.call('HMGET', K_MSG, unpack(ids, first, math.min(first + CHUNK - 1, #ids)))
    for i = 1, #got do raws[first + i - 1] = got[i] end
  end
  return raws
end

-- load() of every id of ids (nil where unknown); dues, when given, holds each one's
-- score in K_DUE.
local function load_all(ids, dues)
  local raws, records = read_all(ids), {}
  for i = 1, #ids do records[i] = decode(ids[i], raws[i], dues and dues[i]) end
  return records
end

local function copy(r)
  local c = {}
  for k, v in pairs(r) do c[k] = v end
  return c
end

-- Remove r (as stored) from the index of its state.
local function unindex(r)
  if r.state == SCHEDULED then
    redis.call('ZREM', K_DUE, due_member(r.seq, r.id))
  elseif r.state == ACTIVE then
    redis.call('ZREM', K_LEASE, r.id)
  else
    redis.call('ZREM', K_DEAD, r.id)
  end
end

-- Write r and add it to the index of its state (the old version is unindexed).
local function store(r)
  redis.call('HSET', K_MSG, r.id, pack(r))
  if r.state == SCHEDULED then
    redis.call('ZADD', K_DUE, text(r.due), due_member(r.seq, r.id))
  elseif r.state == ACTIVE then
    redis.call('ZADD', K_LEASE, text(r.lease_until), r.id)
  else
    redis.call('ZADD', K_DEAD, text(r.seq), r.id)
  end
end

-- HDEL/ZREM many members, in chunks (unpack() has a stack limit).
local function remove_all(key, cmd, members)
  for i = 1, #members, CHUNK do
    redis.call(cmd, key, unpack(members, i, math.min(i + CHUNK - 1, #members)))
  end
end

-- HSET/ZADD many pairs (field, value or score, member) given flat, in chunks of pairs.
local function add_all(key, cmd, pairs)
  for i = 1, #pairs, 2 * CHUNK do
    redis.call(cmd, key, unpack(pairs, i, math.min(i + 2 * CHUNK - 1, #pairs)))
  end
end

-- store() of every record of rs, with one HSET and one ZADD per index (per CHUNK); each
-- score's text made once for a run of records that share it.
local function store_all(rs)
  local fields, due, lease, dead = {}, {}, {}, {}
  local last, score = false, false
  for _, r in ipairs(rs) do
    fields[#fields + 1], fields[#fields + 2] = r.id, pack(r)
    local index, value, member = dead, r.seq, r.id
    if r.state == SCHEDULED then
      index, value, member = due, r.due, due_member(r.seq, r.id)
    elseif r.state == ACTIVE then
      index, value = lease, r.lease_until
    end
    if value ~= last then last, score = value, text(value) end
    index[#index + 1], index[#index + 2] = score, member
  end
  add_all(K_MSG, 'HSET', fields)
  add_all(K_DUE, 'ZADD', due)
  add_all(K_LEASE, 'ZADD', lease)
  add_all(K_DEAD, 'ZADD', dead)
end

local function wake()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('RPUSH', K_WAKE, '1') end
end

-- settle(): an expired lease makes the message scheduled at lease_until, or dead.
local function settle(r, now)
  if r.state ~= ACTIVE or r.lease_until > now then return r, false end
  local s = copy(r)
  s.lease, s.lease_until, s.err = nil, nil, LEASE_EXPIRED
  if r.attempts >= r.max then
    s.state = DEAD
  else
    s.state, s.due = SCHEDULED, r.lease_until
  end
  return s, true
end

-- The loaded record r with a lease expiry applied and written back (nil when unknown).
local function settled(r, now)
  if not r then return nil end
  local s, changed = settle(r, now)
  if changed then
    unindex(r)
    store(s)
    if s.state == SCHEDULED then wake() end
  end
  return s
end

-- The record of id with a lease expiry applied and written back (nil when unknown).
local function load_settled(id, now)
  return settled(load(id), now)
end

-- settle() for every expired lease of the queue, read in one HMGET and written in one
-- HSET and one ZADD per index (per CHUNK).
local function settle_expired(now)
  local bound = text(now)
  local ids = redis.call('ZRANGEBYSCORE', K_LEASE, '-inf', bound)
  if #ids == 0 then return end
  local records, settled_all, woke = load_all(ids), {}, false
  for i = 1, #ids do
    local r = records[i]
    if r then
      local s = settle(r, now)
      settled_all[#settled_all + 1] = s
      woke = woke or s.state == SCHEDULED
    end
  end
  store_all(settled_all)
  if woke then wake() end
  redis.call('ZREMRANGEBYSCORE', K_LEASE, '-inf', bound)
end

-- _held(): true when token holds the unexpired lease of the settled record.
local function held(r, token)
  return r ~= nil and r.state == ACTIVE and r.lease == token
end

-- held() of the settled record of id, stored as raw (false when unknown): while its
-- lease has not expired (settle() leaves it as it is), read without decoding it whole.
local function held_stored(id, raw, token, now)
  if raw and string.byte(raw, 1) >= 128 + 16 and string.byte(raw, 1) % 4 == ACTIVE then
    local _, _, _, _, _, _, _, lease, lu = cmsgpack.unpack_limit(raw, 9, 1)
    if lu > now then return lease == token end
  end
  return held(settled(decode(id, raw), now), token)
end

-- The earliest due time or lease expiry (false when there is none), and the head of
-- the due index as ZRANGE WITHSCORES gives it ({member, score}, or empty).
local function next_event()
  local best = false
  local d = redis.call('ZRANGE', K_DUE, '0', '0', 'WITHSCORES')
  if d[2] then best = tonumber(d[2]) end
  local l = redis.call('ZRANGE', K_LEASE, '0', '0', 'WITHSCORES')
  if l[2] then
    local t = tonumber(l[2])
    if not best or t < best then best = t end
  end
  return best, d
end

-- For a put: whether a marker waits for consumers already (pending), else the earliest
-- due time or lease expiry they may sleep until (false when none). Read before the put
-- adds its own entries.
local function known_before()
  if redis.call('LLEN', K_WAKE) > 0 then return true, false end
  return false, (next_event())
end

-- A put's reply {0, woke}: the marker is pushed when the put's earliest due time comes
-- before every event a consumer may sleep until (known_before()).
local function announce(earliest, pending, before)
  if pending then return {0, 1} end
  if not before or earliest < before then
    redis.call('RPUSH', K_WAKE, '1')
    return {0, 1}
  end
  return {0, 0}
end

-- resolve_due(): '' means absent; a positive delay counts from the ceiling; no delay,
-- a delay <= 0 or a past at_ms is due now (the floor); never before now.
local function resolve_due(delay_ms, at_ms, now, ceil)
  local due = now
  if at_ms ~= '' then
    due = tonumber(at_ms)
  elseif delay_ms ~= '' and tonumber(delay_ms) > 0 then
    due = ceil + tonumber(delay_ms)
  end
  if due > now then return due end
  return now
end

local STATE_NAMES = {'scheduled', 'active', 'dead'}

-- observe(): the record as a reply, READY when due; the lease's expiry when it has
-- one, its token only if asked.
local function reply(r, now, with_lease)
  local name = STATE_NAMES[r.state]
  if r.state == SCHEDULED and r.due <= now then name = 'ready' end
  local lease, lease_until = false, false
  if r.lease then
    lease_until = r.lease_until
    if with_lease then lease = r.lease end
  end
  return {r.id, r.payload, r.enc or '', r.due, r.seq, r.attempts, r.max, name,
    r.headers or false, r.err or false, lease, lease_until}
end
