"""The sync front end's change listener and refresher: one of each per client and process.

:class:`ChangeListener` keeps one subscriber connection per Redis node that owns a watched
run's channel (one in all on a plain server), each read by its own thread. The thread only
reads, health-checks and queues: a notice is handed to every :class:`~luft_redis.coherence.Watch`
of its channel (a header check and a list append), a confirmation marks the watches stale, and
a PING goes out every ``max_staleness / 4``. It takes no lock that a writer holds across I/O
and makes no call but its own subscription's (and, on Redis Cluster, the topology refresh that
finding the channel's node needs).

Anything that may have lost a notice (a lost connection, a PING unanswered for too long, an
``sunsubscribe`` the client did not ask for, a MOVED reply) closes the connection, refreshes
the cluster topology, subscribes again on the node that owns each channel now and marks the
watches stale; the :class:`Refresher` thread then reloads them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import redis
import redis.cluster
from redis.crc import key_slot

from .coherence import DEFAULT_MAX_STALENESS, LinkHealth, Watch, check_primary, on_fork

__all__ = ["ChangeListener", "Refresher"]

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""Longest wait for a message before a link looks at its requests and health checks."""

IDLE_EXIT_SECONDS = 2.0
"""A link or refresher with nothing to do stops its thread after this long."""

MAX_BACKOFF_SECONDS = 1.0
"""Longest pause between reconnection attempts."""


class _Reconnect(Exception):
    """The subscriber connection can no longer be trusted: replace it."""


