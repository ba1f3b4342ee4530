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

:class:`AsyncWriteLane` is the lean path of a backend's writes on a plain (not Cluster) client:
one connection of the client's pool kept for them, the FCALL packed in one piece, its constant
head (function, keys, channel) packed once.

This is the hand-written asyncio source; :mod:`luft_redis._sync.fcall` is generated from it
(see :mod:`luft_redis.runtime`).
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from ..cluster import (
    TopologyChanged,
    async_add_node,
    async_cluster_nodes,
    async_node_pipeline,
    is_lost_redirect,
    loaded_nodes,
    missing_primaries,
    topology_changed,
)
from ..connect import is_cluster
from ..forks import fork_generation
from ..index import STATUS_FIELDS, script_keys, status_args, warn_index_failure
from ..keys import run_keys
from ..retry import REDIS_ERRORS, RetryPolicy, is_function_missing
from ..runtime import async_cluster_ready
from ..scripts import Function, cluster_route, library

__all__ = [
    "AsyncWriteLane",
    "call_durably",
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


async def call_durably(client: Any, fn: Function, keys: Sequence[Any], args: Sequence[Any],
                       wait: Sequence[Any], *, cluster: bool) -> tuple[Any, Any]:  # fmt: skip
    """One attempt of ``fn`` followed by ``wait`` (``WAIT <replicas> <ms>``) in one round trip
    on one connection, since ``WAIT`` counts the replicas that caught up with that
    connection's writes: the two replies, an error reply as its exception (the caller raises
    them). On "Function not found" the library is loaded and both are sent once more.

    On Redis Cluster both go to the primary owning the run's slot, on one of its connections.
    A redirect (``MOVED``/``ASK``: the slot moved or is moving) or a slot missing from the
    client's table refreshes the topology and raises :class:`TopologyChanged` (transient:
    nothing was acknowledged; if the write ran, the retry replays it, and a replay writes, so
    its ``WAIT`` still counts the write's replication).
    """
    lib = library()
    command = fn.command(keys, args)
    route: dict[str, Any] = {}
    if cluster:
        await async_cluster_ready(client)
        if client not in _PRIMED:
            await prime_cluster(client)
        route = cluster_route(client, keys)
        if not route:
            await refresh_topology(client, lib.load_command)
            raise TopologyChanged("no primary serves the run's slot in the client's slot table "
                                  "(a failover?); the topology was refreshed")  # fmt: skip

    async def send() -> list[Any]:
        if cluster:
            return await async_node_pipeline(client, route["target_nodes"], (command, wait))
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*command)
        pipe.execute_command(*wait)
        return list(await pipe.execute(raise_on_error=False))

    result, count = await send()
    if is_function_missing(result):  # nothing ran; the WAIT waited for nothing
        logger.info("loading the Redis Functions library %s", lib.name)
        await client.execute_command(*lib.load_command, **route)
        result, count = await send()
    if isinstance(result, (redis.exceptions.MovedError, redis.exceptions.AskError)):
        await refresh_topology(client, lib.load_command)
        raise TopologyChanged(f"Redis Cluster redirected a durable write ({result}): the run's "
                              "slot moved; nothing acknowledged; topology refreshed")
    return result, count


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


_PLAIN_CONNECTIONS = ("redis.connection", "redis.asyncio.connection")
"""Modules of the connection classes whose sockets the lane writes to: not fakeredis', and not
a Sentinel pool's (a write through a kept connection did not resume after a failover in
``tests/test_failover.py``; those clients keep ``execute_command``)."""


_PREFIXED = 2048
_PREFIX = [b"$%d\r\n" % size for size in range(_PREFIXED)]
"""The RESP length prefix of a bulk string, by its length (formatting one costs more)."""


def _bulk(value: Any) -> bytes:
    if isinstance(value, int):
        value = str(value)
    data = value.encode() if isinstance(value, str) else bytes(value)
    return b"$%d\r\n%b\r\n" % (len(data), data)


