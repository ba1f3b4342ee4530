"""Exactly-once writes under network faults, through a fault-injecting TCP proxy.

:class:`FaultProxy` sits between a redis-py client and a real ``redis-server`` and breaks the
client's connection around ``FCALL`` commands (every luft-redis state change is one):

* ``reply`` faults: the command reaches Redis and is applied; when the first bytes of its reply
  come back, the proxy closes both sides instead of forwarding them. The client sees a
  ``ConnectionError`` for a write that *was* applied, and the backend's
  :class:`~luft_redis.retry.RetryPolicy` sends it again: the Lua scripts must recognise the
  repeated (writer id, operation) and return the stored reply without applying it twice.
* ``request`` faults: the connection is closed as the command arrives, before a byte of it is
  forwarded; the command never reaches Redis and the retry must apply it (once).
* ``late`` faults: the command is applied and its reply held back for ``late_by`` seconds
  before it is forwarded; a client whose ``socket_timeout`` is shorter gives up on it (the
  reply comes too late) and the retry meets a write that was applied already.

Error replies (``-ERR Function not found``, ``-LUFT_...``) are always forwarded: the command was
not applied.

The redis-py clients here are built with ``retry=Retry(NoBackoff(), 0)`` so that every retry
is the library's own (``RetryPolicy``), not redis-py's.

Runs against the session's private redis-server (marked ``server``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Literal

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStatus,
    AgentTask,
    Durability,
    Finding,
    LeaseLostError,
    Log,
    LogLevel,
    NotDurableError,
    NotResumableError,
    RedisCheckpointBackend,
    RunDone,
    RunMismatchError,
    RunNotFoundError,
    RunStatus,
    Severity,
    TaskState,
    TokenUsage,
    ValidationError,
)
from luft_redis import errors as luft_errors
from luft_redis import types as t
from luft_redis._sync import backend as sync_backend
from luft_redis._sync.listener import ChangeListener
from luft_redis.keys import limiter_key, pool_keys, run_keys
from luft_redis.retry import DEFAULT_RETRY, RetryPolicy, is_transient
from luft_redis.tools.server import LOOPBACK, LocalRedisServer, packaged_server

pytestmark = pytest.mark.server

FaultMode = Literal["off", "reply", "request", "late"]

#: Retries for the fault tests: many attempts, a long deadline, short waits (runtime).
GENEROUS = RetryPolicy(max_attempts=30, deadline=30.0, initial_delay=0.002, max_delay=0.05)

_CHUNK = 65536
_TOKEN = b"FCALL"  # also FCALL_RO


class _Link:
    """One client connection and its upstream connection to Redis."""

    __slots__ = ("awaiting", "client", "closed", "delay_reply", "drop_reply", "forced", "lock",
                 "upstream")  # fmt: skip

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.awaiting = False  # an FCALL was forwarded, its reply has not begun
        self.drop_reply = False
        self.delay_reply = False
        self.forced = False
        self.closed = False
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """A thread-based TCP proxy on 127.0.0.1 that drops connections around FCALL.

    ``mode`` and ``probability`` choose the random faults (``random.Random(seed)``);
    :meth:`fail_next` forces the next *n* FCALL commands to fail. Counters:
    ``faults`` (``reply_faults + request_faults + late_faults``), ``fcall_seen`` (FCALL commands the
    client sent, faulted or not), ``fcall_forwarded`` (those that reached Redis),
    ``spared`` (reply faults not made because the reply was an error), ``missing`` (replies
    ``-ERR Function not found``), ``connections``.
    """

    def __init__(self, upstream_port: int, *, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.late_by = 0.5  # seconds a ``late`` reply is held back
        self.mode: FaultMode = "off"
        self.probability = 0.0
        self._rng = random.Random(seed)
        self._forced: list[FaultMode] = []
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.reply_faults = 0
        self.request_faults = 0
        self.late_faults = 0
        self.fcall_seen = 0
        self.fcall_forwarded = 0
        self.spared = 0
        self.missing = 0
        self.connections = 0
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((LOOPBACK, 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)

    @property
    def faults(self) -> int:
        return self.reply_faults + self.request_faults + self.late_faults

    @property
    def attempts(self) -> int:
        """FCALL commands sent, less those Redis refused with "Function not found" (the backend
        then loads the library and sends the same command again, within one attempt)."""
        return self.fcall_seen - self.missing

    def start(self) -> FaultProxy:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self.drop_all()
        self._acceptor.join(timeout=5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=1)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def configure(self, mode: FaultMode, probability: float = 0.0) -> None:
        with self._lock:
            self.mode, self.probability = mode, probability

    def fail_next(self, count: int, mode: FaultMode) -> None:
        """Fault the next ``count`` FCALL commands with ``mode`` (before random faults)."""
        with self._lock:
            self._forced.extend([mode] * count)

    def drop_all(self) -> int:
        """Close every open connection (the effect of a network blip); how many were open."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        return len(links)

    # -- threads ---------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection((LOOPBACK, self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            with self._lock:
                self.connections += 1
                self._links.add(link)
                self._threads = [th for th in self._threads if th.is_alive()]
                for target in (self._pump_requests, self._pump_replies):
                    thread = threading.Thread(target=target, args=(link,), daemon=True)
                    self._threads.append(thread)
                    thread.start()

    def _decide(self) -> tuple[FaultMode, bool]:
        """(the fault for the FCALL just sent, whether it was forced)."""
        with self._lock:
            self.fcall_seen += 1
            if self._forced:
                return self._forced.pop(0), True
            if self.mode != "off" and self._rng.random() < self.probability:
                return self.mode, False
            return "off", False

    def _finish(self, link: _Link) -> None:
        link.close()
        with self._lock:
            self._links.discard(link)

    def _pump_requests(self, link: _Link) -> None:
        tail = b""
        try:
            while True:
                data = link.client.recv(_CHUNK)
                if not data:
                    return
                # the token opens a command; keep a few bytes in case a chunk splits it
                if _TOKEN in (tail + data).upper():
                    fault, forced = self._decide()
                    if fault == "request":
                        with self._lock:
                            self.request_faults += 1
                        return  # closed in finally: Redis never sees the command
                    with self._lock:
                        self.fcall_forwarded += 1
                    link.drop_reply, link.forced = fault == "reply", forced
                    link.delay_reply = fault == "late"
                    link.awaiting = True
                    tail = b""
                else:
                    tail = data[-(len(_TOKEN) - 1) :]
                link.upstream.sendall(data)
        except OSError:
            return
        finally:
            self._finish(link)

    def _pump_replies(self, link: _Link) -> None:
        try:
            while True:
                data = link.upstream.recv(_CHUNK)
                if not data:
                    return
                if link.awaiting:
                    link.awaiting = False
                    if data.startswith(b"-ERR Function not found"):
                        with self._lock:
                            self.missing += 1
                if link.delay_reply:
                    link.delay_reply = False
                    if data[:1] != b"-":
                        with self._lock:
                            self.late_faults += 1
                        time.sleep(self.late_by)  # the client may have given up meanwhile
                if link.drop_reply:
                    link.drop_reply = False
                    if data[:1] == b"-":
                        with self._lock:  # an error reply: nothing was applied, pass it on
                            self.spared += 1
                            if link.forced:  # e.g. Function not found: fault the next attempt
                                self._forced.insert(0, "reply")
                    else:
                        with self._lock:
                            self.reply_faults += 1
                        return  # closed in finally: the client never sees the reply
                link.client.sendall(data)
        except OSError:
            return
        finally:
            self._finish(link)


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def direct(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the (flushed) session server."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def proxy(redis_server: LocalRedisServer, redis_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port, seed=20240917) as p:
        yield p


def _proxied_client(proxy: FaultProxy) -> redis.Redis:
    """A client to the proxy; redis-py's own retries are off so every retry is luft's."""
    return redis.Redis(
        host=LOOPBACK, port=proxy.port, retry=Retry(NoBackoff(), 0),
        socket_timeout=10, socket_connect_timeout=5,
    )  # fmt: skip


@pytest.fixture
def proxied(proxy: FaultProxy) -> Iterator[redis.Redis]:
    client = _proxied_client(proxy)
    try:
        yield client
    finally:
        client.close()


def _fresh(direct: redis.Redis, run_id: uuid.UUID) -> RedisCheckpointBackend:
    reader = RedisCheckpointBackend(direct, watch=False)
    assert reader.open_run(run_id) is not None
    return reader


def _finding(n: int) -> Finding:
    return Finding(kind="bug", severity=Severity.HIGH, title=f"finding {n}", detail=f"op {n}")


def _agent(n: int) -> uuid.UUID:
    return uuid.UUID(int=(0xA5 << 120) | n)


# ------------------------------------------------------------------------------ tests


def test_proxy_passes_traffic_and_counts(proxy: FaultProxy, proxied: redis.Redis) -> None:
    """Without faults the proxy is transparent; a forced reply fault drops one connection."""
    assert proxied.ping()
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "proxy", "/tmp/proxy")
    assert proxy.fcall_forwarded >= 1 and proxy.faults == 0
    proxy.fail_next(1, "reply")
    backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="once"))
    assert proxy.reply_faults == 1
    assert [e.msg for e in backend.get_event_log() if isinstance(e, Log)] == ["once"]


