--[[
  Shared prelude of every luft-redis script.

  Every script receives the eleven keys of one run, in this order (see luft_redis/keys.py):
    KEYS[1]  run            hash    status, task, totals, timestamps, version
    KEYS[2]  events         stream  the event log
    KEYS[3]  phases         hash    <phase_id>:<attr>
    KEYS[4]  results        hash    <agent_id>:<attr>
    KEYS[5]  sessions       hash    <agent_id>:<attr>
    KEYS[6]  started        hash    <agent_id> -> "<seq> <phase_id>"
    KEYS[7]  findings       hash    segment id -> msgpack list of findings
    KEYS[8]  findings_order list    segment ids in order
    KEYS[9]  writers        hash    <writer id> -> "<op seq> <reply>" (exactly-once writes)
    KEYS[10] tasks          hash    <agent_id>:<attr> -> the agent tasks (leases; see below)
    KEYS[11] queue          zset    agent_id -> its submit order (ready) or lease expiry in ms
                                    (leased): the oldest ready task, then the lease that
                                    lapsed longest ago, sort first

  Agent tasks (docs/leases.md). A task's attributes: phase, payload (opaque msgpack), seq
  (submit order), state (ready | leased | done | dead), attempt (hand-outs), failures (failed
  attempts), max (max_attempts of its last claim), token (its current fencing token, "0"
  before the first claim), holder (the worker of the last claim), expires (the lease's expiry,
  unix ms, server clock). The run hash keeps the counters lease_token (the last fencing token
  of this incarnation: strictly increasing, never reused) and task_seq. A fenced write
  carries "<agent_id> <token> <incarnation>" in its fence slot (includes/retention.lua): it
  is applied only when the run's incarnation and the task's token are those of the lease
  (check_fence), else LUFT_LEASE_LOST and nothing is written.

  Every writing script takes ARGV[1] = the run's change channel, the sharded pub/sub channel
  of its change notices (<prefix>:{<run>}:changes, in the run's slot; a channel is not a key,
  so it is not declared in KEYS: a declared name that never exists would make a migrating
  slot answer TRYAGAIN to every call), ARGV[2] = writer id and ARGV[3] = the writer's
  operation sequence number, made before the first attempt; its own arguments follow and are
  read as ARGS[i] (= ARGV[i + 3]). A retried operation whose first attempt was applied gets a
  "replay" delta back (the versions of that attempt, no records) and changes nothing (see
  dedup / remember).

  Deltas. Every writing script replies with one delta and publishes the same bytes as its
  change notice (SPUBLISH on ARGV[1]) when it changed something. A delta (format L3) is a
  header of six netstrings "<len>:<bytes>":
    'L3', incarnation before, version before, incarnation after, version after, op
  then, when there are records, one netstring holding the byte length of every record part as
  decimals separated by single spaces, then those parts back to back (no separators). The
  parts are the records, each a tag and its parts:
      R field value                 the run hash field now holds value
      E section id n (attr value)*n the entity `id` of section (ph, res, ses) is now exactly
                                    these attributes (n = 0: it is gone); in an E res record
                                    an empty `findings` value stands for the blob of this
                                    delta's F record of segment `id` (sent once, not twice)
      S agent_id value              started[agent_id] = value ("<seq> <phase_id>")
      F segment blob                finding segment set: in place when listed, else appended
      X segment                     finding segment removed
      Z then the 7 parts of load's reply, each counted: the whole state (replaces all)
  Format L2 (an unreleased layout before L3) put every record part in a netstring of its own;
  no release wrote it, and this version reads it as an unknown format (a reload).
  A script that changes nothing replies with version before = version after and no records,
  and publishes nothing. The cache applies a delta only when its incarnation and version equal
  the delta's "before" (see luft_redis/delta.py).

  Conventions:
    * numbers travel as decimal strings; u64 sums are done on strings (see u64_add);
    * an optional argument is "n" for null or "s" followed by the value;
    * a script reads and checks everything first and writes only afterwards, so an error
      reply never leaves a half-applied change;
    * domain errors are raised with fail(CODE, message) and reach the client as the error
      reply "LUFT_<CODE> <message>" (see main.lua);
    * every change bumps the run's version, stamps updated_at with the server's clock and
      publishes its delta (see commit).
]]
-- Set at the start of every call by begin_call() (at the end of this file): this prelude is
-- defined once per library load (FUNCTION LOAD) and its state is per call.
local K_RUN, K_EVENTS, K_PHASES, K_RESULTS
local K_SESSIONS, K_STARTED, K_FINDINGS, K_FINDINGS_ORDER
local K_WRITERS, K_TASKS, K_QUEUE
local CHANNEL, WRITER, WRITER_SEQ
local ARGS
local FENCE_AID, FENCE_TOKEN, FENCE_INC, FENCE_BAD