class ChangeListener:
    """The listener of one client in this process; get it with :meth:`for_client`."""

    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _registry: ClassVar[dict[int, ChangeListener]] = {}

    @classmethod
    def for_client(cls, client: Any) -> ChangeListener:
        with cls._registry_lock:
            listener = cls._registry.get(id(client))
            if listener is None or listener._client is not client:
                listener = cls(client)
                cls._registry[id(client)] = listener
            return listener

    @classmethod
    def _forget_all(cls) -> None:  # in a forked child: the threads are gone
        cls._registry_lock = threading.Lock()
        cls._registry = {}

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._lock = threading.Lock()
        self._subscribed = threading.Condition(self._lock)
        self._watches: dict[bytes, list[Watch]] = {}
        self._route: dict[bytes, str] = {}
        self._links: dict[str, _Link] = {}
        self.max_staleness = DEFAULT_MAX_STALENESS

    # -- used by the front end -------------------------------------------------------------

    def watch(self, watch: Watch, max_staleness: float = DEFAULT_MAX_STALENESS) -> None:
        """Deliver the notices of ``watch.channel`` to ``watch``."""
        channel = watch.channel
        with self._lock:
            if max_staleness < self.max_staleness:
                self.max_staleness = max_staleness
                for link in self._links.values():
                    link.health.max_staleness = max_staleness
            watches = self._watches.setdefault(channel, [])
            watches.append(watch)
            link = self._link_for(channel)
            already = channel in link.health.confirmed
            if len(watches) == 1:
                link.request(("sub", channel))
            link.ensure_thread()
        if already:  # no confirmation will come for this watch: its load follows this
            watch.subscribed()

    def unwatch(self, watch: Watch) -> None:
        channel = watch.channel
        with self._lock:
            watches = self._watches.get(channel)
            if not watches or watch not in watches:
                return
            watches.remove(watch)
            if not watches:
                del self._watches[channel]
                name = self._route.pop(channel, None)
                link = self._links.get(name) if name is not None else None
                if link is not None:
                    link.request(("unsub", channel))

    def healthy(self, channel: bytes, max_staleness: float | None = None) -> bool:
        """Subscribed on the channel's node, and that connection proved it delivers lately."""
        name = self._route.get(channel)
        link = self._links.get(name) if name is not None else None
        return link is not None and link.health.healthy(channel, time.monotonic(), max_staleness)

    def wait_subscribed(self, channel: bytes, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._subscribed:
            while True:
                name = self._route.get(channel)
                link = self._links.get(name) if name is not None else None
                if link is not None and channel in link.health.confirmed:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._subscribed.wait(left)

    @property
    def connected(self) -> bool:
        """Every subscriber connection is up (False while any reconnects)."""
        with self._lock:
            links = list(self._links.values())
        return bool(links) and all(link.health.connected for link in links)

    def drop_connections_for_tests(self) -> None:
        """Close every subscriber connection (the effect of CLIENT KILL), to test recovery."""
        with self._lock:
            for link in self._links.values():
                link.request(("drop", b""))

    # -- routing ---------------------------------------------------------------------------

    def _node_name(self, channel: bytes) -> str:
        if not self._cluster:
            return ""
        try:
            node = self._client.nodes_manager.get_node_from_slot(key_slot(channel))
        except Exception:  # no slot map (yet): the link refreshes it when it connects
            return "?"
        return str(node.name)

    def _link_for(self, channel: bytes) -> _Link:
        """The link that should carry ``channel`` (lock held)."""
        name = self._node_name(channel)
        self._route[channel] = name
        link = self._links.get(name)
        if link is None:
            link = self._links[name] = _Link(self, name)
            link.health.max_staleness = self.max_staleness
        return link

    def _channels_of(self, link: _Link) -> list[bytes]:
        with self._lock:
            return [c for c, name in self._route.items() if name == link.name]

    def _reroute(self) -> None:
        """After a topology change: move channels to the links of their current nodes."""
        with self._lock:
            for channel in list(self._route):
                old = self._route[channel]
                new_link = self._link_for(channel)
                if new_link.name != old:
                    old_link = self._links.get(old)
                    if old_link is not None:
                        old_link.request(("unsub", channel))
                    new_link.request(("sub", channel))
                    new_link.ensure_thread()

    def _refresh_topology(self) -> None:
        if not self._cluster:
            return
        try:
            self._client.nodes_manager.initialize()
        except Exception as exc:
            logger.info("cluster topology refresh failed (%s); will retry", exc)
            return
        self._reroute()

    def _targets(self, channel: bytes) -> list[Watch]:
        with self._lock:
            return list(self._watches.get(channel, ()))

    def _retire(self, link: _Link) -> bool:
        """Drop ``link`` if it carries nothing; True when it was dropped."""
        with self._lock:
            if any(name == link.name for name in self._route.values()):
                return False
            if self._links.get(link.name) is link:
                del self._links[link.name]
            return True

    def _open_pubsub(self, link: _Link) -> Any:
        if not self._cluster:
            return self._client.pubsub(ignore_subscribe_messages=False)
        if link.name == "?":
            raise _Reconnect("no slot map")
        node = self._client.get_node(node_name=link.name)
        if node is None or node.redis_connection is None:
            raise _Reconnect(f"node {link.name} is not in the slot map")
        # Right after a failover a refreshed slot map can still name the demoted primary,
        # which would take the subscription as a replica and never see the shard's notices.
        check_primary(node.redis_connection.execute_command("ROLE"), link.name)
        return node.redis_connection.pubsub(ignore_subscribe_messages=False)



class _Link:
    """One subscriber connection (one node) and its thread."""

    def __init__(self, listener: ChangeListener, name: str) -> None:
        self.listener = listener
        self.name = name
        self.health = LinkHealth()
        self._requests: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._asked_unsub: set[bytes] = set()

    def request(self, item: tuple[str, bytes]) -> None:
        self._requests.put(item)

    def ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run,
                name=f"luft-redis-listener-{self.name or 'redis'}-{id(self.listener._client):x}",
                daemon=True,
            )
            self._thread.start()

    def _run(self) -> None:
        listener = self.listener
        backoff = POLL_SECONDS
        idle_since: float | None = None
        while True:
            while not self._requests.empty():  # the connection below subscribes to all
                self._requests.get_nowait()
            channels = listener._channels_of(self)
            if not channels:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since > IDLE_EXIT_SECONDS and listener._retire(self):
                    return
                time.sleep(POLL_SECONDS)
                continue
            idle_since = None
            pubsub: Any = None
            try:
                pubsub = listener._open_pubsub(self)
                self._asked_unsub = set()
                pubsub.ssubscribe(*channels)  # connects; confirmations are read below
                self.health.connect(time.monotonic())
                backoff = POLL_SECONDS
                self._serve(pubsub)
            except Exception as exc:
                self.health.disconnect()
                self._lost(exc)
                listener._refresh_topology()
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                self.health.disconnect()
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        logger.debug("closing a subscriber connection failed", exc_info=True)

    def _serve(self, pubsub: Any) -> None:
        health = self.health
        while True:
            while not self._requests.empty():
                action, channel = self._requests.get_nowait()
                if action == "sub":
                    self._asked_unsub.discard(channel)
                    pubsub.ssubscribe(channel)
                elif action == "unsub":
                    self._asked_unsub.add(channel)
                    health.confirmed.discard(channel)
                    pubsub.sunsubscribe(channel)
                elif action == "drop":
                    raise _Reconnect("dropped on request")
            if not self.listener._channels_of(self) and not self._asked_unsub:
                return
            now = time.monotonic()
            token = health.ping_due(now)
            if token is not None:
                pubsub.ping(token)
            if health.stalled(now):
                raise _Reconnect("health-check PING unanswered")
            timeout = min(POLL_SECONDS, health.until_next_ping(now))
            message = pubsub.get_message(timeout=timeout)
            while message is not None:
                self._dispatch(message)
                message = pubsub.get_message(timeout=0)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if isinstance(kind, bytes):
            kind = kind.decode()
        raw = message.get("channel")
        channel = raw.encode() if isinstance(raw, str) else raw if isinstance(raw, bytes) else b""
        if kind == "smessage":
            for watch in self.listener._targets(channel):
                watch.notice(message["data"])
        elif kind == "pong":
            self.health.pong(message.get("data"))
        elif kind == "ssubscribe":
            listener = self.listener
            with listener._lock:
                self.health.confirmed.add(channel)
                listener._subscribed.notify_all()
            for watch in listener._targets(channel):
                watch.subscribed()
        elif kind == "sunsubscribe":
            if channel in self._asked_unsub:
                self._asked_unsub.discard(channel)
                return
            # the server dropped it: the slot moved (failover, migration)
            self.health.confirmed.discard(channel)
            raise _Reconnect(f"server unsubscribed {channel!r} (slot moved)")

    def _lost(self, exc: BaseException) -> None:
        watched = bool(self.listener._channels_of(self))
        level = logging.INFO if watched else logging.DEBUG
        logger.log(level, "change listener %s: reconnecting (%s)", self.name or "redis", exc)


