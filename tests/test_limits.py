"""Rate limiters (docs/pools.md "Rate limits", issue 28): named GCRA limiters in requests and
tokens per minute, taken from by the claims of the tasks that name them. Every case runs on
fakeredis, a private redis-server and a private Redis Cluster (``redis_client``), through the
sync and the asyncio front end (``make_frontend_backend``), unless it says otherwise.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from luft_redis import (
    AgentDone,
    AgentStatus,
    AgentTask,
    LimiterNotFoundError,
    TokenUsage,
    ValidationError,
)
from luft_redis._sync.fcall import call_function
from luft_redis.keys import limiter_key, limiter_take_memo, pool_keys
from luft_redis.scripts import library

Make = Callable[..., Any]


def _limiter(client: Any, name: str = "model") -> dict[str, int]:
    """The limiter's counters and rates, as stored (plain text)."""
    raw = client.hgetall(limiter_key("luft", name))
    return {k.decode(): int(v) for k, v in raw.items()}


def _bound(make: Make, tasks: int, **submit: Any) -> Any:
    backend = make(watch=False)
    backend.init_run(uuid.uuid4(), "limited", "/d")
    if tasks:
        backend.submit_agents([AgentTask(uuid.uuid4(), 0, {"i": i}) for i in range(tasks)],
                              **submit)  # fmt: skip
    return backend


def _on_loop(backend: Any) -> Callable[..., Any]:
    """Call a lease's coroutine method where the front end needs it (the asyncio loop)."""
    loop = getattr(backend, "event_loop_thread", None)
    return loop.call if loop is not None else (lambda f, *a: f(*a))


def _done(lease: Any, tokens: int) -> AgentDone:
    return AgentDone(run_id=lease.run_id, agent_id=lease.agent_id, status=AgentStatus.OK,
                     tokens=TokenUsage(input=tokens), elapsed_ms=1)  # fmt: skip


