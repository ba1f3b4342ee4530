"""The asyncio front end's change listener and refresher: one of each per client and event loop.

The asyncio twin of :mod:`luft_redis.listener`, with the same logic. :class:`AsyncChangeListener`
keeps one subscriber connection per Redis node that owns a watched run's channel (one in all on a
plain server), each read by its own task on the loop. The task only reads, health-checks and
queues: a notice is handed to every :class:`~luft_redis.coherence.Watch` of its channel (a
header check and a list append), a confirmation marks the watches stale, and a PING goes out
every ``max_staleness / 4``. It never awaits a lock that a writer holds across I/O and makes no
call but its own subscription's (and, on Redis Cluster, the topology refresh that finding the
channel's node needs).

Anything that may have lost a notice (a lost connection, a PING unanswered for too long, an
``sunsubscribe`` the client did not ask for) closes the connection, refreshes the cluster
topology, subscribes again on the node that owns each channel now and marks the watches stale;
the :class:`AsyncRefresher` task then reloads them (``Watch.on_work`` only queues work for it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, ClassVar

import redis.asyncio
import redis.asyncio.cluster

from ..coherence import (
    DEFAULT_MAX_STALENESS,
    LinkHealth,
    Router,
    Watch,
    check_primary,
    handle_message,
    node_name_for,
    on_fork,
)

__all__ = ["AsyncChangeListener", "AsyncRefresher", "Signal"]

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""Longest wait for a message before a link looks at its requests and health checks."""

IDLE_EXIT_SECONDS = 2.0
"""A link or refresher with nothing to do ends its task after this long."""

MAX_BACKOFF_SECONDS = 1.0
"""Longest pause between reconnection attempts."""

Work = Callable[[], Awaitable[None]]


