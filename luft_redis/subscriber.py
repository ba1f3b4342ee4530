"""The subscriber connections of the change listeners: the one transport difference between the
sync and the asyncio front end.

Sync code reads its subscriber socket with a ``hiredis.Reader`` of its own (:class:`Subscriber`,
opened by :func:`sync_open_subscriber`): redis-py's ``PubSub.get_message`` costs a sync thread
several system calls per message, each of which gives up the GIL. asyncio code uses redis-py's
asyncio ``PubSub`` (:class:`AsyncSubscription`, opened by :func:`async_open_subscriber`): on
one loop there is no GIL hand-off to save. Both have the same calls (``ssubscribe``,
``sunsubscribe``, ``ping``, ``get_message``, ``aclose``/``close``), so the listener
(:mod:`luft_redis.asyncio.listener`, and the sync one generated from it) is written once.

On Redis Cluster a subscription goes to the primary that owns the channel's slot now; right
after a failover a refreshed slot map can still name the demoted primary, which would take the
subscription as a replica and never see the shard's notices (:func:`check_primary`).
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

import hiredis
import redis
import redis.asyncio
import redis.exceptions

try:  # redis-py's table of error codes (NOPERM -> NoPermissionError, ...), redis-py >= 5.0
    from redis._parsers import BaseParser as _RedisParser

    _parse_error: Callable[[str], Any] | None = _RedisParser.parse_error
except ImportError:  # pragma: no cover - a redis-py that moved it: plain ResponseError
    _parse_error = None

from .links import check_primary

__all__ = [
    "AsyncSubscription",
    "Reconnect",
    "Subscriber",
    "async_open_subscriber",
    "open_subscriber",
    "sync_open_subscriber",
]

logger = logging.getLogger(__name__)


class Reconnect(Exception):
    """The subscriber connection can no longer be trusted (or cannot be made yet): replace it."""


def _cluster_node(client: Any, name: str) -> Any:
    if name == "?":
        raise Reconnect("no slot map")
    node = client.get_node(node_name=name)
    if node is None:
        raise Reconnect(f"node {name} is not in the slot map")
    return node


def sync_open_subscriber(client: Any, cluster: bool, name: str) -> Any:
    """A subscriber connection for the node ``name`` of ``client`` (a sync client)."""
    if not cluster:
        return open_subscriber(client)
    node = _cluster_node(client, name)
    if node.redis_connection is None:
        raise Reconnect(f"node {name} has no connection yet")
    check_primary(node.redis_connection.execute_command("ROLE"), name)
    return open_subscriber(node.redis_connection)


async def async_open_subscriber(client: Any, cluster: bool, name: str) -> AsyncSubscription:
    """A subscriber connection for the node ``name`` of ``client`` (an asyncio client)."""
    if not cluster:
        return AsyncSubscription(client.pubsub(ignore_subscribe_messages=False), None)
    node = _cluster_node(client, name)
    # the asyncio RedisCluster has no client per node: one of our own, made like its
    # connections (same connection class and options: TLS, credentials, timeouts)
    pool = redis.asyncio.ConnectionPool(
        connection_class=node.connection_class, max_connections=2, **node.connection_kwargs,
    )  # fmt: skip
    subscriber = redis.asyncio.Redis(connection_pool=pool)
    try:
        check_primary(await subscriber.execute_command("ROLE"), name)  # type: ignore[no-untyped-call]
    except BaseException:
        await pool.disconnect()
        raise
    return AsyncSubscription(subscriber.pubsub(ignore_subscribe_messages=False), pool)


class AsyncSubscription:
    """redis-py's asyncio ``PubSub`` and the private pool to close after it (None when it
    comes from the client's own pool)."""

    __slots__ = ("_pool", "_pubsub")

    def __init__(self, pubsub: Any, pool: Any) -> None:
        self._pubsub = pubsub
        self._pool = pool

    async def ssubscribe(self, *channels: bytes) -> None:
        await self._pubsub.ssubscribe(*channels)

    async def sunsubscribe(self, *channels: bytes) -> None:
        await self._pubsub.sunsubscribe(*channels)

    async def ping(self, token: bytes) -> None:
        await self._pubsub.ping(token)

    async def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        message: dict[str, Any] | None = await self._pubsub.get_message(timeout=timeout)
        return message

    async def aclose(self) -> None:
        try:
            await self._pubsub.aclose()
        finally:
            if self._pool is not None:
                await self._pool.disconnect()


def open_subscriber(client: Any) -> Any:
    """A subscriber connection of ``client`` (a ``redis.Redis``): a :class:`Subscriber` when
    the connection has a real socket, else (fakeredis) redis-py's own ``PubSub``, which has
    the same calls."""
    pool = client.connection_pool
    conn = pool.get_connection()
    sock = getattr(conn, "_sock", None)
    if isinstance(sock, socket.socket):  # TCP, Unix or TLS (ssl.SSLSocket)
        return Subscriber(pool, conn, sock)
    pool.release(conn)
    return client.pubsub(ignore_subscribe_messages=False)


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
    ``channel``, ``data``), which :func:`~luft_redis.links.handle_message` reads.
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
            if len(data) == self.BUFFER_SIZE:
                self._drain(max(timeout, 0.001))
            message = self._reader.gets()
        if message is False:
            return None
        return self._shape(message)

    def _drain(self, timeout: float) -> None:
        """After a ``recv`` that filled the buffer: take whatever else has arrived, without
        waiting (a listener that reads in batches must not fall behind by a buffer a batch);
        the socket gets ``timeout`` back (its sends must not see a non-blocking socket)."""
        sock = self._sock
        sock.settimeout(0.0)
        try:
            while True:
                try:
                    data = sock.recv(self.BUFFER_SIZE)
                except (BlockingIOError, ssl.SSLWantReadError, InterruptedError):
                    return
                if not data:
                    raise redis.exceptions.ConnectionError("the server closed the connection")
                self._reader.feed(data)
                if len(data) < self.BUFFER_SIZE:
                    return
        finally:
            sock.settimeout(timeout)

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


def _reply_error(text: str) -> redis.exceptions.RedisError:
    """The redis-py exception for an error reply (NOPERM: ``NoPermissionError``, ...), made
    by redis-py's own table of error codes."""
    error = _parse_error(text) if _parse_error is not None else None
    if isinstance(error, redis.exceptions.RedisError):
        return error
    return redis.exceptions.ResponseError(text)



