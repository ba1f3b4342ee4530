-- luft's SQLite schema as docs/interop.md and shared/spec/luft-stores.md document it (the
-- columns luft-redis reads and writes, plus a few of the others); tests/test_interop*.py read it
CREATE TABLE runs (
    run_id BLOB PRIMARY KEY, task TEXT NOT NULL, status TEXT NOT NULL,
    started_ts TEXT NOT NULL, total_input_tokens INTEGER NOT NULL DEFAULT 0,
    total_output_tokens INTEGER NOT NULL DEFAULT 0, report TEXT, script_path TEXT,
    created_at INTEGER NOT NULL DEFAULT (unixepoch()), run_dir TEXT
);
CREATE TABLE checkpoints (
    run_id BLOB PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
    status TEXT NOT NULL, current_phase INTEGER NOT NULL DEFAULT 0,
    total_tokens INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, workflow_meta TEXT,
    started_agent_ids TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE phases (
    run_id BLOB NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE, phase_id INTEGER NOT NULL,
    label TEXT NOT NULL, planned INTEGER NOT NULL DEFAULT 0, ok INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, started_ts TEXT, done_ts TEXT, description TEXT,
    role TEXT, PRIMARY KEY (run_id, phase_id)
);
CREATE TABLE agents (
    run_id BLOB NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE, agent_id BLOB NOT NULL,
    phase_id INTEGER NOT NULL, status TEXT NOT NULL, model TEXT, prompt_preview TEXT,
    output TEXT, findings_json TEXT NOT NULL DEFAULT '[]',
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    started_ts TEXT, done_ts TEXT, elapsed_ms INTEGER, cache_key_hash TEXT, description TEXT,
    role TEXT, completed_at INTEGER NOT NULL DEFAULT 0, retry_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, agent_id)
);
CREATE TABLE agent_sessions (
    run_id BLOB NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE, agent_id BLOB NOT NULL,
    backend_id TEXT, protocol_session_id TEXT, session_id TEXT NOT NULL, status TEXT NOT NULL,
    updated_at INTEGER NOT NULL, resumable INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, agent_id)
);
CREATE TABLE findings (
    run_id BLOB NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE, agent_id BLOB NOT NULL,
    kind TEXT NOT NULL, severity TEXT NOT NULL, title TEXT NOT NULL, detail TEXT NOT NULL,
    file_path TEXT, line_start INTEGER, line_end INTEGER, evidence TEXT, data TEXT,
    PRIMARY KEY (run_id, agent_id, title)
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id BLOB NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    ts TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL
);