local U64_MAX = '18446744073709551615'
local EMPTY_LIST = '\144' -- msgpack of []

-- Decimal text of a non-negative integer below 2^53. Lua 5.1 turns a number into text with
-- sprintf("%.14g"), a float formatter that costs more than the rest of a small record: the
-- lengths and counts of a delta (small numbers) come from a table filled as they are met.
local DECIMAL = {}
local function decimal(n)
  local s = DECIMAL[n]
  if s == nil then
    s = string.format('%d', n)
    if n < 65536 then DECIMAL[n] = s end
  end
  return s
end

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

-- A read of KEYS[i] (a `kind` key) that is also its type check: `redis.call(cmd, KEYS[i], ...)`,
-- where a WRONGTYPE error (a stray key of another type) is LUFT_CORRUPT naming the key, any
-- other error (an ACL NOPERM) raised as it is. A script reads a key this way before its first
-- write, so the key needs no probe of its own (see dedup).
local function read_key(i, kind, cmd, ...)
  local found = redis.pcall(cmd, KEYS[i], ...)
  if type(found) == 'table' and found.err then
    if string.find(tostring(found.err), '^WRONGTYPE') then check_type(KEYS[i], kind) end
    error(found)
  end
  return found
end

local VALID_STATUS = {running = true, completed = true, failed = true, cancelled = true}

-- The run's status, version and incarnation (nil for a run written by 0.1.0), then any other
-- run fields asked for, checked; fails with LUFT_NO_RUN when the run does not exist.
local function read_run(...)
  local values = read_key(1, 'hash', 'HMGET', 'status', 'version', 'incarnation', ...)
  local status = values[1]
  if not status then fail('NO_RUN', K_RUN .. ' does not exist') end
  if not VALID_STATUS[status] then
    fail('CORRUPT', K_RUN .. ' status is not a checkpoint status')
  end
  stored_uint(K_RUN, 'version', values[2])
  return values
end

