"""Pools (docs/pools.md, issue 28): a fleet claims from many runs. Every case runs on
fakeredis, a private redis-server and a private Redis Cluster (``redis_client``), through the
sync and the asyncio front end (``make_frontend_backend``), unless it says otherwise.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from luft_redis import (
    AgentDone,
    AgentStatus,
    AgentTask,
    LeaseLostError,
    TokenUsage,
    ValidationError,
)
from luft_redis._sync.fcall import call_function
from luft_redis.keys import pool_keys, run_keys
from luft_redis.pools import PICK_BATCH, PICK_KEEP, pick_args
from luft_redis.scripts import library

Make = Callable[..., Any]


def _run(make: Make, pool: str | None, agents: int, **join: Any) -> tuple[Any, uuid.UUID]:
    """A new run with ``agents`` tasks, in ``pool`` (joined with ``join``)."""
    boss = make()
    run_id = uuid.uuid4()
    boss.init_run(run_id, "pooled", "/d")
    if pool is not None:
        boss.join_pool(pool, **join)
    if agents:
        boss.submit_agents([AgentTask(uuid.uuid4(), 0, {"i": i}) for i in range(agents)])
    return boss, run_id


def _done(lease: Any, tokens: int = 1, status: AgentStatus = AgentStatus.OK) -> AgentDone:
    return AgentDone(run_id=lease.run_id, agent_id=lease.agent_id, status=status,
                     tokens=TokenUsage(input=tokens), elapsed_ms=1)  # fmt: skip


def _finish(worker: Any, lease: Any, tokens: int = 1) -> None:
    worker.append_event(_done(lease, tokens), lease=lease)


def _members(client: Any, pool: str) -> set[str]:
    return {m.decode() for m in client.smembers(pool_keys("luft", pool).members)}


def test_a_claim_from_a_pool_serves_every_run_in_turn_and_each_agent_once(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    runs = [_run(make_frontend_backend, "p", 4)[1] for _ in range(3)]
    worker = make_frontend_backend(watch=False)
    order, agents = [], []
    while (lease := worker.claim_agent("w1", pool="p", lease_for=30)) is not None:
        order.append(runs.index(lease.run_id))
        agents.append((lease.run_id, lease.agent_id))
        assert worker.run_id == lease.run_id  # the backend follows the lease's run
        _finish(worker, lease)
    assert len(agents) == 12 and len(set(agents)) == 12
    assert [order[i : i + 3] for i in range(0, 12, 3)] == [order[:3]] * 4  # round-robin
    assert sorted(order[:3]) == [0, 1, 2]
    for run_id in runs:  # every agent done, through the pool
        reader = make_frontend_backend(watch=False)
        reader.open_run(run_id)
        assert {task.state.value for task in reader.agent_tasks()} == {"done"}
    assert redis_client.zcard(pool_keys("luft", "p").ready) == 0  # corrected as found empty


def test_runs_share_by_weight_and_a_higher_priority_goes_first(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    heavy = _run(make_frontend_backend, "w", 40, weight=2)[1]
    light = _run(make_frontend_backend, "w", 40, weight=1)[1]
    worker = make_frontend_backend(watch=False)
    first = []
    for _ in range(30):
        lease = worker.claim_agent("w", pool="w")
        assert lease is not None
        first.append(lease.run_id)
    shares = Counter(first)
    assert shares[heavy] == 20 and shares[light] == 10
    urgent = _run(make_frontend_backend, "w", 3, priority=5)[1]
    time.sleep(PICK_KEEP + 0.05)  # the worker's picks made before it joined are dropped
    got = [worker.claim_agent("w", pool="w") for _ in range(4)]
    assert [lease.run_id for lease in got[:3]] == [urgent] * 3
    assert got[3] is not None and got[3].run_id in (heavy, light)


def test_a_run_that_joins_later_gets_a_worker_within_one_round(
    make_frontend_backend: Make,
) -> None:
    for _ in range(4):
        _run(make_frontend_backend, "late", 50)
    worker = make_frontend_backend(watch=False)
    for _ in range(20):  # the early runs are well under way
        assert worker.claim_agent("w", pool="late") is not None
    newcomer = _run(make_frontend_backend, "late", 5)[1]
    # the picks the worker holds (made before it joined: at most PICK_BATCH), then one pick,
    # whose first run is the newcomer (it entered the ready set at the virtual time)
    picked = [worker.claim_agent("w", pool="late").run_id for _ in range(PICK_BATCH + 1)]
    assert newcomer in picked


def test_finished_cancelled_deleted_and_moved_runs_leave_the_pool_by_themselves(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    cancelled, a = _run(make_frontend_backend, "gone", 2)
    deleted, b = _run(make_frontend_backend, "gone", 2)
    moved, c = _run(make_frontend_backend, "gone", 2)
    _, d = _run(make_frontend_backend, "gone", 2)
    assert _members(redis_client, "gone") == {str(a), str(b), str(c), str(d)}
    cancelled.cancel()
    deleted.delete_run()
    moved.join_pool("elsewhere")  # leaves "gone" (the index of the first pool too)
    worker = make_frontend_backend(watch=False)
    seen = set()
    while (lease := worker.claim_agent("w", pool="gone")) is not None:
        seen.add(lease.run_id)
    assert seen == {d}
    assert _members(redis_client, "gone") == {str(d)}
    assert _members(redis_client, "elsewhere") == {str(c)}
    lease = worker.claim_agent("w", pool="elsewhere")
    assert lease is not None and lease.run_id == c


def test_a_stale_index_entry_of_a_run_in_another_pool_hands_out_nothing(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    """A run whose pool changed without its old index entry being removed (the client died
    between the two calls): the claim in the run's slot sees the pool is not its own."""
    boss, run_id = _run(make_frontend_backend, "old", 2)
    keys = pool_keys("luft", "old")
    boss.join_pool("new")
    # the old index entry, put back as a crashed client would have left it
    call_function(redis_client, library().ops.pool_add, list(keys),
                  [keys.wake, "add", str(run_id), "1", "0", ""])  # fmt: skip
    worker = make_frontend_backend(watch=False)
    assert worker.claim_agent("w", pool="old") is None
    assert _members(redis_client, "old") == set()
    assert worker.claim_agent("w", pool="new") is not None


