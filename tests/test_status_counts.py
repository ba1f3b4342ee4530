"""Issue 19: the runs page's counts kept where one read finds them.

- per run, the run fields ``agents_ok`` and ``agents_failed`` (running = agents - ok - failed),
  kept by every script that sets a result's status (append_events, upsert_agent_result,
  save_checkpoint, init_run; lua/includes/run.lua ``status_count_fields``);
- per prefix, the runs by status next to the run index (``lua/index_status-3.lua``, by every
  index write: :mod:`luft_redis.index`).

A run written by an older version (no counters) shows correct counts, counted from its results
and marked so; corrupt counters are reported, never defaulted. On every target (fakeredis, a
real redis-server, a cluster)."""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis import AgentTask, RedisCheckpointBackend, index
from luft_redis import types as t
from luft_redis._sync import index as index_io
from luft_redis._sync.fcall import call_function
from luft_redis.errors import CorruptDataError
from luft_redis.keys import run_index_key, run_keys
from luft_redis.scripts import library

Client = redis.Redis | RedisCluster
PREFIX = "luft"


def started(run_id: uuid.UUID, agent: uuid.UUID) -> t.AgentStarted:
    return t.AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="p")


def done(run_id: uuid.UUID, agent: uuid.UUID, ok: bool = True) -> t.AgentDone:
    return t.AgentDone(run_id=run_id, agent_id=agent,
                       status=t.AgentStatus.OK if ok else t.AgentStatus.ERROR,
                       tokens=t.TokenUsage(input=1), elapsed_ms=1)  # fmt: skip


def result(agent: uuid.UUID, status: str) -> t.AgentResultCache:
    return t.AgentResultCache(agent_id=agent, phase_id=0, status=status, output=None,
                              findings=(), tokens=1, completed_at=1)  # fmt: skip


def truth(backend: RedisCheckpointBackend) -> tuple[int, int, int]:
    """(ok, failed, running) as the run page computes them from the checkpoint."""
    cp = backend.get_checkpoint()
    assert cp is not None
    agents = set(cp.started_agent_ids) | set(cp.agent_results)
    ok = sum(r.status == "ok" for r in cp.agent_results.values())
    failed = len(cp.agent_results) - ok
    return ok, failed, len(agents) - ok - failed


def row_of(client: Client, run_id: uuid.UUID) -> index.IndexRow:
    rows = [r for r in index_io.read_page(client, PREFIX, limit=500).rows if r.run_id == run_id]
    assert len(rows) == 1
    return rows[0]


def shown(client: Client, run_id: uuid.UUID) -> tuple[int | None, int | None, int | None]:
    row = row_of(client, run_id)
    return row.agents_ok, row.agents_failed, row.agents_running


def stored(client: Client, run_id: uuid.UUID) -> list[Any]:
    raw: Any = client.hmget(run_keys(PREFIX, run_id).run, ["agents_ok", "agents_failed"])
    return list(raw)


def new_run(client: Client) -> tuple[RedisCheckpointBackend, uuid.UUID]:
    backend = RedisCheckpointBackend(client, prefix=PREFIX)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "d")
    return backend, run_id