class Refresher:
    """The thread that reloads stale caches and runs change callbacks, per client."""

    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _registry: ClassVar[dict[int, Refresher]] = {}

    @classmethod
    def for_client(cls, client: Any) -> Refresher:
        with cls._registry_lock:
            refresher = cls._registry.get(id(client))
            if refresher is None or refresher._client is not client:
                refresher = cls(client)
                cls._registry[id(client)] = refresher
            return refresher

    @classmethod
    def _forget_all(cls) -> None:
        cls._registry_lock = threading.Lock()
        cls._registry = {}

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def schedule(self, work: Callable[[], None]) -> None:
        """Run ``work()`` on the refresher thread (never blocks the caller)."""
        self._queue.put(work)
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="luft-redis-refresher", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                work = self._queue.get(timeout=IDLE_EXIT_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                work()
            except Exception:
                logger.exception("luft-redis refresh failed")


def weak_work(owner: Any, method: str) -> Callable[[], None]:
    """``owner.<method>()`` if ``owner`` is still alive (the refresher holds no backend)."""
    ref = weakref.ref(owner)

    def work() -> None:
        target = ref()
        if target is not None:
            getattr(target, method)()

    return work


def _forget_after_fork() -> None:
    ChangeListener._forget_all()
    Refresher._forget_all()


on_fork(_forget_after_fork)
