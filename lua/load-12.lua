--[[
  load: read a run's whole state in one atomic step (for open_run and cache resyncs); the
  event log is not read.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV    none

  Reply:  0 when the run does not exist, else
          {run HGETALL, phases HGETALL, results HGETALL, sessions HGETALL, started HGETALL,
           findings HGETALL, findings_order LRANGE}
  Errors: LUFT_CORRUPT <key> type ... when a key of the run (writers included) holds the
          wrong type
]]
--- @include "includes/call"
--- @include "includes/keytypes"

local function main()
  check_run_types()
  local run = redis.call('HGETALL', K_RUN)
  if #run == 0 then return 0 end
  return {
    run,
    redis.call('HGETALL', K_PHASES),
    redis.call('HGETALL', K_RESULTS),
    redis.call('HGETALL', K_SESSIONS),
    redis.call('HGETALL', K_STARTED),
    redis.call('HGETALL', K_FINDINGS),
    redis.call('LRANGE', K_FINDINGS_ORDER, 0, -1),
  }
end

--- @include "includes/main"