def test_every_status_change_keeps_the_counters(redis_client: Client) -> None:
    """A random mix of the writes that set a result's status (events one by one and in
    batches, results, a save_checkpoint, fenced writes of a lease): the stored counters always
    equal what the checkpoint says, and read_page shows them without counting."""
    rng = random.Random(19)
    backend, run_id = new_run(redis_client)
    assert stored(redis_client, run_id) == [b"0", b"0"]
    agents = [uuid.uuid4() for _ in range(12)]
    for step in range(60):
        a = rng.choice(agents)
        kind = rng.randrange(6)
        if kind == 0:
            backend.append_event(started(run_id, a))
        elif kind == 1:
            backend.append_event(done(run_id, a, ok=rng.random() < 0.6))
        elif kind == 2:
            b = rng.choice(agents)
            backend.append_events([started(run_id, a), done(run_id, a, ok=False),
                                   done(run_id, b), done(run_id, a)])  # fmt: skip
        elif kind == 3:
            backend.upsert_agent_result(result(a, rng.choice(["ok", "error", "timed_out"])))
        elif kind == 4 and step % 10 == 0:
            cp = backend.get_checkpoint()
            assert cp is not None
            keep = dict(list(cp.agent_results.items())[: len(cp.agent_results) // 2])
            backend.save_checkpoint(dataclasses.replace(cp, agent_results=keep))
        else:
            backend.append_event(t.Log(run_id=run_id, level=t.LogLevel.INFO, msg="x"))
        ok, failed, _ = truth(backend)
        assert stored(redis_client, run_id) == [str(ok).encode(), str(failed).encode()], step
    assert shown(redis_client, run_id) == truth(backend)
    assert row_of(redis_client, run_id).counted is False
    # fenced: a lease's failed agent_done, then its retry's ok one
    task = uuid.uuid4()
    backend.submit_agents([AgentTask(task, 0, {"p": 1})])
    lease = backend.claim_agent("w", lease_for=60)
    assert lease is not None
    backend.append_event(done(run_id, task, ok=False), lease=lease)
    assert shown(redis_client, run_id) == truth(backend)
    lease = backend.claim_agent("w", lease_for=60)
    assert lease is not None and lease.agent_id == task
    backend.append_event(done(run_id, task), lease=lease)
    backend.upsert_agent_result(result(task, "ok"), lease=lease)
    assert shown(redis_client, run_id) == truth(backend)
    # another process's cache follows the same writes (the R records are harmless to it)
    other = RedisCheckpointBackend(redis_client, prefix=PREFIX)
    assert other.open_run(run_id) == backend.get_checkpoint()
    other.close()
    backend.close()


def test_a_run_of_an_older_version_is_counted_once_then_kept(redis_client: Client) -> None:
    backend, run_id = new_run(redis_client)
    a, b, c, d = (uuid.uuid4() for _ in range(4))
    backend.append_events([started(run_id, a), done(run_id, b), done(run_id, c, ok=False),
                           started(run_id, d)])  # fmt: skip
    redis_client.hdel(run_keys(PREFIX, run_id).run, "agents_ok", "agents_failed")  # as before
    row = row_of(redis_client, run_id)
    assert (row.agents_ok, row.agents_failed, row.agents_running) == (1, 1, 2) == truth(backend)
    assert row.counted is True
    # a write that changes no status leaves the run as it was (still counted on read)
    backend.append_event(started(run_id, uuid.uuid4()))
    assert stored(redis_client, run_id) == [None, None]
    assert shown(redis_client, run_id) == truth(backend)
    # the first status change counts the results once and keeps the counters from then on
    backend.append_event(done(run_id, a))
    assert stored(redis_client, run_id) == [b"2", b"1"]
    assert shown(redis_client, run_id) == truth(backend)
    assert row_of(redis_client, run_id).counted is False
    backend.close()


@pytest.mark.parametrize("field, value", [("agents_ok", b"many"), ("agents_failed", None)])
def test_corrupt_counters_are_reported_never_defaulted(
    redis_client: Client, field: str, value: bytes | None,
) -> None:  # fmt: skip
    backend, run_id = new_run(redis_client)
    a = uuid.uuid4()
    backend.append_event(done(run_id, a))
    key = run_keys(PREFIX, run_id).run
    if value is None:
        redis_client.hdel(key, field)  # one counter without its twin
    else:
        redis_client.hset(key, field, value)
    row = row_of(redis_client, run_id)
    assert row.agents_ok is None and row.agents_running is None
    assert row.problem is not None and field in row.problem
    version = redis_client.hget(key, "version")
    with pytest.raises(CorruptDataError):
        backend.append_event(done(run_id, uuid.uuid4(), ok=False))
    with pytest.raises(CorruptDataError):
        backend.upsert_agent_result(result(a, "error"))
    assert redis_client.hget(key, "version") == version  # nothing written
    # a count below what it counts is corrupt too
    redis_client.hset(key, mapping={"agents_ok": "0", "agents_failed": "0"})
    with pytest.raises(CorruptDataError):
        backend.upsert_agent_result(result(a, "error"))
    backend.close()


def _counts(client: Client) -> dict[str, int]:
    found = index_io.read_counts(client, PREFIX)
    assert found.exact
    assert found.counts == index_io.count_over_index(client, PREFIX)
    return {k: v for k, v in found.counts.items() if v}


def test_runs_by_status_are_kept_next_to_the_index(redis_client: Client) -> None:
    runs = [new_run(redis_client) for _ in range(5)]
    assert _counts(redis_client) == {"running": 5}
    (b0, r0), (b1, r1), (b2, _r2), (b3, r3), _ = runs
    b0.cancel()
    b1.append_event(t.RunDone(run_id=r1, status=t.RunStatus.COMPLETED, total_tokens=t.TokenUsage()))
    b2.cancel()
    assert _counts(redis_client) == {"running": 2, "cancelled": 2, "completed": 1}
    b0.cancel()  # again: nothing changes
    b2.reset_status_to_running()
    b3.delete_run(r3)
    assert _counts(redis_client) == {"running": 2, "cancelled": 1, "completed": 1}
    # a run that expired (its keys gone): the first page that finds it gone drops its count
    for key in run_keys(PREFIX, r0):
        redis_client.delete(key)
    page = index_io.read_page(redis_client, PREFIX, limit=50)
    assert page.gone == 1
    assert _counts(redis_client) == {"running": 2, "completed": 1}
    for backend, _ in runs:
        backend.close()


def test_an_older_read_never_overwrites_a_newer_status(redis_client: Client) -> None:
    """Two processes index one run at once: the status read last but older loses."""
    backend, run_id = new_run(redis_client)
    backend.cancel()
    now: Any = redis_client.hmget(run_keys(PREFIX, run_id).run, list(index.STATUS_FIELDS))
    stale = index.status_args(run_id, [b"running", now[1], b"1", now[3]])
    assert stale is not None
    index_status = library().ops.index_status
    assert call_function(redis_client, index_status, index.script_keys(PREFIX), stale) == 0
    assert _counts(redis_client) == {"cancelled": 1}
    backend.close()


def test_runs_indexed_by_an_older_version_are_counted_and_said_so(redis_client: Client) -> None:
    backend, _run_id = new_run(redis_client)
    old, old_id = new_run(redis_client)
    old.cancel()
    # as an older version left it: in the index, without a kept status
    redis_client.hdel(index.run_status_key(PREFIX), str(old_id))
    redis_client.hincrby(index.status_counts_key(PREFIX), "cancelled", -1)
    found = index_io.read_counts(redis_client, PREFIX)
    assert not found.exact and found.unkept == 1
    assert found.counts["running"] == 1 and found.counts["cancelled"] == 1
    assert index_io.read_counts(redis_client, PREFIX, count=False).counts == {}
    assert index_io.rebuild(redis_client, PREFIX) == (2, 0)
    assert _counts(redis_client) == {"running": 1, "cancelled": 1}
    # corrupt counts are reported
    redis_client.hset(index.status_counts_key(PREFIX), "running", "x")
    with pytest.raises(CorruptDataError):
        index_io.read_counts(redis_client, PREFIX)
    redis_client.hset(index.status_counts_key(PREFIX), "running", "5")
    with pytest.raises(CorruptDataError):
        index_io.read_counts(redis_client, PREFIX)
    assert redis_client.zcard(run_index_key(PREFIX)) == 2
    backend.close()
    old.close()
