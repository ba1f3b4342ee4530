"""Golden fixtures: data written by every released stored format is read back forever after.

``tests/golden/<set>/`` holds blobs and whole runs captured by ``tests/golden/make_fixtures.py``
with the luft-redis of that format, each with its luft JSON. These tests decode them with the
current code and compare with that JSON; they also restore each run into Redis, open it and
keep writing to it (a fleet upgrades while runs are in flight). Fixtures are never edited: a
format change adds a new set.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import uuid
from pathlib import Path
from typing import Any, TypeAlias

import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis import CorruptDataError, RedisCheckpointBackend, codec, wire
from luft_redis import types as t

Client: TypeAlias = "redis.Redis | RedisCluster"

GOLDEN = Path(__file__).resolve().parent / "golden"
SETS = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and (p / "blobs.json").exists())


def raw_value(value: Any) -> bytes:
    """A stored value of a fixture: a JSON string is UTF-8 text, ``{"base64": ...}`` bytes."""
    if isinstance(value, str):
        return value.encode("utf-8")
    assert isinstance(value, dict) and set(value) == {"base64"}, value
    return base64.b64decode(value["base64"], validate=True)


def canon(value: Any) -> str:
    """A type-exact text form of a JSON value (tells 1, 1.0 and true apart)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def blob_cases() -> list[Any]:
    cases = []
    for name in SETS:
        for i, entry in enumerate(load(GOLDEN / name / "blobs.json")):
            label = entry.get("type", entry["kind"])
            cases.append(pytest.param(entry, id=f"{name}-{i}-{label}"))
    return cases


def run_cases() -> list[Any]:
    return [
        pytest.param(GOLDEN / name / "runs" / path.name, id=f"{name}-{path.stem}")
        for name in SETS
        for path in sorted((GOLDEN / name / "runs").glob("*.json"))
    ]


def test_golden_sets_exist() -> None:
    assert "format1" in SETS  # written by 0.1.0 (unversioned blobs)
    assert "format2" in SETS  # nanosecond timestamps, a format header on every blob
    assert "format3" in SETS  # readable stream entries
    assert blob_cases() and run_cases()
    assert current_set() == f"format{codec.FORMAT}"


def entry_map(entry: dict[str, Any]) -> dict[bytes, bytes]:
    """The field -> value map of a stream entry of a fixture (as XRANGE gives it)."""
    return {name.encode(): raw_value(value) for name, value in entry["fields"]}