class AsyncWriteLane:
    """The writes of one backend on a plain client, without ``execute_command``'s generic path.

    A backend's writes are one at a time (its write lock), so the lane keeps one connection of
    the client's pool for them (taken at the first write, given back by :meth:`aclose`; a new
    one after a fork) and sends each FCALL as bytes packed here: the function, its keys and
    the run's channel are packed once per (function, run). What ``execute_command`` does that
    matters here stays: the connection's own retry policy (``conn.retry``: a connection error
    disconnects, and the call is sent again when the policy allows), the health check, the
    error replies raised as redis-py raises them, any other failure disconnecting the
    connection (so no half-read reply is ever read by the next call), and "Function not found"
    loading the library through the client, then the FCALL once more (as
    :func:`call_function`). Not kept: redis-py's own
    OpenTelemetry metrics of the command (the backend's spans, :mod:`luft_redis.tracing`, are
    made as before).

    :meth:`for_client` gives ``None`` for a client the lane must not bypass: a Cluster client,
    a single-connection client, a client whose class or instance overrides
    ``execute_command`` (test doubles, instrumentation), a pool with client-side caching or a
    text encoding other than UTF-8, connections of another library (fakeredis), a Sentinel
    pool."""

    __slots__ = ("_client", "_conn", "_generation", "_heads")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._conn: Any = None
        self._generation = -1
        self._heads: dict[tuple[str, str], tuple[int, bytes]] = {}

    @classmethod
    def for_client(cls, client: Any) -> AsyncWriteLane | None:
        base = redis.asyncio.Redis if _is_async_client(client) else redis.Redis
        pool = getattr(client, "connection_pool", None)
        if (not isinstance(client, base) or pool is None
                or type(client).execute_command is not base.execute_command
                or "execute_command" in vars(client)
                or getattr(client, "connection", None) is not None
                or getattr(pool, "cache", None) is not None
                or pool.connection_kwargs.get("encoding", "utf-8").lower().replace("-", "")
                != "utf8"
                or not pool.connection_class.__module__.startswith(_PLAIN_CONNECTIONS)):
            return None  # fmt: skip
        return cls(client)

    def _head(self, fn: Function, keys: Sequence[Any]) -> tuple[int, bytes]:
        """(number of parts, packed bytes) of ``fn.command(keys, ())``, made once."""
        cached = self._heads.get((fn.name, keys[0]))
        if cached is None:
            command = fn.command(keys, ())
            if len(self._heads) > 64:
                self._heads.clear()
            cached = self._heads[fn.name, keys[0]] = (
                len(command), b"".join(_bulk(part) for part in command))
        return cached

    async def call(self, fn: Function, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One attempt of ``fn`` (as :func:`call_function`)."""
        count, head = self._head(fn, keys)
        parts = [b"*%d\r\n" % (count + len(args)), head]
        prefix = _PREFIX
        encode = None
        for value in args:
            kind = type(value)
            if kind is str:
                data = value.encode()
            elif kind is bytes:
                data = value
            else:  # a number: as redis-py encodes it (a bad type: its DataError)
                encode = encode or self._client.connection_pool.get_encoder().encode
                data = encode(value)
            size = len(data)
            parts += (prefix[size] if size < _PREFIXED else b"$%d\r\n" % size, data, b"\r\n")
        packed = b"".join(parts)
        try:
            return await self._send(packed)
        except redis.exceptions.ResponseError as exc:
            if not is_function_missing(exc):
                raise
        lib = library()
        logger.info("loading the Redis Functions library %s", lib.name)
        await self._client.execute_command(*lib.load_command)
        return await self._send(packed)

    async def _send(self, packed: bytes) -> Any:
        conn = self._conn
        if conn is None or self._generation != fork_generation():
            self._generation = fork_generation()
            conn = self._conn = await self._client.connection_pool.get_connection()

        async def once() -> Any:
            await conn.send_packed_command((packed,))
            return await conn.read_response()

        async def failed(error: BaseException) -> None:
            await conn.disconnect()

        try:
            return await conn.retry.call_with_retry(once, failed)
        except redis.exceptions.ResponseError:
            raise  # a whole error reply was read: the connection is fine
        except BaseException:
            await conn.disconnect()  # a reply may be on its way: never read it as another's
            raise

    async def aclose(self) -> None:
        """Give the connection back to the pool (a forked child's stays the parent's)."""
        conn, self._conn = self._conn, None
        if conn is not None and self._generation == fork_generation():
            await self._client.connection_pool.release(conn)


def _is_async_client(client: Any) -> bool:
    return isinstance(client, redis.asyncio.Redis)
