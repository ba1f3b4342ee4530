"""Bad input on the import and export paths (issue 20, point 7), in Python and through the CLI.

- A record luft reads as a serde struct (the checkpoint, a phase summary, an agent result or
  session, a finding, its location, an event, its token usage or progress delta) that names a
  field twice is refused, naming the field and the file (or table, column and row); inside a
  free JSON value (``workflow_meta``, an output, a finding's ``data``) and in the result map
  the last value wins, as serde_json keeps it.
- A luft SQLite database whose JSON BLOB or TEXT column is not UTF-8 is a
  :class:`SqliteDataError` naming the table, column and row, not a bare ``UnicodeDecodeError``
  or ``sqlite3.OperationalError``.
- ``export --force`` into a directory whose ``checkpoint.json`` is a directory touches nothing.

Imports run on fakeredis and on a real server (``redis_client``); the CLI runs against the
session's private redis-server.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from luft_redis import RedisCheckpointBackend, interop
from luft_redis import types as t
from luft_redis.interop import RunFileError, SqliteDataError
from luft_redis.keys import run_keys

Client = Any

RUN = uuid.UUID("0193a1b2-0000-7000-8000-0000000000b1")
A1 = uuid.UUID("0193a1b2-0000-7000-8000-0000000000c1")
A2 = uuid.UUID("0193a1b2-0000-7000-8000-0000000000c2")

FINDING = ('{"kind":"bug","severity":"high","title":"F-title","detail":"loop",'
           '"location":{"file":"src/a.rs","line":42},"evidence":["x < n"],'
           '"data":{"conf":0.9}}')  # fmt: skip
FINDING_TWICE = FINDING.replace('{"kind":', '{"kind":"x","kind":', 1)
EVENTS = [
    f'{{"type":"run_started","run_id":"{RUN}","task":"T-task","ts":"2025-01-02T03:04:05Z"}}',
    f'{{"type":"phase_started","run_id":"{RUN}","phase_id":1,"label":"L-phase","planned":2,"description":null,"role":null,"ts":"2025-01-02T03:04:06Z"}}',
    f'{{"type":"agent_started","run_id":"{RUN}","phase_id":1,"agent_id":"{A1}","prompt_preview":"find bugs","model":"m-1","description":null,"role":null,"name":"a1","agent_seq":1,"ts":"2025-01-02T03:04:06.5Z"}}',  # noqa: E501
    f'{{"type":"agent_progress","run_id":"{RUN}","agent_id":"{A1}","delta":{{"kind":"message","text":"hi"}}}}',
    f'{{"type":"agent_done","run_id":"{RUN}","agent_id":"{A1}","status":"Ok","tokens":{{"input":100,"output":50,"cache_read":0,"cache_write":0}},"elapsed_ms":1234,"name":"a1","agent_seq":1,"ts":"2025-01-02T03:04:09Z","output":{{"score":2}},"findings":[{FINDING}],"prompt":"find bugs","retry_count":0}}',  # noqa: E501
    f'{{"type":"phase_done","run_id":"{RUN}","phase_id":1,"ok":1,"failed":0,"ts":"2025-01-02T03:04:11Z"}}',
]


def _build_run(client: Client) -> None:
    backend = RedisCheckpointBackend(client, watch=False)
    backend.init_run_with_meta(RUN, "T-task", "/runs/b1", {"w": 1})
    backend.append_events([t.AgentEvent.from_json(json.loads(line)) for line in EVENTS])
    backend.upsert_agent_session(t.AgentSessionCheckpoint(
        agent_id=A1, backend_id="acp", protocol_session_id=None, session_id="S-1",
        status="active", updated_at=1735787046, resumable=True))  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory exported from a run built on fakeredis."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    interop.export_run_dir(client, RUN, tmp_path / "run")
    return tmp_path / "run"


def _all_keys(client: Client) -> list[bytes]:
    return sorted(client.scan_iter(match="*", count=1000))


def _repeat(text: str, pair: str, earlier: str, occurrence: int = 0) -> str:
    """``text`` with ``"key": earlier, `` put before the ``occurrence``-th ``pair`` (a
    ``"key": value`` piece of ``text``; -1: the last one), so that key is named twice."""
    at = text.rfind(pair) if occurrence == -1 else -1
    if occurrence >= 0:
        for _ in range(occurrence + 1):
            at = text.index(pair, at + 1)
    assert at >= 0, pair
    key = pair.split(":", 1)[0]
    return f"{text[:at]}{key}: {earlier}, {text[at:]}"


# ------------------------------------------------------------ repeated fields, run directory


@pytest.mark.parametrize(
    ("pair", "earlier", "occurrence", "field"),
    [
        ('"task": "T-task"', '"other"', 0, "task"),
        ('"run_id": ', f'"{A2}"', 0, "run_id"),
        ('"label": "L-phase"', '"other"', 0, "completed_phases[0].label"),
        ('"status": "ok"', '"error"', 0, f"agent_results.{A1}.status"),
        ('"line": 42', "7", 0, f"agent_results.{A1}.findings[0].location.line"),
        ('"session_id": "S-1"', '"S-0"', 0, f"agent_sessions.{A1}.session_id"),
        ('"title": "F-title"', '"other"', -1, "findings[0].title"),
    ],
)
def test_checkpoint_naming_a_field_twice_is_refused(
    redis_client: Client, run_dir: Path, pair: str, earlier: str, occurrence: int, field: str
) -> None:
    path = run_dir / "checkpoint.json"
    path.write_text(_repeat(path.read_text(encoding="utf-8"), pair, earlier, occurrence),
                    encoding="utf-8")  # fmt: skip
    with pytest.raises(RunFileError) as info:
        interop.import_run_dir(redis_client, run_dir)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), None, field)
    assert str(info.value) == f"{path}: {field}: field named twice (luft's serde refuses a " \
        "duplicate field)"  # fmt: skip
    assert _all_keys(redis_client) == []


def test_repeated_keys_in_free_values_and_maps_keep_the_last(
    redis_client: Client, run_dir: Path
) -> None:
    """serde_json::Value and HashMap keep the last value of a repeated key: so does the
    import (workflow_meta, an output, a finding's data, an entry of agent_results)."""
    path = run_dir / "checkpoint.json"
    text = path.read_text(encoding="utf-8")
    text = _repeat(text, '"w": 1', '"first"')
    text = _repeat(text, '"score": 2', "1")
    text = _repeat(text, '"conf": 0.9', "0.1")
    other = dict(json.loads(path.read_text(encoding="utf-8"))["agent_results"][str(A1)],
                 status="error", tokens=1)  # fmt: skip
    text = _repeat(text, f'"{A1}": {{', json.dumps(other))
    assert text.count(f'"{A1}": ') == 3  # twice in agent_results, once in agent_sessions
    path.write_text(text, encoding="utf-8")
    interop.import_run_dir(redis_client, run_dir)
    cp = RedisCheckpointBackend(redis_client, watch=False).open_run(RUN)
    assert cp is not None
    assert cp.workflow_meta == {"w": 1}
    result = cp.agent_results[A1]
    assert (result.status, result.tokens, result.output) == ("ok", 150, {"score": 2})
    assert result.findings[0].data == {"conf": 0.9}


@pytest.mark.parametrize(
    ("line", "old", "new", "field"),
    [
        (1, '"task":"T-task"', '"task":"x","task":"T-task"', "task"),
        (1, '{"type":"run_started"', '{"type":"log","type":"run_started"', "type"),
        (5, '"tokens":{"input":100', '"tokens":{"input":1,"input":100', "tokens.input"),
        (4, '"delta":{"kind":"message"', '"delta":{"kind":"tool_call","kind":"message"',
         "delta.kind"),
        (5, '"findings":[{"kind":"bug"', '"findings":[{"kind":"x","kind":"bug"',
         "findings[0].kind"),
        (5, '"location":{"file":', '"location":{"line":1,"file":"y","file":',
         "findings[0].location.file"),
    ],
)  # fmt: skip
def test_event_naming_a_field_twice_is_refused(
    redis_client: Client, run_dir: Path, line: int, old: str, new: str, field: str
) -> None:
    path = run_dir / "events.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    with pytest.raises(RunFileError) as info:
        interop.import_run_dir(redis_client, run_dir)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), line, field)
    assert f"events.jsonl line {line}: {field}: field named twice" in str(info.value)
    assert _all_keys(redis_client) == []


