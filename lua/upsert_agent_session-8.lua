--[[
  upsert_agent_session: insert or replace agent_sessions[agent_id] (contract §4).

  KEYS[1..8] the run's keys (see includes/common.lua)
  ARGV[1] agent_id   ARGV[2] backend_id (opt)   ARGV[3] protocol_session_id (opt)
  ARGV[4] session_id   ARGV[5] status   ARGV[6] updated_at   ARGV[7] resumable ("true"/"false")

  Reply:  {version, now}
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG
]]
--- @include "includes/common"

local function main()
  run_status()
  local p = ARGV[1] .. ':'
  local fields = {
    p .. 'session_id', ARGV[4], p .. 'status', ARGV[5],
    p .. 'updated_at', arg_uint(ARGV[6], 'updated_at'), p .. 'resumable', ARGV[7],
  }
  if ARGV[7] ~= 'true' and ARGV[7] ~= 'false' then fail('BAD_ARG', 'resumable is not a bool') end
  local drop = {}
  for i, name in ipairs({'backend_id', 'protocol_session_id'}) do
    local value = opt(ARGV[1 + i], name)
    if value then
      fields[#fields + 1] = p .. name
      fields[#fields + 1] = value
    else
      drop[#drop + 1] = p .. name
    end
  end
  local now = now_seconds()

  if #drop > 0 then redis.call('HDEL', K_SESSIONS, unpack(drop)) end
  redis.call('HSET', K_SESSIONS, unpack(fields))
  return {tostring(touch(now)), now}
end

--- @include "includes/main"