@pytest.mark.parametrize("entry", blob_cases())
def test_golden_blob_decodes_to_its_json(entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    if kind == "entry":  # format 3 on: a whole stream entry
        event = wire.decode_entry(uuid.UUID(entry["run_id"]), "k", "1-0", entry_map(entry))
        assert event.to_json() == entry["json"]
        assert canon(event.to_json()) == canon(entry["json"])
        return
    blob = raw_value(entry["blob"])
    if kind == "event":
        event = codec.decode_event(
            entry["type"], blob, uuid.UUID(entry["run_id"]), key="k", entry_id="1-0"
        )
        out: Any = event.to_json()
    elif kind == "json":
        out = t.thaw_json(codec.decode_json(blob, key="k", field="f"))
    else:
        assert kind == "findings"
        out = [f.to_json() for f in codec.decode_findings(blob, key="k", field="f")]
    assert out == entry["json"]
    assert canon(out) == canon(entry["json"])


def current_set() -> str:
    """The set captured with the format this version writes."""
    found = [n for n in SETS if load(GOLDEN / n / "README.json").get("format") == codec.FORMAT]
    assert len(found) == 1, f"no golden set of format {codec.FORMAT}: capture one"
    return found[0]


@pytest.mark.parametrize(
    "entry", [p for p in blob_cases() if p.id.startswith(current_set() + "-")]
)
def test_the_current_format_writes_its_golden_blobs_byte_for_byte(entry: dict[str, Any]) -> None:
    """A change of the stored form fails here: it needs a new format number and a new set."""
    if entry["kind"] == "entry":
        flat = codec.encode_entry(t.AgentEvent.from_json(entry["json"]))
        written = [[k, v if isinstance(v, bytes) else v.encode()]
                   for k, v in zip(flat[::2], flat[1::2], strict=True)]  # fmt: skip
        assert written == [[k, raw_value(v)] for k, v in entry["fields"]]
        return
    blob = raw_value(entry["blob"])
    if entry["kind"] == "event":
        assert codec.encode_event(t.AgentEvent.from_json(entry["json"])) == blob
    elif entry["kind"] == "json":
        assert codec.encode_json(t.freeze_json(entry["json"])) == blob
    else:
        found = tuple(t.Finding.from_json(f) for f in entry["json"])
        assert codec.encode_findings(found) == blob


def restore(client: Any, keys: dict[str, Any]) -> None:
    for key, item in keys.items():
        value = item["value"]
        if item["type"] == "hash":
            client.hset(key, mapping={k: raw_value(v) for k, v in value.items()})
        elif item["type"] == "stream":
            for eid, fields in value:
                client.xadd(key, {k: raw_value(v) for k, v in fields.items()}, id=eid)
        else:
            assert item["type"] == "list"
            client.rpush(key, *(raw_value(v) for v in value))


def without_updated_at(cp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cp.items() if k != "updated_at"}


@pytest.mark.parametrize("path", run_cases())
def test_golden_run_opens_reads_and_takes_writes(path: Path, redis_client: Client) -> None:
    dump = load(path)
    restore(redis_client, dump["keys"])
    run_id = uuid.UUID(dump["run_id"])
    backend = RedisCheckpointBackend(redis_client, prefix=dump["prefix"])
    try:
        cp = backend.open_run(run_id)
        assert cp is not None
        assert canon(cp.to_json()) == canon(dump["checkpoint"])
        events = [e.to_json() for e in backend.get_event_log()]
        assert canon(events) == canon(dump["events"])

        # the current version keeps writing to a run of an older format
        log = t.Log(run_id=run_id, level=t.LogLevel.INFO, msg="after the upgrade")
        backend.append_event(log)
        current = backend.get_checkpoint()
        assert current is not None
        backend.save_checkpoint(dataclasses.replace(current))
        other = RedisCheckpointBackend(redis_client, prefix=dump["prefix"])
        try:
            again = other.open_run(run_id)
            assert again is not None
            assert canon(without_updated_at(again.to_json())) == canon(
                without_updated_at(dump["checkpoint"])
            )
            assert canon([e.to_json() for e in other.get_event_log()]) == canon(
                [*dump["events"], log.to_json()]
            )
        finally:
            other.close()
    finally:
        backend.close()


# ------------------------------------------------------------------------- format versions

SAMPLE_EVENT = t.RunStarted(run_id=uuid.uuid4(), task="t")
DECODERS: list[Any] = [
    lambda blob: codec.decode_event(
        "run_started", blob, SAMPLE_EVENT.run_id, key="k", entry_id="1-0"
    ),
    lambda blob: codec.decode_json(blob, key="k", field="f"),
    lambda blob: codec.decode_findings(blob, key="k", field="f"),
]


def test_every_blob_says_which_format_wrote_it() -> None:
    finding = t.Finding(kind="k", severity=t.Severity.LOW, title="t", detail="d")
    done = t.AgentDone(run_id=SAMPLE_EVENT.run_id, agent_id=uuid.uuid4(),
                       status=t.AgentStatus.OK, tokens=t.TokenUsage(), elapsed_ms=1,
                       output={"a": 1})  # fmt: skip
    entry = codec.encode_entry(done)
    assert entry[-2] == "data"
    for blob in (entry[-1], codec.encode_json({"a": 1}), codec.encode_findings((finding,))):
        assert isinstance(blob, bytes)
        assert blob[:2] == bytes((0xC1, codec.FORMAT))
    assert codec.FORMAT == codec.FORMATS[-1] == 3
    # the whole-event blob of formats 1 and 2 is still read (and written for tests)
    assert codec.encode_event(SAMPLE_EVENT)[:2] == bytes((0xC1, 2))
    assert DECODERS[0](codec.encode_event(SAMPLE_EVENT)) == SAMPLE_EVENT


def test_a_format_3_data_blob_alone_is_no_event() -> None:
    """The data of a format-3 entry holds only its nested fields: decode_event (the reader
    of formats 1 and 2) refuses it rather than read it as a whole event."""
    with pytest.raises(CorruptDataError, match="decode the whole entry"):
        DECODERS[0](bytes((0xC1, 3)) + b"\x90")


@pytest.mark.parametrize("version", [4, 255])
@pytest.mark.parametrize("decode", [
    *DECODERS,
    lambda blob: wire.decode_entry(SAMPLE_EVENT.run_id, "k", "1-0", {
        b"type": b"agent_progress", b"a": str(uuid.uuid4()).encode(), b"data": blob}),
])
def test_a_newer_format_is_refused_naming_it(decode: Any, version: int) -> None:
    with pytest.raises(CorruptDataError) as info:
        decode(bytes((0xC1, version)) + b"\x90")
    assert f"stored format {version}" in str(info.value)
    assert "newer luft-redis" in str(info.value)


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("decode", DECODERS)
def test_a_header_of_a_format_never_written_is_refused(decode: Any, version: int) -> None:
    with pytest.raises(CorruptDataError, match=f"unknown stored format {version}"):
        decode(bytes((0xC1, version)) + b"\x90")


def test_a_newer_run_schema_is_refused_naming_it(redis_client: Client) -> None:
    backend = RedisCheckpointBackend(redis_client)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "d")
    keys = backend.keys
    assert keys is not None
    redis_client.hset(keys.run, "schema", "2")
    with pytest.raises(CorruptDataError, match="schema 2 was written by a newer luft-redis"):
        RedisCheckpointBackend(redis_client).open_run(run_id)
    backend.close()


# ------------------------------------------------------------------------------ the tables