def test_stats_count_retries_and_replays(proxy: FaultProxy, proxied: redis.Redis) -> None:
    """A dropped reply is one retry and, since Redis had applied the write, one replay; a
    dropped request is one retry and no replay. Every write is counted once."""
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "stats", "/tmp/stats")
    assert backend.stats().writes_total == 1
    assert backend.stats().write_retries_total == 0 and backend.stats().replays_total == 0
    proxy.fail_next(1, "reply")
    backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="reply lost"))
    proxy.fail_next(1, "request")
    backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="request lost"))
    stats = backend.stats()
    assert proxy.reply_faults == 1 and proxy.request_faults == 1
    assert stats.writes_total == 3
    assert stats.write_retries_total == 2
    assert stats.replays_total == 1
    assert stats.redis_wait_seconds_total > 0
    assert [e.msg for e in backend.get_event_log() if isinstance(e, Log)] == [
        "reply lost", "request lost"]  # fmt: skip


@pytest.mark.slow
def test_thousand_dropped_replies_apply_exactly_once(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis, full_run: bool
) -> None:
    """~3,000 writes, a third of the replies dropped after Redis applied them (>= 1,000
    faults): the log has each event once and in order, the sums are exact. The everyday
    loop (without ``--full``) plays a tenth of it: ~300 writes, >= 100 faults."""
    min_ops, max_ops, min_faults, budget = 3000, 4000, 1000, 240.0
    if not full_run:
        min_ops, max_ops, min_faults = min_ops // 10, max_ops // 10, min_faults // 10
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "dropped replies", "/tmp/faults")
    proxy.configure("reply", 1 / 3)

    events: list[t.AgentEvent] = []
    findings: list[Finding] = []
    results: dict[uuid.UUID, AgentResultCache] = {}
    done_tokens: dict[uuid.UUID, int] = {}
    sessions: dict[uuid.UUID, AgentSessionCheckpoint] = {}
    total = 0
    ops = 0
    started = time.monotonic()
    while ops < min_ops or (proxy.faults < min_faults and ops < max_ops):
        if time.monotonic() - started > budget:
            break
        kind = ops % 6
        if kind in (0, 2, 4):
            event: t.AgentEvent = Log(run_id=run_id, level=LogLevel.INFO, msg=f"log {ops}")
            backend.append_event(event)
            events.append(event)
        elif kind in (1, 3):
            tokens = TokenUsage(input=1000 + ops, output=ops % 97, cache_read=5)
            event = AgentDone(
                run_id=run_id, agent_id=_agent(ops), status=AgentStatus.OK, tokens=tokens,
                elapsed_ms=ops, findings=(_finding(ops),),
            )  # fmt: skip
            backend.append_event(event)
            events.append(event)
            findings.append(_finding(ops))
            done_tokens[_agent(ops)] = tokens.total()
            total += tokens.total()
        elif ops % 12 == 5:
            cache = AgentResultCache(
                agent_id=_agent(ops), phase_id=1, status="ok", output={"n": ops},
                findings=(_finding(ops),), tokens=ops, completed_at=1_700_000_000 + ops,
            )  # fmt: skip
            backend.upsert_agent_result(cache)
            results[cache.agent_id] = cache
            findings.append(_finding(ops))
        else:
            session = AgentSessionCheckpoint(
                agent_id=_agent(ops), session_id=f"s{ops}", status="running",
                updated_at=1_700_000_000 + ops, resumable=True,
            )  # fmt: skip
            backend.upsert_agent_session(session)
            sessions[session.agent_id] = session
        ops += 1
    elapsed = time.monotonic() - started
    proxy.configure("off")
    print(
        f"\n{ops} writes, {proxy.reply_faults} dropped replies, {proxy.spared} spared, "
        f"{proxy.fcall_seen} FCALL, {proxy.connections} connections, {elapsed:.1f}s"
    )
    assert proxy.reply_faults >= min_faults, (ops, proxy.reply_faults, elapsed)

    reader = _fresh(direct, run_id)
    log = reader.get_event_log()
    assert len(log) == len(events)
    assert log == events
    cp = reader.get_checkpoint()
    assert cp is not None
    assert cp.total_tokens == total
    assert list(cp.findings) == findings
    assert dict(cp.agent_sessions) == sessions
    assert set(cp.agent_results) == set(results) | set(done_tokens)
    for agent_id, expected in results.items():
        assert cp.agent_results[agent_id] == expected
    for agent_id, done in done_tokens.items():
        assert cp.agent_results[agent_id].tokens == done
    assert reader.version == ops + 1  # init_run + one version per write, none twice
    # the writer's cache went through the same faults and equals a fresh load
    assert backend.get_checkpoint() == cp
    # one writer wrote: one field in the writers hash
    keys = reader.keys
    assert keys is not None
    assert direct.hlen(keys.writers) == 1


