"""A fleet of processes on one run: concurrent writers, the cancel race, coherent caches.

* (a) ``test_concurrent_writers_converge``: N spawned processes bound to one run append
  agent_started / log / agent_done events (single and batched) and upsert results at once;
  totals, results, started ids (no duplicates) and the log length are exact, and every
  process's cache, once at the final version, equals a fresh ``open_run``.
* (b) ``test_cancel_race_is_sticky``: one process cancels while others send
  run_done(completed), over many rounds: the outcome the canceller saw is the final one, and
  whenever cancel returned before any run_done was sent, the run stays cancelled.
* (c) ``test_cancel_seen_through_cache_alone``: a process sees another's cancel through
  ``get_checkpoint()`` with no command of its own.
* (d) ``test_listener_loss_recovers``: the listener's connection is killed (``CLIENT KILL TYPE
  pubsub`` on a real server); ``cache_is_fresh`` goes False then True, and changes made by the
  other backend meanwhile reach ``get_checkpoint()`` without a write of its own.

Each runs on a private real redis-server (marked ``server``) and on fakeredis served over TCP
(``TcpFakeServer``, which serves several processes). The child processes run this very file
with :func:`runpy.run_path` (as ``_CHILD_RUN_NAME``): pytest imports test files with
``--import-mode=importlib``, which a spawned child could not import by name.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import runpy
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import fakeredis
import pytest
import redis

from luft_redis import (
    AgentDone,
    AgentProgress,
    AgentResultCache,
    AgentStarted,
    AgentStatus,
    CheckpointStatus,
    Finding,
    Log,
    LogLevel,
    ProgressMessage,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
)
from luft_redis._sync.listener import ChangeListener
from luft_redis.tools.server import LOOPBACK, LocalRedisServer, find_free_port

_CHILD_RUN_NAME = "_luft_fleet_child"
NAMESPACE = uuid.UUID("6c7a1d3e-0000-4000-8000-000000000001")
WRITERS = 4
AGENTS_PER_WRITER = 30
SHARED_AGENTS = 5
RACE_ROUNDS = 15
RACE_COMPLETERS = 3
WAIT = 60.0

pytestmark = pytest.mark.timeout(180)


class Target(NamedTuple):
    kind: str  # "redis" or "fakeredis"
    url: str


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.server), pytest.param("fakeredis")])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A server several processes can reach: a flushed real redis-server, or a TcpFakeServer."""
    if request.param == "redis":
        server: LocalRedisServer = request.getfixturevalue("redis_server")
        with redis.Redis.from_url(server.url) as conn:
            conn.flushall()
        yield Target("redis", server.url)
        return
    port = find_free_port()
    fake = fakeredis.TcpFakeServer((LOOPBACK, port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)  # fmt: skip
    thread.start()
    try:
        yield Target("fakeredis", f"redis://{LOOPBACK}:{port}/0")
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(timeout=5)


def _spawn(params: dict[str, Any]) -> Any:
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=runpy.run_path, args=(__file__,),
        kwargs={"init_globals": {"_CHILD_ARGS": params}, "run_name": _CHILD_RUN_NAME},
        daemon=True,
    )  # fmt: skip
    proc.start()
    return proc


def _collect(out: Any, kind: str, count: int, deadline: float) -> dict[int, Any]:
    """``count`` messages of ``kind`` from the children; fail on a child's error report."""
    got: dict[int, Any] = {}
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {kind!r} ({len(got)}/{count})")
        msg_kind, index, payload = out.get(timeout=left)
        if msg_kind == "error":
            raise AssertionError(f"child {index} failed:\n{payload}")
        assert msg_kind == kind, (msg_kind, kind)
        got[index] = payload
    return got


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        proc.join(timeout=10)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _fresh(url: str, run_id: uuid.UUID) -> tuple[Any, int, int]:
    """(checkpoint, version, log length) read by a new backend on a new client."""
    client = redis.Redis.from_url(url)
    try:
        backend = RedisCheckpointBackend(client, watch=False)
        cp = backend.open_run(run_id)
        assert cp is not None
        assert backend.keys is not None
        return cp, backend.version, int(client.xlen(backend.keys.events))
    finally:
        client.close()