def test_repeated_keys_inside_an_event_output_keep_the_last(
    redis_client: Client, run_dir: Path
) -> None:
    path = run_dir / "events.jsonl"
    text = path.read_text(encoding="utf-8")
    text = text.replace('"output":{"score":2}', '"output":{"score":1,"score":2}', 1)
    text = text.replace('"data":{"conf":0.9}', '"data":{"conf":0.1,"conf":0.9}', 1)
    path.write_text(text, encoding="utf-8")
    interop.import_run_dir(redis_client, run_dir)
    log = RedisCheckpointBackend(redis_client, watch=False)
    assert log.open_run(RUN) is not None
    done = [e for e in log.get_event_log() if isinstance(e, t.AgentDone)]
    assert [(e.output, e.findings[0].data) for e in done] == [({"score": 2}, {"conf": 0.9})]


# ------------------------------------------------------------------------------- SQLite

LUFT_DDL = (Path(__file__).parent / "luft_schema.sql").read_text()  # as test_interop.py


@pytest.fixture
def luft_db(tmp_path: Path) -> Path:
    """A luft SQLite database (luft's column types) holding the run, written by export."""
    path = tmp_path / "luft.db"
    conn = sqlite3.connect(path)
    conn.executescript(LUFT_DDL)
    conn.close()
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    interop.export_sqlite(client, path, RUN)
    return path


