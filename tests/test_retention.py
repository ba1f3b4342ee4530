"""Retention: expiry of finished runs, trimming of event logs, gc, and the doctor's run checks.

Runs on every target (fakeredis, a private redis-server, a private cluster) and, where a
backend is driven, on both front ends. TTLs are read back with PTTL right after the script
that set them; the only test that waits for an expiry polls with a deadline (no timing
assertion).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

import luft_redis.retention as retention
from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    CheckpointStatus,
    Log,
    LogLevel,
    PhaseStarted,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    TokenUsage,
)
from luft_redis._sync import retention as sync_retention
from luft_redis.errors import ConfigurationError, ValidationError
from luft_redis.keys import run_index_key, run_keys
from luft_redis.scripts import script_source
from luft_redis.tools.doctor import check_runs, check_server
from luft_redis.tools.server import LocalRedisServer

Factory = Callable[..., Any]
HOUR = dt.timedelta(hours=1)
HOUR_MS = 3_600_000


@pytest.fixture
def make_backend(make_frontend_backend: Factory) -> Factory:
    return make_frontend_backend


def key_list(run_id: uuid.UUID, prefix: str = "luft") -> list[str]:
    """The 9 keys of a run (the 10th entry of RunKeys is the change channel)."""
    return list(run_keys(prefix, run_id))[:9]


def ttls(client: Any, run_id: uuid.UUID) -> dict[str, int]:
    """PTTL of every key of the run, by key name suffix (-2: missing, -1: no TTL), read in
    one round trip (the keys share a slot), so a loaded machine cannot spread the readings
    further apart than the script did."""
    keys = key_list(run_id)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.pttl(key)
    return {k.rsplit(":", 1)[1]: int(v) for k, v in zip(keys, pipe.execute(), strict=True)}


def populate(backend: Any, run_id: uuid.UUID) -> None:
    """A run with every key present: events, phases, results, sessions, started, findings,
    findings_order, writers (and run)."""
    from luft_redis import Finding, Severity

    agent = uuid.uuid4()
    backend.init_run(run_id, "task", "/runs/r")
    backend.append_events([
        PhaseStarted(run_id=run_id, phase_id=1, label="scan", planned=1),
        AgentStarted(run_id=run_id, phase_id=1, agent_id=agent, prompt_preview="p", model=None),
        AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                  tokens=TokenUsage(input=3, output=4), elapsed_ms=1,
                  findings=(Finding(kind="bug", severity=Severity.LOW, title="t", detail="d"),)),
    ])  # fmt: skip
    backend.upsert_agent_session(
        AgentSessionCheckpoint(agent_id=agent, session_id="s", status="active", updated_at=1)
    )


def assert_all_expire_together(client: Any, run_id: uuid.UUID, limit_ms: int) -> None:
    found = ttls(client, run_id)
    assert all(v > 0 for v in found.values()), found  # every key exists and has a TTL
    assert max(found.values()) <= limit_ms
    # one script set them all (fakeredis's clock moves during a script: a few ms apart)
    assert max(found.values()) - min(found.values()) <= 100, found


def assert_no_ttl(client: Any, run_id: uuid.UUID) -> None:
    found = ttls(client, run_id)
    assert all(v == -1 for v in found.values()), found


def finish(backend: Any, run_id: uuid.UUID, how: str) -> CheckpointStatus:
    if how == "run_done":
        backend.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                                     total_tokens=TokenUsage()))  # fmt: skip
        return CheckpointStatus.COMPLETED
    if how == "run_done_failed":
        backend.append_event(RunDone(run_id=run_id, status=RunStatus.FAILED,
                                     total_tokens=TokenUsage()))  # fmt: skip
        return CheckpointStatus.FAILED
    if how == "cancel":
        backend.cancel()
        return CheckpointStatus.CANCELLED
    assert how == "save_failed"
    cp = backend.get_checkpoint()
    backend.save_checkpoint(dataclasses.replace(cp, status=CheckpointStatus.FAILED))
    return CheckpointStatus.FAILED


FINISHES = ("run_done", "run_done_failed", "cancel", "save_failed")


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"expire_finished_after": 3600}, "timedelta"),
        ({"expire_finished_after": dt.timedelta(0)}, "at least 1 ms"),
        ({"expire_finished_after": dt.timedelta(seconds=-5)}, "at least 1 ms"),
        ({"max_events": 0}, "positive"),
        ({"max_events": True}, "positive"),
        ({"max_events": 2.5}, "positive"),
    ],
)
def test_bad_retention_options_are_refused(kwargs: dict[str, Any], word: str) -> None:
    import fakeredis

    with pytest.raises(ConfigurationError, match=word):
        RedisCheckpointBackend(fakeredis.FakeRedis(), watch=False, **kwargs)


def test_options_are_kept_and_from_url_takes_them(redis_url: str) -> None:
    with RedisCheckpointBackend.from_url(
        redis_url, watch=False, expire_finished_after=HOUR, max_events=50
    ) as backend:
        assert backend.expire_finished_after == HOUR
        assert backend.max_events == 50
        assert not backend.log_trimmed  # unbound
        run_id = uuid.uuid4()
        populate(backend, run_id)
        backend.cancel()
        assert_all_expire_together(backend.client, run_id, HOUR_MS)


def test_async_from_url_takes_the_options(redis_url: str) -> None:
    from luft_redis import AsyncRedisCheckpointBackend

    asyncio.run(_async_from_url(redis_url, AsyncRedisCheckpointBackend))


async def _async_from_url(redis_url: str, cls: Any) -> None:

    backend = cls.from_url(
        redis_url, watch=False, expire_finished_after=HOUR, max_events=7
    )
    try:
        assert backend.expire_finished_after == HOUR and backend.max_events == 7
        run_id = uuid.uuid4()
        await backend.init_run(run_id, "t", "/d")
        await backend.cancel()
        assert 0 < await backend.client.pttl(run_keys("luft", run_id).run) <= HOUR_MS
    finally:
        await backend.aclose()


# ---------------------------------------------------------------------------- expiry


@pytest.mark.parametrize("how", FINISHES)
def test_the_finishing_script_sets_the_ttl_on_every_key(
    make_backend: Factory, redis_client: Any, how: str
) -> None:
    backend = make_backend(expire_finished_after=HOUR)
    run_id = uuid.uuid4()
    populate(backend, run_id)
    assert_no_ttl(redis_client, run_id)  # running: no TTL
    status = finish(backend, run_id, how)
    assert backend.get_checkpoint().status is status
    assert_all_expire_together(redis_client, run_id, HOUR_MS)


@pytest.mark.parametrize("how", FINISHES)
def test_without_the_option_a_finished_run_keeps_no_ttl(
    make_backend: Factory, redis_client: Any, how: str
) -> None:
    backend = make_backend()
    run_id = uuid.uuid4()
    populate(backend, run_id)
    finish(backend, run_id, how)
    assert_no_ttl(redis_client, run_id)


def test_keys_created_after_the_finish_get_the_runs_ttl(
    make_backend: Factory, redis_client: Any
) -> None:
    """A bare run (no results, sessions, ... keys) finishes with a TTL; writes by a backend
    *without* the option then create keys, which get the run hash's remaining TTL."""
    writer = make_backend(expire_finished_after=HOUR)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    writer.cancel()
    found = ttls(redis_client, run_id)
    assert found["results"] == -2 and found["sessions"] == -2  # not created yet
    assert 0 < found["run"] <= HOUR_MS

    plain = make_backend()
    assert plain.open_run(run_id) is not None
    agent = uuid.uuid4()
    plain.upsert_agent_result(AgentResultCache(agent_id=agent, phase_id=1, status="ok", output=None,
                                               findings=(), tokens=1, completed_at=1))  # fmt: skip
    plain.upsert_agent_session(
        AgentSessionCheckpoint(agent_id=agent, session_id="s", status="x", updated_at=1)
    )
    plain.append_event(Log(run_id=run_id, agent_id=None, level=LogLevel.INFO, msg="late"))
    found = ttls(redis_client, run_id)
    for name in ("results", "sessions", "events", "writers"):
        assert 0 < found[name] <= found["run"] + 100, found
        assert found["run"] - found[name] <= 100, found
    # the late writes did not extend the run's life
    assert found["run"] <= HOUR_MS


