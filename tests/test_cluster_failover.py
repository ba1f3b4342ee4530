"""Cache coherence through Redis Cluster faults (``../shared/design/coherence.md``, invariant 5).

Each test binds two backends, each on its own ``RedisCluster`` client, to one run:

* a *writer* (``watch=False``, a retry policy generous enough to ride the fault) that appends
  events in a thread before, during and after the fault, each adding one token, and records
  ``(ack_time, total_tokens)`` when an append returns;
* a read-only *watcher* (``watch=True``, ``max_staleness=0.5``).

The main thread checks, every ~5 ms for the whole test: whenever ``watcher.cache_is_fresh`` is
True at time T, ``watcher.get_checkpoint().total_tokens`` is at least what was acknowledged
before ``T - max_staleness - 0.2 s`` (a fresh cache misses no change committed more than
``max_staleness`` ago). After the fault, with the writer stopped, the watcher must converge to
what a new backend on a new client loads, report fresh, be subscribed on the slot's new owner,
and ``wait_for_change`` must wake for a new write.

Faults, one test each:

1. ``CLUSTER FAILOVER`` on the replica of the run's primary (session cluster
   ``redis_cluster_replicas``);
2. migration of the run's slot to another primary (``SETSLOT IMPORTING/MIGRATING``,
   ``MIGRATE``, ``SETSLOT NODE`` on every primary; session cluster), done at once
   (``quick``) and with the slot held MIGRATING for 1 s (``slow``: RedisCluster's own
   TRYAGAIN retries run out, and RetryPolicy takes over);
3. ``SIGKILL`` of the run's primary, its replica promoted by the cluster (a private cluster,
   stopped at the end, so the session cluster stays whole).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from luft_redis import AgentDone, AgentStatus, RedisCheckpointBackend, TokenUsage
from luft_redis.errors import LuftRedisError
from luft_redis.retry import RetryPolicy
from luft_redis.tools.server import LocalRedisCluster, LocalRedisServer, find_redis_cli

# full: a Cluster with replicas and failovers, in `pytest --full` (CI) only; the everyday loop
# covers the Cluster through the cluster target of test_backend/test_coherence/test_server.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.full, pytest.mark.timeout(240)]

MAX_STALENESS = 0.5
"""The watcher's ``max_staleness``."""

MARGIN = 0.2
"""Slack on top of ``max_staleness`` for the invariant (scheduling, clock reads)."""

POLL = 0.005
"""Seconds between two invariant checks in the main thread."""

CONVERGE_BOUND = 10.0
"""Seconds the watcher may take, after the fault and with the writer stopped, to be fresh and
equal to a fresh load."""

WRITER_RETRY = RetryPolicy(max_attempts=50, deadline=20.0)
"""Enough to ride a failover (the kill test waits ~6 s for the replica's promotion)."""

WRITE_PAUSE = 0.002
"""Seconds the writer sleeps between two appends (keeps 6 servers and 4 threads on a small
machine from starving each other; still hundreds of changes per second)."""


# ------------------------------------------------------------------------------ helpers


def _redis_at(node: LocalRedisServer) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port, socket_timeout=5)


def _node_id(node: LocalRedisServer) -> str:
    with _redis_at(node) as conn:
        reply: Any = conn.execute_command("CLUSTER", "MYID")
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _shard_subscribers(node: LocalRedisServer, channel: bytes) -> int:
    """How many connections of ``node`` are subscribed to the sharded ``channel``."""
    with _redis_at(node) as conn:
        reply: Any = conn.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1]) if len(reply) >= 2 else 0


def _wait_for(predicate: Callable[[], bool], bound: float, what: str, every: float = 0.05) -> None:
    """For fault threads (the main thread uses :meth:`Scenario.poll_until`)."""
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {bound:.0f}s waiting for {what}")
        time.sleep(every)


def _replication_caught_up(primary: LocalRedisServer, replica: LocalRedisServer) -> bool:
    with _redis_at(primary) as p, _redis_at(replica) as r:
        sent = int(p.info("replication")["master_repl_offset"])
        info = r.info("replication")
        return info.get("master_link_status") == "up" and int(info["slave_repl_offset"]) >= sent