def _update(path: Path, sql: str, *params: Any) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(sql, params).rowcount == 1, sql
        conn.commit()
    finally:
        conn.close()


# the row of each table, as SqliteDataError names it
AGENT_ROW = f"run {RUN}, agent {A1}"
RUN_ROW = f"run {RUN}"


@pytest.mark.parametrize(
    ("sql", "params", "table", "column", "row", "message"),
    [
        # a BLOB that is not UTF-8 where luft stores JSON text
        ("UPDATE agents SET findings_json = ?", (b"[\xff]",), "agents", "findings_json",
         AGENT_ROW, "not UTF-8 (byte 0xff at offset 1)"),
        ("UPDATE events SET payload = ? WHERE seq = 3", (b'{"type":"log\xc3("}',), "events",
         "payload", "seq 3", "not UTF-8 (byte 0xc3 at offset 12)"),
        ("UPDATE checkpoints SET workflow_meta = ?", (b"\x80",), "checkpoints", "workflow_meta",
         RUN_ROW, "not UTF-8 (byte 0x80 at offset 0)"),
        # TEXT holding bytes that are not UTF-8 (sqlite3 itself raises OperationalError)
        ("UPDATE runs SET task = CAST(? AS TEXT)", (b"T-\xfe",), "runs", "task", RUN_ROW,
         "not UTF-8 (byte 0xfe at offset 2)"),
        ("UPDATE phases SET label = CAST(? AS TEXT)", (b"\xff",), "phases", "label",
         f"{RUN_ROW}, phase 1", "not UTF-8 (byte 0xff at offset 0)"),
        ("UPDATE agents SET status = CAST(? AS TEXT)", (b"o\xffk",), "agents", "status",
         AGENT_ROW, "not UTF-8 (byte 0xff at offset 1)"),
        ("UPDATE agent_sessions SET session_id = CAST(? AS TEXT)", (b"\xe2\x82",),
         "agent_sessions", "session_id", AGENT_ROW, "not UTF-8 (byte 0xe2 at offset 0)"),
        ("UPDATE events SET payload = CAST(? AS TEXT) WHERE seq = 2", (b"{\xff}",), "events",
         "payload", "seq 2", "not UTF-8 (byte 0xff at offset 1)"),
        # a record luft reads as a struct that names a field twice
        ("UPDATE agents SET findings_json = ?",
         (f"[{FINDING_TWICE}]",), "agents",
         "findings_json", AGENT_ROW, "[0].kind: field named twice"),
        ("UPDATE events SET payload = replace(payload, '\"label\":', '\"label\":\"x\",\"label\":')"
         " WHERE seq = 2", (), "events", "payload", "seq 2", "label: field named twice"),
    ],
)  # fmt: skip
def test_sqlite_bad_text_and_repeated_fields_name_table_column_and_row(
    redis_client: Client, luft_db: Path, sql: str, params: tuple[Any, ...], table: str,
    column: str, row: str, message: str,
) -> None:  # fmt: skip
    _update(luft_db, sql, *params)
    with pytest.raises(SqliteDataError) as info:
        interop.import_sqlite(redis_client, luft_db)
    error = info.value
    assert (error.table, error.column, error.row) == (table, column, row)
    assert str(error).startswith(f"{luft_db}: table {table}, {row}, column {column}: {message}")
    assert "\n" not in str(error)
    assert _all_keys(redis_client) == []


