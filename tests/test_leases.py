"""Agent tasks and leases (docs/leases.md, ../shared/design/fleet.md): the invariants.

One live holder per task, fencing (a write with a stale lease changes nothing), tokens that
never go back, server time only, nothing orphaned (lapses are taken over, failures end in
``dead`` until a resume), finishing is a write, exactly-once claims, cancellation through the
heartbeat. Single-process cases run on fakeredis, a private redis-server and Cluster
(``redis_client``); the asyncio front end has its own cases below; the fleet cases fork worker
processes against a private redis-server: 8 workers on 200 agents with 2 SIGKILLed, and a
worker SIGSTOPped past its lease.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest

from luft_redis import (
    AgentDone,
    AgentLease,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    AgentTask,
    AsyncRedisCheckpointBackend,
    CorruptDataError,
    LeaseLostError,
    Log,
    LogLevel,
    RedisCheckpointBackend,
    RunNotRunningError,
    TaskState,
    TokenUsage,
    ValidationError,
)
from luft_redis.keys import RunKeys, run_keys
from luft_redis.tools.server import LocalRedisServer

Factory = Callable[..., RedisCheckpointBackend]


def done(run_id: uuid.UUID, agent: uuid.UUID, status: AgentStatus = AgentStatus.OK,
         tokens: int = 1) -> AgentDone:  # fmt: skip
    return AgentDone(run_id=run_id, agent_id=agent, status=status,
                     tokens=TokenUsage(input=tokens, output=0), elapsed_ms=1)  # fmt: skip


def result(agent: uuid.UUID, status: str = "ok") -> AgentResultCache:
    return AgentResultCache(agent_id=agent, phase_id=0, status=status, tokens=1,
                            completed_at=1, output=None, findings=())  # fmt: skip


def started(run_id: uuid.UUID, agent: uuid.UUID) -> AgentStarted:
    return AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="p")


def stored(client: Any, keys: Any) -> dict[str, Any]:
    """What every key of the run holds (by content: a DUMP also shows a hash table's layout,
    which reads may change)."""
    out: dict[str, Any] = {}
    for name, key in zip(keys._fields, keys, strict=True):
        kind = client.type(key)
        if kind == b"hash":
            out[name] = client.hgetall(key)
        elif kind == b"stream":
            out[name] = client.xrange(key)
        elif kind == b"zset":
            out[name] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            out[name] = client.lrange(key, 0, -1)
        else:
            out[name] = kind
    return out


def states(backend: RedisCheckpointBackend) -> dict[uuid.UUID, TaskState]:
    return {task.agent_id: task.state for task in backend.agent_tasks()}


@pytest.fixture
def run_id() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture
def coordinator(make_backend: Factory, run_id: uuid.UUID) -> RedisCheckpointBackend:
    backend = make_backend()
    backend.init_run(run_id, "fleet", "/d")
    return backend


@pytest.fixture
def worker(make_backend: Factory, run_id: uuid.UUID,
           coordinator: RedisCheckpointBackend) -> RedisCheckpointBackend:  # fmt: skip
    backend = make_backend()
    assert backend.open_run(run_id) is not None
    return backend


def submit(backend: RedisCheckpointBackend, n: int, phase: int = 0,
           max_attempts: int | None = None) -> list[uuid.UUID]:  # fmt: skip
    agents = [uuid.uuid4() for _ in range(n)]
    backend.submit_agents([AgentTask(a, phase, {"prompt": f"p{i}"}) for i, a in enumerate(agents)],
                          max_attempts=max_attempts)  # fmt: skip
    return agents


def claim(backend: RedisCheckpointBackend, worker: str = "w", lease_for: float = 30.0,
          timeout: float = 0.0) -> AgentLease:  # fmt: skip
    lease = backend.claim_agent(worker, lease_for=lease_for, timeout=timeout)
    assert lease is not None
    return lease


# ------------------------------------------------------------------------------ submitting


def test_submit_is_idempotent_and_refuses_a_changed_task(
    coordinator: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    agents = submit(coordinator, 3)
    version = coordinator.version
    coordinator.submit_agents([AgentTask(agents[1], 0, {"prompt": "p1"})])  # same: no change
    assert coordinator.version == version
    with pytest.raises(ValidationError, match=str(agents[2])):
        coordinator.submit_agents([AgentTask(uuid.uuid4(), 0, None),
                                   AgentTask(agents[2], 1, {"prompt": "p2"})])  # fmt: skip
    with pytest.raises(ValidationError, match=str(agents[0])):
        coordinator.submit_agents([AgentTask(agents[0], 0, {"prompt": "other"})])
    tasks = coordinator.agent_tasks()
    assert [t.agent_id for t in tasks] == agents  # submit order; the refused batch added none
    assert all(t.state is TaskState.READY and t.attempt == 0 and t.token == 0 for t in tasks)
    assert tasks[2].payload == {"prompt": "p2"} and tasks[2].phase_id == 0
    assert coordinator.version == version


def test_submit_checks_its_input(coordinator: RedisCheckpointBackend) -> None:
    with pytest.raises(ValidationError, match=r"tasks\[0\].phase_id"):
        coordinator.submit_agents([AgentTask(uuid.uuid4(), -1)])
    with pytest.raises(ValidationError, match=r"tasks\[0\].payload"):
        coordinator.submit_agents([AgentTask(uuid.uuid4(), 0, {"x": float("nan")})])
    with pytest.raises(ValidationError, match="tasks"):
        coordinator.submit_agents(AgentTask(uuid.uuid4(), 0))  # type: ignore[arg-type]
    assert coordinator.agent_tasks() == []


def test_submit_to_a_run_that_is_not_running_is_refused(
    coordinator: RedisCheckpointBackend,
) -> None:
    coordinator.cancel()
    with pytest.raises(RunNotRunningError, match="cancelled"):
        submit(coordinator, 1)
    assert coordinator.agent_tasks() == []


def test_an_agent_with_an_ok_result_is_done_however_it_was_written(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    before = uuid.uuid4()
    coordinator.append_event(done(run_id, before))  # an ok result before it was submitted
    coordinator.submit_agents([AgentTask(before, 0)])
    later, other = submit(coordinator, 2)
    coordinator.upsert_agent_result(result(later))  # fmt: skip
    assert states(coordinator) == {before: TaskState.DONE, later: TaskState.DONE,
                                   other: TaskState.READY}  # fmt: skip
    lease = claim(worker)
    assert lease.agent_id == other  # the done ones are never handed out
    assert worker.claim_agent("w") is None


# ------------------------------------------------------------------------------ claiming


def test_a_claim_skips_a_long_head_of_tasks_done_meanwhile(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    """More done tasks at the queue's head than one claim reads (64): the claim says "again
    now", the next one reads past them, and a claim with a timeout gets the ready task."""
    agents = submit(coordinator, 70)
    coordinator.append_events([done(run_id, agent) for agent in agents[:69]])  # no lease
    lease = worker.claim_agent("w", timeout=10)
    assert lease is not None and lease.agent_id == agents[69]
    assert list(states(coordinator).values()).count(TaskState.DONE) == 69


