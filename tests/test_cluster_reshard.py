"""A live reshard of Redis Cluster onto a new, empty primary (issue 18).

What ``redis-cli --cluster add-node`` + ``--cluster reshard`` do, step by step, on a private
3-primary cluster: a fourth primary, empty, joins (``CLUSTER MEET``); the run's slot goes
``IMPORTING`` on it and ``MIGRATING`` on its owner; ``GETKEYSINSLOT`` + ``MIGRATE`` move the
slot's keys a few at a time; the slot stays ``MIGRATING`` a moment with every key moved (what
a slot with many keys, or many slots, takes); then ``SETSLOT NODE`` on every primary.

Meanwhile two writers append one-token events to a run of that slot, one on the sync front end
(a thread) and one on the asyncio front end (its own event loop in a thread), each on its own
``RedisCluster`` client, and a third backend watches the run (``watch=True``). A second run of
the same slot, lacking most of its keys, gets writes too.

The new primary owns no slot until the end, so redis-py's node table (from ``CLUSTER SLOTS``)
does not list it: every call the old owner answers with ``ASK <new node>`` used to fail inside
redis-py with a bare ``AttributeError``. And while the run's change channel was declared as a
key (a key that never exists), every call of the run got ``TRYAGAIN`` for the whole migration.

Checked: no error that is not a ``LuftRedisError`` (and none at all: a reshard costs a pause,
not an error); the lost redirect was met and followed, on both front ends; every acknowledged
append applied exactly once (tokens and events in the final state equal the
acknowledgements); the watcher ends fresh and equal to a fresh load, subscribed on the new
owner; the longest write during the reshard stays under the default retry deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from luft_redis import (
    AgentDone,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    AgentTask,
    AsyncRedisCheckpointBackend,
    Finding,
    PhaseStarted,
    RedisCheckpointBackend,
    Severity,
    TokenUsage,
)
from luft_redis import cluster as luft_cluster
from luft_redis._sync import fcall as luft_fcall
from luft_redis.asyncio import fcall as luft_async_fcall
from luft_redis.errors import LuftRedisError
from luft_redis.keys import limiter_key, pool_keys, run_keys
from luft_redis.retry import DEFAULT_RETRY, RetryPolicy
from luft_redis.tools.server import (
    LocalRedisCluster,
    LocalRedisServer,
    find_free_port,
    find_redis_cli,
)

# a private 4-node cluster and a live reshard, ~15 s each: pytest --full (CI) only; everyday,
# test_cluster_redirects.py checks the recognition of a lost redirect and its retry
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.full, pytest.mark.timeout(180)]

WRITER_RETRY = RetryPolicy(max_attempts=100, deadline=20.0)
"""Generous, so that a slow machine does not turn a long pause into a failed write; the
pause itself is measured and bounded below (``PAUSE_BOUND``)."""

PAUSE_BOUND = DEFAULT_RETRY.deadline
"""The longest one write may take during the reshard: within the default retry deadline."""

BATCH = 3
"""Keys moved per MIGRATE (``redis-cli --cluster reshard --cluster-pipeline``, small here so the
run's keys are split between the nodes for a while)."""

BATCH_PAUSE = 0.05
"""Seconds between two MIGRATE batches."""

HOLD_MOVED = 0.5
"""Seconds the slot stays MIGRATING once every key has moved: every call of the run meets
``ASK`` to the new primary meanwhile."""

WRITE_PAUSE = 0.002
"""Seconds a writer sleeps between two appends."""

CONVERGE_BOUND = 15.0


# ------------------------------------------------------------------------------ the cluster


def _redis_at(node: LocalRedisServer) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port, socket_timeout=5)


def _myself(node: LocalRedisServer) -> tuple[str, int]:
    """``(node id, cluster bus port)`` of ``node``, from its CLUSTER NODES line."""
    with _redis_at(node) as conn:
        text = conn.execute_command("CLUSTER", "NODES").decode()
    for line in text.splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            bus = fields[1].split("@", 1)[1].split(",", 1)[0]
            return fields[0], int(bus)
    raise AssertionError(f"no myself line in CLUSTER NODES of {node.port}")


