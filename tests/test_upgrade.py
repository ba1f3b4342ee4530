"""Mixed versions during a rolling upgrade: runs and notices written by luft-redis 0.1.0.

0.1.0 stored no ``incarnation`` in the run hash and published notices without a format part
(their first netstring is the run's version). A new process reads such a run as it is, gives
it an incarnation at its next write, and treats an old notice as "something changed that I
cannot read": it reloads through ``load``, which reads every format. Runs on fakeredis and on a
real redis-server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeAlias

import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis import (
    AgentDone,
    AgentStatus,
    RedisCheckpointBackend,
    RunCheckpoint,
    TokenUsage,
)

Client: TypeAlias = "redis.Redis | RedisCluster"
Factory: TypeAlias = Callable[..., RedisCheckpointBackend]

TARGETS = ["fakeredis", "redis"]


def eventually(predicate: Callable[[], bool], bound: float = 5.0) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def fresh_load(make_backend: Factory, run_id: uuid.UUID) -> RunCheckpoint:
    checkpoint = make_backend(watch=False).open_run(run_id)
    assert checkpoint is not None
    return checkpoint


def done(run_id: uuid.UUID, tokens: int) -> AgentDone:
    return AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                     tokens=TokenUsage(input=tokens), elapsed_ms=1)  # fmt: skip


def make_old_run(redis_client: Client, make_backend: Factory) -> uuid.UUID:
    """A run as 0.1.0 left it: no incarnation field in the run hash."""
    run_id = uuid.uuid4()
    creator = make_backend(watch=False)
    creator.init_run(run_id, "old run", "/old")
    creator.append_event(done(run_id, 3))
    assert creator.keys is not None
    redis_client.hdel(creator.keys.run, "incarnation")
    creator.close()
    return run_id


@pytest.mark.parametrize("redis_target", TARGETS)
def test_a_run_without_incarnation_is_read_and_gets_one_at_its_next_write(
    redis_client: Client, make_backend: Factory
) -> None:
    run_id = make_old_run(redis_client, make_backend)
    watcher, writer = make_backend(), make_backend()
    assert watcher.open_run(run_id) == fresh_load(make_backend, run_id)
    assert writer.open_run(run_id) is not None
    keys = writer.keys
    assert keys is not None and redis_client.hget(keys.run, "incarnation") is None

    writer.append_event(done(run_id, 4))
    incarnation = redis_client.hget(keys.run, "incarnation")
    assert incarnation  # set by that write, <writer id>-<operation number>
    assert writer.get_checkpoint() == fresh_load(make_backend, run_id)
    assert eventually(lambda: watcher.get_checkpoint() == writer.get_checkpoint())
    assert eventually(lambda: watcher.cache_is_fresh)
    cp = watcher.get_checkpoint()
    assert cp is not None and cp.total_tokens == 7

    writer.append_event(done(run_id, 5))  # later writes keep that incarnation
    assert redis_client.hget(keys.run, "incarnation") == incarnation
    assert eventually(lambda: watcher.get_checkpoint() == fresh_load(make_backend, run_id))


@pytest.mark.parametrize("redis_target", TARGETS)
def test_an_old_format_notice_makes_watchers_reload(
    redis_client: Client, make_backend: Factory
) -> None:
    """A 0.1.0 process writes (emulated: the run changes behind the watcher's back and a
    notice in the old format arrives): the watcher cannot read it, stops vouching and reloads."""
    run_id = uuid.uuid4()
    owner = make_backend()
    owner.init_run(run_id, "mixed fleet", "/mixed")
    watcher = make_backend()
    watcher.open_run(run_id)
    assert eventually(lambda: watcher.cache_is_fresh)
    keys = watcher.keys
    assert keys is not None
    # what a 0.1.0 cancel did: status and version in the run hash, then its notice
    version = int(redis_client.hget(keys.run, "version") or 0) + 1
    redis_client.hset(keys.run, mapping={"status": "cancelled", "version": str(version)})
    parts = (b"%d" % version, b"1", b"c", b"cancelled")  # version, time, op, status
    old_notice = b"".join(b"%d:%s" % (len(p), p) for p in parts)
    redis_client.spublish(keys.changes, old_notice)
    assert eventually(lambda: watcher.get_checkpoint() == fresh_load(make_backend, run_id))
    cp = watcher.get_checkpoint()
    assert cp is not None and cp.status.value == "cancelled"
    assert eventually(lambda: watcher.cache_is_fresh)
