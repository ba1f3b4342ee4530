"""Capture golden fixtures of the stored format written by the installed luft-redis.

    .venv/bin/python tests/golden/make_fixtures.py <name>

writes ``tests/golden/<name>/`` (it refuses to touch a directory that exists: fixtures are
never edited, a format change adds a new set). A set holds

* ``tables.json``: the field positions and enum codes of ``luft_redis.codec``;
* ``blobs.json``: single blobs (every event type, free JSON values, finding lists), each with
  the luft JSON it was made from; from format 3 on, an event is a whole stream entry (kind
  ``entry``: its field-value pairs in order), formats 1 and 2 stored it as one blob;
* ``runs/<run>.json``: every key of a few runs, dumped from a Redis server (fakeredis), with
  the run's checkpoint and event log as luft JSON, as luft-redis returned them when the set
  was captured.

``tests/test_golden.py`` decodes every set forever after and compares with its luft JSON.
Values that are printable UTF-8 text are stored as JSON strings, anything else as
``{"base64": "..."}``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import fakeredis

from luft_redis import RedisCheckpointBackend, ValidationError, codec
from luft_redis import types as t

HERE = Path(__file__).resolve().parent

RUN = uuid.UUID("0193a1b2-0000-7000-8000-000000000001")
AGENT_A = uuid.UUID("0193a1b2-0000-7000-8000-0000000000a1")
AGENT_B = uuid.UUID("0193a1b2-0000-7000-8000-0000000000b2")
AGENT_C = uuid.UUID("0193a1b2-0000-7000-8000-0000000000c3")
U32 = 2**32 - 1
U64 = 2**64 - 1

NESTED: dict[str, Any] = {
    "a": [1, 2.5, {"b": None, "c": True, "d": False}],
    "big": U64,
    "neg": -(2**63),
    "f": -0.5,
    "one_float": 1.0,
    "s": "日本語 🚀 \u0000 \\ \"",
    "empty": {},
    "none": [],
}


def value_json(raw: bytes) -> Any:
    """A stored value as JSON: text when printable UTF-8, else ``{"base64": ...}``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text
    return {"base64": base64.b64encode(raw).decode("ascii")}


def finding(i: int, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "bug", "severity": ["info", "low", "medium", "high", "critical"][i % 5],
        "title": f"finding {i}", "detail": f"detail {i}",
        "location": {"file": f"src/f{i}.rs", "line": i}, "evidence": [f"e{i}"],
        "data": {"i": i},
    }  # fmt: skip
    obj.update(extra)
    return obj