def test_sqlite_repeated_keys_in_free_values_keep_the_last(
    redis_client: Client, luft_db: Path
) -> None:
    _update(luft_db, "UPDATE agents SET output = ?", '{"score":1,"score":2}')
    _update(luft_db, "UPDATE checkpoints SET workflow_meta = ?", '{"w":0,"w":1}')
    _update(luft_db, "UPDATE agents SET findings_json = replace(findings_json, '\"conf\":', "
            "'\"conf\":0.1,\"conf\":')")  # fmt: skip
    interop.import_sqlite(redis_client, luft_db)
    cp = RedisCheckpointBackend(redis_client, watch=False).open_run(RUN)
    assert cp is not None
    assert (cp.workflow_meta, cp.agent_results[A1].output) == ({"w": 1}, {"score": 2})
    assert cp.agent_results[A1].findings[0].data == {"conf": 0.9}


def test_sqlite_run_id_that_is_not_a_uuid_names_its_row(luft_db: Path) -> None:
    _update(luft_db, "UPDATE agent_sessions SET agent_id = ?", "not-a-uuid")
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    with pytest.raises(SqliteDataError) as info:
        interop.import_sqlite(client, luft_db)
    assert (info.value.table, info.value.column, info.value.row) == (
        "agent_sessions", "agent_id", f"run {RUN}, row 1")
    assert "'not-a-uuid' is not a 16-byte UUID" in str(info.value)


# ------------------------------------------------------------------------------ export


def _exported(client: Client, directory: Path) -> dict[str, bytes]:
    """The files of ``directory`` after an export of the run with 2 more events."""
    backend = RedisCheckpointBackend(client, watch=False)
    assert backend.open_run(RUN) is not None
    backend.append_events([
        t.Log(run_id=RUN, agent_id=None, level=t.LogLevel.INFO, msg="later"),
        t.PhaseStarted(run_id=RUN, phase_id=2, label="two", planned=1),
    ])  # fmt: skip
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_export_force_onto_a_directory_touches_nothing(run_dir: Path) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    (run_dir / "checkpoint.json").unlink()
    (run_dir / "checkpoint.json").mkdir()
    before = _exported(client, run_dir)
    assert set(before) == {"events.jsonl"}
    for overwrite in (True, False):
        with pytest.raises(interop.InteropError) as info:
            interop.export_run_dir(client, RUN, run_dir, overwrite=overwrite)
        assert str(info.value) == (
            f"{run_dir / 'checkpoint.json'} is a directory; nothing was written (remove it, or "
            "export to another directory)")  # fmt: skip
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.json", "events.jsonl"]


