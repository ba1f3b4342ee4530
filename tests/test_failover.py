"""Failover under Sentinel: the primary is SIGKILLed during writes; writes go on on the promoted
replica; acknowledged events are counted against the log, with and without ``durability=``.

A primary, two replicas and three Sentinels run on free loopback ports in a temp dir (two
replicas, so that the promoted primary still has one to acknowledge ``WAIT``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
from redis.crc import key_slot

from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentStarted,
    AgentStatus,
    AgentTask,
    Durability,
    Log,
    LogLevel,
    NotDurableError,
    RedisCheckpointBackend,
    TaskState,
    TokenUsage,
)
from luft_redis.errors import LuftRedisError
from luft_redis.keys import pool_keys, run_keys
from luft_redis.retry import RetryPolicy
from luft_redis.tools.server import (
    LOOPBACK,
    LocalRedisCluster,
    LocalRedisServer,
    find_free_port,
    find_redis_server,
)

pytestmark = [pytest.mark.server, pytest.mark.slow]

SERVICE = "luftmain"


@dataclass
class Sentinels:
    ports: list[int]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"


def _wait(predicate: object, bound: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def topology(redis_server_binary: str) -> Iterator[tuple[LocalRedisServer, LocalRedisServer,
                                                          Sentinels]]:  # fmt: skip
    binary = find_redis_server()
    assert binary is not None
    primary = LocalRedisServer(binary=binary).start()
    replicas = [
        LocalRedisServer(
            binary=binary, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
        ).start()
        for _ in range(2)
    ]
    replica = replicas[0]
    root = Path(tempfile.mkdtemp(prefix="luft-sentinel-"))
    sentinels = Sentinels(ports=[find_free_port() for _ in range(3)])
    try:
        for rep in replicas:
            with redis.Redis(port=rep.port) as r:
                _wait(lambda r=r: r.info("replication").get("master_link_status") == "up", 15,
                      "the replicas to sync")  # fmt: skip
        for i, port in enumerate(sentinels.ports):
            work = root / f"s{i}"
            work.mkdir()
            conf = work / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {work}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            sentinels.procs.append(subprocess.Popen(
                [binary, str(conf), "--sentinel", "--logfile", str(work / "sentinel.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        for port in sentinels.ports:
            with redis.Redis(port=port) as s:
                _wait(lambda s=s: len(s.sentinel_slaves(SERVICE)) == 2
                      and s.sentinel_master(SERVICE)["num-other-sentinels"] == 2,
                      20, "the sentinels to see the replica and each other")  # fmt: skip
        yield primary, replica, sentinels
    finally:
        for proc in sentinels.procs:
            proc.kill()
            proc.wait(timeout=10)
        for rep in replicas:
            rep.stop()
        primary.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Outcome:
    acked: list[str] = field(default_factory=list)
    not_durable: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    first_ok_after_kill: float | None = None


def _write_through_failover(
    topology: tuple[LocalRedisServer, LocalRedisServer, Sentinels],
    durability: Durability | None,
) -> tuple[Outcome, set[str], float]:
    primary, _, sentinels = topology
    retry = RetryPolicy(max_attempts=400, deadline=30.0, initial_delay=0.05, max_delay=0.5)
    backend = RedisCheckpointBackend.from_url(
        sentinels.url, watch=False, retry=retry, durability=durability,
        socket_timeout=2.0, socket_connect_timeout=1.0,
    )  # fmt: skip
    run_id = uuid.uuid4()
    backend.init_run(run_id, "failover", "/d")
    outcome = Outcome()
    killed_at: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set() and i < 5000:
            msg = f"e{i}"
            i += 1
            try:
                backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg=msg))
            except NotDurableError:
                outcome.not_durable.append(msg)
                continue
            except LuftRedisError:
                outcome.failed.append(msg)
                continue
            outcome.acked.append(msg)
            if killed_at and outcome.first_ok_after_kill is None:
                outcome.first_ok_after_kill = time.monotonic() - killed_at[0]

    thread = threading.Thread(target=writer)
    thread.start()
    _wait(lambda: len(outcome.acked) >= 200, 30, "200 writes before the failover")
    primary.kill()
    killed_at.append(time.monotonic())
    _wait(lambda: outcome.first_ok_after_kill is not None, 40, "a write after the failover")
    acked_then = len(outcome.acked)
    _wait(lambda: len(outcome.acked) >= acked_then + 200, 30, "200 writes after the failover")
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    present = {e.msg for e in backend.get_event_log() if isinstance(e, Log)}
    log_len = len(backend.get_event_log())
    backend.close()
    assert outcome.first_ok_after_kill is not None
    # exactly once: no event twice in the log
    assert log_len == len(present)
    return outcome, present, outcome.first_ok_after_kill


@pytest.mark.full  # Sentinel failover: pytest --full (CI) only
def test_failover_with_durability_loses_nothing_acknowledged(
    topology: tuple[LocalRedisServer, LocalRedisServer, Sentinels],
) -> None:
    outcome, present, took = _write_through_failover(topology, Durability(1, 2000))
    lost = [m for m in outcome.acked if m not in present]
    print(f"durability=1: acked={len(outcome.acked)} lost={len(lost)} "
          f"not_durable={len(outcome.not_durable)} failed={len(outcome.failed)} "
          f"writes resumed after {took:.2f}s")  # fmt: skip
    assert lost == []
    assert took < 30


@pytest.mark.full  # Sentinel failover: pytest --full (CI) only
def test_failover_without_durability_is_counted(
    topology: tuple[LocalRedisServer, LocalRedisServer, Sentinels],
) -> None:
    outcome, present, took = _write_through_failover(topology, None)
    lost = [m for m in outcome.acked if m not in present]
    print(f"no durability: acked={len(outcome.acked)} lost={len(lost)} "
          f"failed={len(outcome.failed)} writes resumed after {took:.2f}s")  # fmt: skip
    # asynchronous replication may lose the last acknowledged writes; count, do not hide them
    assert len(lost) <= len(outcome.acked)
    assert took < 30


def test_durability_on_a_primary_without_replicas_says_so(redis_url: str) -> None:
    backend = RedisCheckpointBackend.from_url(
        redis_url, watch=False, durability=Durability(replicas=1, timeout_ms=50)
    )
    run_id = uuid.uuid4()
    with pytest.raises(NotDurableError) as info:
        backend.init_run(run_id, "t", "/d")
    assert info.value.acked == 0 and info.value.wanted == 1
    backend.close()


def test_durability_errors_go_to_each_write_of_concurrent_threads(redis_url: str) -> None:
    """Two threads write durably through one backend to a primary without replicas: every
    write gets its own NotDurableError (the count of replicas is the write's own, never a
    field another thread may clear or overwrite)."""
    backend = RedisCheckpointBackend.from_url(
        redis_url, watch=False, durability=Durability(replicas=1, timeout_ms=5)
    )
    run_id = uuid.uuid4()
    with pytest.raises(NotDurableError):
        backend.init_run(run_id, "t", "/d")
    outcomes: list[str] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        for _ in range(n):
            try:
                backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
                result = "ok"
            except NotDurableError:
                result = "not durable"
            with lock:
                outcomes.append(result)

    threads = [threading.Thread(target=write, args=(10,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == ["not durable"] * 20
    assert len(backend.get_event_log()) == 20
    backend.close()


# ------------------------------------------------------------------- a fleet through a failover


def _fleet_through_failover(make: Callable[[], RedisCheckpointBackend],
                            fail_over: Callable[[], None], n: int = 60,
                            pool: str | None = None) -> None:  # fmt: skip
    """Two worker threads (each its own backend with ``durability=``) claim ``n`` agents
    and write fenced events and results; ``fail_over()`` runs once a third of them is done.
    Afterwards every agent has its ok result and at most one accepted ok ``agent_done`` (none
    only when its worker's ``agent_done`` was refused after the result was written), each
    worker saw its tokens strictly increase, no token was handed out twice, and the run's
    ``lease_token`` on the new primary is at least every token handed out."""
    boss = make()
    run_id = uuid.uuid4()
    boss.init_run(run_id, "fleet failover", "/d", pool=pool)
    agents = [uuid.uuid4() for _ in range(n)]
    boss.submit_agents([AgentTask(a, 0, {"i": i}) for i, a in enumerate(agents)])
    seen: dict[str, list[int]] = {}
    finished: set[uuid.UUID] = set()
    refused: set[uuid.UUID] = set()  # agents whose agent_done raised after their ok result
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        backend = make()
        tokens = seen.setdefault(name, [])
        try:
            backend.open_run(run_id)
            while not stop.is_set():
                try:
                    lease = backend.claim_agent(name, lease_for=2.0, timeout=0.2, pool=pool)
                except LuftRedisError:
                    continue  # a claim lost in the failover lapses and is taken over
                if lease is None:
                    continue
                tokens.append(lease.token)
                try:
                    with lease:
                        agent = lease.agent_id
                        backend.append_event(AgentStarted(run_id=run_id, phase_id=0,
                                                          agent_id=agent, prompt_preview=name),
                                             lease=lease)  # fmt: skip
                        backend.upsert_agent_result(AgentResultCache(
                            agent_id=agent, phase_id=0, status="ok", tokens=1, completed_at=1,
                            output={"by": name}, findings=()), lease=lease)  # fmt: skip
                        try:
                            backend.append_event(AgentDone(
                                run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                                tokens=TokenUsage(input=1), elapsed_ms=1), lease=lease)  # fmt: skip
                        except LuftRedisError:
                            with lock:
                                refused.add(agent)
                            raise
                    with lock:
                        finished.add(agent)
                except LuftRedisError:
                    continue  # taken over, not durable, or the failover outlasted the retries
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            backend.close()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        _wait(lambda: len(finished) >= n // 3, 60, "a third of the agents before the failover")
        fail_over()

        def all_done() -> bool:
            try:
                return all(task.state is TaskState.DONE for task in boss.agent_tasks())
            except LuftRedisError:
                return False  # the failover outlasted the retries: ask again

        _wait(all_done, 90, "every agent done after the failover")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors and not any(thread.is_alive() for thread in threads)
    log = boss.get_event_log()
    ok = [e.agent_id for e in log if isinstance(e, AgentDone) and e.status is AgentStatus.OK]
    assert len(set(ok)) == len(ok)  # never two accepted ok agent_done for one agent
    # An agent without one is an agent whose worker wrote its ok result and then had its
    # agent_done refused (its lease lapsed in the failover): the next claim finds the ok
    # result and ends the task as done without handing it out again (claim_agent-12.lua).
    assert set(ok) <= set(agents) and set(agents) - set(ok) <= refused
    cp = boss.sync()
    assert cp is not None and set(cp.agent_results) == set(agents)
    assert all(r.status == "ok" for r in cp.agent_results.values())
    for tokens in seen.values():
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # never backwards
    handed = [token for tokens in seen.values() for token in tokens]
    assert len(set(handed)) == len(handed)  # no token handed out twice
    current = int(boss.client.hget(run_keys("luft", run_id).run, "lease_token") or 0)
    assert current >= max(handed)
    print(f"fleet failover: {len(handed)} claims for {n} agents, {len(refused)} agent_done "
          f"refused, lease_token {current}")
    boss.close()


@pytest.mark.full  # Sentinel failover: pytest --full (CI) only
def test_a_fleet_through_a_sentinel_failover_finishes_every_agent_once(
    topology: tuple[LocalRedisServer, LocalRedisServer, Sentinels],
) -> None:
    primary, _, sentinels = topology
    retry = RetryPolicy(max_attempts=400, deadline=30.0, initial_delay=0.05, max_delay=0.5)

    def make() -> RedisCheckpointBackend:
        return RedisCheckpointBackend.from_url(
            sentinels.url, retry=retry, durability=Durability(1, 2000), max_attempts=20,
            socket_timeout=2.0, socket_connect_timeout=1.0,
        )  # fmt: skip

    _fleet_through_failover(make, primary.kill)


@pytest.mark.full  # Cluster with replicas, failover: pytest --full (CI) only
@pytest.mark.parametrize("pool", [None, "failover"], ids=["bound", "pool"])
def test_a_fleet_through_a_cluster_failover_finishes_every_agent_once(
    redis_cluster_replicas: LocalRedisCluster, pool: str | None
) -> None:
    """On Cluster, with ``durability=Durability(replicas=1)``, a ``CLUSTER FAILOVER`` of the
    run's primary in the middle of the fleet's work: the same guarantees as through Sentinel.
    With ``pool``, the workers claim from a pool and the failover is the pool's primary's.
    (Not ``FORCE``: a forced takeover can drop a write the worker was told was not durable,
    and this test's worker gives the lease up on that error instead of writing it again.)"""
    cluster = redis_cluster_replicas
    cluster.wait_ready(timeout=30)  # an earlier test may have failed over
    made: list[RedisCheckpointBackend] = []
    clients: list[Any] = []
    retry = RetryPolicy(max_attempts=400, deadline=30.0, initial_delay=0.05, max_delay=0.5)

    def make() -> RedisCheckpointBackend:
        clients.append(cluster.client())
        backend = RedisCheckpointBackend(clients[-1], retry=retry, max_attempts=20,
                                         durability=Durability(1, 2000))  # fmt: skip
        made.append(backend)
        return backend

    def fail_over() -> None:  # the run's primary; with a pool, the pool's primary
        run_id = made[0].run_id
        assert run_id is not None
        key = run_keys("luft", run_id).run if pool is None else pool_keys("luft", pool).pool
        slot = key_slot(key.encode())
        old = cluster.primary_for_slot(slot)
        (replica,) = cluster.replicas_of(old)
        with redis.Redis(host=replica.host, port=replica.port) as conn:
            conn.execute_command("CLUSTER", "FAILOVER")
        cluster.wait_for_primary(slot, replica)

    try:
        _fleet_through_failover(make, fail_over, pool=pool)
    finally:
        for client in clients:
            client.close()
        cluster.wait_ready(timeout=30)  # the demoted primary follows its replacement


# ------------------------------------------------------------ durable writes on Redis Cluster


@pytest.mark.full  # Cluster with replicas: pytest --full (CI) only
def test_durable_writes_on_cluster_wait_on_the_slot_owner(
    redis_cluster_replicas: LocalRedisCluster,
    frontend: str,
    frontend_backend_type: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    """``durability=`` on Redis Cluster: the write and its ``WAIT`` go to the run's primary on
    one connection. A write its replica acknowledged returns; with the replica stopped it is
    applied and reported NotDurableError; after a failover the client's stale slot table sends
    the next write to the demoted primary, whose MOVED refreshes the table, and the retry is
    acknowledged by the new primary's replica. Every write is in the log once."""
    cluster = redis_cluster_replicas
    cluster.wait_ready(timeout=30)  # an earlier test may have failed over
    node = cluster.primaries()[0]
    if frontend == "sync":
        client: Any = cluster.client()
    else:
        loop = request.getfixturevalue("async_loop")
        client = loop.open_client(
            lambda: redis.asyncio.cluster.RedisCluster(host=LOOPBACK, port=node.port))
    retry = RetryPolicy(max_attempts=200, deadline=30.0, initial_delay=0.05, max_delay=0.5)
    backend = frontend_backend_type(client, watch=False, retry=retry,
                                    durability=Durability(replicas=1, timeout_ms=1000))  # fmt: skip
    try:
        run_id = uuid.uuid4()
        backend.init_run(run_id, "durable on cluster", "/d")
        backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="replicated"))
        slot = key_slot(run_keys("luft", run_id).run.encode())
        primary = cluster.primary_for_slot(slot)
        (replica,) = cluster.replicas_of(primary)
        assert replica.pid is not None
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotDurableError) as caught:
                backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="unreplicated"))
            assert caught.value.acked == 0
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        with (redis.Redis(host=primary.host, port=primary.port) as old,
              redis.Redis(host=replica.host, port=replica.port) as conn):
            target = old.info("replication")["master_repl_offset"]

            def caught_up() -> bool:
                info = conn.info("replication")
                return bool(info.get("master_link_status") == "up"
                            and info.get("slave_repl_offset", -1) >= target)  # fmt: skip

            _wait(caught_up, 30, "the resumed replica to catch up")
            conn.execute_command("CLUSTER", "FAILOVER")
            try:
                cluster.wait_for_primary(slot, replica, timeout=10)
            except TimeoutError:  # a manual failover can time out (the pair was busy):
                conn.execute_command("CLUSTER", "FAILOVER", "FORCE")  # the replica has it all
                cluster.wait_for_primary(slot, replica)
        cluster.wait_ready(timeout=30)  # the demoted primary follows its replacement
        retries = backend.stats().write_retries_total
        backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="after the failover"))
        assert backend.stats().write_retries_total > retries  # the MOVED, followed
        msgs = [e.msg for e in backend.get_event_log() if isinstance(e, Log)]
        assert msgs == ["replicated", "unreplicated", "after the failover"]
    finally:
        backend.close()
        if frontend == "sync":
            client.close()
