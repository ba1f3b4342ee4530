--[[
  cancel: running -> cancelled (contract §5). A completed, failed or already cancelled run is
  left as it is, without error and without a new version.

  KEYS[1..8] the run's keys (see includes/common.lua)
  ARGV    none

  Reply:  {version, updated_at, status}
  Errors: LUFT_NO_RUN, LUFT_CORRUPT
]]
--- @include "includes/common"

local function main()
  local status = run_status()
  if status ~= 'running' then
    local run = redis.call('HMGET', K_RUN, 'version', 'updated_at')
    return {stored_uint(K_RUN, 'version', run[1]), stored_uint(K_RUN, 'updated_at', run[2]),
      status}
  end
  local now = now_seconds()
  return {tostring(touch(now, {'status', 'cancelled'})), now, 'cancelled'}
end

--- @include "includes/main"
