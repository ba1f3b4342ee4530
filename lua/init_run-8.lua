--[[
  init_run: create a new run (contract §4): status running, phase 0, empty collections,
  created_at = updated_at = server time, version 1.

  KEYS[1..8] the run's keys (see includes/common.lua)
  ARGV[1] run id (canonical)      ARGV[2] task        ARGV[3] run_dir
  ARGV[4] workflow_meta: optional msgpack blob ("n" or "s<blob>")
  ARGV[5] schema version

  Reply:  {version, now}
  Errors: LUFT_EXISTS when the run already exists (nothing changed); LUFT_BAD_ARG
]]
--- @include "includes/common"

local function main()
  if redis.call('EXISTS', K_RUN) == 1 then fail('EXISTS', K_RUN .. ' already exists') end
  local meta = opt(ARGV[4], 'workflow_meta')
  local now = now_seconds()
  -- Leftovers of a run whose main hash was deleted must not leak into the new run.
  redis.call('DEL', K_EVENTS, K_PHASES, K_RESULTS, K_SESSIONS, K_STARTED, K_FINDINGS,
    K_FINDINGS_ORDER)
  local fields = {
    'schema', ARGV[5], 'run_id', ARGV[1], 'task', ARGV[2], 'run_dir', ARGV[3],
    'status', 'running', 'current_phase', '0', 'total_tokens', '0', 'phases', '0',
    'created_at', now, 'updated_at', now, 'version', '1',
  }
  if meta then
    fields[#fields + 1] = 'workflow_meta'
    fields[#fields + 1] = meta
  end
  redis.call('HSET', K_RUN, unpack(fields))
  return {'1', now}
end

--- @include "includes/main"
