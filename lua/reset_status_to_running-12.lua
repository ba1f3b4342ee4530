--[[
  reset_status_to_running: failed/cancelled/running -> running (contract §5, decided: a
  completed run is not resumable).

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence

  Agent tasks (docs/leases.md) that are dead, or leased with a lease that has lapsed, are
  ready again, their attempts and failures reset; so is every leased one when the run was
  cancelled or failed (the stop ended those leases: not a failed attempt).

  Reply and notice: the delta, op "reset": R status running
  Errors: LUFT_NOT_RESUMABLE <status> on a completed run (nothing changed); LUFT_NO_RUN;
          LUFT_CORRUPT; LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/time"
--- @include "includes/run"
--- @include "includes/commit"
--- @include "includes/tasks"
--- @include "includes/retention"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run()
  if run[1] == 'completed' then fail('NOT_RESUMABLE', run[1]) end
  local now = now_ms()
  local flat = redis.call('HGETALL', K_TASKS)
  local tasks = {}
  for i = 1, #flat, 2 do
    local aid, attr = string.match(flat[i], '^(.*):(%a+)$')
    if aid then
      local task = tasks[aid]
      if not task then
        task = {}
        tasks[aid] = task
        tasks[#tasks + 1] = aid
      end
      task[attr] = flat[i + 1]
    end
  end
  local revive = {}
  for i = 1, #tasks do
    local aid = tasks[i]
    local task = tasks[aid]
    -- a lease the run's stop ended (the holder saw it cancelled or failed) is not a failed
    -- attempt: its task starts over, as a dead or lapsed one does
    local ended = task.state == 'leased' and (run[1] ~= 'running'
      or task_uint(aid, 'expires', task.expires) <= now)
    if task.state == 'dead' or ended then
      revive[#revive + 1] = {aid, task_uint(aid, 'seq', task.seq)}
    end
  end
  for i = 1, #revive do
    local aid, seq = revive[i][1], revive[i][2]
    local p = aid .. ':'
    redis.call('HSET', K_TASKS, p .. 'state', 'ready', p .. 'attempt', '0', p .. 'failures', '0',
      p .. 'expires', '0')
    redis.call('ZADD', K_QUEUE, seq, aid)
  end
  return retained(commit(run, now_seconds(), 'reset', {'status', 'running'}), 'running')
end

--- @include "includes/main"