def event_samples(run: uuid.UUID) -> list[dict[str, Any]]:
    """luft JSON of every event type: fully set, minimal, and edge values."""
    r, a = str(run), str(AGENT_A)
    tok = {"input": 10, "output": 20, "cache_read": 3, "cache_write": 4}
    big = {"input": U64, "output": U64, "cache_read": U64, "cache_write": U64}
    return [
        {"type": "run_started", "run_id": r, "task": "review the repo",
         "ts": "2025-01-02T03:04:05.123456Z"},
        {"type": "run_started", "run_id": r, "task": ""},
        {"type": "phase_started", "run_id": r, "phase_id": 3, "label": "scan", "planned": 7,
         "description": "scan every file", "role": "reviewer", "ts": "2025-01-02T03:04:05.123Z"},
        {"type": "phase_started", "run_id": r, "phase_id": U32, "label": "", "planned": U64},
        {"type": "agent_started", "run_id": r, "phase_id": 2, "agent_id": a,
         "prompt_preview": "Review src/", "model": "claude-opus", "description": "desc",
         "role": "critic", "name": "agent-1", "agent_seq": 5, "ts": "2025-01-02T03:04:05Z"},
        {"type": "agent_started", "run_id": r, "phase_id": 0, "agent_id": a,
         "prompt_preview": "p", "model": None},
        {"type": "agent_progress", "run_id": r, "agent_id": a,
         "delta": {"kind": "message", "text": "thinking"}},
        {"type": "agent_progress", "run_id": r, "agent_id": a,
         "delta": {"kind": "tool_call", "name": "read_file", "summary": "src/lib.rs"}},
        {"type": "agent_progress", "run_id": r, "agent_id": a,
         "delta": {"kind": "file_edit", "path": "src/main.rs"}},
        {"type": "agent_progress", "run_id": r, "agent_id": a,
         "delta": {"kind": "tokens", "usage": tok}},
        {"type": "acp_raw", "run_id": r, "agent_id": a, "kind": "notification", "raw": NESTED},
        {"type": "acp_request", "run_id": r, "agent_id": a, "method": "session/prompt",
         "raw": {"jsonrpc": "2.0", "id": 7, "params": [1, "two", None]}},
        {"type": "agent_done", "run_id": r, "agent_id": a, "status": "TimedOut", "tokens": tok,
         "elapsed_ms": 1234, "name": "agent-1", "agent_seq": 9,
         "ts": "2025-01-02T03:04:05.000001Z", "output": {"answer": 42, "list": [True, None]},
         "findings": [finding(1), finding(2, location=None, evidence=[], data=None)],
         "prompt": "do the thing", "retry_count": 2},
        {"type": "agent_done", "run_id": r, "agent_id": a, "status": "Ok", "tokens": big,
         "elapsed_ms": U64, "agent_seq": U32, "retry_count": U32},
        {"type": "agent_done", "run_id": r, "agent_id": a, "status": "Error",
         "tokens": {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0},
         "elapsed_ms": 0},
        {"type": "agent_done", "run_id": r, "agent_id": a, "status": "Cancelled",
         "tokens": tok, "elapsed_ms": 1, "output": "text output"},
        {"type": "phase_done", "run_id": r, "phase_id": 4, "ok": 5, "failed": 1,
         "ts": "2025-01-02T03:04:05.5Z"},
        {"type": "run_done", "run_id": r, "status": "partial", "total_tokens": tok,
         "report": NESTED, "ts": "9999-12-31T23:59:59.999999Z"},
        {"type": "run_done", "run_id": r, "status": "completed", "total_tokens": tok,
         "report": None, "ts": "0001-01-01T00:00:00Z"},
        {"type": "run_done", "run_id": r, "status": "failed", "total_tokens": tok,
         "report": [1, 2]},
        {"type": "run_done", "run_id": r, "status": "cancelled", "total_tokens": tok,
         "report": 1.5},
        {"type": "log", "run_id": r, "agent_id": a, "level": "warn", "msg": "hot"},
        *({"type": "log", "run_id": r, "agent_id": None, "level": level, "msg": level}
          for level in ("trace", "debug", "info", "error")),
        {"type": "budget_set", "run_id": r, "time_limit_ms": 60000, "max_rounds": 5},
        {"type": "budget_set", "run_id": r, "time_limit_ms": None, "max_rounds": None},
        {"type": "budget_set", "run_id": r, "time_limit_ms": U64, "max_rounds": U32},
        # wider than luft's u32: accepted by 0.1.0, read back by every later version
        {"type": "budget_set", "run_id": r, "time_limit_ms": 1, "max_rounds": U64},
        {"type": "report_emitted", "run_id": r, "phase_id": 1, "report": {"summary": "ok"}},
        {"type": "parallel_started", "run_id": r, "phase_id": 1, "span_id": 11, "count": 3},
        {"type": "parallel_done", "run_id": r, "phase_id": 1, "span_id": 11, "ok": 2,
         "failed": 1, "results": [{"i": 0}, {"i": 1}], "elapsed_ms": 999},
        {"type": "workflow_started", "run_id": r, "span_id": U64, "path": "wf/review.lua",
         "args": {"depth": 2}},
        {"type": "workflow_done", "run_id": r, "span_id": 12, "path": "wf/review.lua",
         "report": None, "elapsed_ms": 5, "error": "boom"},
        {"type": "converge_started", "run_id": r, "phase_id": 2, "span_id": 13, "items": 4,
         "max_rounds": U32},
        {"type": "converge_done", "run_id": r, "phase_id": 2, "span_id": 13, "rounds": 3,
         "converged": True, "surviving": 2, "result": ["x"], "elapsed_ms": 77, "error": None},
        {"type": "pipeline_started", "run_id": r, "total_stages": 3, "items": 10},
        {"type": "pipeline_stage_started", "run_id": r, "stage_index": 0, "label": "lint",
         "agents_in_stage": 4},
        {"type": "pipeline_item_done", "run_id": r, "stage_index": 0, "item_index": 5,
         "status": "Error", "tokens": tok, "elapsed_ms": 8},
        {"type": "pipeline_done", "run_id": r, "stages_completed": 3, "total_ok": 9,
         "total_failed": 1},
        {"type": "schema_retry", "run_id": r, "agent_id": a, "attempt": 1, "max": 3},
        {"type": "plan_preview", "run_id": r, "reasoning": "because",
         "phases": [{"label": "scan", "dynamic": True, "description": "first"},
                    {"label": "fix"}]},
        {"type": "plan_preview", "run_id": r, "reasoning": "", "phases": []},
        {"type": "signal_received", "run_id": r, "signal": "SIGINT",
         "ts": "2025-01-02T03:04:05.999999Z"},
        {"type": "signal_received", "run_id": None, "signal": "SIGTERM"},
        # nine fraction digits, before the epoch, at the ends of the range
        {"type": "phase_done", "run_id": r, "phase_id": 1, "ok": 0, "failed": 0,
         "ts": "2026-01-02T03:04:05.123456789Z"},
        {"type": "phase_done", "run_id": r, "phase_id": 1, "ok": 0, "failed": 0,
         "ts": "1969-12-31T23:59:59.999999999Z"},
        {"type": "phase_done", "run_id": r, "phase_id": 1, "ok": 0, "failed": 0,
         "ts": "0001-01-01T00:00:00.000000001Z"},
        {"type": "phase_done", "run_id": r, "phase_id": 1, "ok": 0, "failed": 0,
         "ts": "9999-12-31T23:59:59.999999999Z"},
        {"type": "signal_received", "run_id": None, "signal": "SIGHUP",
         "ts": "2106-02-07T06:28:16.000000001Z"},
    ]  # fmt: skip