def _wait_for(predicate: Callable[[], bool], bound: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > bound:
            raise AssertionError(f"timed out after {bound:.0f}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def _cluster_info(node: LocalRedisServer) -> dict[str, str]:
    with _redis_at(node) as conn:
        text = conn.execute_command("CLUSTER", "INFO").decode()
    return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)


def _start_empty_primary(cluster: LocalRedisCluster, binary: str) -> LocalRedisServer:
    """A new cluster-enabled node, joined to ``cluster`` with CLUSTER MEET, owning no slot
    (``redis-cli --cluster add-node``). Stopped by the caller."""
    for _ in range(3):
        port, bus = find_free_port(), find_free_port()
        if port == bus:
            continue
        node = LocalRedisServer(
            port=port, dir=Path(cluster.dir) / "joined", binary=binary,
            extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", "5000", "--cluster-port", str(bus)],
        )  # fmt: skip
        try:
            node.start()
            break
        except RuntimeError:
            node.stop()
    else:
        raise AssertionError("the new node did not start")
    seed = cluster.primaries()[0]
    _, seed_bus = _myself(seed)
    with _redis_at(node) as conn:
        conn.execute_command("CLUSTER", "MEET", seed.host, seed.port, seed_bus)
    everyone = [*cluster.nodes, node]

    def joined() -> bool:
        infos = [_cluster_info(n) for n in everyone]
        return all(i.get("cluster_known_nodes") == str(len(everyone))
                   and i.get("cluster_state") == "ok" for i in infos)  # fmt: skip

    _wait_for(joined, 30, "the new node to join")
    return node


@pytest.fixture
def grown_cluster(redis_server_binary: str) -> Iterator[tuple[LocalRedisCluster, LocalRedisServer]]:
    """A private cluster of 3 primaries and a 4th, empty primary joined to it."""
    if find_redis_cli(redis_server_binary) is None:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail("redis-cli not found; CI is set, so this is an error, not a skip")
        pytest.skip("redis-cli not found")
    cluster = LocalRedisCluster(3, binary=redis_server_binary)
    cluster.start()
    try:
        new = _start_empty_primary(cluster, redis_server_binary)
        try:
            yield cluster, new
        finally:
            new.stop()
    finally:
        cluster.stop()


def _reshard(slot: int, source: LocalRedisServer, target: LocalRedisServer,
             primaries: list[LocalRedisServer], log: list[str]) -> None:  # fmt: skip
    """Move ``slot`` from ``source`` to ``target`` as ``redis-cli --cluster reshard`` does."""
    source_id, _ = _myself(source)
    target_id, _ = _myself(target)
    with _redis_at(source) as src, _redis_at(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        log.append(f"{time.monotonic():.3f} MIGRATING")
        for _ in range(1000):
            keys: Any = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, BATCH)
            if not keys:
                break
            src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
            time.sleep(BATCH_PAUSE)
        else:
            raise AssertionError(f"slot {slot} still has keys on the source")
        log.append(f"{time.monotonic():.3f} all keys moved")
        time.sleep(HOLD_MOVED)
    for node in [target, source, *(n for n in primaries if n not in (target, source))]:
        with _redis_at(node) as conn:
            conn.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    log.append(f"{time.monotonic():.3f} SETSLOT NODE")


def _close_all(backends: list[RedisCheckpointBackend], clients: list[RedisCluster]) -> None:
    """Close what a test made, backends first, whatever each raises."""
    for made in backends:
        with contextlib.suppress(Exception):
            made.close()
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()


# ------------------------------------------------------------------------------ writers


class Tally:
    """What one writer saw: acknowledged appends per run, errors, the slowest append."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.acked: dict[uuid.UUID, int] = {}
        self.typed: list[str] = []  # LuftRedisError: retries exhausted
        self.untyped: list[str] = []  # anything else: the bug of issue 18
        self.slowest = 0.0
        self.slowest_by_run: dict[uuid.UUID, float] = {}
        self.writes = 0

    def record(self, run_id: uuid.UUID, started: float, exc: BaseException | None) -> None:
        took = time.monotonic() - started
        if exc is None:
            self.acked[run_id] = self.acked.get(run_id, 0) + 1
            self.slowest = max(self.slowest, took)
            self.slowest_by_run[run_id] = max(self.slowest_by_run.get(run_id, 0.0), took)
            self.writes += 1
        elif isinstance(exc, LuftRedisError):
            self.typed.append(f"{self.name} after {took:.2f}s: {exc!r}")
        else:
            where = traceback.extract_tb(exc.__traceback__)[-3:]
            self.untyped.append(f"{self.name} after {took:.2f}s: {type(exc).__name__}: {exc} "
                                f"at {traceback.format_list(where)}")  # fmt: skip


def _done(run_id: uuid.UUID, agent_id: uuid.UUID) -> AgentDone:
    return AgentDone(run_id=run_id, agent_id=agent_id, status=AgentStatus.OK,
                     tokens=TokenUsage(input=1), elapsed_ms=1)  # fmt: skip


def _sync_writer(backends: dict[uuid.UUID, RedisCheckpointBackend], runs: list[uuid.UUID],
                 tally: Tally, halt: threading.Event) -> None:  # fmt: skip
    agent = uuid.uuid4()
    i = 0
    while not halt.is_set():
        run_id = runs[i % len(runs)]
        i += 1
        started = time.monotonic()
        try:
            backends[run_id].append_event(_done(run_id, agent))
            tally.record(run_id, started, None)
        except BaseException as exc:  # recorded: the test fails on it
            tally.record(run_id, started, exc)
        time.sleep(WRITE_PAUSE)


def _async_writer(make_client: Callable[[], Any], runs: list[uuid.UUID], tally: Tally,
                  halt: threading.Event, ready: threading.Event) -> None:  # fmt: skip
    async def main() -> None:
        client = make_client()
        backends: dict[uuid.UUID, AsyncRedisCheckpointBackend] = {}
        agent = uuid.uuid4()
        try:
            for run_id in dict.fromkeys(runs):
                backends[run_id] = AsyncRedisCheckpointBackend(client, watch=False,
                                                               retry=WRITER_RETRY)  # fmt: skip
                assert await backends[run_id].open_run(run_id) is not None
            ready.set()
            i = 0
            while not halt.is_set():
                run_id = runs[i % len(runs)]
                i += 1
                started = time.monotonic()
                try:
                    await backends[run_id].append_event(_done(run_id, agent))
                    tally.record(run_id, started, None)
                except BaseException as exc:  # recorded: the test fails on it
                    tally.record(run_id, started, exc)
                await asyncio.sleep(WRITE_PAUSE)
        finally:
            for backend in backends.values():
                await backend.aclose()
            await client.aclose()

    asyncio.run(main())


def _same_slot_run(slot: int) -> uuid.UUID:
    """A run id whose hash tag lands in ``slot`` (16384 draws on average)."""
    for _ in range(1_000_000):
        run_id = uuid.uuid4()
        if key_slot(f"{{{run_id}}}".encode()) == slot:
            return run_id
    raise AssertionError("no run id found for the slot")


def _fresh(cluster: LocalRedisCluster, run_id: uuid.UUID) -> Any:
    client = cluster.client()
    try:
        backend = RedisCheckpointBackend(client, watch=False, retry=WRITER_RETRY)
        try:
            return backend.open_run(run_id)
        finally:
            backend.close()
    finally:
        client.close()


# ------------------------------------------------------------------------------ the test


def test_live_reshard_onto_a_new_primary_costs_a_pause_not_an_error(
    grown_cluster: tuple[LocalRedisCluster, LocalRedisServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster, new = grown_cluster
    lost: list[str] = []
    recognise = luft_cluster.is_lost_redirect

    def counted(exc: BaseException) -> bool:
        found = recognise(exc)
        if found:
            lost.append(type(exc).__name__ + ": " + str(exc))
        return found

    # where the hooks look it up: the FCALL helper of each front end
    monkeypatch.setattr(luft_fcall, "is_lost_redirect", counted)
    monkeypatch.setattr(luft_async_fcall, "is_lost_redirect", counted)

    clients: list[RedisCluster] = []
    backends: list[RedisCheckpointBackend] = []

    def backend(**kwargs: Any) -> RedisCheckpointBackend:
        client = cluster.client()
        clients.append(client)
        made = RedisCheckpointBackend(client, **kwargs)
        backends.append(made)
        return made

    try:
        setup = backend(watch=False, retry=WRITER_RETRY)
        full = uuid.uuid4()
        slot = key_slot(f"{{{full}}}".encode())
        sparse = _same_slot_run(slot)
        # the full run: every one of its 12 keys exists (a script whose keys are all on one side
        # of a migrating slot runs there, or is redirected with ASK; a split is TRYAGAIN)
        setup.init_run(full, "reshard", "/tmp/reshard")
        helper = uuid.uuid4()
        finding = Finding(kind="bug", severity=Severity.LOW, title="t", detail="d")
        setup.append_events([
            PhaseStarted(run_id=full, phase_id=0, label="p", planned=1),
            AgentStarted(run_id=full, phase_id=0, agent_id=helper, prompt_preview="p"),
            AgentDone(run_id=full, agent_id=helper, status=AgentStatus.OK,
                      tokens=TokenUsage(input=1), elapsed_ms=1, findings=(finding,)),
        ])  # fmt: skip
        setup.upsert_agent_session(AgentSessionCheckpoint(
            agent_id=helper, session_id="s", status="running", updated_at=1))  # fmt: skip
        setup.submit_agents([AgentTask(uuid.uuid4(), 0, {"n": 1})])  # the tasks and queue keys
        keys = run_keys("luft", full)
        assert clients[0].exists(*keys) == len(keys) == 12
        base_tokens, base_events = 1, 3
        # the sparse run: only its run hash, writers and history (TRYAGAIN while its slot moves)
        setup.init_run(sparse, "sparse", "/tmp/sparse")
        source = cluster.primary_for_slot(slot)

        watcher = backend(watch=True, max_staleness=0.5)
        assert watcher.open_run(full) is not None
        _wait_for(lambda: watcher.cache_is_fresh, 10, "the watcher to be fresh")

        runs = [full, full, full, sparse]  # mostly the full run
        halt = threading.Event()
        sync_tally, async_tally = Tally("sync"), Tally("asyncio")
        writer_client = cluster.client()
        clients.append(writer_client)
        writers: dict[uuid.UUID, RedisCheckpointBackend] = {}
        for run_id in (full, sparse):  # two backends on one client, one per run
            writers[run_id] = RedisCheckpointBackend(writer_client, watch=False,
                                                     retry=WRITER_RETRY)  # fmt: skip
            backends.append(writers[run_id])
            assert writers[run_id].open_run(run_id) is not None
        seed = cluster.primaries()[0]
        ready = threading.Event()
        threads = [
            threading.Thread(target=_sync_writer, args=(writers, runs, sync_tally, halt),
                             name="reshard-sync-writer", daemon=True),
            threading.Thread(
                target=_async_writer,
                args=(lambda: redis.asyncio.cluster.RedisCluster(host=seed.host, port=seed.port),
                      runs, async_tally, halt, ready),
                name="reshard-async-writer", daemon=True),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        assert ready.wait(10)
        _wait_for(lambda: sync_tally.writes >= 50 and async_tally.writes >= 50, 30,
                  "the writers to warm up")  # fmt: skip
        for tally in (sync_tally, async_tally):  # the pause is measured from here
            tally.slowest = 0.0
            tally.slowest_by_run.clear()

        log: list[str] = []
        started = time.monotonic()
        _reshard(slot, source, new, [*cluster.primaries(), new], log)
        _wait_for(lambda: all(_owner_is(n, slot, new) for n in [*cluster.nodes, new]), 30,
                  "every node to agree on the slot's new owner")  # fmt: skip
        took = time.monotonic() - started
        goal = (sync_tally.writes + 50, async_tally.writes + 50)
        _wait_for(lambda: sync_tally.writes >= goal[0] and async_tally.writes >= goal[1], 30,
                  "writes after the reshard")  # fmt: skip
        halt.set()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), thread.name

        print(f"reshard took {took:.2f}s ({'; '.join(log)}); writes: sync {sync_tally.writes} "
              f"(slowest {sync_tally.slowest:.2f}s), asyncio {async_tally.writes} (slowest "
              f"{async_tally.slowest:.2f}s); lost redirects followed: {len(lost)}; slowest "
              f"write of the full run {_slowest(full, sync_tally, async_tally):.2f}s, of the "
              f"sparse run {_slowest(sparse, sync_tally, async_tally):.2f}s")  # fmt: skip

        # 1. every error is a LuftRedisError, and a normal reshard gives none
        untyped = sync_tally.untyped + async_tally.untyped
        assert untyped == [], f"{len(untyped)} untyped errors: {untyped[:3]}"
        typed = sync_tally.typed + async_tally.typed
        assert typed == [], f"{len(typed)} writes failed: {typed[:3]}"
        # 2. the new primary was reached through ASK before it owned the slot, by redirects
        #    redis-py could not follow alone (so this test exercises the fix)
        assert lost, "no call was redirected to the new primary while the slot moved"
        # 3. a bounded pause
        assert max(sync_tally.slowest, async_tally.slowest) < PAUSE_BOUND
        # 4. exactly once: tokens and events equal the acknowledgements
        for run_id, tokens0, events0 in ((full, base_tokens, base_events), (sparse, 0, 0)):
            acked = sync_tally.acked.get(run_id, 0) + async_tally.acked.get(run_id, 0)
            state = _fresh(cluster, run_id)
            assert state is not None
            assert state.total_tokens == tokens0 + acked, run_id
            assert clients[0].xlen(run_keys("luft", run_id).events) == events0 + acked
        assert sync_tally.acked.get(sparse, 0) > 0 and async_tally.acked.get(sparse, 0) > 0
        # 5. the watcher follows the slot: fresh, equal to a fresh load, subscribed on the new
        #    owner only
        expected = _fresh(cluster, full)
        _wait_for(lambda: watcher.cache_is_fresh and watcher.get_checkpoint() == expected,
                  CONVERGE_BOUND, "the watcher to converge to a fresh load")  # fmt: skip
        channel = keys.changes.encode()
        assert _shard_subscribers(new, channel) == 1
        assert _shard_subscribers(source, channel) == 0
    finally:
        _close_all(backends, clients)


def _slowest(run_id: uuid.UUID, *tallies: Tally) -> float:
    return max(tally.slowest_by_run.get(run_id, 0.0) for tally in tallies)


def _owner_is(node: LocalRedisServer, slot: int, owner: LocalRedisServer) -> bool:
    """``node`` says ``owner`` serves ``slot``."""
    with _redis_at(node) as conn:
        reply: Any = conn.execute_command("CLUSTER", "SLOTS")
    for first, last, primary, *_ in reply:
        if first <= slot <= last:
            return int(primary[1]) == owner.port
    return False


def _shard_subscribers(node: LocalRedisServer, channel: bytes) -> int:
    with _redis_at(node) as conn:
        reply: Any = conn.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1]) if len(reply) >= 2 else 0


@contextlib.contextmanager
def _held_migrating(slot: int, source: LocalRedisServer,
                    target: LocalRedisServer) -> Iterator[None]:  # fmt: skip
    """``slot`` IMPORTING on ``target`` and MIGRATING on ``source``, no key moved; STABLE again
    on exit."""
    source_id, _ = _myself(source)
    target_id, _ = _myself(target)
    with _redis_at(source) as src, _redis_at(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        try:
            yield
        finally:
            src.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def test_a_slot_held_migrating_past_the_deadline_is_a_typed_error_and_writes_nothing(
    grown_cluster: tuple[LocalRedisCluster, LocalRedisServer],
) -> None:
    """A run lacking some of its keys gets TRYAGAIN while its slot is MIGRATING (its keys are
    not all on one side); when the slot stays so past the retry policy's deadline, the write
    fails with a LuftRedisError, on both front ends, having written nothing; once the slot
    settles, writes go through."""
    cluster, new = grown_cluster
    short = RetryPolicy(max_attempts=1000, deadline=1.0)
    typed = r"its slot is being migrated\) until the retry policy gave up"
    client = cluster.client()
    writer = RedisCheckpointBackend(client, watch=False, retry=short)
    run_id = uuid.uuid4()
    try:
        writer.init_run(run_id, "held", "/tmp/held")  # run hash and writers only
        slot = key_slot(f"{{{run_id}}}".encode())
        source = cluster.primary_for_slot(slot)
        with _held_migrating(slot, source, new):
            started = time.monotonic()
            with pytest.raises(LuftRedisError, match=typed) as caught:
                writer.append_event(_done(run_id, uuid.uuid4()))
            took = time.monotonic() - started
        print(f"sync write, slot held MIGRATING: {caught.value!r} after {took:.2f}s")
        assert short.deadline <= took < short.deadline + 3.0

        async def async_write() -> None:
            aclient = redis.asyncio.cluster.RedisCluster(host=source.host, port=source.port)
            backend = AsyncRedisCheckpointBackend(aclient, watch=False, retry=short)
            try:
                assert await backend.open_run(run_id) is not None
                with _held_migrating(slot, source, new), pytest.raises(LuftRedisError,
                                                                       match=typed):
                    await backend.append_event(_done(run_id, uuid.uuid4()))
            finally:
                await backend.aclose()
                await aclient.aclose()

        asyncio.run(async_write())
        state = writer.open_run(run_id)
        assert state is not None and state.total_tokens == 0
        assert client.xlen(run_keys("luft", run_id).events) == 0
        writer.append_event(_done(run_id, uuid.uuid4()))
        after = writer.get_checkpoint()
        assert after is not None and after.total_tokens == 1
    finally:
        writer.close()
        client.close()


def test_claims_from_a_pool_go_on_through_a_reshard_of_the_pool_and_limiter_slots(
    grown_cluster: tuple[LocalRedisCluster, LocalRedisServer],
) -> None:
    """Workers claim from a pool (under its max_leases, its tasks under a rate limiter) while
    the pool's slot, then the limiter's, move to the new primary: no error, and every agent
    done exactly once."""
    cluster, new = grown_cluster
    clients: list[RedisCluster] = []
    backends: list[RedisCheckpointBackend] = []

    def backend() -> RedisCheckpointBackend:
        client = cluster.client()
        clients.append(client)
        made = RedisCheckpointBackend(client, watch=False, retry=WRITER_RETRY)
        backends.append(made)
        return made

    try:
        setup = backend()
        setup.set_rate_limit("rs-model", requests_per_minute=100_000)
        setup.configure_pool("rs", max_leases=3)
        agents: set[tuple[uuid.UUID, uuid.UUID]] = set()
        for _ in range(4):
            run_id = uuid.uuid4()
            setup.init_run(run_id, "pooled", "/tmp/rs", pool="rs")
            tasks = [AgentTask(uuid.uuid4(), 0, None) for _ in range(40)]
            setup.submit_agents(tasks, limiter="rs-model", expected_tokens=1)
            agents |= {(run_id, task.agent_id) for task in tasks}
        done: list[tuple[uuid.UUID, uuid.UUID]] = []
        tally = Tally("pool")
        halt = threading.Event()

        def work(worker: RedisCheckpointBackend, name: str) -> None:
            while not halt.is_set() and len(done) < len(agents):
                started = time.monotonic()
                try:
                    lease = worker.claim_agent(name, pool="rs", lease_for=30, timeout=0.5)
                    if lease is None:
                        continue
                    time.sleep(WRITE_PAUSE)
                    worker.append_event(AgentDone(run_id=lease.run_id, agent_id=lease.agent_id,
                                                  status=AgentStatus.OK, tokens=TokenUsage(input=1),
                                                  elapsed_ms=1), lease=lease)  # fmt: skip
                    done.append((lease.run_id, lease.agent_id))
                    tally.record(lease.run_id, started, None)
                except Exception as exc:
                    tally.record(uuid.UUID(int=0), started, exc)

        threads = [threading.Thread(target=work, args=(backend(), f"w{i}"), daemon=True)
                   for i in range(3)]  # fmt: skip
        for thread in threads:
            thread.start()
        _wait_for(lambda: len(done) >= 20, 30, "the workers to warm up")
        log: list[str] = []
        for tag in ("{pool:rs}", "{limit:rs-model}"):
            slot = key_slot(tag.encode())
            source = cluster.primary_for_slot(slot)
            _reshard(slot, source, new, [*cluster.primaries(), new], log)
            _wait_for(lambda slot=slot: all(_owner_is(n, slot, new)  # type: ignore[misc]
                                            for n in [*cluster.nodes, new]), 30,
                      f"every node to agree on the new owner of {tag}")  # fmt: skip
        _wait_for(lambda: len(done) >= len(agents), 60, "every agent to be done")
        halt.set()
        for thread in threads:
            thread.join(30)
        print(f"pool reshard: {'; '.join(log)}; slowest claim+done {tally.slowest:.2f}s")
        assert tally.untyped == [], tally.untyped[:3]
        assert tally.typed == [], tally.typed[:3]
        assert sorted(done) == sorted(agents)  # each agent once
        limiter = clients[0].hgetall(limiter_key("luft", "rs-model"))
        assert int(limiter[b"admitted"]) == len(agents)
        assert clients[0].zcard(pool_keys("luft", "rs").leases) == 0  # every lease ended
    finally:
        _close_all(backends, clients)
