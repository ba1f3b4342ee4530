"""The cache across backends on separate clients: change notices, the change API, the live feed.

Runs on fakeredis, a private redis-server and a private 3-master cluster.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

import luft_redis.errors as luft_redis_errors
from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStatus,
    CheckpointStatus,
    Finding,
    Log,
    LogLevel,
    PhaseStarted,
    RedisCheckpointBackend,
    RunCheckpoint,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
)
from luft_redis.keys import tombstone_key

Client: TypeAlias = "redis.Redis | RedisCluster"
Factory: TypeAlias = Callable[..., RedisCheckpointBackend]

BOUND = 5.0  # seconds: far above the expected milliseconds, low enough to fail fast


def fresh(backend: RedisCheckpointBackend) -> RunCheckpoint:
    other = RedisCheckpointBackend(backend.client, watch=False)
    assert backend.run_id is not None
    cp = other.open_run(backend.run_id)
    assert cp is not None
    return cp


def eventually(predicate: Callable[[], bool], bound: float = BOUND) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def done(run_id: uuid.UUID, agent: uuid.UUID, tokens: int = 10) -> AgentDone:
    return AgentDone(
        run_id=run_id, agent_id=agent, status=AgentStatus.OK,
        tokens=TokenUsage(input=tokens, output=1), elapsed_ms=1,
        findings=(Finding(kind="k", severity=Severity.LOW, title=str(agent), detail="d"),),
    )  # fmt: skip


@pytest.fixture
def pair(make_backend: Factory) -> tuple[RedisCheckpointBackend, RedisCheckpointBackend]:
    writer, reader = make_backend(), make_backend()
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    reader.open_run(run_id)
    assert eventually(lambda: writer.cache_is_fresh and reader.cache_is_fresh)
    return writer, reader


def test_a_reader_sees_every_kind_of_change_without_writing(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    writer, reader = pair
    run_id = writer.run_id
    assert run_id is not None
    agent = uuid.uuid4()
    changes: list[Callable[[], None]] = [
        lambda: writer.append_event(PhaseStarted(run_id=run_id, phase_id=1, label="a", planned=2)),
        lambda: writer.append_events([done(run_id, agent), Log(run_id=run_id,
                                      level=LogLevel.INFO, msg="x")]),
        lambda: writer.upsert_agent_result(AgentResultCache(
            agent_id=agent, phase_id=1, status="error", output={"o": [1]}, findings=(),
            tokens=3, completed_at=7, cache_key_hash="h")),
        lambda: writer.upsert_agent_session(AgentSessionCheckpoint(
            agent_id=agent, backend_id="b", session_id="s", status="x", updated_at=1,
            resumable=True)),
        writer.cancel,
        writer.reset_status_to_running,
        lambda: writer.save_checkpoint(writer.get_checkpoint()._replace(task="saved")),  # type: ignore[union-attr]
        lambda: writer.append_event(RunDone(run_id=run_id, status=RunStatus.FAILED,
                                            total_tokens=TokenUsage(input=99))),
    ]
    for change in changes:
        before = reader.version
        change()
        assert reader.wait_for_change(before, timeout=BOUND)
        assert eventually(lambda: reader.get_checkpoint() == writer.get_checkpoint())
        assert reader.get_checkpoint() == fresh(writer)
        assert reader.cache_is_fresh
    cp = reader.get_checkpoint()
    assert cp is not None and cp.status is CheckpointStatus.FAILED and cp.task == "saved"


def test_a_worker_learns_of_a_cancel_through_its_cache(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    operator, worker = pair
    operator.cancel()
    assert eventually(
        lambda: worker.get_checkpoint().status is CheckpointStatus.CANCELLED  # type: ignore[union-attr]
    )
    assert worker.can_resume()  # a cancelled run stays resumable


def test_subscribe_and_unsubscribe(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    writer, reader = pair
    run_id = writer.run_id
    assert run_id is not None
    seen: list[int] = []
    got = threading.Event()

    def on_change(cp: RunCheckpoint) -> None:
        seen.append(cp.total_tokens)
        got.set()

    unsubscribe = reader.subscribe(on_change)
    writer.append_event(done(run_id, uuid.uuid4(), tokens=41))
    assert got.wait(BOUND)
    assert seen[-1] == 42
    unsubscribe()
    count = len(seen)
    before = reader.version
    writer.append_event(done(run_id, uuid.uuid4(), tokens=1))
    assert reader.wait_for_change(before, timeout=BOUND)
    assert len(seen) == count


def test_wait_for_change_times_out(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    _, reader = pair
    start = time.monotonic()
    assert reader.wait_for_change(timeout=0.2) is False
    assert time.monotonic() - start >= 0.19


def test_iter_events_follows_the_log(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    writer, reader = pair
    run_id = writer.run_id
    assert run_id is not None
    writer.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="before"))
    events = [Log(run_id=run_id, level=LogLevel.INFO, msg=f"m{i}") for i in range(5)]

    def produce() -> None:
        for event in events:
            time.sleep(0.02)
            writer.append_event(event)

    thread = threading.Thread(target=produce)
    thread.start()
    got = [entry.event for entry in reader.iter_events("$", timeout=1.0)]
    thread.join()
    assert got == events
    everything = list(reader.iter_events(follow=False))
    assert [e.event for e in everything][1:] == events
    # resume after an id
    after_first = list(reader.iter_events(everything[0].id, follow=False))
    assert [e.event for e in after_first] == events


def test_a_backend_without_watch_catches_up_on_its_next_write(make_backend: Factory) -> None:
    writer, lazy = make_backend(), make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    lazy.open_run(run_id)
    writer.append_event(done(run_id, uuid.uuid4()))
    time.sleep(0.1)
    assert lazy.get_checkpoint().total_tokens == 0  # type: ignore[union-attr]
    assert not lazy.cache_is_fresh
    lazy.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
    assert lazy.get_checkpoint() == fresh(writer)


def test_many_backends_on_one_client_share_one_listener(
    redis_client: Client, open_client: Callable[[], Client]
) -> None:
    from luft_redis._sync.listener import ChangeListener

    backends = [RedisCheckpointBackend(redis_client) for _ in range(3)]
    runs = [uuid.uuid4() for _ in backends]
    for backend, run_id in zip(backends, runs, strict=True):
        backend.init_run(run_id, "t", "/d")
    listener = ChangeListener.for_client(redis_client)
    assert all(b._binding is not None and b._binding.listener is listener for b in backends)
    threads = [t for t in threading.enumerate() if t.name.startswith("luft-redis-listener")]
    mine = [t for t in threads if t.name.endswith(f"-{id(redis_client):x}")]
    # one subscriber connection (and thread) per node that owns a watched channel
    nodes = {t.name.rsplit("-", 1)[0] for t in mine}
    assert len(mine) == len(nodes) >= 1
    assert len(mine) <= (3 if isinstance(redis_client, RedisCluster) else 1)
    other = RedisCheckpointBackend(open_client())
    other.open_run(runs[1])
    before = backends[1].version
    other.append_event(Log(run_id=runs[1], level=LogLevel.INFO, msg="x"))
    assert backends[1].wait_for_change(before, timeout=BOUND)
    assert backends[0].version == 1 and backends[2].version == 1
    for backend in backends:
        backend.close()
    other.close()


def test_a_retried_write_applies_once(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    """The same (writer, operation) sent twice, as after a lost reply: applied once."""
    writer, reader = pair
    run_id = writer.run_id
    assert run_id is not None
    from luft_redis.delta import parse_delta

    args = writer._encoder.events([done(run_id, uuid.uuid4(), tokens=100)], run_id)
    op = ("writer-x", "7", *args, "", "")  # (no fence, no retention)
    keys = list(writer.keys or ())

    def call(op: tuple[str, ...]) -> bytes:
        reply: bytes = writer._call(writer._scripts.append_events, op, keys, run_id)
        return reply

    first, second = parse_delta(call(op)), parse_delta(call(op))
    assert first.changed and not first.replay and second.replay
    assert (second.inc_before, second.v_before, second.inc_after, second.v_after) == (
        first.inc_before, first.v_before, first.inc_after, first.v_after)
    cp = fresh(writer)
    assert cp.total_tokens == 101 and len(writer.get_event_log()) == 1
    older = ("writer-x", "6", *args, "", "")
    with pytest.raises(Exception, match="older"):
        call(older)
    assert fresh(writer) == cp
    assert eventually(lambda: reader.get_checkpoint() == cp)


def test_a_change_right_after_loading_reaches_a_backend_sharing_the_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """open_run on a channel another backend of the same client already watches: a change
    made between the load and the binding must not be skipped (fakeredis: needs a hook)."""
    import luft_redis.cache as cache_mod

    server = fakeredis.FakeServer()
    c1, c2 = fakeredis.FakeRedis(server=server), fakeredis.FakeRedis(server=server)
    writer = RedisCheckpointBackend(c2)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    other, reader = RedisCheckpointBackend(c1), RedisCheckpointBackend(c1)
    other.open_run(run_id)
    load = cache_mod.RunState.from_load.__func__  # type: ignore[attr-defined]

    def load_then_change(cls: Any, *args: Any) -> Any:
        state = load(cls, *args)
        writer.upsert_agent_session(AgentSessionCheckpoint(
            agent_id=uuid.uuid4(), session_id="s", status="x", updated_at=1))  # fmt: skip
        time.sleep(0.2)  # the listener has the notice before the state is bound
        return state

    monkeypatch.setattr(cache_mod.RunState, "from_load", classmethod(load_then_change))
    reader.open_run(run_id)
    monkeypatch.undo()
    assert eventually(lambda: reader.version == writer.version == 2)
    assert reader.get_checkpoint() == writer.get_checkpoint() and reader.cache_is_fresh
    for backend in (writer, other, reader):
        backend.close()


def test_rebinding_during_a_write_does_not_mix_runs() -> None:
    """A write that waits for other processes' notices releases the lock; a rebind by another
    thread meanwhile must not receive the first run's change (fakeredis)."""
    server = fakeredis.FakeServer()
    c1, c2 = fakeredis.FakeRedis(server=server), fakeredis.FakeRedis(server=server)
    writer = RedisCheckpointBackend(c2, watch=False)
    r1, r2 = uuid.uuid4(), uuid.uuid4()
    writer.init_run(r2, "two", "/d")
    writer.upsert_agent_session(AgentSessionCheckpoint(
        agent_id=uuid.uuid4(), session_id="s", status="x", updated_at=1))  # fmt: skip
    writer.init_run(r1, "one", "/d")
    reader = RedisCheckpointBackend(c1)
    reader.open_run(r1)
    from luft_redis._sync.listener import ChangeListener

    # a slow listener: the notices of c1 are not delivered
    ChangeListener.for_client(c1)._targets = lambda channel: []  # type: ignore[method-assign]
    writer.upsert_agent_session(AgentSessionCheckpoint(
        agent_id=uuid.uuid4(), session_id="s", status="x", updated_at=1))  # fmt: skip
    agent = uuid.uuid4()
    result = AgentResultCache(agent_id=agent, phase_id=0, status="ok", output=None,
                              findings=(), tokens=5, completed_at=1)  # fmt: skip
    first = threading.Thread(target=reader.upsert_agent_result, args=(result,))
    first.start()
    time.sleep(0.03)
    reader.open_run(r2)
    first.join()
    cp = reader.get_checkpoint()
    assert cp is not None and cp.run_id == r2 and agent not in cp.agent_results
    assert cp == fresh(reader)
    reader.close()


