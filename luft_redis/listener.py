"""Change notices: one listener thread per Redis client keeps every bound backend's cache current.

Every Lua script that changes a run publishes one notice on the run's sharded channel
``<prefix>:{<run-id>}:changes`` (``SPUBLISH``, so it works on Redis Cluster too): the run's new
version, the server time and what changed. A :class:`ChangeListener` (one per client object,
shared by every backend on that client) subscribes with ``SSUBSCRIBE`` to the channels of the
runs its backends are bound to and hands each notice to them; they apply it to their cache, or
reload the run when a version is missing.

Whenever a subscription is (re)confirmed, after a reconnect for instance, the backends reload
their run, so a notice lost while the connection was down cannot leave a cache behind. While the
listener is not connected, the backends report ``cache_is_fresh == False``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from typing import Any, ClassVar, Protocol

import redis.cluster

__all__ = ["ChangeListener", "Watcher", "parse_notice"]

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""How long the listener waits for a message before it looks at (un)subscribe requests."""

IDLE_EXIT_SECONDS = 2.0
"""A listener with no watcher left stops its thread after this long."""

MAX_BACKOFF_SECONDS = 2.0
"""Longest pause between reconnection attempts."""


class Watcher(Protocol):
    """What a listener calls on a backend (from the listener thread)."""

    def _on_notice(self, channel: bytes, payload: bytes) -> None: ...

    def _on_subscribed(self, channel: bytes, confirmation: int) -> None: ...


def parse_notice(payload: bytes) -> list[bytes]:
    """Split a notice made of netstrings ``<len>:<bytes>`` into its parts."""
    parts: list[bytes] = []
    pos, end = 0, len(payload)
    while pos < end:
        colon = payload.index(b":", pos)
        length = int(payload[pos:colon])
        start = colon + 1
        if length < 0 or start + length > end:
            raise ValueError("truncated notice")
        parts.append(payload[start : start + length])
        pos = start + length
    return parts


