--[[
  renew_lease: extend a lease (the holder's heartbeat). A lapsed lease that nobody took over
  renews fine: its holder is still alone. Not a change of the checkpoint: no version, no
  notice, nothing remembered (a renew is idempotent: a retry extends the lease once more).

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel   ARGV[2] writer id   ARGV[3] operation sequence (unused)
  ARGS[1] agent_id   ARGS[2] token   ARGS[3] incarnation   ARGS[4] lease duration in ms

  Reply:  an array {outcome, expires (unix ms, or "0")}: "ok" (extended), "ended" (the lease's
          task was finished with this token: nothing to extend), "released" (the task was handed
          back without a new claim yet, as a resume after a cancel does: the holder should stop),
          or "cancelled" (the run is not running: the holder should stop; the lease is left as
          it is)
  Errors: LUFT_LEASE_LOST "<agent_id> <token> <current token or ->" when another claim took
          the task over (or the run was re-created); LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/keytypes"
--- @include "includes/run"

local function main()
  check_run_types()
  local aid, token, inc = ARGS[1], arg_uint(ARGS[2], 'token'), ARGS[3]
  local lease_ms = tonumber(arg_uint(ARGS[4], 'lease duration'))
  if aid == nil or inc == nil or lease_ms < 1 then fail('BAD_ARG', 'renew arguments are malformed') end
  local run = read_run()
  local p = aid .. ':'
  local task = redis.call('HMGET', K_TASKS, p .. 'token', p .. 'state')
  local current = task[1]
  if (run[3] or '') ~= inc then current = nil end
  if current ~= token then fail('LEASE_LOST', aid .. ' ' .. token .. ' ' .. (current or '-')) end
  if run[1] ~= 'running' then return {'cancelled', '0'} end
  if task[2] == 'done' then return {'ended', '0'} end
  if task[2] ~= 'leased' then return {'released', '0'} end -- handed back (a resume after a stop)
  local expires = whole(now_ms() + lease_ms)
  redis.call('HSET', K_TASKS, p .. 'expires', expires)
  redis.call('ZADD', K_QUEUE, expires, aid)
  return {'ok', expires}
end

--- @include "includes/main"
