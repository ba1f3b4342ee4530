--[[
  A pool's index (docs/pools.md), in the pool's slot ({pool:<name>}), for pool_add-4.lua and
  pool_pick-6.lua. These scripts take the pool's keys, not a run's: a run lives in its own
  slot, so a claim from a pool picks a run here, then claims in the run's slot.

    KEYS[1] pool     hash  vt (the virtual time: the pass of the last pick), and per run
                           <run>:w (weight), <run>:p (priority), <run>:t (the tag
                           "<incarnation> <version>" of the write that last woke it)
    KEYS[2] ready    zset  run -> (9 - priority) * 1e13 + pass: the runs that may have
                           claimable work, lowest first (higher priority, then smaller pass)
    KEYS[3] sleep    zset  run -> unix ms when its earliest lease lapses (it had nothing
                           ready, only leased tasks, when a claim last looked)
    KEYS[4] members  set   every run that joined and has not been found gone
  ARGV[1] the pool's wake channel (SPUBLISH <prefix>:{pool:<name>}:wake, payload the run id)

  Fair shares are stride scheduling: each pick adds 1000 / weight to the picked run's pass,
  so runs are picked in proportion to their weights; a run that enters the ready set starts
  at the virtual time, so a run that joins later is picked within one round.
]]
--- @defines-only
--- @include "includes/fail"

local TIER = 1e13

-- The stored weight and priority of run `rid` (numbers), checked.
local function pool_member(rid)
  local w, p = unpack(redis.call('HMGET', KEYS[1], rid .. ':w', rid .. ':p'))
  if not (w and p and string.find(w, '^%d+$') and string.find(p, '^%d$')) then
    fail('CORRUPT', KEYS[1] .. ' ' .. rid .. ' has no weight and priority')
  end
  return tonumber(w), tonumber(p)
end

-- The virtual time (a number).
local function pool_vt()
  local vt = redis.call('HGET', KEYS[1], 'vt')
  if vt == false then return 0 end
  local n = tonumber(vt)
  if n == nil or n < 0 then fail('CORRUPT', KEYS[1] .. ' vt is not a number') end
  return n
end

-- Put run `rid` (priority `p`) in the ready set unless it is there: at the virtual time.
local function pool_ready(rid, p, vt)
  redis.call('ZREM', KEYS[3], rid)
  redis.call('ZADD', KEYS[2], 'NX', (9 - p) * TIER + vt, rid)
end

-- Run `rid` leaves the index (found gone, or left).
local function pool_forget(rid)
  redis.call('HDEL', KEYS[1], rid .. ':w', rid .. ':p', rid .. ':t')
  redis.call('ZREM', KEYS[2], rid)
  redis.call('ZREM', KEYS[3], rid)
  return redis.call('SREM', KEYS[4], rid)
end
