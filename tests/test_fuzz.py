"""Fuzzing the decoders and the loader: stored garbage is a ``CorruptDataError``, nothing else.

Part 1 feeds arbitrary bytes, arbitrary msgpack values and mutated real encodings to
``codec.decode_event`` (for every event type), ``codec.decode_json`` and
``codec.decode_findings``. Part 2 writes garbage with a raw client into the fields of a real
run (on every target of ``redis_client``) and checks that ``open_run``/``get_event_log`` raise
a ``CorruptDataError`` naming the Redis key and field, that the scripts refuse to write on top
of a corrupt field, and that another run is not affected.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeAlias

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster

from luft_redis import (
    AgentDone,
    AgentStarted,
    AgentStatus,
    CorruptDataError,
    Finding,
    Location,
    Log,
    LogLevel,
    PhaseDone,
    PhaseStarted,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    Severity,
    SignalReceived,
    TokenUsage,
    codec,
    wire,
)
from luft_redis import types as t
from luft_redis.errors import LuftRedisError


def _examples(count: int) -> int:
    """*count* examples under the Hypothesis profile ``ci`` (``pytest --full``, 100 examples by
    default), a quarter of them under ``dev`` (the everyday loop); see tests/conftest.py."""
    return max(min(count, 2), count * settings().max_examples // 100)


Client: TypeAlias = "redis.Redis | RedisCluster"

FUZZ = settings(max_examples=_examples(200), deadline=None)
STORE_FUZZ = settings(
    max_examples=_examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

RUN_ID = uuid.UUID("0193a1b2-0000-7000-8000-000000000001")
EVENT_TYPE_NAMES = sorted(t.EVENT_TYPES)
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

# -------------------------------------------------------------------------------- strategies

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=U64_MAX)
    | st.sampled_from([0, 1, 2, 3, 16, 255, U32_MAX, U32_MAX + 1, U64_MAX, -1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.binary(min_size=16, max_size=16)
    | st.builds(msgpack.Timestamp, st.integers(-(2**63), 2**63 - 1), st.integers(0, 10**9 - 1))
)

msgpack_values: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=8)
        | st.dictionaries(
            st.text(max_size=8) | st.binary(max_size=4) | st.integers(-9, 9), inner, max_size=5
        )
    ),
    max_leaves=30,
)


def _pack(value: Any) -> bytes:
    """msgpack without a header: read as stored format 1 (0.1.0)."""
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


HEADER = bytes((codec.MARKER, 2))
"""Format 2: the last format that stored an event as one blob (format 3 stores a stream
entry of plain-text fields, fuzzed below in ``test_entry_decoder_on_mutated_entries``)."""


def _pack2(value: Any) -> bytes:
    """msgpack behind the header of stored format 2."""
    return HEADER + _pack(value)


def _body(blob: bytes, header: bytes = HEADER) -> Any:
    assert blob[:2] == header
    return msgpack.unpackb(blob[2:])


def _sample_events(run_id: uuid.UUID) -> list[t.AgentEvent]:
    agent = uuid.UUID("0193a1b2-0000-7000-8000-00000000000a")
    finding = Finding(
        kind="bug",
        severity=Severity.HIGH,
        title="off by one",
        detail="loop bound",
        location=Location(file="a.py", line=3),
        evidence=("x",),
        data={"k": [1, 2.5, None]},
    )
    return [
        PhaseStarted(run_id=run_id, phase_id=1, label="review", planned=2, description="d"),
        AgentStarted(run_id=run_id, phase_id=1, agent_id=agent, prompt_preview="p", model="m"),
        AgentDone(
            run_id=run_id,
            agent_id=agent,
            status=AgentStatus.OK,
            tokens=TokenUsage(input=10, output=5),
            elapsed_ms=7,
            output={"a": [1, "b"]},
            findings=(finding,),
            prompt="why",
        ),
        PhaseDone(run_id=run_id, phase_id=1, ok=1, failed=0),
        Log(run_id=run_id, agent_id=agent, level=LogLevel.WARN, msg="hello"),
        SignalReceived(run_id=None, signal="SIGTERM"),
        RunDone(run_id=run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage(input=1)),
    ]


_SAMPLES = [(type(e).TYPE, _body(codec.encode_event(e))) for e in _sample_events(RUN_ID)]


def _mutate(value: Any, data: st.DataObject) -> Any:
    """Replace, drop or append one element somewhere inside a nested list."""
    if type(value) is list and value and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(value) - 1))
        copy = list(value)
        copy[i] = _mutate(copy[i], data)
        return copy
    action = data.draw(st.sampled_from(["replace", "drop", "append"]))
    if type(value) is list and value and action == "drop":
        return value[:-1]
    if type(value) is list and action == "append":
        return [*value, data.draw(msgpack_values)]
    return data.draw(msgpack_values)


# -------------------------------------------------------------------------------- part 1: codec


def _decode_all(blob: bytes) -> None:
    """Every decoder on ``blob``: a value or CorruptDataError naming the given key/field."""
    for name in EVENT_TYPE_NAMES:
        try:
            event = codec.decode_event(name, blob, RUN_ID, key="k:events", entry_id="1-0")
        except CorruptDataError as exc:
            assert exc.key == "k:events"
            assert exc.field in ("entry 1-0 data", "entry 1-0 type")
        else:
            assert name == event.TYPE
    for decode in (codec.decode_json, codec.decode_findings):
        try:
            decode(blob, key="k:h", field="f")
        except CorruptDataError as exc:
            assert (exc.key, exc.field) == ("k:h", "f")


@FUZZ
@given(st.binary(max_size=200))
def test_decoders_on_random_bytes(blob: bytes) -> None:
    _decode_all(blob)


@FUZZ
@given(msgpack_values)
def test_decoders_on_random_msgpack(value: Any) -> None:
    _decode_all(_pack(value))
    _decode_all(_pack2(value))


@FUZZ
@given(st.lists(msgpack_values, max_size=16))
def test_event_decoder_on_random_arrays(fields: list[Any]) -> None:
    """Arrays of plausible length reach the per-field checks of every event type."""
    for pack in (_pack, _pack2):
        _decode_all(pack(fields))
        _decode_all(pack([True, *fields]))  # signal_received's run-id flag


@FUZZ
@given(st.sampled_from(_SAMPLES), st.data())
def test_event_decoder_on_mutated_events(sample: tuple[str, Any], data: st.DataObject) -> None:
    name, body = sample
    blob = data.draw(st.sampled_from([_pack, _pack2]))(_mutate(body, data))
    try:
        event = codec.decode_event(name, blob, RUN_ID, key="k", entry_id="1-0")
    except CorruptDataError as exc:
        assert (exc.key, exc.field) == ("k", "entry 1-0 data")
    else:
        assert name == event.TYPE
    # A mutated AgentDone also feeds the findings decoder with almost-findings.
    if name == "agent_done" and type(body) is list and len(body) > 8:
        _decode_all(_pack2(_mutate(body[8], data)))


_ENTRIES = [
    (e.TYPE, [(k if isinstance(k, bytes) else k.encode(),
               v if isinstance(v, bytes) else v.encode())
              for k, v in zip(flat[::2], flat[1::2], strict=True)])
    for e in _sample_events(RUN_ID)
    for flat in [codec.encode_entry(e)]
]  # fmt: skip


@FUZZ
@given(st.sampled_from(_ENTRIES), st.data())
def test_entry_decoder_on_mutated_entries(
    sample: tuple[str, list[tuple[bytes, bytes]]], data: st.DataObject
) -> None:
    """A format-3 stream entry with a field dropped, added, or its value replaced by bytes,
    text or a mutated data blob: an event of its type or a CorruptDataError naming it."""
    _, pairs = sample
    fields = dict(pairs)
    names = [*fields, b"type", b"data", b"run", b"ms", b"zz"]
    key = data.draw(st.sampled_from(names))
    action = data.draw(st.sampled_from(["drop", "bytes", "text", "number", "blob"]))
    if action == "drop":
        fields.pop(key, None)
    elif action == "bytes":
        fields[key] = data.draw(st.binary(max_size=40))
    elif action == "text":
        fields[key] = data.draw(st.text(max_size=40)).encode("utf-8", "surrogatepass")
    elif action == "number":
        fields[key] = str(data.draw(st.integers(-(2**70), 2**70))).encode()
    else:
        body = _body(fields[b"data"], bytes((codec.MARKER, 3))) if b"data" in fields else []
        fields[b"data"] = bytes((codec.MARKER, 3)) + _pack(_mutate(body, data))
    try:
        event = wire.decode_entry(RUN_ID, "k:events", "1-0", fields)
    except CorruptDataError as exc:
        assert exc.key == "k:events"
        assert exc.field.startswith("entry 1-0")
    else:
        assert fields[b"type"].decode() == event.TYPE


@FUZZ
@given(st.sampled_from(_SAMPLES), st.binary(min_size=1, max_size=8), st.data())
def test_event_decoder_on_corrupted_bytes(
    sample: tuple[str, Any], noise: bytes, data: st.DataObject
) -> None:
    """Real encodings with bytes overwritten or cut off."""
    _, body = sample
    blob = bytearray(_pack2(body))
    at = data.draw(st.integers(0, len(blob)))
    blob[at : at + len(noise)] = noise
    cut = data.draw(st.integers(0, len(blob)))
    _decode_all(bytes(blob[:cut]))
    _decode_all(bytes(blob))


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\xc1",  # never used
        b"\x91" * 5000 + b"\xc0",  # very deep nesting
        b"\x81\xa1a" * 3000 + b"\xc0",
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4G elements
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GB
        b"\xd4\x01\x00",  # ext type
        b"\xc7\x00\xff",  # ext type -1 (timestamp) of length 0
        b"\xd6\xff\x00\x00\x00\x00",  # msgpack timestamp ext
        _pack({1: 2}),  # non-string map key
        _pack({b"a": 1}),  # bytes map key
        _pack(float("nan")),
        _pack([float("inf")]),
        _pack(b"\xff\xfe"),
        _pack([0, 2**64 - 1, -(2**63)]),
        _pack("\ud800".encode("utf-8", "surrogatepass")),  # str with invalid UTF-8
        b"\xa2\xed\xa0",  # fixstr with a lone surrogate
        _pack([1]) + b"\x00",  # trailing data
        b"\xc1\x02",  # a header and nothing
        b"\xc1\x00\x90", b"\xc1\x01\x90",  # formats never written with a header
        b"\xc1\x03\x90", b"\xc1\xff\x90",  # newer formats
        b"\xc1\x02\xc1\x02\x90",  # a header twice
        b"\xc1\x02\xd7\xff" + b"\xff" * 8,  # a timestamp with 2^30-1 nanoseconds
        b"\xc1\x02\x91\xd7\xff" + b"\xff" * 8,
    ],
)
def test_decoders_on_nasty_blobs(blob: bytes) -> None:
    _decode_all(blob)


# ---------------------------------------------------------------------------- part 2: stored data

AGENT = uuid.UUID("0193a1b2-0000-7000-8000-0000000000a1")
PHASE = 1


@dataclass
class Stored:
    """Every backend here is ``watch=False`` and closed at the end of the test: no listener
    thread runs while Hypothesis draws. On Redis Cluster a listener refreshes the topology
    through redis-py, which shuffles with the global ``random`` module; from another thread,
    in the middle of a draw, that is Hypothesis's "Do not use the random module inside
    strategies" (an error under the test config's filterwarnings)."""

    client: Any
    backend: RedisCheckpointBackend
    run_id: uuid.UUID
    other: uuid.UUID
    opened: list[RedisCheckpointBackend] = dataclass_field(default_factory=list)

    @property
    def keys(self) -> Any:
        keys = self.backend.keys
        assert keys is not None
        return keys

    def reopen(self) -> RedisCheckpointBackend:
        backend = RedisCheckpointBackend(self.client, watch=False)
        self.opened.append(backend)
        return backend


