"""Calling the Functions library: FCALL, loading the library on a miss; the run index's writes.

The front ends and the tools that run a library function outside a backend
(:mod:`luft_redis.interop`'s restore, :mod:`luft_redis.retention`'s gc) go through
:func:`call_function`: one round trip when the library is loaded; on "Function not found" (a
new node, a flushed or restarted server, a failover), ``FUNCTION LOAD REPLACE`` on that node and
the FCALL once more. On Redis Cluster the call goes straight to the run's slot owner
(:func:`luft_redis.scripts.cluster_route`), and a client loads the library on every primary
before its first call.

:func:`index_add` and :func:`index_remove` keep the run index (:mod:`luft_redis.index`), and
the status counts next to it, after a lifecycle change: retried like any write, and logged,
not raised, when they still fail (the script is what counts; ``luft-redis runs
--rebuild-index`` repairs the index).

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

from ..cluster import (
    async_add_node,
    async_cluster_nodes,
    is_lost_redirect,
    loaded_nodes,
    missing_primaries,
    topology_changed,
)
from ..connect import is_cluster
from ..index import STATUS_FIELDS, script_keys, status_args, warn_index_failure
from ..keys import run_keys
from ..retry import REDIS_ERRORS, RetryPolicy, is_function_missing
from ..runtime import async_cluster_ready
from ..scripts import Function, cluster_route, library

__all__ = [
    "call_function",
    "index_add",
    "index_remove",
    "prime_cluster",
    "raise_lost_redirect",
    "refresh_topology",
]

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
        await raise_lost_redirect(client, exc, lib.load_command)  # TopologyChanged
        raise
    logger.info("loading the Redis Functions library %s on %s", lib.name,
                route["target_nodes"].name)  # fmt: skip
    await client.execute_command(*lib.load_command, **route)
    return await client.execute_command(*command, **route)


async def _index_eval(client: Any, prefix: str, args: Sequence[str]) -> Any:
    """Run ``lua/index_status-3.lua`` (loaded on a miss, as every function)."""
    return await call_function(client, library().ops.index_status, script_keys(prefix), args)


async def _index_status(client: Any, prefix: str, run_id: uuid.UUID) -> None:
    """Index the run with its status as the run hash holds it now (two round trips: the run
    and the index live in different slots); nothing when the run is gone."""
    values = await client.hmget(run_keys(prefix, run_id).run, list(STATUS_FIELDS))
    args = status_args(run_id, values)
    if args is not None:
        await _index_eval(client, prefix, args)


async def index_add(client: Any, retry: RetryPolicy, prefix: str, run_id: uuid.UUID,
                    score: float | None = None) -> None:  # fmt: skip
    """Index the run (ZADD by its ``updated_at``) with its current status, which the status
    counts next to the index follow (retried; a failure is logged). ``score`` is not used
    (the run hash's ``updated_at`` is), kept for callers."""
    del score
    try:
        await retry.acall(lambda: _index_status(client, prefix, run_id))
    except Exception as exc:
        warn_index_failure("update", prefix, run_id, exc)


async def index_remove(client: Any, retry: RetryPolicy, prefix: str, run_id: uuid.UUID) -> None:
    """Remove the run from the run index, its status and its count (retried; a failure is
    logged)."""
    try:
        await retry.acall(lambda: _index_eval(client, prefix, ["remove", str(run_id)]))
    except Exception as exc:
        warn_index_failure("removal", prefix, run_id, exc)


async def refresh_topology(client: Any, load_command: Sequence[Any] | None = None) -> list[str]:
    """Re-read the slot map of ``client`` (a ``RedisCluster``), add every primary that
    ``CLUSTER NODES`` lists and its node table lacks, and run ``load_command`` (``FUNCTION LOAD
    REPLACE ...``) on each node added; the names of the nodes added (see
    :mod:`luft_redis.cluster`). Failures are logged: a refresh is best effort, the caller
    retries."""
    manager = client.nodes_manager
    missing: list[tuple[str, int]] = []
    try:
        await manager.initialize()
        for node in list(manager.nodes_cache.values()):
            try:
                reply = await async_cluster_nodes(client, node)
            except REDIS_ERRORS:
                continue
            missing = missing_primaries(manager.nodes_cache, reply)
            break
    except REDIS_ERRORS as exc:
        logger.info("Redis Cluster topology refresh failed (%s)", exc)
        return []
    added = [async_add_node(manager, host, port) for host, port in missing]
    loaded = loaded_nodes(client)
    for name in added:
        if load_command is None or name in loaded:
            continue
        try:
            await client.execute_command(*load_command, target_nodes=manager.nodes_cache[name])
            loaded.add(name)
        except (*REDIS_ERRORS, KeyError) as exc:  # KeyError: dropped again meanwhile
            logger.info("loading the Functions library on new node %s failed (%s)", name, exc)
    if added:
        logger.info("Redis Cluster: added slotless primaries %s to the node table", added)
    return added


async def raise_lost_redirect(client: Any, exc: AttributeError,
                              load_command: Sequence[Any] | None = None) -> None:  # fmt: skip
    """The hook for ``except AttributeError`` around a call on a ``RedisCluster``: when
    ``exc`` is a lost redirect (:func:`luft_redis.cluster.is_lost_redirect`), refresh the
    topology and raise :class:`~luft_redis.cluster.TopologyChanged` from it; otherwise return
    (the caller re-raises ``exc``)."""
    if is_lost_redirect(exc):
        raise topology_changed(exc, await refresh_topology(client, load_command))
