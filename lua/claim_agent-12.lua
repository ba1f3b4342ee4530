--[[
  claim_agent: hand out one agent task with a lease (docs/leases.md): the oldest ready task;
  when none is ready, the task whose lease lapsed longest ago (the stalled check runs here, so
  no separate process is needed; the lapse counts as a failed attempt). A task whose agent has
  an ok result meanwhile (written with or without a lease) becomes done and is skipped; a
  lapsed task at max_attempts failures becomes dead. Times are the server's clock.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] worker (the holder's name)   ARGS[2] lease duration in ms   ARGS[3] max_attempts for
          a task submitted without one (by a version before tasks kept theirs)
  ARGS[4] for a claim from a pool, the pool's name ("" or absent: a bound claim): a run that
          is not in that pool (any more) replies "" and "!pool"
  ARGS[5] the rate limiter the caller was admitted by for this claim ("" or absent: none). A
          task that names a limiter is handed out only to a claim admitted by it: to any
          other the reply is "" and "@<limiter> <expected tokens>" (take from that limiter,
          limit_take-2.lua, then claim again with it); nothing is claimed

  Reply:  an array: the delta (op "claim"; no records), then for a lease
          agent_id, token, attempt, expires (unix ms), phase_id, payload, incarnation, the
          task's limiter ("" none) and expected tokens ("" none);
          with nothing claimable: "" and the ms until the next lease lapses ("" when none is
          leased; "0" when the claim stopped after SCAN tasks that became done or dead:
          claim again at once; with max_leases live leases, the ms until the earliest ends), the delta a new version without records when tasks became
          done or dead, else one that changes nothing; on a run that is not running "" and
          "!<status>"; on a run whose total_tokens reached its max_tokens "" and "!budget".
          A retry of the same operation (its reply lost) gets the same reply again: the
          same lease, or the same marker (kept in the writers hash under "<writer> claim").
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/numbers"
--- @include "includes/args"
--- @include "includes/keytypes"
--- @include "includes/run"
--- @include "includes/commit"
--- @include "includes/tasks"

-- queue entries read at a time (the first read takes one), and at most by one claim
local PAGE, SCAN = 4, 64

-- The reply of a lease; `task` its phase, payload, limiter and expected tokens as stored
-- (nil: read them, for a retry).
local function lease_reply(delta, aid, token, attempt, expires, inc, task)
  if task == nil then
    local p = aid .. ':'
    task = read_key(10, 'hash', 'HMGET', p .. 'phase', p .. 'payload', p .. 'limiter',
      p .. 'expect')
  end
  return {delta, aid, token, attempt, expires, task[1] or '0', task[2] or '', inc,
    task[3] or '', task[4] or ''}
end

local function main()
  local memo_field = WRITER .. ' claim'
  -- A reply without a lease: its marker (the ms to wait, "@<limiter> <tokens>", "!<why>")
  -- kept as this writer's claim memo, so that a retry after a lost reply gets it again
  local function nothing(delta, marker)
    redis.call('HSET', K_WRITERS, memo_field, WRITER_SEQ .. ' - ' .. marker)
    return {delta, '', marker}
  end
  -- one probe, the history (written by commit, never read): every other key this script
  -- writes (writers, run, queue, tasks) is read first with read_key, whose WRONGTYPE is the
  -- type check; the run's other keys are not touched
  local dup = dedup({12, 'stream'})
  if dup then
    local memo = read_key(9, 'hash', 'HGET', memo_field) or ''
    local seq, aid, token, attempt, expires, inc =
      string.match(memo, '^(%d+) (%S+) (%d+) (%d+) (%d+) (%S+)$')
    if seq == WRITER_SEQ then return lease_reply(dup, aid, token, attempt, expires, inc) end
    local nseq, marker = string.match(memo, '^(%d+) %- (.*)$')
    if nseq == WRITER_SEQ then return {dup, '', marker} end
    return {dup, '', ''}
  end
  local worker = ARGS[1]
  if worker == nil or worker == '' then fail('BAD_ARG', 'worker is empty') end
  local lease_ms = tonumber(arg_uint(ARGS[2], 'lease duration'))
  local max = tonumber(arg_uint(ARGS[3], 'max_attempts'))
  if lease_ms < 1 or max < 1 then fail('BAD_ARG', 'lease duration and max_attempts must be >= 1') end
  local run = read_run('lease_token', 'max_leases', 'max_tokens', 'total_tokens', 'pool',
    'lapses', 'takeovers')
  if run[1] ~= 'running' then return nothing(unchanged(run, 'claim'), '!' .. run[1]) end
  if ARGS[4] and ARGS[4] ~= '' and run[8] ~= ARGS[4] then -- a pool's stale index entry
    return nothing(unchanged(run, 'claim'), '!pool')
  end
  local token = tonumber(run[4] and stored_uint(K_RUN, 'lease_token', run[4]) or '0')
  if run[6] and uint_ge(stored_uint(K_RUN, 'total_tokens', run[7] or '0'),
      stored_uint(K_RUN, 'max_tokens', run[6])) then -- over its token budget (docs/pools.md)
    return nothing(unchanged(run, 'claim'), '!budget')
  end
  local clock = redis.call('TIME') -- one read of the clock: ms for leases, s for updated_at
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  if run[5] then -- at most max_leases live leases: else wait for the earliest to end
    local live = read_key(11, 'zset', 'ZCOUNT', '(' .. now, '+inf')
    if live >= tonumber(stored_uint(K_RUN, 'max_leases', run[5])) then
      local first = redis.call('ZRANGE', K_QUEUE, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
        'WITHSCORES')
      return nothing(unchanged(run, 'claim'), first[2] and whole(tonumber(first[2]) - now) or '0')
    end
  end

  -- 1. reads and decisions: skip tasks that are done or dead by now; pick the first claimable.
  -- The queue's head is read one entry first (it almost always decides), then PAGE at a time,
  -- at most SCAN entries in all; past that the reply says "try again now" (wait 0), since
  -- the tasks this claim ends leave the queue and the next claim reads past them.
  local ended, chosen, wait, lapsed = {}, nil, '', 0
  local offset, decided = 0, false
  while not decided do
    if offset >= SCAN then
      wait = '0'
      break
    end
    local size = offset == 0 and 1 or PAGE
    local head = read_key(11, 'zset', 'ZRANGE', offset, offset + size - 1, 'WITHSCORES')
    if #head == 0 then break end
    for i = 1, #head, 2 do
      local aid, score = head[i], tonumber(head[i + 1])
      local leased = score >= LEASE_SCORE
      if leased and score > now then
        wait = whole(score - now)
        decided = true
        break
      end
      local p = aid .. ':'
      -- a ready task needs its attempt, phase, payload and max; a lapsed one also its
      -- failures and submit order (a task's attempt is set when it is submitted)
      local t
      -- (and both their limiter and expected tokens)
      if leased then
        t = read_key(10, 'hash', 'HMGET', p .. 'attempt', p .. 'phase', p .. 'payload',
          p .. 'max', p .. 'limiter', p .. 'expect', p .. 'failures', p .. 'seq')
      else
        t = read_key(10, 'hash', 'HMGET', p .. 'attempt', p .. 'phase', p .. 'payload',
          p .. 'max', p .. 'limiter', p .. 'expect')
      end
      if not t[1] then fail('CORRUPT', K_QUEUE .. ' ' .. aid .. ' has no task in ' .. K_TASKS) end
      local attempt = task_uint(aid, 'attempt', t[1])
      if read_key(4, 'hash', 'HGET', p .. 'status') == 'ok' then -- done, however it was written
        ended[#ended + 1] = {aid, end_lease(aid, true), nil}
      elseif leased then -- lapsed: that attempt failed
        lapsed = lapsed + 1
        local failures = task_uint(aid, 'failures', t[7])
        local fields, _, state = end_lease(aid, false, failures,
          t[4] and task_uint(aid, 'max', t[4]) or max, task_uint(aid, 'seq', t[8]))
        if state == 'dead' then
          ended[#ended + 1] = {aid, fields, nil}
        else
          chosen, decided = {aid, attempt, t, whole(failures + 1)}, true
          break
        end
      else
        chosen, decided = {aid, attempt, t}, true
        break
      end
    end
    offset = offset + size
    if #head < 2 * size then break end
  end

  -- a task of a rate limiter this claim was not admitted by: take from it first
  if chosen and chosen[3][5] and chosen[3][5] ~= (ARGS[5] or '') then
    if chosen[4] then lapsed = lapsed - 1 end -- (its lapse is counted when it is claimed)
    wait, chosen = '@' .. chosen[3][5] .. ' ' .. (chosen[3][6] or '0'), nil
  end
  -- counters (not checkpoint fields): lapses found, and takeovers (a lapsed task claimed)
  local counters = {}
  if lapsed > 0 then
    counters = {'lapses', whole(tonumber(stored_uint(K_RUN, 'lapses', run[9] or '0')) + lapsed)}
  end
  if chosen and chosen[4] then
    counters[#counters + 1] = 'takeovers'
    counters[#counters + 1] = whole(tonumber(stored_uint(K_RUN, 'takeovers', run[10] or '0')) + 1)
  end

  -- 2. writes
  for i = 1, #ended do write_task_end(ended[i][1], ended[i][2], ended[i][3]) end
  if not chosen then
    if #ended == 0 then return nothing(unchanged(run, 'claim'), wait) end
    return nothing(commit(run, clock[1], 'claim', counters), wait)
  end
  local aid, attempt = chosen[1], whole(chosen[2] + 1)
  token = whole(token + 1)
  local expires = whole(now + lease_ms)
  local p = aid .. ':'
  local fields = {p .. 'state', 'leased', p .. 'attempt', attempt, p .. 'token', token,
    p .. 'holder', worker, p .. 'expires', expires}
  if not chosen[3][4] then -- a task submitted without its max_attempts: the claim's, kept
    fields[#fields + 1], fields[#fields + 2] = p .. 'max', ARGS[3]
  end
  if chosen[4] then -- a lapsed task's failed attempt (a ready task's failures stay as stored)
    fields[#fields + 1], fields[#fields + 2] = p .. 'failures', chosen[4]
  end
  redis.call('HSET', K_TASKS, unpack(fields))
  redis.call('ZADD', K_QUEUE, expires, aid)
  local inc = run[3] or (WRITER .. '-' .. WRITER_SEQ) -- as commit() sets it for a 0.1.0 run
  -- lease_token: a counter, not a checkpoint field (set with the version: an R record); the
  -- lease, for a retry of this claim, in the same HSET as the writer's entry
  counters[#counters + 1], counters[#counters + 2] = 'lease_token', token
  local delta = commit(run, clock[1], 'claim', counters, nil, {memo_field,
    WRITER_SEQ .. ' ' .. aid .. ' ' .. token .. ' ' .. attempt .. ' ' .. expires .. ' ' .. inc})
  local t = chosen[3]
  return lease_reply(delta, aid, token, attempt, expires, inc, {t[2], t[3], t[5], t[6]})
end

--- @include "includes/main"
