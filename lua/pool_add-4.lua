--[[
  pool_add: a run joins a pool, or is woken in it (it may have claimable work: after a
  submit, a release, a failed finish, a resume), or leaves it (docs/pools.md).

  KEYS[1..4] the pool's keys (see includes/pool.lua)   ARGV[1] the pool's wake channel
  ARGV[2] "add" or "leave"   ARGV[3] the run id
  add:    ARGV[4] weight (1..1000)   ARGV[5] priority (0..9)   ARGV[6] the tag
          "<incarnation> <version>" of the run as the write that woke it left it ("" unknown)

  An add sets the run's weight, priority and tag, puts it in the ready set (at the virtual
  time, unless it is there already: then at its pass, in its new priority's tier), takes it
  out of the sleep set and publishes its id on the wake channel, so a blocked claim picks
  again. It is idempotent: a retry changes nothing more. A leave removes the run.

  Reply:  1 when the run was not in the ready set (add) or was a member (leave), else 0
  Errors: LUFT_BAD_ARG, LUFT_CORRUPT
]]
--- @include "includes/fail"
--- @include "includes/pool"

local function main()
  local op, rid = ARGV[2], ARGV[3]
  if (op ~= 'add' and op ~= 'leave') or rid == nil or not string.find(rid, '^[%x-]+$') then
    fail('BAD_ARG', 'pool: expected "add" or "leave" and a run id')
  end
  if op == 'leave' then return pool_forget(rid) end
  local w, p, tag = ARGV[4], ARGV[5], ARGV[6]
  if not (w and p and tag and string.find(w, '^%d+$') and string.find(p, '^%d$')
      and tonumber(w) >= 1 and tonumber(w) <= 1000) then
    fail('BAD_ARG', 'pool: weight must be 1..1000 and priority 0..9')
  end
  local vt = pool_vt()
  local old = redis.call('ZSCORE', KEYS[2], rid)
  local fields = {rid .. ':w', w, rid .. ':p', p}
  if tag ~= '' then fields[#fields + 1], fields[#fields + 2] = rid .. ':t', tag end
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('SADD', KEYS[4], rid)
  local added = 0
  if old then -- keep its pass, in the tier of its (maybe new) priority
    local pass = tonumber(old) % TIER
    redis.call('ZADD', KEYS[2], (9 - tonumber(p)) * TIER + pass, rid)
  else
    pool_ready(rid, tonumber(p), vt)
    added = 1
  end
  redis.call('SPUBLISH', ARGV[1], rid)
  return added
end

--- @include "includes/main"
