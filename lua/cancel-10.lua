--[[
  cancel: running -> cancelled (contract §5). A completed, failed or already cancelled run is
  left as it is, without error and without a new version.

  KEYS[1..10] the run's keys (see includes/common.lua)
  ARGV[1] writer id   ARGV[2] operation sequence

  Reply:  {version, updated_at, status}
  Notice: op "c", then the new status (only when the status changed)
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_STALE
]]
--- @include "includes/common"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run('updated_at')
  local status, version = run[1], run[2]
  if status ~= 'running' then
    return remember({version, stored_uint(K_RUN, 'updated_at', run[3]), status})
  end
  local now = now_seconds()
  local new_version = touch(version, now, {'status', 'cancelled'})
  notify(new_version, now, 'c', {'cancelled'})
  return remember({new_version, now, 'cancelled'})
end

--- @include "includes/main"
