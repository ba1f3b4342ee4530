--[[
  pool_pick: pick the run a claim from the pool tries next (docs/pools.md), after applying
  what the previous try found.

  KEYS[1..4] the pool's keys (see includes/pool.lua)
  KEYS[5] the claiming backend's pick memo  string  "<pick seq> <run> <weight> <priority>" of
          its last pick, expiring after PICK_MEMO_MS: a retry of the same pick (its reply
          lost) gets that pick again, and no pass advances twice
  ARGV[1] the pool's wake channel
  ARGV[2] the run the previous try of this claim found nothing to claim in ("" none)
  ARGV[3] what it found: "gone" (no such run, or not running: it leaves the pool), "empty"
          (nothing ready or leased, or over its token budget), "wait" (only leases: the
          earliest lapses in ARGV[4] ms)
  ARGV[4] ms (for "wait")   ARGV[5] the run's tag "<incarnation> <version>" as that try saw it
  ARGV[6] the pick's sequence number (the same for every retry of one pick)

  A run found empty or waiting leaves the ready set only when no wake came after what the
  try saw (its stored tag is not newer), so a submit racing with the try is never lost; a
  tag of another incarnation is replaced by the one seen and the run is tried once more.
  Runs in the sleep set whose time has come go back to the ready set. Then the ready set's
  first run is picked, and its pass advances by 1000 / weight.

  Reply:  {run id, weight, priority} of the picked run; with none ready {"", ms until the
          earliest sleeping run is due, or "" when none sleeps}
  Errors: LUFT_BAD_ARG, LUFT_CORRUPT
]]
--- @include "includes/fail"
--- @include "includes/pool"

local DUE = 64 -- sleeping runs moved back to the ready set by one pick, at most
local PICK_MEMO_MS = 600000

-- May run `rid` leave the ready set, given the tag its try saw?
local function may_drop(rid, seen)
  local sinc, sv = string.match(seen, '^(%S+) (%d+)$')
  if not sinc then fail('BAD_ARG', 'pool: the tag seen is not "<incarnation> <version>"') end
  local tag = redis.call('HGET', KEYS[1], rid .. ':t')
  if not tag then return true end
  local inc, v = string.match(tag, '^(%S+) (%d+)$')
  if not inc then fail('CORRUPT', KEYS[1] .. ' ' .. rid .. ':t is not "<incarnation> <version>"') end
  if inc == sinc then return tonumber(v) <= tonumber(sv) end
  redis.call('HSET', KEYS[1], rid .. ':t', seen) -- another incarnation: try it once more
  return false
end

local function main()
  local rid, kind, seq = ARGV[2], ARGV[3], ARGV[6]
  if seq == nil or not string.find(seq, '^%d+$') then fail('BAD_ARG', 'pool: pick sequence') end
  local memo = redis.call('GET', KEYS[5])
  if memo then
    local mseq, mrun, mw, mp = string.match(memo, '^(%d+) (%S+) (%d+) (%d)$')
    if mseq == seq then return {mrun, mw, mp} end
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if rid == nil or kind == nil then fail('BAD_ARG', 'pool: expected a run and what was found') end
  if rid ~= '' then
    if kind == 'gone' then
      pool_forget(rid)
    elseif kind == 'empty' or kind == 'wait' then
      local ms = tonumber(ARGV[4] or '')
      if kind == 'wait' and (ms == nil or ms < 0) then fail('BAD_ARG', 'pool: wait ms') end
      if may_drop(rid, ARGV[5] or '') then
        redis.call('ZREM', KEYS[2], rid)
        if kind == 'wait' and redis.call('SISMEMBER', KEYS[4], rid) == 1 then
          redis.call('ZADD', KEYS[3], now + ms, rid)
        end
      end
    else
      fail('BAD_ARG', 'pool: what was found must be "gone", "empty" or "wait"')
    end
  end
  local vt = pool_vt()
  local due = redis.call('ZRANGE', KEYS[3], '-inf', now, 'BYSCORE', 'LIMIT', 0, DUE)
  for i = 1, #due do
    local _, p = pool_member(due[i])
    pool_ready(due[i], p, vt)
  end
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #first == 0 then
    local next = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    if #next == 0 then return {'', ''} end
    return {'', tostring(math.max(0, math.floor(tonumber(next[2]) - now)))}
  end
  local pick = first[1]
  local w, p = pool_member(pick)
  local pass = tonumber(first[2]) - (9 - p) * TIER
  redis.call('ZADD', KEYS[2], (9 - p) * TIER + pass + 1000 / w, pick)
  redis.call('HSET', KEYS[1], 'vt', tostring(pass))
  redis.call('SET', KEYS[5], seq .. ' ' .. pick .. ' ' .. w .. ' ' .. p, 'PX', PICK_MEMO_MS)
  return {pick, tostring(w), tostring(p)}
end

--- @include "includes/main"