def test_batch_retried_after_dropped_reply_applies_once(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """append_events (one script for the batch) whose reply is lost 1-3 times in a row."""
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "batches", "/tmp/batches")
    expected: list[t.AgentEvent] = []
    total = 0
    for b in range(60):
        batch: list[t.AgentEvent] = []
        for k in range(5):
            n = b * 10 + k
            if k % 2:
                tokens = TokenUsage(input=n + 1, output=2 * n)
                total += tokens.total()
                batch.append(AgentDone(
                    run_id=run_id, agent_id=_agent(n), status=AgentStatus.OK, tokens=tokens,
                    elapsed_ms=1, findings=(_finding(n),),
                ))  # fmt: skip
            else:
                batch.append(Log(run_id=run_id, level=LogLevel.WARN, msg=f"batch {b} #{k}"))
        before = backend.version
        proxy.fail_next(1 + b % 3, "reply")
        backend.append_events(batch)
        assert backend.version == before + 1
        expected += batch
    assert proxy.reply_faults == sum(1 + b % 3 for b in range(60))
    reader = _fresh(direct, run_id)
    assert reader.get_event_log() == expected
    cp = reader.get_checkpoint()
    assert cp is not None and cp.total_tokens == total and reader.version == 61
    assert backend.get_checkpoint() == cp