def json_samples() -> list[Any]:
    return [None, True, False, 0, -1, U64, -(2**63), 1.5, -0.0, "", "text", [], {}, NESTED,
            [[[[{"deep": [1]}]]]]]  # fmt: skip


def findings_samples() -> list[list[dict[str, Any]]]:
    return [
        [finding(1)],
        [finding(i) for i in range(5)],
        [finding(7, location={"file": "x", "line": None}), finding(8, location=None)],
        [finding(9, location={"file": "wide", "line": U32}),
         finding(10, location={"file": "wider than luft (u64)", "line": U64})],
    ]


def blobs() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for obj in event_samples(RUN):
        try:
            event = t.AgentEvent.from_json(obj)
        except ValidationError:
            continue  # a value this version no longer accepts
        if hasattr(codec, "encode_entry"):  # format 3: the whole stream entry
            flat = codec.encode_entry(event)
            fields = [[name, value_json(v if isinstance(v, bytes) else v.encode())]
                      for name, v in zip(flat[::2], flat[1::2], strict=True)]  # fmt: skip
            out.append({"kind": "entry", "type": event.TYPE, "run_id": str(RUN),
                        "fields": fields, "json": event.to_json()})  # fmt: skip
            continue
        out.append({
            "kind": "event", "type": event.TYPE, "run_id": str(RUN),
            "blob": value_json(codec.encode_event(event)), "json": event.to_json(),
        })  # fmt: skip
    for value in json_samples():
        frozen = t.freeze_json(value)
        out.append({"kind": "json", "blob": value_json(codec.encode_json(frozen)),
                    "json": t.thaw_json(frozen)})  # fmt: skip
    for group in findings_samples():
        try:
            found = tuple(t.Finding.from_json(f) for f in group)
        except ValidationError:
            continue
        out.append({"kind": "findings", "blob": value_json(codec.encode_findings(found)),
                    "json": [f.to_json() for f in found]})  # fmt: skip
    return out