-- The run field `agents`: the number of distinct agents that started (K_STARTED) or have a
-- result (K_RESULTS), what `luft-redis runs` shows. Every script that adds a started agent or
-- a result keeps it (read before its first write, plus what it adds); a run written before
-- the field existed has none, and gets it counted here from the two hashes at its first such
-- write. `n`: the field as the caller read it already (HMGET), when it did.
local function stored_agents(n)
  if n == nil then n = redis.call('HGET', K_RUN, 'agents') end
  if n then return tonumber(stored_uint(K_RUN, 'agents', n)) end
  -- (HGETALL, not HKEYS: the commands of docs/security.md's ACL; once per older run)
  local seen, count = {}, 0
  local started = redis.call('HGETALL', K_STARTED)
  for i = 1, #started, 2 do
    seen[started[i]] = true
    count = count + 1
  end
  local fields = redis.call('HGETALL', K_RESULTS)
  for i = 1, #fields, 2 do
    local aid = string.match(fields[i], '^(.+):status$')
    if aid and not seen[aid] then
      seen[aid] = true
      count = count + 1
    end
  end
  return count
end

-- The run fields agents_ok and agents_failed: the agents whose result's status is "ok", and
-- those with a result of any other status (running = agents - ok - failed: started, no
-- result), what the runs page shows. `changes` lists {status before, status after} of the
-- results a write sets (false/nil: no result); `ok`, `failed`: the two fields as read_run
-- read them (read_run('agents_ok', 'agents_failed', ...): no read of its own). Returns the
-- fields to set with the write's version ({name, value, ...}), nil when no count changes;
-- call it before the first write.
-- A run written before the counters has neither field: counted here from the results as they
-- are before this write (once per run). One field without the other is LUFT_CORRUPT.
local function status_count_fields(changes, stored_ok, stored_failed)
  local dok, dfailed = 0, 0
  for i = 1, #changes do
    local before, after = changes[i][1], changes[i][2]
    if before ~= after then
      if before == 'ok' then dok = dok - 1 elseif before then dfailed = dfailed - 1 end
      if after == 'ok' then dok = dok + 1 elseif after then dfailed = dfailed + 1 end
    end
  end
  if dok == 0 and dfailed == 0 then return nil end
  local stored = {stored_ok, stored_failed}
  local ok, failed = 0, 0
  if stored[1] and stored[2] then
    ok = tonumber(stored_uint(K_RUN, 'agents_ok', stored[1]))
    failed = tonumber(stored_uint(K_RUN, 'agents_failed', stored[2]))
  elseif stored[1] or stored[2] then
    fail('CORRUPT', K_RUN .. ' has one of agents_ok and agents_failed without the other')
  else
    -- (HGETALL, not HSCAN/HKEYS: the commands of docs/security.md's ACL; once per older run)
    local fields = redis.call('HGETALL', K_RESULTS)
    for i = 1, #fields, 2 do
      if string.find(fields[i], ':status$') then
        if fields[i + 1] == 'ok' then ok = ok + 1 else failed = failed + 1 end
      end
    end
  end
  ok, failed = ok + dok, failed + dfailed
  if ok < 0 or failed < 0 then
    fail('CORRUPT', K_RUN .. ' agents_ok/agents_failed are less than the results they count')
  end
  return {'agents_ok', string.format('%.0f', ok), 'agents_failed', string.format('%.0f', failed)}
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

-- The delta under construction: the parts of its records are DELTA[1..DN], in order (see the
-- header). The table is kept from call to call and only its first DN entries belong to this
-- call: growing a new table part by part (a rehash at every power of two) costs more than
-- writing the records' bytes. begin_call() sets DN = 0 and drops a table grown past
-- DELTA_KEEP parts (a whole-state record), so a big save does not stay in memory.
local FORMAT = 'L3'
local DELTA, DN = {}, 0
local DELTA_KEEP = 4096
local LENGTHS = {} -- scratch of delta_bytes, kept like DELTA
-- Segment id -> the blob of the F record this call sent for it (see rec_attrs); the table is
-- new in every call that sends one.
local F_SENT, F_SENT_CALL, CALL = {}, 0, 0
local function sent_findings(aid, blob)
  if F_SENT_CALL ~= CALL then F_SENT, F_SENT_CALL = {}, CALL end
  F_SENT[aid] = blob
end

-- Append a record of two or three parts: its tag, then a (and b unless nil).
local function rec(tag, a, b)
  local n = DN
  DELTA[n + 1] = tag
  DELTA[n + 2] = a
  if b == nil then
    DN = n + 2
  else
    DELTA[n + 3] = b
    DN = n + 3
  end
end

-- Append an E record of entity `id` (section tag `tag`) from a flat attr/value list.
local function rec_attrs(tag, id, out)
  local n, count = DN, #out
  DELTA[n + 1] = 'E'
  DELTA[n + 2] = tag
  DELTA[n + 3] = id
  DELTA[n + 4] = decimal(count / 2)
  n = n + 4
  local sent = F_SENT_CALL == CALL and F_SENT[id]
  for i = 1, count, 2 do
    local value = out[i + 1]
    if sent and value == sent and out[i] == 'findings' then value = '' end
    DELTA[n + i] = out[i]
    DELTA[n + i + 1] = value
  end
  DN = n + count
end

local PHASE_ATTRS = {'seq', 'label', 'planned', 'ok', 'failed', 'description', 'role'}
local RESULT_ATTRS = {'status', 'phase_id', 'tokens', 'completed_at', 'output', 'findings',
  'cache_key_hash', 'description', 'role'}
local SESSION_ATTRS = {'backend_id', 'protocol_session_id', 'session_id', 'status',
  'updated_at', 'resumable'}

-- Record entity `id` of `key` (section tag `tag`) as it is now stored: an E record.
local function rec_entity(tag, key, id, attrs)
  local names = {}
  for i = 1, #attrs do names[i] = id .. ':' .. attrs[i] end
  local values = redis.call('HMGET', key, unpack(names))
  local out = {}
  for i = 1, #attrs do
    if values[i] then
      out[#out + 1] = attrs[i]
      out[#out + 1] = values[i]
    end
  end
  rec_attrs(tag, id, out)
end

-- A delta's bytes: its header, then, with `records`, the parts DELTA[1..DN] behind their
-- index of lengths (format L3, see the header).
local function delta_bytes(inc_before, v_before, inc_after, v_after, op, records)
  local head = '2:' .. FORMAT .. decimal(#inc_before) .. ':' .. inc_before
    .. decimal(#v_before) .. ':' .. v_before .. decimal(#inc_after) .. ':' .. inc_after
    .. decimal(#v_after) .. ':' .. v_after .. decimal(#op) .. ':' .. op
  local n = DN
  if not records or n == 0 then return head end
  local parts, lengths = DELTA, LENGTHS
  for i = 1, n do
    local len = #parts[i]
    lengths[i] = DECIMAL[len] or decimal(len)
  end
  local index = table.concat(lengths, ' ', 1, n)
  return head .. decimal(#index) .. ':' .. index .. table.concat(parts, '', 1, n)
end

-- The type every key of a run must have (KEYS[1..11]).
local RUN_KEY_TYPES = {'hash', 'stream', 'hash', 'hash', 'hash', 'hash', 'hash', 'list', 'hash',
  'hash', 'zset'}

-- Probe KEYS[i] with a command that reads only a `kind` key and answers an integer: cheaper
-- than TYPE, whose status reply becomes a table. Its WRONGTYPE error is the sign of a stray
-- key, which check_type then names; any other error (an ACL NOPERM) is raised as it is.
local function probe_type(i, kind)
  local found
  if kind == 'hash' then
    found = redis.pcall('HLEN', KEYS[i])
  elseif kind == 'stream' then
    found = redis.pcall('XLEN', KEYS[i])
  elseif kind == 'zset' then
    found = redis.pcall('ZCARD', KEYS[i])
  else
    found = redis.pcall('LLEN', KEYS[i])
  end
  if type(found) == 'table' then
    if string.find(tostring(found.err), '^WRONGTYPE') then check_type(KEYS[i], kind) end
    error(found)
  end
end

-- Fail with LUFT_CORRUPT naming the first key of the run that holds the wrong type: every
-- script calls it (dedup does) before it reads or writes anything else, so a stray key never
-- surfaces as an untyped WRONGTYPE error or stops a script half way.
local function check_run_types()
  for i = 1, #RUN_KEY_TYPES do probe_type(i, RUN_KEY_TYPES[i]) end
end

-- A "replay" delta when this writer's operation WRITER_SEQ was already applied, else nil.
-- The wrong-type check of the run's keys comes first: by default every key is probed
-- (check_run_types). A script that reads a key with read_key before its first write, and
-- probes (probe_type) each key it writes without reading, before that first write too,
-- passes `probes`, the list {i1, kind1, i2, kind2, ...} of the keys to probe now (the
-- writers hash is read here, with read_key).
local function dedup(probes)
  if WRITER == nil or WRITER_SEQ == nil or string.find(WRITER_SEQ, '^%d+$') == nil then
    fail('BAD_ARG', 'writer id and operation sequence are required')
  end
  if probes then
    for i = 1, #probes, 2 do probe_type(probes[i], probes[i + 1]) end
  else
    check_run_types()
  end
  local last = read_key(9, 'hash', 'HGET', WRITER)
  if not last then return nil end
  local seq, ib, vb, ia, va = string.match(last, '^(%d+) (%S*) (%d+) (%S*) (%d+)$')
  if not seq then
    fail('CORRUPT', K_WRITERS .. ' ' .. WRITER .. ' is not "<seq> <inc> <v> <inc> <v>"')
  end
  if seq == WRITER_SEQ then
    -- A write, though it changes nothing: a WAIT after this reply (durability=) counts the
    -- replicas that caught up with this connection's last write, and a retry comes on a new
    -- connection, which has none on Redis >= 7.2 and Valkey: the replicas would acknowledge
    -- a write they may never have received.
    redis.call('HSET', K_WRITERS, WRITER, last)
    if ib == '-' then ib = '' end
    if ia == '-' then ia = '' end
    return delta_bytes(ib, vb, ia, va, 'replay')
  end
  if #seq > #WRITER_SEQ or (#seq == #WRITER_SEQ and seq > WRITER_SEQ) then
    fail('STALE', 'operation ' .. WRITER_SEQ .. ' of writer ' .. WRITER .. ' is older than ' .. seq)
  end
  return nil
end

-- Remember this operation's versions for retries of the same operation; `memo`, a field and
-- its value, is set in the same HSET (a script's own record of the operation's reply).
local function remember(ib, vb, ia, va, memo)
  if ib == '' then ib = '-' end
  if ia == '' then ia = '-' end
  local last = WRITER_SEQ .. ' ' .. ib .. ' ' .. vb .. ' ' .. ia .. ' ' .. va
  if memo then
    redis.call('HSET', K_WRITERS, WRITER, last, memo[1], memo[2])
  else
    redis.call('HSET', K_WRITERS, WRITER, last)
  end
end

-- The reply of an operation that changed nothing: the run as it is, no notice.
local function unchanged(run, op)
  local inc, version = run[3] or '', run[2]
  remember(inc, version, inc, version)
  return delta_bytes(inc, version, inc, version, op)
end

-- The whole state, as a Z record (init_run and save_checkpoint): the delta's only record.
local function rec_whole_state()
  local parts = {
    redis.call('HGETALL', K_RUN), redis.call('HGETALL', K_PHASES),
    redis.call('HGETALL', K_RESULTS), redis.call('HGETALL', K_SESSIONS),
    redis.call('HGETALL', K_STARTED), redis.call('HGETALL', K_FINDINGS),
    redis.call('LRANGE', K_FINDINGS_ORDER, 0, -1),
  }
  local delta, n = DELTA, 1
  delta[1] = 'Z'
  for i = 1, #parts do
    local part = parts[i]
    local count = #part
    delta[n + 1] = decimal(count)
    for j = 1, count do delta[n + 1 + j] = part[j] end
    n = n + 1 + count
  end
  DN = n
end

-- Publish a delta as the run's change notice (every script that changes something).
local function notify(payload)
  redis.call('SPUBLISH', CHANNEL, payload)
end

-- Finish a change of `run` (read_run's values): stamp updated_at with `now`, set `fields`,
-- bump the version (a run written by 0.1.0 gets its incarnation here), publish the delta and
-- return it. With `whole`, the delta carries the whole state (Z) instead of the records;
-- `memo` is passed on to remember.
local function commit(run, now, op, fields, whole, memo)
  local version, inc_before = run[2], run[3] or ''
  local inc_after = inc_before
  local new_version = u64_add(version, '1', 'version')
  local all = {'updated_at', now, 'version', new_version}
  if inc_before == '' then
    inc_after = WRITER .. '-' .. WRITER_SEQ
    all[#all + 1] = 'incarnation'
    all[#all + 1] = inc_after
  end
  if fields then
    for i = 1, #fields do all[#all + 1] = fields[i] end
  end
  redis.call('HSET', K_RUN, unpack(all))
  if whole then
    rec_whole_state()
  else
    for i = 1, #all, 2 do rec('R', all[i], all[i + 1]) end
  end
  local payload = delta_bytes(inc_before, version, inc_after, new_version, op, DELTA)
  notify(payload)
  remember(inc_before, version, inc_after, new_version, memo)
  return payload
end

-- Replace agent `aid`'s findings in the run's finding list (contract §5, findings): in place
-- when the agent already has some there, at the end when it has none. Reporting no findings
-- removes the agent's segment (decided: the stored list is then exactly what get_checkpoint()
-- shows, so saving that changes nothing). Segments "<aid>#2", "<aid>#3", ... left by
-- save_checkpoint for the same agent are dropped too (an agent with such segments always has
-- its own segment, so a new segment has none).
-- With `push` (a list), a new segment's id is appended to it for the caller to RPUSH later.
local function set_agent_findings(aid, blob, push)
  if blob == EMPTY_LIST then
    if redis.call('HDEL', K_FINDINGS, aid) == 0 then return end
    redis.call('LREM', K_FINDINGS_ORDER, 1, aid)
    rec('X', aid)
  elseif redis.call('HSETNX', K_FINDINGS, aid, blob) == 1 then
    if push then push[#push + 1] = aid else redis.call('RPUSH', K_FINDINGS_ORDER, aid) end
    rec('F', aid, blob)
    sent_findings(aid, blob)
    return
  else
    redis.call('HSET', K_FINDINGS, aid, blob)
    rec('F', aid, blob)
    sent_findings(aid, blob)
  end
  local k = 2
  while redis.call('HDEL', K_FINDINGS, aid .. '#' .. k) == 1 do
    redis.call('LREM', K_FINDINGS_ORDER, 1, aid .. '#' .. k)
    rec('X', aid .. '#' .. k)
    k = k + 1
  end
end

-- The server's clock in unix milliseconds (a number: exact below 2^53).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Decimal text of a whole number below 2^53 (string.format's %d takes a C long: 64 bits on
-- the servers' builds, as u64_add relies on too; cheaper than %.0f, a float conversion).
local function whole(n)
  return string.format('%d', n)
end

-- A fenced write (FENCE_AID set): the run's incarnation and the agent's current token must be
-- the lease's, else LUFT_LEASE_LOST "<agent_id> <stale token> <current token or ->" and
-- nothing is written. Returns the fenced agent id and the task's state ("leased", or after
-- the lease's own agent_done "done", "ready" or "dead"), or nil for a write without a lease. Returns the fenced agent id, or nil for a write without a lease. Its
-- read of the task's token is the tasks hash's type check (read_key).
local function check_fence(run)
  if FENCE_BAD then fail('BAD_ARG', 'fence argument is not "<agent> <token> <inc>"') end
  if not FENCE_AID then return nil end
  local p = FENCE_AID .. ':'
  local task = read_key(10, 'hash', 'HMGET', p .. 'token', p .. 'state')
  local current = task[1]
  if (run[3] or '') ~= FENCE_INC then current = nil end
  if current ~= FENCE_TOKEN then
    fail('LEASE_LOST', FENCE_AID .. ' ' .. FENCE_TOKEN .. ' ' .. (current or '-'))
  end
  return FENCE_AID, task[2]
end

-- LUFT_LEASE_LOST "<agent_id> <token> ended" for a fenced write that would contradict the
-- agent_done that ended its own lease: a second agent_done, or a result of the other outcome
-- (see fenced_result_ok). The lease's token stays current until the next claim, so the
-- agent's result may follow its agent_done.
local function fence_ended()
  fail('LEASE_LOST', FENCE_AID .. ' ' .. FENCE_TOKEN .. ' ended')
end

-- A fenced result with status `status` for a task in `state` (check_fence's): while leased
-- any; after the lease's ok agent_done (done) only an ok one; after a failed one (ready or
-- dead) only one that is not ok.
local function check_fenced_result(state, status)
  if state ~= 'leased' and (state == 'done') ~= (status == 'ok') then fence_ended() end
end

-- The ready score of a task (its submit order) and the smallest lease score (an expiry in
-- unix ms): every submit order is far below it.
local LEASE_SCORE = 1e12

-- The writes that end task `aid`'s lease as it stands: `ok` makes it done (its failures stay
-- as stored); otherwise a failed attempt (`failures`, `max` and `seq`, its submit order, as
-- stored), ready again until `max` failures, then dead. Returns the task's HSET fields, its
-- queue score (nil: leaves the queue) and the new state.
local function end_lease(aid, ok, failures, max, seq)
  local p = aid .. ':'
  if ok then return {p .. 'state', 'done', p .. 'expires', '0'}, nil, 'done' end
  local state, score = 'dead', nil
  failures = failures + 1
  if failures < max then state, score = 'ready', seq end
  return {p .. 'state', state, p .. 'failures', whole(failures), p .. 'expires', '0'}, score, state
end

-- Apply end_lease's result (after every check of the script).
local function write_task_end(aid, fields, score)
  redis.call('HSET', K_TASKS, unpack(fields))
  if score then redis.call('ZADD', K_QUEUE, score, aid) else redis.call('ZREM', K_QUEUE, aid) end
end

-- A stored task attribute that must be a whole number.
local function task_uint(aid, attr, value)
  return tonumber(stored_uint(K_TASKS, aid .. ':' .. attr, value))
end

-- Bind this call's keys and arguments (and start an empty delta). The loader runs the
-- statement of the @each-call line where a script includes this file (scripts.py).
local function begin_call()
  K_RUN, K_EVENTS, K_PHASES, K_RESULTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  K_SESSIONS, K_STARTED, K_FINDINGS, K_FINDINGS_ORDER = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
  K_WRITERS, K_TASKS, K_QUEUE = KEYS[9], KEYS[10], KEYS[11]
  CHANNEL, WRITER, WRITER_SEQ = ARGV[1], ARGV[2], ARGV[3]
  local n = #ARGV
  if n <= 4000 then
    ARGS = {unpack(ARGV, 4, n)} -- one table of the right size (no rehash per element)
  else -- (Lua's unpack has a stack limit)
    ARGS = {}
    for i = 4, n do ARGS[i - 3] = ARGV[i] end
  end
  FENCE_AID, FENCE_TOKEN, FENCE_INC, FENCE_BAD = nil, nil, nil, false -- (includes/retention)
  CALL = CALL + 1
  if DN > DELTA_KEEP then DELTA, LENGTHS = {}, {} end
  DN = 0
end
--- @each-call begin_call()