def test_delete_retried_after_a_dropped_reply_gets_its_first_answer(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """delete_run whose reply is lost 1-3 times: the retry answers True (the run existed), from
    the tombstone the first attempt left (issue 10, section 3: exactly-once deletes)."""
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    for lost in (1, 2, 3):
        run_id = uuid.uuid4()
        backend.init_run(run_id, "to delete", "/tmp/delete")
        backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
        faults = proxy.reply_faults
        proxy.fail_next(lost, "reply")
        assert backend.delete_run(run_id) is True
        assert proxy.reply_faults == faults + lost  # the delete was applied, then retried
        assert backend.run_id is None
        assert direct.exists(*run_keys("luft", run_id)[:9]) == 0
        # a new delete (a new operation) of the now missing run says so
        proxy.fail_next(1, "reply")
        assert backend.delete_run(run_id) is False


def test_dropped_requests_apply_exactly_once(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """The connection is cut as the command arrives (never applied), or after the reply
    (applied), at random: every write still lands exactly once."""
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "dropped requests", "/tmp/requests")
    proxy.fail_next(1, "request")
    backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="first"))
    assert proxy.request_faults == 1 and backend.version == 2
    events: list[t.AgentEvent] = [Log(run_id=run_id, level=LogLevel.INFO, msg="first")]
    total = 0
    rng = random.Random(7)
    for n in range(600):
        if n % 2:
            proxy.configure("request", 1 / 3)
        else:
            proxy.configure("reply", 1 / 3)
        if rng.random() < 0.5:
            tokens = TokenUsage(input=n, output=n + 3)
            total += tokens.total()
            event: t.AgentEvent = AgentDone(
                run_id=run_id, agent_id=_agent(n), status=AgentStatus.ERROR, tokens=tokens,
                elapsed_ms=n,
            )  # fmt: skip
        else:
            event = Log(run_id=run_id, level=LogLevel.DEBUG, msg=f"req {n}")
        backend.append_event(event)
        events.append(event)
    proxy.configure("off")
    print(f"\n601 writes, {proxy.request_faults} dropped requests, "
          f"{proxy.reply_faults} dropped replies")  # fmt: skip
    assert proxy.request_faults >= 60 and proxy.reply_faults >= 60
    reader = _fresh(direct, run_id)
    assert reader.get_event_log() == events
    cp = reader.get_checkpoint()
    assert cp is not None and cp.total_tokens == total and reader.version == 602
    assert backend.get_checkpoint() == cp


def test_non_transient_errors_are_not_retried(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """Domain and validation errors reach the caller on the first attempt."""
    backend = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "errors", "/tmp/errors")

    # client-side checks: no command at all
    seen = proxy.attempts
    with pytest.raises(RunMismatchError):
        backend.append_event(Log(run_id=uuid.uuid4(), level=LogLevel.INFO, msg="other run"))
    with pytest.raises(ValidationError):
        backend.append_events(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))  # type: ignore[arg-type]
    assert proxy.attempts == seen

    # domain error from the script: exactly one FCALL
    backend.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                                 total_tokens=TokenUsage()))  # fmt: skip
    seen = proxy.attempts
    with pytest.raises(NotResumableError):
        backend.reset_status_to_running()
    assert proxy.attempts == seen + 1

    # the run deleted behind the backend's back: LUFT_NO_RUN, one FCALL
    keys = backend.keys
    assert keys is not None
    direct.delete(keys.run)
    seen = proxy.attempts
    with pytest.raises(RunNotFoundError):
        backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="gone"))
    assert proxy.attempts == seen + 1
    assert proxy.faults == 0

    # a transient one is: three dropped requests, then it goes through
    other = RedisCheckpointBackend(proxied, watch=False, retry=GENEROUS)
    other_id = uuid.uuid4()
    other.init_run(other_id, "transient", "/tmp/transient")
    seen = proxy.attempts
    proxy.fail_next(3, "request")
    other.append_event(Log(run_id=other_id, level=LogLevel.INFO, msg="after 3 faults"))
    assert proxy.attempts == seen + 4 and proxy.request_faults == 3

    assert not is_transient(NotResumableError(run_id, "completed"))
    assert not is_transient(redis.exceptions.ResponseError("LUFT_NO_RUN x"))
    assert is_transient(redis.exceptions.ResponseError("LOADING Redis is loading"))
    assert is_transient(redis.exceptions.ConnectionError("reset"))


def test_retries_exhausted_then_next_write_recovers(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """A write whose every reply was lost raises ConnectionError, yet was applied once; the
    next write sees the version gap, reloads, and the cache matches Redis again."""
    policy = RetryPolicy(max_attempts=3, deadline=10.0, initial_delay=0.001, max_delay=0.01)
    backend = RedisCheckpointBackend(proxied, watch=False, retry=policy)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "exhausted", "/tmp/exhausted")
    lost = AgentDone(run_id=run_id, agent_id=_agent(1), status=AgentStatus.OK,
                     tokens=TokenUsage(input=10, output=5), elapsed_ms=1)  # fmt: skip
    proxy.fail_next(3, "reply")
    with pytest.raises(luft_errors.ConnectionError):
        backend.append_event(lost)
    assert proxy.reply_faults == 3
    assert backend.version == 1  # the cache did not see the reply

    # the same failure before the command reaches Redis: not applied at all
    proxy.fail_next(3, "request")
    with pytest.raises(luft_errors.ConnectionError):
        backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="never"))

    after = Log(run_id=run_id, level=LogLevel.INFO, msg="after")
    backend.append_event(after)
    reader = _fresh(direct, run_id)
    assert reader.get_event_log() == [lost, after]
    cp = reader.get_checkpoint()
    assert cp is not None and cp.total_tokens == 15 and reader.version == 3
    assert backend.get_checkpoint() == cp


