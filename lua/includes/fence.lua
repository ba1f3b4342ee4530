--[[
  Fenced writes. A fenced write carries "<agent_id> <token> <incarnation>" in its fence slot
  (includes/options.lua): it is applied only when the run's incarnation and the task's token
  are those of the lease (check_fence), else LUFT_LEASE_LOST and nothing is written.
]]
--- @defines-only
--- @include "includes/options"
--- @include "includes/fail"
--- @include "includes/keytypes"

-- A fenced write (FENCE_AID set): the run's incarnation and the agent's current token must be
-- the lease's, else LUFT_LEASE_LOST "<agent_id> <stale token> <current token or ->" and
-- nothing is written. Returns the fenced agent id and the task's state ("leased", or after
-- the lease's own agent_done "done", "ready" or "dead"), or nil for a write without a lease.
-- Its read of the task's token is the tasks hash's type check (read_key).
local function check_fence(run)
  if FENCE_BAD then fail('BAD_ARG', 'fence argument is not "<agent> <token> <inc>"') end
  if not FENCE_AID then return nil end
  local p = FENCE_AID .. ':'
  local task = read_key(10, 'hash', 'HMGET', p .. 'token', p .. 'state')
  local current = task[1]
  if (run[3] or '') ~= FENCE_INC then current = nil end
  if current ~= FENCE_TOKEN then
    fail('LEASE_LOST', FENCE_AID .. ' ' .. FENCE_TOKEN .. ' ' .. (current or '-'))
  end
  return FENCE_AID, task[2]
end

-- LUFT_LEASE_LOST "<agent_id> <token> ended" for a fenced write that would contradict the
-- agent_done that ended its own lease: a second agent_done, or a result of the other outcome
-- (see fenced_result_ok). The lease's token stays current until the next claim, so the
-- agent's result may follow its agent_done.
local function fence_ended()
  fail('LEASE_LOST', FENCE_AID .. ' ' .. FENCE_TOKEN .. ' ended')
end

-- A fenced result with status `status` for a task in `state` (check_fence's): while leased
-- any; after the lease's ok agent_done (done) only an ok one; after a failed one (ready or
-- dead) only one that is not ok.
local function check_fenced_result(state, status)
  if state ~= 'leased' and (state == 'done') ~= (status == 'ok') then fence_ended() end
end
