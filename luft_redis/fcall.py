"""Calling the Functions library from sync code: FCALL, loading the library on a miss.

The sync front end (:mod:`luft_redis.backend`) and the sync tools that run a library function
outside a backend (:mod:`luft_redis.interop`'s restore, :mod:`luft_redis.retention`'s gc) go
through :func:`call_function`: one round trip when the library is loaded; on "Function not
found" (a new node, a flushed or restarted server, a failover), ``FUNCTION LOAD REPLACE`` on
that node and the FCALL once more. On Redis Cluster the call goes straight to the run's slot
owner (:func:`luft_redis.scripts.cluster_route`), and a client loads the library on every
primary before its first call. The asyncio front end has the same steps with ``await``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import redis.exceptions

from .cluster import raise_lost_redirect
from .connect import is_cluster
from .retry import is_function_missing
from .scripts import Function, cluster_route, library

__all__ = ["call_function", "prime_cluster"]

logger = logging.getLogger(__name__)

REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

_PRIMED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The RedisCluster clients that loaded the library on every primary."""


def prime_cluster(client: Any) -> None:
    """Load the library on every primary, once per client (a node added or promoted later
    gets it on its first "Function not found")."""
    lib = library()
    _PRIMED.add(client)
    try:
        client.execute_command(*lib.load_command, target_nodes=client.get_primaries())
    except REDIS_ERRORS as exc:
        logger.info("loading %s on every primary failed (%s); each node loads it on its "
                    "first miss", lib.name, exc)  # fmt: skip


def call_function(client: Any, fn: Function, keys: Sequence[Any], args: Sequence[Any],
                  *, cluster: bool | None = None) -> Any:  # fmt: skip
    """One attempt of ``fn`` on ``client`` (a sync ``Redis`` or ``RedisCluster``); redis-py's
    exceptions pass through (the caller retries and translates them)."""
    lib = library()
    command = fn.command(keys, args)
    if not (is_cluster(client) if cluster is None else cluster):
        try:
            return client.execute_command(*command)
        except redis.exceptions.ResponseError as exc:
            if not is_function_missing(exc):
                raise
        logger.info("loading the Redis Functions library %s", lib.name)
        client.execute_command(*lib.load_command)
        return client.execute_command(*command)
    if client not in _PRIMED:
        prime_cluster(client)
    try:
        return client.execute_command(*command, **cluster_route(client, keys))
    except redis.exceptions.ResponseError as exc:
        route = cluster_route(client, keys)
        if not route or not is_function_missing(exc):  # no node known to load it on
            raise
    except AttributeError as exc:  # redirected to a node redis-py does not know: a reshard
        raise_lost_redirect(client, exc, lib.load_command)  # TopologyChanged, transient
        raise
    logger.info("loading the Redis Functions library %s on %s", lib.name,
                route["target_nodes"].name)  # fmt: skip
    client.execute_command(*lib.load_command, **route)
    return client.execute_command(*command, **route)
