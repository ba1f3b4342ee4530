--[[
  A write's bookkeeping: exactly once, versions, the change notice.

  A retried operation whose first attempt was applied gets a "replay" delta back (the
  versions of that attempt, no records) and changes nothing (dedup, remember: the writers
  hash, KEYS[9], keeps "<op seq> <versions>" per writer). Every change bumps the run's
  version, stamps updated_at with the server's clock and publishes its delta (commit).
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"
--- @include "includes/keytypes"
--- @include "includes/delta"
--- @include "includes/history"

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

-- Publish a delta as the run's change notice (every script that changes something).
local function notify(payload)
  redis.call('SPUBLISH', CHANNEL, payload)
end

-- Finish a change of `run` (read_run's values): stamp updated_at with `now`, set `fields`,
-- bump the version (a run written by 0.1.0 gets its incarnation here), add the version's
-- history entry (includes/history.lua), publish the delta and return it. With `whole`, the delta carries the whole state (Z) instead of the records;
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
  local restart = HISTORY_RESTART
  local base = whole or restart or not history_reaches(version)
  redis.call('HSET', K_RUN, 'history_version', new_version, unpack(all))
  if whole then
    rec_whole_state()
  else
    for i = 1, #all, 2 do rec('R', all[i], all[i + 1]) end
  end
  local payload = delta_bytes(inc_before, version, inc_after, new_version, op, DELTA)
  notify(payload)
  remember(inc_before, version, inc_after, new_version, memo)
  add_history(new_version, op, now, base, whole, restart)
  return payload
end
