--[[
  The stored attributes of a run's entities: the fields "<id>:<attr>" of the phases, results
  and sessions hashes (docs/redis-layout.md). *_ATTRS: every attribute, in the order of an E
  record (rec_entity reads them back with HMGET); *_OPTIONAL: those stored only when not null
  (or, for findings, not empty), in the order the scripts take them as arguments. Declared
  once for Lua; tests/test_lua_includes.py checks them against the records they store
  (luft_redis/types.py) and the reader (luft_redis/cache.py).
]]
--- @defines-only

local PHASE_ATTRS = {'seq', 'label', 'planned', 'ok', 'failed', 'description', 'role'}
local PHASE_OPTIONAL = {'description', 'role'}
local RESULT_ATTRS = {'status', 'phase_id', 'tokens', 'completed_at', 'output', 'findings',
  'cache_key_hash', 'description', 'role'}
local RESULT_OPTIONAL = {'output', 'findings', 'cache_key_hash', 'description', 'role'}
-- the optional text attributes of a result (after output and findings): an agent_done's
-- fields of these names fill them (append_events)
local RESULT_FILLABLE = {}
for i = 3, #RESULT_OPTIONAL do RESULT_FILLABLE[RESULT_OPTIONAL[i]] = true end
local SESSION_ATTRS = {'backend_id', 'protocol_session_id', 'session_id', 'status',
  'updated_at', 'resumable'}
local SESSION_OPTIONAL = {'backend_id', 'protocol_session_id'}