def test_a_blocked_claim_wakes_when_any_run_of_the_pool_gets_work(
    make_frontend_backend: Make,
) -> None:
    boss, run_id = _run(make_frontend_backend, "wake", 0)
    worker = make_frontend_backend(watch=False)
    agent = uuid.uuid4()

    def later() -> None:
        time.sleep(0.3)
        boss.submit_agents([AgentTask(agent, 0, None)])

    thread = threading.Thread(target=later)
    started = time.monotonic()
    thread.start()
    lease = worker.claim_agent("w", pool="wake", timeout=20)
    thread.join()
    assert lease is not None and lease.agent_id == agent and lease.run_id == run_id
    assert time.monotonic() - started < 10  # woken by the pool's channel, not the timeout


def test_a_lapsed_lease_of_a_pooled_run_is_taken_over(make_frontend_backend: Make) -> None:
    _, run_id = _run(make_frontend_backend, "lapse", 1)
    dying = make_frontend_backend(watch=False)
    first = dying.claim_agent("dying", pool="lapse", lease_for=0.3)
    assert first is not None
    heir = make_frontend_backend(watch=False)
    started = time.monotonic()
    second = heir.claim_agent("heir", pool="lapse", timeout=20)
    assert second is not None and second.agent_id == first.agent_id and second.run_id == run_id
    assert second.token > first.token and second.attempt == 2
    assert time.monotonic() - started < 10  # the sleep set's time, not the timeout


def test_a_lease_released_after_the_backend_moved_on_wakes_its_run(
    make_frontend_backend: Make,
) -> None:
    """A worker holds run A's only agent, claims again (the backend moves to run B), then
    hands A's agent back: A is woken in the pool at once, not at its lease's lapse."""
    _, run_a = _run(make_frontend_backend, "moved", 1)
    worker = make_frontend_backend(watch=False)
    first = worker.claim_agent("w", pool="moved", lease_for=60)
    assert first is not None and first.run_id == run_a
    other = make_frontend_backend(watch=False)
    assert other.claim_agent("o", pool="moved") is None  # A sleeps until its lease lapses
    _, run_b = _run(make_frontend_backend, "moved", 1)
    second = worker.claim_agent("w", pool="moved", lease_for=60)
    assert second is not None and second.run_id == run_b and worker.run_id == run_b
    call = getattr(worker, "event_loop_thread", None)
    (call.call if call is not None else (lambda f: f()))(first.release)
    again = other.claim_agent("o", pool="moved", lease_for=60)
    assert again is not None and again.run_id == run_a and again.agent_id == first.agent_id