# -------------------------------------------------------------------------------- whole runs


def ev(obj: dict[str, Any]) -> t.AgentEvent:
    return t.AgentEvent.from_json(obj)


def run_full(backend: RedisCheckpointBackend) -> None:
    """Every event type through append_event, results, sessions, findings of agents."""
    backend.init_run_with_meta(RUN, "review the repository", "/runs/full",
                               {"workflow": "review", "nested": NESTED})  # fmt: skip
    samples = event_samples(RUN)
    agents = {"agent_started", "agent_progress", "acp_raw", "acp_request", "agent_done",
              "schema_retry"}  # fmt: skip
    for i, obj in enumerate(samples):
        if obj["type"] == "run_done" and obj["status"] != "partial":
            continue
        if obj["type"] in agents:  # spread the agent events over three agents
            obj = {**obj, "agent_id": str((AGENT_A, AGENT_B, AGENT_C)[i % 3])}
        if obj["type"] == "agent_done" and obj["tokens"]["input"] == U64:
            continue  # would overflow total_tokens
        try:
            event = ev(obj)
        except ValidationError:
            continue
        backend.append_event(event)
    backend.upsert_agent_result(t.AgentResultCache(
        agent_id=AGENT_C, phase_id=2, status="ok", output={"cached": True},
        findings=(t.Finding.from_json(finding(3)),), tokens=99, completed_at=1735787045,
        cache_key_hash="sha256:abc", description="the third", role="fixer",
    ))  # fmt: skip
    backend.upsert_agent_session(t.AgentSessionCheckpoint(
        agent_id=AGENT_A, backend_id="acp", protocol_session_id="p-1", session_id="s-1",
        status="running", updated_at=1735787046, resumable=True,
    ))  # fmt: skip
    backend.upsert_agent_session(t.AgentSessionCheckpoint(
        agent_id=AGENT_B, session_id="s-2", status="done", updated_at=0,
    ))  # fmt: skip
    backend.append_event(ev({"type": "run_done", "run_id": str(RUN), "status": "completed",
                             "total_tokens": {"input": 1, "output": 2},
                             "ts": "2025-01-02T03:04:06.25Z"}))  # fmt: skip


def run_saved(backend: RedisCheckpointBackend) -> None:
    """A run whose state was replaced by save_checkpoint: segments of every kind."""
    run = uuid.UUID("0193a1b2-0000-7000-8000-000000000002")
    backend.init_run(run, "saved run", "/runs/saved")
    backend.append_event(ev({"type": "agent_started", "run_id": str(run), "phase_id": 1,
                             "agent_id": str(AGENT_A), "prompt_preview": "p", "model": None}))
    f1, f2, f3, f4 = (t.Finding.from_json(finding(i)) for i in (1, 2, 3, 4))
    cp = t.RunCheckpoint.from_json({
        "run_id": str(run), "task": "saved run, edited", "status": "cancelled",
        "current_phase": 7, "completed_phases": [
            {"phase_id": 7, "label": "seven", "planned": 2, "ok": 1, "failed": 1,
             "description": None, "role": "r"},
            {"phase_id": 1, "label": "one", "planned": U64, "ok": 0, "failed": 0,
             "description": "d", "role": None},
        ],
        "agent_results": {
            str(AGENT_A): {"agent_id": str(AGENT_A), "phase_id": 1, "status": "timed_out",
                           "output": None, "findings": [f1.to_json(), f2.to_json()],
                           "tokens": 5, "completed_at": 17},
            str(AGENT_B): {"agent_id": str(AGENT_B), "phase_id": 7, "status": "error",
                           "output": {"o": 1}, "findings": [], "tokens": 0, "completed_at": 0,
                           "cache_key_hash": "k", "description": "b", "role": "c"},
        },
        "agent_sessions": {
            str(AGENT_B): {"agent_id": str(AGENT_B), "session_id": "s", "status": "idle",
                           "updated_at": 3, "resumable": False},
        },
        "findings": [f1.to_json(), f3.to_json(), f2.to_json(), f4.to_json(), f1.to_json()],
        "total_tokens": U64, "created_at": 1, "updated_at": 2, "workflow_meta": [1, "two"],
        "started_agent_ids": [str(AGENT_B), str(AGENT_A)],
    })  # fmt: skip
    backend.save_checkpoint(cp)