class Signal:
    """Wakes the coroutines waiting for a condition when somebody says it may have changed
    (an asyncio condition variable without a lock: everything runs on one loop)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def notify(self) -> None:
        """Wake every waiter (never blocks)."""
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds (checked after every :meth:`notify`); False when
        ``timeout`` seconds passed first (``None``: no limit)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            if self._event is None:
                self._event = asyncio.Event()
            event = self._event
            if deadline is None:
                await event.wait()
                continue
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), left)
            except TimeoutError:
                return predicate()
        return True


class _Reconnect(Exception):
    """The subscriber connection can no longer be trusted: replace it."""


_Registry = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Any]]


class AsyncChangeListener:
    """The listener of one asyncio client on one event loop; get it with :meth:`for_client`
    (from a coroutine)."""

    _registry: ClassVar[_Registry] = weakref.WeakKeyDictionary()

    @classmethod
    def for_client(cls, client: Any) -> AsyncChangeListener:
        per_loop = cls._registry.setdefault(asyncio.get_running_loop(), {})
        listener = per_loop.get(id(client))
        if not isinstance(listener, AsyncChangeListener) or listener._client is not client:
            listener = per_loop[id(client)] = cls(client)
        return listener

    @classmethod
    def existing(cls, client: Any) -> AsyncChangeListener | None:
        """The listener of ``client`` on the running loop, if one was made."""
        per_loop = cls._registry.get(asyncio.get_running_loop())
        listener = per_loop.get(id(client)) if per_loop is not None else None
        if isinstance(listener, AsyncChangeListener) and listener._client is client:
            return listener
        return None

    @classmethod
    def _forget_all(cls) -> None:  # in a forked child: the loop and its tasks are the parent's
        cls._registry = weakref.WeakKeyDictionary()

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._subscribed = Signal()
        self._router: Router[_Link] = Router(lambda name: _Link(self, name), self._node_name)
        self.failure: BaseException | None = None
        """Why the last subscriber connection failed, until a subscription is confirmed."""

    # -- used by the front end -------------------------------------------------------------

    def watch(self, watch: Watch, max_staleness: float = DEFAULT_MAX_STALENESS) -> None:
        """Deliver the notices of ``watch.channel`` to ``watch`` (call it on the loop)."""
        self.failure = None
        link, already = self._router.add(watch, max_staleness)
        link.ensure_task()
        if already:  # no confirmation will come for this watch: its load follows this
            watch.subscribed()

    def unwatch(self, watch: Watch) -> None:
        self._router.remove(watch)

    def healthy(self, channel: bytes, max_staleness: float | None = None) -> bool:
        """Subscribed on the channel's node, and that connection proved it delivers lately."""
        return self._router.healthy(channel, time.monotonic(), max_staleness)

    def health_age(self, channel: bytes) -> float | None:
        """Seconds since the last answered health check of the channel's connection."""
        return self._router.health_age(channel, time.monotonic())

    def confirmed(self, channel: bytes) -> bool:
        """The server confirmed the subscription of ``channel`` on its current link."""
        return self._router.confirmed(channel)

    async def wait_subscribed(self, channel: bytes, timeout: float) -> bool:
        """Wait until the channel's subscription is confirmed (True), or a subscriber
        connection failed (:attr:`failure`; False at once, the listener keeps trying) or
        ``timeout`` passed (False)."""
        done = await self._subscribed.wait_for(
            lambda: self.confirmed(channel) or self.failure is not None, timeout
        )
        return done and self.confirmed(channel)

    @property
    def idle(self) -> bool:
        """Nothing is watched through this listener."""
        return not self._router.watches

    @property
    def connected(self) -> bool:
        """Every subscriber connection is up (False while any reconnects)."""
        return self._router.connected

    def drop_connections_for_tests(self) -> None:
        """Close every subscriber connection (the effect of CLIENT KILL), to test recovery."""
        self._router.drop_all()

    async def aclose(self) -> None:
        """Stop every link task and close its connection (the client is about to close)."""
        router = self._router
        links = list(router.links.values())
        router.links.clear()
        router.route.clear()
        router.watches.clear()
        for link in links:
            await link.stop()
        per_loop = self._registry.get(asyncio.get_running_loop())
        if per_loop is not None and per_loop.get(id(self._client)) is self:
            del per_loop[id(self._client)]

    # -- routing ---------------------------------------------------------------------------

    def _node_name(self, channel: bytes) -> str:
        return node_name_for(self._client, self._cluster, channel)

    def _channels_of(self, link: _Link) -> list[bytes]:
        return self._router.channels_of(link)

    def _reroute(self) -> None:
        """After a topology change: move channels to the links of their current nodes."""
        for link in self._router.reroute():
            link.ensure_task()

    async def _refresh_topology(self) -> None:
        if not self._cluster:
            return
        try:
            await self._client.nodes_manager.initialize()
        except Exception as exc:
            logger.info("cluster topology refresh failed (%s); will retry", exc)
            return
        self._reroute()

    def _targets(self, channel: bytes) -> list[Watch]:
        return self._router.targets(channel)

    def _retire(self, link: _Link) -> bool:
        """Drop ``link`` if it carries nothing; True when it was dropped."""
        return self._router.retire(link)

    async def _open_pubsub(self, link: _Link) -> tuple[Any, Any]:
        """A pubsub for ``link``'s node, and the connection pool to close after it (None
        when it comes from the client's own pool)."""
        if not self._cluster:
            return self._client.pubsub(ignore_subscribe_messages=False), None
        if link.name == "?":
            raise _Reconnect("no slot map")
        node = self._client.get_node(node_name=link.name)
        if node is None:
            raise _Reconnect(f"node {link.name} is not in the slot map")
        # the asyncio RedisCluster has no client per node: one of our own, made like its
        # connections (same connection class and options: TLS, credentials, timeouts)
        pool = redis.asyncio.ConnectionPool(
            connection_class=node.connection_class, max_connections=2,
            **node.connection_kwargs,
        )  # fmt: skip
        subscriber = redis.asyncio.Redis(connection_pool=pool)
        try:
            # a refreshed slot map can still name a demoted primary right after a failover
            check_primary(await subscriber.execute_command("ROLE"), link.name)  # type: ignore[no-untyped-call]
        except BaseException:
            await pool.disconnect()
            raise
        return subscriber.pubsub(ignore_subscribe_messages=False), pool


