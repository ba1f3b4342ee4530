--[[
  release_lease: hand a leased task back. failed = 0 (a graceful release): ready again, the
  attempt not counted as failed; failed = 1 (the holder's code raised): a failed attempt,
  ready again until max_attempts failures, then dead.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] agent_id   ARGS[2] token   ARGS[3] incarnation   ARGS[4] failed: "0" or "1"

  Reply and notice: the delta, op "release", no records; when the lease had already ended
          (finished with this token), a delta that changes nothing and no notice
  Errors: LUFT_LEASE_LOST "<agent_id> <token> <current token or ->" when another claim took
          the task over; LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/run"
--- @include "includes/commit"
--- @include "includes/tasks"

local function main()
  local dup = dedup()
  if dup then return dup end
  local aid, token, inc, failed = ARGS[1], arg_uint(ARGS[2], 'token'), ARGS[3], ARGS[4]
  if aid == nil or inc == nil or (failed ~= '0' and failed ~= '1') then
    fail('BAD_ARG', 'release arguments are malformed')
  end
  local run = read_run()
  local p = aid .. ':'
  local task = redis.call('HMGET', K_TASKS, p .. 'token', p .. 'state', p .. 'failures',
    p .. 'max', p .. 'seq')
  local current = task[1]
  if (run[3] or '') ~= inc then current = nil end
  if current ~= token then fail('LEASE_LOST', aid .. ' ' .. token .. ' ' .. (current or '-')) end
  if task[2] ~= 'leased' then return unchanged(run, 'release') end
  local failures, seq = task_uint(aid, 'failures', task[3]), task_uint(aid, 'seq', task[5])
  local max = task_uint(aid, 'max', task[4])
  local fields, score
  if failed == '1' then
    fields, score = end_lease(aid, false, failures, max, seq)
  else
    fields, score = {p .. 'state', 'ready', p .. 'expires', '0'}, seq
  end
  write_task_end(aid, fields, score)
  return commit(run, now_seconds(), 'release')
end

--- @include "includes/main"
