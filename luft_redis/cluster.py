"""Redis Cluster: a call redirected to a node the client does not know (a live reshard).

When a Cluster grows, a new empty primary joins and slots move to it one by one
(``redis-cli --cluster reshard``: ``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` of the keys,
then ``SETSLOT NODE``). While a slot moves, its old owner answers a call whose keys have all
left with ``ASK <slot> <new node>``. redis-py follows the redirect by looking the node up in
its node table, which it builds from ``CLUSTER SLOTS``: a primary that owns no slot yet is
not listed there, so the lookup finds nothing and redis-py fails with a bare
``AttributeError: 'NoneType' object has no attribute 'redis_connection'`` (sync; on the
asyncio client ``... 'execute_command'``, which its error handler then hides behind
``... 'connection_kwargs'`` while recording a metric for the missing node), and a topology
refresh of its own would not help (redis-py 8.1; upstream issue redis/redis-py#4015).

This module turns that failure into what it is, a transient change of topology:

* :func:`is_lost_redirect` recognises it: an ``AttributeError`` on ``None`` raised inside
  ``redis.cluster`` or ``redis.asyncio.cluster``, where the only ``None`` redis-py
  dereferences is a node it looked up and did not find;
* :func:`sync_refresh_topology` (:func:`async_refresh_topology` for the asyncio client)
  re-reads the slot
  map (redis-py's ``nodes_manager.initialize()``), then adds to the client's node table every
  primary that ``CLUSTER NODES`` lists and the table lacks (the slotless importing node), and
  loads the Functions library on each node it added: a node that joined empty has none, and the
  ``ASK`` sends the call to it;
* :func:`sync_raise_lost_redirect` (:func:`async_raise_lost_redirect`), the hook the front
  ends call in
  their ``except AttributeError`` around a Cluster call: refresh, then raise
  :class:`TopologyChanged` from the original error, which :func:`luft_redis.retry.is_transient`
  treats as transient. The retry policy then calls again: redis-py now knows the node, sends
  ``ASKING`` and the call there, or meets ``TRYAGAIN`` (some keys moved, some not), which the
  policy retries too, until the slot settles or the policy's deadline passes (then the typed
  error). Nothing ran when the lookup failed: redis-py had not sent the call yet.

A later ``nodes_manager.initialize()`` (redis-py refreshes on every few ``MOVED`` and on
connection errors) drops the slotless node again until it owns a slot; the next lost redirect
adds it back. Once ``SETSLOT NODE`` gives it the slot, ``CLUSTER SLOTS`` lists it and
``MOVED`` leads there by redis-py's own means.

This module imports only redis-py (:mod:`luft_redis.retry` imports it).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import redis.asyncio.cluster
import redis.cluster
import redis.exceptions

__all__ = [
    "TopologyChanged",
    "async_raise_lost_redirect",
    "async_refresh_topology",
    "is_lost_redirect",
    "sync_raise_lost_redirect",
    "sync_refresh_topology",
]

logger = logging.getLogger(__name__)

_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

_CLUSTER_MODULES = frozenset({"redis.cluster", "redis.asyncio.cluster"})

_LOADED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
"""Per client, the nodes (``host:port``) a refresh loaded the library on: a node dropped from
the table by redis-py and added again is not loaded twice."""


class TopologyChanged(redis.exceptions.ClusterError):
    """redis-py could not follow a redirect to a node missing from its node table (a slot
    moving to a new primary); the topology was refreshed and nothing ran. Transient."""


def is_lost_redirect(exc: BaseException) -> bool:
    """True for redis-py's failure to follow an ``ASK``/``MOVED`` to a node it does not know:
    an ``AttributeError`` on ``None`` (``redis_connection`` sync, ``execute_command`` or
    ``connection_kwargs`` asyncio) raised inside ``redis.cluster`` or
    ``redis.asyncio.cluster``."""
    if not isinstance(exc, AttributeError) or exc.obj is not None:
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_globals.get("__name__") in _CLUSTER_MODULES


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _primaries(reply: Any) -> list[tuple[str, int]]:
    """``(host, port)`` of every primary a ``CLUSTER NODES`` reply lists as reachable (not
    failing, not in handshake, with an address)."""
    found: list[tuple[str, int]] = []
    for line in _text(reply).splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = set(fields[2].split(","))
        if "master" not in flags or flags & {"fail", "fail?", "handshake", "noaddr"}:
            continue
        address = fields[1].split("@", 1)[0]
        host, _, port = address.rpartition(":")
        if host and port.isdigit() and int(port) > 0:
            found.append((host, int(port)))
    return found


def _missing(nodes_cache: dict[str, Any],
             listed: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:  # fmt: skip
    return [(h, p) for h, p in listed if redis.cluster.get_node_name(h, p) not in nodes_cache]


def sync_refresh_topology(client: Any, load_command: Sequence[Any] | None = None) -> list[str]:
    """Re-read the slot map of ``client`` (a sync ``RedisCluster``), add every primary that
    ``CLUSTER NODES`` lists and its node table lacks, and run ``load_command`` (``FUNCTION
    LOAD REPLACE ...``) on each node added; the names of the nodes added. Failures are logged:
    a refresh is best effort, the caller retries."""
    manager = client.nodes_manager
    try:
        manager.initialize()
        listed: list[tuple[str, int]] = []
        for node in list(manager.nodes_cache.values()):
            try:
                reply = client.get_redis_connection(node).execute_command("CLUSTER", "NODES")
            except _REDIS_ERRORS:
                continue
            listed = _primaries(reply)
            break
    except _REDIS_ERRORS as exc:
        logger.info("Redis Cluster topology refresh failed (%s)", exc)
        return []
    added: list[str] = []
    for host, port in _missing(manager.nodes_cache, listed):
        node = redis.cluster.ClusterNode(host, port, redis.cluster.PRIMARY)  # type: ignore[no-untyped-call]
        with manager._lock:
            node = manager.nodes_cache.setdefault(node.name, node)
        manager.create_redis_connections([node])
        added.append(node.name)
    loaded = _LOADED.setdefault(client, set())
    for name in added:
        if load_command is None or name in loaded:
            continue
        try:
            client.execute_command(*load_command, target_nodes=manager.nodes_cache[name])
            loaded.add(name)
        except (*_REDIS_ERRORS, KeyError) as exc:  # KeyError: dropped again meanwhile
            logger.info("loading the Functions library on new node %s failed (%s)", name, exc)
    if added:
        logger.info("Redis Cluster: added slotless primaries %s to the node table", added)
    return added


async def async_refresh_topology(client: Any,
                                 load_command: Sequence[Any] | None = None) -> list[str]:
    """:func:`sync_refresh_topology` for an asyncio ``RedisCluster``."""
    manager = client.nodes_manager
    try:
        await manager.initialize()
        listed: list[tuple[str, int]] = []
        for node in list(manager.nodes_cache.values()):
            try:
                reply = await node.execute_command("CLUSTER", "NODES")
            except _REDIS_ERRORS:
                continue
            listed = _primaries(reply)
            break
    except _REDIS_ERRORS as exc:
        logger.info("Redis Cluster topology refresh failed (%s)", exc)
        return []
    added: list[str] = []
    for host, port in _missing(manager.nodes_cache, listed):
        node = redis.asyncio.cluster.ClusterNode(host, port, redis.cluster.PRIMARY,
                                                 **manager.connection_kwargs)  # fmt: skip
        manager.set_nodes(manager.nodes_cache, {node.name: node})
        added.append(node.name)
    loaded = _LOADED.setdefault(client, set())
    for name in added:
        if load_command is None or name in loaded:
            continue
        try:
            await client.execute_command(*load_command, target_nodes=manager.nodes_cache[name])
            loaded.add(name)
        except (*_REDIS_ERRORS, KeyError) as exc:
            logger.info("loading the Functions library on new node %s failed (%s)", name, exc)
    if added:
        logger.info("Redis Cluster: added slotless primaries %s to the node table", added)
    return added


def _changed(exc: AttributeError, added: list[str]) -> TopologyChanged:
    what = f"added {', '.join(added)}" if added else "no new node found yet"
    changed = TopologyChanged(
        "Redis Cluster redirected a call to a node missing from the client's node table (a "
        f"slot moving to a new primary); nothing ran; topology refreshed ({what})"
    )
    changed.__cause__ = exc
    return changed


def sync_raise_lost_redirect(client: Any, exc: AttributeError,
                        load_command: Sequence[Any] | None = None) -> None:  # fmt: skip
    """The hook for ``except AttributeError`` around a call on a sync ``RedisCluster``: when
    ``exc`` is a lost redirect (:func:`is_lost_redirect`), refresh the topology and raise
    :class:`TopologyChanged` from it; otherwise return (the caller re-raises ``exc``)."""
    if is_lost_redirect(exc):
        raise _changed(exc, sync_refresh_topology(client, load_command))


async def async_raise_lost_redirect(client: Any, exc: AttributeError,
                               load_command: Sequence[Any] | None = None) -> None:  # fmt: skip
    """:func:`sync_raise_lost_redirect` for an asyncio ``RedisCluster``."""
    if is_lost_redirect(exc):
        raise _changed(exc, await async_refresh_topology(client, load_command))
