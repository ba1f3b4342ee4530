"""A run's history: ``history``, ``checkpoint_at`` and ``fork_run``.

The property: whatever mix of writes several backends make to a run, ``checkpoint_at`` of every
version equals what ``get_checkpoint()`` returned right after the write that made it. It runs
on every target (fakeredis, a real server, a cluster) and both front ends.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster

from luft_redis import (
    AgentDone,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    AgentTask,
    CheckpointStatus,
    CorruptDataError,
    Finding,
    HistoryUnavailableError,
    Log,
    LogLevel,
    PhaseDone,
    PhaseStarted,
    RedisCheckpointBackend,
    RunDone,
    RunNotFoundError,
    RunStatus,
    Severity,
    TokenUsage,
    ValidationError,
)
from luft_redis import types as t
from luft_redis.errors import LuftRedisError
from luft_redis.keys import run_keys

Client: TypeAlias = "redis.Redis | RedisCluster"

OPS = ("append", "batch", "result", "session", "cancel", "reset", "save", "submit", "claim",
       "done", "release", "pool", "leave")  # fmt: skip


def _lease_call(backend: Any, lease: Any, name: str, **kwargs: Any) -> Any:
    """``lease.<name>(**kwargs)`` on either front end (an asyncio lease on its backend's loop)."""
    loop = getattr(backend, "event_loop_thread", None)
    if loop is None:
        return getattr(lease, name)(**kwargs)
    return loop.call(getattr(lease, name), **kwargs)


class Mix:
    """Random writes to one run by several backends; ``seen`` maps each version to the
    checkpoint its writer's ``get_checkpoint()`` returned right after the write."""

    def __init__(self, backends: list[Any], run_id: uuid.UUID, rng: random.Random) -> None:
        self.backends = backends
        self.run_id = run_id
        self.rng = rng
        self.agents = [uuid.uuid4() for _ in range(6)]
        self.leases: list[tuple[Any, Any]] = []
        self.seen: dict[int, t.RunCheckpoint] = {}

    def record(self, backend: Any) -> None:
        self.seen[backend.version] = backend.get_checkpoint()

    def event(self) -> t.AgentEvent:
        rng, rid = self.rng, self.run_id
        agent = rng.choice(self.agents)
        kind = rng.randrange(6)
        if kind == 0:
            return AgentStarted(run_id=rid, phase_id=rng.randrange(3), agent_id=agent,
                                prompt_preview="p",
                                description=rng.choice([None, "d"]))  # fmt: skip
        if kind == 1:
            findings = tuple(Finding(kind="bug", severity=Severity.LOW, title=f"f{i}", detail="x")
                             for i in range(rng.randrange(3)))  # fmt: skip
            return AgentDone(run_id=rid, agent_id=agent,
                             status=rng.choice([AgentStatus.OK, AgentStatus.ERROR]),
                             tokens=TokenUsage(input=rng.randrange(100), output=3),
                             elapsed_ms=5, output=rng.choice([None, {"n": rng.randrange(9)}]),
                             findings=findings)  # fmt: skip
        if kind == 2:
            return PhaseStarted(run_id=rid, phase_id=rng.randrange(3), label="ph", planned=4)
        if kind == 3:
            return PhaseDone(run_id=rid, phase_id=rng.randrange(3), ok=1, failed=0)
        if kind == 4:
            return RunDone(run_id=rid, status=rng.choice([RunStatus.COMPLETED, RunStatus.FAILED]),
                           total_tokens=TokenUsage(input=1))  # fmt: skip
        return Log(run_id=rid, level=LogLevel.INFO, msg="m")

    def step(self, op: str) -> None:
        rng, rid = self.rng, self.run_id
        b = rng.choice(self.backends)
        before = b.version
        try:
            if op == "append":
                b.append_event(self.event())
            elif op == "batch":
                b.append_events([self.event() for _ in range(rng.randrange(1, 4))])
            elif op == "result":
                b.upsert_agent_result(t.AgentResultCache(
                    agent_id=rng.choice(self.agents), phase_id=rng.randrange(3),
                    status=rng.choice(["ok", "error", "timed_out"]), output={"r": 1},
                    findings=(), tokens=rng.randrange(50), completed_at=7,
                    description=rng.choice([None, "desc"])))  # fmt: skip
            elif op == "session":
                b.upsert_agent_session(AgentSessionCheckpoint(
                    agent_id=rng.choice(self.agents), session_id=f"s{rng.randrange(3)}",
                    status="active", updated_at=rng.randrange(99), resumable=True))  # fmt: skip
            elif op == "cancel":
                b.cancel()
            elif op == "reset":
                b.reset_status_to_running()
            elif op == "save":
                cp = b.get_checkpoint()
                b.save_checkpoint(cp._replace(task=f"saved {rng.randrange(9)}",
                                              total_tokens=cp.total_tokens + 1))  # fmt: skip
            elif op == "submit":
                b.submit_agents([AgentTask(uuid.uuid4(), 0, {"i": 1})])
            elif op == "claim":
                lease = b.claim_agent("w", lease_for=30)
                if lease is not None:
                    self.leases.append((b, lease))
            elif op == "done" and self.leases:
                owner, lease = self.leases.pop(rng.randrange(len(self.leases)))
                owner.append_event(AgentDone(run_id=rid, agent_id=lease.agent_id,
                                             status=AgentStatus.OK, tokens=TokenUsage(input=2),
                                             elapsed_ms=1), lease=lease)  # fmt: skip
                b = owner
            elif op == "release" and self.leases:
                owner, lease = self.leases.pop(rng.randrange(len(self.leases)))
                _lease_call(owner, lease, "release", failed=rng.random() < 0.5)
                b = owner
            elif op == "pool":
                b.join_pool("hist", weight=rng.randrange(1, 4))
            elif op == "leave":
                b.leave_pool()
        except LuftRedisError:
            pass  # refused (a finished run, a lost lease): no version to record
        b.sync()
        if b.version != before:
            self.record(b)


def _check(backend: Any, mix: Mix) -> None:
    versions = sorted(mix.seen)
    for version in versions:
        assert backend.checkpoint_at(mix.run_id, at=version) == mix.seen[version], version
    listed = backend.history(mix.run_id, count=10_000)
    assert [v.version for v in listed] == list(range(1, versions[-1] + 1))
    assert listed[0].op == "init" and listed[0].base


PROPERTY = settings(max_examples=max(2, 8 * settings().max_examples // 100), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
"""8 examples under the ``ci`` profile (``pytest --full``), 2 in the everyday loop."""


@PROPERTY
@given(ops=st.lists(st.sampled_from(OPS), min_size=5, max_size=40), seed=st.integers(0, 2**16))
def test_checkpoint_at_every_version_is_what_get_checkpoint_returned(
    make_frontend_backend: Callable[..., Any], ops: list[str], seed: int,
) -> None:  # fmt: skip
    """Several backends write a random mix of every writing operation; checkpoint_at of each
    version equals the writer's get_checkpoint() right after that write."""
    backends = [make_frontend_backend() for _ in range(2)]
    run_id = uuid.uuid4()
    backends[0].init_run(run_id, "task", "/runs/x")
    backends[1].open_run(run_id)
    mix = Mix(backends, run_id, random.Random(seed))
    mix.record(backends[0])
    for op in ops:
        mix.step(op)
    _check(backends[1], mix)


def _writer_process(url: str, run_id: uuid.UUID, seed: int, ops: int, out: Any) -> None:
    """One process of the fleet below: random writes by its own backend (no listener, so its
    cache changes only with its own writes), each (version, checkpoint) it saw sent back."""
    backend = RedisCheckpointBackend.from_url(url, watch=False)
    try:
        backend.open_run(run_id)
        mix = Mix([backend], run_id, random.Random(seed))
        rng = random.Random(seed + 1)
        for _ in range(ops):
            mix.step(rng.choice(OPS))
        out.put([(v, cp.to_json()) for v, cp in mix.seen.items()])
    finally:
        backend.close()


@pytest.mark.server
def test_checkpoint_at_holds_for_writes_of_several_processes(redis_url: str) -> None:
    """Three processes write a random mix to one run at once; every (version, checkpoint)
    any of them saw right after its write is what checkpoint_at of that version returns."""
    reader = RedisCheckpointBackend.from_url(redis_url, watch=False)
    run_id = uuid.uuid4()
    reader.init_run(run_id, "fleet", "/runs/f")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer_process, args=(redis_url, run_id, seed, 40, out))
             for seed in (11, 22, 33)]  # fmt: skip
    for proc in procs:
        proc.start()
    seen: dict[int, Any] = {}
    for _ in procs:
        for version, state in out.get(timeout=120):
            assert seen.setdefault(version, state) == state  # one state per version
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert len(seen) > 30
    for version, state in seen.items():
        assert reader.checkpoint_at(at=version).to_json() == state, version
    last = reader.history(count=1, reverse=True)[0].version
    assert [v.version for v in reader.history(count=10_000)] == list(range(1, last + 1))
    reader.close()


def test_history_lists_versions_with_their_changes(
    make_frontend_backend: Callable[..., Any],
) -> None:
    b = make_frontend_backend()
    run_id = uuid.uuid4()
    b.init_run(run_id, "task", "/r")
    agent = uuid.uuid4()
    b.append_event(AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="p"))
    b.append_event(AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                             tokens=TokenUsage(input=4), elapsed_ms=1))  # fmt: skip
    b.cancel()
    versions = b.history()
    assert [(v.version, v.op) for v in versions] == [
        (1, "init"), (2, "append"), (3, "append"), (4, "cancel")]
    assert versions[1].changes == (f"started {str(agent)[:8]}",)
    assert f"result {str(agent)[:8]} ok" in versions[2].changes
    assert versions[3].changes == ("status cancelled",)
    events = b.get_event_log()
    assert versions[2].event_id is not None and versions[0].event_id is None
    assert all(abs((v.time - dt.datetime.now(dt.UTC)).total_seconds()) < 60 for v in versions)
    # paging: newest first, and continuing after an id
    newest = b.history(count=2, reverse=True)
    assert [v.version for v in newest] == [4, 3]
    rest = b.history(start="(" + versions[1].id, count=10)
    assert [v.version for v in rest] == [3, 4]
    assert len(events) == 2