def test_listener_recovers_from_dropped_connections(
    proxy: FaultProxy, direct: redis.Redis
) -> None:
    """An observer whose every connection (its change listener's too) is cut 20 times while
    another process writes: its cache converges to the run."""
    run_id = uuid.uuid4()
    writer = RedisCheckpointBackend(direct, watch=False)
    writer.init_run(run_id, "observed", "/tmp/observed")
    client = _proxied_client(proxy)
    try:
        observer = RedisCheckpointBackend(client, watch=True, retry=GENEROUS)
        assert observer.open_run(run_id) is not None
        listener = ChangeListener.for_client(client)
        dropped = 0
        for round_ in range(20):
            for k in range(5):
                writer.append_event(Log(run_id=run_id, level=LogLevel.INFO,
                                        msg=f"r{round_} k{k}"))  # fmt: skip
            reconnect_by = time.monotonic() + 5
            while not listener.connected and time.monotonic() < reconnect_by:
                time.sleep(0.01)  # the listener is back: cut it (and the rest) again
            dropped += proxy.drop_all()
            time.sleep(0.01)
        writer.append_event(AgentDone(run_id=run_id, agent_id=_agent(9), status=AgentStatus.OK,
                                      tokens=TokenUsage(input=3), elapsed_ms=1))  # fmt: skip
        deadline = time.monotonic() + 10
        while observer.version < writer.version and time.monotonic() < deadline:
            observer.wait_for_change(timeout=0.5)
        assert dropped >= 20
        assert observer.version == writer.version == 102
        assert observer.get_checkpoint() == writer.get_checkpoint()
        # and it is fresh again: a new change arrives by notice
        writer.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="last"))
        assert observer.wait_for_change(after_version=102, timeout=10)
        assert observer.get_checkpoint() == writer.get_checkpoint()
        observer.close()
    finally:
        client.close()


def test_default_policy_values() -> None:
    """The documented defaults (docs/reliability.md)."""
    expected = RetryPolicy(max_attempts=10, deadline=5.0, initial_delay=0.02, max_delay=1.0)
    assert expected == DEFAULT_RETRY


# ------------------------------------------------------------------------ leases under faults
# Claims, renews, releases and fenced writes (docs/leases.md) through the proxy: a lost or
# late reply never hands one agent to two holders, never loses a claim (a retried claim gets
# the same lease; an unanswered one lapses and is taken over), never applies a fenced write
# twice, and a fenced write that reaches Redis only after a takeover is refused.

#: Many quick attempts: the retries of a write outlast a takeover the test stages meanwhile.
PATIENT = RetryPolicy(max_attempts=400, deadline=20.0, initial_delay=0.002, max_delay=0.02)


def _lease_started(run_id: uuid.UUID, agent: uuid.UUID, note: str) -> t.AgentStarted:
    return t.AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview=note)


def _lease_done(run_id: uuid.UUID, agent: uuid.UUID) -> AgentDone:
    return AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                     tokens=TokenUsage(input=1), elapsed_ms=1)  # fmt: skip


def _lease_result(agent: uuid.UUID) -> AgentResultCache:
    return AgentResultCache(agent_id=agent, phase_id=0, status="ok", tokens=1,
                            completed_at=1, output={"by": "lease"}, findings=())  # fmt: skip


def _lease_token(direct: redis.Redis, run_id: uuid.UUID) -> int:
    return int(direct.hget(run_keys("luft", run_id).run, "lease_token") or 0)


def _impatient_clients(proxy: FaultProxy, n: int) -> list[redis.Redis]:
    """``n`` clients through the proxy that give up on a reply after 0.15 s (a late one is
    a timeout) and leave every retry to the library."""
    return [redis.Redis(host=LOOPBACK, port=proxy.port, retry=Retry(NoBackoff(), 0),
                        socket_timeout=0.15, socket_connect_timeout=5) for _ in range(n)]


