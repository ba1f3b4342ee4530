"""The bulk decoders of a cold load (``cache._Loader._results_bulk``, ``_started_bulk``,
``_segments_bulk``, ``codec.decode_findings_many``/``decode_json_many``) against the
per-field path they shortcut: on any load reply, valid or mutated, both give the same state or
the same error. The bulk path only declines (returns None) what it doubts; it must never
accept what the per-field path refuses, nor decode anything differently."""

from __future__ import annotations

import uuid
from typing import Any

import fakeredis
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luft_redis import (
    AgentResultCache,
    CheckpointStatus,
    CorruptDataError,
    Finding,
    Location,
    PhaseSummary,
    RedisCheckpointBackend,
    RunCheckpoint,
    Severity,
    codec,
)
from luft_redis import cache as cache_mod
from luft_redis.cache import RunState
from luft_redis.keys import RunKeys

H = codec._HEADER


def _results() -> list[AgentResultCache]:
    findings = [
        (),
        (Finding(kind="bug", severity=Severity.HIGH, title="t", detail="d",
                 location=Location(file="a.py", line=3)),),
        (Finding(kind="k", severity=Severity.LOW, title="t2", detail="", location=Location(
            file="b.py")), Finding(kind="k", severity=Severity.INFO, title="", detail="x")),
        (Finding(kind="e", severity=Severity.CRITICAL, title="t", detail="d", evidence=("a", "b"),
                 data={"n": [1, 2.5, None]}),),
    ]  # fmt: skip
    outputs: list[Any] = [None, "done", 7, {"answer": [1, "x"]}, True]
    return [
        AgentResultCache(
            agent_id=uuid.uuid4(), phase_id=i % 3, status=("ok", "error", "cancelled")[i % 3],
            output=outputs[i % len(outputs)], findings=findings[i % len(findings)],
            tokens=i * 1000, completed_at=1_777_000_000 + i,
            cache_key_hash=None if i % 2 else "abc", description=None if i % 3 else "desc é",
            role="r" if i % 4 else None,
        )
        for i in range(9)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def base() -> tuple[uuid.UUID, RunKeys, list[Any]]:
    client = fakeredis.FakeRedis()
    backend = RedisCheckpointBackend(client, watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "bulk", "/tmp/bulk")
    rs = _results()
    backend.save_checkpoint(RunCheckpoint(
        run_id=run_id, task="bulk", status=CheckpointStatus.RUNNING, current_phase=1,
        completed_phases=(PhaseSummary(phase_id=1, label="l", planned=9, ok=9, failed=0),),
        agent_results={r.agent_id: r for r in rs},
        findings=tuple(f for r in rs for f in r.findings), total_tokens=1, created_at=1,
        updated_at=2, started_agent_ids=tuple(r.agent_id for r in rs[:7]),
    ))  # fmt: skip
    binding = backend._binding
    assert binding is not None
    reply = client.execute_command(  # type: ignore[no-untyped-call]
        *backend._scripts.load.command(binding.key_list, []))
    backend.close()
    return run_id, binding.keys, reply


def _outcome(run_id: uuid.UUID, keys: RunKeys, reply: Any, bulk: bool,
             monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:  # fmt: skip
    with monkeypatch.context() as m:
        if not bulk:
            for name in ("_results_bulk", "_started_bulk", "_segments_bulk"):
                m.setattr(cache_mod._Loader, name, lambda self, *a: None)
        try:
            return "ok", RunState.from_load(run_id, keys, reply).snapshot
        except Exception as exc:  # compared, not swallowed
            return type(exc).__name__, str(exc)


def _same(base: Any, reply: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    run_id, keys, _ = base
    fast = _outcome(run_id, keys, reply, True, monkeypatch)
    slow = _outcome(run_id, keys, reply, False, monkeypatch)
    assert fast == slow
    return fast


def test_a_valid_reply_takes_the_bulk_path(base: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, keys, reply = base
    loader = cache_mod._Loader(run_id, keys)
    assert loader._results_bulk(reply[2]) is not None
    assert loader._started_bulk(reply[4]) is not None
    assert loader._segments_bulk(reply[5], reply[6]) is not None
    kind, snapshot = _same(base, reply, monkeypatch)
    assert kind == "ok" and len(snapshot.agent_results) == 9


NASTY = [
    b"", b"0", b"01", b"-1", b"1 ", b" 1", b"+1", b"1_0", b"\xd9\xa3", b"1\n2", b"4294967296",
    b"18446744073709551616", b"ok", b"OK", b"error", b"\xff", b"ok\n", b"1 0", b"01 0",
    b"1 4294967296", b"1  0", b"1 0\n2 0",
    H, H + b"\x90", H + b"\x91\x94\xa1k\x03\xa1t\xa1d", H + b"\x91\x94\xa1k\xc3\xa1t\xa1d",
    H + b"\x91\x94\xa1k\x09\xa1t\xa1d", H + b"\x91\x95\xa1k\x01\xa1t\xa1d\x90",
    H + b"\x91\x95\xa1k\x01\xa1t\xa1d\x92\xa1f\xce\xff\xff\xff\xff",
    H + b"\x91\x95\xa1k\x01\xa1t\xa1d\x92\xa1f\xcf\x00\x00\x00\x01\x00\x00\x00\x00",
    H + b"\x91\x95\xa1k\x01\xa1t\xa1d\x91\x01", H + b"\x91\x95\xa1k\x01\xa1t\xa1d\xc0",
    H + b"\x91\x96\xa1k\x01\xa1t\xa1d\xc0\x92\xa1a\x01",
    H + b"\x91\x96\xa1k\x01\xa1t\xa1d\xc0\xa1a",
    H + b"\x91\x97\xa1k\x01\xa1t\xa1d\xc0\x90\x81\x01\x02",
    H + b"\x91\x98\xa1k\x01\xa1t\xa1d\xc0\x90\xc0\xc0",
    H + b"\x91\x93\xa1k\x01\xa1t", H + b"\x91\x94\xa1k\x01\xa1t\xa1d\x00", H + b"\xa1x",
    H + b"\xc7\x0d\x05" + b"x" * 13, H + b"\xd4\x05x", H + b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00",
    H + b"\x92\x01\x02", H + b"\xa5hello", H + b"\xc3", H + b"\xc0", b"\xc1\x04\xa1x",
    b"\xc1\x01\xa1x", b"\x91\x94\xa1k\x01\xa1t\xa1d", b"\xa1x",
    b"\xc1\x02\x91\x94\xa1k\x01\xa1t\xa1d", codec.encode_json("x") + b"\x00",
]  # fmt: skip


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_a_mutated_reply_decodes_as_the_per_field_path_does(
    base: Any, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, reply = base
    mutated = [list(part) if isinstance(part, list) else part for part in reply]
    for _ in range(data.draw(st.integers(1, 3))):
        part = data.draw(st.sampled_from([2, 2, 2, 4, 5, 6]))
        items = mutated[part]
        if not items:
            continue
        i = data.draw(st.integers(0, len(items) - 1))
        action = data.draw(st.sampled_from(["nasty", "bytes", "swap", "drop", "dup", "name"]))
        if action == "nasty":
            items[i] = data.draw(st.sampled_from(NASTY))
        elif action == "bytes":
            items[i] = data.draw(st.binary(max_size=12))
        elif action == "swap":
            j = data.draw(st.integers(0, len(items) - 1))
            items[i], items[j] = items[j], items[i]
        elif action == "drop" and part != 6:
            del items[i - i % 2 : i - i % 2 + 2]
        elif action == "drop":
            del items[i]
        elif action == "dup":
            items.append(items[i])
            if part != 6:
                items.append(items[i ^ 1])
        else:
            name = items[i - i % 2]
            items[i - i % 2] = data.draw(st.sampled_from([
                name.upper(), name + b"x", name[:36] + b":unknown", name[:35] + b":status",
                b"x" + name, name.replace(b":", b";"), name[:37], str(uuid.uuid4()).encode()
                + name[36:], name[:36] + b"\n" + name,
            ]))  # fmt: skip
    _same(base, mutated, monkeypatch)


def test_a_name_twice_in_the_started_reply_decodes_as_the_per_field_path_does(
    base: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An example the mutation test above found: the first agent of the started hash's reply
    named again at its end, and the values swapped. The bulk path listed that agent twice; the
    per-field path keeps a name's last value (a dict), so the bulk path declines such a reply."""
    _, _, reply = base
    mutated = [list(part) if isinstance(part, list) else part for part in reply]
    started = mutated[4]
    started += started[0:2]
    started[1], started[3] = started[3], started[1]
    kind, snapshot = _same(base, mutated, monkeypatch)
    assert kind == "ok" and len(set(snapshot.started_agent_ids)) == len(snapshot.started_agent_ids)


def test_bulk_findings_decode_as_the_per_blob_decoder() -> None:
    valid = [codec.encode_findings(r.findings) for r in _results() if r.findings]
    found = codec.decode_findings_many(valid)
    assert found == {blob: codec.decode_findings(blob, key="k", field="f") for blob in valid}
    for nasty in NASTY:  # all or none of a batch: each one alone, then with the valid ones
        for batch in ([nasty], [*valid, nasty]):
            found = codec.decode_findings_many(batch)
            try:
                exact: Any = codec.decode_findings(nasty, key="k", field="f")
            except CorruptDataError:
                assert found == {}
            else:
                assert found.get(nasty, exact) == exact  # left out (format 1), or the same


def test_bulk_json_decodes_as_the_per_blob_decoder() -> None:
    valid = [codec.encode_json(v) for v in ("x", 1, None, True, -5, 2**64 - 1)]
    found = codec.decode_json_many(valid)
    assert found == {blob: codec.decode_json(blob, key="k", field="f") for blob in valid}
    for nasty in [*NASTY, msgpack.packb("old"), codec.encode_json({"a": 1})]:
        for batch in ([nasty], [*valid, nasty]):
            found = codec.decode_json_many(batch)
            try:
                exact: Any = codec.decode_json(nasty, key="k", field="f")
            except CorruptDataError:
                assert nasty not in found
            else:  # left out (not a scalar, or format 1), or the same
                assert type(found.get(nasty, exact)) is type(exact)
                assert found.get(nasty, exact) == exact


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("valid", [True, False])
def test_a_big_load_pauses_the_gc_and_leaves_it_as_it_was(
    base: Any, monkeypatch: pytest.MonkeyPatch, enabled: bool, valid: bool
) -> None:
    """A load past PAUSE_GC_FIELDS decodes with the cyclic GC off (when it was on), and the
    GC is as it was afterwards: after a good load and after a corrupt one alike."""
    import gc

    run_id, keys, reply = base
    monkeypatch.setattr(cache_mod, "PAUSE_GC_FIELDS", len(reply[2]))
    seen: list[bool] = []
    load = cache_mod._Loader.load

    def spy(self: Any, r: Any) -> Any:
        seen.append(gc.isenabled())
        return load(self, r)

    monkeypatch.setattr(cache_mod._Loader, "load", spy)
    bad = list(reply)
    if not valid:  # a result's tokens that are not a number
        bad[2] = list(reply[2])
        at = next(i for i, name in enumerate(bad[2][::2]) if name.endswith(b":tokens"))
        bad[2][2 * at + 1] = b"x"
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        if valid:
            assert len(RunState.from_load(run_id, keys, bad).results) == 9
        else:
            with pytest.raises(CorruptDataError):
                RunState.from_load(run_id, keys, bad)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False]
    # below the threshold nothing changes
    monkeypatch.setattr(cache_mod, "PAUSE_GC_FIELDS", len(reply[2]) + 1)
    seen.clear()
    if valid:
        RunState.from_load(run_id, keys, reply)
        assert seen == [gc.isenabled()]
