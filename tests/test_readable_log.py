"""The event log is readable with ``redis-cli`` (stored format 3), and a log holds entries of
every format.

A format-3 stream entry keeps the event's scalar fields as plain text (``codec.ENTRY_NAMES``)
and only what is nested in the ``data`` blob; formats 1 and 2 kept the whole event in
``data``. After an upgrade one stream holds both, decoded entry by entry; a reader of formats
1 and 2 refuses a format-3 entry instead of misreading it.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any, TypeAlias

import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis import CorruptDataError, RedisCheckpointBackend, codec, wire
from luft_redis import types as t
from luft_redis.tools.server import find_redis_cli

Client: TypeAlias = "redis.Redis | RedisCluster"

TS = t.Timestamp(2026, 1, 2, 3, 4, 5, 123456, nanosecond=789, tzinfo=t.EPOCH.tzinfo)


def quickstart_events(run_id: uuid.UUID, agent_id: uuid.UUID) -> list[t.AgentEvent]:
    """The README quickstart's events, with a name, a cache read and a fixed ts."""
    finding = t.Finding(kind="bug", severity=t.Severity.HIGH, title="off by one",
                        detail="loop bound")  # fmt: skip
    return [
        t.AgentStarted(run_id=run_id, phase_id=2, agent_id=agent_id,
                       prompt_preview="look for bugs", model="claude", ts=TS),
        t.AgentDone(run_id=run_id, agent_id=agent_id, status=t.AgentStatus.TIMED_OUT,
                    tokens=t.TokenUsage(input=1200, output=340, cache_read=77),
                    elapsed_ms=5100, name="reviewer-7", agent_seq=3, ts=TS,
                    output={"summary": "one bug"}, findings=(finding,)),
        t.RunDone(run_id=run_id, status=t.RunStatus.FAILED, total_tokens=t.TokenUsage(), ts=TS),
    ]  # fmt: skip