def test_a_run_re_created_under_the_same_id_is_served_by_its_pool(
    make_frontend_backend: Make,
) -> None:
    """A pooled run is deleted and created again with the same id (a new incarnation, its
    versions counted from 1 again): the pool hands out the new run's agents, never the old
    lease's, and the old lease is fenced out."""
    boss, run_id = _run(make_frontend_backend, "again", 1)
    worker = make_frontend_backend(watch=False)
    old = worker.claim_agent("w", pool="again", lease_for=60)
    assert old is not None and old.run_id == run_id
    boss.delete_run(run_id)
    boss.init_run(run_id, "again", "/d", pool="again")
    agent = uuid.uuid4()
    boss.submit_agents([AgentTask(agent, 0, None)])
    fresh = make_frontend_backend(watch=False).claim_agent("o", pool="again", lease_for=60)
    assert fresh is not None and fresh.run_id == run_id and fresh.agent_id == agent
    with pytest.raises(LeaseLostError):
        worker.append_event(_done(old), lease=old)


def test_max_leases_bounds_a_runs_leases_and_a_finish_frees_a_slot(
    make_frontend_backend: Make,
) -> None:
    _, capped = _run(make_frontend_backend, "cap", 5, max_leases=2)
    worker = make_frontend_backend(watch=False)
    leases = [worker.claim_agent("w", pool="cap", lease_for=60) for _ in range(3)]
    assert [lease is not None for lease in leases] == [True, True, False]
    bound = make_frontend_backend(watch=False)  # a bound claim keeps the limit too
    bound.open_run(capped)
    assert bound.claim_agent("b") is None
    _finish(worker, leases[1])
    again = make_frontend_backend(watch=False).claim_agent("w2", pool="cap", timeout=10)
    assert again is not None and again.run_id == capped


def test_a_run_over_its_token_budget_hands_out_no_agent_until_it_is_raised(
    make_frontend_backend: Make,
) -> None:
    boss, run_id = _run(make_frontend_backend, "budget", 3, max_tokens=100)
    worker = make_frontend_backend(watch=False)
    lease = worker.claim_agent("w", pool="budget")
    assert lease is not None
    _finish(worker, lease, tokens=100)  # total_tokens reaches max_tokens
    assert worker.claim_agent("w", pool="budget") is None
    bound = make_frontend_backend(watch=False)
    bound.open_run(run_id)
    assert bound.claim_agent("b") is None
    assert bound.pool_membership().over_budget(100)
    boss.join_pool("budget", max_tokens=1000)  # raised: woken in the pool
    assert worker.claim_agent("w", pool="budget") is not None


