--[[
  reset_status_to_running: failed/cancelled/running -> running (contract §5, decided: a
  completed run is not resumable).

  KEYS[1..8] the run's keys (see includes/common.lua)
  ARGV    none

  Reply:  {version, now, "running"}
  Errors: LUFT_NOT_RESUMABLE <status> on a completed run (nothing changed); LUFT_NO_RUN;
          LUFT_CORRUPT
]]
--- @include "includes/common"

local function main()
  local status = run_status()
  if status == 'completed' then fail('NOT_RESUMABLE', status) end
  local now = now_seconds()
  return {tostring(touch(now, {'status', 'running'})), now, 'running'}
end

--- @include "includes/main"