def test_a_slow_open_run_does_not_hold_up_other_backends_on_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listener is shared by every backend on a client: while one backend loads a big run,
    the others keep receiving their notices (fakeredis; the load is slowed by a hook)."""
    import luft_redis.cache as cache_mod

    server = fakeredis.FakeServer()
    shared, other_client = fakeredis.FakeRedis(server=server), fakeredis.FakeRedis(server=server)
    writer = RedisCheckpointBackend(other_client)
    r1, r2 = uuid.uuid4(), uuid.uuid4()
    writer.init_run(r2, "big", "/d")
    writer.init_run(r1, "small", "/d")
    watcher, loader = RedisCheckpointBackend(shared), RedisCheckpointBackend(shared)
    watcher.open_run(r1)
    load = cache_mod.RunState.from_load.__func__  # type: ignore[attr-defined]
    loading = threading.Event()

    def slow_load(cls: Any, *args: Any) -> Any:
        loading.set()
        time.sleep(1.0)
        return load(cls, *args)

    monkeypatch.setattr(cache_mod.RunState, "from_load", classmethod(slow_load))
    opener = threading.Thread(target=loader.open_run, args=(r2,))
    opener.start()
    assert loading.wait(BOUND)
    start = time.monotonic()
    writer.append_event(Log(run_id=r1, level=LogLevel.INFO, msg="while the other loads"))
    assert watcher.wait_for_change(1, timeout=BOUND)
    took = time.monotonic() - start
    opener.join()
    monkeypatch.undo()
    assert took < 0.5, f"the watcher waited {took:.2f}s for the other backend's load"
    assert loader.get_checkpoint() is not None and loader.get_checkpoint().task == "big"  # type: ignore[union-attr]
    for backend in (writer, watcher, loader):
        backend.close()


def test_delete_run(
    redis_client: Client, pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend]
) -> None:
    from luft_redis import RunNotFoundError

    operator, worker = pair
    run_id = operator.run_id
    assert run_id is not None
    operator.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
    other = uuid.uuid4()
    RedisCheckpointBackend(redis_client, watch=False).init_run(other, "kept", "/d")
    assert operator.delete_run() is True
    assert operator.get_checkpoint() is None and operator.run_id is None
    assert operator.list_runs() == [other]
    left = [k for k in redis_client.scan_iter(match=f"*{run_id}*", count=1000)]
    assert left == [tombstone_key("luft", run_id).encode()]  # only the delete's tombstone
    assert eventually(lambda: not worker.cache_is_fresh)
    with pytest.raises(RunNotFoundError):
        worker.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="late"))
    assert list(redis_client.scan_iter(match=f"*{run_id}*", count=1000)) == left  # no write
    assert operator.delete_run(run_id) is False
    with pytest.raises(luft_redis_errors.RunNotBoundError):
        operator.delete_run()


@pytest.mark.parametrize("redis_target", ["redis"])
def test_close_releases_the_subscriber_connection_at_once(redis_client: Client) -> None:
    """close() of the last backend watching through a client ends its listener thread and its
    subscriber connection before it returns: the client can be closed right after."""
    assert isinstance(redis_client, redis.Redis)
    kwargs = redis_client.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"])
    backend = RedisCheckpointBackend(client)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")
    channel = backend.keys.changes if backend.keys else ""
    assert eventually(lambda: backend.cache_is_fresh)
    assert redis_client.pubsub_shardnumsub(channel)[0][1] == 1
    backend.close()
    suffix = f"-{id(client):x}"
    alive = [t for t in threading.enumerate()
             if t.name.startswith("luft-redis-listener") and t.name.endswith(suffix)]  # fmt: skip
    assert alive == []
    assert redis_client.pubsub_shardnumsub(channel)[0][1] == 0
    client.close()


def test_a_phase_started_without_its_label_is_refused_before_anything_is_written(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    """Issue 10: the script checks every event's arguments before its first write, so a
    phase_started whose label is missing fails with nothing stored (it used to fail at the
    phase's HSET, after the XADD of the whole batch)."""
    writer, _ = pair
    run_id = writer.run_id
    assert run_id is not None
    keys = list(writer.keys or ())
    before = fresh(writer)
    ok = writer._encoder.events([done(run_id, uuid.uuid4())], run_id)
    phase = writer._encoder.events(
        [PhaseStarted(run_id=run_id, phase_id=1, label="scan", planned=2)], run_id)
    # event count, the entry (its length, then its field-value pairs), the rule arguments
    length = int(phase[1])
    entry, rule = phase[2 : 2 + length], phase[2 + length :]
    assert entry[:2] == ["type", "phase_started"] and rule[1] == "scan"
    # a batch of a valid agent_done, then the phase_started cut before its label
    args = ["2", *ok[1:], *phase[1 : 2 + length + 1]]
    with pytest.raises(luft_redis_errors.LuftRedisError, match=r"label|argument"):
        writer._call(writer._scripts.append_events, ("w-label", "1", *args, "", ""), keys, run_id)
    assert writer.client.xlen(writer.keys.events) == 0  # type: ignore[union-attr]
    assert fresh(writer) == before


def test_an_agent_done_delta_carries_its_findings_blob_once(
    pair: tuple[RedisCheckpointBackend, RedisCheckpointBackend],
) -> None:
    """Format L3: the result's E record points at the F record instead of repeating the blob,
    and both a writer and another process rebuild the same findings from it."""
    from luft_redis import codec
    from luft_redis.delta import FORMAT, parse_delta

    writer, reader = pair
    run_id = writer.run_id
    assert run_id is not None
    event = done(run_id, uuid.uuid4())
    blob = codec.encode_findings(event.findings)
    args = writer._encoder.events([event], run_id)
    keys = list(writer.keys or ())
    op = ("w-once", "1", *args, "", "")  # (no fence, no retention)
    reply = writer._call(writer._scripts.append_events, op, keys, run_id)
    delta = parse_delta(reply)
    assert delta.fmt == FORMAT == b"L3"
    assert reply.count(blob) == 1
    records = delta.records()
    assert records.count(blob) == 1
    e = records.index(b"E")
    attrs = records[e + 4 : e + 4 + 2 * int(records[e + 3])]
    assert attrs[attrs.index(b"findings") + 1] == b""
    cp = fresh(writer)
    assert cp.agent_results[event.agent_id].findings == event.findings
    assert eventually(lambda: reader.get_checkpoint() == cp)


@pytest.mark.parametrize(("cut", "header"), [
    ("4 99999 0 0 0", None),  # past the end of the data blob
    ("0 5 0 0 0", None),  # offset 0 (offsets count from 1)
    ("4 5 0 0 0", "drop"),  # no blob header argument
    ("4 5", None),  # too few words
    ("4 5 0 0 1", None),  # a fill pair announced and not there (no name)
    ("4 x 0 0 0", None),  # not a decimal
])  # fmt: skip
def test_an_agent_done_whose_blobs_are_not_in_its_data_is_refused_whole(
    make_backend: Factory, cut: str, header: str | None
) -> None:
    """The script cuts an agent_done's output and findings out of its entry's data blob: an
    offset or length outside it, or a missing header, is LUFT_BAD_ARG and nothing is written
    (the log, the results and the version stay as they were)."""
    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    event = AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                      tokens=TokenUsage(), elapsed_ms=1, output="out")  # fmt: skip
    args = writer._encoder.events([event], run_id)
    words = args[-2].split(" ")
    args[-2] = " ".join([*words[:3], cut])
    if header == "drop":
        del args[-1]
    keys = list(writer.keys or ())
    before = fresh(writer)
    with pytest.raises(luft_redis_errors.BackendError, match="BAD_ARG"):
        writer._call(writer._scripts.append_events, ("w-bad", "1", *args, "", ""), keys, run_id)
    assert fresh(writer) == before
    assert writer.client.xlen(keys[1]) == 0


