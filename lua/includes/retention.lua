--[[
  Retention: expiry of finished runs and trimming of the event log (see docs/redis-layout.md,
  "Retention").

  The rule (retain, after all of a script's writes, with the run's status after the script):
    * a running run has no TTL on any key: when its run hash has one (it was resumed, by
      reset_status_to_running or a save_checkpoint with status running), PERSIST every key;
    * a finished run (completed, failed, cancelled) whose run hash has a TTL: every key of the
      run without one (a key created after the run finished) gets the run hash's PTTL, so all
      keys expire at the same moment;
    * a finished run without a TTL, written by a backend with ttl_ms > 0: PEXPIRE every key of
      the run with ttl_ms (the script that finishes a run, or the next write by such a backend
      to a run finished without one).
  Time is frozen while a script runs, so every key gets the same expiry time.
]]
--- @defines-only
--- @include "includes/options"

local RETAIN_KEYS = 12 -- KEYS[1..12], every key of the run
local RETAIN_FINAL = {completed = true, failed = true, cancelled = true}

-- Apply the retention rule (see the header) to the run, whose status is now `status`.
local function retain(status)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl == -2 then return end
  if not RETAIN_FINAL[status] then
    if ttl >= 0 then
      for i = 1, RETAIN_KEYS do redis.call('PERSIST', KEYS[i]) end
    end
  elseif ttl > 0 then
    for i = 2, RETAIN_KEYS do
      if redis.call('PTTL', KEYS[i]) == -1 then redis.call('PEXPIRE', KEYS[i], ttl) end
    end
  elseif ttl == -1 and RETAIN_TTL_MS > 0 then
    for i = 1, RETAIN_KEYS do redis.call('PEXPIRE', KEYS[i], RETAIN_TTL_MS) end
  end
end

-- `reply` after retain(status): for `return retained(commit(...), status)`.
local function retained(reply, status)
  retain(status)
  return reply
end

-- Trim the event log (KEYS[2]) to about max_events entries (XTRIM MAXLEN ~, once per batch,
-- after its XADDs: Redis drops whole stream nodes only, so the log keeps at least max_events
-- entries). Two booleans: whether entries were removed, and whether the run hash does not say
-- so yet: the caller then sets the run field log_trimmed = 1 (it stays 1: the log never
-- becomes whole again).
local function trim_log()
  if RETAIN_MAX_EVENTS <= 0 then return false, false end
  local removed = redis.call('XTRIM', KEYS[2], 'MAXLEN', '~', RETAIN_MAX_EVENTS)
  return removed > 0, removed > 0 and redis.call('HGET', KEYS[1], 'log_trimmed') ~= '1'
end