def _canon(cp: Any) -> str:
    return json.dumps(cp.to_json(), sort_keys=True)


# ------------------------------------------------------------------------------ (a)


def test_concurrent_writers_converge(target: Target) -> None:
    run_id = uuid.uuid4()
    client = redis.Redis.from_url(target.url)
    procs: list[Any] = []
    try:
        RedisCheckpointBackend(client, watch=False).init_run(run_id, "fleet", "/tmp/fleet")
        ctx = multiprocessing.get_context("spawn")
        out, barrier, final_set = ctx.Queue(), ctx.Barrier(WRITERS), ctx.Event()
        final = ctx.Value("q", 0)
        for index in range(WRITERS):
            procs.append(_spawn(dict(role="writer", url=target.url, run_id=str(run_id),
                                     index=index, out=out, barrier=barrier,
                                     final_set=final_set, final=final)))  # fmt: skip
        deadline = time.monotonic() + WAIT
        _collect(out, "ready", WRITERS, deadline)
        done = _collect(out, "done", WRITERS, deadline)
        cp, version, xlen = _fresh(target.url, run_id)
        final.value = version
        final_set.set()
        states = _collect(out, "state", WRITERS, deadline)

        assert cp.status is CheckpointStatus.RUNNING
        assert cp.total_tokens == sum(d["tokens"] for d in done.values())
        assert xlen == sum(d["events"] for d in done.values())
        own = {uuid.uuid5(NAMESPACE, f"{i}:{k}")
               for i in range(WRITERS) for k in range(AGENTS_PER_WRITER)}  # fmt: skip
        shared = {uuid.uuid5(NAMESPACE, f"shared:{k}") for k in range(SHARED_AGENTS)}
        assert set(cp.agent_results) == own
        assert all(r.status == "ok" for r in cp.agent_results.values())
        assert len(cp.started_agent_ids) == len(set(cp.started_agent_ids))
        assert set(cp.started_agent_ids) == own | shared
        expected_findings = sum(1 for k in range(AGENTS_PER_WRITER) if k % 3 == 0) * WRITERS
        assert len(cp.findings) == expected_findings
        for index, state in states.items():
            assert state["version"] == version, (index, state["version"], version)
            assert state["cp"] == _canon(cp), f"writer {index}'s cache differs from open_run"
    finally:
        _stop(procs)
        client.close()


def _writer(a: dict[str, Any]) -> None:
    run_id, index = uuid.UUID(a["run_id"]), a["index"]
    client = redis.Redis.from_url(a["url"])
    backend = RedisCheckpointBackend(client)
    assert backend.open_run(run_id) is not None
    a["out"].put(("ready", index, None))
    a["barrier"].wait(WAIT)
    events = tokens_sum = 0
    for k in range(AGENTS_PER_WRITER):
        agent = uuid.uuid5(NAMESPACE, f"{index}:{k}")
        shared = uuid.uuid5(NAMESPACE, f"shared:{k % SHARED_AGENTS}")
        backend.append_event(AgentStarted(run_id=run_id, phase_id=index % 3, agent_id=agent,
                                          prompt_preview=f"agent {index}:{k}"))  # fmt: skip
        backend.append_event(AgentStarted(run_id=run_id, phase_id=0, agent_id=shared,
                                          prompt_preview="shared"))  # fmt: skip
        backend.append_event(Log(run_id=run_id, agent_id=agent, level=LogLevel.INFO,
                                 msg=f"{index}:{k}"))  # fmt: skip
        events += 3
        findings = (
            (Finding(kind="bug", severity=Severity.HIGH, title=f"{index}:{k}", detail="d"),)
            if k % 3 == 0 else ()
        )  # fmt: skip
        backend.upsert_agent_result(AgentResultCache(
            agent_id=agent, phase_id=index % 3, status="ok", output={"i": index, "k": k},
            findings=findings, tokens=0, completed_at=1,
        ))  # fmt: skip
        tokens = TokenUsage(input=index * 1000 + k, output=7)
        tokens_sum += tokens.total()
        done = AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK, tokens=tokens,
                         elapsed_ms=k)  # fmt: skip
        if k % 2:
            progress = AgentProgress(run_id=run_id, agent_id=agent,
                                     delta=ProgressMessage(text="almost"))  # fmt: skip
            backend.append_events([progress, done])
            events += 2
        else:
            backend.append_event(done)
            events += 1
    a["out"].put(("done", index, {"events": events, "tokens": tokens_sum}))
    assert a["final_set"].wait(WAIT)
    final = a["final"].value
    deadline = time.monotonic() + 20
    while backend.version < final and time.monotonic() < deadline:
        backend.wait_for_change(after_version=backend.version, timeout=0.5)
    cp = backend.get_checkpoint()
    assert cp is not None
    a["out"].put(("state", index, {"version": backend.version, "cp": _canon(cp)}))
    backend.close()
    client.close()


