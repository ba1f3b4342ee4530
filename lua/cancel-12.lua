--[[
  cancel: running -> cancelled (contract §5). A completed, failed or already cancelled run is
  left as it is, without error and without a new version.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence

  Reply:  the delta, op "cancel": R status cancelled; when the run was not running, a delta
          that changes nothing (version before = after) and no notice
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_STALE
]]
--- @include "includes/time"
--- @include "includes/run"
--- @include "includes/commit"
--- @include "includes/retention"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run()
  if run[1] ~= 'running' then return retained(unchanged(run, 'cancel'), run[1]) end
  return retained(commit(run, now_seconds(), 'cancel', {'status', 'cancelled'}), 'cancelled')
end

--- @include "includes/main"