def _fill(backend: RedisCheckpointBackend, run_id: uuid.UUID) -> None:
    backend.init_run_with_meta(run_id, "fuzz me", "/tmp/fuzz", {"workflow": "w"})
    backend.append_event(PhaseStarted(run_id=run_id, phase_id=PHASE, label="review", planned=1))
    backend.append_event(
        AgentStarted(run_id=run_id, phase_id=PHASE, agent_id=AGENT, prompt_preview="p", model="m")
    )
    backend.append_event(
        AgentDone(
            run_id=run_id,
            agent_id=AGENT,
            status=AgentStatus.OK,
            tokens=TokenUsage(input=100, output=20),
            elapsed_ms=5,
            output={"answer": 42},
            findings=(Finding(kind="bug", severity=Severity.LOW, title="t", detail="d"),),
        )
    )
    backend.append_event(PhaseDone(run_id=run_id, phase_id=PHASE, ok=1, failed=0))
    backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="done"))


@pytest.fixture
def stored(redis_client: Client) -> Iterator[Stored]:
    """Two filled runs on the current target; the first one gets corrupted."""
    backend = RedisCheckpointBackend(redis_client, watch=False)
    other_backend = RedisCheckpointBackend(redis_client, watch=False)
    run_id, other = uuid.uuid4(), uuid.uuid4()
    _fill(other_backend, other)
    _fill(backend, run_id)
    stored = Stored(redis_client, backend, run_id, other, [backend, other_backend])
    yield stored
    for opened in stored.opened:
        opened.close()


