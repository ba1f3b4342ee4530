"""The change listener and the refresher: one of each per client (and, for asyncio, per loop).

:class:`AsyncChangeListener` keeps one subscriber connection per Redis node that owns a watched
run's channel (one in all on a plain server), each served by its own worker (a task on the
loop; a thread in the sync code generated from this module, :mod:`luft_redis._sync.listener`). The
worker only reads, health-checks and queues: a notice is handed to every
:class:`~luft_redis.watch.Watch` of its channel (a header check and a list append), a
confirmation marks the watches stale, and a PING goes out every ``max_staleness / 4``. It reads
in batches: after a batch of this process's own notices only (already applied from the writes'
replies) it pauses (``COALESCE_SECONDS``, doubling up to ``OWN_PAUSE_SECONDS``), so one wake-up
serves many; after another process's change it reads on at once (a writer of this process may
be waiting for that notice before it can apply its own reply). It takes
no lock that a writer holds across I/O and makes no call but its own subscription's (and, on
Redis Cluster, the topology refresh that finding the channel's node needs).

Anything that may have lost a notice (a lost connection, a PING unanswered for too long, an
``sunsubscribe`` the client did not ask for, a MOVED reply) closes the connection, refreshes
the cluster topology, subscribes again on the node that owns each channel now and marks the
watches stale; the :class:`AsyncRefresher` worker then reloads them (``Watch.on_work`` only
queues work for it).

This is the hand-written asyncio source; :mod:`luft_redis._sync.listener` is generated from it
(see :mod:`luft_redis.runtime` for what differs).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, ClassVar

from ..connect import is_cluster
from ..forks import on_fork
from ..links import DEFAULT_MAX_STALENESS, LinkHealth, Router, handle_message, node_name_for
from ..runtime import (
    AsyncRegistry,
    AsyncSignal,
    AsyncStateLock,
    AsyncWorker,
    AsyncWorkQueue,
    async_sleep,
)
from ..subscriber import Reconnect, async_open_subscriber
from ..watch import Watch

__all__ = [
    "COALESCE_SECONDS",
    "LISTENER_NICE",
    "OWN_PAUSE_SECONDS",
    "AsyncChangeListener",
    "AsyncRefresher",
    "weak_work",
]

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""Longest wait for a message before a link looks at its requests and health checks."""

COALESCE_SECONDS = 0.005
"""After a batch of this process's own notices, the first pause before a link reads again:
notices that arrive meanwhile are read together, one wake-up for the lot (None or 0: read at
once). After a batch holding another process's change there is no pause: a writer of this
process that is behind waits for those notices (with 2 and 4 writer processes on one run, a
5 ms pause there cut their throughput to a third in ``benchmarks.run``'s writers rows).

A worker that reads each notice as it arrives wakes once per notice, this process's own
writes included (their notice arrives with the write's reply, and the writer already applied
it). Each wake-up is a thread switch and a GIL hand-off in sync code (measured, the client on
one cpu: 35-40 µs of CPU per write at the process's priority). A notice arriving while the
link is idle is read at once; only a notice that follows another within this time waits, at
most this long. ``cache_is_fresh`` is unaffected (its bound is ``max_staleness``, and the
health-check PINGs are sent and read on the same schedule). Read when a batch ends, so an
assignment (``luft_redis._sync.listener.COALESCE_SECONDS``) takes effect at once."""

OWN_PAUSE_SECONDS = 0.05
"""The longest pause between reads while every notice read was this process's own (already
applied from its writes' replies, so nothing waits for them): the pause doubles from
``COALESCE_SECONDS`` up to this after each such batch, and drops back at once after a batch
with news (another process's change, a confirmation). A single writer process then reads its
own notices a few dozen at a time; another process's change waits at most this long (the
freshness promise, ``max_staleness``, is unaffected: no pause is longer than a quarter of the
interval between health-check PINGs)."""

BATCH_LIMIT = 256
"""A batch of this many messages or more is not followed by a pause: the link is behind."""

IDLE_EXIT_SECONDS = 2.0
"""A link or refresher with nothing to do ends its worker after this long."""