def test_claims_hand_out_the_oldest_ready_task_with_increasing_tokens(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend
) -> None:
    agents = submit(coordinator, 4)
    leases = [claim(worker, f"w{i}") for i in range(4)]
    assert [lease.agent_id for lease in leases] == agents
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4 and tokens[0] >= 1
    assert all(lease.attempt == 1 for lease in leases)
    assert worker.claim_agent("w") is None  # all leased, none lapsed
    task = {t.agent_id: t for t in coordinator.agent_tasks()}[agents[2]]
    assert task.state is TaskState.LEASED and task.holder == "w2" and task.token == tokens[2]
    assert task.expires_at is not None and abs(task.expires_at - leases[2].expires_at) < 0.001
    assert leases[0].task == AgentTask(agents[0], 0, {"prompt": "p0"})


def test_claim_checks_its_input(worker: RedisCheckpointBackend) -> None:
    for bad in ("", "two words"):
        with pytest.raises(ValidationError, match="worker"):
            worker.claim_agent(bad)
    for lease_for in (0, -1, float("inf"), "1"):
        with pytest.raises(ValidationError, match="lease_for"):
            worker.claim_agent("w", lease_for=lease_for)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="timeout"):
        worker.claim_agent("w", timeout=-1)


CLAIM_KEYS = {"run", "writers", "queue", "tasks", "results", "history"}
"""The keys a claim of a ready task reads (each read is its type check) or writes."""


@pytest.mark.parametrize("name", list(RunKeys._fields))
def test_a_claim_reports_a_key_of_the_wrong_type_it_reads_and_leaves_the_others(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID,
    redis_client: Any, name: str,
) -> None:
    """A stray key of the wrong type among the keys a claim reads is CorruptDataError naming
    it, before anything is written; a claim does not touch (nor probe) the run's other keys:
    over a stray one it hands out the task and leaves that key as it was."""
    (agent,) = submit(coordinator, 1)
    keys = run_keys("luft", run_id)
    key = getattr(keys, name)
    redis_client.delete(key)
    redis_client.set(key, b"stray string")
    before = stored(redis_client, keys)
    if name in CLAIM_KEYS:
        with pytest.raises(CorruptDataError) as info:
            worker.claim_agent("w")
        assert info.value.key == key
        assert stored(redis_client, keys) == before
    else:
        assert claim(worker).agent_id == agent
        assert redis_client.get(key) == b"stray string"