def _other_run_still_works(s: Stored) -> None:
    backend = s.reopen()
    before = backend.open_run(s.other)
    assert before is not None and before.total_tokens == 120
    backend.append_event(
        AgentDone(
            run_id=s.other,
            agent_id=uuid.uuid4(),
            status=AgentStatus.OK,
            tokens=TokenUsage(input=1),
            elapsed_ms=1,
        )
    )
    assert [e.TYPE for e in backend.get_event_log()][-1] == "agent_done"
    fresh = s.reopen().open_run(s.other)
    assert fresh is not None and fresh.total_tokens == 121
    assert s.other in s.reopen().list_runs()


def _is_uint(raw: bytes, hi: int = U64_MAX) -> bool:
    return re.fullmatch(rb"0|[1-9][0-9]*", raw) is not None and int(raw) <= hi


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _open_expecting(s: Stored, key: str, field: str, *, may_succeed: bool = False) -> None:
    backend = s.reopen()
    try:
        backend.open_run(s.run_id)
    except CorruptDataError as exc:
        assert (exc.key, exc.field) == (key, field), exc
        assert key in str(exc)
        assert backend.run_id is None  # a failed open binds nothing
    else:
        assert may_succeed, f"open_run accepted garbage in {key} {field!r}"


garbage = st.binary(max_size=40) | st.sampled_from(
    [
        b"",
        b"-1",
        b"1e3",
        b" 1",
        b"1 ",
        b"01",
        b"0x10",
        b"18446744073709551616",
        b"4294967296",
        b"\xff",
        b"\xc0",
        b"\x90",
        b"RUNNING",
        b"nan",
        b"1.5",
        "\u0661".encode(),
    ]
)

