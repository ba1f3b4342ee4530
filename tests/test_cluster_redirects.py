"""luft_redis/cluster.py without a server: recognising redis-py's lost redirect, reading
``CLUSTER NODES``, and what the retry policy and the error mapping make of it. The live
reshard itself is ``tests/test_cluster_reshard.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions

from luft_redis import cluster
from luft_redis._sync import fcall
from luft_redis.asyncio import fcall as async_fcall
from luft_redis.errors import BackendError
from luft_redis.retry import RetryPolicy, is_transient
from luft_redis.scripts import translate_error


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def test_the_sync_client_failure_is_recognised() -> None:
    """What redis-py's sync RedisCluster raises when an ASK names a node missing from its node
    table: get_redis_connection(None) (redis/cluster.py)."""
    exc = _raised(lambda: redis.cluster.RedisCluster.get_redis_connection(object(), None))  # type: ignore[arg-type]
    assert isinstance(exc, AttributeError) and "redis_connection" in str(exc)
    assert cluster.is_lost_redirect(exc)


def test_the_asyncio_client_failure_is_recognised() -> None:
    """redis.asyncio's twin: recording a metric for the missing node (``connection_kwargs``
    of None), which hides the first AttributeError."""

    async def record() -> None:
        await redis.asyncio.cluster.RedisCluster._record_command_metric(
            object(), "FCALL", 0.0, None)  # type: ignore[arg-type]  # fmt: skip

    exc = _raised(lambda: asyncio.run(record()))
    assert isinstance(exc, AttributeError) and "connection_kwargs" in str(exc)
    assert cluster.is_lost_redirect(exc)


def test_other_attribute_errors_are_not_taken_for_it() -> None:
    none: Any = None
    mine = _raised(lambda: none.redis_connection)  # on None, but not inside redis-py
    assert isinstance(mine, AttributeError) and not cluster.is_lost_redirect(mine)
    assert not cluster.is_lost_redirect(AttributeError("redis_connection"))  # never raised
    assert not cluster.is_lost_redirect(redis.exceptions.TryAgainError("TRYAGAIN"))
    other = _raised(lambda: redis.cluster.RedisCluster.get_redis_connection(object(), 5))  # type: ignore[arg-type]
    assert isinstance(other, AttributeError) and not cluster.is_lost_redirect(other)


NODES = """\
07c3 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003,host-3 master - 0 1426238318243 3 connected 10923-16383 [93->-e7d1]
e7d1 127.0.0.1:30007@40007 master - 0 1426238317741 7 connected [93-<-292f]
6ec2 127.0.0.1:30004@40004 slave 07c3 0 1426238316232 1 connected
dead 127.0.0.1:30005@40005 master,fail - 0 1426238316232 5 disconnected
hand 127.0.0.1:30006@40006 master,handshake - 0 0 0 connected
addr :0@0 master,noaddr - 0 0 0 disconnected
"""


def test_cluster_nodes_gives_every_reachable_primary_slotless_ones_included() -> None:
    assert cluster._primaries(NODES) == [
        ("127.0.0.1", 30001), ("127.0.0.1", 30002), ("127.0.0.1", 30003), ("127.0.0.1", 30007),
    ]  # fmt: skip
    assert cluster._primaries(NODES.encode()) == cluster._primaries(NODES)


def test_topology_changed_is_transient_then_a_typed_error() -> None:
    """The retry policy calls again after TopologyChanged; past its attempts, the error the
    front end raises is a LuftRedisError saying what happened."""
    changed = cluster.TopologyChanged("redirected to a node not known yet")
    assert is_transient(changed)
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise changed

    with pytest.raises(cluster.TopologyChanged):
        RetryPolicy(max_attempts=3, deadline=5.0, initial_delay=0.001).call(attempt)
    assert len(calls) == 3
    typed = translate_error(changed)
    assert isinstance(typed, BackendError) and "not known yet" in str(typed)


def test_the_hook_passes_other_attribute_errors_through() -> None:
    """raise_lost_redirect (both front ends) returns (the caller re-raises) for an
    AttributeError that is not redis-py's, without touching the client."""
    none: Any = None
    exc = _raised(lambda: none.redis_connection)
    assert isinstance(exc, AttributeError)
    fcall.raise_lost_redirect(object(), exc)
    asyncio.run(async_fcall.raise_lost_redirect(object(), exc))


def test_a_slot_that_stays_unsettled_is_named_in_the_final_error() -> None:
    """redis-py's own give-up after TRYAGAIN/ASK/MOVED (``TTL exhausted``) becomes a
    BackendError that says a slot was being migrated."""
    typed = translate_error(redis.exceptions.ClusterError("TTL exhausted."))
    assert isinstance(typed, BackendError)
    assert "slot is being migrated" in str(typed) and "TTL exhausted" in str(typed)
