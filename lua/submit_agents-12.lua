--[[
  submit_agents: add agent tasks to the run (docs/leases.md), atomically for the whole batch.
  Submitting an agent again with the same phase, payload, limiter and expected tokens changes
  nothing (its state and attempts stay); with any of them other, the whole batch is refused. An agent that
  already has an ok result is done at once and never handed out.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[#ARGV - 1], ARGV[#ARGV] the fence and retention option slots, always there, taken off
          first (includes/options.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] max_attempts of the new tasks (kept with each: failed attempts after which it is
          dead)   ARGS[2] number of tasks, then per task: agent_id, phase_id, payload (opaque
          msgpack), the rate limiter it is claimed under ("" none) and its expected tokens
          ("" none: what a claim takes from that limiter's token budget before it runs)

  Reply and notice: the delta, op "submit", no records (tasks are not part of the
          checkpoint: a watcher reads them with agent_tasks); when every task was known
          already, a delta that changes nothing and no notice
  Errors: LUFT_NOT_RUNNING <status> (nothing changed), LUFT_TASK_MISMATCH <agent_id> (the
          agent was submitted before with another phase or payload; nothing changed),
          LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"
--- @include "includes/args"
--- @include "includes/time"
--- @include "includes/hset_flat"
--- @include "includes/run"
--- @include "includes/commit"
--- @include "includes/retention"

local function main()
  local dup = dedup()
  if dup then return dup end
  local run = read_run('task_seq')
  if run[1] ~= 'running' then fail('NOT_RUNNING', run[1]) end
  local seq = tonumber(run[4] and stored_uint(K_RUN, 'task_seq', run[4]) or '0')
  local max = arg_uint(ARGS[1], 'max_attempts')
  if max == '0' then fail('BAD_ARG', 'max_attempts must be >= 1') end
  local count = tonumber(arg_uint(ARGS[2], 'task count'))
  if #ARGS ~= 2 + 5 * count then fail('BAD_ARG', 'argument list does not match the task count') end

  -- 1. checks
  local fields, queue, seen = {}, {}, {}
  for i = 0, count - 1 do
    local at = 3 + 5 * i
    local aid, phase, payload, limiter, expect = ARGS[at], ARGS[at + 1], ARGS[at + 2],
      ARGS[at + 3], ARGS[at + 4]
    arg_uint(phase, 'phase_id')
    if expect ~= '' and (#arg_uint(expect, 'expected tokens') > 13 or tonumber(expect) > 1e12) then
      fail('BAD_ARG', 'expected tokens must be at most 10^12')
    end
    if not string.find(limiter, '^[%w_.:-]*$') or #limiter > 100 then
      fail('BAD_ARG', 'limiter name is malformed')
    end
    if seen[aid] then fail('BAD_ARG', 'agent ' .. aid .. ' is submitted twice in one batch') end
    seen[aid] = true
    local p = aid .. ':'
    local known = redis.call('HMGET', K_TASKS, p .. 'phase', p .. 'payload', p .. 'limiter',
      p .. 'expect')
    if known[1] or known[2] then
      if known[1] ~= phase or known[2] ~= payload or (known[3] or '') ~= limiter
          or (known[4] or '') ~= expect then
        fail('TASK_MISMATCH', aid)
      end
    else
      seq = seq + 1
      local state = 'ready'
      if redis.call('HGET', K_RESULTS, p .. 'status') == 'ok' then
        state = 'done'
      else
        queue[#queue + 1] = seq
        queue[#queue + 1] = aid
      end
      local n = #fields
      fields[n + 1], fields[n + 2] = p .. 'phase', phase
      fields[n + 3], fields[n + 4] = p .. 'payload', payload
      fields[n + 5], fields[n + 6] = p .. 'seq', whole(seq)
      fields[n + 7], fields[n + 8] = p .. 'state', state
      fields[n + 9], fields[n + 10] = p .. 'attempt', '0'
      fields[n + 11], fields[n + 12] = p .. 'failures', '0'
      fields[n + 13], fields[n + 14] = p .. 'token', '0'
      fields[n + 15], fields[n + 16] = p .. 'expires', '0'
      fields[n + 17], fields[n + 18] = p .. 'max', max
      if limiter ~= '' then fields[n + 19], fields[n + 20] = p .. 'limiter', limiter end
      if expect ~= '' then fields[#fields + 1], fields[#fields + 2] = p .. 'expect', expect end
    end
  end
  if #fields == 0 then return unchanged(run, 'submit') end

  -- 2. writes
  hset_flat(K_TASKS, fields)
  for i = 1, #queue, 4000 do
    redis.call('ZADD', K_QUEUE, unpack(queue, i, math.min(i + 3999, #queue)))
  end
  redis.call('HSET', K_RUN, 'task_seq', whole(seq)) -- a counter, not a checkpoint field
  return retained(commit(run, now_seconds(), 'submit'), run[1])
end

--- @include "includes/main"
