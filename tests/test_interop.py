"""Moving runs between Redis and luft's stores: luft_redis.interop and its CLI commands.

Round trips (run directory: byte-equal; SQLite: row-equal), import as a restore (stored
timestamps kept, the stored layout of the normal write path, a notice that makes bound caches
reload), atomicity (a bad file leaves nothing behind and an existing run untouched), bounded
memory for 100,000 events, typed errors naming file and line, table and column.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis import RedisCheckpointBackend, interop
from luft_redis import types as t
from luft_redis.errors import RunExistsError, RunNotFoundError
from luft_redis.interop import (
    RunFileError,
    SqliteSchemaError,
    dumps_compact,
    dumps_pretty,
)
from luft_redis.keys import run_index_key, run_keys

Client = Any

RUN = uuid.UUID("0193a1b2-0000-7000-8000-000000000001")
A1 = uuid.UUID("0193a1b2-0000-7000-8000-0000000000a1")
A2 = uuid.UUID("0193a1b2-0000-7000-8000-0000000000a2")
A3 = uuid.UUID("0193a1b2-0000-7000-8000-0000000000a3")

# luft's exact JSON lines (serde_json::to_string of AgentEvent), written out by hand
LUFT_EVENTS = [
    f'{{"type":"run_started","run_id":"{RUN}","task":"review the repo ✓","ts":"2025-01-02T03:04:05.123456789Z"}}',  # noqa: E501
    f'{{"type":"budget_set","run_id":"{RUN}","time_limit_ms":60000,"max_rounds":null}}',
    f'{{"type":"phase_started","run_id":"{RUN}","phase_id":1,"label":"scan","planned":2,"description":"look \\"around\\"","role":null,"ts":"2025-01-02T03:04:06Z"}}',  # noqa: E501
    f'{{"type":"agent_started","run_id":"{RUN}","phase_id":1,"agent_id":"{A1}","prompt_preview":"find bugs","model":"m-1","description":null,"role":"reviewer","name":"a1","agent_seq":1,"ts":"2025-01-02T03:04:06.500Z"}}',  # noqa: E501
    f'{{"type":"agent_started","run_id":"{RUN}","phase_id":1,"agent_id":"{A2}","prompt_preview":"find more","model":null,"description":null,"role":null,"name":null,"agent_seq":2,"ts":"2025-01-02T03:04:06.600Z"}}',  # noqa: E501
    f'{{"type":"agent_progress","run_id":"{RUN}","agent_id":"{A1}","delta":{{"kind":"tokens","usage":{{"input":5,"output":1,"cache_read":0,"cache_write":0}}}}}}',
    f'{{"type":"log","run_id":"{RUN}","agent_id":"{A1}","level":"warn","msg":"tab\\there\\nnew line \\u0001 ü"}}',  # noqa: E501
    f'{{"type":"agent_done","run_id":"{RUN}","agent_id":"{A1}","status":"Ok","tokens":{{"input":100,"output":50,"cache_read":7,"cache_write":0}},"elapsed_ms":1234,"name":"a1","agent_seq":1,"ts":"2025-01-02T03:04:09.000001Z","output":{{"score":0.25,"big":1e20,"tiny":1e-7,"n":3,"ok":true}},"findings":[{{"kind":"bug","severity":"high","title":"off by one","detail":"loop","location":{{"file":"src/a.rs","line":42}},"evidence":["x < n"],"data":{{"conf":0.9}}}}],"prompt":"find bugs","retry_count":1}}',  # noqa: E501
    f'{{"type":"agent_done","run_id":"{RUN}","agent_id":"{A2}","status":"TimedOut","tokens":{{"input":10,"output":0,"cache_read":0,"cache_write":0}},"elapsed_ms":99,"name":null,"agent_seq":2,"ts":"2025-01-02T03:04:10Z","output":null,"findings":[],"prompt":"","retry_count":0}}',
    f'{{"type":"phase_done","run_id":"{RUN}","phase_id":1,"ok":1,"failed":1,"ts":"2025-01-02T03:04:11Z"}}',
    '{"type":"signal_received","run_id":null,"signal":"SIGTERM","ts":"2025-01-02T03:04:12Z"}',
    f'{{"type":"run_done","run_id":"{RUN}","status":"failed","total_tokens":{{"input":110,"output":50,"cache_read":0,"cache_write":0}},"report":{{"summary":"done","items":[1,2.5,-3]}},"ts":"2025-01-02T03:04:13Z"}}',
]


def _build_run(client: Client, prefix: str = "luft") -> RedisCheckpointBackend:
    """A run written through the normal path: init, events, a result upsert, a session."""
    backend = RedisCheckpointBackend(client, prefix=prefix, watch=False)
    meta = {"workflow": "wf.lua", "weights": [0.5, 1.0]}
    backend.init_run_with_meta(RUN, "review the repo ✓", "/runs/r1", meta)
    events = [t.AgentEvent.from_json(json.loads(line)) for line in LUFT_EVENTS]
    backend.append_events(events[:5])
    backend.upsert_agent_session(t.AgentSessionCheckpoint(
        agent_id=A1, backend_id="acp", protocol_session_id=None, session_id="s-1",
        status="active", updated_at=1735787046, resumable=True))  # fmt: skip
    backend.append_events(events[5:])
    backend.upsert_agent_result(t.AgentResultCache(
        agent_id=A3, phase_id=1, status="error", output={"e": "boom"}, findings=(),
        tokens=0, completed_at=1735787050, cache_key_hash="abc", description="late",
        role=None))  # fmt: skip
    return backend


def _all_keys(client: Client) -> list[bytes]:
    return sorted(client.scan_iter(match="*", count=1000))


def _layout(client: Client, prefix: str = "luft") -> dict[str, Any]:
    """What is stored for RUN, except what a restore makes new (version, incarnation,
    run_dir, the writers hash and the history) and the stream entry ids."""
    keys = run_keys(prefix, RUN)
    run = client.hgetall(keys.run)
    for name in (b"version", b"incarnation", b"run_dir", b"history_version"):
        run.pop(name, None)
    return {
        "run": run,
        "events": [fields for _, fields in client.xrange(keys.events)],
        "phases": client.hgetall(keys.phases),
        "results": client.hgetall(keys.results),
        "sessions": client.hgetall(keys.sessions),
        "started": client.hgetall(keys.started),
        "findings": client.hgetall(keys.findings),
        "findings_order": client.lrange(keys.findings_order, 0, -1),
    }


def _flush(client: Client) -> None:
    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.flushall()


# ------------------------------------------------------------------------ JSON forms


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1.0"), (0.25, "0.25"), (-2.5, "-2.5"), (0.1, "0.1"), (1e15, "1000000000000000.0"),
        (1e16, "1e16"), (1.5e300, "1.5e300"), (1e-4, "0.0001"), (1e-5, "0.00001"),
        (1e-6, "1e-6"), (1.234e-7, "1.234e-7"), (123456.789, "123456.789"), (-0.0, "-0.0"),
        (0.0, "0.0"), (1.7976931348623157e308, "1.7976931348623157e308"),
        (5e-324, "5e-324"), (12345678901234567.0, "1.2345678901234568e16"),
    ],
)  # fmt: skip
def test_floats_are_written_as_serde_json_writes_them(value: float, text: str) -> None:
    assert dumps_compact(value) == text
    assert json.loads(text) == value


def test_pretty_and_compact_layouts() -> None:
    value = {"a": [], "b": {}, "c": [1, {"d": None, "é": "x\ny\u0001\"\\"}], "e": True}
    assert dumps_compact(value) == (
        '{"a":[],"b":{},"c":[1,{"d":null,"é":"x\\ny\\u0001\\"\\\\"}],"e":true}'
    )
    assert dumps_pretty(value) == (
        '{\n  "a": [],\n  "b": {},\n  "c": [\n    1,\n    {\n      "d": null,\n'
        '      "é": "x\\ny\\u0001\\"\\\\"\n    }\n  ],\n  "e": true\n}'
    )
    # the same text as the standard library's indent=2 where floats do not differ
    assert dumps_pretty(value) == json.dumps(value, indent=2, ensure_ascii=False)


# ------------------------------------------------------------------- run directories


def test_export_writes_luft_run_directory(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    backend = _build_run(client)
    result = interop.export_run_dir(client, RUN, tmp_path / "out")
    assert result.events == len(LUFT_EVENTS)
    events_text = (tmp_path / "out" / "events.jsonl").read_text(encoding="utf-8")
    # luft's own lines come back byte for byte, one per line, each ended by \n
    assert events_text == "".join(line + "\n" for line in LUFT_EVENTS)
    raw = (tmp_path / "out" / "checkpoint.json").read_bytes()
    assert not raw.endswith(b"\n")
    assert "✓".encode() in raw  # UTF-8, not \u escapes
    obj = json.loads(raw)
    cp = backend.get_checkpoint()
    assert cp is not None
    assert t.RunCheckpoint.from_json(obj) == cp
    assert list(obj) == [
        "run_id", "task", "status", "current_phase", "completed_phases", "agent_results",
        "agent_sessions", "findings", "total_tokens", "created_at", "updated_at",
        "workflow_meta", "started_agent_ids",
    ]  # fmt: skip
    assert list(obj["agent_results"]) == sorted(str(a) for a in (A1, A2, A3))
    assert raw.decode("utf-8") == dumps_pretty(obj)
    assert raw.startswith(b'{\n  "run_id": "')
    # no temporary files left behind
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "checkpoint.json",
        "events.jsonl",
    ]


def test_round_trip_is_byte_equal(redis_client: Client, tmp_path: Path) -> None:
    """export, import into an empty Redis, export again: the same bytes; and the import stores
    what the normal write path stored."""
    _build_run(redis_client)
    before = _layout(redis_client)
    interop.export_run_dir(redis_client, RUN, tmp_path / "one")
    _flush(redis_client)
    assert _all_keys(redis_client) == []
    result = interop.import_run_dir(redis_client, tmp_path / "one")
    assert result == interop.ImportResult(RUN, len(LUFT_EVENTS), replaced=False)
    assert _layout(redis_client) == before
    keys = run_keys("luft", RUN)
    run = redis_client.hgetall(keys.run)
    assert run[b"version"] == b"1"
    assert run[b"run_dir"] == str((tmp_path / "one").resolve()).encode()
    inc = run[b"incarnation"].decode()
    (_writer, last), = redis_client.hgetall(keys.writers).items()  # fmt: skip
    assert last.decode() == f"2 {inc} 0 {inc} 1"
    # the run index lists it (for `luft-redis runs`), scored by its stored updated_at
    index = run_index_key("luft")
    assert redis_client.zscore(index, str(RUN)) == float(run[b"updated_at"].decode())
    # nothing else: no staging key left, no TTL on the run's keys
    beside = {index.encode(), f"{index}:status".encode(), f"{index}:counts".encode()}
    assert [k for k in _all_keys(redis_client) if k not in beside] == sorted(
        k.encode() for k in (*keys[:9], keys.history) if redis_client.exists(k)
    )
    assert all(redis_client.ttl(k) == -1 for k in (*keys[:9], keys.history))
    assert [v.op for v in RedisCheckpointBackend(redis_client, watch=False).history(RUN)] == [
        "restore"]  # its history starts at the import, with a base
    interop.export_run_dir(redis_client, RUN, tmp_path / "two")
    for name in ("checkpoint.json", "events.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    # the run works on: a later write continues it
    backend = RedisCheckpointBackend(redis_client, watch=False)
    cp = backend.open_run(RUN)
    assert cp is not None and cp.status is t.CheckpointStatus.FAILED
    backend.reset_status_to_running()
    backend.append_event(t.Log(run_id=RUN, agent_id=None, level=t.LogLevel.INFO, msg="again"))
    assert backend.version == 3
    assert len(backend.get_event_log()) == len(LUFT_EVENTS) + 1


def test_import_keeps_stored_timestamps(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    interop.export_run_dir(client, RUN, tmp_path)
    obj = json.loads((tmp_path / "checkpoint.json").read_text(encoding="utf-8"))
    obj["created_at"], obj["updated_at"] = 1_600_000_000, 1_600_000_123
    (tmp_path / "checkpoint.json").write_text(json.dumps(obj), encoding="utf-8")  # compact
    other = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    interop.import_run_dir(other, tmp_path, run_dir="/elsewhere")
    backend = RedisCheckpointBackend(other, watch=False)
    cp = backend.open_run(RUN)
    assert cp == t.RunCheckpoint.from_json(obj)
    assert (cp.created_at, cp.updated_at) == (1_600_000_000, 1_600_000_123)
    assert other.hget(run_keys("luft", RUN).run, "run_dir") == b"/elsewhere"
    assert [e.to_json() for e in backend.get_event_log()] == [json.loads(x) for x in LUFT_EVENTS]


def test_existing_run_needs_replace_and_bound_caches_reload(
    redis_client: Client, tmp_path: Path
) -> None:
    _build_run(redis_client)
    interop.export_run_dir(redis_client, RUN, tmp_path)
    obj = json.loads((tmp_path / "checkpoint.json").read_text(encoding="utf-8"))
    obj["task"] = "restored task"
    (tmp_path / "checkpoint.json").write_text(dumps_pretty(obj), encoding="utf-8")
    before = _layout(redis_client)
    with pytest.raises(RunExistsError):
        interop.import_run_dir(redis_client, tmp_path)
    assert _layout(redis_client) == before
    watcher = RedisCheckpointBackend(redis_client)  # watch=True: follows the notices
    try:
        old = watcher.open_run(RUN)
        assert old is not None and old.task == "review the repo ✓"
        result = interop.import_run_dir(redis_client, tmp_path, replace=True)
        assert result.replaced
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cp = watcher.get_checkpoint()
            if cp is not None and cp.task == "restored task" and watcher.cache_is_fresh:
                break
            time.sleep(0.02)
        assert watcher.get_checkpoint() == t.RunCheckpoint.from_json(obj)
        assert watcher.version == 1
        # the watcher writes on to the restored run
        watcher.cancel()
        synced = watcher.sync()
        assert synced is not None and synced.status is t.CheckpointStatus.FAILED
    finally:
        watcher.close()


def _write_dir(path: Path, events: list[str], checkpoint: str | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if checkpoint is None:
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        _build_run(client)
        interop.export_run_dir(client, RUN, path, overwrite=True)
    else:
        (path / "checkpoint.json").write_text(checkpoint, encoding="utf-8")
    (path / "events.jsonl").write_text("".join(e + "\n" for e in events), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "bad", "expect"),
    [
        (3, '{"type":"log",', "not JSON"),
        (2, '{"type":"no_such_event","run_id":null}', "unknown event type"),
        (4, f'{{"type":"log","run_id":"{uuid.uuid4()}","agent_id":null,"level":"info","msg":"x"}}',
         "cannot go into run"),
        (5, f'{{"type":"log","run_id":"{RUN}","agent_id":null,"level":"loud","msg":"x"}}', "level"),
        (6, "", "empty line"),
    ],
)  # fmt: skip
def test_malformed_events_name_file_and_line_and_store_nothing(
    redis_client: Client, tmp_path: Path, line: int, bad: str, expect: str
) -> None:
    events = list(LUFT_EVENTS)
    events[line - 1] = bad
    directory = _write_dir(tmp_path / "run", events)
    with pytest.raises(RunFileError) as info:
        interop.import_run_dir(redis_client, directory)
    assert info.value.line == line
    assert info.value.path == str(directory / "events.jsonl")
    assert f"events.jsonl line {line}" in str(info.value)
    assert expect in str(info.value)
    assert _all_keys(redis_client) == []  # no run, no staging keys


def test_failed_replace_leaves_the_run_as_it_was(redis_client: Client, tmp_path: Path) -> None:
    _build_run(redis_client)
    before = _layout(redis_client)
    keys_before = _all_keys(redis_client)
    events = [*LUFT_EVENTS, '{"type":"log"}']
    directory = _write_dir(tmp_path / "run", events)
    with pytest.raises(RunFileError, match="line 13"):
        interop.import_run_dir(redis_client, directory, replace=True)
    assert _layout(redis_client) == before
    assert _all_keys(redis_client) == keys_before


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("{", "checkpoint.json line 1: not JSON"),
        ('{"run_id": "x"}', "checkpoint.json: run_id:"),
        (json.dumps({"run_id": str(RUN), "task": "t", "status": "sleeping"}), "status"),
        (json.dumps({
            "run_id": str(RUN), "task": "t", "status": "running", "current_phase": 1,
            "completed_phases": [{"phase_id": 1, "label": "a", "planned": 1, "ok": 0,
                                  "failed": 0}] * 2,
            "agent_results": {}, "findings": [], "total_tokens": 0, "created_at": 1,
            "updated_at": 1}), "checkpoint.json: completed_phases: phase ids must be unique"),
    ],
)
def test_malformed_checkpoint_is_a_typed_error(tmp_path: Path, text: str, expect: str) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    directory = _write_dir(tmp_path / "run", LUFT_EVENTS, checkpoint=text)
    with pytest.raises(RunFileError, match=expect):
        interop.import_run_dir(client, directory)
    assert _all_keys(client) == []


def test_missing_files_and_existing_export(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    with pytest.raises(RunFileError, match="not a directory"):
        interop.import_run_dir(client, tmp_path / "nope")
    (tmp_path / "run").mkdir()
    with pytest.raises(RunFileError, match=r"checkpoint\.json: no such file"):
        interop.import_run_dir(client, tmp_path / "run")
    _build_run(client)
    interop.export_run_dir(client, RUN, tmp_path / "run")
    (tmp_path / "run" / "events.jsonl").unlink()
    with pytest.raises(RunFileError, match=r"events\.jsonl: no such file"):
        interop.import_run_dir(client, tmp_path / "run", replace=True)
    (tmp_path / "run" / "events.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(interop.InteropError, match="exists"):
        interop.export_run_dir(client, RUN, tmp_path / "run")
    with pytest.raises(RunNotFoundError):
        interop.export_run_dir(client, uuid.uuid4(), tmp_path / "other")


_IMPORT_AND_MEASURE = """
import json, resource, sys
import redis
from luft_redis import interop
seen = []
client = redis.Redis.from_url(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = interop.import_run_dir(client, sys.argv[2], progress=lambda d, n: seen.append((d, n)))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"events": result.events, "grew_kib": after - before, "seen": seen}))
"""


@pytest.mark.server
@pytest.mark.full  # a soak: pytest --full (CI); everyday: test_cli_export_import_round_trip
@pytest.mark.timeout(900)  # a few seconds alone; far more on a loaded machine
def test_100k_events_import_in_bounded_memory(redis_url: str, tmp_path: Path) -> None:
    """100,000 events (about 40 MB of JSON lines) import while the importing process's peak
    memory grows by less than a fifth of the file (no tracemalloc: it is too slow here)."""
    count = 100_000
    directory = tmp_path / "big"
    directory.mkdir()
    padding = "x" * 300
    with (directory / "events.jsonl").open("w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(f'{{"type":"log","run_id":"{RUN}","agent_id":null,"level":"info",'
                         f'"msg":"{i} {padding}"}}\n')  # fmt: skip
    cp = t.RunCheckpoint(run_id=RUN, task="big", status=t.CheckpointStatus.RUNNING,
                         current_phase=0, completed_phases=(), agent_results={}, findings=(),
                         total_tokens=0, created_at=1, updated_at=2)  # fmt: skip
    (directory / "checkpoint.json").write_text(dumps_pretty(cp.to_json()), encoding="utf-8")
    size_kib = (directory / "events.jsonl").stat().st_size // 1024
    proc = subprocess.run([sys.executable, "-c", _IMPORT_AND_MEASURE, redis_url, str(directory)],
                          capture_output=True, text=True, timeout=840, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["events"] == count
    assert report["grew_kib"] < size_kib / 5, (report["grew_kib"], size_kib)
    seen = [tuple(x) for x in report["seen"]]
    assert seen[-1] == (count, count)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) > 100  # reported as it went
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.xlen(run_keys("luft", RUN).events) == count
        first: Any = client.xrange(run_keys("luft", RUN).events, count=1)
        assert first[0][1][b"type"] == b"log"
        # stored in fields (stored format 3), not as the JSON line
        assert first[0][1][b"msg"] == f"0 {padding}".encode()
        assert first[0][1][b"lv"] == b"info"
    finally:
        client.close()


# -------------------------------------------------------------------------- SQLite

# luft's schema (the columns luft-redis reads and writes, plus a few of the others)
LUFT_DDL = (Path(__file__).parent / "luft_schema.sql").read_text()

FINDING_JSON = ('{"kind":"bug","severity":"high","title":"off by one","detail":"loop",'
                '"location":{"file":"src/a.rs","line":42},"evidence":["x < n"],'
                '"data":{"conf":0.9}}')  # fmt: skip
OUTPUT_JSON = '{"score":0.25,"big":1e20,"tiny":1e-7,"n":3,"ok":true}'

# the ts column of each event: its own ts, else the one before it (what export writes)
EVENT_TS = [
    "2025-01-02T03:04:05.123456789Z", "2025-01-02T03:04:05.123456789Z",
    "2025-01-02T03:04:06Z", "2025-01-02T03:04:06.500Z", "2025-01-02T03:04:06.600Z",
    "2025-01-02T03:04:06.600Z", "2025-01-02T03:04:06.600Z", "2025-01-02T03:04:09.000001Z",
    "2025-01-02T03:04:10Z", "2025-01-02T03:04:11Z", "2025-01-02T03:04:12Z",
    "2025-01-02T03:04:13Z",
]  # fmt: skip


def _luft_db(path: Path, ddl: str = LUFT_DDL, *, with_run: bool = True) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(ddl)
    if with_run:
        r = RUN.bytes
        conn.execute(
            "INSERT INTO runs (run_id, task, status, started_ts, run_dir, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (r, "review the repo ✓", "failed", EVENT_TS[0], "/runs/r1", 1735787045),
        )
        conn.execute(
            "INSERT INTO checkpoints VALUES (?, 'failed', 1, 160, 1735787045, 1735787053, ?, ?)",
            (r, '{"workflow":"wf.lua","weights":[0.5,1.0]}', f'["{A1}","{A2}"]'),
        )
        conn.execute(
            "INSERT INTO phases (run_id, phase_id, label, planned, ok, failed, started_ts, "
            "done_ts, description, role) VALUES (?, 1, 'scan', 2, 1, 1, ?, ?, ?, NULL)",
            (r, "2025-01-02T03:04:06Z", "2025-01-02T03:04:11Z", 'look "around"'),
        )
        cols = ("run_id, agent_id, phase_id, status, model, prompt_preview, output, "
                "findings_json, input_tokens, output_tokens, started_ts, done_ts, elapsed_ms, "
                "cache_key_hash, description, role, completed_at, retry_count")  # fmt: skip
        marks = ", ".join("?" * 18)
        conn.execute(f"INSERT INTO agents ({cols}) VALUES ({marks})", (
            r, A1.bytes, 1, "ok", "m-1", "find bugs", OUTPUT_JSON, f"[{FINDING_JSON}]", 100, 50,
            "2025-01-02T03:04:06.500Z", "2025-01-02T03:04:09.000001Z", 1234, None, None,
            "reviewer", 1735787049, 1))  # fmt: skip
        conn.execute(f"INSERT INTO agents ({cols}) VALUES ({marks})", (
            r, A2.bytes, 1, "timed_out", None, "find more", None, "[]", 10, 0,
            "2025-01-02T03:04:06.600Z", "2025-01-02T03:04:10Z", 99, "k2", None, None,
            1735787050, 0))  # fmt: skip
        conn.execute(f"INSERT INTO agents ({cols}) VALUES ({marks})", (
            r, A3.bytes, 1, "running", None, "still going", None, "[]", 0, 0,
            "2025-01-02T03:04:07Z", None, None, None, None, None, 0, 0))  # fmt: skip
        conn.execute(
            "INSERT INTO agent_sessions VALUES (?, ?, 'acp', NULL, 's-1', 'active', 1735787046, 1)",
            (r, A1.bytes),
        )
        conn.execute(
            "INSERT INTO findings VALUES (?, ?, 'bug', 'high', 'off by one', 'loop', "
            "'src/a.rs', 42, 42, '[\"x < n\"]', '{\"conf\":0.9}')", (r, A1.bytes),
        )  # fmt: skip
        for ts, line in zip(EVENT_TS, LUFT_EVENTS, strict=True):
            conn.execute("INSERT INTO events (run_id, ts, type, payload) VALUES (?, ?, ?, ?)",
                          (r, ts, json.loads(line)["type"], line))  # fmt: skip
    conn.commit()
    conn.close()
    return path


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {
            "runs": conn.execute("SELECT run_id, task, status, started_ts, run_dir, created_at "
                                 "FROM runs").fetchall(),
            "checkpoints": conn.execute("SELECT * FROM checkpoints").fetchall(),
            "phases": conn.execute("SELECT * FROM phases ORDER BY phase_id").fetchall(),
            "agents": conn.execute("SELECT * FROM agents WHERE status != 'running' "
                                   "ORDER BY agent_id").fetchall(),
            "agent_sessions": conn.execute("SELECT * FROM agent_sessions").fetchall(),
            "findings": conn.execute("SELECT * FROM findings").fetchall(),
            "events": conn.execute("SELECT ts, type, payload FROM events ORDER BY seq").fetchall(),
        }  # fmt: skip
    finally:
        conn.close()


def test_sqlite_import_then_export_gives_the_same_rows(
    redis_client: Client, tmp_path: Path
) -> None:
    source = _luft_db(tmp_path / "luft.db")
    assert interop.sqlite_run_ids(source) == [RUN]
    results = interop.import_sqlite(redis_client, source)
    assert results == [interop.ImportResult(RUN, len(LUFT_EVENTS), replaced=False)]
    backend = RedisCheckpointBackend(redis_client, watch=False)
    cp = backend.open_run(RUN)
    assert cp is not None
    assert (cp.created_at, cp.updated_at, cp.total_tokens) == (1735787045, 1735787053, 160)
    assert cp.status is t.CheckpointStatus.FAILED and cp.task == "review the repo ✓"
    assert set(cp.agent_results) == {A1, A2}  # the running agent has no result yet
    assert cp.agent_results[A1].tokens == 150
    assert cp.agent_results[A1].output == json.loads(OUTPUT_JSON)
    finding = t.Finding.from_json(json.loads(FINDING_JSON))
    assert cp.agent_results[A1].findings == (finding,)
    assert cp.findings == (finding,)
    assert cp.agent_sessions[A1].resumable is True
    assert cp.started_agent_ids == (A1, A2)
    assert cp.workflow_meta == {"workflow": "wf.lua", "weights": [0.5, 1.0]}
    assert [dumps_compact(e.to_json()) for e in backend.get_event_log()] == LUFT_EVENTS
    assert redis_client.hget(run_keys("luft", RUN).run, "run_dir") == b"/runs/r1"
    # the started hash keeps each agent's phase, as the normal write path does
    assert redis_client.hgetall(run_keys("luft", RUN).started) == {
        str(A1).encode(): b"1 1", str(A2).encode(): b"2 1"}  # fmt: skip

    target = _luft_db(tmp_path / "back.db", with_run=False)
    exported = interop.export_sqlite(redis_client, target, RUN)
    assert exported.events == len(LUFT_EVENTS)
    assert _rows(target) == _rows(source)
    with pytest.raises(RunExistsError):
        interop.export_sqlite(redis_client, target, RUN)
    interop.export_sqlite(redis_client, target, RUN, replace=True)
    assert _rows(target) == _rows(source)
    # importing again needs replace; then the run is replaced atomically
    with pytest.raises(RunExistsError):
        interop.import_sqlite(redis_client, source, run_id=RUN)
    assert interop.import_sqlite(redis_client, source, run_id=RUN, replace=True)[0].replaced


def test_export_sqlite_refuses_a_database_without_the_documented_columns(
    tmp_path: Path,
) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    old = LUFT_DDL.replace(", retry_count INTEGER NOT NULL DEFAULT 0", "")
    assert old != LUFT_DDL
    path = _luft_db(tmp_path / "old.db", old, with_run=False)
    with pytest.raises(SqliteSchemaError) as info:
        interop.export_sqlite(client, path, RUN)
    assert (info.value.table, info.value.column) == ("agents", "retry_count")
    assert "table agents column retry_count" in str(info.value)
    assert all(rows == [] for rows in _rows(path).values())
    only_runs = LUFT_DDL[: LUFT_DDL.index("CREATE TABLE checkpoints")]
    with pytest.raises(SqliteSchemaError, match="table checkpoints: missing"):
        interop.import_sqlite(client, _luft_db(tmp_path / "x.db", only_runs, with_run=False))
    with pytest.raises(SqliteSchemaError, match="table runs column run_id: missing"):
        interop.import_sqlite(client, _luft_db(tmp_path / "y.db", "CREATE TABLE runs (a);",
                                               with_run=False))  # fmt: skip


def test_export_sqlite_rolls_back_on_an_unknown_required_column(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    ddl = LUFT_DDL.replace("elapsed_ms INTEGER,", "elapsed_ms INTEGER, host TEXT NOT NULL,")
    path = _luft_db(tmp_path / "new.db", ddl, with_run=False)
    with pytest.raises(SqliteSchemaError) as info:
        interop.export_sqlite(client, path, RUN)
    assert (info.value.table, info.value.column) == ("agents", "host")
    assert all(rows == [] for rows in _rows(path).values())  # one transaction: nothing


def test_sqlite_bad_payload_names_the_row(tmp_path: Path) -> None:
    path = _luft_db(tmp_path / "luft.db")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE events SET payload = '{\"type\":\"log\"}' WHERE seq = 4")
    conn.commit()
    conn.close()
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    with pytest.raises(interop.SqliteDataError, match="table events, seq 4"):
        interop.import_sqlite(client, path)
    assert _all_keys(client) == []


# ---------------------------------------------------------------------------- the CLI


def _cli(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("LUFT_REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "luft_redis", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)  # fmt: skip


@pytest.fixture
def served_run(redis_url: str) -> Iterator[str]:
    client = redis.Redis.from_url(redis_url)
    _build_run(client)
    yield redis_url
    client.close()


@pytest.mark.server
def test_cli_export_import_round_trip(served_run: str, tmp_path: Path) -> None:
    url = served_run
    out = _cli("export", str(RUN), "-o", str(tmp_path / "a"), "--redis", url)
    assert out.returncode == 0, out.stderr
    assert f"run {RUN}: exported to {tmp_path / 'a'} ({len(LUFT_EVENTS)} events)" in out.stdout
    again = _cli("export", str(RUN), "-o", str(tmp_path / "a"), "--redis", url)
    assert again.returncode == 1 and "exists" in again.stderr
    refused = _cli("import", str(tmp_path / "a"), "--redis", url)
    assert refused.returncode == 1
    assert f"run {RUN} already exists under prefix 'luft'" in refused.stderr
    assert "--replace" in refused.stderr  # the message says how to replace it
    done = _cli("import", str(tmp_path / "a"), "--replace", "--redis", url)
    assert done.returncode == 0, done.stderr
    assert f"run {RUN}: replaced from" in done.stdout
    assert _cli("export", str(RUN), "-o", str(tmp_path / "b"), "--redis", url).returncode == 0
    for name in ("checkpoint.json", "events.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with (tmp_path / "a" / "events.jsonl").open("a", encoding="utf-8") as handle:
        handle.write("not json\n")
    bad = _cli("import", str(tmp_path / "a"), "--replace", "--redis", url)
    assert bad.returncode == 1
    assert f"{tmp_path / 'a' / 'events.jsonl'} line {len(LUFT_EVENTS) + 1}: not JSON" in bad.stderr
    gone = uuid.uuid4()
    missing = _cli("export", str(gone), "-o", str(tmp_path / "c"), "--redis", url)
    shown = _cli("show", str(gone), "--redis", url)
    # one wording for a missing run, whichever command meets it
    for result in (missing, shown):
        assert result.returncode == 1
        assert f"run {gone} not found under prefix 'luft'" in result.stderr, result.stderr


@pytest.mark.server
def test_cli_sqlite(served_run: str, tmp_path: Path) -> None:
    url = served_run
    target = _luft_db(tmp_path / "back.db", with_run=False)
    out = _cli("export-sqlite", str(target), str(RUN), "--redis", url)
    assert out.returncode == 0, out.stderr
    assert f"run {RUN}: exported to {target}" in out.stdout
    assert len(_rows(target)["events"]) == len(LUFT_EVENTS)
    refused = _cli("import-sqlite", str(target), "--redis", url)
    assert refused.returncode == 1 and "already exists" in refused.stderr
    assert "--replace" in refused.stderr
    done = _cli("import-sqlite", str(target), "--run", str(RUN), "--replace", "--redis", url)
    assert done.returncode == 0, done.stderr
    assert f"run {RUN}: replaced from {target} ({len(LUFT_EVENTS)} events)" in done.stdout
    old = _luft_db(tmp_path / "old.db", LUFT_DDL.replace("run_dir TEXT\n", "x TEXT\n"),
                   with_run=False)  # fmt: skip
    schema = _cli("export-sqlite", str(old), str(RUN), "--redis", url)
    assert schema.returncode == 1
    assert "table runs column run_dir: missing" in schema.stderr
    unreachable = _cli("import-sqlite", str(target), "--redis", "redis://127.0.0.1:1/0")
    assert unreachable.returncode == 2


def test_progress_reporter_plain_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from luft_redis.tools import cli_interop

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(importlib, "import_module", _no_rich())
    stream = Tty()
    with cli_interop.progress_reporter("import", stream=stream) as report:
        assert report is not None
        report(500, 1000)
        report(1000, 1000)
    text = stream.getvalue()
    assert "1000/1000 events" in text and text.endswith("\r\x1b[K")
    pipe = io.StringIO()
    with cli_interop.progress_reporter("import", stream=pipe) as report:
        assert report is None  # not a terminal: the summary line says it all
    assert pipe.getvalue() == ""


def _no_rich() -> Callable[[str], Any]:
    real = importlib.import_module

    def fake(name: str) -> Any:
        if name.startswith("rich"):
            raise ImportError(name)
        return real(name)

    return fake


def test_run_created_during_an_import_wins_and_staging_is_dropped(redis_client: Client) -> None:
    """The swap script checks again: a run created while the import streamed is kept."""
    source = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    backend = _build_run(source)
    cp = backend.get_checkpoint()
    assert cp is not None
    events = backend.get_event_log()
    rival = RedisCheckpointBackend(redis_client, watch=False)

    def racing() -> Iterator[t.AgentEvent]:
        for i, event in enumerate(events):
            if i == 3:
                rival.init_run(RUN, "the rival", "/rival")
            yield event

    with pytest.raises(RunExistsError):
        interop.import_run(redis_client, cp, racing())
    assert rival.sync() is not None and rival.get_checkpoint().task == "the rival"  # type: ignore[union-attr]
    assert redis_client.xlen(run_keys("luft", RUN).events) == 0
    assert [k for k in _all_keys(redis_client) if b":import:" in k] == []


# ------------------------------------------------------------------- a trimmed log (max_events)


def _trimmed_run(client: Client) -> int:
    """RUN with max_events=3 and 300 log events: its log is trimmed; the events left."""
    backend = RedisCheckpointBackend(client, watch=False, max_events=3)
    backend.init_run(RUN, "trimmed", "/runs/t")
    for i in range(300):
        backend.append_event(t.Log(run_id=RUN, level=t.LogLevel.INFO, msg=f"m{i}"))
    assert backend.log_trimmed
    backend.close()
    return int(client.xlen(run_keys("luft", RUN).events))


def test_export_of_a_trimmed_log_is_refused_unless_allowed(
    redis_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    left = _trimmed_run(redis_client)
    assert left < 300
    with pytest.raises(interop.LogTrimmedError) as info:
        interop.export_run_dir(redis_client, RUN, tmp_path / "d")
    assert info.value.run_id == RUN
    assert str(RUN) in str(info.value) and "trimmed" in str(info.value)
    assert isinstance(info.value, interop.InteropError)
    assert not (tmp_path / "d").exists()  # nothing written

    with caplog.at_level("WARNING", logger="luft_redis._sync.interop"):
        result = interop.export_run_dir(redis_client, RUN, tmp_path / "d", allow_trimmed=True)
    assert result.log_trimmed and result.events == left
    assert "trimmed" in caplog.text and str(RUN) in caplog.text
    lines = (tmp_path / "d" / "events.jsonl").read_text().splitlines()
    assert len(lines) == left and json.loads(lines[-1])["msg"] == "m299"

    path = _luft_db(tmp_path / "t.db", with_run=False)
    with pytest.raises(interop.LogTrimmedError, match=str(RUN)):
        interop.export_sqlite(redis_client, path, RUN)
    assert all(rows == [] for rows in _rows(path).values())
    assert interop.export_sqlite(redis_client, path, RUN, allow_trimmed=True).log_trimmed


def test_export_of_a_whole_log_says_it_is_whole(redis_client: Client, tmp_path: Path) -> None:
    _build_run(redis_client)
    assert interop.export_run_dir(redis_client, RUN, tmp_path / "w").log_trimmed is False


def test_a_log_trimmed_while_it_is_exported_is_refused_and_nothing_is_left(
    redis_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer trims the log while the export reads it: the export is refused, no file
    (nor .tmp) is left, and no SQLite row is written."""
    _build_run(redis_client)
    from luft_redis._sync import interop as sync_interop

    original = sync_interop._iter_redis_events

    def trimmed_meanwhile(*args: Any) -> Iterator[t.AgentEvent]:
        for i, event in enumerate(original(*args)):
            if i == 1:  # as max_events trimming by another process would mark it
                redis_client.hset(run_keys("luft", RUN).run, "log_trimmed", "1")
            yield event

    monkeypatch.setattr(sync_interop, "_iter_redis_events", trimmed_meanwhile)
    with pytest.raises(interop.LogTrimmedError, match=str(RUN)):
        interop.export_run_dir(redis_client, RUN, tmp_path / "d")
    assert list((tmp_path / "d").iterdir()) == []
    path = _luft_db(tmp_path / "t.db", with_run=False)
    redis_client.hdel(run_keys("luft", RUN).run, "log_trimmed")
    with pytest.raises(interop.LogTrimmedError):
        interop.export_sqlite(redis_client, path, RUN)
    assert all(rows == [] for rows in _rows(path).values())


