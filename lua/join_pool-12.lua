--[[
  join_pool: set the run's pool membership and its limits (docs/pools.md): the run hash
  fields pool, pool_weight, pool_priority, max_leases and max_tokens (plain text; the last
  two absent when unlimited). The pool's own index (pool_add-3.lua, in the pool's slot) is
  written by the client after this script, so a claim from the pool finds the run.

  KEYS[1..12] the run's keys (see includes/call.lua)
  ARGV[1] the run's change channel (see includes/call.lua)
  ARGV[2] writer id   ARGV[3] operation sequence   then ARGS:
  ARGS[1] pool name ("" leaves the pool)   ARGS[2] weight (1..1000)   ARGS[3] priority (0..9)
  ARGS[4] max_leases ("n" or "s<count>")   ARGS[5] max_tokens ("n" or "s<count>")
  ARGS[6] "keep" (optional): a run in that pool already keeps its fields as they are

  Reply:  {the delta (op "pool"; R records of the fields, which are not checkpoint fields, or
          one that changes nothing when every field already holds its value), the pool the
          run was in before ("" none), also for a retry whose first reply was lost (kept in
          the writers hash under "<writer> pool"), then pool, pool_weight, pool_priority,
          max_leases and max_tokens as stored now ("" when absent)}
  Errors: LUFT_NO_RUN, LUFT_CORRUPT, LUFT_BAD_ARG, LUFT_STALE
]]
--- @include "includes/call"
--- @include "includes/fail"
--- @include "includes/args"
--- @include "includes/keytypes"
--- @include "includes/time"
--- @include "includes/run"
--- @include "includes/commit"

local NAMES = {'pool', 'pool_weight', 'pool_priority', 'max_leases', 'max_tokens'}

-- The reply: the delta, the pool before, then the five fields as they are stored now.
local function reply(delta, before)
  local now = redis.call('HMGET', K_RUN, unpack(NAMES))
  local out = {delta, before}
  for i = 1, #NAMES do out[2 + i] = now[i] or '' end
  return out
end

local function main()
  local memo_field = WRITER .. ' pool'
  local dup = dedup()
  if dup then -- a retry: the pool it was in before, as the first attempt found it
    local seq, before = string.match(read_key(9, 'hash', 'HGET', memo_field) or '', '^(%d+) ?(.*)$')
    return reply(dup, seq == WRITER_SEQ and before or '')
  end
  local pool = ARGS[1]
  if pool == nil or not string.find(pool, '^[%w_.:-]*$') or #pool > 100 then
    fail('BAD_ARG', 'pool name is malformed')
  end
  local weight = tonumber(arg_uint(ARGS[2], 'weight'))
  local priority = tonumber(arg_uint(ARGS[3], 'priority'))
  if weight < 1 or weight > 1000 or priority > 9 then
    fail('BAD_ARG', 'weight must be 1..1000 and priority 0..9')
  end
  local max_leases, max_tokens = opt(ARGS[4], 'max_leases'), opt(ARGS[5], 'max_tokens')
  if max_leases and tonumber(arg_uint(max_leases, 'max_leases')) < 1 then
    fail('BAD_ARG', 'max_leases must be >= 1')
  end
  if max_tokens then arg_uint(max_tokens, 'max_tokens') end
  local run = read_run(unpack(NAMES))
  if ARGS[6] == 'keep' and run[4] == pool then -- in that pool already: as it is
    return reply(unchanged(run, 'pool'), pool)
  end
  local want = {pool, ARGS[2], ARGS[3], max_leases, max_tokens}
  if pool == '' then want = {} end
  local set, drop, same = {}, {}, true
  for i, name in ipairs(NAMES) do
    if want[i] ~= run[3 + i] then same = false end
    if want[i] then
      set[#set + 1], set[#set + 2] = name, want[i]
    elseif run[3 + i] then
      drop[#drop + 1] = name
    end
  end
  if same then return reply(unchanged(run, 'pool'), run[4] or '') end
  if #drop > 0 then redis.call('HDEL', K_RUN, unpack(drop)) end
  local before = run[4] or ''
  return reply(commit(run, now_seconds(), 'pool', set, nil,
    {memo_field, WRITER_SEQ .. ' ' .. before}), before)
end

--- @include "includes/main"