def test_checkpoint_at_an_event_id_and_a_time(make_frontend_backend: Callable[..., Any],
                                              redis_client: Client) -> None:  # fmt: skip
    b = make_frontend_backend()
    run_id = uuid.uuid4()
    b.init_run(run_id, "task", "/r")
    agents = [uuid.uuid4() for _ in range(3)]
    states = []
    for agent in agents:
        b.append_event(AgentStarted(run_id=run_id, phase_id=0, agent_id=agent,
                                    prompt_preview="p"))  # fmt: skip
        states.append(b.get_checkpoint())
        b.upsert_agent_session(AgentSessionCheckpoint(agent_id=agent, session_id="s",
                                                      status="a", updated_at=1))  # fmt: skip
        time.sleep(0.003)
    log: Any = redis_client.xrange(run_keys("luft", run_id).events)
    ids = [raw.decode() for raw, _ in log]
    for event_id, state in zip(ids, states, strict=True):
        assert b.checkpoint_at(at=event_id) == state
    history = b.history(count=100)
    for version in history:
        got = b.checkpoint_at(at=version.time + dt.timedelta(microseconds=999))
        assert got.updated_at == b.checkpoint_at(at=version.version).updated_at
    assert b.checkpoint_at(at=history[-1].time.isoformat()) == b.get_checkpoint()
    assert b.checkpoint_at(at=str(history[2].version)) == b.checkpoint_at(at=history[2].version)


