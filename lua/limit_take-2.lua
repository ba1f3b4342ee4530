--[[
  limit_take: take from a named rate limiter, or charge it (docs/pools.md, "Rate limits"):
  GCRA, as redis-cell, on two budgets at once, requests and tokens. Each budget keeps a
  theoretical arrival time (tat, unix us): spending n units moves it n * 60e6 / rate us later,
  and the limiter admits while tat - now <= burst.

  KEYS[1] the limiter (see limit_set-1.lua)
  KEYS[2] the taking backend's memo  string  "<seq> <reply>" of its last take, expiring after
          MEMO_MS: a retry of the same take (its reply lost) gets the same reply and takes
          nothing more
  ARGV[1] the take's sequence number (the same for every retry of one take)
  ARGV[2] "admit": take only when every limited budget admits now, else take nothing and
          count a wait; "charge": take whatever the budgets hold (tokens an agent reported,
          or a refund when negative: a budget never goes back past now)
  ARGV[3] requests (a whole number, negative for a refund)   ARGV[4] tokens (idem)

  Counters: admitted (requests taken, net of refunds), waits (admits refused), tokens (net).
  Reply:  "0" taken; else the ms until the limiter admits (admit only)
  Errors: LUFT_NO_LIMITER <key> (no such limiter: none was set), LUFT_BAD_ARG, LUFT_CORRUPT
]]
--- @include "includes/fail"

local MEMO_MS = 600000
local AHEAD_US = 1e14 -- an arrival time at most this far ahead (3 years): stays a 15-digit number

local function signed(s, what)
  if s == nil or not string.find(s, '^%-?%d+$') or #s > 16 then
    fail('BAD_ARG', 'limit: ' .. what .. ' must be a whole number')
  end
  return tonumber(s)
end

-- A stored whole number (nil when absent), checked.
local function stored(value, field)
  if value == false then return nil end
  if not string.find(value, '^%d+$') or #value > 17 then
    fail('CORRUPT', KEYS[1] .. ' ' .. field .. ' is not a whole number')
  end
  return tonumber(value)
end

local function main()
  local seq, mode = ARGV[1], ARGV[2]
  if seq == nil or not string.find(seq, '^%d+$') then fail('BAD_ARG', 'limit: take sequence') end
  if mode ~= 'admit' and mode ~= 'charge' then fail('BAD_ARG', 'limit: "admit" or "charge"') end
  local cost = {signed(ARGV[3], 'requests'), signed(ARGV[4], 'tokens')}
  local memo = redis.call('GET', KEYS[2])
  if memo then
    local mseq, reply = string.match(memo, '^(%d+) (%d+)$')
    if mseq == seq then return reply end
  end
  local h = redis.call('HMGET', KEYS[1], 'requests_per_minute', 'tokens_per_minute', 'burst_ms',
    'tat_requests', 'tat_tokens')
  local rate = {stored(h[1], 'requests_per_minute'), stored(h[2], 'tokens_per_minute')}
  if not rate[1] and not rate[2] then fail('NO_LIMITER', KEYS[1]) end
  local burst = (stored(h[3], 'burst_ms') or 0) * 1000
  local tat = {stored(h[4], 'tat_requests'), stored(h[5], 'tat_tokens')}
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local wait = 0
  for i = 1, 2 do
    tat[i] = math.max(tat[i] or 0, now)
    if rate[i] and mode == 'admit' and tat[i] - now > burst then
      wait = math.max(wait, tat[i] - now - burst)
    end
  end
  local reply = '0'
  if wait > 0 then
    reply = string.format('%d', math.ceil(wait / 1000))
    redis.call('HINCRBY', KEYS[1], 'waits', 1)
  else
    local fields = {}
    for i, name in ipairs({'tat_requests', 'tat_tokens'}) do
      if rate[i] and cost[i] ~= 0 then
        local moved = math.min(math.max(now, tat[i] + cost[i] * 60000000 / rate[i]),
          now + AHEAD_US)
        fields[#fields + 1], fields[#fields + 2] = name, string.format('%d', math.floor(moved))
      end
    end
    if #fields > 0 then redis.call('HSET', KEYS[1], unpack(fields)) end
    -- counters (net: a refund takes back what it gives back)
    if cost[1] ~= 0 then redis.call('HINCRBY', KEYS[1], 'admitted', cost[1]) end
    if cost[2] ~= 0 then redis.call('HINCRBY', KEYS[1], 'tokens', cost[2]) end
  end
  redis.call('SET', KEYS[2], seq .. ' ' .. reply, 'PX', MEMO_MS)
  return reply
end

--- @include "includes/main"
