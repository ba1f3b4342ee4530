--[[
  reset_status_to_running: failed/cancelled/running -> running (contract §5, decided: a
  completed run is not resumable).

  KEYS[1..9]  the run's keys (see includes/common.lua)
  ARGV[#ARGV] optional "@retention <ttl_ms> <max_events>", taken off first (includes/retention)
  ARGV[1] the run's change channel (see includes/common.lua)
  ARGV[2] writer id   ARGV[3] operation sequence

  Reply and notice: the delta, op "reset": R status running
  Errors: LUFT_NOT_RESUMABLE <status> on a completed run (nothing changed); LUFT_NO_RUN;
          LUFT_CORRUPT; LUFT_STALE
]]
--- @include "includes/retention"
--- @include "includes/common"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run()
  if run[1] == 'completed' then fail('NOT_RESUMABLE', run[1]) end
  return retained(commit(run, now_seconds(), 'reset', {'status', 'running'}), 'running')
end

--- @include "includes/main"