@pytest.mark.parametrize("name", [n for n in SETS if (GOLDEN / n / "tables.json").exists()])
def test_tables_only_ever_grow(name: str) -> None:
    """Positions and codes once written stay: a new field or member is appended."""
    frozen = load(GOLDEN / name / "tables.json")
    for record, fields in frozen["FIELDS"].items():
        now = list(codec.FIELDS[record])
        assert now[: len(fields)] == fields, f"{record}: append new fields, never reorder"
    for table in ("ENTRY_NAMES", "TOKEN_NAMES"):  # stream field names, from format 3 on
        names = frozen.get(table, {})
        assert {k: getattr(codec, table)[k] for k in names} == names, table
    for enum, codes in frozen["ENUM_CODES"].items():
        assert {k: codec.ENUM_CODES[enum][k] for k in codes} == codes, enum
    assert {k: codec.DELTA_KIND_CODES[k] for k in frozen["DELTA_KIND_CODES"]} == frozen[
        "DELTA_KIND_CODES"
    ]


def test_enum_codes_come_from_the_table_not_the_declaration_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Shuffled(t._StrEnum):  # declared in another order than its codes
        B = "b"
        A = "a"

    monkeypatch.setitem(codec.ENUM_CODES, "Shuffled", {"a": 0, "b": 1})
    pack, unpack = codec._enum(Shuffled)
    assert (pack(Shuffled.A), pack(Shuffled.B)) == (0, 1)
    assert unpack(1, "f") is Shuffled.B
    with pytest.raises(codec._Bad):
        unpack(2, "f")


def test_field_positions_come_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    @t._record
    class Later(t.Record):  # a record whose table puts its fields in another order
        first: str
        second: str = ""

    monkeypatch.setitem(codec.FIELDS, "Later", ("second", "first"))
    pack, unpack = codec._record_codec(Later)
    assert pack(Later(first="1", second="2")) == ["2", "1"]
    assert unpack(["2", "1"], "") == Later(first="1", second="2")


@pytest.mark.parametrize(
    ("table", "record", "value"),
    [
        ("FIELDS", "Location", ("line", "file", "column")),  # a field the record lacks
        ("FIELDS", "Location", ("file",)),  # a field left out
        ("FIELDS", "Location", ("file", "line", "line")),
        ("ENUM_CODES", "LogLevel", {"trace": 0, "debug": 1, "info": 2, "warn": 3}),
        ("ENUM_CODES", "LogLevel", {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 3}),
    ],
)
def test_a_table_that_disagrees_with_its_type_is_refused(
    monkeypatch: pytest.MonkeyPatch, table: str, record: str, value: Any
) -> None:
    monkeypatch.setitem(getattr(codec, table), record, value)
    with pytest.raises(RuntimeError, match=record):
        codec._check_tables()


def test_the_layout_docs_list_every_position_and_code() -> None:
    """docs/redis-layout.md documents each blob field by field: it must match the tables."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "redis-layout.md").read_text()
    rows = {}
    for line in doc.splitlines():
        m = re.match(r"\| `?(\w+)`? \| (\d .*) \|$", line)
        if m:
            rows[m.group(1)] = re.findall(r"(\d+) `(\w+)`", m.group(2))
    for name, fields in codec.FIELDS.items():
        if name.startswith("Progress"):
            continue
        shift = 1 if name == "signal_received" else 0  # the run-id flag comes first
        assert rows.get(name) == [(str(i + shift), f) for i, f in enumerate(fields)], name
    for enum, codes in codec.ENUM_CODES.items():
        assert rows.get(enum) == [(str(c), v) for v, c in codes.items()], enum
    for kind, code in codec.DELTA_KIND_CODES.items():
        assert f"| `{kind}` ({code}) |" in doc


DELTA_FILES = sorted((GOLDEN / "deltas").glob("*.json"))


def test_golden_delta_sets_exist() -> None:
    """Every delta format this version reads has its captured deltas, the current one
    included, and none other is kept: a format is read, and its file kept, forever once a
    released version wrote it (L2, replaced before any release, is neither)."""
    from luft_redis.delta import FORMAT, READABLE_FORMATS

    names = {p.stem for p in DELTA_FILES}
    assert FORMAT.decode() in names
    assert names == {f.decode() for f in READABLE_FORMATS}


@pytest.mark.parametrize("path", DELTA_FILES, ids=lambda p: p.stem)
def test_golden_deltas_apply_to_their_checkpoint(path: Path) -> None:
    """Deltas (replies = notices) of every format read still apply, record by record, to the
    checkpoint they made (a mixed fleet publishes the notices of every released version)."""
    from luft_redis.cache import RunState
    from luft_redis.delta import parse_delta
    from luft_redis.keys import run_keys

    doc = load(path)
    for name, run in doc["runs"].items():
        run_id = uuid.UUID(run["run_id"])
        keys = run_keys("luft", run_id)
        deltas = [parse_delta(base64.b64decode(d)) for d in run["deltas"]]
        assert deltas[0].whole, name
        state = RunState.from_whole(run_id, keys, deltas[0])
        for delta in deltas[1:]:
            assert (delta.inc_before, delta.v_before) == (state.incarnation, state.version)
            state = state.apply(delta)
            assert (state.incarnation, state.version) == (delta.inc_after, delta.v_after)
        assert canon(state.snapshot.to_json()) == canon(run["checkpoint"]), name
