--[[
  pool_lease: a pool's limit of live leases across its runs (docs/pools.md, "A pool's
  max_leases"): set it, and keep the pool's leases as the claims, renews and ends of leases
  claimed from the pool report them.

  KEYS[1] the pool's hash (see includes/pool.lua): its field max_leases
  KEYS[2] the pool's leases  zset  "<run> <agent> <token>" -> the lease's expiry (unix ms), and
          "hold <pick memo key>" -> until when a backend's pick holds a place (pool_pick-6.lua)
  ARGV[1] the pool's wake channel   ARGV[2] the operation, then its arguments:
  limit   ARGV[3] max_leases ("" none: no limit; the leases key is dropped)
  lease   ARGV[3] the lease "<run> <agent> <token>"   ARGV[4] its expiry (unix ms)
          ARGV[5] the pick memo key whose hold it replaces: after a claim
  renew   ARGV[3] the lease   ARGV[4] its new expiry: moved when it is there, never added
          (it may have ended since the renew: a report arriving late adds no ghost)
  end     ARGV[3] the lease: it ended (finished, released); a blocked claim of the pool is
          woken (SPUBLISH ARGV[1])

  Every operation is idempotent: a retry changes nothing more.
  Reply:  1 when something changed, else 0
  Errors: LUFT_BAD_ARG
]]
--- @include "includes/fail"

local function lease_member(s)
  if s == nil or not string.find(s, '^[%x-]+ [%x-]+ %d+$') then
    fail('BAD_ARG', 'pool: a lease is "<run> <agent> <token>"')
  end
  return s
end

local function main()
  local op = ARGV[2]
  if op == 'limit' then
    local cap = ARGV[3]
    if cap == nil or (cap ~= '' and (not string.find(cap, '^[1-9]%d*$') or #cap > 10)) then
      fail('BAD_ARG', 'pool: max_leases must be a whole number >= 1')
    end
    if cap == '' then
      redis.call('DEL', KEYS[2])
      local removed = redis.call('HDEL', KEYS[1], 'max_leases')
      if removed == 1 then redis.call('SPUBLISH', ARGV[1], '') end -- no limit: look again
      return removed
    end
    if redis.call('HGET', KEYS[1], 'max_leases') == cap then return 0 end
    redis.call('HSET', KEYS[1], 'max_leases', cap)
    redis.call('SPUBLISH', ARGV[1], '') -- a raised limit: blocked claims look again
    return 1
  elseif op == 'lease' or op == 'renew' then
    local member, expires, hold = lease_member(ARGV[3]), ARGV[4], ARGV[5]
    if not (expires and string.find(expires, '^%d+$') and hold) then
      fail('BAD_ARG', 'pool: a lease needs its expiry and the hold it replaces')
    end
    if op == 'renew' then return redis.call('ZADD', KEYS[2], 'XX', 'CH', expires, member) end
    if hold ~= '' then redis.call('ZREM', KEYS[2], 'hold ' .. hold) end
    if redis.call('HEXISTS', KEYS[1], 'max_leases') == 0 then return 0 end -- no limit (now)
    return redis.call('ZADD', KEYS[2], 'CH', expires, member)
  elseif op == 'end' then
    if redis.call('ZREM', KEYS[2], lease_member(ARGV[3])) == 0 then return 0 end
    redis.call('SPUBLISH', ARGV[1], '')
    return 1
  end
  fail('BAD_ARG', 'pool: expected "limit", "lease", "renew" or "end"')
end

--- @include "includes/main"