def test_a_claim_under_a_spent_limiter_claims_nothing_and_waits_the_time_it_names(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    backend = make_frontend_backend(watch=False)
    backend.set_rate_limit("model", requests_per_minute=60, burst=0)  # one a second
    backend = _bound(make_frontend_backend, 3, limiter="model")
    first = backend.claim_agent("w")
    assert first is not None and first.limiter == "model"
    assert backend.claim_agent("w") is None  # out of budget: nothing claimed
    assert [task.state.value for task in backend.agent_tasks()] == ["leased", "ready", "ready"]
    stored = _limiter(redis_client)
    assert (stored["admitted"], stored["waits"]) == (1, 1)
    assert stored["requests_per_minute"] == 60 and "tokens_per_minute" not in stored
    start = time.monotonic()
    second = backend.claim_agent("w", timeout=5)  # sleeps the second the limiter named
    waited = time.monotonic() - start
    assert second is not None and second.agent_id != first.agent_id
    assert 0.5 <= waited < 3.0, waited
    assert _limiter(redis_client)["admitted"] == 2


def test_tokens_a_claim_reserved_are_settled_by_what_its_agent_reports(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    backend = make_frontend_backend(watch=False)
    backend.set_rate_limit("model", tokens_per_minute=10_000_000)
    backend = _bound(make_frontend_backend, 2, limiter="model", expected_tokens=500)
    call = _on_loop(backend)
    lease = backend.claim_agent("w")
    assert lease is not None and lease.charged == 500
    assert _limiter(redis_client)["tokens"] == 500  # reserved by the claim
    call(lease.report_tokens, 300)  # within the reservation: nothing more
    assert _limiter(redis_client)["tokens"] == 500
    call(lease.report_tokens, 400)  # 700 used: 200 past the reservation
    assert _limiter(redis_client)["tokens"] == 700
    backend.append_event(_done(lease, 750), lease=lease)  # settled exactly: 50 more
    assert _limiter(redis_client)["tokens"] == 750
    other = backend.claim_agent("w")
    assert other is not None and other.charged == 500
    call(other.report_tokens, 200)
    # an agent_done that says less than it reported: what it reported stands (300 back)
    backend.append_event(_done(other, 100), lease=other)
    assert _limiter(redis_client)["tokens"] == 750 + 200
    with pytest.raises(ValidationError, match="tokens"):
        call(other.report_tokens, -1)
    third = _bound(make_frontend_backend, 1, limiter="model", expected_tokens=500)
    held = third.claim_agent("w")
    assert held is not None
    _on_loop(third)(held.release)  # handed back unreported: the reservation stays spent
    assert _limiter(redis_client)["tokens"] == 750 + 200 + 500


def test_a_run_waiting_on_its_limiter_lets_the_pool_serve_the_others(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    boss = make_frontend_backend(watch=False)
    boss.set_rate_limit("model", requests_per_minute=1, burst=0)
    limited = _bound(make_frontend_backend, 3, limiter="model")
    limited.join_pool("lp")
    free = _bound(make_frontend_backend, 3)
    free.join_pool("lp")
    worker = make_frontend_backend(watch=False)
    got = []
    while (lease := worker.claim_agent("w", pool="lp")) is not None:
        got.append(lease.run_id)
    assert got.count(limited.run_id) == 1 and got.count(free.run_id) == 3
    keys = pool_keys("luft", "lp")  # the limited run sleeps until the limiter admits
    due = redis_client.zscore(keys.sleep, str(limited.run_id))
    assert due is not None and due / 1000 - time.time() > 30


def test_a_task_naming_a_limiter_that_does_not_exist_is_refused(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    backend = _bound(make_frontend_backend, 0)
    with pytest.raises(LimiterNotFoundError, match="set_rate_limit"):
        backend.submit_agents([AgentTask(uuid.uuid4(), 0)], limiter="nope")
    assert backend.agent_tasks() == []  # nothing submitted
    backend.set_rate_limit("gone", requests_per_minute=100)
    backend.submit_agents([AgentTask(uuid.uuid4(), 0, limiter="gone")])
    assert backend.delete_rate_limit("gone") is True
    assert backend.delete_rate_limit("gone") is False
    with pytest.raises(LimiterNotFoundError):
        backend.claim_agent("w")
    assert [task.state.value for task in backend.agent_tasks()] == ["ready"]  # not claimed
    assert [task.limiter for task in backend.agent_tasks()] == ["gone"]


def test_bad_rate_limit_arguments_are_refused_naming_them(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    backend = _bound(make_frontend_backend, 0)
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "requests_per_minute"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"requests_per_minute": 1.5}, "requests_per_minute"),
        ({"tokens_per_minute": True}, "tokens_per_minute"),
        ({"requests_per_minute": 5, "burst": -1}, "burst"),
        ({"requests_per_minute": 5, "burst": float("nan")}, "burst"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ValidationError) as caught:
            backend.set_rate_limit("model", **kwargs)
        assert caught.value.field == field, kwargs
    with pytest.raises(ValidationError) as caught:
        backend.set_rate_limit("a model", requests_per_minute=5)
    assert caught.value.field == "limiter"
    assert redis_client.keys("*limit*") == []  # nothing stored
    backend.set_rate_limit("model", requests_per_minute=5)
    aid = uuid.uuid4()
    for task, field in [
        (AgentTask(aid, 0, limiter="bad name"), "tasks[0].limiter"),
        (AgentTask(aid, 0, limiter="model", expected_tokens=-1), "tasks[0].expected_tokens"),
        (AgentTask(aid, 0, expected_tokens=5), "tasks[0].expected_tokens"),
    ]:
        with pytest.raises(ValidationError) as caught:
            backend.submit_agents([task])
        assert caught.value.field == field
    backend.submit_agents([AgentTask(aid, 0, limiter="model", expected_tokens=5)])
    with pytest.raises(ValidationError, match="another phase, payload, limiter or expected"):
        backend.submit_agents([AgentTask(aid, 0, limiter="model", expected_tokens=6)])
    assert [task.limiter for task in backend.agent_tasks()] == ["model"]


def test_a_take_retried_after_its_reply_was_lost_takes_once(redis_client: Any) -> None:
    key = limiter_key("luft", "model")
    redis_client.hset(key, mapping={"requests_per_minute": "60", "burst_ms": "0"})
    fn = library().ops.limit_take
    keys = [key, limiter_take_memo(key, "writer-1")]

    def take(seq: int) -> bytes:
        reply: bytes = call_function(redis_client, fn, keys, [str(seq), "admit", "1", "0"],
                                     cluster=hasattr(redis_client, "get_nodes"))  # fmt: skip
        return reply

    assert take(1) == b"0"
    assert take(1) == b"0"  # the same take again: its memo, nothing taken
    assert int(take(2)) > 900  # a new take: out of budget for about a second
    assert (_limiter(redis_client)["admitted"], _limiter(redis_client)["waits"]) == (1, 1)
    redis_client.hset(key, "tat_tokens", "soon")  # corrupt state is reported, not defaulted
    with pytest.raises(Exception, match="tat_tokens"):
        take(3)


def test_workers_never_take_more_than_the_limiter_allows(
    redis_client: Any, make_frontend_backend: Make
) -> None:
    boss = make_frontend_backend(watch=False)
    boss.set_rate_limit("model", requests_per_minute=1200, burst=0.1)  # 20/s, 3 at once
    run = _bound(make_frontend_backend, 200, limiter="model")
    workers = [make_frontend_backend(watch=False) for _ in range(4)]
    for worker in workers:
        worker.open_run(run.run_id)
    claimed: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.0

    def work(worker: Any) -> None:
        while time.monotonic() < stop:
            lease = worker.claim_agent("w", timeout=max(0.0, stop - time.monotonic()))
            if lease is not None:
                with lock:
                    claimed.append(time.monotonic())

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = _limiter(redis_client)
    assert stored["admitted"] == len(claimed)
    # 20 a second over the test's span, the 3 of the burst, and one in flight per worker
    span = (claimed[-1] - claimed[0]) if claimed else 0.0
    assert 1 <= len(claimed) <= 20 * span + 3 + 4, (len(claimed), span)
    assert stored["waits"] >= 1


def test_a_take_that_another_worker_beat_to_its_task_becomes_the_next_tasks_reservation(
    redis_client: Any,
) -> None:
    """Sync, every target: between this worker's take and its claim, another worker claims
    the task it took for; its claim gets the next task of that limiter, whose expected tokens
    become what it reserved (the difference settled at once)."""
    from luft_redis import RedisCheckpointBackend

    boss = RedisCheckpointBackend(redis_client, watch=False)
    boss.set_rate_limit("model", tokens_per_minute=10**9)
    boss.init_run(uuid.uuid4(), "raced", "/d")
    first, second = uuid.uuid4(), uuid.uuid4()
    boss.submit_agents([AgentTask(first, 0, None, "model", 1000),
                        AgentTask(second, 0, None, "model", 100)])  # fmt: skip
    worker = RedisCheckpointBackend(redis_client, watch=False)
    other = RedisCheckpointBackend(redis_client, watch=False)
    assert boss.run_id is not None
    for backend in (worker, other):
        backend.open_run(boss.run_id)
    take = worker._limit_take
    beaten: list[Any] = []

    def take_then_lose_the_task(*args: Any) -> int:
        wait = take(*args)
        if not beaten:
            beaten.append(other.claim_agent("other"))
        return wait

    worker._limit_take = take_then_lose_the_task  # type: ignore[method-assign,assignment]
    lease = worker.claim_agent("w")
    assert beaten[0] is not None and beaten[0].agent_id == first
    assert lease is not None and lease.agent_id == second and lease.charged == 100
    assert _limiter(redis_client)["tokens"] == 1000 + 100
    assert _limiter(redis_client)["admitted"] == 2


def test_a_take_is_given_back_when_the_claim_after_it_fails(redis_client: Any) -> None:
    """Sync, every target: the run is deleted between the take and the claim: the claim
    raises RunNotFoundError and the limiter gets its request and tokens back."""
    from luft_redis import RedisCheckpointBackend, RunNotFoundError

    boss = RedisCheckpointBackend(redis_client, watch=False)
    boss.set_rate_limit("model", requests_per_minute=1000, tokens_per_minute=10**9)
    boss.init_run(uuid.uuid4(), "doomed", "/d")
    boss.submit_agents([AgentTask(uuid.uuid4(), 0, None, "model", 700)])
    worker = RedisCheckpointBackend(redis_client, watch=False)
    assert boss.run_id is not None
    worker.open_run(boss.run_id)
    take = worker._limit_take

    def take_then_delete(*args: Any) -> int:
        wait = take(*args)
        if args[1] == "admit":
            boss.delete_run()
        return wait

    worker._limit_take = take_then_delete  # type: ignore[method-assign,assignment]
    with pytest.raises(RunNotFoundError):
        worker.claim_agent("w")
    stored = _limiter(redis_client)
    assert (stored["admitted"], stored["tokens"]) == (0, 0)


def test_what_a_limiter_would_admit_now_is_reported_as_it_admits(redis_client: Any) -> None:
    from luft_redis import RedisCheckpointBackend
    from luft_redis._sync.pools import list_rate_limits

    boss = RedisCheckpointBackend(redis_client, watch=False)
    boss.set_rate_limit("burst", requests_per_minute=60, burst=1.0)  # admits 2 at once
    boss.set_rate_limit("paced", requests_per_minute=60, tokens_per_minute=600, burst=0)
    found = {limit.name: limit for limit in list_rate_limits(redis_client, "luft")}
    assert found["burst"].requests_available == 2.0 and found["burst"].tokens_available is None
    assert found["paced"].requests_available == 1.0 and found["paced"].tokens_available == 0.0
    with pytest.raises(ValidationError) as caught:
        boss.init_run(uuid.uuid4(), "big", "/d")
        boss.submit_agents([AgentTask(uuid.uuid4(), 0, None, "paced", 10**12 + 1)])
    assert caught.value.field == "tasks[0].expected_tokens"


def test_a_pooled_run_whose_limiter_was_deleted_does_not_stop_the_pool(
    redis_client: Any, make_frontend_backend: Make, caplog: pytest.LogCaptureFixture
) -> None:
    boss = make_frontend_backend(watch=False)
    boss.set_rate_limit("gone", requests_per_minute=1000)
    broken = _bound(make_frontend_backend, 2, limiter="gone")
    broken.join_pool("mixed")
    fine = _bound(make_frontend_backend, 3)
    fine.join_pool("mixed")
    boss.delete_rate_limit("gone")
    worker = make_frontend_backend(watch=False)
    with caplog.at_level("ERROR"):
        got = [lease.run_id for _ in range(4)
               if (lease := worker.claim_agent("w", pool="mixed")) is not None]  # fmt: skip
    assert got == [fine.run_id] * 3  # the other run served; the broken one sleeps in the pool
    assert "names a rate limiter that does not exist" in caplog.text
    assert redis_client.zscore(pool_keys("luft", "mixed").sleep, str(broken.run_id)) is not None
    with pytest.raises(LimiterNotFoundError):  # a bound claim of that run raises
        broken.claim_agent("w")