class Writer(threading.Thread):
    """Appends one-token events to a run until stopped; records every acknowledgement."""

    def __init__(self, backend: RedisCheckpointBackend, run_id: uuid.UUID) -> None:
        super().__init__(name="failover-writer", daemon=True)
        self.backend = backend
        self.run_id = run_id
        self.agent_id = uuid.uuid4()
        self.times: list[float] = []  # ack times (monotonic), ascending
        self.totals: list[int] = []  # the run's total_tokens right after each ack
        self.failures: list[str] = []
        self._halt = threading.Event()
        self._paused = False
        self._gate = threading.Lock()  # held across each append: pause() waits for it

    def event(self) -> AgentDone:
        return AgentDone(run_id=self.run_id, agent_id=self.agent_id, status=AgentStatus.OK,
                         tokens=TokenUsage(input=1), elapsed_ms=1)  # fmt: skip

    def append_one(self) -> None:
        self.backend.append_event(self.event())
        now = time.monotonic()
        snapshot = self.backend.get_checkpoint()
        assert snapshot is not None
        self.times.append(now)
        self.totals.append(snapshot.total_tokens)

    def run(self) -> None:
        while not self._halt.is_set():
            with self._gate:
                if self._paused:
                    pass
                else:
                    try:
                        self.append_one()
                    except LuftRedisError as exc:  # retries exhausted: the test fails at the end
                        self.failures.append(f"{time.monotonic():.3f} {exc!r}")
            time.sleep(WRITE_PAUSE if not self._paused else POLL)

    def pause(self) -> None:
        """Stop appending; returns once no append is in flight."""
        self._paused = True
        with self._gate:
            pass

    def resume(self) -> None:
        self._paused = False

    def stop(self, bound: float = 30.0) -> None:
        self._halt.set()
        self.join(bound)
        assert not self.is_alive(), "the writer did not stop"

    @property
    def acked(self) -> int:
        return len(self.times)


@dataclass
class Stats:
    checks: int = 0
    fresh: int = 0
    max_lag: float = 0.0  # while fresh: age of the oldest acknowledged change it missed
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    longest_stale: float = 0.0
    stale_since: float | None = None


