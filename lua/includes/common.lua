--[[
  Shared prelude of every luft-redis script.

  Every script receives the keys of one run, in this order (see luft_redis/keys.py):
    KEYS[1]  run            hash    status, task, totals, timestamps, version
    KEYS[2]  events         stream  the event log
    KEYS[3]  phases         hash    <phase_id>:<attr>
    KEYS[4]  results        hash    <agent_id>:<attr>
    KEYS[5]  sessions       hash    <agent_id>:<attr>
    KEYS[6]  started        hash    <agent_id> -> "<seq> <phase_id>"
    KEYS[7]  findings       hash    segment id -> msgpack list of findings
    KEYS[8]  findings_order list    segment ids in order
    KEYS[9]  writers        hash    <writer id> -> "<op seq> <reply>" (exactly-once writes)
    KEYS[10] changes        the sharded pub/sub channel of change notices (not a key)

  Every writing script takes ARGV[1] = writer id and ARGV[2] = the writer's operation sequence
  number, made before the first attempt; its own arguments follow and are read as ARGS[i]
  (= ARGV[i + 2]). A retried operation whose first attempt was applied gets the stored reply
  of that attempt back and changes nothing (see dedup / remember).

  Conventions:
    * numbers travel as decimal strings; u64 sums are done on strings (see u64_add);
    * an optional argument is "n" for null or "s" followed by the value;
    * a script reads and checks everything first and writes only afterwards, so an error
      reply never leaves a half-applied change;
    * domain errors are raised with fail(CODE, message) and reach the client as the error
      reply "LUFT_<CODE> <message>" (see main.lua);
    * every change bumps the run's version, stamps updated_at with the server's clock and
      publishes one change notice (see notify).
]]
local K_RUN, K_EVENTS, K_PHASES, K_RESULTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_SESSIONS, K_STARTED, K_FINDINGS, K_FINDINGS_ORDER = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WRITERS, K_CHANGES = KEYS[9], KEYS[10]

local WRITER, WRITER_SEQ = ARGV[1], ARGV[2]
local ARGS = {}
for i = 3, #ARGV do ARGS[i - 2] = ARGV[i] end

local U64_MAX = '18446744073709551615'
local EMPTY_LIST = '\144' -- msgpack of []

local function fail(code, message)
  error('LUFT_' .. code .. ' ' .. message, 0)
end

-- Decode an optional argument: "n" -> nil, "s<value>" -> value.
local function opt(arg, name)
  if arg == 'n' then return nil end
  if arg == nil or string.sub(arg, 1, 1) ~= 's' then
    fail('BAD_ARG', 'optional argument ' .. name .. ' is malformed')
  end
  return string.sub(arg, 2)
end