def test_a_plain_backend_finishing_an_already_expiring_run_keeps_its_ttl(
    make_backend: Factory, redis_client: Any
) -> None:
    short = dt.timedelta(minutes=10)
    writer = make_backend(expire_finished_after=short)
    run_id = uuid.uuid4()
    populate(writer, run_id)
    writer.append_event(RunDone(run_id=run_id, status=RunStatus.FAILED,
                                total_tokens=TokenUsage()))  # fmt: skip
    longer = make_backend(expire_finished_after=dt.timedelta(days=30))
    assert longer.open_run(run_id) is not None
    longer.save_checkpoint(dataclasses.replace(longer.get_checkpoint(),
                                              status=CheckpointStatus.CANCELLED))
    # already expiring: the first TTL stands (not restarted with another length)
    assert_all_expire_together(redis_client, run_id, 600_000)


@pytest.mark.parametrize("how", ["reset", "save_running"])
def test_resuming_removes_the_ttl_in_the_same_script(
    make_backend: Factory, redis_client: Any, how: str
) -> None:
    backend = make_backend(expire_finished_after=HOUR)
    run_id = uuid.uuid4()
    populate(backend, run_id)
    backend.cancel()
    assert_all_expire_together(redis_client, run_id, HOUR_MS)
    if how == "reset":
        backend.reset_status_to_running()
    else:
        backend.save_checkpoint(dataclasses.replace(backend.get_checkpoint(),
                                                    status=CheckpointStatus.RUNNING))
    assert backend.get_checkpoint().status is CheckpointStatus.RUNNING
    assert_no_ttl(redis_client, run_id)
    # and it expires again when it finishes again
    finish(backend, run_id, "run_done")
    assert_all_expire_together(redis_client, run_id, HOUR_MS)


