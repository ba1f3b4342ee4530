"""Calling the Functions library: FCALL, loading the library on a miss; the run index's writes.

The front ends and the tools that run a library function outside a backend
(:mod:`luft_redis.interop`'s restore, :mod:`luft_redis.retention`'s gc) go through
:func:`call_function`: one round trip when the library is loaded; on "Function not found" (a
new node, a flushed or restarted server, a failover), ``FUNCTION LOAD REPLACE`` on that node and
the FCALL once more. On Redis Cluster the call goes straight to the run's slot owner
(:func:`luft_redis.scripts.cluster_route`), and a client loads the library on every primary
before its first call.

:func:`index_add` and :func:`index_remove` keep the run index (:mod:`luft_redis.index`) after a
lifecycle change: retried like any write, and logged, not raised, when they still fail (the
script is what counts; ``luft-redis runs --rebuild-index`` repairs the index).

This is the hand-written asyncio source; :mod:`luft_redis.fcall` is generated from it
(see :mod:`luft_redis.runtime`).
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import redis.exceptions

from ..cluster import async_raise_lost_redirect
from ..connect import is_cluster
from ..index import warn_index_failure
from ..keys import run_index_key
from ..retry import REDIS_ERRORS, RetryPolicy, is_function_missing
from ..runtime import async_cluster_ready
from ..scripts import Function, cluster_route, library

__all__ = ["call_function", "index_add", "index_remove", "prime_cluster"]

logger = logging.getLogger(__name__)

_PRIMED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The RedisCluster clients that loaded the library on every primary."""


async def prime_cluster(client: Any) -> None:
    """Load the library on every primary, once per client (a node added or promoted later
    gets it on its first "Function not found")."""
    lib = library()
    _PRIMED.add(client)
    try:
        await client.execute_command(*lib.load_command, target_nodes=client.get_primaries())
    except REDIS_ERRORS as exc:
        logger.info("loading %s on every primary failed (%s); each node loads it on its "
                    "first miss", lib.name, exc)  # fmt: skip


async def call_function(client: Any, fn: Function, keys: Sequence[Any], args: Sequence[Any],
                        *, cluster: bool | None = None) -> Any:  # fmt: skip
    """One attempt of ``fn`` on ``client``; redis-py's exceptions pass through (the caller
    retries and translates them)."""
    lib = library()
    command = fn.command(keys, args)
    if not (is_cluster(client) if cluster is None else cluster):
        try:
            return await client.execute_command(*command)
        except redis.exceptions.ResponseError as exc:
            if not is_function_missing(exc):
                raise
        logger.info("loading the Redis Functions library %s", lib.name)
        await client.execute_command(*lib.load_command)
        return await client.execute_command(*command)
    await async_cluster_ready(client)
    if client not in _PRIMED:
        await prime_cluster(client)
    try:
        return await client.execute_command(*command, **cluster_route(client, keys))
    except redis.exceptions.ResponseError as exc:
        route = cluster_route(client, keys)
        if not route or not is_function_missing(exc):  # no node known to load it on
            raise
    except AttributeError as exc:  # redirected to a node redis-py does not know: a reshard
        await async_raise_lost_redirect(client, exc, lib.load_command)  # TopologyChanged
        raise
    logger.info("loading the Redis Functions library %s on %s", lib.name,
                route["target_nodes"].name)  # fmt: skip
    await client.execute_command(*lib.load_command, **route)
    return await client.execute_command(*command, **route)


async def index_add(client: Any, retry: RetryPolicy, prefix: str, run_id: uuid.UUID,
                    score: float) -> None:  # fmt: skip
    """ZADD the run to the run index (retried; a failure is logged)."""
    key = run_index_key(prefix)
    try:
        await retry.acall(lambda: client.zadd(key, {str(run_id): score}))
    except Exception as exc:
        warn_index_failure("update", prefix, run_id, exc)


async def index_remove(client: Any, retry: RetryPolicy, prefix: str, run_id: uuid.UUID) -> None:
    """ZREM the run from the run index (retried; a failure is logged)."""
    key = run_index_key(prefix)
    try:
        await retry.acall(lambda: client.zrem(key, str(run_id)))
    except Exception as exc:
        warn_index_failure("removal", prefix, run_id, exc)