def test_export_and_import_on_either_front_end(
    frontend: str, frontend_client: Any, redis_client: Client, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The export and import functions of both front ends (luft_redis.interop, generated, and
    luft_redis.asyncio.interop, its source) move a run directory and a SQLite database the
    same way: the files one writes, the other reads back to the same layout."""
    from luft_redis.asyncio import interop as async_interop

    module: Any = interop if frontend == "sync" else async_interop

    def run(name: str, *args: Any, **kwargs: Any) -> Any:
        function = getattr(module, name)
        if frontend == "sync":
            return function(*args, **kwargs)
        return request.getfixturevalue("async_loop").call(function, *args, **kwargs)

    _build_run(redis_client)
    before = _layout(redis_client)
    exported = run("export_run_dir", frontend_client, RUN, tmp_path / "dir")
    assert exported == interop.ExportResult(RUN, len(LUFT_EVENTS), str(tmp_path / "dir"))
    interop.export_run_dir(redis_client, RUN, tmp_path / "sync")  # the same bytes
    for name in ("checkpoint.json", "events.jsonl"):
        assert (tmp_path / "dir" / name).read_bytes() == (tmp_path / "sync" / name).read_bytes()
    with pytest.raises(RunExistsError):
        run("import_run_dir", frontend_client, tmp_path / "dir")
    _flush(redis_client)
    got = run("import_run_dir", frontend_client, tmp_path / "dir")
    assert got == interop.ImportResult(RUN, len(LUFT_EVENTS), replaced=False)
    assert _layout(redis_client) == before
    target = _luft_db(tmp_path / "t.db", with_run=False)
    assert run("export_sqlite", frontend_client, target, RUN).events == len(LUFT_EVENTS)
    _flush(redis_client)
    assert run("import_sqlite", frontend_client, target) == [
        interop.ImportResult(RUN, len(LUFT_EVENTS), replaced=False)]  # fmt: skip
    backend = RedisCheckpointBackend(redis_client, watch=False)
    cp = backend.open_run(RUN)
    assert cp is not None and cp.task == "review the repo ✓"
    assert [dumps_compact(e.to_json()) for e in backend.get_event_log()] == LUFT_EVENTS


@pytest.mark.parametrize("frontend", ["async"])
def test_async_export_refuses_a_trimmed_log_and_import_replaces(
    frontend_client: Any, redis_client: Client, async_loop: Any, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """What the round trip above leaves out, on the asyncio functions: a trimmed log refused
    unless allowed (a warning from their own logger), and an import with ``replace`` (and
    its progress)."""
    from luft_redis.asyncio import interop as async_interop

    left = _trimmed_run(redis_client)
    with pytest.raises(interop.LogTrimmedError, match=str(RUN)):
        async_loop.call(async_interop.export_run_dir, frontend_client, RUN, tmp_path / "t")
    assert not (tmp_path / "t").exists()
    with caplog.at_level("WARNING", logger="luft_redis.asyncio.interop"):
        result = async_loop.call(async_interop.export_run_dir, frontend_client, RUN,
                                 tmp_path / "t", allow_trimmed=True)  # fmt: skip
    assert result.log_trimmed and result.events == left
    assert any(r.name == "luft_redis.asyncio.interop" and "trimmed" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    path = _luft_db(tmp_path / "t.db", with_run=False)
    with pytest.raises(interop.LogTrimmedError):
        async_loop.call(async_interop.export_sqlite, frontend_client, path, RUN)
    assert all(rows == [] for rows in _rows(path).values())

    _flush(redis_client)
    _build_run(redis_client)
    before = _layout(redis_client)
    async_loop.call(async_interop.export_run_dir, frontend_client, RUN, tmp_path / "w")
    seen: list[tuple[int, int | None]] = []
    got = async_loop.call(async_interop.import_run_dir, frontend_client, tmp_path / "w",
                          replace=True, progress=lambda done, total: seen.append((done, total)))
    assert got == interop.ImportResult(RUN, len(LUFT_EVENTS), replaced=True)
    assert seen[-1] == (len(LUFT_EVENTS), len(LUFT_EVENTS))
    assert _layout(redis_client) == before
