--[[
  This call's keys and arguments: every script of a run includes it (the others through the
  includes they use).

  Every script of a run receives the twelve keys of one run, in this order (see
  luft_redis/keys.py and docs/redis-layout.md):
    KEYS[1]  run            hash    status, task, totals, timestamps, version
    KEYS[2]  events         stream  the event log
    KEYS[3]  phases         hash    <phase_id>:<attr>
    KEYS[4]  results        hash    <agent_id>:<attr>
    KEYS[5]  sessions       hash    <agent_id>:<attr>
    KEYS[6]  started        hash    <agent_id> -> "<seq> <phase_id>"
    KEYS[7]  findings       hash    segment id -> msgpack list of findings
    KEYS[8]  findings_order list    segment ids in order
    KEYS[9]  writers        hash    <writer id> -> "<op seq> <reply>" (exactly-once writes)
    KEYS[10] tasks          hash    <agent_id>:<attr> -> the agent tasks (includes/tasks.lua)
    KEYS[11] queue          zset    agent_id -> its submit order (ready) or lease expiry in ms
                                    (leased): the oldest ready task, then the lease that
                                    lapsed longest ago, sort first
    KEYS[12] history        stream  one entry per version: what it changed (includes/history.lua)

  Every writing script takes ARGV[1] = the run's change channel, the sharded pub/sub channel
  of its change notices (<prefix>:{<run>}:changes, in the run's slot; a channel is not a key,
  so it is not declared in KEYS: a declared name that never exists would make a migrating
  slot answer TRYAGAIN to every call), ARGV[2] = writer id and ARGV[3] = the writer's
  operation sequence number, made before the first attempt (includes/commit.lua); its own
  arguments follow and are read as ARGS[i] (= ARGV[i + 3]).

  A script reads and checks everything first and writes only afterwards, so an error reply
  never leaves a half-applied change.
]]
-- Set at the start of every call by begin_call() (below): an include is defined once per
-- library load (FUNCTION LOAD) and its state is per call.
local K_RUN, K_EVENTS, K_PHASES, K_RESULTS
local K_SESSIONS, K_STARTED, K_FINDINGS, K_FINDINGS_ORDER
local K_WRITERS, K_TASKS, K_QUEUE, K_HISTORY
local CHANNEL, WRITER, WRITER_SEQ
local ARGS

-- Bind this call's keys and arguments. The loader runs the statement of the @each-call line
-- where a script includes this file, or an include that uses it (scripts.py).
local function begin_call()
  K_RUN, K_EVENTS, K_PHASES, K_RESULTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  K_SESSIONS, K_STARTED, K_FINDINGS, K_FINDINGS_ORDER = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
  K_WRITERS, K_TASKS, K_QUEUE, K_HISTORY = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
  CHANNEL, WRITER, WRITER_SEQ = ARGV[1], ARGV[2], ARGV[3]
  local n = #ARGV
  if n <= 4000 then
    ARGS = {unpack(ARGV, 4, n)} -- one table of the right size (no rehash per element)
  else -- (Lua's unpack has a stack limit)
    ARGS = {}
    for i = 4, n do ARGS[i - 3] = ARGV[i] end
  end
end
--- @each-call begin_call()