def test_export_force_writes_beside_and_leaves_other_files_alone(run_dir: Path) -> None:
    """The temporary files have names of their own: luft's ``checkpoint.json.tmp`` (or
    anything else) in the directory is left as it is, and no temporary file remains."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    (run_dir / "checkpoint.json.tmp").write_bytes(b"luft's")
    (run_dir / "events.jsonl.tmp").mkdir()
    _exported(client, run_dir)
    result = interop.export_run_dir(client, RUN, run_dir, overwrite=True)
    assert result.events == len(EVENTS) + 2
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoint.json", "checkpoint.json.tmp", "events.jsonl", "events.jsonl.tmp"]
    assert (run_dir / "checkpoint.json.tmp").read_bytes() == b"luft's"
    assert len((run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()) == \
        len(EVENTS) + 2  # fmt: skip
    assert '"label": "two"' in (run_dir / "checkpoint.json").read_text(encoding="utf-8")


def test_export_failing_between_the_renames_says_what_was_replaced(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one window an export cannot close (the second rename fails after the first): the
    error says the new log is in place and the checkpoint is not; no temporary file stays."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    _build_run(client)
    old_checkpoint = (run_dir / "checkpoint.json").read_bytes()
    _exported(client, run_dir)
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).name == "checkpoint.json":
            raise PermissionError(13, "Permission denied")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(interop.InteropError) as info:
        interop.export_run_dir(client, RUN, run_dir, overwrite=True)
    assert str(info.value) == (
        f"cannot replace {run_dir / 'checkpoint.json'}: Permission denied; "
        f"{run_dir / 'events.jsonl'} already holds the new log: export again once "
        "checkpoint.json can be written")  # fmt: skip
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.json", "events.jsonl"]
    assert (run_dir / "checkpoint.json").read_bytes() == old_checkpoint
    assert len((run_dir / "events.jsonl").read_bytes().splitlines()) == len(EVENTS) + 2


# --------------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LUFT_REDIS_URL"}
    return subprocess.run([sys.executable, "-m", "luft_redis", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=env, timeout=120,
                          check=False)  # fmt: skip


def _one_line_failure(out: subprocess.CompletedProcess[str], command: str) -> str:
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.endswith("\n"), out.stderr
    assert out.stderr.startswith(f"luft-redis {command}: "), out.stderr
    return out.stderr


@pytest.fixture
def served_run(redis_url: str) -> Iterator[str]:
    client = redis.Redis.from_url(redis_url)
    _build_run(client)
    yield redis_url
    client.close()


@pytest.mark.server
def test_cli_import_refuses_a_repeated_field(redis_url: str, run_dir: Path) -> None:
    path = run_dir / "checkpoint.json"
    path.write_text(_repeat(path.read_text(encoding="utf-8"), '"task": "T-task"', '"x"'),
                    encoding="utf-8")  # fmt: skip
    err = _one_line_failure(_cli("import", str(run_dir), "--redis", redis_url), "import")
    assert f"{path}: task: field named twice" in err
    client = redis.Redis.from_url(redis_url)
    try:
        assert not client.exists(run_keys("luft", RUN).run)
    finally:
        client.close()


@pytest.mark.server
@pytest.mark.parametrize(
    ("sql", "params", "where"),
    [
        ("UPDATE agents SET findings_json = ?", (b"[\xff]",),
         f"table agents, run {RUN}, agent {A1}, column findings_json: not UTF-8"),
        ("UPDATE events SET payload = ? WHERE seq = 4", (b"\xff",),
         "table events, seq 4, column payload: not UTF-8"),
        ("UPDATE runs SET task = CAST(? AS TEXT)", (b"\xff\n\xfe",),
         f"table runs, run {RUN}, column task: not UTF-8 (byte 0xff at offset 0)"),
    ],
)  # fmt: skip
def test_cli_import_sqlite_not_utf8_is_one_line(
    redis_url: str, luft_db: Path, sql: str, params: tuple[Any, ...], where: str
) -> None:
    _update(luft_db, sql, *params)
    out = _cli("import-sqlite", str(luft_db), "--redis", redis_url)
    assert f"{luft_db}: {where}" in _one_line_failure(out, "import-sqlite")


@pytest.mark.server
def test_cli_export_force_onto_a_directory(served_run: str, run_dir: Path) -> None:
    (run_dir / "checkpoint.json").unlink()
    (run_dir / "checkpoint.json").mkdir()
    (run_dir / "events.jsonl").write_bytes(b"the old log\n")
    out = _cli("export", str(RUN), "-o", str(run_dir), "--force", "--redis", served_run)
    err = _one_line_failure(out, "export")
    assert f"{run_dir / 'checkpoint.json'} is a directory; nothing was written" in err
    assert (run_dir / "events.jsonl").read_bytes() == b"the old log\n"
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.json", "events.jsonl"]