class Scenario:
    """One run, a writer thread and a watcher, with the invariant checked from the main
    thread; see the module docstring."""

    def __init__(self, cluster: LocalRedisCluster) -> None:
        self.cluster = cluster
        self.clients: list[RedisCluster] = []
        self.backends: list[RedisCheckpointBackend] = []
        self.run_id = uuid.uuid4()
        self.stats = Stats()
        self.writer_backend = self._backend(watch=False, retry=WRITER_RETRY)
        self.watcher = self._backend(watch=True, max_staleness=MAX_STALENESS)
        self.writer = Writer(self.writer_backend, self.run_id)
        self.channel = b""
        self.slot = -1

    def _backend(self, **kwargs: Any) -> RedisCheckpointBackend:
        client = self.cluster.client()
        self.clients.append(client)
        backend = RedisCheckpointBackend(client, **kwargs)
        self.backends.append(backend)
        return backend

    def close(self) -> None:
        if self.writer.is_alive():
            self.writer.stop()
        for backend in self.backends:
            with contextlib.suppress(Exception):
                backend.close()
        for client in self.clients:
            with contextlib.suppress(Exception):
                client.close()

    # -- the invariant ----------------------------------------------------------------------

    def check(self) -> None:
        """One sample of the invariant (recorded; asserted by :meth:`assert_invariant`)."""
        stats = self.stats
        stats.checks += 1
        now = time.monotonic()
        if not self.watcher.cache_is_fresh:
            if stats.stale_since is None:
                stats.stale_since = now
            return
        if stats.stale_since is not None:
            stats.longest_stale = max(stats.longest_stale, now - stats.stale_since)
            stats.stale_since = None
        snapshot = self.watcher.get_checkpoint()
        seen = snapshot.total_tokens if snapshot is not None else -1
        stats.fresh += 1
        # acknowledgements are appended (time, total) by one thread: take a consistent prefix
        count = min(len(self.writer.times), len(self.writer.totals))
        times, totals = self.writer.times[:count], self.writer.totals[:count]
        missing = bisect.bisect_right(totals, seen)  # the first ack the watcher has not seen
        if missing >= len(times):
            return
        lag = now - times[missing]
        stats.max_lag = max(stats.max_lag, lag)
        if lag > MAX_STALENESS + MARGIN:
            stats.violation_count += 1
            if len(stats.violations) < 10:
                due = totals[bisect.bisect_right(times, now - MAX_STALENESS - MARGIN) - 1]
                stats.violations.append(
                    f"t={now:.3f}: fresh with total_tokens={seen}, but {due} were acknowledged "
                    f"before t-{MAX_STALENESS + MARGIN:.1f}s (missing since {lag:.3f}s)"
                )

    def assert_invariant(self) -> None:
        stats = self.stats
        assert not stats.violations, (
            f"{stats.violation_count} samples fresh but stale beyond max_staleness "
            f"(checks={stats.checks}, fresh={stats.fresh}):\n" + "\n".join(stats.violations)
        )

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            time.sleep(POLL)

    def poll_until(self, predicate: Callable[[], bool], bound: float, what: str,
                   every: float = POLL) -> float:  # fmt: skip
        """Check the invariant every POLL seconds until ``predicate()`` (asked every ``every``
        seconds) holds; the seconds it took. AssertionError after ``bound`` seconds."""
        start = time.monotonic()
        deadline = start + bound
        next_ask = start
        while True:
            self.check()
            now = time.monotonic()
            if now >= next_ask:
                if predicate():
                    return now - start
                next_ask = now + every
            if now >= deadline:
                raise AssertionError(f"timed out after {bound:.0f}s waiting for {what}")
            time.sleep(POLL)

    def during(self, fault: Callable[[], None], bound: float, what: str) -> None:
        """Run ``fault()`` in a thread while the main thread checks the invariant."""
        errors: list[BaseException] = []

        def target() -> None:
            try:
                fault()
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)

        thread = threading.Thread(target=target, name="failover-fault", daemon=True)
        thread.start()
        self.poll_until(lambda: not thread.is_alive(), bound, what)
        thread.join()
        if errors:
            raise errors[0]

    # -- phases -----------------------------------------------------------------------------

    def start(self, warm_up: int = 100) -> None:
        """Make the run, bind the watcher, wait until it is fresh, start the writer."""
        self.writer_backend.init_run(self.run_id, "cluster-failover", "/tmp/cluster-failover")
        assert self.watcher.open_run(self.run_id) is not None
        keys = self.watcher.keys
        assert keys is not None
        self.channel = keys.changes.encode()
        self.slot = key_slot(f"{{{self.run_id}}}".encode())
        assert key_slot(self.channel) == self.slot
        self.poll_until(lambda: self.watcher.cache_is_fresh, 10, "the watcher to be fresh")
        self.writer.start()
        self.poll_until(lambda: self.writer.acked >= warm_up, 30, f"{warm_up} writes")

    def fresh_load(self) -> Any:
        """What a new backend on a new client loads now."""
        client = self.cluster.client()
        try:
            backend = RedisCheckpointBackend(client, watch=False, retry=WRITER_RETRY)
            try:
                return backend.open_run(self.run_id)
            finally:
                backend.close()
        finally:
            client.close()

    def finish(self, owner: LocalRedisServer, others: list[LocalRedisServer]) -> None:
        """After the fault: stop the writer; the watcher converges to a fresh load, reports
        fresh, is subscribed on ``owner`` (the slot's primary now, and on none of ``others``),
        and ``wait_for_change`` wakes for a new write."""
        self.poll(1.0)  # writes go on after the fault
        self.writer.pause()
        acked = self.writer.acked
        self.writer.stop()
        # exactly once, and acknowledgements in order: ack number i saw total i
        assert self.writer.totals == list(range(1, acked + 1))

        expected = self.fresh_load()
        assert expected is not None and expected.total_tokens == acked
        took = self.poll_until(
            lambda: self.watcher.cache_is_fresh and self.watcher.get_checkpoint() == expected,
            CONVERGE_BOUND,
            "the watcher to converge to a fresh load",
        )
        print(f"converged {took:.2f}s after the writer stopped; {acked} writes acknowledged")
        assert _shard_subscribers(owner, self.channel) == 1
        for node in others:
            if node.running:
                assert _shard_subscribers(node, self.channel) == 0, node

        # a new write wakes a waiter (through a notice: this backend never writes)
        before = self.watcher.version
        woke: list[bool] = []
        waiter = threading.Thread(
            target=lambda: woke.append(self.watcher.wait_for_change(before, timeout=10)),
            name="failover-waiter", daemon=True)  # fmt: skip
        waiter.start()
        self.poll(0.2)
        self.writer.append_one()
        self.poll_until(lambda: not waiter.is_alive(), 15, "wait_for_change to return")
        assert woke == [True]
        assert self.watcher.version > before
        final = self.fresh_load()
        assert final is not None and final.total_tokens == acked + 1
        self.poll_until(
            lambda: self.watcher.cache_is_fresh and self.watcher.get_checkpoint() == final,
            CONVERGE_BOUND, "the watcher to apply the last write")  # fmt: skip
        self.poll(2 * MAX_STALENESS)  # stays fresh and right while nothing happens
        assert self.watcher.cache_is_fresh
        self.assert_invariant()
        s = self.stats
        print(f"checks={s.checks} fresh={s.fresh} max lag while fresh={s.max_lag:.3f}s "
              f"longest stale period={s.longest_stale:.2f}s")  # fmt: skip
        # last, so that a failed write does not hide what the watcher did
        failures = self.writer.failures
        assert failures == [], f"{len(failures)} writes failed: {failures[:3]}"