def test_an_event_of_the_same_millisecond_as_the_base_before_it(
    make_frontend_backend: Callable[..., Any], redis_client: Client,
) -> None:  # fmt: skip
    """Stream ids of the log and of the history come from one clock but two streams: an
    init's base and the first event can share a millisecond, and the append's entry then
    takes the next id with e. The event still names its version (ids set by hand here)."""
    b = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    keys = run_keys("luft", run_id)
    b.init_run(run_id, "task", "/r")
    b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="first"))
    after = b.get_checkpoint()
    entries: Any = redis_client.xrange(keys.history)
    log: Any = redis_client.xrange(keys.events)
    (base_id, base), (_, append) = entries
    ((_, event),) = log
    redis_client.delete(keys.history, keys.events)
    ms = int(base_id.decode().split("-")[0])
    redis_client.xadd(keys.history, base, id=f"{ms}-0")
    redis_client.xadd(keys.events, event, id=f"{ms}-0")
    redis_client.xadd(keys.history, {**append, b"e": f"{ms}-0"}, id=f"{ms}-1")
    assert b.checkpoint_at(at=f"{ms}-0") == after
    assert b.history()[1].event_id == f"{ms}-0"


def test_points_outside_the_history_are_typed_errors(make_frontend_backend: Callable[..., Any],
                                                      redis_client: Client) -> None:  # fmt: skip
    b = make_frontend_backend()
    run_id = uuid.uuid4()
    b.init_run(run_id, "task", "/r")
    b.cancel()
    with pytest.raises(ValidationError, match="after the run's last version 2"):
        b.checkpoint_at(at=3)
    with pytest.raises(ValidationError, match="no event 1-0 in the run's log"):
        b.checkpoint_at(at="1-0")
    with pytest.raises(ValidationError, match="not a version, an event id"):
        b.checkpoint_at(at="yesterday")
    with pytest.raises(ValidationError, match="between 1 and"):
        b.checkpoint_at(at=0)
    with pytest.raises(HistoryUnavailableError, match="starts at version 1"):
        b.checkpoint_at(at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    with pytest.raises(RunNotFoundError):
        b.checkpoint_at(uuid.uuid4(), at=1)
    with pytest.raises(RunNotFoundError):
        b.history(uuid.uuid4())


def test_a_run_written_before_the_history_has_one_from_its_next_write(
    make_frontend_backend: Callable[..., Any], redis_client: Client,
) -> None:  # fmt: skip
    """A run without a history (written before it, or by an older luft-redis) gets a base at
    its next write: later versions are read back, earlier ones are a typed error naming
    where the history starts."""
    b = make_frontend_backend()
    run_id = uuid.uuid4()
    keys = run_keys("luft", run_id)
    b.init_run(run_id, "task", "/r")
    b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="old"))
    redis_client.delete(keys.history)
    redis_client.hdel(keys.run, "history_version")
    with pytest.raises(HistoryUnavailableError, match="the run has no history") as info:
        b.checkpoint_at(at=2)
    assert info.value.first_version is None
    assert b.history() == []
    b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="new"))
    b.cancel()
    assert b.checkpoint_at(at=4) == b.get_checkpoint()
    assert b.checkpoint_at(at=3).status is CheckpointStatus.RUNNING
    with pytest.raises(HistoryUnavailableError, match="starts at version 3") as info:
        b.checkpoint_at(at=2)
    assert info.value.first_version == 3
    # an older writer in between (a version without an entry): the next write is a base again
    b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
    redis_client.hset(keys.run, "history_version", "1")
    b.reset_status_to_running()
    versions = b.history()
    assert versions[-1].base and versions[-1].op == "reset"
    assert b.checkpoint_at(at=versions[-1].version) == b.get_checkpoint()