def _submitted(direct: redis.Redis, n: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    run_id = uuid.uuid4()
    boss = RedisCheckpointBackend(direct, watch=False)
    boss.init_run(run_id, "leases under faults", "/d")
    agents = [uuid.uuid4() for _ in range(n)]
    boss.submit_agents([AgentTask(a, 0, {"i": i}) for i, a in enumerate(agents)])
    return run_id, agents


@pytest.mark.slow
def test_lease_cycles_under_lost_and_late_replies(proxy: FaultProxy, direct: redis.Redis) -> None:
    """Two workers through the proxy run 30 agents (claim, renew, fenced agent_started,
    result and agent_done) while a third of their FCALLs lose the request, lose the reply, or
    get it after the client gave up: every agent is handed out once (attempt 1, 30 tokens in
    all, increasing), never to both workers, and every fenced write is applied once."""
    n = 30
    run_id, agents = _submitted(direct, n)
    proxy.late_by = 0.3
    clients = _impatient_clients(proxy, 2)
    try:
        workers = [RedisCheckpointBackend(c, watch=False, retry=GENEROUS) for c in clients]
        for worker in workers:
            assert worker.open_run(run_id) is not None
        tokens: list[int] = []
        modes: list[FaultMode] = ["reply", "request", "late"]
        rounds = 0
        while len(tokens) < n and rounds < n:
            proxy.configure(modes[rounds % 3], 1 / 3)
            rounds += 1
            leases = [w.claim_agent(f"w{i}", lease_for=30.0) for i, w in enumerate(workers)]
            held = [lease for lease in leases if lease is not None]
            assert len({lease.agent_id for lease in held}) == len(held)  # never one for two
            tokens += [lease.token for lease in held]
            for worker, lease in zip(workers, leases, strict=True):
                if lease is None:
                    continue
                lease.renew()
                worker.append_event(_lease_started(run_id, lease.agent_id, "once"), lease=lease)
                worker.upsert_agent_result(_lease_result(lease.agent_id), lease=lease)
                worker.append_event(_lease_done(run_id, lease.agent_id), lease=lease)
                assert lease.finished and not lease.lost
        proxy.configure("off")
        print(f"\nleases: {proxy.reply_faults} lost replies, {proxy.request_faults} lost "
              f"requests, {proxy.late_faults} late replies, {proxy.fcall_seen} FCALL")  # fmt: skip
        assert min(proxy.reply_faults, proxy.request_faults, proxy.late_faults) >= 3
        assert tokens == sorted(tokens) == list(range(1, n + 1))  # no claim twice, none lost
        assert _lease_token(direct, run_id) == n
        reader = _fresh(direct, run_id)
        tasks = reader.agent_tasks()
        assert {task.agent_id for task in tasks} == set(agents)
        assert all(task.state is TaskState.DONE and task.attempt == 1 and task.failures == 0
                   for task in tasks)  # fmt: skip
        log = reader.get_event_log()
        for kind in (t.AgentStarted, AgentDone):
            assert sorted(e.agent_id for e in log if isinstance(e, kind)) == sorted(agents)
        cp = reader.get_checkpoint()
        assert cp is not None and cp.total_tokens == n
        assert {a: r.output for a, r in cp.agent_results.items()} == {
            a: {"by": "lease"} for a in agents}  # fmt: skip
        assert reader.version == 2 + n * 4  # init, submit, then claim + 3 writes per agent
    finally:
        for client in clients:
            client.close()


def test_pool_claims_under_lost_late_and_stalled_replies(
    proxy: FaultProxy, direct: redis.Redis
) -> None:
    """Two workers claim 30 agents of 3 pooled runs (the pool's max_leases and a rate limiter
    in play: picks, takes, claims, lease reports are all FCALLs) while a third of their FCALLs
    lose the request, lose the reply, or stall past the client's timeout without the
    connection closing: every agent is handed out once, the limiter admits each once, and the
    pool's lease count ends empty."""
    boss = RedisCheckpointBackend(direct, watch=False)
    boss.set_rate_limit("faulty-model", requests_per_minute=100_000, tokens_per_minute=10**9)
    boss.configure_pool("faulty", max_leases=4)
    agents: set[tuple[uuid.UUID, uuid.UUID]] = set()
    for _ in range(3):
        run_id = uuid.uuid4()
        boss.init_run(run_id, "pooled under faults", "/d", pool="faulty")
        tasks = [AgentTask(uuid.uuid4(), 0, None, "faulty-model", 10) for _ in range(10)]
        boss.submit_agents(tasks)
        agents |= {(run_id, task.agent_id) for task in tasks}
    proxy.late_by = 0.3
    clients = _impatient_clients(proxy, 2)
    try:
        workers = [RedisCheckpointBackend(c, watch=False, retry=GENEROUS) for c in clients]
        claimed: list[tuple[uuid.UUID, uuid.UUID, int]] = []
        modes: list[FaultMode] = ["reply", "request", "late"]
        rounds = 0
        while len(claimed) < len(agents) and rounds < 3 * len(agents):
            proxy.configure(modes[rounds % 3], 1 / 3)
            rounds += 1
            for i, worker in enumerate(workers):
                lease = worker.claim_agent(f"w{i}", pool="faulty", lease_for=30.0)
                if lease is None:
                    continue
                claimed.append((lease.run_id, lease.agent_id, lease.attempt))
                worker.append_event(_lease_done(lease.run_id, lease.agent_id), lease=lease)
                assert lease.finished and not lease.lost
        proxy.configure("off")
        print(f"\npool: {proxy.reply_faults} lost replies, {proxy.request_faults} lost "
              f"requests, {proxy.late_faults} late replies, {proxy.fcall_seen} FCALL")  # fmt: skip
        assert min(proxy.reply_faults, proxy.request_faults, proxy.late_faults) >= 3
        assert sorted((r, a) for r, a, _ in claimed) == sorted(agents)  # each once
        assert {attempt for _, _, attempt in claimed} == {1}
        limiter = direct.hgetall(limiter_key("luft", "faulty-model"))
        assert int(limiter[b"admitted"]) == len(agents)
        assert int(limiter[b"tokens"]) == len(agents) * 1  # reserved 10, settled to 1 each
        assert direct.zcard(pool_keys("luft", "faulty").leases) == 0
    finally:
        for client in clients:
            client.close()


def test_an_unanswered_claim_lapses_and_is_taken_over(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """A claim applied in Redis whose every reply was lost (the worker gave up) leaves the
    task leased to nobody who knows it only until the lease lapses: then it is taken over."""
    run_id, (agent,) = _submitted(direct, 1)
    policy = RetryPolicy(max_attempts=2, deadline=5.0, initial_delay=0.001, max_delay=0.01)
    worker = RedisCheckpointBackend(proxied, watch=False, retry=policy)
    assert worker.open_run(run_id) is not None
    proxy.fail_next(2, "reply")
    with pytest.raises(luft_errors.ConnectionError):
        worker.claim_agent("forgetful", lease_for=0.3)
    assert proxy.reply_faults == 2
    other = _fresh(direct, run_id)
    (task,) = other.agent_tasks()
    assert task.state is TaskState.LEASED and task.holder == "forgetful" and task.attempt == 1
    assert other.claim_agent("heir") is None  # not before the lease lapses
    heir = other.claim_agent("heir", timeout=10)
    assert heir is not None and heir.agent_id == agent and heir.attempt == 2 and heir.token == 2
    assert worker.claim_agent("forgetful") is None  # a new claim: nothing left to hand out
    other.append_event(_lease_done(run_id, agent), lease=heir)
    assert [task.state for task in other.agent_tasks()] == [TaskState.DONE]


def _takeover_while_retrying(proxy: FaultProxy, direct: redis.Redis, run_id: uuid.UUID,
                             found: list[object]) -> threading.Thread:  # fmt: skip
    """Drop every FCALL request for a while, take the lapsed task over directly, then let
    the retries of the stale holder through."""

    def stage() -> None:
        time.sleep(0.45)  # the 0.3 s lease lapses
        heir = _fresh(direct, run_id)
        found.append(heir.claim_agent("heir"))
        proxy.configure("off")

    proxy.configure("request", 1.0)
    thread = threading.Thread(target=stage)
    thread.start()
    return thread


def test_a_fenced_write_applied_before_a_takeover_is_not_applied_again(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis
) -> None:
    """The reply of a fenced write is lost and its retries go on until after another worker
    took the task over: the retry gets the first answer (the write was accepted while the
    lease was current) and nothing is written twice; the next fenced write is refused."""
    run_id, (agent,) = _submitted(direct, 1)
    zombie = RedisCheckpointBackend(proxied, watch=False, retry=PATIENT)
    assert zombie.open_run(run_id) is not None
    lease = zombie.claim_agent("zombie", lease_for=0.3)
    assert lease is not None
    found: list[object] = []
    proxy.fail_next(1, "reply")
    thread = _takeover_while_retrying(proxy, direct, run_id, found)
    zombie.append_event(_lease_started(run_id, agent, "zombie"), lease=lease)
    thread.join(10)
    (heir,) = found
    assert heir is not None and heir.token > lease.token  # type: ignore[attr-defined]
    assert proxy.reply_faults == 1 and proxy.request_faults >= 1
    with pytest.raises(LeaseLostError):
        zombie.append_event(_lease_done(run_id, agent), lease=lease)
    log = _fresh(direct, run_id).get_event_log()
    assert [e.prompt_preview for e in log if isinstance(e, t.AgentStarted)] == ["zombie"]
    assert not any(isinstance(e, AgentDone) for e in log)


@pytest.mark.parametrize("operation", ["append_event", "upsert_agent_result", "renew",
                                       "release"])  # fmt: skip
def test_a_fenced_write_that_arrives_after_a_takeover_is_refused(
    proxy: FaultProxy, proxied: redis.Redis, direct: redis.Redis, operation: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fenced write (and a renew, a release) whose requests are lost until another worker
    took the task over reaches Redis too late: LeaseLostError, and nothing is written."""
    if operation == "release":  # a release gives up after RELEASE_FLOOR (1 s); a loaded
        # machine may take longer to stage the takeover, so this one waits long enough
        monkeypatch.setattr(sync_backend, "RELEASE_FLOOR", 10.0)
    run_id, (agent,) = _submitted(direct, 1)
    zombie = RedisCheckpointBackend(proxied, watch=False, retry=PATIENT)
    assert zombie.open_run(run_id) is not None
    lease = zombie.claim_agent("zombie", lease_for=0.3)
    assert lease is not None
    found: list[object] = []
    thread = _takeover_while_retrying(proxy, direct, run_id, found)
    if operation == "renew":  # a renew retries only within the lease's time left: it gives up
        with contextlib.suppress(luft_errors.ConnectionError), pytest.raises(LeaseLostError):
            lease.renew()  # (or it meets the takeover: refused as well)
        thread.join(10)
    with pytest.raises(LeaseLostError) as caught:
        if operation == "append_event":
            zombie.append_event(_lease_done(run_id, agent), lease=lease)
        elif operation == "upsert_agent_result":
            zombie.upsert_agent_result(_lease_result(agent), lease=lease)
        elif operation == "renew":
            lease.renew()
        else:
            lease.release()
    thread.join(10)
    (heir,) = found
    assert heir is not None and caught.value.current == heir.token  # type: ignore[attr-defined]
    assert proxy.request_faults >= 1 and lease.lost
    reader = _fresh(direct, run_id)
    assert reader.version == 4  # init, submit, two claims: no write of the zombie's after
    cp = reader.get_checkpoint()
    assert cp is not None and not cp.agent_results and not reader.get_event_log()
    (task,) = reader.agent_tasks()
    assert task.state is TaskState.LEASED and task.holder == "heir"


@pytest.mark.slow
def test_async_lease_cycles_under_lost_and_late_replies(
    proxy: FaultProxy, direct: redis.Redis
) -> None:
    """The asyncio front end through the same faults: two workers on one loop run 15 agents
    concurrently; every agent handed out once, every fenced write applied once."""
    import asyncio

    import redis.asyncio
    from redis.asyncio.retry import Retry as AsyncRetry

    from luft_redis import AsyncRedisCheckpointBackend

    n = 15
    run_id, agents = _submitted(direct, n)
    proxy.late_by = 0.3
    tokens: list[int] = []

    async def worker(name: str) -> None:
        client = redis.asyncio.Redis(host=LOOPBACK, port=proxy.port,
                                     retry=AsyncRetry(NoBackoff(), 0), socket_timeout=0.15,
                                     socket_connect_timeout=5)  # fmt: skip
        async with AsyncRedisCheckpointBackend(client, watch=False, retry=GENEROUS) as backend:
            assert await backend.open_run(run_id) is not None
            while (lease := await backend.claim_agent(name, lease_for=30.0)) is not None:
                tokens.append(lease.token)
                await lease.renew()
                await backend.append_event(_lease_started(run_id, lease.agent_id, name),
                                           lease=lease)  # fmt: skip
                await backend.upsert_agent_result(_lease_result(lease.agent_id), lease=lease)
                await backend.append_event(_lease_done(run_id, lease.agent_id), lease=lease)
                assert lease.finished and not lease.lost
        await client.aclose()

    async def main() -> None:
        await asyncio.gather(worker("a0"), worker("a1"))

    rng = random.Random(7)
    modes: list[FaultMode] = ["reply", "request", "late"]
    proxy.fail_next(12, "off")  # the library loads and both runs open without faults
    proxy.configure(modes[rng.randrange(3)], 1 / 3)

    stop = threading.Event()

    def switch() -> None:  # change the kind of fault every 50 ms while the workers run
        while not stop.wait(0.05):
            proxy.configure(modes[rng.randrange(3)], 1 / 3)

    switcher = threading.Thread(target=switch)
    switcher.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        switcher.join(5)
        proxy.configure("off")
    print(f"\nasync leases: {proxy.reply_faults} lost replies, {proxy.request_faults} lost "
          f"requests, {proxy.late_faults} late replies")  # fmt: skip
    assert proxy.faults >= 5
    assert sorted(tokens) == list(range(1, n + 1))  # each agent handed out once
    assert _lease_token(direct, run_id) == n
    reader = _fresh(direct, run_id)
    assert all(task.state is TaskState.DONE and task.attempt == 1
               for task in reader.agent_tasks())  # fmt: skip
    log = reader.get_event_log()
    for kind in (t.AgentStarted, AgentDone):
        assert sorted(e.agent_id for e in log if isinstance(e, kind)) == sorted(agents)
    assert reader.version == 2 + n * 4


# ------------------------------------------------ a replayed durable write waits for replicas


@pytest.fixture(params=["default", "redis-8.2", "valkey-9"])
def primary_and_replica(request: pytest.FixtureRequest, redis_server_binary: str
                        ) -> Iterator[tuple[LocalRedisServer, LocalRedisServer]]:  # fmt: skip
    """A private primary and one replica of it, in sync, on the default server and on the
    packaged ones (which count a connection's writes for ``WAIT`` differently: see below)."""
    binary = redis_server_binary
    if request.param != "default":
        try:
            binary = packaged_server(request.param)
        except FileNotFoundError as exc:
            pytest.skip(f"{request.param}: {exc}")
    primary = LocalRedisServer(binary=binary).start()
    replica = LocalRedisServer(
        binary=binary, extra_args=["--replicaof", LOOPBACK, str(primary.port)]
    ).start()
    try:
        with redis.Redis(host=LOOPBACK, port=replica.port) as conn:
            deadline = time.monotonic() + 15
            while conn.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica did not sync"
                time.sleep(0.05)
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def test_a_replayed_durable_write_is_only_acknowledged_once_replicated(
    primary_and_replica: tuple[LocalRedisServer, LocalRedisServer],
) -> None:
    """A durable write applied on the primary whose reply was lost is retried on a new
    connection, where the script replays it without applying it again. ``WAIT`` counts the
    replicas that caught up with *that connection's* last write: the replay must make one, or
    a replica that never received the write acknowledges it at once (Redis 8.2 and Valkey 9
    did, before the replay wrote; Redis 7.0 moves a connection's offset on every command).
    With the replica stopped the retried write is reported NotDurableError, never
    acknowledged; once the replica resumes, the write is there exactly once."""
    primary, replica = primary_and_replica
    assert replica.pid is not None
    with FaultProxy(primary.port, seed=7) as proxy:
        client = _proxied_client(proxy)
        durable = Durability(replicas=1, timeout_ms=300)
        backend = RedisCheckpointBackend(client, watch=False, retry=GENEROUS, durability=durable)
        run_id = uuid.uuid4()
        backend.init_run(run_id, "durable replay", "/tmp/durable")
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            proxy.fail_next(1, "reply")
            with pytest.raises(NotDurableError) as caught:
                backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="replayed"))
            assert caught.value.acked == 0
            assert backend.stats().replays_total == 1
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        with redis.Redis(host=LOOPBACK, port=replica.port) as conn:
            reader = RedisCheckpointBackend(conn, watch=False)
            deadline = time.monotonic() + 15
            while True:
                assert reader.open_run(run_id) is not None
                msgs = [e.msg for e in reader.get_event_log() if isinstance(e, Log)]
                if msgs or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert msgs == ["replayed"]
        backend.close()
        client.close()
