"""The sync listener's subscriber connection (``luft_redis._sync.listener.Subscriber``) and thread.

The subscriber reads its socket with a RESP reader of its own instead of redis-py's
``PubSub.get_message``: these tests feed it RESP2 and RESP3 bytes over a socket pair (split
anywhere, errors, a closed peer), then run it against a real server on both protocols, and
check that the listener thread runs at the priority ``LISTENER_NICE`` says (assigned or not).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.exceptions

from luft_redis import AgentDone, AgentStatus, RedisCheckpointBackend, TokenUsage
from luft_redis._sync import listener as listener_module
from luft_redis._sync.listener import ChangeListener
from luft_redis.subscriber import Subscriber, open_subscriber


class _Pool:
    def __init__(self) -> None:
        self.released: list[Any] = []

    def release(self, conn: Any) -> None:
        self.released.append(conn)


class _Conn:
    """What a Subscriber needs of a redis-py connection: send_command and disconnect."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.disconnected = False

    def send_command(self, *args: Any, check_health: bool = True) -> None:
        assert check_health is False  # a health check would read replies off the socket
        self.sent.append(args)

    def disconnect(self) -> None:
        self.disconnected = True


@pytest.fixture
def wired() -> Iterator[tuple[Subscriber, socket.socket, _Conn, _Pool]]:
    ours, server = socket.socketpair()
    pool, conn = _Pool(), _Conn()
    sub = Subscriber(pool, conn, ours)
    try:
        yield sub, server, conn, pool
    finally:
        sub.close()
        server.close()
        ours.close()


def test_resp2_messages_split_anywhere_come_out_whole(wired: Any) -> None:
    sub, server, _, _ = wired
    stream = (b"*3\r\n$10\r\nssubscribe\r\n$2\r\nch\r\n:1\r\n"
              b"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n"
              b"*2\r\n$4\r\npong\r\n$6\r\nluft-1\r\n")  # fmt: skip
    got: list[dict[str, Any]] = []
    for i in range(0, len(stream), 7):  # 7-byte pieces: every message arrives split
        server.sendall(stream[i : i + 7])
        time.sleep(0.002)
        message = sub.get_message(timeout=0.5)
        while message is not None:
            got.append(message)
            message = sub.get_message(timeout=0)
    assert got == [
        {"type": "ssubscribe", "channel": b"ch", "data": 1},
        {"type": "smessage", "channel": b"ch", "data": b"hello"},
        {"type": "pong", "channel": None, "data": b"luft-1"},
    ]


def test_resp3_pushes_and_the_plain_ping_reply(wired: Any) -> None:
    sub, server, _, _ = wired
    server.sendall(b">3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n$6\r\nluft-7\r\n+PONG\r\n"
                   b">3\r\n$12\r\nsunsubscribe\r\n$2\r\nch\r\n:0\r\n")  # fmt: skip
    first = sub.get_message(timeout=1.0)
    assert first == {"type": "smessage", "channel": b"ch", "data": b"abc"}
    # the rest was read by the same recv: handed out with no system call (timeout=0)
    assert sub.get_message(timeout=0) == {"type": "pong", "channel": None, "data": b"luft-7"}
    assert sub.get_message(timeout=0) == {"type": "pong", "channel": None, "data": b""}
    assert sub.get_message(timeout=0) == {"type": "sunsubscribe", "channel": b"ch", "data": 0}
    assert sub.get_message(timeout=0) is None


def test_a_backlog_larger_than_the_buffer_is_read_by_one_call(wired: Any) -> None:
    """A listener that reads in batches finds more than ``BUFFER_SIZE`` bytes waiting: one
    ``get_message(timeout)`` takes all of it (the rest without waiting), every message comes
    out with ``timeout=0``, and the socket is blocking with a timeout again afterwards."""
    sub, server, _, _ = wired
    payload = b"x" * 1000
    one = b"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$1000\r\n" + payload + b"\r\n"
    count = 3 * Subscriber.BUFFER_SIZE // len(one) + 7
    writer = threading.Thread(target=server.sendall, args=(one * count,))
    writer.start()
    time.sleep(0.2)  # the socket buffers fill (the writer may still be blocked: fine)
    got = [sub.get_message(timeout=1.0)]
    while got[-1] is not None:
        got.append(sub.get_message(timeout=0))
    assert len(got) - 1 > Subscriber.BUFFER_SIZE // len(one)  # more than one buffer's worth
    assert sub._sock.gettimeout() == 1.0
    writer.join(5)
    while len(got) - 1 < count:  # what the peer sent after that: the same messages, in order
        message = sub.get_message(timeout=1.0)
        assert message is not None
        got.insert(-1, message)
    assert all(m == {"type": "smessage", "channel": b"ch", "data": payload} for m in got[:-1])