@pytest.mark.parametrize("redis_target", ["fakeredis", "redis"])  # (a RENAME-free copy)
def test_the_history_of_an_earlier_run_of_the_same_id_is_not_read(redis_client: Client) -> None:
    """An older luft-redis deleted a run without its history and made it again: the next
    write starts the new run's history with a base, and a version found only in the earlier
    run's entries is a typed error naming that base, never the earlier run's state."""
    b = RedisCheckpointBackend(redis_client, watch=False)
    run_id, other = uuid.uuid4(), uuid.uuid4()
    keys = run_keys("luft", run_id)
    b.init_run(run_id, "first", "/r")
    b.cancel()
    stale: Any = redis_client.xrange(keys.history)
    b.delete_run(run_id)
    b.init_run(other, "second", "/r")  # an older init_run: this run hash, no history
    fields: Any = redis_client.hgetall(run_keys("luft", other).run)
    fields.pop(b"history_version")
    redis_client.hset(keys.run, mapping={**fields, b"run_id": str(run_id).encode(),
                                         b"incarnation": b"0ld"})  # fmt: skip
    for entry_id, entry in stale:  # ... and the first run's history still there
        redis_client.xadd(keys.history, entry, id=entry_id)
    b.open_run(run_id)
    b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="new"))
    assert b.checkpoint_at(at=2) == b.get_checkpoint()
    with pytest.raises(HistoryUnavailableError, match="starts at version 2") as info:
        b.checkpoint_at(at=1)
    assert info.value.first_version == 2
    b.close()