def test_a_wake_lost_with_its_writer_is_found_by_a_claims_sweep(
    make_frontend_backend: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer dies between its submit (the run's slot) and the wake (the pool's slot):
    a claim waiting on the pool finds the run by its sweep of the members."""
    from luft_redis._sync import backend as sync_backend
    from luft_redis.asyncio import backend as async_backend

    for module in (sync_backend, async_backend):
        monkeypatch.setattr(module, "SWEEP_INTERVAL", 0.3)
    boss, run_id = _run(make_frontend_backend, "sweep", 0)
    worker = make_frontend_backend(watch=False)
    assert worker.claim_agent("w", pool="sweep") is None  # found empty: out of the ready set
    agent = uuid.uuid4()
    backend_class = type(getattr(boss, "wrapped", boss))
    asynchronous = backend_class is async_backend.AsyncRedisCheckpointBackend
    monkeypatch.setattr(backend_class, "_pool_wake", _async_no_wake if asynchronous else _no_wake)
    boss.submit_agents([AgentTask(agent, 0, None)])  # as a writer that died before its wake
    monkeypatch.undo()
    for module in (sync_backend, async_backend):
        monkeypatch.setattr(module, "SWEEP_INTERVAL", 0.3)
    started = time.monotonic()
    lease = worker.claim_agent("w", pool="sweep", timeout=20)
    assert lease is not None and lease.agent_id == agent and lease.run_id == run_id
    assert time.monotonic() - started < 10


async def _async_no_wake(*args: Any) -> None:
    return None


def _no_wake(*args: Any) -> None:
    return None


def test_a_pick_racing_a_submit_loses_no_wake_up(redis_client: Any) -> None:
    """The index's correction keeps a run whose wake came after what the failed try saw."""
    keys = pool_keys("luft", "race")
    ops = library().ops
    rid = str(uuid.uuid4())

    def add(tag: str) -> Any:
        return call_function(redis_client, ops.pool_add, list(keys),
                             [keys.wake, "add", rid, "1", "0", tag])  # fmt: skip

    seq = iter(range(1, 100))

    def pick(*fix: str, same: bool = False) -> list[Any]:
        fixes = [(fix[0], fix[1], fix[2], fix[3])] if fix else []
        number = last[0] if same else next(seq)
        last[0] = number
        return list(call_function(redis_client, ops.pool_pick,
                                  [*keys, keys.pick_memo("t"), keys.leases],
                                  pick_args(keys.wake, number, fixes)))  # fmt: skip

    last = [0]

    add("inc-1 5")
    assert pick()[:3] == [rid.encode(), b"1", b"0"]
    assert pick(same=True)[:3] == [rid.encode(), b"1", b"0"]  # a retry: the same picks
    # a try that saw version 4 found nothing; the wake of version 5 came after it: kept
    assert pick(rid, "empty", "", "inc-1 4")[0] == rid.encode()
    # a try that saw version 5 (or later) found nothing: out of the ready set
    assert pick(rid, "empty", "", "inc-1 5") == [b"", b""]
    add("inc-1 9")
    # another incarnation seen: tried once more, then dropped
    assert pick()[0] == rid.encode()
    assert pick(rid, "wait", "60000", "inc-2 1")[0] == rid.encode()
    reply = pick(rid, "wait", "60000", "inc-2 1")
    assert reply[0] == b"" and 59_000 <= int(reply[1]) <= 60_000  # sleeping until the lapse
    assert pick(same=True) == reply  # a retry of a pick that picked none: its first reply
    assert redis_client.sismember(keys.members, rid)
    pick(rid, "gone", "", "")
    assert not redis_client.sismember(keys.members, rid)
    # a pick whose corrections applied and that picked none, retried: applied once (an
    # "unused" pick given back twice would move the run's pass back twice)
    add("inc-3 1")
    assert pick()[0] == rid.encode()  # its pass: 1000 past the virtual time
    score = redis_client.zscore(keys.ready, rid)
    redis_client.hset(keys.pool, "max_leases", "1")  # at the cap: the pick picks none
    redis_client.zadd(keys.leases, {"someone": time.time() * 1000 + 60_000})
    assert pick(rid, "unused", "", "")[:1] == [b""]
    assert redis_client.zscore(keys.ready, rid) == score - 1000
    assert pick(rid, "unused", "", "", same=True)[:1] == [b""]  # the same pick, retried
    assert redis_client.zscore(keys.ready, rid) == score - 1000


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"pool": "a b"}, "pool"), ({"pool": ""}, "pool"), ({"pool": "x" * 101}, "pool"),
    ({"weight": 0}, "weight"), ({"weight": 1001}, "weight"), ({"weight": True}, "weight"),
    ({"priority": 10}, "priority"), ({"priority": -1}, "priority"),
    ({"max_leases": 0}, "max_leases"), ({"max_tokens": -1}, "max_tokens"),
])  # fmt: skip
def test_join_pool_checks_its_input_and_writes_nothing(
    redis_client: Any, make_frontend_backend: Make, kwargs: dict[str, Any], named: str
) -> None:
    boss, run_id = _run(make_frontend_backend, None, 0)
    before = redis_client.hgetall(run_keys("luft", run_id).run)
    with pytest.raises(ValidationError) as caught:
        boss.join_pool(**{"pool": "ok", **kwargs})
    assert caught.value.field == named
    assert redis_client.hgetall(run_keys("luft", run_id).run) == before
    with pytest.raises(ValidationError):
        make_frontend_backend(watch=False).claim_agent("w", pool="a b")