MAX_BACKOFF_SECONDS = 1.0
"""Longest pause between reconnection attempts."""

LISTENER_NICE: int | None = None
"""The CPU priority (Linux nice value) of the sync listener threads
(``luft_redis._sync.listener.LISTENER_NICE``); None (the default): the process's own. asyncio tasks
have none.

Until the listener read in batches it ran at nice 19 by default: it woke for every notice, and
at the process's priority the kernel switched to it at once for each of the process's own
writes, while the thread that wrote waited for the CPU and the GIL (35-40 µs per write with
the client on one cpu). It now wakes once per batch (``COALESCE_SECONDS``, and up to
``OWN_PAUSE_SECONDS`` while only its own notices come), whatever its priority
(``benchmarks.fleet --variant nice19:LISTENER_NICE=19`` measures both). At nice 19 on a host
whose cpus other processes keep busy, a listener that pauses between batches waited long for
the cpu after each pause: ``test_slow_wait_does_not_delay_notices`` saw notices 0.3-0.5 s
late in 4 of 8 runs at a load of 12 on 2 cpus, and none at the process's priority. Set it (19
was the old default) to let the batches run only when the process's other threads wait;
freshness keeps its promise either way, since ``cache_is_fresh`` needs a health-check PING
answered within ``max_staleness``. Set it before the first backend binds a run; only Linux
sets a thread's priority (elsewhere it is left alone).
"""

Work = Callable[[], Awaitable[None]]


def _listener_nice() -> int | None:
    return LISTENER_NICE  # read when a worker starts, so an assignment takes effect


class AsyncChangeListener:
    """The listener of one client; get it with :meth:`for_client`."""

    _registry: ClassVar[AsyncRegistry[AsyncChangeListener]] = AsyncRegistry()

    @classmethod
    def for_client(cls, client: Any) -> AsyncChangeListener:
        return cls._registry.get(client, cls)

    @classmethod
    def existing(cls, client: Any) -> AsyncChangeListener | None:
        """The listener of ``client``, if one was made."""
        return cls._registry.existing(client)

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self._lock = AsyncStateLock()
        self._subscribed = AsyncSignal()
        self._router: Router[_Link] = Router(lambda name: _Link(self, name), self._node_name)
        self.failure: BaseException | None = None
        """Why the last subscriber connection failed, until a subscription is confirmed."""

    # -- used by the front end -------------------------------------------------------------

    def watch(self, watch: Watch, max_staleness: float = DEFAULT_MAX_STALENESS) -> None:
        """Deliver the notices of ``watch.channel`` to ``watch``."""
        with self._lock:
            self.failure = None
            link, already = self._router.add(watch, max_staleness)
            link.ensure_worker()
        if already:  # no confirmation will come for this watch: its load follows this
            watch.subscribed()

    def unwatch(self, watch: Watch) -> None:
        with self._lock:
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

    def _failed(self, exc: BaseException | None) -> None:
        self.failure = exc
        self._subscribed.notify()

    @property
    def idle(self) -> bool:
        """Nothing is watched through this listener."""
        with self._lock:
            return not self._router.watches

    @property
    def connected(self) -> bool:
        """Every subscriber connection is up (False while any reconnects)."""
        with self._lock:
            return self._router.connected

    def drop_connections_for_tests(self) -> None:
        """Close every subscriber connection (the effect of CLIENT KILL), to test recovery."""
        with self._lock:
            self._router.drop_all()

    async def release(self, timeout: float = 1.0, *, force: bool = False) -> bool:
        """When nothing is watched any more (or ``force``: the client is about to close):
        close the subscriber connections and end their workers now (at most ``timeout``
        seconds each), so the client can be closed at once. False when something is still
        watched (and not ``force``)."""
        with self._lock:
            router = self._router
            if router.watches and not force:
                return False
            links = list(router.links.values())
            if force:
                router.links.clear()
                router.route.clear()
                router.watches.clear()
        for link in links:
            await link.stop(timeout)
        if force:
            self._registry.drop(self._client, self)
        return True

    async def aclose(self) -> None:
        """:meth:`release` by force: stop every worker and close its connection."""
        await self.release(force=True)

    # -- routing ---------------------------------------------------------------------------

    def _node_name(self, channel: bytes) -> str:
        return node_name_for(self._client, self._cluster, channel)

    def _channels_of(self, link: _Link) -> list[bytes]:
        with self._lock:
            return self._router.channels_of(link)

    def _reroute(self) -> None:
        """After a topology change: move channels to the links of their current nodes."""
        with self._lock:
            for link in self._router.reroute():
                link.ensure_worker()

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
        with self._lock:
            return self._router.targets(channel)

    def _retire(self, link: _Link) -> bool:
        """Drop ``link`` if it carries nothing; True when it was dropped."""
        with self._lock:
            return self._router.retire(link)

    async def _open_pubsub(self, link: _Link) -> Any:
        return await async_open_subscriber(self._client, self._cluster, link.name)