def test_a_corrupt_history_entry_is_reported(make_frontend_backend: Callable[..., Any],
                                              redis_client: Client) -> None:  # fmt: skip
    b = make_frontend_backend()
    run_id = uuid.uuid4()
    keys = run_keys("luft", run_id)
    b.init_run(run_id, "task", "/r")
    b.cancel()
    bad = redis_client.xadd(keys.history, {"v": "3", "op": "cancel", "d": b"9:garbage!!"})
    with pytest.raises(CorruptDataError, match="field 'd': unreadable"):
        b.checkpoint_at(at=3)
    with pytest.raises(CorruptDataError, match="field 'd': unreadable"):
        b.history()
    redis_client.xdel(keys.history, bad)
    bad = redis_client.xadd(keys.history, {"v": "x", "op": "cancel"})
    with pytest.raises(CorruptDataError, match="field 'v': is not a version"):
        b.history()
    redis_client.xdel(keys.history, bad)
    bad = redis_client.xadd(keys.history, {"v": "3", "op": "cancel", "zz": "1"})
    with pytest.raises(CorruptDataError, match="field 'zz': not a field of a history entry"):
        b.checkpoint_at(at=3)
    redis_client.xdel(keys.history, bad)
    cases: list[tuple[str, bytes]] = [("t", b"abc"), ("e", b"zz"), ("d", b"3:1 0Q")]
    for name, value in cases:
        bad = redis_client.xadd(keys.history, {"v": "3", "op": "cancel", name: value})
        with pytest.raises(CorruptDataError, match=f"field '{name}'"):
            b.history()
        redis_client.xdel(keys.history, bad)
    redis_client.xadd(keys.history, {"v": "9", "op": "cancel"})
    with pytest.raises(CorruptDataError, match="version 9 follows"):
        b.checkpoint_at(at=9)


def test_history_restarts_when_the_log_is_trimmed(make_frontend_backend: Callable[..., Any],
                                                  redis_client: Client) -> None:  # fmt: skip
    """With max_events, the history keeps at most about twice as many versions: a trim of the
    log past that writes a base and drops the entries before it."""
    b = make_frontend_backend(max_events=10)
    run_id = uuid.uuid4()
    b.init_run(run_id, "task", "/r")
    seen = {}
    for i in range(400):
        b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg=f"m{i}"))
        seen[b.version] = b.get_checkpoint()
    keys = run_keys("luft", run_id)
    assert redis_client.xlen(keys.history) < 200
    first = b.history(count=1)[0]
    assert first.base and first.op == "append" and first.version > 2
    with pytest.raises(HistoryUnavailableError) as info:
        b.checkpoint_at(at=2)
    assert info.value.first_version == first.version
    for version in range(first.version, b.version + 1):
        assert b.checkpoint_at(at=version) == seen[version]
    assert first.event_id is not None  # the restarting append: its event names it
    assert b.checkpoint_at(at=first.event_id) == seen[first.version]


def _dump(client: Client, run_id: uuid.UUID) -> dict[str, Any]:
    """Every key of the run as DUMP bytes with its TTL."""
    return {key: (client.dump(key), client.pttl(key)) for key in run_keys("luft", run_id)}