def test_submit_with_the_pool_a_run_is_in_keeps_its_weight_and_limits(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    """Another process joined the run with weight 3 and limits; a backend bound without
    loading it (it made the run) submits with ``pool=`` the same pool: nothing changes but
    the tasks, and its membership is the stored one."""
    boss, run_id = _run(make_frontend_backend, None, 0)
    other = make_frontend_backend(watch=False)
    other.open_run(run_id)
    other.join_pool("keep", weight=3, priority=2, max_leases=4, max_tokens=500)
    boss.submit_agents([AgentTask(uuid.uuid4(), 0, None)], pool="keep")
    fields = redis_client.hmget(run_keys("luft", run_id).run, "pool_weight", "pool_priority",
                                "max_leases", "max_tokens")  # fmt: skip
    assert fields == [b"3", b"2", b"4", b"500"]
    member = boss.pool_membership()
    assert (member.weight, member.priority, member.max_leases) == (3, 2, 4)
    boss.submit_agents([AgentTask(uuid.uuid4(), 0, None)], pool="other")  # another pool: joins
    assert redis_client.hget(run_keys("luft", run_id).run, "pool") == b"other"
    assert redis_client.hget(run_keys("luft", run_id).run, "pool_weight") == b"1"
    assert _members(redis_client, "keep") == set()
    assert _members(redis_client, "other") == {str(run_id)}


def test_pool_fields_are_plain_text_in_the_run_hash(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    boss, run_id = _run(make_frontend_backend, "text", 0, weight=3, priority=2, max_leases=4,
                        max_tokens=5000)  # fmt: skip
    fields = redis_client.hmget(run_keys("luft", run_id).run, "pool", "pool_weight",
                                "pool_priority", "max_leases", "max_tokens")  # fmt: skip
    assert fields == [b"text", b"3", b"2", b"4", b"5000"]
    reader = make_frontend_backend(watch=False)
    reader.open_run(run_id)
    member = reader.pool_membership()
    assert (member.pool, member.weight, member.priority, member.max_leases,
            member.max_tokens) == ("text", 3, 2, 4, 5000)  # fmt: skip
    boss.leave_pool()
    assert redis_client.hmget(run_keys("luft", run_id).run, "pool", "max_tokens") == [None, None]
    assert _members(redis_client, "text") == set()


def _jain(shares: list[int]) -> float:
    return sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares))


@pytest.mark.parametrize("weights", [(1,) * 10, (2,) * 5 + (1,) * 5], ids=["equal", "2:1"])
def test_four_workers_share_a_pool_of_ten_runs_fairly(
    redis_client: Any, make_backend: Make, weights: tuple[int, ...]
) -> None:
    """Issue 28: 10 runs of 100 agents, 4 workers: each run's share of the first 500 claims
    is within 10% of its weight's due (Jain's index >= 0.95 for equal weights)."""
    runs = [_run(make_backend, "fair", 100, weight=w)[1] for w in weights]
    claims: list[uuid.UUID] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        backend = make_backend(watch=False)
        try:
            while True:
                lease = backend.claim_agent(name, pool="fair", lease_for=60)
                assert lease is not None
                with lock:
                    if len(claims) >= 500:
                        return
                    claims.append(lease.run_id)
                _finish(backend, lease)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and len(claims) == 500
    counts = Counter(claims)
    shares = [counts[run_id] for run_id in runs]
    due = [500 * w / sum(weights) for w in weights]
    assert all(abs(got - want) <= 0.1 * want for got, want in zip(shares, due, strict=True)), shares
    if len(set(weights)) == 1:
        assert _jain(shares) >= 0.95


# ------------------------------------------------------------------------------ a fleet


def _pool_worker(url: str, runs: list[uuid.UUID], name: str, work_s: float) -> None:
    """A worker process of the pool "fleet": claim, run (sleep), write fenced events, until
    every task of ``runs`` is done. Reports through the runs only."""
    from luft_redis import LeaseLostError, RedisCheckpointBackend, TaskState

    backend = RedisCheckpointBackend.from_url(url)
    reader = RedisCheckpointBackend.from_url(url, watch=False)
    try:
        while True:
            lease = backend.claim_agent(name, pool="fleet", lease_for=1.0, timeout=1.5)
            if lease is None:
                states = set()
                for run_id in runs:
                    reader.open_run(run_id)
                    states |= {task.state for task in reader.agent_tasks()}
                if states <= {TaskState.DONE, TaskState.DEAD}:
                    return
                continue
            try:
                with lease:
                    time.sleep(work_s)
                    backend.append_event(_done(lease), lease=lease)
            except LeaseLostError:
                pass  # taken over: the heir's writes count
    finally:
        backend.close()
        reader.close()