# name -> (key attribute, field, validity test of a value for that field)
HASH_FIELDS: dict[str, tuple[str, str, Callable[[bytes], bool]]] = {
    "status": (
        "run",
        "status",
        lambda raw: raw in (b"running", b"completed", b"failed", b"cancelled"),
    ),
    "total_tokens": ("run", "total_tokens", _is_uint),
    "version": ("run", "version", _is_uint),
    "updated_at": ("run", "updated_at", _is_uint),
    "current_phase": ("run", "current_phase", lambda raw: _is_uint(raw, U32_MAX)),
    "schema": ("run", "schema", lambda raw: raw == b"1"),
    "task": ("run", "task", _is_utf8),
    "result_tokens": ("results", f"{AGENT}:tokens", _is_uint),
    "result_status": (
        "results",
        f"{AGENT}:status",
        lambda raw: raw.decode("utf-8", "replace") in t.AGENT_RESULT_STATUSES,
    ),
    "result_phase_id": ("results", f"{AGENT}:phase_id", lambda raw: _is_uint(raw, U32_MAX)),
    "phase_planned": ("phases", f"{PHASE}:planned", _is_uint),
    "phase_seq": ("phases", f"{PHASE}:seq", _is_uint),
    "phase_label": ("phases", f"{PHASE}:label", _is_utf8),
    "started": (
        "started",
        str(AGENT),
        lambda raw: re.fullmatch(rb"(0|[1-9][0-9]{0,8}) (0|[1-9][0-9]{0,8})", raw) is not None,
    ),
}

