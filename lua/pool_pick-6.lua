--[[
  pool_pick: pick the runs a claim from the pool tries next (docs/pools.md), after applying
  what earlier tries found.

  KEYS[1..4] the pool's keys (see includes/pool.lua)
  KEYS[5] the claiming backend's pick memo  string  "<pick seq> <run> <weight> <priority> ..."
          of its last pick ("<pick seq> ~ <ms> ..." when it picked none), expiring after
          PICK_MEMO_MS: a retry of the same pick (its reply lost) gets the same reply, and no
          correction or pass is applied twice
  KEYS[6] the pool's leases  zset  (only when the pool hash has max_leases) "<run> <agent>
          <token>" -> its lease's expiry (unix ms, written by pool_lease-2.lua after a
          claim), and "hold <KEYS[5]>" -> until when a backend's pick holds a place for the
          claim that follows it (HOLD_MS)
  ARGV[1] the pool's wake channel
  ARGV[2] the pick's sequence number (the same for every retry of one pick)
  ARGV[3] how many picks (1..64): the runs of that many consecutive picks, in order (a run of
          a large weight may come more than once)
  ARGV[4] n, the number of corrections, then n times (run, found, ms, tag): a try of `run`
          claimed nothing, and found "gone" (no such run, not running, or not in this pool:
          it leaves the pool), "empty" (nothing ready or leased, or over its token budget)
          or "wait" (only leases: the earliest lapses in `ms`); `tag` is the run's
          "<incarnation> <version>" as that try saw it. Or "unused": a pick of `run` that the
          backend dropped untried (too old): its pass goes back by 1000 / weight

  A run found empty or waiting leaves the ready set only when no wake came after what the
  try saw (its stored tag is not newer), so a submit racing with the try is never lost; a
  tag of another incarnation is replaced by the one seen and the run is tried once more.
  Runs in the sleep set whose time has come go back to the ready set. Then each pick takes
  the ready set's first run and advances its pass by 1000 / weight.

  A pool with max_leases (set by pool_lease-2.lua) counts its live leases and holds first
  (dropping those past their time, and this backend's own earlier hold: its claim is over): at
  the cap, nothing is picked and the reply says when the earliest ends; under it, one run is
  picked, and held a place until its claim's lease replaces the hold.

  Reply:  {run id, weight, priority, run id, weight, priority, ...} of the picks, then "cap"
          when the pool has max_leases; with none ready {"", ms until the earliest sleeping
          run is due, or "" when none sleeps}; at the pool's max_leases {"", ms until the
          earliest lease or hold ends, "cap"}
  Errors: LUFT_BAD_ARG, LUFT_CORRUPT
]]
--- @include "includes/fail"
--- @include "includes/pool"

local DUE = 64 -- sleeping runs moved back to the ready set by one pick, at most
local PICK_MEMO_MS = 600000
local HOLD_MS = 5000 -- a pick's hold of a place under the pool's max_leases, at most