def test_a_lapsed_lease_is_taken_over_and_its_holder_fenced_out(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend,
    make_backend: Factory, run_id: uuid.UUID, redis_client: Any,
) -> None:  # fmt: skip
    (agent,) = submit(coordinator, 1)
    zombie = claim(worker, "zombie", lease_for=0.2)
    worker.append_event(started(run_id, agent), lease=zombie)
    time.sleep(0.35)
    other = make_backend()
    other.open_run(run_id)
    heir = claim(other, "heir")
    assert heir.agent_id == agent and heir.token > zombie.token and heir.attempt == 2
    task = coordinator.agent_tasks()[0]
    assert task.failures == 1 and task.holder == "heir"  # the lapse was a failed attempt
    keys = run_keys("luft", run_id)
    before = stored(redis_client, keys)
    writes: list[Callable[[], object]] = [
        lambda: worker.append_event(done(run_id, agent), lease=zombie),
        lambda: worker.append_events(
            [Log(run_id=run_id, level=LogLevel.INFO, msg="x")], lease=zombie),
        lambda: worker.upsert_agent_result(result(agent, "ok"), lease=zombie),
        lambda: worker.upsert_agent_session(AgentSessionCheckpoint(
            agent_id=agent, session_id="s", status="x", updated_at=1), lease=zombie),
        zombie.renew,
        zombie.release,
    ]
    for write in writes:
        with pytest.raises(LeaseLostError) as caught:
            write()
        assert caught.value.agent_id == str(agent)
        assert caught.value.token == zombie.token and caught.value.current == heir.token
    assert zombie.lost
    # nothing written: no event, result, session, version or notice
    assert stored(redis_client, keys) == before
    other.append_event(done(run_id, agent), lease=heir)
    assert states(coordinator) == {agent: TaskState.DONE}
    log = other.get_event_log()
    assert sum(isinstance(e, AgentDone) for e in log) == 1