# Blobs: random bytes are almost never valid, but may be (b"\xc0" is JSON null).
BLOB_FIELDS: dict[str, tuple[str, str]] = {
    "workflow_meta": ("run", "workflow_meta"),
    "result_output": ("results", f"{AGENT}:output"),
    "result_findings": ("results", f"{AGENT}:findings"),
    "findings_segment": ("findings", str(AGENT)),
}


@pytest.mark.parametrize("name", sorted(HASH_FIELDS))
def test_garbage_in_a_hash_field(stored: Stored, name: str) -> None:
    key_attr, field, valid = HASH_FIELDS[name]
    key = getattr(stored.keys, key_attr)
    original = stored.client.hget(key, field)
    assert original is not None, f"{key} {field} is not stored; the layout changed?"

    @STORE_FUZZ
    @given(garbage)
    def check(raw: bytes) -> None:
        assume(not valid(raw))
        stored.client.hset(key, field, raw)
        _open_expecting(stored, key, field)

    check()
    stored.client.hset(key, field, original)
    assert stored.reopen().open_run(stored.run_id) is not None
    _other_run_still_works(stored)


@pytest.mark.parametrize("name", sorted(BLOB_FIELDS))
def test_garbage_in_a_blob_field(stored: Stored, name: str) -> None:
    key_attr, field = BLOB_FIELDS[name]
    key = getattr(stored.keys, key_attr)
    assert stored.client.hget(key, field) is not None, f"{key} {field} is not stored"

    @STORE_FUZZ
    @given(garbage | msgpack_values.map(_pack) | msgpack_values.map(_pack2))
    def check(raw: bytes) -> None:
        stored.client.hset(key, field, raw)
        _open_expecting(stored, key, field, may_succeed=True)

    check()
    _other_run_still_works(stored)


def test_garbage_in_the_findings_order(stored: Stored) -> None:
    keys = stored.keys
    segment = stored.client.lindex(keys.findings_order, 0)
    assert segment == str(AGENT).encode()

    @STORE_FUZZ
    @given(garbage)
    def check(raw: bytes) -> None:
        assume(raw != segment)
        stored.client.lset(keys.findings_order, 0, raw)
        if _is_utf8(raw):  # names a segment that does not exist
            _open_expecting(stored, keys.findings, raw.decode("utf-8"))
        else:
            _open_expecting(stored, keys.findings_order, "<element>")

    check()
    stored.client.lset(keys.findings_order, 0, segment)
    stored.client.rpush(keys.findings_order, "~9")  # listed, but no such segment
    _open_expecting(stored, keys.findings, "~9")
    stored.client.rpop(keys.findings_order)
    stored.client.delete(keys.findings_order)  # a segment no longer listed
    _open_expecting(stored, keys.findings, str(AGENT))
    _other_run_still_works(stored)


def test_garbage_in_a_stream_entry(stored: Stored) -> None:
    keys = stored.keys
    events = stored.reopen()
    assert events.open_run(stored.run_id) is not None
    first_id, first = stored.client.xrange(keys.events, count=1)[0]
    # the whole-event blob of formats 1 and 2 (the log of an upgraded run holds such entries)
    first = {b"type": first[b"type"], b"data": codec.encode_event(events.get_event_log()[0])}

    def check_log(field_suffix: str, entry: Any, *, may_succeed: bool = False) -> None:
        eid = entry.decode() if isinstance(entry, bytes) else str(entry)
        try:
            log = events.get_event_log()
        except CorruptDataError as exc:
            assert exc.key == keys.events, exc
            if field_suffix == " *":  # a format-3 entry: the error names its stream field
                assert exc.field.startswith(f"entry {eid}"), exc
            else:
                assert exc.field == f"entry {eid}{field_suffix}", exc
        else:
            assert may_succeed, f"garbage entry {eid} decoded as {log[-1]!r}"
        finally:
            stored.client.xdel(keys.events, entry)

    @STORE_FUZZ
    @given(
        st.sampled_from(EVENT_TYPE_NAMES),
        garbage | msgpack_values.map(_pack) | msgpack_values.map(_pack2),
    )
    def check_data(type_name: str, raw: bytes) -> None:
        entry = stored.client.xadd(keys.events, {"type": type_name, "data": raw})
        check_log(" data" if raw[:2] != b"\xc1\x03" else " *", entry, may_succeed=True)

    @STORE_FUZZ
    @given(garbage)
    def check_type(raw: bytes) -> None:
        assume(raw.decode("utf-8", "replace") not in t.EVENT_TYPES)
        entry = stored.client.xadd(keys.events, {"type": raw, "data": first[b"data"]})
        check_log(" type", entry)

    check_data()
    check_type()
    # no data field: a format-3 entry (nothing nested), here lacking the fields of a log
    entry = stored.client.xadd(keys.events, {"type": b"log"})
    check_log(" lv", entry)
    entry = stored.client.xadd(keys.events, {"data": first[b"data"]})  # no type field
    check_log("", entry)
    # The undamaged log still reads back whole.
    assert [e.TYPE for e in events.get_event_log()] == [
        "phase_started",
        "agent_started",
        "agent_done",
        "phase_done",
        "log",
    ]
    assert first_id is not None
    _other_run_still_works(stored)


