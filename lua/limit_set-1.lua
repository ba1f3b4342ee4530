--[[
  limit_set: define (or change) a named rate limiter (docs/pools.md, "Rate limits"). A
  limiter lives in its own slot ({limit:<name>}), apart from any run or pool: many runs and
  pools may share one (one per model or provider).

  KEYS[1] the limiter   hash  requests_per_minute, tokens_per_minute (either may be absent:
                              not limited), burst_ms (how far ahead of its rate a limiter
                              admits), and its state: tat_requests, tat_tokens (GCRA's
                              theoretical arrival times, unix us), and counters admitted,
                              waits, tokens (see limit_take-2.lua)
  ARGV[1] requests per minute ("" none)   ARGV[2] tokens per minute ("" none)
  ARGV[3] burst in ms

  Changing the rates keeps the state: budget already spent stays spent. Idempotent.
  Reply:  1 when the limiter is new, else 0
  Errors: LUFT_BAD_ARG
]]
--- @include "includes/fail"

local function positive(s, what)
  if s == nil or not string.find(s, '^[1-9]%d*$') or #s > 15 then
    fail('BAD_ARG', what .. ' must be a whole number from 1 to 10^15 - 1')
  end
  return s
end

local function main()
  local rpm, tpm, burst = ARGV[1], ARGV[2], ARGV[3]
  if rpm == nil or tpm == nil or (rpm == '' and tpm == '') then
    fail('BAD_ARG', 'a rate limit needs requests_per_minute or tokens_per_minute')
  end
  if burst == nil or not string.find(burst, '^%d+$') or #burst > 12 then
    fail('BAD_ARG', 'burst must be whole milliseconds')
  end
  local set, drop = {'burst_ms', burst}, {}
  for _, f in ipairs({{'requests_per_minute', rpm}, {'tokens_per_minute', tpm}}) do
    if f[2] == '' then
      drop[#drop + 1] = f[1]
    else
      set[#set + 1], set[#set + 2] = f[1], positive(f[2], f[1])
    end
  end
  local new = redis.call('EXISTS', KEYS[1]) == 0
  if #drop > 0 then redis.call('HDEL', KEYS[1], unpack(drop)) end
  redis.call('HSET', KEYS[1], unpack(set))
  return new and 1 or 0
end

--- @include "includes/main"