@contextlib.contextmanager
def scenario(cluster: LocalRedisCluster) -> Iterator[Scenario]:
    sc = Scenario(cluster)
    try:
        yield sc
    finally:
        sc.close()


# ------------------------------------------------------------------------------ 1. failover


def test_cluster_failover_keeps_fresh_honest(redis_cluster_replicas: LocalRedisCluster) -> None:
    """CLUSTER FAILOVER on the replica of the run's primary: the old primary drops the shard
    subscription (an unrequested ``sunsubscribe``); the watcher never reports fresh while it
    misses a change older than max_staleness, and follows the slot to the new primary."""
    cluster = redis_cluster_replicas
    cluster.wait_ready(timeout=30)  # an earlier test may have failed over
    with scenario(cluster) as sc:
        sc.start()
        old = cluster.primary_for_slot(sc.slot)
        (replica,) = cluster.replicas_of(old)
        assert _shard_subscribers(old, sc.channel) == 1

        def fail_over() -> None:
            with _redis_at(replica) as conn:
                conn.execute_command("CLUSTER", "FAILOVER")
            _wait_for(lambda: cluster.is_primary(sc.slot, replica), 30, "the failover")

        sc.during(fail_over, 40, "the failover")
        sc.finish(owner=replica, others=[old])
    cluster.wait_ready(timeout=30)  # the demoted primary follows its replacement


# ------------------------------------------------------------------------------ 2. migration


def _migrate_slot(cluster: LocalRedisCluster, slot: int, source: LocalRedisServer,
                  target: LocalRedisServer, hold: float = 0.0) -> None:  # fmt: skip
    """Move ``slot`` with its keys from ``source`` to ``target``, as ``redis-cli --cluster
    reshard`` does: IMPORTING/MIGRATING, MIGRATE the keys, then SETSLOT NODE on every primary
    (the target first, then the source). ``hold``: seconds the slot stays MIGRATING before
    its keys move (what moving a slot with many keys takes)."""
    source_id, target_id = _node_id(source), _node_id(target)
    with _redis_at(source) as src, _redis_at(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        time.sleep(hold)
        for _ in range(1000):
            keys: Any = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
        else:
            raise AssertionError(f"slot {slot} still has keys on the source")
    primaries = cluster.primaries()
    for node in [target, source, *(n for n in primaries if n not in (target, source))]:
        with _redis_at(node) as conn:
            conn.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)



