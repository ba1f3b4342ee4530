--[[
  Agent tasks (docs/leases.md), KEYS[10] and the queue KEYS[11]. A task's attributes: phase,
  payload (opaque msgpack), seq (submit order), state (ready | leased | done | dead), attempt
  (hand-outs), failures (failed attempts), max (max_attempts of its last claim), token (its
  current fencing token, "0" before the first claim), holder (the worker of the last claim),
  expires (the lease's expiry, unix ms, server clock). The run hash keeps the counters
  lease_token (the last fencing token of this incarnation: strictly increasing, never
  reused) and task_seq.
]]
--- @defines-only
--- @include "includes/call"
--- @include "includes/numbers"

-- The ready score of a task (its submit order) and the smallest lease score (an expiry in
-- unix ms): every submit order is far below it.
local LEASE_SCORE = 1e12

-- The writes that end task `aid`'s lease as it stands: `ok` makes it done (its failures stay
-- as stored); otherwise a failed attempt (`failures`, `max` and `seq`, its submit order, as
-- stored), ready again until `max` failures, then dead. Returns the task's HSET fields, its
-- queue score (nil: leaves the queue) and the new state.
local function end_lease(aid, ok, failures, max, seq)
  local p = aid .. ':'
  if ok then return {p .. 'state', 'done', p .. 'expires', '0'}, nil, 'done' end
  local state, score = 'dead', nil
  failures = failures + 1
  if failures < max then state, score = 'ready', seq end
  return {p .. 'state', state, p .. 'failures', whole(failures), p .. 'expires', '0'}, score, state
end

-- Apply end_lease's result (after every check of the script).
local function write_task_end(aid, fields, score)
  redis.call('HSET', K_TASKS, unpack(fields))
  if score then redis.call('ZADD', K_QUEUE, score, aid) else redis.call('ZREM', K_QUEUE, aid) end
end

-- A stored task attribute that must be a whole number.
local function task_uint(aid, attr, value)
  return tonumber(stored_uint(K_TASKS, aid .. ':' .. attr, value))
end