def test_nothing_arrives_within_the_timeout(wired: Any) -> None:
    sub, _, _, _ = wired
    started = time.monotonic()
    assert sub.get_message(timeout=0.05) is None
    assert 0.04 <= time.monotonic() - started < 1.0
    assert sub.get_message(timeout=0) is None


def test_an_error_reply_is_redis_pys_exception(wired: Any) -> None:
    sub, server, _, _ = wired
    server.sendall(b"-NOPERM this user has no permissions to access one of the channels\r\n")
    with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions"):
        sub.get_message(timeout=1.0)


def test_a_closed_peer_is_a_connection_error(wired: Any) -> None:
    sub, server, _, _ = wired
    server.close()
    with pytest.raises(redis.exceptions.ConnectionError):
        sub.get_message(timeout=1.0)


def test_commands_go_out_without_a_health_check_and_close_releases_once(wired: Any) -> None:
    sub, _, conn, pool = wired
    sub.ssubscribe(b"a", b"b")
    sub.ping(b"luft-1")
    sub.sunsubscribe(b"a")
    assert conn.sent == [("SSUBSCRIBE", b"a", b"b"), ("PING", b"luft-1"), ("SUNSUBSCRIBE", b"a")]
    sub.close()
    sub.close()
    assert conn.disconnected and pool.released == [conn]


def test_fakeredis_gets_redis_pys_pubsub() -> None:
    fakeredis = pytest.importorskip("fakeredis")
    client = fakeredis.FakeRedis()
    opened = open_subscriber(client)
    try:
        assert not isinstance(opened, Subscriber)
        assert isinstance(opened, redis.client.PubSub)
    finally:
        opened.close()
        client.close()


def _done(run_id: uuid.UUID) -> AgentDone:
    return AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                     tokens=TokenUsage(input=5, output=1), elapsed_ms=1)  # fmt: skip


def _eventually(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


@pytest.mark.server
@pytest.mark.parametrize("protocol", [2, 3])
def test_a_reader_on_either_protocol_follows_another_writer(redis_url: str,
                                                             protocol: int) -> None:  # fmt: skip
    """Against a real server: the reader's listener reads notices, confirmations and PONGs
    through a Subscriber on a RESP2 and on a RESP3 connection."""
    reader_client = redis.Redis.from_url(redis_url, protocol=protocol)
    writer_client = redis.Redis.from_url(redis_url)
    writer = RedisCheckpointBackend(writer_client, prefix="sub")
    reader = RedisCheckpointBackend(reader_client, prefix="sub")
    try:
        run_id = uuid.uuid4()
        writer.init_run(run_id, "t", "/d")
        reader.open_run(run_id)
        assert _eventually(lambda: reader.cache_is_fresh)
        link = next(iter(ChangeListener.for_client(reader_client)._router.links.values()))
        assert link.health.age(time.monotonic()) is not None  # a PONG came back
        for _ in range(20):
            writer.append_event(_done(run_id))
        target = writer.version
        assert _eventually(lambda: reader.version == target)
        assert reader.get_checkpoint() == writer.get_checkpoint()
        assert reader.cache_is_fresh
    finally:
        reader.close()
        writer.close()
        reader_client.close()
        writer_client.close()


def _thread_nice(name_part: str) -> int | None:
    for thread in threading.enumerate():
        if name_part in thread.name and thread.native_id is not None:
            return os.getpriority(os.PRIO_PROCESS, thread.native_id)
    return None


@pytest.mark.server
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priority: Linux only")
@pytest.mark.parametrize("nice", [19, None])
def test_only_the_listener_thread_runs_at_listener_nice(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, nice: int | None
) -> None:
    """The listener thread runs at LISTENER_NICE (None by default: the process's own; 19 when
    assigned); the thread that binds and the refresher thread (reloads, callbacks) keep
    theirs."""
    assert listener_module.LISTENER_NICE is None
    monkeypatch.setattr(listener_module, "LISTENER_NICE", nice)
    client = redis.Redis.from_url(redis_url)
    backend = RedisCheckpointBackend(client, prefix="nice")
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        backend.init_run(uuid.uuid4(), "t", "/d")
        assert _eventually(lambda: backend.cache_is_fresh)
        tag = f"{id(client):x}"
        expected = before if nice is None else max(nice, before)
        assert _thread_nice(f"luft-redis-listener-redis-{tag}") == expected
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
        assert _thread_nice(f"luft-redis-refresher-{tag}") == before
    finally:
        backend.close()
        client.close()