# ------------------------------------------------------------------------------ (b)


def test_cancel_race_is_sticky(target: Target) -> None:
    client = redis.Redis.from_url(target.url)
    run_ids = [uuid.uuid4() for _ in range(RACE_ROUNDS)]
    procs: list[Any] = []
    try:
        creator = RedisCheckpointBackend(client, watch=False)
        for run_id in run_ids:
            creator.init_run(run_id, "race", "/tmp/race")
        ctx = multiprocessing.get_context("spawn")
        parties = 1 + RACE_COMPLETERS
        out, barrier = ctx.Queue(), ctx.Barrier(parties)
        for index in range(parties):
            procs.append(_spawn(dict(role="racer", url=target.url, index=index,
                                     run_ids=[str(r) for r in run_ids], out=out,
                                     barrier=barrier)))  # fmt: skip
        reports = _collect(out, "rounds", parties, time.monotonic() + 2 * WAIT)
        outcomes = {CheckpointStatus.CANCELLED: 0, CheckpointStatus.COMPLETED: 0}
        cancel_first = 0
        for r, run_id in enumerate(run_ids):
            final, _, _ = _fresh(target.url, run_id)
            cancel_returned, seen_after_cancel = reports[0][r]
            first_run_done = min(reports[i][r] for i in range(1, parties))
            assert final.status.value == seen_after_cancel, (r, final.status)
            outcomes[final.status] += 1
            if cancel_returned < first_run_done:
                cancel_first += 1
                assert final.status is CheckpointStatus.CANCELLED, f"round {r}: cancel lost"
        assert sum(outcomes.values()) == RACE_ROUNDS
        print(f"cancel race: {outcomes}, cancel returned first in {cancel_first} rounds")
    finally:
        _stop(procs)
        client.close()


def _racer(a: dict[str, Any]) -> None:
    index = a["index"]
    client = redis.Redis.from_url(a["url"])
    backend = RedisCheckpointBackend(client)
    rng = random.Random(index)
    rounds: list[Any] = []
    for text in a["run_ids"]:
        run_id = uuid.UUID(text)
        assert backend.open_run(run_id) is not None
        a["barrier"].wait(WAIT)
        time.sleep(rng.uniform(0, 0.002) if index == 0 else rng.uniform(0, 0.008))
        if index == 0:
            backend.cancel()
            returned = time.monotonic_ns()  # CLOCK_MONOTONIC: shared by the processes
            cp = backend.get_checkpoint()
            assert cp is not None
            rounds.append((returned, cp.status.value))
        else:
            rounds.append(time.monotonic_ns())
            backend.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                                         total_tokens=TokenUsage()))  # fmt: skip
        a["barrier"].wait(WAIT)
    a["out"].put(("rounds", index, rounds))
    backend.close()
    client.close()


# ------------------------------------------------------------------------------ (c)