def test_a_lapsed_lease_nobody_took_over_renews_fine(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    (agent,) = submit(coordinator, 1)
    lease = claim(worker, lease_for=0.1)
    time.sleep(0.2)
    assert coordinator.agent_tasks()[0].lapsed
    lease.renew()
    assert not lease.lost and lease.expires_at > time.time()
    assert not coordinator.agent_tasks()[0].lapsed
    worker.append_event(done(run_id, agent), lease=lease)
    assert lease.finished and states(coordinator) == {agent: TaskState.DONE}


def test_a_fenced_batch_with_another_agents_event_is_refused_whole(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    a, b = submit(coordinator, 2)
    lease = claim(worker)
    version = worker.version
    with pytest.raises(ValidationError, match=str(b)):
        worker.append_events([started(run_id, a), done(run_id, b)], lease=lease)
    with pytest.raises(ValidationError, match="cache"):
        worker.upsert_agent_result(result(b, "ok"), lease=lease)  # fmt: skip
    assert worker.version == version and worker.get_event_log() == []
    worker.append_events([started(run_id, a), Log(run_id=run_id, level=LogLevel.INFO, msg="m")],
                         lease=lease)  # fmt: skip
    assert len(worker.get_event_log()) == 2


def test_writes_without_a_lease_are_not_checked(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    (agent,) = submit(coordinator, 1)
    claim(worker, "holder")
    coordinator.append_event(done(run_id, agent))  # luft's own path: no lease, no fence
    assert states(coordinator) == {agent: TaskState.DONE}


# ------------------------------------------------------------------------------ finishing


def test_failed_attempts_end_in_dead_until_the_run_is_resumed(
    make_backend: Factory, run_id: uuid.UUID, coordinator: RedisCheckpointBackend
) -> None:
    worker = make_backend(max_attempts=5)  # the task's own max_attempts counts, not a claim's
    worker.open_run(run_id)
    (agent,) = submit(coordinator, 1, max_attempts=2)
    first = claim(worker)
    worker.append_event(done(run_id, agent, AgentStatus.ERROR), lease=first)
    assert first.finished and states(coordinator) == {agent: TaskState.READY}
    second = claim(worker)
    assert second.attempt == 2
    # the token stays current until the next claim: a result right after agent_done is fine
    worker.append_event(done(run_id, agent, AgentStatus.ERROR), lease=second)
    worker.upsert_agent_result(result(agent, "error"), lease=second)  # fmt: skip
    task = coordinator.agent_tasks()[0]
    assert task.state is TaskState.DEAD and task.failures == 2
    assert worker.claim_agent("w") is None
    coordinator.cancel()
    coordinator.reset_status_to_running()
    task = coordinator.agent_tasks()[0]
    assert task.state is TaskState.READY and task.attempt == 0 and task.failures == 0
    third = claim(worker)
    assert third.agent_id == agent and third.token > second.token
    worker.append_event(done(run_id, agent), lease=third)
    assert states(coordinator) == {agent: TaskState.DONE}


def test_release_hands_back_and_an_exception_counts_as_a_failure(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend
) -> None:
    (agent,) = submit(coordinator, 1)
    lease = claim(worker)
    lease.release()
    task = coordinator.agent_tasks()[0]
    assert task.state is TaskState.READY and task.failures == 0 and task.attempt == 1
    lease.release()  # again: nothing to do
    with pytest.raises(RuntimeError), claim(worker) as held:
        assert held.agent_id == agent
        raise RuntimeError("the agent crashed")
    task = coordinator.agent_tasks()[0]
    assert task.state is TaskState.READY and task.failures == 1 and task.attempt == 2
    with claim(worker):
        pass  # leaving normally without finishing: released, not failed
    task = coordinator.agent_tasks()[0]
    assert task.state is TaskState.READY and task.failures == 1 and task.attempt == 3


def test_the_heartbeat_keeps_a_lease_alive(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend,
    make_backend: Factory, run_id: uuid.UUID,
) -> None:  # fmt: skip
    (agent,) = submit(coordinator, 1)
    other = make_backend()
    other.open_run(run_id)
    with claim(worker, lease_for=0.3) as lease:
        first = lease.expires_at
        time.sleep(0.8)  # more than two lease durations
        assert other.claim_agent("other") is None  # never lapsed
        assert lease.expires_at > first and not lease.lost
        worker.append_event(done(run_id, agent), lease=lease)
    assert states(coordinator) == {agent: TaskState.DONE}


def test_cancel_reaches_the_holder_at_its_next_heartbeat(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend
) -> None:
    submit(coordinator, 2)
    with claim(worker, lease_for=0.3) as lease:
        coordinator.cancel()
        deadline = time.monotonic() + 0.3  # one heartbeat is lease_for / 3
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lease.cancelled and lease.lost
    assert worker.claim_agent("w") is None  # a claim on a run that is not running: None


def test_a_re_created_run_fences_out_every_old_lease(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend,
    make_backend: Factory, run_id: uuid.UUID,
) -> None:  # fmt: skip
    (agent,) = submit(coordinator, 1)
    old = claim(worker)
    coordinator.delete_run(run_id)
    coordinator.init_run(run_id, "again", "/d")
    coordinator.submit_agents([AgentTask(agent, 0, {"prompt": "p0"})])
    fresh = make_backend()
    fresh.open_run(run_id)
    new = claim(fresh)
    assert new.token == old.token  # counters restart with the run, the incarnation does not
    worker.open_run(run_id)
    with pytest.raises(LeaseLostError) as caught:
        worker.append_event(started(run_id, agent), lease=old)
    assert caught.value.current is None  # another incarnation: no current token of ours
    fresh.append_event(done(run_id, agent), lease=new)


# ------------------------------------------------------------------------------ exactly once


def test_a_claim_retried_after_a_lost_reply_returns_the_same_lease(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, redis_client: Any,
    run_id: uuid.UUID,
) -> None:  # fmt: skip
    submit(coordinator, 3)
    fn = worker._scripts.claim_agent
    keys = list(run_keys("luft", run_id))
    args = ("writer-x", "7", "w", "30000", "3")
    first = redis_client.execute_command(*fn.command(keys, args), **_route(redis_client, keys))
    again = redis_client.execute_command(*fn.command(keys, args), **_route(redis_client, keys))
    assert first[1:] == again[1:] and first[1]  # the same lease, not a second one
    assert [t.state for t in coordinator.agent_tasks()].count(TaskState.LEASED) == 1
    later = redis_client.execute_command(*fn.command(keys, ("writer-x", "8", "w", "30000", "3")),
                                         **_route(redis_client, keys))  # fmt: skip
    assert later[1] and later[1] != first[1] and int(later[2]) > int(first[2])


def _route(client: Any, keys: list[str]) -> dict[str, Any]:
    from luft_redis.scripts import cluster_route

    return cluster_route(client, keys) if hasattr(client, "get_node_from_slot") else {}


def test_blocked_claim_wakes_on_a_submit(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend
) -> None:
    import threading

    submitted: list[uuid.UUID] = []

    def later() -> None:
        time.sleep(0.3)
        submitted.extend(submit(coordinator, 1))

    thread = threading.Thread(target=later)
    started_at = time.monotonic()
    thread.start()
    lease = worker.claim_agent("w", timeout=10)
    thread.join()
    assert lease is not None and [lease.agent_id] == submitted
    assert time.monotonic() - started_at < 5  # woken by the notice, not by the timeout


def test_blocked_claim_wakes_when_a_lease_lapses(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, make_backend: Factory,
    run_id: uuid.UUID,
) -> None:  # fmt: skip
    (agent,) = submit(coordinator, 1)
    claim(worker, "dying", lease_for=0.3)
    other = make_backend(watch=False)  # no notices at all: the lapse timer must wake it
    other.open_run(run_id)
    started_at = time.monotonic()
    lease = other.claim_agent("heir", timeout=10)
    assert lease is not None and lease.agent_id == agent and lease.attempt == 2
    assert time.monotonic() - started_at < 5


def test_a_forked_child_never_holds_its_parents_lease(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    if isinstance(worker.client, fakeredis.FakeRedis):
        pytest.skip("fakeredis does not serve a forked child")
    (agent,) = submit(coordinator, 1)
    lease = claim(worker)
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()

    def child() -> None:
        try:
            worker.append_event(started(run_id, agent), lease=lease)
            result.put("written")
        except LeaseLostError:
            result.put(f"refused {lease.forked}")

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(30)
    assert result.get(timeout=5) == "refused True"
    assert not lease.forked
    worker.append_event(started(run_id, agent), lease=lease)  # the parent still holds it


# ------------------------------------------------------------------------------ asyncio


def test_asyncio_front_end_leases(redis_target: str, request: pytest.FixtureRequest) -> None:
    """The same API on AsyncRedisCheckpointBackend: claims, fenced writes, a heartbeat on the
    loop, release on leaving ``async with`` and a takeover fencing the old holder out."""
    server = fakeredis.FakeServer()
    url = ""
    if redis_target == "redis":
        url = request.getfixturevalue("redis_url")
    elif redis_target == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.flushall()
        url = cluster.url

    def client() -> Any:
        import redis.asyncio
        import redis.asyncio.cluster

        if redis_target == "fakeredis":
            return fakeredis.FakeAsyncRedis(server=server)
        if redis_target == "cluster":
            return redis.asyncio.cluster.RedisCluster.from_url(url)
        return redis.asyncio.Redis.from_url(url)

    async def main() -> None:
        run_id = uuid.uuid4()
        boss = AsyncRedisCheckpointBackend(client())
        a = AsyncRedisCheckpointBackend(client())
        b = AsyncRedisCheckpointBackend(client())
        try:
            await boss.init_run(run_id, "t", "/d")
            await a.open_run(run_id)
            await b.open_run(run_id)
            agents = [uuid.uuid4() for _ in range(2)]
            await boss.submit_agents([AgentTask(x, 0, {"n": i}) for i, x in enumerate(agents)])
            lease = await a.claim_agent("a", lease_for=1.0)
            assert lease is not None and lease.agent_id == agents[0]
            async with lease:
                # the heartbeat task renews meanwhile (every 0.5 s: a 0.3 s lease renewed every
                # 0.15 s lapsed once on a loaded CI machine)
                await asyncio.sleep(2.2)
                assert await b.claim_agent("b") is not None  # the second agent, not the first
                assert await b.claim_agent("b") is None
                await a.append_event(done(run_id, agents[0]), lease=lease)
            tasks = {t.agent_id: t.state for t in await boss.agent_tasks()}
            assert tasks[agents[0]] is TaskState.DONE
            # a blocked event loop misses its heartbeat: the lease is lost, with a WARNING
            await boss.reset_status_to_running()
            await boss.submit_agents([AgentTask(uuid.uuid4(), 1)])
            slow = await a.claim_agent("a", lease_for=0.2)
            assert slow is not None
            async with slow:
                time.sleep(0.4)  # blocks the loop: no heartbeat can run
                await asyncio.sleep(0.1)
                assert slow.lost
        finally:
            for backend in (boss, a, b):
                await backend.aclose()

    asyncio.run(main())


# ------------------------------------------------------------------------------ a fleet


@pytest.fixture
def fleet_server(redis_server: LocalRedisServer) -> Iterator[str]:
    import redis

    with redis.Redis.from_url(redis_server.url) as admin:
        admin.flushall()
    yield redis_server.url


def _worker(url: str, run_id: uuid.UUID, name: str, work_s: float) -> None:
    """A worker process: claim, run (sleep), write fenced events until nothing is left. It
    reports through the run only (a process SIGKILLed while it holds a multiprocessing
    queue's lock would stop every other process's reports)."""
    backend = RedisCheckpointBackend.from_url(url)
    try:
        backend.open_run(run_id)
        while True:
            lease = backend.claim_agent(name, lease_for=1.0, timeout=1.5)
            if lease is None:
                if all(t.state in (TaskState.DONE, TaskState.DEAD)
                       for t in backend.agent_tasks()):  # fmt: skip
                    return
                continue
            try:
                with lease:
                    backend.append_event(started(run_id, lease.agent_id), lease=lease)
                    time.sleep(work_s)
                    backend.append_event(done(run_id, lease.agent_id), lease=lease)
            except LeaseLostError:
                pass  # taken over: the heir's writes count
    finally:
        backend.close()


@pytest.mark.server
@pytest.mark.slow
def test_a_fleet_with_killed_workers_finishes_every_agent_exactly_once(fleet_server: str) -> None:
    """8 worker processes, 200 agents, 2 workers SIGKILLed mid-agent: every agent ends with
    exactly one accepted ok agent_done, no agent is dead, no agent was held by two live
    workers at once, and the killed workers' agents were taken over when their leases lapsed,
    with nothing done by the coordinator."""
    run_id = uuid.uuid4()
    boss = RedisCheckpointBackend.from_url(fleet_server)
    ctx = multiprocessing.get_context("fork")
    procs: list[Any] = []
    try:
        boss.init_run(run_id, "fleet", "/d")
        agents = [uuid.uuid4() for _ in range(200)]
        boss.submit_agents([AgentTask(a, 0, {"i": i}) for i, a in enumerate(agents)])
        # the two victims take 30 s per agent, so they are always killed mid-agent
        procs = [ctx.Process(target=_worker,
                             args=(fleet_server, run_id, f"w{i}", 30.0 if i < 2 else 0.03))
                 for i in range(8)]  # fmt: skip
        for proc in procs:
            proc.start()
        victims = {"w0": procs[0], "w1": procs[1]}
        killed: dict[str, uuid.UUID] = {}
        deadline = time.monotonic() + 30
        while len(killed) < 2 and time.monotonic() < deadline:
            for task in boss.agent_tasks():
                name = task.holder or ""
                if task.state is TaskState.LEASED and name in victims and name not in killed:
                    os.kill(victims[name].pid or 0, signal.SIGKILL)  # mid-agent
                    killed[name] = task.agent_id
            time.sleep(0.005)
        for proc in procs:
            proc.join(90)
            assert proc.exitcode is not None
        assert len(killed) == 2
        tasks = {t.agent_id: t for t in boss.agent_tasks()}
        assert {t.state for t in tasks.values()} == {TaskState.DONE}  # none dead, none orphaned
        log = boss.get_event_log()
        ok = [e.agent_id for e in log if isinstance(e, AgentDone) and e.status is AgentStatus.OK]
        assert sorted(ok) == sorted(agents)  # exactly one accepted ok agent_done each
        for agent in killed.values():
            assert tasks[agent].attempt >= 2 and tasks[agent].failures >= 1
            assert tasks[agent].holder not in victims
        cp = boss.sync()
        assert cp is not None and cp.total_tokens == 200 and len(cp.agent_results) == 200
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        boss.close()


def _paused_worker(url: str, run_id: uuid.UUID, out: Any, go: Any) -> None:
    backend = RedisCheckpointBackend.from_url(url)
    try:
        backend.open_run(run_id)
        lease = backend.claim_agent("paused", lease_for=0.5)
        assert lease is not None
        backend.append_event(started(run_id, lease.agent_id), lease=lease)
        out.put(("claimed", str(lease.agent_id), lease.token))
        go.wait(30)  # the parent SIGSTOPs us here, takes over, SIGCONTs, then sets go
        try:
            backend.append_event(done(run_id, lease.agent_id, tokens=99), lease=lease)
            out.put(("written",))
        except LeaseLostError as exc:
            out.put(("refused", exc.token, exc.current))
    finally:
        backend.close()


@pytest.mark.server
def test_a_worker_paused_past_its_lease_is_refused(fleet_server: str) -> None:
    run_id = uuid.uuid4()
    boss = RedisCheckpointBackend.from_url(fleet_server)
    ctx = multiprocessing.get_context("fork")
    out, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_paused_worker, args=(fleet_server, run_id, out, go))
    try:
        boss.init_run(run_id, "pause", "/d")
        (agent,) = submit(boss, 1)
        proc.start()
        assert out.get(timeout=20)[0] == "claimed"
        os.kill(proc.pid or 0, signal.SIGSTOP)
        time.sleep(0.8)  # past the 0.5 s lease
        heir = boss.claim_agent("heir", lease_for=30)
        assert heir is not None and heir.agent_id == agent
        boss.append_event(done(run_id, agent, tokens=5), lease=heir)
        os.kill(proc.pid or 0, signal.SIGCONT)
        go.set()
        assert out.get(timeout=20) == ("refused", heir.token - 1, heir.token)
        proc.join(20)
        log = boss.get_event_log()
        dones = [e for e in log if isinstance(e, AgentDone)]
        assert len(dones) == 1 and dones[0].tokens.input == 5  # the zombie's write is not there
        assert boss.sync().total_tokens == 5  # type: ignore[union-attr]
    finally:
        if proc.is_alive():
            os.kill(proc.pid or 0, signal.SIGCONT)
            proc.kill()
        boss.close()


def test_logging_names_the_lost_lease(
    coordinator: RedisCheckpointBackend, worker: RedisCheckpointBackend,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    submit(coordinator, 1)
    with caplog.at_level(logging.WARNING, logger="luft_redis._sync.lease"), \
            claim(worker, lease_for=0.3) as lease:  # fmt: skip
        coordinator.cancel()
        deadline = time.monotonic() + 1
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.01)
    assert any(str(lease.agent_id) in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------ issue 26 §5: the lease's rules


def test_cancel_then_resume_within_the_lease_is_not_a_failed_attempt(
    make_backend: Factory, run_id: uuid.UUID, coordinator: RedisCheckpointBackend
) -> None:
    """The holder learns of the cancel and stops without releasing; the run is resumed before
    its lease would lapse. The cancel ended that lease, not the agent: the task is ready at
    once, with no failure counted, even with max_attempts=1."""
    (agent,) = submit(coordinator, 1, max_attempts=1)
    worker = make_backend()
    worker.open_run(run_id)
    lease = claim(worker, lease_for=60.0)
    coordinator.cancel()
    lease.renew()
    assert lease.cancelled and lease.lost  # the holder stops, leaving the lease as it is
    coordinator.reset_status_to_running()
    (task,) = coordinator.agent_tasks()
    assert task.state is TaskState.READY and task.failures == 0
    again = claim(worker, "w2")
    assert again.agent_id == agent and again.token > lease.token
    worker.append_event(done(run_id, agent), lease=again)
    assert states(coordinator) == {agent: TaskState.DONE}


def test_resuming_a_running_run_leaves_live_leases_alone(
    worker: RedisCheckpointBackend, coordinator: RedisCheckpointBackend
) -> None:
    (agent,) = submit(coordinator, 1)
    lease = claim(worker)
    coordinator.reset_status_to_running()  # running -> running: nothing stopped the lease
    assert states(coordinator) == {agent: TaskState.LEASED}
    lease.renew()
    assert not lease.lost


def test_a_task_keeps_the_max_attempts_it_was_submitted_with(
    make_backend: Factory, run_id: uuid.UUID, coordinator: RedisCheckpointBackend
) -> None:
    """Whoever claims last, the task's own max_attempts decides when it is dead (a worker made
    with max_attempts=2 no longer hands out a 4th attempt of a task with 3 failures)."""
    submit(coordinator, 1, max_attempts=4)
    for n, claimer_max in enumerate((1, 2, 9, 2), 1):
        worker = make_backend(max_attempts=claimer_max)
        worker.open_run(run_id)
        lease = claim(worker)
        assert lease.attempt == n
        lease.release(failed=True)
    (task,) = coordinator.agent_tasks()
    assert task.state is TaskState.DEAD and task.failures == 4


def test_a_task_submitted_before_tasks_kept_max_attempts_takes_the_claims(
    redis_client: Any, worker: RedisCheckpointBackend, coordinator: RedisCheckpointBackend,
    run_id: uuid.UUID,
) -> None:  # fmt: skip
    """A task hash written by the previous version has no ``max`` field: the first claim's
    max_attempts is kept with it, as before."""
    (agent,) = submit(coordinator, 1, max_attempts=7)
    redis_client.hdel(run_keys("luft", run_id).tasks, f"{agent}:max")
    lease = claim(worker)  # this worker: the default, 3
    assert redis_client.hget(run_keys("luft", run_id).tasks, f"{agent}:max") == b"3"
    lease.release(failed=True)
    assert redis_client.hget(run_keys("luft", run_id).tasks, f"{agent}:max") == b"3"


@pytest.mark.parametrize(
    "batch", [["ok", "error"], ["ok", "ok"], ["error", "ok"]], ids=lambda b: "-".join(b)
)
def test_a_lease_ends_at_its_first_agent_done(
    redis_client: Any, worker: RedisCheckpointBackend, coordinator: RedisCheckpointBackend,
    run_id: uuid.UUID, batch: list[str],
) -> None:  # fmt: skip
    """A fenced batch with two agent_done of its agent is refused whole (LeaseLostError,
    "ended"): nothing is written, and the task stays leased."""
    (agent,) = submit(coordinator, 1)
    lease = claim(worker)
    statuses = {"ok": AgentStatus.OK, "error": AgentStatus.ERROR}
    keys = run_keys("luft", run_id)
    before = stored(redis_client, keys)
    with pytest.raises(LeaseLostError) as caught:
        worker.append_events([done(run_id, agent, statuses[s]) for s in batch], lease=lease)
    assert caught.value.current == "ended" and "ended with its agent_done" in str(caught.value)
    assert stored(redis_client, keys) == before
    assert states(coordinator) == {agent: TaskState.LEASED}


def test_after_an_ok_agent_done_only_its_ok_result_is_accepted(
    worker: RedisCheckpointBackend, coordinator: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    """The ok agent_done is the lease's commit point: its ok result may follow (the demo writes
    it so), a result that is not ok or another agent_done would undo it and is refused."""
    (agent,) = submit(coordinator, 1)
    lease = claim(worker)
    worker.append_event(done(run_id, agent), lease=lease)
    with pytest.raises(LeaseLostError):
        worker.upsert_agent_result(result(agent, "error"), lease=lease)
    with pytest.raises(LeaseLostError):
        worker.append_event(done(run_id, agent, AgentStatus.ERROR), lease=lease)
    worker.upsert_agent_result(result(agent), lease=lease)
    worker.append_event(Log(run_id=run_id, agent_id=agent, level=LogLevel.INFO, msg="bye"),
                        lease=lease)  # fmt: skip
    cp = worker.get_checkpoint()  # (its own writes are in its cache)
    assert cp is not None and cp.agent_results[agent].status == "ok"
    assert states(coordinator) == {agent: TaskState.DONE}


def test_after_a_failed_agent_done_no_ok_result_is_accepted(
    worker: RedisCheckpointBackend, coordinator: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    (agent,) = submit(coordinator, 1)
    lease = claim(worker)
    worker.append_event(done(run_id, agent, AgentStatus.ERROR), lease=lease)
    worker.upsert_agent_result(result(agent, "error"), lease=lease)  # its own outcome: fine
    with pytest.raises(LeaseLostError):
        worker.upsert_agent_result(result(agent), lease=lease)  # would make the task done
    assert states(coordinator) == {agent: TaskState.READY}


def test_a_blocked_claim_of_a_backend_without_watch_wakes_on_submit(
    make_frontend_backend: Callable[..., Any],
) -> None:
    """``watch=False``: the claim follows the run's notices while it waits, so a submit wakes
    it at once, not at its timeout."""
    coordinator = make_frontend_backend(watch=False)
    worker = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    coordinator.init_run(run_id, "wake", "/d")
    worker.open_run(run_id)
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(
        worker.claim_agent("w", lease_for=30.0, timeout=20.0)))  # fmt: skip
    waiting.start()
    time.sleep(0.3)
    (agent,) = submit(coordinator, 1)
    submitted = time.monotonic()
    waiting.join(10)
    assert not waiting.is_alive() and got and got[0] is not None
    assert got[0].agent_id == agent
    assert time.monotonic() - submitted < 2.0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda b: b.claim_agent("w", lease_for=1e17), "lease_for"),
        (lambda b: b.claim_agent("w", lease_for=float("nan")), "lease_for"),
        (lambda b: b.claim_agent("w", timeout=float("nan")), "timeout"),
        (lambda b: b.submit_agents([AgentTask(uuid.uuid4(), 0)], max_attempts=10**30),
         "max_attempts"),
        (lambda b: b.submit_agents([AgentTask(uuid.uuid4(), 0)], max_attempts=0),
         "max_attempts"),
    ],
)  # fmt: skip
def test_lease_numbers_out_of_range_are_refused_before_any_io(
    make_frontend_backend: Callable[..., Any], call: Callable[[Any], Any], field: str
) -> None:
    backend = make_frontend_backend(watch=False)
    backend.init_run(uuid.uuid4(), "ranges", "/d")
    version = backend.version
    with pytest.raises(ValidationError) as caught:
        call(backend)
    assert caught.value.field == field
    assert backend.sync() is not None and backend.version == version


@pytest.mark.parametrize("value", [0, -1, 10**30, 2.5, True])
def test_a_backend_refuses_max_attempts_out_of_range(
    frontend_backend_type: Any, frontend_client: Any, value: Any
) -> None:
    with pytest.raises(ValidationError, match="max_attempts"):
        frontend_backend_type(frontend_client, watch=False, max_attempts=value)


def test_a_holder_that_missed_the_cancel_learns_the_resume_handed_its_task_back(
    make_backend: Factory, run_id: uuid.UUID, coordinator: RedisCheckpointBackend
) -> None:
    """Cancel and resume both between two heartbeats: the holder never saw the run stop, and
    its task is ready again. Its next renew says so: ``lost``, not ``finished``."""
    (agent,) = submit(coordinator, 1)
    worker = make_backend()
    worker.open_run(run_id)
    lease = claim(worker, lease_for=60.0)
    coordinator.cancel()
    coordinator.reset_status_to_running()
    lease.renew()
    assert lease.lost and not lease.finished and not lease.cancelled
    assert states(coordinator) == {agent: TaskState.READY}
