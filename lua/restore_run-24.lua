--[[
  restore_run: swap a run staged by an import (luft_redis.interop) in place of the run, in one
  atomic step. The staging keys were filled beforehand (events streamed with XADD, the state
  written by save_checkpoint on the staging keys); they share the run's hash tag, so RENAME
  stays in the run's slot (Redis Cluster included).

  KEYS[1..12]  the run's keys (see includes/call.lua)
  KEYS[13..24] the staging keys, in the same order as KEYS[1..12]: run, events, phases,
               results, sessions, started, findings, findings_order, writers, tasks, queue,
               history (an import brings no agent tasks: the staged tasks and queue are never
               filled; the staged history is dropped)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] replace: '1' to replace an existing run, '0' to refuse it
  ARGS[2] updated_at to keep (unix seconds, from the imported checkpoint)
  ARGS[3] the new incarnation (the staged run hash holds it already)

  Every staging key that exists is renamed onto the run's key (its TTL removed); the run's
  other keys, its writers hash and history included, are deleted first. The run hash gets
  version 1 and the stored updated_at, as after init_run: a restore starts a new incarnation,
  whose history starts with a base (includes/history.lua).

  Reply and notice: the delta, op "restore", from (incarnation, 0) to (incarnation, 1), no
          records: a cache of the run (any other incarnation) reloads.
  Errors: LUFT_EXISTS when the run exists and ARGS[1] is '0' (nothing changed);
          LUFT_BAD_ARG when the staged run is missing or is not this import's; LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/keytypes"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/history"

local function main()
  local dup = dedup()
  if dup then return dup end
  local replace, updated_at, inc = ARGS[1], arg_uint(ARGS[2], 'updated_at'), ARGS[3]
  if replace ~= '0' and replace ~= '1' then fail('BAD_ARG', 'replace is not 0 or 1') end
  if inc == nil or string.find(inc, '^[0-9a-f]+$') == nil then
    fail('BAD_ARG', 'incarnation is not a hex id')
  end
  check_type(KEYS[13], 'hash')
  local staged = redis.call('HGET', KEYS[13], 'incarnation')
  if staged ~= inc then
    fail('BAD_ARG', KEYS[13] .. ' is not the staged run of this import')
  end
  if replace == '0' and redis.call('EXISTS', K_RUN) == 1 then
    fail('EXISTS', K_RUN .. ' already exists')
  end

  redis.call('DEL', K_RUN, K_EVENTS, K_PHASES, K_RESULTS, K_SESSIONS, K_STARTED, K_FINDINGS,
    K_FINDINGS_ORDER, K_WRITERS, K_TASKS, K_QUEUE, K_HISTORY)
  for i = 1, 8 do
    if redis.call('EXISTS', KEYS[12 + i]) == 1 then
      redis.call('RENAME', KEYS[12 + i], KEYS[i])
      redis.call('PERSIST', KEYS[i])
    end
  end
  redis.call('DEL', KEYS[21], KEYS[22], KEYS[23], KEYS[24])
  redis.call('HSET', K_RUN, 'updated_at', updated_at, 'version', '1', 'history_version', '1')
  local payload = delta_bytes(inc, '0', inc, '1', 'restore')
  redis.call('SPUBLISH', CHANNEL, payload)
  remember(inc, '0', inc, '1')
  add_history('1', 'restore', nil, true, false, false)
  return payload
end

--- @include "includes/main"