class _Link:
    """One subscriber connection (one node) and its worker."""

    def __init__(self, listener: AsyncChangeListener, name: str) -> None:
        self.listener = listener
        self.name = name
        self.health = LinkHealth()
        self._requests: AsyncWorkQueue[tuple[str, bytes]] = AsyncWorkQueue()
        self._worker: AsyncWorker | None = None
        self._asked_unsub: dict[bytes, int] = {}  # unsubscribes not yet confirmed
        self._stopping = False

    def request(self, item: tuple[str, bytes]) -> None:
        self._requests.put(item)

    async def stop(self, timeout: float) -> None:
        """Close the connection and end the worker (it carries nothing: see release())."""
        self._stopping = True
        self._requests.put(("drop", b""))
        worker = self._worker
        if worker is not None:
            await worker.join(timeout)

    def ensure_worker(self) -> None:
        if self._worker is None or not self._worker.alive:
            self._stopping = False
            name = f"luft-redis-listener-{self.name or 'redis'}-{id(self.listener._client):x}"
            self._worker = AsyncWorker(self._run, name, _listener_nice)

    async def _run(self) -> None:
        listener = self.listener
        backoff = POLL_SECONDS
        idle_since: float | None = None
        while True:
            while self._requests.get_nowait() is not None:
                pass  # the connection below subscribes to all
            channels = listener._channels_of(self)
            if self._stopping and not channels and listener._retire(self):
                return
            if not channels:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since > IDLE_EXIT_SECONDS and listener._retire(self):
                    return
                await async_sleep(POLL_SECONDS)
                continue
            idle_since = None
            pubsub: Any = None
            try:
                pubsub = await listener._open_pubsub(self)
                self._asked_unsub = {}
                await pubsub.ssubscribe(*channels)  # confirmations are read below
                self.health.connect(time.monotonic())
                backoff = POLL_SECONDS
                await self._serve(pubsub)
            except Exception as exc:
                self.health.disconnect()  # not fresh while we wait to reconnect
                if not self._stopping:
                    if not isinstance(exc, Reconnect):
                        listener._failed(exc)
                    self._lost(exc)
                    await listener._refresh_topology()
                    await async_sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                self.health.disconnect()
                if pubsub is not None:
                    try:
                        await pubsub.aclose()
                    except Exception:
                        logger.debug("closing a subscriber connection failed", exc_info=True)

    async def _serve(self, pubsub: Any) -> None:
        health = self.health
        pause = 0.0
        while True:
            request = self._requests.get_nowait()
            while request is not None:
                action, channel = request
                if action == "sub":
                    await pubsub.ssubscribe(channel)
                elif action == "unsub":
                    self._asked_unsub[channel] = self._asked_unsub.get(channel, 0) + 1
                    health.confirmed.discard(channel)
                    await pubsub.sunsubscribe(channel)
                elif action == "drop":
                    raise Reconnect("dropped on request")
                request = self._requests.get_nowait()
            if not self.listener._channels_of(self) and (not self._asked_unsub or self._stopping):
                return
            now = time.monotonic()
            token = health.ping_due(now)
            if token is not None:
                await pubsub.ping(token)
            if health.stalled(now):
                raise Reconnect("health-check PING unanswered")
            timeout = min(POLL_SECONDS, health.until_next_ping(now))
            message = await pubsub.get_message(timeout=timeout)
            if message is None:
                continue
            count = 0
            news = health.news
            while message is not None:
                if message.get("type") != "smessage":
                    news = -1  # a PONG, a confirmation: not a batch of own notices only
                self._dispatch(message)
                count += 1
                message = await pubsub.get_message(timeout=0)
            if not COALESCE_SECONDS or count >= BATCH_LIMIT:
                pause = 0.0
            elif news == health.news:  # only notices this process had applied already
                pause = min(max(pause, COALESCE_SECONDS) * 2, OWN_PAUSE_SECONDS)
            else:  # another process writes: a writer of this process may be waiting for its
                pause = 0.0  # notices before it can apply its own reply (no pause: read on)
            if pause:  # (never long next to the health checks a small max_staleness needs)
                await async_sleep(min(pause, health.ping_interval / 4))  # one wake-up per batch

    def _dispatch(self, message: dict[str, Any]) -> None:
        listener = self.listener
        if handle_message(message, self.health, self._asked_unsub, listener._targets):
            listener._failed(None)  # a confirmation: the subscription works

    def _lost(self, exc: BaseException) -> None:
        watched = bool(self.listener._channels_of(self))
        level = logging.INFO if watched else logging.DEBUG
        logger.log(level, "change listener %s: reconnecting (%s)", self.name or "redis", exc)