def test_cancel_seen_through_cache_alone(target: Target) -> None:
    run_id = uuid.uuid4()
    client = redis.Redis.from_url(target.url)
    backend = RedisCheckpointBackend(client)
    procs: list[Any] = []
    try:
        backend.init_run(run_id, "watch", "/tmp/watch")
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs.append(_spawn(dict(role="watcher", url=target.url, run_id=str(run_id), out=out)))
        deadline = time.monotonic() + WAIT
        _collect(out, "ready", 1, deadline)
        backend.cancel()
        seen = _collect(out, "seen", 1, deadline)[0]
        assert seen["status"] == "cancelled"
        assert seen["commands"] == [], "the watcher sent commands: not from its cache alone"
        assert seen["seconds"] < 5
    finally:
        _stop(procs)
        backend.close()  # its listener: left open, it would stay subscribed for the session
        client.close()


def _watcher(a: dict[str, Any]) -> None:
    client = redis.Redis.from_url(a["url"])
    backend = RedisCheckpointBackend(client)
    assert backend.open_run(uuid.UUID(a["run_id"])) is not None
    deadline = time.monotonic() + 10
    while not backend.cache_is_fresh and time.monotonic() < deadline:
        time.sleep(0.01)
    commands: list[Any] = []
    original: Any = client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:  # every command of the client's pool
        commands.append(args[0] if args else "?")
        return original(*args, **kwargs)

    client.execute_command = counting  # type: ignore[method-assign]
    a["out"].put(("ready", 0, None))
    started = time.monotonic()
    status = None
    while time.monotonic() - started < 10:
        cp = backend.get_checkpoint()
        assert cp is not None
        status = cp.status.value
        if status == "cancelled":
            break
        time.sleep(0.002)
    a["out"].put(("seen", 0, {"status": status, "seconds": time.monotonic() - started,
                              "commands": [str(c) for c in commands]}))  # fmt: skip
    backend.close()
    client.close()


# ------------------------------------------------------------------------------ (d)


def _until(predicate: Any, timeout: float, step: float = 0.001) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def test_listener_loss_recovers(target: Target) -> None:
    run_id = uuid.uuid4()
    c1, c2 = redis.Redis.from_url(target.url), redis.Redis.from_url(target.url)
    admin = redis.Redis.from_url(target.url)
    try:
        b1, b2 = RedisCheckpointBackend(c1), RedisCheckpointBackend(c2)
        b1.init_run(run_id, "listener loss", "/tmp/loss")
        assert b2.open_run(run_id) is not None
        assert _until(lambda: b1.cache_is_fresh and b2.cache_is_fresh, 10, 0.01)

        if target.kind == "redis":
            admin_any: Any = admin
            killed = admin_any.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            assert int(killed) >= 1
        else:  # fakeredis has no CLIENT KILL: drop the listener's connection from inside
            ChangeListener.for_client(c1).drop_connections_for_tests()
        assert _until(lambda: not b1.cache_is_fresh, 5), "cache_is_fresh never went False"

        def done(tokens: int) -> AgentDone:
            return AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                             tokens=TokenUsage(input=tokens), elapsed_ms=1)  # fmt: skip

        b2.append_event(done(5))  # during the outage (b1's listener is reconnecting)
        assert _until(lambda: b1.cache_is_fresh, 10, 0.005), "cache_is_fresh never came back"

        def tokens() -> int:
            cp = b1.get_checkpoint()  # the cache: no I/O
            return -1 if cp is None else cp.total_tokens

        assert _until(lambda: tokens() == 5, 5, 0.005), (
            "b1's cache missed the change made during the outage"
        )
        b2.append_event(done(7))  # after the outage
        assert _until(lambda: tokens() == 12, 5, 0.005)
        fresh, version, _ = _fresh(target.url, run_id)
        assert b1.version == version
        assert _canon(b1.get_checkpoint()) == _canon(fresh)
        b1.close()
        b2.close()
    finally:
        for c in (c1, c2, admin):
            c.close()


# ------------------------------------------------------------------------------ the children


def _child_main(a: dict[str, Any]) -> None:
    role = a["role"]
    try:
        {"writer": _writer, "racer": _racer, "watcher": _watcher}[role](a)
    except BaseException:
        a["out"].put(("error", a.get("index", 0), traceback.format_exc()))
        raise


if __name__ == _CHILD_RUN_NAME:
    _child_main(globals()["_CHILD_ARGS"])