@pytest.mark.parametrize(
    "hold",
    [
        pytest.param(0.0, id="quick"),
        pytest.param(1.0, id="slow"),
    ],
)  # fmt: skip
def test_slot_migration_keeps_fresh_honest(
    redis_cluster_replicas: LocalRedisCluster, hold: float
) -> None:
    """The run's slot moves to another primary while the writer appends (its retries ride
    TRYAGAIN/ASK/MOVED); the source drops the shard subscription when it gives the slot up,
    and the watcher follows the slot to its new owner. ``slow``: the slot stays MIGRATING for
    ``hold`` seconds before its keys move, as with a slot holding many keys."""
    cluster = redis_cluster_replicas
    cluster.wait_ready(timeout=30)
    try:
        with scenario(cluster) as sc:
            sc.start()
            source = cluster.primary_for_slot(sc.slot)
            target = next(node for node in cluster.primaries() if node is not source)
            assert _shard_subscribers(source, sc.channel) == 1

            def migrate() -> None:
                _migrate_slot(cluster, sc.slot, source, target, hold)
                _wait_for(lambda: cluster.is_primary(sc.slot, target), 30, "the migration")

            sc.during(migrate, 40, "the migration")
            sc.finish(owner=target, others=[source, *cluster.replicas_of(source)])
    finally:
        cluster.wait_ready(timeout=30)  # every node agrees on the slot map


# ------------------------------------------------------------------------------ 3. SIGKILL


@pytest.fixture
def private_cluster(redis_server_binary: str) -> Iterator[LocalRedisCluster]:
    """A cluster of 3 primaries with 1 replica each for this test alone (it kills a node)."""
    if find_redis_cli(redis_server_binary) is None:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail("redis-cli not found; CI is set, so this is an error, not a skip")
        pytest.skip("redis-cli not found")
    cluster = LocalRedisCluster(3, replicas=1, binary=redis_server_binary)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


PROMOTION_BOUND = 15.0
"""Seconds the cluster gets to promote the replica by itself (cluster-node-timeout is 5 s in
``LocalRedisCluster``: failure detection, then the replica's election)."""


def test_primary_sigkill_keeps_fresh_honest(private_cluster: LocalRedisCluster) -> None:
    """SIGKILL of the run's primary: the subscriber connection breaks, the slot has no
    primary until the cluster promotes the replica (seconds); the watcher is not fresh
    meanwhile, and follows the slot to the promoted replica."""
    cluster = private_cluster
    with scenario(cluster) as sc:
        sc.start()
        old = cluster.primary_for_slot(sc.slot)
        (replica,) = cluster.replicas_of(old)
        # Replication is asynchronous: a write acknowledged just before the kill may be lost
        # with the primary, which is data loss and not what this test is about. So the writer
        # pauses while the replica catches up and the primary is killed, and resumes at once:
        # its writes ride the failover on retries.
        sc.writer.pause()
        sc.poll_until(lambda: _replication_caught_up(old, replica), 10,
                      "the replica to catch up", every=0.02)  # fmt: skip
        old.kill()
        sc.writer.resume()
        killed = time.monotonic()
        forced: list[bool] = []

        def promoted() -> None:
            try:
                _wait_for(lambda: cluster.is_primary(sc.slot, replica), PROMOTION_BOUND,
                          "the replica's promotion")  # fmt: skip
            except AssertionError:
                # The cluster did not fail over by itself in time (a slow machine): force the
                # promotion, as an operator would.
                forced.append(True)
                with _redis_at(replica) as conn:
                    conn.execute_command("CLUSTER", "FAILOVER", "FORCE")
                _wait_for(lambda: cluster.is_primary(sc.slot, replica), 15,
                          "the forced promotion")  # fmt: skip

        sc.during(promoted, PROMOTION_BOUND + 20, "the promotion")
        print(
            f"replica promoted {time.monotonic() - killed:.1f}s after the kill"
            f"{' (CLUSTER FAILOVER FORCE)' if forced else ''}"
        )
        sc.finish(owner=replica, others=[old])