def test_an_agent_done_fills_the_text_attributes_its_result_lacks(make_backend: Factory) -> None:
    """The pairs after an agent_done's blob header (an event field that is also an optional
    text field of a result: none in this contract yet, so the arguments are made here) fill
    the result where it lacks them, as its output does (contract §5): a new result gets them,
    a stored one keeps its own, a null one sets nothing; a name that is not such a field is
    LUFT_BAD_ARG with nothing written."""
    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    keys = list(writer.keys or ())
    seq = iter(range(1, 100))

    def append(agent: uuid.UUID, pairs: list[str]) -> None:
        event = AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                          tokens=TokenUsage(input=1), elapsed_ms=1)  # fmt: skip
        args = writer._encoder.events([event], run_id)
        words = args[-2].split(" ")
        args[-2] = " ".join([*words[:-1], str(len(pairs) // 2)])
        args += pairs
        writer._call(writer._scripts.append_events,
                     ("w-fill", str(next(seq)), *args, "", ""), keys, run_id)  # fmt: skip

    def result(agent: uuid.UUID) -> Any:
        return fresh(writer).agent_results[agent]

    new, stored = uuid.uuid4(), uuid.uuid4()
    append(new, ["role", "sreviewer", "description", "n"])
    assert (result(new).role, result(new).description) == ("reviewer", None)
    append(new, ["role", "sother", "description", "sd"])  # keeps its role, gains description
    assert (result(new).role, result(new).description) == ("reviewer", "d")
    writer.upsert_agent_result(AgentResultCache(
        agent_id=stored, phase_id=0, status="ok", output=None, findings=(), tokens=1,
        completed_at=1, role="writer"))  # fmt: skip
    append(stored, ["role", "sreviewer", "cache_key_hash", "sk"])
    assert (result(stored).role, result(stored).cache_key_hash) == ("writer", "k")
    before = fresh(writer)
    with pytest.raises(luft_redis_errors.BackendError, match="no text attribute"):
        append(uuid.uuid4(), ["status", "sok"])
    assert fresh(writer) == before


def test_a_writer_applies_its_own_delta_from_what_it_sent(make_backend: Factory) -> None:
    """The writer's cache holds the very values it sent (nothing of its own decoded again);
    another process decodes the bytes to equal values. (The writer does not watch: a watching
    one may get its own notice, which carries only bytes, before the reply.)"""
    writer, reader = make_backend(watch=False), make_backend()
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    reader.open_run(run_id)
    event = done(run_id, uuid.uuid4())
    event = AgentDone(run_id=run_id, agent_id=event.agent_id, status=AgentStatus.OK,
                      tokens=TokenUsage(input=3), elapsed_ms=1, output={"k": [1, 2]},
                      findings=event.findings)  # fmt: skip
    writer.append_event(event)

    def results(backend: RedisCheckpointBackend) -> Any:
        cp = backend.get_checkpoint()
        assert cp is not None
        return cp.agent_results

    mine = results(writer)[event.agent_id]
    assert mine.findings is event.findings and mine.output is event.output
    assert eventually(lambda: event.agent_id in results(reader))
    theirs = results(reader)[event.agent_id]
    assert theirs == mine and theirs.findings is not event.findings


def test_a_delta_naming_a_findings_blob_it_lacks_makes_the_cache_stale_not_a_read_fail(
    make_backend: Factory,
) -> None:
    """An L3 E res record whose empty findings names no F record cannot be applied: the read
    still answers (the last good state) and the cache reports stale until it reloads."""
    from luft_redis.delta import parse_delta

    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    event = done(run_id, uuid.uuid4())
    args = writer._encoder.events([event], run_id)
    keys = list(writer.keys or ())
    reply = writer._call(writer._scripts.append_events, ("w-bad", "1", *args, "", ""), keys, run_id)
    good = parse_delta(reply)
    records = good.records()
    f = records.index(b"F")
    cut = records[:f] + records[f + 3 :]  # drop the F record, keep the E res pointing at it
    index = b" ".join(str(len(p)).encode() for p in cut)
    body = reply[: good.body] + str(len(index)).encode() + b":" + index + b"".join(cut)
    bad = parse_delta(body)
    assert bad.records() == cut
    cache = writer._binding.cache  # type: ignore[union-attr]
    before = writer.get_checkpoint()
    assert cache.offer(bad).name == "APPLIED"
    assert writer.get_checkpoint() == before  # the read answers; nothing half-applied
    assert not cache.synced


def test_a_writers_own_notice_is_dropped_before_it_is_parsed(
    make_backend: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notice of a write whose reply was applied is the reply's bytes: the listener drops
    it with one comparison (no header parse, no lock, no work for the front end)."""
    import luft_redis.watch as watching

    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    writer.append_event(done(run_id, uuid.uuid4()))
    binding = writer._binding
    assert binding is not None
    cache = binding.cache
    own = cache.last_payload
    assert own is not None
    work: list[object] = []
    watch = watching.Watch(cache, binding.channel, work.append)

    def refuse(payload: bytes) -> Any:
        raise AssertionError("an own notice was parsed")

    monkeypatch.setattr(watching, "parse_delta", refuse)
    tip, generation = cache.tip, cache.generation
    watch.notice(bytes(bytearray(own)))  # equal bytes, another object (as off the socket)
    assert work == [] and cache.tip == tip and cache.generation == generation
    monkeypatch.undo()
    other = bytes(own).replace(b"append", b"appenD")  # not the same notice: parsed as usual
    watch.notice(other)
    assert cache.tip == tip


def test_own_notices_read_in_a_batch_are_all_dropped_unparsed(
    make_backend: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listener reads notices in batches (COALESCE_SECONDS): by the time it reads a
    writer's notices the writer applied several replies, and every one of those notices is
    dropped without parsing (not only the last); a notice that is news is still applied and
    counted in the link's ``news``."""
    import luft_redis.links as links
    import luft_redis.watch as watching
    from luft_redis.cache import RECENT

    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    binding = writer._binding
    assert binding is not None
    cache = binding.cache
    own: list[bytes] = []
    for _ in range(RECENT + 5):
        writer.append_event(done(run_id, uuid.uuid4()))
        assert cache.last_payload is not None
        own.append(cache.last_payload)
    work: list[object] = []
    watch = watching.Watch(cache, binding.channel, work.append)
    health = links.LinkHealth()
    from luft_redis.delta import parse_delta as real_parse

    parsed: list[bytes] = []

    def counting(payload: bytes) -> Any:
        parsed.append(payload)
        return real_parse(payload)

    monkeypatch.setattr(watching, "parse_delta", counting)
    tip, generation = cache.tip, cache.generation
    for payload in own:
        message = {"type": "smessage", "channel": binding.channel,
                   "data": bytes(bytearray(payload))}  # fmt: skip
        links.handle_message(message, health, {}, lambda channel: [watch])
    # the last RECENT are dropped unparsed; the older ones are parsed and found old
    assert parsed == own[:5]
    assert work == [] and cache.tip == tip and cache.generation == generation
    assert health.news == 0
    # another writer's change is news: applied, and counted
    other = make_backend(watch=False)
    other.open_run(run_id)
    other.append_event(done(run_id, uuid.uuid4()))
    theirs = other._binding.cache.last_payload  # type: ignore[union-attr]
    assert theirs is not None
    message = {"type": "smessage", "channel": binding.channel, "data": theirs}
    links.handle_message(message, health, {}, lambda channel: [watch])
    assert health.news == 1 and cache.tip[1] == tip[1] + 1
    assert writer.get_checkpoint() == fresh(writer)


def test_a_batch_of_deltas_builds_one_snapshot_equal_to_applying_them_one_by_one(
    make_backend: Factory,
) -> None:
    """Queued deltas are decoded together at the next read, and the snapshot is built once
    after the last: the result equals reading after every delta, and a fresh load."""
    from luft_redis.delta import parse_delta

    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    one = make_backend(watch=False)
    one.open_run(run_id)
    batch = make_backend(watch=False)
    batch.open_run(run_id)
    caches = [b._binding.cache for b in (one, batch)]  # type: ignore[union-attr]
    agents = [uuid.uuid4() for _ in range(4)]
    for i in range(12):
        if i == 5:
            writer.append_event(PhaseStarted(run_id=run_id, phase_id=1, label="a", planned=2))
        else:
            writer.append_event(done(run_id, agents[i % 4], tokens=i + 1))
        payload = writer._binding.cache.last_payload  # type: ignore[union-attr]
        assert payload is not None
        delta = parse_delta(payload)
        for cache in caches:
            assert cache.offer(delta).name == "APPLIED"
        caches[0].snapshot()  # one by one
    assert caches[1].snapshot() == caches[0].snapshot() == fresh(writer)
    assert caches[1].tip == caches[0].tip == writer._binding.cache.tip  # type: ignore[union-attr]


@pytest.mark.parametrize("user_setting", [False, True])
def test_decoding_in_two_threads_leaves_the_gc_as_the_user_set_it(
    make_backend: Factory, monkeypatch: pytest.MonkeyPatch, user_setting: bool,
) -> None:
    """Issue 10, no global side effects: loading and applying never toggle the cyclic GC (a
    process-wide switch), whatever the user set, with two threads decoding at once."""
    import gc

    writer = make_backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    for _ in range(20):
        writer.append_event(done(run_id, uuid.uuid4()))
    calls: list[str] = []
    real_disable, real_enable = gc.disable, gc.enable
    def spy(name: str, real: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            calls.append(name)
            real()

        return call

    monkeypatch.setattr(gc, "disable", spy("disable", real_disable))
    monkeypatch.setattr(gc, "enable", spy("enable", real_enable))
    was = gc.isenabled()
    (real_enable if user_setting else real_disable)()
    seen: set[bool] = set()
    errors: list[BaseException] = []

    def decode() -> None:
        try:
            for _ in range(15):
                reader = RedisCheckpointBackend(writer.client, watch=False)
                reader.open_run(run_id)
                reader.append_event(done(run_id, uuid.uuid4()))
                reader.get_checkpoint()  # applies the write's delta
                seen.add(gc.isenabled())
                reader.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=decode) for _ in range(2)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            seen.add(gc.isenabled())
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert seen == {user_setting} and gc.isenabled() is user_setting
        assert calls == []
    finally:
        (real_enable if was else real_disable)()


def test_what_a_write_sent_equals_a_full_decode_of_its_bytes() -> None:
    """A write's own delta is applied from what it sent (wire.Sent: the values behind the
    id texts and blobs of its arguments); each must equal, type for type, a full decode of
    those bytes, and the blobs cut from the entry's parts must be the bytes a separate
    encoding gives (each value is encoded once)."""
    from luft_redis import codec
    from luft_redis.types import Location
    from luft_redis.wire import Encoder, Sent

    findings = (
        Finding(kind="bug", severity=Severity.HIGH, title="t", detail="d",
                location=Location(file="a.rs", line=3), evidence=("e",),
                data={"x": [1, 2.0, True, None], "big": 2**64 - 1}),
        Finding(kind="k", severity=Severity.LOW, title="u", detail=""),
    )  # fmt: skip
    value = {"answer": 42, "list": [1.0, "two", {"n": None}], "s": "日本"}
    run_id = uuid.uuid4()
    for output, found in ((value, findings), (value, ()), (None, findings), (False, ())):
        event = AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                          tokens=TokenUsage(), elapsed_ms=1, output=output,
                          findings=found)  # fmt: skip
        sent: Sent = {}
        args = Encoder().events([event], run_id, sent)
        blobs = {k: v for k, v in sent.items() if isinstance(k, bytes)}
        assert sent[str(event.agent_id)] is event.agent_id
        expected = {}
        if output is not None:
            expected[codec.encode_json(event.output)] = event.output
        if found:
            expected[codec.encode_findings(found)] = found
        assert blobs == expected
        data = args[args.index("data") + 1]
        for blob, sent_value in blobs.items():
            # sent once, in the entry's data, where the script cuts it out
            assert b"s" + blob not in args and blob[len(codec.BLOB_HEADER):] in data
            if isinstance(sent_value, tuple):
                full: Any = codec.decode_findings(blob, key="k", field="f")
                assert full == sent_value and full is not sent_value
            else:
                full = codec.decode_json(blob, key="k", field="o")
                assert canon_json(full) == canon_json(sent_value)


def canon_json(value: Any) -> str:
    """A type-exact text form of a (frozen) JSON value (tells 1, 1.0 and True apart)."""
    import json

    def plain(v: Any) -> Any:
        if isinstance(v, str | int | float | bool) or v is None:
            return [type(v).__name__, v]
        if hasattr(v, "items"):
            return {k: plain(x) for k, x in v.items()}
        return [plain(x) for x in v]

    return json.dumps(plain(value), sort_keys=True, ensure_ascii=False)


def netstrings(*parts: bytes) -> bytes:
    return b"".join(str(len(p)).encode() + b":" + p for p in parts)


def l9_notice(incarnation: bytes, version: int) -> bytes:
    """A newer writer's notice: netstrings, first part an unknown format."""
    return b"2:L91:x1:y"


def l2_notice(incarnation: bytes, version: int) -> bytes:
    """A notice in format L2 (every record part a netstring of its own), replaced by L3 before
    any release: one that continues the reader's chain and sets the task, so that reading it
    would change the checkpoint."""
    return netstrings(b"L2", incarnation, str(version).encode(), incarnation,
                      str(version + 1).encode(), b"append", b"R", b"task", b"misread")  # fmt: skip


@pytest.mark.parametrize("notice", [l9_notice, l2_notice], ids=["L9", "L2"])
def test_a_notice_in_an_unknown_format_makes_a_watcher_reload_not_raise(
    make_backend: Factory, open_client: Callable[[], Any],
    notice: Callable[[bytes, int], bytes],
) -> None:
    """A notice in a format unknown here (a newer writer's ``L9``; ``L2``, whose reader is
    gone) on the run's channel: the watching backend marks its cache stale (cache_is_fresh
    False while the reload waits), then reloads and equals a fresh load; nothing raises, and
    nothing of the notice is applied (docs/redis-layout.md)."""
    from luft_redis.keys import run_keys

    writer, reader = make_backend(watch=False), make_backend()
    run_id = uuid.uuid4()
    writer.init_run(run_id, "before", "/d")
    reader.open_run(run_id)
    assert eventually(lambda: reader.cache_is_fresh)
    keys = run_keys("luft", run_id)
    admin = open_client()
    # a change no notice told the reader about: only a reload can bring it
    admin.hset(keys.run, "task", "changed behind the cache")
    assert reader.get_checkpoint().task == "before"  # type: ignore[union-attr]

    release = threading.Event()
    reload = reader._reload  # the refresher's reload waits until the test saw it stale

    def held_reload(binding: Any) -> Any:
        release.wait(BOUND)
        return reload(binding)

    reader._reload = held_reload  # type: ignore[method-assign]
    reloads = reader.stats().reloads_total
    incarnation = admin.hget(keys.run, "incarnation")
    admin.spublish(keys.changes, notice(incarnation, reader.version))
    try:
        assert eventually(lambda: not reader.cache_is_fresh)
        assert reader.get_checkpoint().task == "before"  # type: ignore[union-attr]
    finally:
        release.set()
    assert eventually(lambda: reader.cache_is_fresh)
    assert reader.stats().reloads_total > reloads
    cp = reader.get_checkpoint()
    assert cp is not None and cp.task == "changed behind the cache"
    assert cp == fresh(reader)
    # the reader goes on applying ordinary notices afterwards
    writer.open_run(run_id)
    writer.append_event(done(run_id, uuid.uuid4()))
    assert eventually(lambda: reader.get_checkpoint() == writer.get_checkpoint())
