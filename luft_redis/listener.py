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

import inspect
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import hiredis
import redis
import redis.cluster
import redis.exceptions

try:  # redis-py's table of error codes (NOPERM -> NoPermissionError, ...), redis-py >= 5.0
    from redis._parsers import BaseParser as _RedisParser

    _parse_error: Callable[[str], Any] | None = _RedisParser.parse_error
except ImportError:  # pragma: no cover - a redis-py that moved it: plain ResponseError
    _parse_error = None

from .coherence import (
    DEFAULT_MAX_STALENESS,
    LinkHealth,
    Router,
    Watch,
    check_primary,
    handle_message,
    node_name_for,
    on_fork,
)

__all__ = ["ChangeListener", "Refresher"]

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""Longest wait for a message before a link looks at its requests and health checks."""

IDLE_EXIT_SECONDS = 2.0
"""A link or refresher with nothing to do stops its thread after this long."""

MAX_BACKOFF_SECONDS = 1.0
"""Longest pause between reconnection attempts."""

LISTENER_NICE: int | None = 19
"""The CPU priority (Linux nice value) of the listener threads; None: the process's own.

A listener thread wakes for every notice of a watched run, this process's own writes
included, whose notice arrives with the write's reply. At the process's own priority the
kernel switches to the listener at once, and the thread that wrote then waits for the CPU and
the GIL: measured with the client on one cpu, 35-40 µs per write. At nice 19
the listener runs when the process's other threads wait (for Redis, typically), so its work
overlaps theirs. Freshness keeps its promise either way: ``cache_is_fresh`` needs a
health-check PING answered within ``max_staleness``, so a listener starved of CPU makes its
caches say they are not fresh; it never lets them claim to be. Set this before the first
backend binds a run; only Linux sets a thread's priority (elsewhere it is left alone).
"""


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
        self._router: Router[_Link] = Router(lambda name: _Link(self, name), self._node_name)
        self.failure: BaseException | None = None
        """Why the last subscriber connection failed, until a subscription is confirmed."""

    # -- used by the front end -------------------------------------------------------------

    def watch(self, watch: Watch, max_staleness: float = DEFAULT_MAX_STALENESS) -> None:
        """Deliver the notices of ``watch.channel`` to ``watch``."""
        with self._lock:
            self.failure = None
            link, already = self._router.add(watch, max_staleness)
            link.ensure_thread()
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

    def wait_subscribed(self, channel: bytes, timeout: float) -> bool:
        """Wait until the channel's subscription is confirmed (True), or a subscriber
        connection failed (:attr:`failure`; False at once, the listener keeps trying) or
        ``timeout`` passed (False)."""
        with self._subscribed:
            return self._subscribed.wait_for(
                lambda: self._router.confirmed(channel) or self.failure is not None, timeout
            ) and self._router.confirmed(channel)

    def _failed(self, exc: BaseException) -> None:
        with self._subscribed:
            self.failure = exc
            self._subscribed.notify_all()

    @property
    def connected(self) -> bool:
        """Every subscriber connection is up (False while any reconnects)."""
        with self._lock:
            return self._router.connected

    def drop_connections_for_tests(self) -> None:
        """Close every subscriber connection (the effect of CLIENT KILL), to test recovery."""
        with self._lock:
            self._router.drop_all()

    def release(self, timeout: float = 1.0) -> bool:
        """When nothing is watched any more: close the subscriber connections and end their
        threads now (at most ``timeout`` seconds each), so the client can be closed at once.
        False when something is still watched."""
        with self._lock:
            if self._router.watches:
                return False
            links = list(self._router.links.values())
        for link in links:
            link.stop(timeout)
        return True

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
                link.ensure_thread()

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
            return self._router.targets(channel)

    def _retire(self, link: _Link) -> bool:
        """Drop ``link`` if it carries nothing; True when it was dropped."""
        with self._lock:
            return self._router.retire(link)

    def _open_pubsub(self, link: _Link) -> Any:
        if not self._cluster:
            return open_subscriber(self._client)
        if link.name == "?":
            raise _Reconnect("no slot map")
        node = self._client.get_node(node_name=link.name)
        if node is None or node.redis_connection is None:
            raise _Reconnect(f"node {link.name} is not in the slot map")
        # Right after a failover a refreshed slot map can still name the demoted primary,
        # which would take the subscription as a replica and never see the shard's notices.
        check_primary(node.redis_connection.execute_command("ROLE"), link.name)
        return open_subscriber(node.redis_connection)


def open_subscriber(client: Any) -> Any:
    """A subscriber connection of ``client`` (a ``redis.Redis``): a :class:`Subscriber` when
    the connection has a real socket, else (fakeredis) redis-py's own ``PubSub``, which has
    the same calls."""
    pool = client.connection_pool
    if _takes_no_command_name(pool):
        conn = pool.get_connection()
    else:  # pragma: no cover - redis-py < 5.3
        conn = pool.get_connection("SSUBSCRIBE")
    sock = getattr(conn, "_sock", None)
    if isinstance(sock, socket.socket):  # TCP, Unix or TLS (ssl.SSLSocket)
        return Subscriber(pool, conn, sock)
    pool.release(conn)
    return client.pubsub(ignore_subscribe_messages=False)


def _takes_no_command_name(pool: Any) -> bool:
    """redis-py 5.3 and later take ``get_connection()`` without arguments (5.0-5.2 need one)."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is None or parameter.default is not inspect.Parameter.empty


