--[[
  reset_status_to_running: failed/cancelled/running -> running (contract §5, decided: a
  completed run is not resumable).

  KEYS[1..10] the run's keys (see includes/common.lua)
  ARGV[1] writer id   ARGV[2] operation sequence

  Reply:  {version, now, "running"}
  Notice: op "c", then "running"
  Errors: LUFT_NOT_RESUMABLE <status> on a completed run (nothing changed); LUFT_NO_RUN;
          LUFT_CORRUPT; LUFT_STALE
]]
--- @include "includes/common"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run()
  local status, version = run[1], run[2]
  if status == 'completed' then fail('NOT_RESUMABLE', status) end
  local now = now_seconds()
  local new_version = touch(version, now, {'status', 'running'})
  notify(new_version, now, 'c', {'running'})
  return remember({new_version, now, 'running'})
end

--- @include "includes/main"
