--[[
  upsert_agent_result: insert or replace agent_results[agent_id] (contract §4); the agent's
  findings replace its earlier ones in the run's finding list. total_tokens is untouched and
  no event is added.

  KEYS[1..8] the run's keys (see includes/common.lua)
  ARGV[1] agent_id   ARGV[2] phase_id   ARGV[3] status   ARGV[4] tokens   ARGV[5] completed_at
  ARGV[6] output (opt msgpack)   ARGV[7] findings (opt msgpack, absent when empty)
  ARGV[8] cache_key_hash (opt)   ARGV[9] description (opt)   ARGV[10] role (opt)

  Reply:  {version, now}
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG
]]
--- @include "includes/common"

local OPTIONAL = {'output', 'findings', 'cache_key_hash', 'description', 'role'}

local function main()
  run_status()
  local aid = ARGV[1]
  local p = aid .. ':'
  local fields = {
    p .. 'status', ARGV[3], p .. 'phase_id', arg_uint(ARGV[2], 'phase_id'),
    p .. 'tokens', arg_uint(ARGV[4], 'tokens'),
    p .. 'completed_at', arg_uint(ARGV[5], 'completed_at'),
  }
  local drop = {}
  for i, name in ipairs(OPTIONAL) do
    local value = opt(ARGV[5 + i], name)
    if value then
      fields[#fields + 1] = p .. name
      fields[#fields + 1] = value
    else
      drop[#drop + 1] = p .. name
    end
  end
  local findings = opt(ARGV[7], 'findings') or EMPTY_LIST
  local now = now_seconds()

  if #drop > 0 then redis.call('HDEL', K_RESULTS, unpack(drop)) end
  redis.call('HSET', K_RESULTS, unpack(fields))
  set_agent_findings(aid, findings)
  return {tostring(touch(now)), now}
end

--- @include "includes/main"