class AsyncRefresher:
    """The worker that reloads stale caches and runs change callbacks, per client.

    Its worker is started by :meth:`hold`, from the backend that binds a run, and stays while
    any run is held: a thread inherits the priority of the thread that starts it, and the sync
    listener threads run at ``LISTENER_NICE``, so a refresher started from a listener would
    run reloads and the application's callbacks at that low priority too. With nothing held
    it stops after ``IDLE_EXIT_SECONDS`` without work.
    """

    _registry: ClassVar[AsyncRegistry[AsyncRefresher]] = AsyncRegistry()

    @classmethod
    def for_client(cls, client: Any) -> AsyncRefresher:
        return cls._registry.get(client, cls)

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queue: AsyncWorkQueue[tuple[Hashable, Work]] = AsyncWorkQueue()
        self._pending: set[Hashable] = set()
        self._lock = AsyncStateLock()
        self._worker: AsyncWorker | None = None
        self._held: weakref.WeakSet[Watch] = weakref.WeakSet()

    def hold(self, watch: Watch) -> None:
        """Keep the worker running while ``watch`` is held (until :meth:`release`, or until
        the watch is garbage); starts it from the caller."""
        with self._lock:
            self._held.add(watch)
            self._ensure_worker()

    def release(self, watch: Watch) -> None:
        with self._lock:
            self._held.discard(watch)

    def schedule(self, key: Hashable, work: Work) -> None:
        """Run ``work()`` on the refresher's worker (never blocks the caller). Work already
        queued under ``key`` and not started yet is not queued twice."""
        with self._lock:
            if key not in self._pending:
                self._pending.add(key)
                self._queue.put((key, work))
            self._ensure_worker()

    def _ensure_worker(self) -> None:  # with self._lock held
        if self._worker is None or not self._worker.alive:
            self._worker = AsyncWorker(self._run, f"luft-redis-refresher-{id(self._client):x}")

    async def _run(self) -> None:
        while True:
            item = await self._queue.get(IDLE_EXIT_SECONDS)
            if item is None:
                with self._lock:
                    if self._queue.empty() and not self._held:
                        self._worker = None
                        return
                continue
            key, work = item
            with self._lock:
                self._pending.discard(key)
            try:
                await work()
            except Exception:
                logger.exception("luft-redis refresh failed")


def weak_work(owner: Any, method: str) -> Work:
    """``owner.<method>()`` if ``owner`` is still alive (the refresher holds no backend)."""
    ref = weakref.ref(owner)

    async def work() -> None:
        target = ref()
        if target is not None:
            await getattr(target, method)()

    return work


def _forget_after_fork() -> None:
    AsyncChangeListener._registry.forget_all()
    AsyncRefresher._registry.forget_all()


on_fork(_forget_after_fork)