def b(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def pairs(lines: list[str]) -> list[tuple[str, str]]:
    return list(zip(lines[::2], lines[1::2], strict=True))


def test_xrange_through_redis_cli_shows_the_scalar_fields_as_text(redis_url: str) -> None:
    """The real ``redis-cli`` binary, against a private redis-server: the agent, status,
    tokens, elapsed time, name, phase, ts of each event are plain text."""
    cli = find_redis_cli()
    if cli is None:
        pytest.skip("redis-cli not found")
    client = redis.Redis.from_url(redis_url)
    backend = RedisCheckpointBackend(client)
    run_id, agent_id = uuid.uuid4(), uuid.uuid4()
    backend.init_run(run_id, "review the repository", "/tmp/runs/demo")
    for event in quickstart_events(run_id, agent_id):
        backend.append_event(event)
    backend.close()
    key = f"luft:{{{run_id}}}:events"
    out = subprocess.run([cli, "-u", redis_url, "--no-raw", "XRANGE", key, "-", "+"],
                         capture_output=True, check=True, timeout=30).stdout  # fmt: skip
    text = out.decode("utf-8", "replace")
    # --no-raw quotes every value: '1) "type"' ... one line per field and value
    values = [line.split('"', 1)[1].rsplit('"', 1)[0] for line in text.splitlines()
              if '"' in line and not line.strip().startswith("1) 1)")]  # fmt: skip
    raw = subprocess.run([cli, "-u", redis_url, "--raw", "XRANGE", key, "-", "+"],
                         capture_output=True, check=True, timeout=30).stdout  # fmt: skip
    lines = raw.decode("utf-8", "replace").splitlines()
    started = lines.index("agent_started")
    assert pairs(lines[started - 1 : started + 11]) == [
        ("type", "agent_started"), ("ph", "2"), ("a", str(agent_id)),
        ("pv", "look for bugs"), ("m", "claude"), ("ts", str(TS.unix_nanos())),
    ]  # fmt: skip
    done = lines.index("agent_done")
    assert pairs(lines[done - 1 : done + 19]) == [
        ("type", "agent_done"), ("a", str(agent_id)), ("st", "TimedOut"), ("in", "1200"),
        ("out", "340"), ("cr", "77"), ("ms", "5100"), ("n", "reviewer-7"), ("seq", "3"),
        ("ts", "1767323045123456789"),
    ]  # fmt: skip
    assert lines[done + 19] == "data"  # output and findings: msgpack behind the header
    run_done = lines.index("run_done")
    assert pairs(lines[run_done - 1 : run_done + 5]) == [
        ("type", "run_done"), ("st", "failed"), ("ts", str(TS.unix_nanos())),
    ]  # fmt: skip
    # the quoted (non-raw) form shows the same text, and the data blob escaped
    assert str(agent_id) in values and "TimedOut" in values and "reviewer-7" in values
    assert any(v.startswith("\\xc1\\x03") for v in values)


def old_reader(run_id: uuid.UUID, key: str, eid: str, fields: Any) -> t.AgentEvent:
    """``wire.decode_entry`` as formats 1 and 2 had it (luft-redis before format 3)."""
    type_raw, blob = fields.get(b"type"), fields.get(b"data")
    if not isinstance(type_raw, bytes) or not isinstance(blob, bytes):
        raise CorruptDataError(key, f"entry {eid}", "lacks its type or data field")
    return codec.decode_event(
        type_raw.decode("utf-8", "replace"), blob, run_id, key=key, entry_id=eid
    )


def test_a_reader_of_formats_1_and_2_refuses_every_format_3_entry(
    redis_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous version's decoder (its logic, with its FORMATS) meets new entries: it
    raises CorruptDataError for each, naming format 3 when the entry has a data field, and
    never returns an event."""
    backend = RedisCheckpointBackend(redis_client)
    run_id, agent_id = uuid.uuid4(), uuid.uuid4()
    backend.init_run(run_id, "t", "d")
    events = [*quickstart_events(run_id, agent_id),
              t.AgentProgress(run_id=run_id, agent_id=agent_id,
                              delta=t.ProgressMessage(text="reading")),
              t.SignalReceived(run_id=None, signal="SIGTERM")]  # fmt: skip
    for event in events:
        backend.append_event(event)
    keys = backend.keys
    assert keys is not None
    entries: Any = redis_client.xrange(keys.events)
    assert [wire.decode_entry(run_id, keys.events, wire.entry_id(i), f)
            for i, f in entries] == events  # fmt: skip
    monkeypatch.setattr(codec, "FORMATS", (1, 2))
    for eid, fields in entries:
        with pytest.raises(CorruptDataError) as info:
            old_reader(run_id, keys.events, wire.entry_id(eid), fields)
        if b"data" in fields:
            assert "stored format 3 was written by a newer luft-redis" in str(info.value)
        else:
            assert "lacks its type or data field" in str(info.value)
    backend.close()


def test_one_log_holds_entries_of_every_format(redis_client: Client) -> None:
    """A run written before the upgrade (whole-event blobs of formats 1 and 2) keeps its log;
    new entries go after them; the log, the CLI's reader and a fresh backend read all."""
    backend = RedisCheckpointBackend(redis_client)
    run_id, agent_id = uuid.uuid4(), uuid.uuid4()
    backend.init_run(run_id, "t", "d")
    keys = backend.keys
    assert keys is not None
    old = quickstart_events(run_id, agent_id)
    # format 2, as the previous version's append wrote it, and a headerless format-1 blob
    redis_client.xadd(keys.events, {"type": old[0].TYPE, "data": codec.encode_event(old[0])})
    v1 = t.Log(run_id=run_id, level=t.LogLevel.INFO, msg="from 0.1.0")
    redis_client.xadd(keys.events, {"type": "log", "data": codec.encode_event(v1)[2:]})
    for event in old[1:]:
        backend.append_event(event)
    assert list(backend.get_event_log()) == [old[0], v1, *old[1:]]
    fresh = RedisCheckpointBackend(redis_client)
    assert fresh.open_run(run_id) is not None
    assert list(fresh.get_event_log()) == [old[0], v1, *old[1:]]
    fresh.close()
    backend.close()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({b"st": b"ok"}, "st", "is not a AgentStatus"),
        ({b"ms": b"-1"}, "ms", "expected a decimal u64"),
        ({b"ms": b"01"}, "ms", "expected a decimal u64"),
        ({b"in": b"18446744073709551616"}, "in", "expected a decimal u64"),
        ({b"a": b"not-a-uuid"}, "a", "expected a UUID"),
        ({b"ts": b"2026-01-02T03:04:05Z"}, "ts", "expected decimal nanoseconds"),
        ({b"zz": b"1"}, "zz", "is no field of agent_done"),
        ({b"data": b"\xc1\x03\x93\xc0\x90\xa0"}, "data", "expected the format-3 array"),
        ({b"data": b"\xc1\x04\x90"}, "data", "stored format 4 was written by a newer"),
    ],
)
def test_a_bad_format_3_field_is_corrupt_data_naming_it(
    fields: dict[bytes, bytes], field: str, message: str
) -> None:
    run_id = uuid.uuid4()
    event = quickstart_events(run_id, uuid.uuid4())[1]
    flat = codec.encode_entry(event)
    stored = {b(k): b(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    with pytest.raises(CorruptDataError, match=message) as info:
        wire.decode_entry(run_id, "k", "1-0", {**stored, **fields})
    assert (info.value.key, info.value.field) == ("k", f"entry 1-0 {field}")


def test_a_missing_required_field_is_named() -> None:
    with pytest.raises(CorruptDataError, match="is missing") as info:
        wire.decode_entry(uuid.uuid4(), "k", "1-0", {b"type": b"agent_done", b"st": b"Ok"})
    assert info.value.field == "entry 1-0 a"


def test_the_layout_docs_name_every_stream_field() -> None:
    """docs/redis-layout.md lists the stream name of every scalar event field."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "redis-layout.md").read_text()
    section = doc[doc.index("## `luft:{R}:events` (stream)"):doc.index("## `luft:{R}:phases`")]
    for field, short in codec.ENTRY_NAMES.items():
        assert f"`{short}`" in section and f"`{field}`" in section, field
    for short in (*codec.TOKEN_NAMES.values(), *codec.ENTRY_RESERVED):
        assert f"`{short}`" in section, short