def run_minimal(backend: RedisCheckpointBackend) -> None:
    """A run just created, then cancelled."""
    run = uuid.UUID("0193a1b2-0000-7000-8000-000000000003")
    backend.init_run(run, "", "")
    backend.cancel()


RUNS = {"full": run_full, "saved": run_saved, "minimal": run_minimal}


def dump_run(client: Any, prefix: str, run: uuid.UUID) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for raw in sorted(client.scan_iter(match=f"{prefix}:{{{run}}}:*")):
        key = raw.decode()
        kind = client.type(raw).decode()
        if kind == "hash":
            value: Any = {k.decode(): value_json(v)
                          for k, v in sorted(client.hgetall(raw).items())}  # fmt: skip
        elif kind == "stream":
            value = [[eid.decode(), {k.decode(): value_json(v) for k, v in fields.items()}]
                     for eid, fields in client.xrange(raw)]  # fmt: skip
        elif kind == "list":
            value = [value_json(v) for v in client.lrange(raw, 0, -1)]
        else:
            raise SystemExit(f"unexpected key type {kind} of {key}")
        keys[key] = {"type": kind, "value": value}
    return keys


def main(name: str) -> None:
    target = HERE / name
    if target.exists():
        raise SystemExit(f"{target} exists: golden fixtures are never edited, pick a new name")
    runs: dict[str, Any] = {}
    for run_name, make in RUNS.items():
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        backend = RedisCheckpointBackend(client)
        make(backend)
        run_id = backend.run_id
        assert run_id is not None
        fresh = RedisCheckpointBackend(client)
        cp = fresh.open_run(run_id)
        assert cp is not None
        runs[run_name] = {
            "prefix": backend.prefix, "run_id": str(run_id),
            "keys": dump_run(client, backend.prefix, run_id),
            "checkpoint": cp.to_json(),
            "events": [e.to_json() for e in fresh.get_event_log()],
        }  # fmt: skip
        backend.close()
        fresh.close()
    (target / "runs").mkdir(parents=True)
    meta = {
        "captured": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "by": "tests/golden/make_fixtures.py",
        "format": getattr(codec, "FORMAT", 1),
    }
    (target / "README.json").write_text(json.dumps(meta, indent=1) + "\n")
    tables: dict[str, Any] = {
        "FIELDS": {k: list(v) for k, v in codec.FIELDS.items()},
        "ENUM_CODES": codec.ENUM_CODES,
        "DELTA_KIND_CODES": codec.DELTA_KIND_CODES,
    }
    if hasattr(codec, "ENTRY_NAMES"):  # format 3: the stream field names of an entry
        tables["ENTRY_NAMES"] = codec.ENTRY_NAMES
        tables["TOKEN_NAMES"] = codec.TOKEN_NAMES
    (target / "tables.json").write_text(json.dumps(tables, indent=1) + "\n")
    text = json.dumps(blobs(), indent=1, ensure_ascii=False)
    (target / "blobs.json").write_text(text + "\n", encoding="utf-8")
    for run_name, dump in runs.items():
        text = json.dumps(dump, indent=1, ensure_ascii=False)
        (target / "runs" / f"{run_name}.json").write_text(text + "\n", encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