class Subscriber:
    """One subscriber connection, read with a RESP reader of its own.

    redis-py's ``PubSub.get_message`` costs a pub/sub message several system calls (two
    ``poll``, a ``recv`` peek, two ``settimeout``, the ``recv``) and, in redis-py 8, a debug
    log line that formats the whole message even when debug logging is off. Every system call
    gives up the GIL, so the listener thread and the thread that just wrote take turns several
    times per notice. Measured in one process with the client on one cpu (two backends, one
    per read path, their append_event + get_checkpoint calls alternated in chunks): this
    reader costs each write about 40 µs less.

    Its connection is taken from the client's pool and connected by redis-py (AUTH, HELLO,
    TLS, Sentinel: whatever the client is configured for); after that it only sends
    (``SSUBSCRIBE``, ``SUNSUBSCRIBE``, ``PING``), and its socket is read here: one ``recv`` for
    whatever has arrived (at most ``BUFFER_SIZE`` bytes), parsed by a ``hiredis.Reader`` of its
    own (RESP2 or RESP3), every complete message handed out without another system call. It
    is never given back to the pool connected (:meth:`close` disconnects it first, as
    redis-py's ``PubSub`` does).

    Messages come out in the shape of redis-py's ``PubSub.get_message`` (a dict with ``type``,
    ``channel``, ``data``), which :func:`~luft_redis.coherence.handle_message` reads.
    """

    BUFFER_SIZE = 65536

    def __init__(self, pool: Any, conn: Any, sock: socket.socket) -> None:
        self._pool = pool
        self._conn = conn
        self._sock = sock
        self._reader = hiredis.Reader()
        self._closed = False

    # -- sending (the same calls as redis-py's PubSub) --------------------------------------

    def _send(self, *args: Any) -> None:
        self._conn.send_command(*args, check_health=False)

    def ssubscribe(self, *channels: bytes) -> None:
        self._send("SSUBSCRIBE", *channels)

    def sunsubscribe(self, *channels: bytes) -> None:
        self._send("SUNSUBSCRIBE", *channels)

    def ping(self, token: bytes) -> None:
        self._send("PING", token)

    # -- reading ----------------------------------------------------------------------------

    def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        """The next message: one already read at once, else (``timeout`` > 0) what arrives
        within ``timeout`` seconds, else None. ``timeout=0`` makes no system call."""
        message = self._reader.gets()
        if message is False and timeout > 0:
            sock = self._sock
            sock.settimeout(max(timeout, 0.001))
            try:
                data = sock.recv(self.BUFFER_SIZE)
            except (TimeoutError, BlockingIOError):
                return None
            if not data:
                raise redis.exceptions.ConnectionError("the server closed the connection")
            self._reader.feed(data)
            message = self._reader.gets()
        if message is False:
            return None
        return self._shape(message)

    def _shape(self, message: Any) -> dict[str, Any]:
        if isinstance(message, list):  # RESP2 array or RESP3 push (a list subclass)
            kind = message[0]
            if kind == b"smessage" or kind == b"message":
                return {"type": kind.decode(), "channel": message[1], "data": message[2]}
            if kind == b"pong":  # RESP2: a PING in subscribed mode answers ["pong", token]
                return {"type": "pong", "channel": None, "data": message[1]}
            channel = message[1] if len(message) > 1 else None
            data = message[2] if len(message) > 2 else None
            return {"type": kind.decode(errors="replace"), "channel": channel, "data": data}
        if isinstance(message, hiredis.ReplyError):
            raise _reply_error(str(message))
        if isinstance(message, bytes):  # RESP3: PING answers its token as a plain reply
            return {"type": "pong", "channel": None, "data": b"" if message == b"PONG" else message}
        raise redis.exceptions.InvalidResponse(f"unexpected subscriber reply {message!r:.80}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._conn.disconnect()
        finally:
            self._pool.release(self._conn)


def _lower_priority(nice: int | None) -> None:
    """Give the calling thread the nice value ``nice`` (Linux only; see LISTENER_NICE)."""
    if nice is None or not sys.platform.startswith("linux"):
        return
    try:  # on Linux, PRIO_PROCESS with a thread id sets that one thread's priority
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if nice > current:  # lowering is always allowed; raising it back is not
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:
        logger.debug("could not lower the listener thread's priority: %s", exc)


def _reply_error(text: str) -> redis.exceptions.RedisError:
    """The redis-py exception for an error reply (NOPERM: ``NoPermissionError``, ...), made
    by redis-py's own table of error codes."""
    error = _parse_error(text) if _parse_error is not None else None
    if isinstance(error, redis.exceptions.RedisError):
        return error
    return redis.exceptions.ResponseError(text)



class _Link:
    """One subscriber connection (one node) and its thread."""

    def __init__(self, listener: ChangeListener, name: str) -> None:
        self.listener = listener
        self.name = name
        self.health = LinkHealth()
        self._requests: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._asked_unsub: dict[bytes, int] = {}  # unsubscribes not yet confirmed
        self._stopping = False

    def request(self, item: tuple[str, bytes]) -> None:
        self._requests.put(item)

    def stop(self, timeout: float) -> None:
        """Close the connection and end the thread (it carries nothing: see release())."""
        self._stopping = True
        self._requests.put(("drop", b""))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run,
                name=f"luft-redis-listener-{self.name or 'redis'}-{id(self.listener._client):x}",
                daemon=True,
            )
            self._thread.start()

    def _run(self) -> None:
        _lower_priority(LISTENER_NICE)
        listener = self.listener
        backoff = POLL_SECONDS
        idle_since: float | None = None
        while True:
            while not self._requests.empty():  # the connection below subscribes to all
                self._requests.get_nowait()
            channels = listener._channels_of(self)
            if self._stopping and not channels and listener._retire(self):
                return
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
                self._asked_unsub = {}
                pubsub.ssubscribe(*channels)  # connects; confirmations are read below
                self.health.connect(time.monotonic())
                backoff = POLL_SECONDS
                self._serve(pubsub)
            except Exception as exc:
                self.health.disconnect()
                if not self._stopping:
                    if not isinstance(exc, _Reconnect):
                        listener._failed(exc)
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
                    pubsub.ssubscribe(channel)
                elif action == "unsub":
                    self._asked_unsub[channel] = self._asked_unsub.get(channel, 0) + 1
                    health.confirmed.discard(channel)
                    pubsub.sunsubscribe(channel)
                elif action == "drop":
                    raise _Reconnect("dropped on request")
            if not self.listener._channels_of(self) and (not self._asked_unsub or self._stopping):
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
        listener = self.listener
        confirmed = handle_message(message, self.health, self._asked_unsub, listener._targets)
        if confirmed is not None:
            with listener._subscribed:
                listener.failure = None
                listener._subscribed.notify_all()

    def _lost(self, exc: BaseException) -> None:
        watched = bool(self.listener._channels_of(self))
        level = logging.INFO if watched else logging.DEBUG
        logger.log(level, "change listener %s: reconnecting (%s)", self.name or "redis", exc)


