"""The run field ``agents``: distinct agents that started or have a result, kept by the
scripts, shown by ``luft-redis runs`` (``index.read_page``) in one read per run; on every
target (fakeredis, a real redis-server, a cluster)."""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import redis
from redis.cluster import RedisCluster

from luft_redis import RedisCheckpointBackend, interop
from luft_redis import types as t
from luft_redis._sync import index as index_io
from luft_redis.keys import run_keys

Client = redis.Redis | RedisCluster


def started(run_id: uuid.UUID, agent: uuid.UUID, phase: int = 0) -> t.AgentStarted:
    return t.AgentStarted(run_id=run_id, phase_id=phase, agent_id=agent, prompt_preview="p")


def done(run_id: uuid.UUID, agent: uuid.UUID, tokens: int = 10) -> t.AgentDone:
    return t.AgentDone(run_id=run_id, agent_id=agent, status=t.AgentStatus.OK,
                       tokens=t.TokenUsage(input=tokens), elapsed_ms=1)  # fmt: skip


def result(agent: uuid.UUID) -> t.AgentResultCache:
    return t.AgentResultCache(agent_id=agent, phase_id=0, status="ok", output=None,
                              findings=(), tokens=1, completed_at=1)  # fmt: skip


def truth(backend: RedisCheckpointBackend) -> int:
    cp = backend.get_checkpoint()
    assert cp is not None
    return len(set(cp.started_agent_ids) | set(cp.agent_results))


def shown(client: Client, run_id: uuid.UUID) -> int:
    """What ``luft-redis runs`` shows for the run."""
    rows = [r for r in index_io.read_page(client, "luft", limit=500).rows if r.run_id == run_id]
    assert len(rows) == 1
    return rows[0].agents


def stored(client: Client, run_id: uuid.UUID) -> bytes | None:
    raw: Any = client.hget(run_keys("luft", run_id).run, "agents")
    return raw  # type: ignore[no-any-return]


def new_run(client: Client) -> tuple[RedisCheckpointBackend, uuid.UUID]:
    backend = RedisCheckpointBackend(client)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "d")
    return backend, run_id


def test_results_without_agent_started_count(redis_client: Client) -> None:
    """The asyncio quickstart's run: 10 ok results, no agent_started event."""
    backend, run_id = new_run(redis_client)
    assert shown(redis_client, run_id) == 0
    for _ in range(10):
        backend.append_event(done(run_id, uuid.uuid4()))
    assert shown(redis_client, run_id) == 10 == truth(backend)
    backend.close()


def test_an_agent_that_started_and_has_a_result_counts_once(redis_client: Client) -> None:
    backend, run_id = new_run(redis_client)
    a, b, c, d, e = (uuid.uuid4() for _ in range(5))
    backend.append_event(started(run_id, a))
    backend.append_event(done(run_id, a))  # started, then its result
    backend.append_event(done(run_id, b))
    backend.append_event(started(run_id, b))  # result, then started
    backend.append_events([started(run_id, c), done(run_id, c), done(run_id, d),
                           started(run_id, d, 1), started(run_id, c, 2)])  # one batch
    backend.append_event(done(run_id, a))  # reported again
    backend.upsert_agent_result(result(a))  # a result for a started agent
    assert shown(redis_client, run_id) == 4 == truth(backend)
    backend.upsert_agent_result(result(e))  # a result of an agent never seen
    backend.upsert_agent_result(result(e))
    assert shown(redis_client, run_id) == 5 == truth(backend)
    # the cache of another process follows the same writes (the R record is harmless to it)
    other = RedisCheckpointBackend(redis_client)
    assert other.open_run(run_id) == backend.get_checkpoint()
    other.close()
    backend.close()


def test_save_checkpoint_recounts(redis_client: Client) -> None:
    backend, run_id = new_run(redis_client)
    a, b, c, d = (uuid.uuid4() for _ in range(4))
    for agent in (a, b, c, d):
        backend.append_event(done(run_id, agent))
    cp = backend.get_checkpoint()
    assert cp is not None
    # the state replaced wholesale: a and b started, b and c with a result (d is gone)
    saved = dataclasses.replace(
        cp, started_agent_ids=(a, b),
        agent_results={b: cp.agent_results[b], c: cp.agent_results[c]},
    )  # fmt: skip
    backend.save_checkpoint(saved)
    assert shown(redis_client, run_id) == 3 == truth(backend)
    backend.append_event(done(run_id, a))  # started, now with a result: no new agent
    backend.append_event(started(run_id, d))
    assert shown(redis_client, run_id) == 4 == truth(backend)
    backend.close()


def test_an_import_counts_the_agents_of_its_checkpoint(redis_client: Client) -> None:
    backend, run_id = new_run(redis_client)
    a, b, c = (uuid.uuid4() for _ in range(3))
    backend.append_events([started(run_id, a), done(run_id, b), started(run_id, c),
                           done(run_id, c)])  # fmt: skip
    cp = backend.get_checkpoint()
    assert cp is not None
    events = list(backend.get_event_log())
    backend.close()
    interop.import_run(redis_client, cp, events, replace=True)
    assert shown(redis_client, run_id) == 3
    fresh = RedisCheckpointBackend(redis_client)
    assert fresh.open_run(run_id) is not None
    assert truth(fresh) == 3
    fresh.close()


def test_a_run_written_before_the_field_falls_back_then_is_counted(
    redis_client: Client,
) -> None:
    """A run of an older version has no ``agents``: ``runs`` shows its started agents, and
    its first write that adds an agent counts them all from the hashes."""
    backend, run_id = new_run(redis_client)
    a, b, c = (uuid.uuid4() for _ in range(3))
    backend.append_events([started(run_id, a), done(run_id, b), done(run_id, c)])
    redis_client.hdel(run_keys("luft", run_id).run, "agents")  # as an older version left it
    assert shown(redis_client, run_id) == 1  # the old way: HLEN started
    backend.append_event(t.Log(run_id=run_id, level=t.LogLevel.INFO, msg="no new agent"))
    assert stored(redis_client, run_id) is None
    backend.append_event(done(run_id, uuid.uuid4()))
    assert stored(redis_client, run_id) == b"4"
    assert shown(redis_client, run_id) == 4 == truth(backend)
    redis_client.hdel(run_keys("luft", run_id).run, "agents")
    backend.upsert_agent_result(result(uuid.uuid4()))
    assert shown(redis_client, run_id) == 5 == truth(backend)
    backend.close()


def test_random_operations_keep_the_count(redis_client: Client) -> None:
    """Random batches of starts, results, upserts and saves over a small pool of agents: the
    field always equals the distinct agents of the checkpoint."""
    rng = random.Random(20)
    backend, run_id = new_run(redis_client)
    pool = [uuid.uuid4() for _ in range(8)]
    for _ in range(40):
        op = rng.choice(["events", "events", "upsert", "save"])
        if op == "events":
            batch = [started(run_id, rng.choice(pool)) if rng.random() < 0.5
                     else done(run_id, rng.choice(pool)) for _ in range(rng.randint(1, 4))]
            backend.append_events(batch)
        elif op == "upsert":
            backend.upsert_agent_result(result(rng.choice(pool)))
        else:
            cp = backend.get_checkpoint()
            assert cp is not None
            keep = {k: v for k, v in cp.agent_results.items() if rng.random() < 0.7}
            ids = tuple(a for a in cp.started_agent_ids if rng.random() < 0.7)
            backend.save_checkpoint(dataclasses.replace(cp, agent_results=keep,
                                                        started_agent_ids=ids))
        assert shown(redis_client, run_id) == truth(backend), op
    backend.close()
