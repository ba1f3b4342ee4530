--[[
  The writing backend's options: two argument slots at the end of ARGV.

  Included by the writing scripts that take them (directly or through includes/retention and
  includes/fence): its per-call statement takes the two option slots off the end of ARGS
  before the script reads its own arguments. The slots are always there, at fixed positions,
  so no argument of the caller's data (a log message, a method name) is ever taken for one:

    ARGS[#ARGS - 1] the fence of a fenced write: "<agent_id> <token> <incarnation>", or ""
                (not fenced); see includes/fence.lua
    ARGS[#ARGS]     the retention options: "<ttl_ms> <max_events>", decimal, 0 = off, or ""
                (both off). ttl_ms: expire_finished_after in milliseconds; max_events: trim
                the event log to about that many entries (includes/retention.lua).
  A malformed slot, or a call without them, is the error reply LUFT_BAD_ARG before anything
  is read or written.
]]
--- @include "includes/call"

-- This call's options, set by take_options() at the start of every call that includes this.
local FENCE_AID, FENCE_TOKEN, FENCE_INC, FENCE_BAD
local RETAIN_TTL_MS, RETAIN_MAX_EVENTS = 0, 0

-- Take this call's two option slots off the end of ARGS (run right after begin_call(), at the
-- script's include line: see the @each-call line below). The error text when one is malformed.
local function take_options()
  FENCE_AID, FENCE_TOKEN, FENCE_INC, FENCE_BAD = nil, nil, nil, false
  local n = #ARGS
  local fence, retention = ARGS[n - 1], ARGS[n]
  if n < 2 then return 'LUFT_BAD_ARG the fence and retention option slots are missing' end
  ARGS[n], ARGS[n - 1] = nil, nil
  RETAIN_TTL_MS, RETAIN_MAX_EVENTS = 0, 0
  if retention ~= '' then
    local ttl, max_events = string.match(retention, '^(%d+) (%d+)$')
    if not ttl or #ttl > 15 or #max_events > 15 then
      return 'LUFT_BAD_ARG retention option ' .. string.format('%q', string.sub(retention, 1, 60))
        .. ' is not "<ttl_ms> <max_events>"'
    end
    RETAIN_TTL_MS, RETAIN_MAX_EVENTS = tonumber(ttl), tonumber(max_events)
  end
  if fence ~= '' then
    FENCE_AID, FENCE_TOKEN, FENCE_INC = string.match(fence, '^(%S+) (%d+) (%S+)$')
    FENCE_BAD = FENCE_AID == nil
  end
  return nil
end
--- @each-call do local bad = take_options(); if bad then return redis.error_reply(bad) end end