class Refresher:
    """The thread that reloads stale caches and runs change callbacks, per client.

    Its thread is started by :meth:`hold`, from the thread of the backend that binds a run,
    and stays while any run is held: a thread inherits the priority of the thread that
    starts it, and the listener thread runs at ``LISTENER_NICE``, so a refresher started from
    the listener would run reloads and the application's callbacks at that low priority too.
    With nothing held it stops after ``IDLE_EXIT_SECONDS`` without work.
    """

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
        self._held: weakref.WeakSet[Watch] = weakref.WeakSet()

    def hold(self, watch: Watch) -> None:
        """Keep the thread running while ``watch`` is held (until :meth:`release`, or until
        the watch is garbage); starts the thread from the calling thread."""
        with self._lock:
            self._held.add(watch)
            self._ensure_thread()

    def release(self, watch: Watch) -> None:
        with self._lock:
            self._held.discard(watch)

    def schedule(self, work: Callable[[], None]) -> None:
        """Run ``work()`` on the refresher thread (never blocks the caller)."""
        self._queue.put(work)
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                self._ensure_thread()

    def _ensure_thread(self) -> None:  # with self._lock held
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name=f"luft-redis-refresher-{id(self._client):x}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                work = self._queue.get(timeout=IDLE_EXIT_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty() and not self._held:
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