def test_a_fork_of_a_cancelled_run_runs_to_the_end_under_leases(
    make_frontend_backend: Callable[..., Any], redis_client: Client,
) -> None:  # fmt: skip
    """Phase 0 went well, phase 1 went wrong and the run was cancelled: a fork at the end of
    phase 0 gets phase 0's state and log, its phase-1 agents ready again in the parent's pool,
    and workers claiming from the pool finish it. The parent is not changed at all."""
    coordinator = make_frontend_backend()
    fleet = [make_frontend_backend() for _ in range(3)]  # leased workers, taking turns
    run_id = uuid.uuid4()
    coordinator.init_run(run_id, "review", "/runs/r")
    coordinator.join_pool("fleet", weight=2)
    phases = [[uuid.uuid4() for _ in range(3)] for _ in range(2)]

    def run_phase(backend: Any, rid: uuid.UUID, phase: int, fail: bool) -> None:
        backend.append_event(PhaseStarted(run_id=rid, phase_id=phase, label=f"p{phase}",
                                          planned=3))  # fmt: skip
        turn = 0
        while (lease := fleet[turn % 3].claim_agent(f"w{turn % 3}", pool="fleet",
                                                   lease_for=30)) is not None:  # fmt: skip
            worker = fleet[turn % 3]
            turn += 1
            status = AgentStatus.ERROR if fail else AgentStatus.OK
            worker.append_event(AgentStarted(run_id=lease.run_id, phase_id=phase,
                                             agent_id=lease.agent_id, prompt_preview="p"),
                                lease=lease)  # fmt: skip
            worker.append_event(AgentDone(run_id=lease.run_id, agent_id=lease.agent_id,
                                          status=status, tokens=TokenUsage(input=10),
                                          elapsed_ms=1, output={"phase": phase}),
                                lease=lease)  # fmt: skip
        assert turn == 3  # each agent of the phase once

    coordinator.submit_agents([AgentTask(a, 0, {"n": i}) for i, a in enumerate(phases[0])])
    run_phase(coordinator, run_id, 0, fail=False)
    coordinator.sync()
    coordinator.append_event(PhaseDone(run_id=run_id, phase_id=0, ok=3, failed=0))
    good = coordinator.version
    good_state = coordinator.get_checkpoint()
    coordinator.submit_agents([AgentTask(a, 1, {"n": i}) for i, a in enumerate(phases[1])],
                              max_attempts=1)  # fmt: skip
    run_phase(coordinator, run_id, 1, fail=True)
    coordinator.cancel()
    for i, worker in enumerate(fleet):  # each worker's claim meets the cancelled run once (a
        assert worker.claim_agent(f"w{i}", pool="fleet") is None  # write: its claim memo)
    parent_before = _dump(redis_client, run_id)

    child = coordinator.fork_run(run_id, at=good, task="review, again")
    assert _dump(redis_client, run_id) == parent_before
    fork = make_frontend_backend()
    cp = fork.open_run(child)
    assert cp is not None
    assert cp._replace(run_id=run_id, task="review", updated_at=0) == \
        good_state._replace(updated_at=0)  # fmt: skip
    assert redis_client.hget(run_keys("luft", child).run, "parent") == f"{run_id} {good}".encode()
    assert [e.to_json() for e in fork.get_event_log()] == \
        [e._replace(run_id=child).to_json() if hasattr(e, "run_id") else e.to_json()
         for e in coordinator.get_event_log()[: len(fork.get_event_log())]]  # fmt: skip
    tasks = fork.agent_tasks()
    assert sorted(task.agent_id for task in tasks) == sorted(phases[1])
    membership = fork.pool_membership()
    assert membership is not None and membership.weight == 2
    run_phase(fork, child, 1, fail=False)
    fork.sync()
    fork.append_event(PhaseDone(run_id=child, phase_id=1, ok=3, failed=0))
    fork.append_event(RunDone(run_id=child, status=RunStatus.COMPLETED,
                              total_tokens=TokenUsage(input=60)))  # fmt: skip
    done = fork.get_checkpoint()
    assert done.status is CheckpointStatus.COMPLETED
    assert all(done.agent_results[a].status == "ok" for phase in phases for a in phase)
    assert _dump(redis_client, run_id) == parent_before
    assert fork.history(count=1)[0].op == "restore"