@pytest.mark.server
@pytest.mark.slow
def test_a_pool_fleet_with_killed_workers_finishes_every_agent_exactly_once(
    redis_server: Any,
) -> None:
    """4 runs of 40 agents in one pool, 6 worker processes, 2 SIGKILLed mid-agent: every
    agent of every run ends with exactly one accepted ok agent_done, none dead; the killed
    workers' agents were taken over once their leases lapsed (the sleep set's wake)."""
    import multiprocessing
    import os
    import signal

    import redis

    from luft_redis import RedisCheckpointBackend, TaskState

    with redis.Redis.from_url(redis_server.url) as admin:
        admin.flushall()
    boss = RedisCheckpointBackend.from_url(redis_server.url)
    runs, agents = [], {}
    for _ in range(4):
        run_id = uuid.uuid4()
        boss.init_run(run_id, "fleet", "/d", pool="fleet")
        agents[run_id] = [uuid.uuid4() for _ in range(40)]
        boss.submit_agents([AgentTask(a, 0, {"i": i}) for i, a in enumerate(agents[run_id])])
        runs.append(run_id)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_pool_worker,
                         args=(redis_server.url, runs, f"w{i}", 30.0 if i < 2 else 0.02))
             for i in range(6)]  # fmt: skip
    try:
        for proc in procs:
            proc.start()
        victims = {"w0": procs[0], "w1": procs[1]}
        killed: dict[str, tuple[uuid.UUID, uuid.UUID]] = {}
        deadline = time.monotonic() + 30
        while len(killed) < 2 and time.monotonic() < deadline:
            for run_id in runs:
                boss.open_run(run_id)
                for task in boss.agent_tasks():
                    name = task.holder or ""
                    if task.state is TaskState.LEASED and name in victims and name not in killed:
                        os.kill(victims[name].pid or 0, signal.SIGKILL)  # mid-agent
                        killed[name] = (run_id, task.agent_id)
            time.sleep(0.005)
        for proc in procs:
            proc.join(120)
            assert proc.exitcode is not None
        assert len(killed) == 2
        for run_id in runs:
            boss.open_run(run_id)
            tasks = {t.agent_id: t for t in boss.agent_tasks()}
            assert {t.state for t in tasks.values()} == {TaskState.DONE}
            ok = [e.agent_id for e in boss.get_event_log()
                  if isinstance(e, AgentDone) and e.status is AgentStatus.OK]  # fmt: skip
            assert sorted(ok) == sorted(agents[run_id])  # exactly one accepted ok each
            for victim_run, agent in killed.values():
                if victim_run == run_id:
                    assert tasks[agent].attempt >= 2 and tasks[agent].holder not in victims
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        boss.close()


