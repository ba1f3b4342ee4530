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
* ``refresh_topology`` (in :mod:`luft_redis.asyncio.fcall`, and the sync
  :mod:`luft_redis._sync.fcall` generated from it) re-reads the slot map (redis-py's
  ``nodes_manager.initialize()``), then adds to the client's node table every primary that
  ``CLUSTER NODES`` lists and the table lacks (the slotless importing node: the
  ``async_``/``sync_`` helpers here, since redis-py's two clients build nodes differently),
  and loads the Functions library on each node it added: a node that joined empty has none,
  and the ``ASK`` sends the call to it;
* ``raise_lost_redirect`` (same module), the hook around a Cluster call's
  ``except AttributeError``: refresh, then raise :class:`TopologyChanged`
  (:func:`topology_changed`) from the original error, which
  :func:`luft_redis.retry.is_transient` treats as transient. The retry policy then calls
  again: redis-py now knows the node, sends ``ASKING`` and the call there, or meets
  ``TRYAGAIN`` (some keys moved, some not), which the policy retries too, until the slot
  settles or the policy's deadline passes (then the typed error). Nothing ran when the lookup
  failed: redis-py had not sent the call yet.

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
    "async_add_node",
    "async_cluster_nodes",
    "async_node_pipeline",
    "is_lost_redirect",
    "loaded_nodes",
    "missing_primaries",
    "sync_add_node",
    "sync_cluster_nodes",
    "sync_node_pipeline",
    "topology_changed",
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


async def async_cluster_nodes(client: Any, node: Any) -> Any:
    """``CLUSTER NODES`` asked of ``node`` (an asyncio cluster node runs commands itself)."""
    return await node.execute_command("CLUSTER", "NODES")


def sync_cluster_nodes(client: Any, node: Any) -> Any:
    """``CLUSTER NODES`` asked of ``node`` (a sync cluster node has a client of its own)."""
    return client.get_redis_connection(node).execute_command("CLUSTER", "NODES")


async def async_node_pipeline(client: Any, node: Any,
                              commands: Sequence[Sequence[Any]]) -> list[Any]:  # fmt: skip
    """``commands`` sent to ``node`` in one write on one of its connections, every reply read
    (an error reply as its exception): a ``WAIT`` among them then counts that connection's
    writes. An asyncio cluster node runs a pipeline itself."""
    stack = [redis.asyncio.cluster.PipelineCommand(i, *command)
             for i, command in enumerate(commands)]  # fmt: skip
    await node.execute_pipeline(stack)
    return [command.result for command in stack]


def sync_node_pipeline(client: Any, node: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """``commands`` sent to ``node`` in one write on one of its connections, every reply read
    (an error reply as its exception). A sync cluster node has a client of its own."""
    pipe = client.get_redis_connection(node).pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(pipe.execute(raise_on_error=False))


def async_add_node(manager: Any, host: str, port: int) -> str:
    """Add the primary ``host:port`` to an asyncio ``RedisCluster``'s node table."""
    node = redis.asyncio.cluster.ClusterNode(host, port, redis.cluster.PRIMARY,
                                             **manager.connection_kwargs)  # fmt: skip
    manager.set_nodes(manager.nodes_cache, {node.name: node})
    return str(node.name)


def sync_add_node(manager: Any, host: str, port: int) -> str:
    """Add the primary ``host:port`` to a sync ``RedisCluster``'s node table."""
    node = redis.cluster.ClusterNode(host, port, redis.cluster.PRIMARY)  # type: ignore[no-untyped-call]
    with manager._lock:
        node = manager.nodes_cache.setdefault(node.name, node)
    manager.create_redis_connections([node])
    return str(node.name)


def missing_primaries(nodes_cache: dict[str, Any], reply: Any) -> list[tuple[str, int]]:
    """The primaries a ``CLUSTER NODES`` reply lists and the node table lacks."""
    listed = _primaries(reply)
    return [(h, p) for h, p in listed if redis.cluster.get_node_name(h, p) not in nodes_cache]


def loaded_nodes(client: Any) -> set[str]:
    """The nodes (``host:port``) a refresh of ``client`` loaded the library on: a node dropped
    from the table by redis-py and added again is not loaded twice."""
    return _LOADED.setdefault(client, set())


def topology_changed(exc: AttributeError, added: list[str]) -> TopologyChanged:
    """The transient error that replaces a lost redirect, naming what the refresh found."""
    what = f"added {', '.join(added)}" if added else "no new node found yet"
    changed = TopologyChanged(
        "Redis Cluster redirected a call to a node missing from the client's node table (a "
        f"slot moving to a new primary); nothing ran; topology refreshed ({what})"
    )
    changed.__cause__ = exc
    return changed
