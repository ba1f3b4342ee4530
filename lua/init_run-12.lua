--[[
  init_run: create a new run (contract §4): status running, phase 0, empty collections,
  created_at = updated_at = server time, version 1, a new incarnation.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] run id (canonical)   ARGS[2] task   ARGS[3] run_dir
  ARGS[4] workflow_meta: optional msgpack blob ("n" or "s<blob>")
  ARGS[5] schema version   ARGS[6] incarnation (a new random id, [0-9a-f]+)

  Reply and notice: the delta, op "init", from (incarnation, 0) to (incarnation, 1): a Z
          record with the whole new state. A run of the same id deleted earlier is another
          incarnation to every cache.
  Errors: LUFT_EXISTS when the run already exists (nothing changed); LUFT_BAD_ARG
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/delta"
--- @include "includes/commit"
--- @include "includes/history"

local function main()
  local dup = dedup()
  if dup then return dup end
  if redis.call('EXISTS', K_RUN) == 1 then fail('EXISTS', K_RUN .. ' already exists') end
  local meta = opt(ARGS[4], 'workflow_meta')
  local inc = ARGS[6]
  if inc == nil or string.find(inc, '^[0-9a-f]+$') == nil then
    fail('BAD_ARG', 'incarnation is not a hex id')
  end
  local now = now_seconds()
  -- Leftovers of a run whose main hash was deleted must not leak into the new run.
  redis.call('DEL', K_EVENTS, K_PHASES, K_RESULTS, K_SESSIONS, K_STARTED, K_FINDINGS,
    K_FINDINGS_ORDER, K_HISTORY)
  local fields = {
    'schema', ARGS[5], 'run_id', ARGS[1], 'task', ARGS[2], 'run_dir', ARGS[3],
    'status', 'running', 'current_phase', '0', 'total_tokens', '0', 'phases', '0', 'agents', '0',
    'agents_ok', '0', 'agents_failed', '0',
    'created_at', now, 'updated_at', now, 'version', '1', 'incarnation', inc,
    'history_version', '1',
  }
  if meta then
    fields[#fields + 1] = 'workflow_meta'
    fields[#fields + 1] = meta
  end
  redis.call('HSET', K_RUN, unpack(fields))
  rec_whole_state()
  local payload = delta_bytes(inc, '0', inc, '1', 'init', DELTA)
  redis.call('SPUBLISH', CHANNEL, payload)
  remember(inc, '0', inc, '1')
  add_history('1', 'init', nil, true, true, false)
  return payload
end

--- @include "includes/main"