def test_a_pools_max_leases_bounds_its_leases_across_runs(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    runs = [_run(make_frontend_backend, "cap", 3)[1] for _ in range(3)]
    admin = make_frontend_backend(watch=False)
    admin.configure_pool("cap", max_leases=2)
    workers = [make_frontend_backend(watch=False) for _ in range(4)]
    first = workers[0].claim_agent("w0", pool="cap", lease_for=60)
    second = workers[1].claim_agent("w1", pool="cap", lease_for=60)
    assert first is not None and second is not None and first.pool_capped
    assert workers[2].claim_agent("w2", pool="cap") is None  # at the pool's limit
    keys = pool_keys("luft", "cap")
    assert redis_client.zcard(keys.leases) == 2
    assert redis_client.hget(keys.pool, "max_leases") == b"2"
    _finish(workers[0], first)  # an agent done: a place again
    third = workers[2].claim_agent("w2", pool="cap", lease_for=0.3)  # (lapses, no heartbeat)
    assert third is not None
    assert workers[3].claim_agent("w3", pool="cap") is None
    call = getattr(workers[1], "event_loop_thread", None)
    (call.call if call is not None else (lambda f: f()))(second.release)  # released: a place
    fourth = workers[1].claim_agent("w1", pool="cap", lease_for=60)
    assert fourth is not None
    start = time.monotonic()  # the lapsing lease's place comes back when it lapses
    fifth = workers[3].claim_agent("w3", pool="cap", lease_for=60, timeout=5)
    assert fifth is not None and time.monotonic() - start < 3
    assert {lease.run_id for lease in (first, second, third, fourth, fifth)} <= set(runs)
    got: list[Any] = []
    blocked = threading.Thread(target=lambda: got.append(
        workers[2].claim_agent("w2", pool="cap", lease_for=60, timeout=10)))
    blocked.start()
    time.sleep(0.3)
    start = time.monotonic()
    admin.configure_pool("cap", max_leases=10)  # a raised limit wakes a blocked claim
    blocked.join(10)
    assert got and got[0] is not None and time.monotonic() - start < 2
    got.clear()  # at the limit again (10 leased), then the limit removed: woken too
    admin.configure_pool("cap", max_leases=len([x for x in (first, second, third, fourth,
                                                             fifth) if x]) + 1 - 2)
    blocked = threading.Thread(target=lambda: got.append(
        workers[0].claim_agent("w0", pool="cap", lease_for=60, timeout=10)))
    blocked.start()
    time.sleep(0.3)
    start = time.monotonic()
    admin.configure_pool("cap", max_leases=None)  # no limit: the set is gone
    blocked.join(10)
    assert got and got[0] is not None and time.monotonic() - start < 2
    assert redis_client.exists(keys.leases) == 0
    assert redis_client.hget(keys.pool, "max_leases") is None
    with pytest.raises(ValidationError) as caught:
        admin.configure_pool("cap", max_leases=0)
    assert caught.value.field == "max_leases"
    with pytest.raises(ValidationError) as caught:
        admin.configure_pool("no pool", max_leases=1)
    assert caught.value.field == "pool"


def test_a_renewed_lease_keeps_its_place_under_the_pools_limit(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    _run(make_frontend_backend, "held", 3)
    make_frontend_backend(watch=False).configure_pool("held", max_leases=1)
    holder, other = make_frontend_backend(watch=False), make_frontend_backend(watch=False)
    lease = holder.claim_agent("h", pool="held", lease_for=0.6)
    assert lease is not None
    call = getattr(holder, "event_loop_thread", None)
    renew = (lambda: call.call(lease.renew)) if call is not None else lease.renew
    for _ in range(4):  # 1.2 s: past its first expiry, renewed each 0.3 s
        time.sleep(0.3)
        renew()
        assert other.claim_agent("o", pool="held") is None
    view = redis_client.zrange(pool_keys("luft", "held").leases, 0, -1)
    assert view == [f"{lease.run_id} {lease.agent_id} {lease.token}".encode()]
    _finish(holder, lease)  # ended: out of the count; a renew's report arriving late adds no
    assert redis_client.zcard(pool_keys("luft", "held").leases) == 0  # ghost
    late = getattr(holder, "event_loop_thread", None)
    backend: Any = getattr(holder, "wrapped", holder)  # (the asyncio backend, on its loop)

    def report() -> Any:
        return backend._pool_lease(lease, expires_ms=int(time.time() * 1000) + 60_000)

    late.call(report) if late is not None else report()
    assert redis_client.zcard(pool_keys("luft", "held").leases) == 0


def test_a_run_counts_its_lapses_and_takeovers(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    boss, run_id = _run(make_frontend_backend, "lapsing", 0)
    boss.submit_agents([AgentTask(uuid.uuid4(), 0)], max_attempts=2)
    worker = make_frontend_backend(watch=False)
    key = run_keys("luft", run_id).run
    assert worker.claim_agent("w", pool="lapsing", lease_for=0.2) is not None
    time.sleep(0.3)  # lapsed: the next claim takes it over
    assert worker.claim_agent("w", pool="lapsing", lease_for=0.2) is not None
    assert redis_client.hmget(key, "lapses", "takeovers") == [b"1", b"1"]
    time.sleep(0.3)  # lapsed again: its second failure, dead (no takeover)
    assert worker.claim_agent("w", pool="lapsing") is None
    assert redis_client.hmget(key, "lapses", "takeovers", "lease_token") == [b"2", b"1", b"2"]