def test_fork_log_events_and_finished_points(make_frontend_backend: Callable[..., Any],
                                             redis_client: Client) -> None:  # fmt: skip
    """A fork's copied events have no version of its own history (a typed error); a point
    where the run was finished with agent tasks to run again is refused before anything is
    written."""
    b = make_frontend_backend()
    run_id = uuid.uuid4()
    b.init_run(run_id, "task", "/r")
    b.submit_agents([AgentTask(uuid.uuid4(), 0, {"i": i}) for i in range(2)])
    for i in range(3):
        b.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg=f"m{i}"))
    b.cancel()
    with pytest.raises(ValidationError, match="cancelled at 6"):
        b.fork_run(run_id, at=6, new_run_id=uuid.UUID(int=7))
    assert not redis_client.exists(*run_keys("luft", uuid.UUID(int=7)))
    child = b.fork_run(run_id, at=5)
    fork = make_frontend_backend()
    fork.open_run(child)
    fork.append_event(Log(run_id=child, level=LogLevel.INFO, msg="own"))
    copied: Any = redis_client.xrange(run_keys("luft", child).events)
    with pytest.raises(HistoryUnavailableError, match="starts at version 1"):
        fork.checkpoint_at(at=copied[0][0].decode())
    assert fork.checkpoint_at(at=copied[-1][0].decode()) == fork.get_checkpoint()
    assert len(fork.agent_tasks()) == 2


def test_fork_refuses_an_existing_id_and_its_own(make_frontend_backend: Callable[..., Any]) -> None:
    b = make_frontend_backend()
    run_id, other = uuid.uuid4(), uuid.uuid4()
    b.init_run(run_id, "task", "/r")
    b.init_run(other, "task", "/r")
    with pytest.raises(ValidationError, match="new_run_id"):
        b.fork_run(run_id, at=1, new_run_id=run_id)
    with pytest.raises(LuftRedisError, match="exists"):
        b.fork_run(run_id, at=1, new_run_id=other)
    child = b.fork_run(run_id, at=1)
    assert b.checkpoint_at(child, at=1).run_id == child



OLDER = "2e6466f"
"""The last luft-redis before the history (its scripts take eleven keys and write none)."""


@pytest.mark.server
@pytest.mark.full  # a second checkout in a subprocess: pytest --full (CI)
def test_a_rolling_upgrade_an_older_writer_leaves_a_gap_the_next_write_closes(
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """An older luft-redis (a separate process, its own Functions library) writes a version
    without a history entry: the next write by this version is a base, the versions before
    the gap and after it read back, the one in the gap is a typed error naming where the
    history starts again."""
    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{OLDER}^{{commit}}"],
            capture_output=True, check=False).returncode != 0:  # fmt: skip
        pytest.skip(f"needs git and commit {OLDER} (a clone of the repository)")
    archive = subprocess.run(["git", "-C", str(root), "archive", OLDER, "luft_redis", "lua"],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    client = redis.Redis.from_url(redis_url)
    new = RedisCheckpointBackend(client)
    run_id = uuid.uuid4()
    new.init_run(run_id, "upgrade", "/runs/u")
    new.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="new"))
    before_gap = new.get_checkpoint()
    older = f"""
import sys, uuid
sys.path.insert(0, {str(tmp_path)!r})
import redis, luft_redis
assert luft_redis.__file__.startswith({str(tmp_path)!r}), luft_redis.__file__
b = luft_redis.RedisCheckpointBackend(redis.Redis.from_url({redis_url!r}), watch=False)
b.open_run(uuid.UUID({str(run_id)!r}))
b.append_event(luft_redis.Log(run_id=b.run_id, level=luft_redis.LogLevel.INFO, msg="old"))
print(b.version)
"""
    done = subprocess.run([sys.executable, "-c", older], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr
    new.cancel()
    assert new.version == 4
    versions = new.history()
    assert [v.version for v in versions] == [1, 2, 4] and versions[-1].base
    assert new.checkpoint_at(at=4) == new.get_checkpoint()
    assert new.checkpoint_at(at=2) == before_gap
    with pytest.raises(HistoryUnavailableError, match="starts at version 4") as info:
        new.checkpoint_at(at=3)
    assert info.value.first_version == 4
    new.close()
    client.close()