@pytest.mark.parametrize(
    ("key_attr", "field", "raw"),
    [
        ("run", "status", b"bogus"),
        ("run", "total_tokens", b"12x"),
        ("run", "total_tokens", b"18446744073709551616"),
        ("run", "version", b"-1"),
        ("run", "version", b"abc"),
        ("started", str(AGENT), b"garbage"),
    ],
)
def test_writes_refuse_a_corrupt_run(stored: Stored, key_attr: str, field: str, raw: bytes) -> None:
    """A script that reads a corrupt field fails before writing anything."""
    keys = stored.keys
    key = getattr(keys, key_attr)
    stored.client.hset(key, field, raw)
    attempts: list[t.AgentEvent] = [
        # agent_started of a known agent reads `started`; agent_done adds tokens.
        AgentStarted(run_id=stored.run_id, phase_id=PHASE, agent_id=AGENT, prompt_preview="2"),
        AgentDone(
            run_id=stored.run_id,
            agent_id=AGENT,
            status=AgentStatus.OK,
            tokens=TokenUsage(input=1),
            elapsed_ms=1,
        ),
    ]
    refused = 0
    for event in attempts:
        length = stored.client.xlen(keys.events)
        run_before = stored.client.hgetall(keys.run)
        try:
            stored.backend.append_event(event)
        except CorruptDataError as exc:
            refused += 1
            assert (exc.key, exc.field) == (key, field), exc
            assert stored.client.xlen(keys.events) == length
            assert stored.client.hgetall(keys.run) == run_before
    assert refused, f"no write refused the corrupt {key} {field!r}"
    _other_run_still_works(stored)


def test_a_missing_run_hash_field(stored: Stored) -> None:
    keys = stored.keys
    for field in ("status", "total_tokens", "version", "created_at", "task", "schema"):
        value = stored.client.hget(keys.run, field)
        stored.client.hdel(keys.run, field)
        _open_expecting(stored, keys.run, field)
        stored.client.hset(keys.run, field, value)
    _other_run_still_works(stored)


def test_result_with_a_bad_field_name(stored: Stored) -> None:
    keys = stored.keys
    stored.client.hset(keys.results, "no-colon", b"1")
    _open_expecting(stored, keys.results, "no-colon")
    stored.client.hdel(keys.results, "no-colon")
    stored.client.hset(keys.results, "not-a-uuid:status", b"ok")
    with pytest.raises(CorruptDataError) as info:
        stored.reopen().open_run(stored.run_id)
    assert info.value.key == keys.results and "not-a-uuid" in info.value.field
    _other_run_still_works(stored)


def test_wrong_key_types_are_luft_errors(stored: Stored) -> None:
    """A key of the wrong Redis type: a luft error (WRONGTYPE), never a raw redis error."""
    keys = stored.keys
    stored.client.delete(keys.phases)
    stored.client.set(keys.phases, b"a string")
    with pytest.raises(LuftRedisError):
        stored.reopen().open_run(stored.run_id)
    _other_run_still_works(stored)