local function is_uint(s)
  return type(s) == 'string' and (s == '0' or string.find(s, '^[1-9]%d*$') ~= nil)
    and (#s < 20 or (#s == 20 and s <= U64_MAX))
end

-- A stored u64 field, checked; a missing field is corrupt too.
local function stored_uint(key, field, value)
  if not is_uint(value) then
    fail('CORRUPT', key .. ' ' .. field .. ' is not an unsigned integer')
  end
  return value
end

local function arg_uint(value, name)
  if not is_uint(value) then fail('BAD_ARG', name .. ' is not an unsigned integer') end
  return value
end

-- For each name, the optional argument ARGS[first + i - 1]: when present, append
-- `prefix .. name` and its value to `fields`; when null, append `prefix .. name` to `drop`
-- (the field to delete, so an upsert replaces the whole entity).
local function optional_fields(fields, drop, prefix, names, first)
  for i, name in ipairs(names) do
    local value = opt(ARGS[first + i - 1], name)
    if value then
      fields[#fields + 1] = prefix .. name
      fields[#fields + 1] = value
    else
      drop[#drop + 1] = prefix .. name
    end
  end
end

-- Exact addition of two u64 decimal strings; fails with LUFT_OVERFLOW past 2^64-1.
local function u64_add(a, b, what)
  if #a < 15 and #b < 15 then
    return string.format('%d', tonumber(a) + tonumber(b))
  end
  local digits, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(a, i) - 48 end
    if j > 0 then d = d + string.byte(b, j) - 48 end
    digits[#digits + 1] = d % 10
    carry = math.floor(d / 10)
    i, j = i - 1, j - 1
  end
  local sum = string.reverse(table.concat(digits))
  if #sum > 20 or (#sum == 20 and sum > U64_MAX) then
    fail('OVERFLOW', what .. ' would exceed 2^64-1')
  end
  return sum
end

local VALID_STATUS = {running = true, completed = true, failed = true, cancelled = true}

-- The run's status and version (plus any other run fields asked for), checked; fails with
-- LUFT_NO_RUN when the run does not exist.
local function read_run(...)
  local values = redis.call('HMGET', K_RUN, 'status', 'version', ...)
  local status = values[1]
  if not status then fail('NO_RUN', K_RUN .. ' does not exist') end
  if not VALID_STATUS[status] then
    fail('CORRUPT', K_RUN .. ' status is not a checkpoint status')
  end
  stored_uint(K_RUN, 'version', values[2])
  return values
end

-- Server time in unix seconds, as a decimal string.
local function now_seconds()
  return redis.call('TIME')[1]
end

-- HSET a flat field/value list in chunks (Lua's unpack has a stack limit).
local function hset_flat(key, flat)
  local n = #flat
  local i = 1
  while i <= n do
    local j = math.min(i + 3999, n)
    redis.call('HSET', key, unpack(flat, i, j))
    i = j + 1
  end
end

-- The stored reply when this writer's operation WRITER_SEQ was already applied, else nil.
local function dedup()
  if WRITER == nil or WRITER_SEQ == nil or string.find(WRITER_SEQ, '^%d+$') == nil then
    fail('BAD_ARG', 'writer id and operation sequence are required')
  end
  local last = redis.call('HGET', K_WRITERS, WRITER)
  if not last then return nil end
  local seq, reply = string.match(last, '^(%d+) (.*)$')
  if not seq then fail('CORRUPT', K_WRITERS .. ' ' .. WRITER .. ' is not "<seq> <reply>"') end
  if seq == WRITER_SEQ then
    local parts = {}
    for part in string.gmatch(reply, '[^ ]+') do parts[#parts + 1] = part end
    return parts
  end
  if #seq > #WRITER_SEQ or (#seq == #WRITER_SEQ and seq > WRITER_SEQ) then
    fail('STALE', 'operation ' .. WRITER_SEQ .. ' of writer ' .. WRITER .. ' is older than ' .. seq)
  end
  return nil
end

-- Remember this operation's reply (space-free parts) for retries of the same operation.
local function remember(reply)
  redis.call('HSET', K_WRITERS, WRITER, WRITER_SEQ .. ' ' .. table.concat(reply, ' '))
  return reply
end

-- Publish a change notice: netstrings "<len>:<bytes>" of version, now, op and op parts.
local function notify(version, now, op, parts)
  local out = {}
  local function put(s) out[#out + 1] = #s .. ':' .. s end
  put(version)
  put(now)
  put(op)
  if parts then for i = 1, #parts do put(parts[i]) end end
  redis.call('SPUBLISH', K_CHANGES, table.concat(out))
end

-- Stamp updated_at, set `fields` and bump the version; returns the new version (string).
local function touch(version, now, fields)
  local new_version = u64_add(version, '1', 'version')
  local all = {'updated_at', now, 'version', new_version}
  if fields then
    for i = 1, #fields do all[#all + 1] = fields[i] end
  end
  redis.call('HSET', K_RUN, unpack(all))
  return new_version
end

-- Fail with LUFT_CORRUPT unless `key` is missing or holds a `kind` ('hash', 'list', ...):
-- called in the check phase for keys a script writes without reading them first, so a key of
-- the wrong type never stops a script half way.
local function check_type(key, kind)
  local found = redis.call('TYPE', key)
  if type(found) == 'table' then found = found['ok'] end
  if found ~= 'none' and found ~= kind then
    fail('CORRUPT', key .. ' type is ' .. tostring(found) .. ', not a ' .. kind)
  end
end

-- The finding list's keys are written after other writes: check them first.
local function check_findings_keys()
  check_type(K_FINDINGS, 'hash')
  check_type(K_FINDINGS_ORDER, 'list')
end

-- Replace agent `aid`'s findings in the run's finding list (contract §5, findings): in place
-- when the agent already has some there, at the end when it has none. Reporting no findings
-- removes the agent's segment (decided: the stored list is then exactly what get_checkpoint()
-- shows, so saving that changes nothing). Segments "<aid>#2", "<aid>#3", ... left by
-- save_checkpoint for the same agent are dropped too (an agent with such segments always has
-- its own segment, so a new segment has none).
local function set_agent_findings(aid, blob)
  if blob == EMPTY_LIST then
    if redis.call('HDEL', K_FINDINGS, aid) == 0 then return end
    redis.call('LREM', K_FINDINGS_ORDER, 1, aid)
  elseif redis.call('HSETNX', K_FINDINGS, aid, blob) == 1 then
    redis.call('RPUSH', K_FINDINGS_ORDER, aid)
    return
  else
    redis.call('HSET', K_FINDINGS, aid, blob)
  end
  local k = 2
  while redis.call('HDEL', K_FINDINGS, aid .. '#' .. k) == 1 do
    redis.call('LREM', K_FINDINGS_ORDER, 1, aid .. '#' .. k)
    k = k + 1
  end
end
