--[[
  agent_tasks: every agent task of the run, as stored, with the server's clock and whether each
  agent has an ok result (read-only: FCALL_RO).

  KEYS[1..12] the run's keys (see includes/call.lua)

  Reply:  0 when the run does not exist; else an array: now (unix ms, server clock), the
          flat HGETALL of the tasks hash, then the agent ids (of tasks) whose result is ok
  Errors: LUFT_CORRUPT (a key of the wrong type)
]]
--- @include "includes/call"
--- @include "includes/numbers"
--- @include "includes/time"
--- @include "includes/keytypes"

local function main()
  check_run_types()
  if redis.call('EXISTS', K_RUN) == 0 then return 0 end
  local flat = redis.call('HGETALL', K_TASKS)
  local ok = {}
  for i = 1, #flat, 2 do
    local field = flat[i]
    local aid = string.match(field, '^(.*):state$')
    if aid and redis.call('HGET', K_RESULTS, aid .. ':status') == 'ok' then ok[#ok + 1] = aid end
  end
  return {whole(now_ms()), flat, ok}
end

--- @include "includes/main"