class ChangeListener:
    """The listener thread of one client; get it with :meth:`for_client`."""

    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _registry: ClassVar[dict[int, ChangeListener]] = {}

    @classmethod
    def for_client(cls, client: Any) -> ChangeListener:
        """The listener of ``client``, created on first use."""
        with cls._registry_lock:
            listener = cls._registry.get(id(client))
            if listener is None or listener._client is not client:
                listener = cls(client)
                cls._registry[id(client)] = listener
            return listener

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._lock = threading.Lock()
        self._watchers: dict[bytes, weakref.WeakSet[Any]] = {}
        self._requests: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._confirmed: set[bytes] = set()
        self._confirmations: dict[bytes, int] = {}
        self._confirmed_cv = threading.Condition(self._lock)
        self._connected = False
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    # -- used by backends ------------------------------------------------------------------

    def watch(self, channel: bytes, watcher: Watcher) -> None:
        """Deliver the notices of ``channel`` to ``watcher`` (held weakly)."""
        with self._lock:
            watchers = self._watchers.setdefault(channel, weakref.WeakSet())
            new_channel = not watchers
            watchers.add(watcher)
            if new_channel:
                self._requests.put(("sub", channel))
            # else: already subscribed, and the watcher's own load comes after that
            self._ensure_thread()
        self._wake.set()

    def unwatch(self, channel: bytes, watcher: Watcher) -> None:
        with self._lock:
            watchers = self._watchers.get(channel)
            if watchers is None:
                return
            watchers.discard(watcher)
            if not watchers:
                del self._watchers[channel]
                self._confirmed.discard(channel)
                self._requests.put(("unsub", channel))
        self._wake.set()

    def is_fresh(self, channel: bytes) -> bool:
        """True while connected and subscribed to ``channel``."""
        return self._connected and channel in self._confirmed

    def confirmation(self, channel: bytes) -> int:
        """How many times the subscription to ``channel`` was confirmed (0: not yet)."""
        with self._lock:
            return self._confirmations.get(channel, 0) if channel in self._confirmed else 0

    def wait_confirmed(self, channel: bytes, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the subscription; its confirmation count or 0."""
        with self._confirmed_cv:
            self._confirmed_cv.wait_for(lambda: channel in self._confirmed, timeout)
            return self._confirmations.get(channel, 0) if channel in self._confirmed else 0

    @property
    def connected(self) -> bool:
        return self._connected

    def kill_connection_for_tests(self) -> None:  # pragma: no cover - used by tests only
        """Drop the listener's connection (the effect of CLIENT KILL), to test recovery."""
        self._requests.put(("drop", b""))
        self._wake.set()

    # -- the thread ------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name=f"luft-redis-listener-{id(self._client):x}", daemon=True
            )
            self._thread.start()

    def _channels(self) -> list[bytes]:
        with self._lock:
            return [c for c, w in self._watchers.items() if w]

    def _targets(self, channel: bytes) -> list[Watcher]:
        with self._lock:
            watchers = self._watchers.get(channel)
            return list(watchers) if watchers else []

    def _run(self) -> None:
        backoff = POLL_SECONDS
        idle_since: float | None = None
        while True:
            # drain (un)subscribe requests before the snapshot of channels, which then
            # includes every watch() made so far; later ones stay queued for _serve
            while not self._requests.empty():
                action, _ = self._requests.get_nowait()
                if action == "drop":
                    break
            channels = self._channels()
            if not channels:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since > IDLE_EXIT_SECONDS:
                    with self._lock:
                        if not any(self._watchers.values()):
                            self._thread = None
                            with ChangeListener._registry_lock:
                                if ChangeListener._registry.get(id(self._client)) is self:
                                    del ChangeListener._registry[id(self._client)]
                            return
                self._wake.wait(POLL_SECONDS)
                self._wake.clear()
                continue
            idle_since = None
            pubsub: Any = None
            try:
                pubsub = self._client.pubsub(ignore_subscribe_messages=False)
                pubsub.ssubscribe(*channels)
                self._connected = True
                backoff = POLL_SECONDS
                self._serve(pubsub)
            except Exception as exc:
                self._lost(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                self._connected = False
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        logger.debug("closing a broken pubsub failed", exc_info=True)

    def _serve(self, pubsub: Any) -> None:
        while True:
            while not self._requests.empty():
                action, channel = self._requests.get_nowait()
                if action == "sub":
                    pubsub.ssubscribe(channel)
                elif action == "unsub":
                    pubsub.sunsubscribe(channel)
                elif action == "drop":
                    raise ConnectionError("listener connection dropped on request")
            if not self._channels():
                return
            if self._cluster:
                message = pubsub.get_sharded_message(timeout=POLL_SECONDS)
            else:
                message = pubsub.get_message(timeout=POLL_SECONDS)
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(kind, bytes):
            kind = kind.decode()
        if not isinstance(channel, bytes):
            channel = str(channel).encode()
        if kind == "smessage":
            for watcher in self._targets(channel):
                try:
                    watcher._on_notice(channel, message["data"])
                except Exception:
                    logger.exception("applying a change notice on %r failed", channel)
        elif kind == "ssubscribe":
            with self._lock:
                self._confirmed.add(channel)
                count = self._confirmations[channel] = self._confirmations.get(channel, 0) + 1
                self._confirmed_cv.notify_all()
            for watcher in self._targets(channel):
                try:
                    watcher._on_subscribed(channel, count)
                except Exception:
                    logger.exception("resync after subscribing to %r failed", channel)
        elif kind == "sunsubscribe":
            with self._lock:
                if channel not in self._watchers:
                    self._confirmed.discard(channel)

    def _lost(self, exc: BaseException) -> None:
        was_connected = self._connected
        self._connected = False
        with self._lock:
            self._confirmed.clear()
            watched = any(self._watchers.values())
        if was_connected and watched:
            logger.warning("change listener lost its connection (%s); reconnecting", exc)
        else:
            logger.debug("change listener cannot connect: %s", exc)