-- May run `rid` leave the ready set, given the tag its try saw?
local function may_drop(rid, seen)
  local sinc, sv = string.match(seen or '', '^(%S+) (%d+)$')
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
  local seq, want, n = ARGV[2], tonumber(ARGV[3] or ''), tonumber(ARGV[4] or '')
  if seq == nil or not string.find(seq, '^%d+$') then fail('BAD_ARG', 'pool: pick sequence') end
  if not want or want < 1 or want > 64 or want % 1 ~= 0 then
    fail('BAD_ARG', 'pool: how many picks must be 1..64')
  end
  if not n or n < 0 or n % 1 ~= 0 or #ARGV ~= 4 + 4 * n then
    fail('BAD_ARG', 'pool: corrections are (run, found, ms, tag) each')
  end
  local memo = redis.call('GET', KEYS[5])
  if memo and string.match(memo, '^(%d+)') == seq then
    local out = {}
    for part in string.gmatch(string.sub(memo, #seq + 2), '%S+') do out[#out + 1] = part end
    if out[1] == '~' then out[1] = '' end -- none picked: {"", ms or "", ["cap"]}
    if out[1] == '' and out[2] == '~' then out[2] = '' end
    return out
  end
  -- A reply that picks none, kept as the memo too ("~" stands for "")
  local function none(wait, capped)
    local reply = {'', wait}
    if capped then reply[3] = 'cap' end
    redis.call('SET', KEYS[5], seq .. ' ~ ' .. (wait == '' and '~' or wait)
      .. (capped and ' cap' or ''), 'PX', PICK_MEMO_MS)
    return reply
  end
  -- checks first: nothing is written before every correction is known to be well formed
  for i = 0, n - 1 do
    local kind, ms = ARGV[6 + 4 * i], ARGV[7 + 4 * i]
    if kind ~= 'gone' and kind ~= 'empty' and kind ~= 'wait' and kind ~= 'unused' then
      fail('BAD_ARG', 'pool: what was found must be "gone", "empty", "wait" or "unused"')
    end
    if kind == 'wait' and not string.find(ms, '^%d+$') then fail('BAD_ARG', 'pool: wait ms') end
    if (kind == 'empty' or kind == 'wait') and not string.find(ARGV[8 + 4 * i], '^%S+ %d+$') then
      fail('BAD_ARG', 'pool: the tag seen is not "<incarnation> <version>"')
    end
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for i = 0, n - 1 do
    local rid, kind, ms, seen = ARGV[5 + 4 * i], ARGV[6 + 4 * i], ARGV[7 + 4 * i], ARGV[8 + 4 * i]
    if kind == 'gone' then
      pool_forget(rid)
    elseif kind == 'unused' then
      local score = redis.call('ZSCORE', KEYS[2], rid)
      if score then
        local w = pool_member(rid)
        redis.call('ZADD', KEYS[2], tonumber(score) - 1000 / w, rid)
      end
    elseif may_drop(rid, seen) then
      redis.call('ZREM', KEYS[2], rid)
      if kind == 'wait' and redis.call('SISMEMBER', KEYS[4], rid) == 1 then
        redis.call('ZADD', KEYS[3], now + tonumber(ms), rid)
      end
    end
  end
  local cap = redis.call('HGET', KEYS[1], 'max_leases')
  if cap then -- the pool's limit of live leases (holds of picks included)
    if not string.find(cap, '^[1-9]%d*$') then fail('CORRUPT', KEYS[1] .. ' max_leases is not a count') end
    redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. now)
    redis.call('ZREM', KEYS[6], 'hold ' .. KEYS[5])
    if redis.call('ZCARD', KEYS[6]) >= tonumber(cap) then
      local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
      return none(tostring(math.max(0, math.floor(tonumber(first[2]) - now))), true)
    end
    want = 1
  end
  local vt = pool_vt()
  local due = redis.call('ZRANGE', KEYS[3], '-inf', now, 'BYSCORE', 'LIMIT', 0, DUE)
  for i = 1, #due do
    local _, p = pool_member(due[i])
    pool_ready(due[i], p, vt)
  end
  local out, members = {}, {}
  for _ = 1, want do
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if #first == 0 then break end
    local pick = first[1]
    local m = members[pick]
    if not m then
      m = {pool_member(pick)}
      members[pick] = m
    end
    local w, p = m[1], m[2]
    local pass = tonumber(first[2]) - (9 - p) * TIER
    redis.call('ZADD', KEYS[2], (9 - p) * TIER + pass + 1000 / w, pick)
    vt = pass
    out[#out + 1], out[#out + 2], out[#out + 3] = pick, tostring(w), tostring(p)
  end
  if #out == 0 then
    local next = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    if #next == 0 then return none('', cap ~= false) end
    return none(tostring(math.max(0, math.floor(tonumber(next[2]) - now))), cap ~= false)
  end
  redis.call('HSET', KEYS[1], 'vt', tostring(vt))
  if cap then
    redis.call('ZADD', KEYS[6], now + HOLD_MS, 'hold ' .. KEYS[5])
    out[#out + 1] = 'cap'
  end
  redis.call('SET', KEYS[5], seq .. ' ' .. table.concat(out, ' '), 'PX', PICK_MEMO_MS)
  return out
end

--- @include "includes/main"