def test_resume_by_a_backend_without_the_option_removes_the_ttl(
    make_backend: Factory, redis_client: Any
) -> None:
    writer = make_backend(expire_finished_after=HOUR)
    run_id = uuid.uuid4()
    populate(writer, run_id)
    writer.cancel()
    plain = make_backend()
    assert plain.open_run(run_id) is not None
    plain.reset_status_to_running()
    assert_no_ttl(redis_client, run_id)


def test_a_finished_run_without_ttl_gets_one_at_the_next_write_of_a_backend_with_the_option(
    make_backend: Factory, redis_client: Any
) -> None:
    plain = make_backend()
    run_id = uuid.uuid4()
    populate(plain, run_id)
    plain.cancel()
    assert_no_ttl(redis_client, run_id)
    expiring = make_backend(expire_finished_after=HOUR)
    assert expiring.open_run(run_id) is not None
    expiring.append_event(Log(run_id=run_id, agent_id=None, level=LogLevel.INFO, msg="x"))
    assert_all_expire_together(redis_client, run_id, HOUR_MS)


def test_an_expired_run_keeps_its_cached_checkpoint_and_sync_reports_it_gone(
    make_backend: Factory, redis_client: Any
) -> None:
    """An expiry publishes no notice: a watching cache keeps the final checkpoint; sync()
    asks Redis (the run is finished) and reports None."""
    backend = make_backend(expire_finished_after=dt.timedelta(milliseconds=50))
    run_id = uuid.uuid4()
    populate(backend, run_id)
    finish(backend, run_id, "run_done")
    final = backend.get_checkpoint()
    assert final.status is CheckpointStatus.COMPLETED
    deadline = time.monotonic() + 10
    while redis_client.exists(*key_list(run_id)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert redis_client.exists(*key_list(run_id)) == 0
    assert backend.get_checkpoint() == final  # no notice: the cache keeps what it had
    assert backend.sync() is None


def test_a_malformed_retention_argument_is_refused_before_any_write(redis_client: Any) -> None:
    backend = RedisCheckpointBackend(redis_client, watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")
    before = redis_client.hgetall(run_keys("luft", run_id).run)
    script = redis_client.register_script(script_source("cancel"))
    keys = run_keys("luft", run_id)  # ARGV: the change channel, writer, operation, the slots
    with pytest.raises(redis.exceptions.ResponseError, match="LUFT_BAD_ARG retention option"):
        script(keys=list(keys), args=[keys.changes, "w", "1", "", "soon 0"])
    with pytest.raises(redis.exceptions.ResponseError, match="LUFT_BAD_ARG the fence and"):
        script(keys=list(keys), args=[keys.changes, "w", "1"])  # no option slots
    assert redis_client.hgetall(run_keys("luft", run_id).run) == before


# ---------------------------------------------------------------------------- trimming


def _logs(run_id: uuid.UUID, start: int, n: int) -> list[Any]:
    return [Log(run_id=run_id, agent_id=None, level=LogLevel.INFO, msg=f"m{i}")
            for i in range(start, start + n)]  # fmt: skip


def test_max_events_trims_the_log_and_the_checkpoint_stays_exact(
    make_backend: Factory, redis_client: Any
) -> None:
    writer = make_backend(max_events=20)
    reader = make_backend()  # no option: learns log_trimmed from the notices / a load
    run_id = uuid.uuid4()
    writer.init_run(run_id, "t", "/d")
    assert reader.open_run(run_id) is not None
    agents = [uuid.uuid4() for _ in range(40)]
    n = 0
    for i, agent in enumerate(agents):
        batch = _logs(run_id, n, 9)
        n += 9
        last = AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                         tokens=TokenUsage(input=i, output=1), elapsed_ms=1)  # fmt: skip
        writer.append_events([*batch, last])
    cp = writer.get_checkpoint()
    assert cp.total_tokens == sum(i + 1 for i in range(len(agents)))
    assert set(cp.agent_results) == set(agents)
    loaded = make_backend(watch=False)  # another process loads the same exact checkpoint
    assert loaded.open_run(run_id) == cp

    log = writer.get_event_log()
    assert 20 <= len(log) < 400  # trimmed: "~" keeps at least max_events
    assert log[-1] == last  # the newest events are kept, in order
    assert log[-2] == _logs(run_id, n - 1, 1)[0]
    assert isinstance(log, list)
    assert writer.log_trimmed
    deadline = time.monotonic() + 5
    while not reader.log_trimmed and time.monotonic() < deadline:
        reader.wait_for_change(timeout=0.1)  # the notices carry log_trimmed
    assert reader.log_trimmed
    other = make_backend()
    assert other.open_run(run_id) is not None and other.log_trimmed
    assert retention.log_trimmed(redis_client, "luft", run_id)
    assert redis_client.hget(run_keys("luft", run_id).run, "log_trimmed") == b"1"


def test_log_trimmed_is_false_while_the_log_is_whole(
    make_backend: Factory, redis_client: Any
) -> None:
    trimming = make_backend(max_events=1000)
    run_id = uuid.uuid4()
    trimming.init_run(run_id, "t", "/d")
    trimming.append_events(_logs(run_id, 0, 50))
    assert len(trimming.get_event_log()) == 50
    assert not trimming.log_trimmed
    plain = make_backend()
    other = uuid.uuid4()
    plain.init_run(other, "t", "/d")
    plain.append_events(_logs(other, 0, 300))
    assert len(plain.get_event_log()) == 300 and not plain.log_trimmed
    assert not retention.log_trimmed(redis_client, "luft", other)


def test_a_corrupt_log_trimmed_field_is_reported(redis_client: Any) -> None:
    from luft_redis.errors import CorruptDataError

    backend = RedisCheckpointBackend(redis_client, watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")
    redis_client.hset(run_keys("luft", run_id).run, "log_trimmed", "yes")
    with pytest.raises(CorruptDataError, match="log_trimmed"):
        RedisCheckpointBackend(redis_client, watch=False).open_run(run_id)


# ---------------------------------------------------------------------------- gc


def _server_now(client: Any) -> int:
    if isinstance(client, RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        seconds, _ = client.time(target_nodes=node)
    else:
        seconds, _ = client.time()
    return int(seconds)


@pytest.fixture
def aged_runs(redis_client: Any) -> Iterator[dict[str, uuid.UUID]]:
    """Runs of each status, old (updated 8 days ago) and new, made through the backend; the
    age is set by rewriting updated_at (the only way to be 8 days old in a test)."""
    backend = RedisCheckpointBackend(redis_client, watch=False)
    runs: dict[str, uuid.UUID] = {}
    eight_days_ago = _server_now(redis_client) - 8 * 86400
    for name in ("completed", "failed", "cancelled", "running"):
        for age in ("old", "new"):
            run_id = uuid.uuid4()
            backend.init_run(run_id, name, "/d")
            if name in ("completed", "failed"):
                backend.append_event(RunDone(run_id=run_id, status=RunStatus(name),
                                             total_tokens=TokenUsage()))  # fmt: skip
            elif name == "cancelled":
                backend.cancel()
            if age == "old":  # and its index score, as when it finished 8 days ago
                redis_client.hset(run_keys("luft", run_id).run, "updated_at", eight_days_ago)
                redis_client.zadd(run_index_key("luft"), {str(run_id): eight_days_ago})
            runs[f"{name}-{age}"] = run_id
    yield runs
    backend.close()


def _existing(client: Any, runs: dict[str, uuid.UUID]) -> set[str]:
    return {name for name, rid in runs.items() if client.exists(run_keys("luft", rid).run)}


def test_gc_deletes_exactly_the_old_finished_runs(
    redis_client: Any, aged_runs: dict[str, uuid.UUID]
) -> None:
    report = retention.collect_garbage(redis_client, older_than=dt.timedelta(days=7),
                                       batch_size=2)  # fmt: skip
    old_finished = {"completed-old", "failed-old", "cancelled-old"}
    assert {aged_runs[n] for n in old_finished} == set(report.deleted)
    assert not report.skipped
    assert _existing(redis_client, aged_runs) == set(aged_runs) - old_finished
    for name in old_finished:  # every key of the run went, and its run index entry
        assert redis_client.exists(*key_list(aged_runs[name])) == 0
        assert redis_client.zscore(run_index_key("luft"), str(aged_runs[name])) is None
    for name in set(aged_runs) - old_finished:
        assert redis_client.zscore(run_index_key("luft"), str(aged_runs[name])) is not None


def test_gc_by_status_and_dry_run(redis_client: Any, aged_runs: dict[str, uuid.UUID]) -> None:
    week = dt.timedelta(days=7)
    dry = retention.collect_garbage(redis_client, older_than=week, dry_run=True)
    assert dry.dry_run and not dry.deleted
    assert {r.run_id for r in dry.found} == {
        aged_runs[n] for n in ("completed-old", "failed-old", "cancelled-old")
    }
    assert _existing(redis_client, aged_runs) == set(aged_runs)  # nothing deleted

    report = retention.collect_garbage(redis_client, older_than=week, statuses=["failed"])
    assert report.deleted == [aged_runs["failed-old"]]
    assert _existing(redis_client, aged_runs) == set(aged_runs) - {"failed-old"}

    everything = retention.collect_garbage(redis_client, older_than=dt.timedelta(0))
    assert len(everything.deleted) == 5  # every finished run but failed-old; never running
    assert _existing(redis_client, aged_runs) == {"running-old", "running-new"}


def test_gc_skips_a_run_resumed_after_it_was_found(
    redis_client: Any, aged_runs: dict[str, uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    found = list(retention.iter_finished_runs(redis_client, older_than=dt.timedelta(days=7)))
    resumed = aged_runs["cancelled-old"]
    backend = RedisCheckpointBackend(redis_client, watch=False)
    assert backend.open_run(resumed) is not None
    backend.reset_status_to_running()  # between the SCAN and the delete
    # (collect_garbage looks it up in its own module, the generated one)
    monkeypatch.setattr(sync_retention, "iter_finished_runs", lambda *a, **k: iter(found))
    report = retention.collect_garbage(redis_client, older_than=dt.timedelta(days=7))
    assert report.skipped == [resumed]
    assert resumed not in report.deleted and len(report.deleted) == 2
    assert redis_client.exists(run_keys("luft", resumed).run) == 1


def test_gc_tells_watching_backends_the_run_is_gone(
    redis_client: Any, aged_runs: dict[str, uuid.UUID]
) -> None:
    watcher = RedisCheckpointBackend(redis_client)
    try:
        assert watcher.open_run(aged_runs["completed-old"]) is not None
        retention.collect_garbage(redis_client, older_than=dt.timedelta(days=7))
        assert watcher.wait_for_change(timeout=10)
        assert watcher.sync() is None
    finally:
        watcher.close()


def test_gc_publishes_the_delete_notice_in_the_current_format(
    redis_client: Any, aged_runs: dict[str, uuid.UUID]
) -> None:
    """gc's notice is the delete delta of delete_run (format ``delta.FORMAT``, from the run's
    last incarnation and version, no records), which a cache applies as a delete, not an
    unknown format to reload after."""
    from luft_redis.delta import FORMAT, parse_delta

    keys = run_keys("luft", aged_runs["failed-old"])
    incarnation, version = redis_client.hmget(keys.run, "incarnation", "version")
    if isinstance(redis_client, RedisCluster):  # subscribe on the node that owns the slot
        node = redis_client.get_node_from_key(keys.changes)  # type: ignore[no-untyped-call]
        listener: Any = redis.Redis(host=node.host, port=node.port)
    else:
        listener = redis_client
    pubsub = listener.pubsub()
    try:
        pubsub.ssubscribe(keys.changes)
        assert pubsub.get_sharded_message(timeout=5)["type"] == "ssubscribe"
        report = retention.collect_garbage(redis_client, older_than=dt.timedelta(days=7),
                                           statuses=("failed",))  # fmt: skip
        assert report.deleted == [aged_runs["failed-old"]]
        message = pubsub.get_sharded_message(timeout=5)
    finally:
        pubsub.close()
        if listener is not redis_client:
            listener.close()
    assert message is not None and message["type"] == "smessage", message
    delta = parse_delta(message["data"])
    assert delta.fmt == FORMAT and delta.deleted
    assert (delta.inc_before, delta.v_before) == (incarnation.decode(), int(version))
    assert (delta.inc_after, delta.v_after) == (delta.inc_before, delta.v_before)
    assert delta.records() == []


def _no_scan(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("gc SCANned the keyspace instead of reading the run index")


def test_gc_goes_through_the_index_not_a_scan(
    redis_client: Any, aged_runs: dict[str, uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(redis_client), "scan_iter", _no_scan)
    week = dt.timedelta(days=7)
    found = list(retention.iter_finished_runs(redis_client, older_than=week, batch_size=1))
    old_finished = {aged_runs[n] for n in ("completed-old", "failed-old", "cancelled-old")}
    assert {r.run_id for r in found} == old_finished and len(found) == 3
    report = retention.collect_garbage(redis_client, older_than=week, batch_size=2)
    assert set(report.deleted) == old_finished
    assert _existing(redis_client, aged_runs) == set(aged_runs) - {
        "completed-old", "failed-old", "cancelled-old"}  # fmt: skip


def test_gc_pages_the_index_by_score_while_it_deletes(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many old runs, some sharing one score, read two per batch while collect_garbage
    deletes between batches: every one is found and deleted once."""
    backend = RedisCheckpointBackend(redis_client, watch=False)
    old = _server_now(redis_client) - 8 * 86400
    runs = []
    for i in range(9):
        run_id = uuid.uuid4()
        backend.init_run(run_id, "t", "/d")
        backend.cancel()
        score = old + i // 3  # three runs per second
        redis_client.hset(run_keys("luft", run_id).run, "updated_at", score)
        redis_client.zadd(run_index_key("luft"), {str(run_id): score})
        runs.append(run_id)
    backend.close()
    monkeypatch.setattr(type(redis_client), "scan_iter", _no_scan)
    report = retention.collect_garbage(redis_client, older_than=dt.timedelta(days=7),
                                       batch_size=2)  # fmt: skip
    assert sorted(report.deleted) == sorted(runs) and len(report.deleted) == 9
    assert redis_client.zcard(run_index_key("luft")) == 0


def test_gc_removes_index_entries_of_gone_runs(
    redis_client: Any, aged_runs: dict[str, uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    expired = aged_runs["completed-old"]  # as if its TTL ran out: every key gone, not its entry
    redis_client.delete(*key_list(expired))
    redis_client.zadd(run_index_key("luft"), {"not-a-run-id": 1})
    monkeypatch.setattr(type(redis_client), "scan_iter", _no_scan)
    report = retention.collect_garbage(redis_client, older_than=dt.timedelta(days=7),
                                       dry_run=True)  # fmt: skip
    assert expired not in {r.run_id for r in report.found} and len(report.found) == 2
    members = {m.decode() for m in redis_client.zrange(run_index_key("luft"), 0, -1)}
    assert str(expired) not in members and "not-a-run-id" not in members
    assert members == {str(r) for n, r in aged_runs.items() if n != "completed-old"}


def test_gc_scan_fallback_finds_runs_the_index_lacks(
    redis_client: Any, aged_runs: dict[str, uuid.UUID]
) -> None:
    redis_client.delete(run_index_key("luft"))  # a prefix whose index was never built
    week = dt.timedelta(days=7)
    assert retention.collect_garbage(redis_client, older_than=week, dry_run=True).found == []
    report = retention.collect_garbage(redis_client, older_than=week, use_index=False)
    assert set(report.deleted) == {
        aged_runs[n] for n in ("completed-old", "failed-old", "cancelled-old")}  # fmt: skip


def test_gc_arguments_are_checked(redis_client: Any) -> None:
    with pytest.raises(ValidationError, match="running"):
        retention.collect_garbage(redis_client, older_than=HOUR, statuses=["running"])
    with pytest.raises(ValidationError, match="batch_size"):
        retention.collect_garbage(redis_client, older_than=HOUR, batch_size=0)
    assert retention.parse_duration("7d") == dt.timedelta(days=7)
    assert retention.parse_duration("12h") == dt.timedelta(hours=12)
    assert retention.parse_duration("90") == dt.timedelta(seconds=90)
    with pytest.raises(ValidationError, match="duration"):
        retention.parse_duration("7 days")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "luft_redis", *args], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.parametrize("redis_target", ["redis"], indirect=True)
def test_cli_gc(
    redis_client: Any, aged_runs: dict[str, uuid.UUID], redis_server: LocalRedisServer
) -> None:
    redis_url = redis_server.url
    dry = _cli("gc", "--redis", redis_url, "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert sum(line.startswith("would delete") for line in lines) == 3
    assert str(aged_runs["failed-old"]) in dry.stdout
    assert str(aged_runs["running-old"]) not in dry.stdout
    assert "nothing was deleted" in lines[-1]
    assert _existing(redis_client, aged_runs) == set(aged_runs)

    real = _cli("gc", "--redis", redis_url, "--older-than", "7d", "--status", "completed,failed")
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines()[-1] == "2 run(s) deleted"
    assert _existing(redis_client, aged_runs) == set(aged_runs) - {"completed-old", "failed-old"}

    bad = _cli("gc", "--redis", redis_url, "--older-than", "7d", "--status", "running")
    assert bad.returncode == 2 and "choose among" in bad.stderr
    missing = _cli("gc", "--redis", redis_url)
    assert missing.returncode == 2 and "--older-than" in missing.stderr

    redis_client.delete(run_index_key("luft"))  # never built: only --scan finds the run
    index_only = _cli("gc", "--redis", redis_url, "--older-than", "7d")
    assert index_only.stdout.splitlines()[-1] == "0 run(s) deleted"
    scan = _cli("gc", "--redis", redis_url, "--older-than", "7d", "--scan")
    assert scan.returncode == 0, scan.stderr
    assert scan.stdout.splitlines()[-1] == "1 run(s) deleted"
    assert _existing(redis_client, aged_runs) == {"completed-new", "failed-new",
                                                  "cancelled-new", "running-old", "running-new"}
    assert "--rebuild-index" in _cli("gc", "--help").stdout


# ---------------------------------------------------------------------------- doctor


def test_doctor_reports_memory_per_run_and_finished_runs_without_ttl(
    redis_client: Any, redis_target: str
) -> None:
    plain = RedisCheckpointBackend(redis_client, watch=False)
    expiring = RedisCheckpointBackend(redis_client, watch=False, expire_finished_after=HOUR)
    for backend, n in ((plain, 2), (expiring, 3)):
        for _ in range(n):
            run_id = uuid.uuid4()
            populate(backend, run_id)
            backend.cancel()
    populate(plain, uuid.uuid4())  # running: never counted
    checks = {c.name: c for c in check_runs(redis_client, "luft")}
    assert checks["runs-without-ttl"].level == "warn"
    assert "2 of 5 finished run(s)" in checks["runs-without-ttl"].message
    assert "6 run(s)" in checks["runs-without-ttl"].message
    memory = checks["run-memory"]
    if redis_target == "fakeredis" and memory.level == "unknown":
        assert "MEMORY USAGE" in memory.message  # fakeredis may not know the command
    else:
        assert memory.level == "ok"
        assert "per run on average over 6 sampled run(s)" in memory.message


def test_doctor_runs_all_expiring_is_ok(redis_client: Any) -> None:
    backend = RedisCheckpointBackend(redis_client, watch=False, expire_finished_after=HOUR)
    run_id = uuid.uuid4()
    populate(backend, run_id)
    backend.cancel()
    checks = {c.name: c for c in check_runs(redis_client, "luft", sample=1)}
    assert checks["runs-without-ttl"].level == "ok"
    assert "1 finished of 1 run(s)" in checks["runs-without-ttl"].message
    empty = {c.name: c for c in check_runs(redis_client, "other")}
    assert empty["run-memory"].message == "no runs under prefix 'other'"


@pytest.mark.parametrize("redis_target", ["redis"], indirect=True)
def test_cli_doctor_prints_the_run_checks(
    redis_client: Any, redis_server: LocalRedisServer
) -> None:
    redis_url = redis_server.url
    backend = RedisCheckpointBackend(redis_client, watch=False)
    run_id = uuid.uuid4()
    populate(backend, run_id)
    backend.cancel()
    done = _cli("doctor", "--redis", redis_url)
    assert done.returncode in (0, 1), done.stderr  # the private server is not persistent
    assert "run-memory" in done.stdout and "per run on average over 1 sampled" in done.stdout
    line = next(x for x in done.stdout.splitlines() if "runs-without-ttl" in x)
    assert line.startswith("WARN") and "1 of 1 finished run(s)" in line
    report = check_server(redis_client, prefix="luft")
    assert {"run-memory", "runs-without-ttl"} <= {c.name for c in report.checks}


@pytest.mark.parametrize("redis_target", ["redis"], indirect=True)
def test_cli_show_prints_log_trimmed(
    redis_client: Any, redis_server: LocalRedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from luft_redis.tools import cli

    trimming = RedisCheckpointBackend(redis_client, watch=False, max_events=10)
    trimmed, whole = uuid.uuid4(), uuid.uuid4()
    trimming.init_run(trimmed, "t", "/d")
    trimming.append_events(_logs(trimmed, 0, 300))
    trimming.init_run(whole, "t", "/d")
    trimming.append_events(_logs(whole, 0, 5))
    assert cli.main(["show", str(trimmed), "--redis", redis_server.url, "--events", "0"]) == 0
    assert re.search(r"log_trimmed:\s+True", capsys.readouterr().out)
    assert cli.main(["show", str(whole), "--redis", redis_server.url, "--json"]) == 0
    assert '"log_trimmed": false' in capsys.readouterr().out
