"""The run index (``luft_redis.index``): both front ends keep it after the operations that
create, finish, resume or delete a run, on every target; ``read_page`` and ``rebuild``."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis._sync import fcall
from luft_redis._sync import index as index_io
from luft_redis.keys import run_index_key, run_keys
from luft_redis.retry import NO_RETRY
from luft_redis.types import (
    CheckpointStatus,
    Log,
    LogLevel,
    RunDone,
    RunStatus,
    TokenUsage,
)

Client = redis.Redis | RedisCluster


def _index(client: Client, prefix: str = "luft") -> dict[str, float]:
    pairs: Any = client.zrange(run_index_key(prefix), 0, -1, withscores=True)
    return {member.decode(): float(score) for member, score in pairs}


def _updated_at(client: Client, run_id: uuid.UUID) -> float:
    raw = client.hget(run_keys("luft", run_id).run, "updated_at")
    assert raw is not None
    return float(int(raw))


def test_index_key_is_in_its_own_prefix_slot() -> None:
    assert run_index_key("luft") == "luft:{luft}:runs"
    assert run_index_key("team-a") == "team-a:{team-a}:runs"


def test_the_front_ends_keep_the_index(
    redis_client: Client, make_frontend_backend: Callable[..., Any]
) -> None:
    backend = make_frontend_backend(watch=False)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    backend.init_run(a, "first", "/tmp/a")
    assert _index(redis_client) == {str(a): _updated_at(redis_client, a)}
    backend.init_run_with_meta(b, "second", "/tmp/b", {"w": 1})
    backend.init_run(c, "third", "/tmp/c")
    assert set(_index(redis_client)) == {str(a), str(b), str(c)}

    # an event that does not finish the run leaves the index alone
    redis_client.zadd(run_index_key("luft"), {str(c): 5})
    backend.append_event(Log(run_id=c, level=LogLevel.INFO, msg="hello"))
    assert _index(redis_client)[str(c)] == 5
    # run_done finishes it: the entry takes its updated_at
    backend.append_events([Log(run_id=c, level=LogLevel.INFO, msg="bye"),
                           RunDone(run_id=c, status=RunStatus.FAILED,
                                   total_tokens=TokenUsage())])  # fmt: skip
    assert _index(redis_client)[str(c)] == _updated_at(redis_client, c)

    # resume and cancel
    redis_client.zadd(run_index_key("luft"), {str(c): 5})
    backend.reset_status_to_running()
    assert _index(redis_client)[str(c)] == _updated_at(redis_client, c)
    redis_client.zadd(run_index_key("luft"), {str(c): 5})
    backend.cancel()
    assert _index(redis_client)[str(c)] == _updated_at(redis_client, c)

    # save_checkpoint: a final status is indexed, a running one is not
    cp = backend.get_checkpoint()
    assert cp is not None and cp.status is CheckpointStatus.CANCELLED
    redis_client.zadd(run_index_key("luft"), {str(c): 5})
    backend.save_checkpoint(dataclasses.replace(cp, status=CheckpointStatus.RUNNING))
    assert _index(redis_client)[str(c)] == 5
    backend.save_checkpoint(dataclasses.replace(cp, status=CheckpointStatus.COMPLETED))
    assert _index(redis_client)[str(c)] == _updated_at(redis_client, c)

    # delete: bound and unbound
    assert backend.delete_run() is True
    assert backend.delete_run(a) is True
    assert set(_index(redis_client)) == {str(b)}
    assert backend.delete_run(a) is False
    assert set(_index(redis_client)) == {str(b)}


def test_other_prefixes_have_their_own_index(
    redis_client: Client, make_frontend_backend: Callable[..., Any]
) -> None:
    run = uuid.uuid4()
    make_frontend_backend(watch=False, prefix="team-a").init_run(run, "t", "/tmp/t")
    assert set(_index(redis_client, "team-a")) == {str(run)}
    assert _index(redis_client) == {}


def test_a_failed_index_update_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def zadd(self, *args: Any) -> Any:
            raise redis.exceptions.ConnectionError("gone")

        def zrem(self, *args: Any) -> Any:
            raise redis.exceptions.ConnectionError("gone")

    run = uuid.uuid4()
    with caplog.at_level(logging.WARNING, logger="luft_redis.index"):
        fcall.index_add(Broken(), NO_RETRY, "luft", run, 1.0)
        fcall.index_remove(Broken(), NO_RETRY, "luft", run)
    assert len(caplog.records) == 2
    assert all("--rebuild-index" in r.getMessage() and str(run) in r.getMessage()
               for r in caplog.records)  # fmt: skip


def _make_runs(client: Client, backend: Any, count: int) -> list[uuid.UUID]:
    runs = [uuid.uuid4() for _ in range(count)]
    for i, run in enumerate(runs):
        backend.init_run(run, f"task {i}", f"/tmp/{i}")
        if i % 3 == 0:
            backend.append_event(RunDone(run_id=run, status=RunStatus.COMPLETED,
                                         total_tokens=TokenUsage()))  # fmt: skip
        # distinct, known update times (the index score and the hash agree)
        client.hset(run_keys("luft", run).run, "updated_at", str(1_000_000 + i))
        client.zadd(run_index_key("luft"), {str(run): 1_000_000 + i})
    return runs


def test_read_page_orders_filters_and_skips_gone_runs(
    redis_client: Client, make_frontend_backend: Callable[..., Any]
) -> None:
    backend = make_frontend_backend(watch=False)
    runs = _make_runs(redis_client, backend, 10)
    page = index_io.read_page(redis_client, "luft", limit=4)
    assert [r.run_id for r in page.rows] == runs[::-1][:4]
    assert page.indexed == 10 and page.gone == 0

    completed = index_io.read_page(redis_client, "luft", limit=50, statuses=["completed"])
    assert [r.run_id for r in completed.rows] == [runs[9], runs[6], runs[3], runs[0]]
    assert all(r.status == "completed" for r in completed.rows)

    recent = index_io.read_page(redis_client, "luft", limit=50, since=1_000_007)
    assert [r.run_id for r in recent.rows] == [runs[9], runs[8], runs[7]]

    # a run whose keys went without its index entry (expiry, a raw DEL) is skipped, and its
    # entry leaves the index
    redis_client.delete(*[k for k in run_keys("luft", runs[9]) if not k.endswith(":changes")])
    page = index_io.read_page(redis_client, "luft", limit=3)
    assert [r.run_id for r in page.rows] == [runs[8], runs[7], runs[6]]
    assert page.gone == 1 and page.indexed == 9
    assert str(runs[9]) not in _index(redis_client)
    assert index_io.read_page(redis_client, "luft", limit=3).gone == 0

    redis_client.zadd(run_index_key("luft"), {"not-a-run-id": 2_000_000})
    assert index_io.rebuild(redis_client, "luft") == (9, 1)
    assert set(_index(redis_client)) == {str(r) for r in runs[:9]}
    assert _index(redis_client)[str(runs[4])] == 1_000_004


def test_rebuild_finds_runs_that_were_never_indexed(
    redis_client: Client, make_frontend_backend: Callable[..., Any]
) -> None:
    backend = make_frontend_backend(watch=False)
    runs = _make_runs(redis_client, backend, 5)
    redis_client.delete(run_index_key("luft"))  # as after an upgrade from 0.1
    assert index_io.read_page(redis_client, "luft", limit=50).rows == []
    assert index_io.rebuild(redis_client, "luft") == (5, 0)
    page = index_io.read_page(redis_client, "luft", limit=50)
    assert [r.run_id for r in page.rows] == runs[::-1]
    assert page.rows[0].task == "task 4" and page.rows[-1].status == "completed"


def test_read_page_removes_entries_of_gone_runs_across_pages(
    redis_client: Client, make_frontend_backend: Callable[..., Any]
) -> None:
    """Gone runs between the pages of a filtered read: every one leaves the index and no
    live row is skipped (the next page starts as many entries earlier as were removed)."""
    backend = make_frontend_backend(watch=False)
    runs = _make_runs(redis_client, backend, 12)
    gone = [r for i, r in enumerate(runs) if i % 2 == 1]
    for run in gone:
        redis_client.delete(*[k for k in run_keys("luft", run) if not k.endswith(":changes")])
    page = index_io.read_page(redis_client, "luft", limit=50, statuses=["running"])
    alive_running = [r for i, r in enumerate(runs) if i % 2 == 0 and i % 3 != 0]
    assert [r.run_id for r in page.rows] == alive_running[::-1]
    assert page.gone == len(gone) and page.indexed == 12 - len(gone)
    assert set(_index(redis_client)) == {str(r) for r in runs if r not in gone}


def test_an_expired_run_leaves_the_index_when_read(
    redis_client: Client, make_frontend_backend: Callable[..., Any]
) -> None:
    """A run that expired (expire_finished_after) keeps its index entry until a reader
    finds it gone: read_page then removes it."""
    backend = make_frontend_backend(watch=False)
    runs = _make_runs(redis_client, backend, 2)
    for key in run_keys("luft", runs[0]):  # runs[0] is completed: let every key expire
        redis_client.pexpire(key, 1)
    deadline = time.monotonic() + 10
    while redis_client.exists(run_keys("luft", runs[0]).run) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert str(runs[0]) in _index(redis_client)
    page = index_io.read_page(redis_client, "luft", limit=50)
    assert [r.run_id for r in page.rows] == [runs[1]] and page.gone == 1
    assert set(_index(redis_client)) == {str(runs[1])}