class _Link:
    """One subscriber connection (one node) and its task."""

    def __init__(self, listener: AsyncChangeListener, name: str) -> None:
        self.listener = listener
        self.name = name
        self.health = LinkHealth()
        self._requests: collections.deque[tuple[str, bytes]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._asked_unsub: dict[bytes, int] = {}  # unsubscribes not yet confirmed

    def request(self, item: tuple[str, bytes]) -> None:
        self._requests.append(item)

    def ensure_task(self) -> None:
        if self._task is None or self._task.done():
            name = f"luft-redis-listener-{self.name or 'redis'}-{id(self.listener._client):x}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # we are being cancelled ourselves, not just the link task
            except Exception:
                logger.debug("stopping a listener task failed", exc_info=True)

    async def _run(self) -> None:
        listener = self.listener
        backoff = POLL_SECONDS
        idle_since: float | None = None
        while True:
            self._requests.clear()  # the connection below subscribes to all
            channels = listener._channels_of(self)
            if not channels:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since > IDLE_EXIT_SECONDS and listener._retire(self):
                    return
                await asyncio.sleep(POLL_SECONDS)
                continue
            idle_since = None
            pubsub: Any = None
            pool: Any = None
            try:
                pubsub, pool = await listener._open_pubsub(self)
                logger.debug("change listener %s: subscribing %d channel(s)",
                             self.name or "redis", len(channels))  # fmt: skip
                self.health.connect(time.monotonic())
                self._asked_unsub = {}
                await pubsub.ssubscribe(*channels)
                backoff = POLL_SECONDS
                await self._serve(pubsub)
            except Exception as exc:
                self.health.disconnect()  # not fresh while we wait to reconnect
                if not isinstance(exc, _Reconnect):
                    listener.failure = exc
                    listener._subscribed.notify()
                self._lost(exc)
                await listener._refresh_topology()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                self.health.disconnect()
                await _close(pubsub, pool)

    async def _serve(self, pubsub: Any) -> None:
        health = self.health
        while True:
            while self._requests:
                action, channel = self._requests.popleft()
                if action == "sub":
                    await pubsub.ssubscribe(channel)
                elif action == "unsub":
                    self._asked_unsub[channel] = self._asked_unsub.get(channel, 0) + 1
                    health.confirmed.discard(channel)
                    await pubsub.sunsubscribe(channel)
                elif action == "drop":
                    raise _Reconnect("dropped on request")
            if not self.listener._channels_of(self) and not self._asked_unsub:
                return
            now = time.monotonic()
            token = health.ping_due(now)
            if token is not None:
                await pubsub.ping(token)
            if health.stalled(now):
                raise _Reconnect("health-check PING unanswered")
            timeout = min(POLL_SECONDS, health.until_next_ping(now))
            message = await pubsub.get_message(timeout=timeout)
            while message is not None:
                self._dispatch(message)
                message = await pubsub.get_message(timeout=0)

    def _dispatch(self, message: dict[str, Any]) -> None:
        listener = self.listener
        if handle_message(message, self.health, self._asked_unsub, listener._targets):
            listener.failure = None
            listener._subscribed.notify()

    def _lost(self, exc: BaseException) -> None:
        watched = bool(self.listener._channels_of(self))
        level = logging.INFO if watched else logging.DEBUG
        logger.log(level, "change listener %s: reconnecting (%s)", self.name or "redis", exc)


async def _close(pubsub: Any, pool: Any) -> None:
    """Close a subscriber connection (and its private pool); failures are only logged."""
    try:
        if pubsub is not None:
            await pubsub.aclose()
        if pool is not None:
            await pool.disconnect()
    except Exception:
        logger.debug("closing a subscriber connection failed", exc_info=True)


class AsyncRefresher:
    """The task that reloads stale caches and runs change callbacks, per client and loop."""

    _registry: ClassVar[_Registry] = weakref.WeakKeyDictionary()

    @classmethod
    def for_client(cls, client: Any) -> AsyncRefresher:
        per_loop = cls._registry.setdefault(asyncio.get_running_loop(), {})
        refresher = per_loop.get(id(client))
        if not isinstance(refresher, AsyncRefresher) or refresher._client is not client:
            refresher = per_loop[id(client)] = cls(client)
        return refresher

    @classmethod
    def _forget_all(cls) -> None:
        cls._registry = weakref.WeakKeyDictionary()

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queue: asyncio.Queue[tuple[Hashable, Work]] = asyncio.Queue()
        self._pending: set[Hashable] = set()
        self._task: asyncio.Task[None] | None = None

    def schedule(self, key: Hashable, work: Work) -> None:
        """Run ``await work()`` on the refresher task (never blocks the caller; call it on the
        loop). Work already queued under ``key`` and not started yet is not queued twice."""
        if key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait((key, work))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="luft-redis-refresher"
            )

    async def _run(self) -> None:
        while True:
            try:
                key, work = await asyncio.wait_for(self._queue.get(), IDLE_EXIT_SECONDS)
            except TimeoutError:
                if self._queue.empty():
                    self._task = None
                    return
                continue
            self._pending.discard(key)
            try:
                await work()
            except Exception:
                logger.exception("luft-redis refresh failed")


def weak_work(owner: Any, method: str) -> Work:
    """``await owner.<method>()`` if ``owner`` is still alive (the refresher holds no backend)."""
    ref = weakref.ref(owner)

    async def work() -> None:
        target = ref()
        if target is not None:
            await getattr(target, method)()

    return work


def _forget_after_fork() -> None:
    AsyncChangeListener._forget_all()
    AsyncRefresher._forget_all()


on_fork(_forget_after_fork)
