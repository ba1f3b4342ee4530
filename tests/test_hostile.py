"""Hostile cases for cache coherence (``../shared/design/coherence.md``, "What to test"), on
both front ends.

Every test here would fail on a cache that is wrong while it says it is fresh (or that never
finds its way back to fresh). Each test of sections 2 to 6 runs on the sync
``RedisCheckpointBackend`` and on the asyncio ``AsyncRedisCheckpointBackend`` (the ``frontend``
fixture: ids ``sync-...`` and ``async-...``); the asyncio one is driven through conftest.py's
``AsyncBackendProxy``, which runs every call on the backend's own event loop (a daemon thread),
so the test reads the same on both. The faults hit the real mechanism of each front end (see
:class:`FrontEnd`).

1. Fork, sync only: the asyncio backend refuses by design to work in a forked child, with
   ``ForkedError`` (``test_a_backend_made_before_a_fork_refuses_to_work_in_the_child`` in
   tests/test_asyncio.py). ``test_forked_children_write_exactly_once``: a bound backend is
   inherited by 4 children forked after binding; each writes 30 events through it at once.
   Every acknowledged write is stored once, every child has its own writer id, no child's cache
   reports fresh at the fork, and each converges.
   ``test_a_forked_child_never_reports_fresh_before_reloading``: another thread of the child
   reads ``cache_is_fresh`` throughout the fork handling.
   ``test_forked_reader_sees_the_parents_cancel``: a child that only reads still learns of a
   change.
2. ``test_noop_cancel_from_a_lagging_cache``: ``cancel()`` of a run another process completed
   meanwhile (a no-op), from a cache that lags (``watch=False``, notices delayed or dropped).
3. ``test_stalled_subscriber``: the connections stop delivering without a FIN (a TCP proxy
   that stalls): the cache stops reporting fresh within ``max_staleness``, never reports fresh
   with the pre-cancel state, and converges once the link is back, or replaced by the library
   itself, or reloaded at once by ``sync()`` through the stalled pool.
4. ``test_recreated_run_is_followed``: the run is deleted and re-created, or the server loses
   its data (FLUSHALL) and the run is re-created; every bound cache (two of them sharing one
   client and listener) follows the new incarnation, none reports fresh while showing the old
   one, the old writer's next write lands in the new incarnation and in its own cache, and a
   writer that does not watch learns of the new incarnation from its own write. Also: a write
   told LUFT_NO_RUN stops vouching; a late delete notice of the old incarnation does not strand
   a reloaded cache.
5. ``test_slow_wait_does_not_delay_notices``: a backend writing with a ``WAIT`` that takes 1 s
   does not hold up the notices of another backend on the same client.
6. ``test_random_interleavings``: random operations (writes, no-ops, deletes and re-inits,
   delayed notices, dropped subscriber connections, ``CLIENT KILL TYPE pubsub``) over three
   backends; after each step a cache that reports fresh equals a fresh load and a cache at the
   stored version holds the stored state; in the end ``sync()`` converges everywhere.
   ``test_random_interleavings_regain_freshness_unaided``: the same, without ``sync()``.

"Delayed notices" are delayed on the wire's side of the listener (:class:`DelayedSubscriber`,
:class:`AsyncDelayedSubscriber`): every message of the subscriber connection (notices,
confirmations and PING replies alike) is handed over ``seconds`` late and in order, as a slow
network would. Dropping notices while the PINGs still get through (replacing the listener's
``_targets``) breaks the ordering the health check relies on, so it is only used where the test
asserts nothing about freshness.

Runs on fakeredis and a private redis-server (marked ``server``); the fork test uses
fakeredis served over TCP (``TcpFakeServer``) so the children share the parent's server.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import multiprocessing
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import fakeredis
import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

import luft_redis.cache as cache_mod
from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentStatus,
    AgentTask,
    CheckpointStatus,
    Log,
    LogLevel,
    NotDurableError,
    NotResumableError,
    RedisCheckpointBackend,
    RunCheckpoint,
    RunDone,
    RunNotFoundError,
    RunStatus,
    TokenUsage,
)
from luft_redis._sync.backend import Durability
from luft_redis._sync.listener import ChangeListener
from luft_redis.asyncio import AsyncChangeListener
from luft_redis.errors import ConnectionError as LuftConnectionError
from luft_redis.tools.server import LOOPBACK, LocalRedisServer, find_free_port


def _examples(count: int) -> int:
    """*count* examples under the Hypothesis profile ``ci`` (``pytest --full``, 100 examples by
    default), a quarter of them under ``dev`` (the everyday loop); see tests/conftest.py."""
    return max(min(count, 2), count * settings().max_examples // 100)


Client: TypeAlias = "redis.Redis | RedisCluster"
Factory: TypeAlias = Callable[..., Any]

pytestmark = pytest.mark.timeout(300)

BOUND = 5.0
"""Seconds any convergence may take (far above the expected milliseconds)."""

FAKE_AND_REDIS = ["fakeredis", pytest.param("redis", marks=pytest.mark.server)]
REDIS_ONLY = [pytest.param("redis", marks=pytest.mark.server)]


# ------------------------------------------------------------------------------ helpers


def eventually(predicate: Callable[[], bool], bound: float = BOUND, step: float = 0.002) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def load(client: Any, run_id: uuid.UUID) -> RunCheckpoint | None:
    """The run as stored now, read by a new (sync) backend on the sync ``client``: no cache of
    its own to trust."""
    return RedisCheckpointBackend(client, watch=False).open_run(run_id)


def agent_done(run_id: uuid.UUID, agent: uuid.UUID | None = None, tokens: int = 1) -> AgentDone:
    return AgentDone(
        run_id=run_id, agent_id=agent or uuid.uuid4(), status=AgentStatus.OK,
        tokens=TokenUsage(input=tokens), elapsed_ms=1,
    )  # fmt: skip


def completed(run_id: uuid.UUID) -> RunDone:
    return RunDone(run_id=run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage())


def result(agent: uuid.UUID, n: int) -> AgentResultCache:
    return AgentResultCache(agent_id=agent, phase_id=0, status="ok", output={"n": n},
                            findings=(), tokens=n, completed_at=n)  # fmt: skip


def describe(backend: Any) -> str:
    cp = backend.get_checkpoint()
    shown = "unbound" if cp is None else f"task={cp.task!r} status={cp.status.value}"
    return f"fresh={backend.cache_is_fresh} v={backend.version} {shown}"


def is_fresh_and_current(backend: Any, client: Any) -> bool:
    """Fresh, and (read after that) equal to what is stored (``client``: a sync client)."""
    if not backend.cache_is_fresh:
        return False
    run_id = backend.run_id
    assert run_id is not None
    return bool(backend.get_checkpoint() == load(client, run_id))


class NoticeDelay:
    """How late a delayed subscriber connection hands over its messages (seconds)."""

    def __init__(self) -> None:
        self.seconds = 0.0


class _Held:
    """The messages a delayed subscriber connection has read and not yet handed over."""

    def __init__(self, inner: Any, gate: NoticeDelay) -> None:
        self._inner = inner
        self._gate = gate
        self._held: collections.deque[tuple[float, Any]] = collections.deque()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _next(self, deadline: float) -> tuple[bool, Any, float]:
        """``(True, message)`` when the oldest held message is due (or ``(True, None)`` at the
        deadline), else ``(False, None, seconds to read for)``."""
        now = time.monotonic()
        delay = self._gate.seconds
        if self._held and now - self._held[0][0] >= delay:
            return True, self._held.popleft()[1], 0.0
        if now >= deadline:
            return True, None, 0.0
        wait = deadline - now
        if self._held:
            wait = min(wait, self._held[0][0] + delay - now)
        return False, None, max(wait, 0.001)


class DelayedSubscriber(_Held):
    """A sync subscriber connection whose messages arrive ``gate.seconds`` late, in order.

    Notices, subscription confirmations and PING replies are held alike, so the listener's
    health check sees exactly the lag a slow network would give it.
    """

    def _pull(self, timeout: float) -> None:
        message = self._inner.get_message(timeout=timeout)
        while message is not None:
            self._held.append((time.monotonic(), message))
            message = self._inner.get_message(timeout=0)

    def get_message(self, timeout: float = 0.0) -> Any:
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            self._pull(0)
            done, message, wait = self._next(deadline)
            if done:
                return message
            self._pull(wait)


class AsyncDelayedSubscriber(_Held):
    """:class:`DelayedSubscriber` for the asyncio listener (its ``AsyncSubscription``)."""

    async def _pull(self, timeout: float) -> None:
        message = await self._inner.get_message(timeout=timeout)
        while message is not None:
            self._held.append((time.monotonic(), message))
            message = await self._inner.get_message(timeout=0)

    async def get_message(self, timeout: float = 0.0) -> Any:
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            await self._pull(0)
            done, message, wait = self._next(deadline)
            if done:
                return message
            await self._pull(wait)


class FrontEnd:
    """The front end under test, as the hostile helpers need it.

    ``sync``: clients and backends are the sync ones, and everything runs in the calling
    thread. ``async``: clients are asyncio clients made on ``loop`` (conftest.py's
    ``EventLoopThread``), backends are ``AsyncBackendProxy``s on them, and whatever touches
    the listener (one per client *and* event loop) runs on that loop (:meth:`here`).
    """

    def __init__(self, name: str, loop: Any, open_client: Callable[[], Any],
                 make_backend: Factory, backend_type: Factory) -> None:  # fmt: skip
        self.name = name
        self.loop = loop
        self.client = open_client
        """A new client of this front end to the current target (closed after the test)."""
        self.backend = make_backend
        """``make(client=None, **kwargs)``: a backend (closed after the test)."""
        self.backend_type = backend_type
        """The backend class, ``cls(client, **kwargs)``: for backends the test closes."""
        self._sync_made: list[Any] = []

    def here(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` where the front end's own code runs: in this thread (sync), or
        on the event loop (asyncio, awaiting what it returns)."""
        return function(*args) if self.loop is None else self.loop.call(function, *args)

    def client_to(self, port: int, **options: Any) -> Any:
        """A client of this front end to 127.0.0.1:``port`` with redis-py's own retries off
        (every retry is the backend's), closed after the test (or by :meth:`close_client`)."""
        if self.loop is None:
            sync_client = redis.Redis(host=LOOPBACK, port=port, retry=Retry(NoBackoff(), 0),
                                      **options)  # fmt: skip
            self._sync_made.append(sync_client)
            return sync_client
        return self.loop.open_client(lambda: redis.asyncio.Redis(
            host=LOOPBACK, port=port, retry=AsyncRetry(NoBackoff(), 0), **options))  # fmt: skip

    def close(self) -> None:
        for client in self._sync_made:
            client.close()

    def close_client(self, client: Any) -> None:
        """Close ``client`` now (with its listener, for asyncio)."""
        if self.loop is None:
            client.close()
        else:
            self.loop.close_client(client)

    def inner(self, backend: Any) -> Any:
        """The backend itself (not its proxy): use it through :meth:`here`."""
        return getattr(backend, "wrapped", backend)

    def listener(self, client: Any) -> Any:
        """The change listener of ``client`` (for asyncio: on the loop); use it through
        :meth:`here`."""
        kind: Any = ChangeListener if self.loop is None else AsyncChangeListener
        return self.here(kind.for_client, client)

    def drop_connections(self, client: Any) -> None:
        """The listener of ``client`` closes its subscriber connections (as CLIENT KILL would)."""
        self.here(self.listener(client).drop_connections_for_tests)

    def delay_notices(self, client: Any) -> NoticeDelay:
        """Route the subscriber connections of ``client``'s listener through a delayed
        subscriber (call before the first backend on ``client`` binds a run)."""
        gate = NoticeDelay()
        listener = self.listener(client)
        opener = listener._open_pubsub  # the listener's own: sync, or a coroutine function
        open_delayed: Callable[[Any], Any]
        if self.loop is None:

            def open_delayed(link: Any) -> Any:
                return DelayedSubscriber(opener(link), gate)

        else:

            async def open_delayed(link: Any) -> Any:
                return AsyncDelayedSubscriber(await opener(link), gate)

        self.here(setattr, listener, "_open_pubsub", open_delayed)
        return gate


@pytest.fixture
def fe(
    frontend: str,
    open_frontend_client: Callable[[], Any],
    make_frontend_backend: Factory,
    frontend_backend_type: Factory,
    request: pytest.FixtureRequest,
) -> Iterator[FrontEnd]:
    """The front end under test (``sync`` or ``async``) on the current target."""
    loop = request.getfixturevalue("async_loop") if frontend == "async" else None
    made = FrontEnd(frontend, loop, open_frontend_client, make_frontend_backend,
                    frontend_backend_type)  # fmt: skip
    yield made
    made.close()


class FreshnessMonitor:
    """Polls backends every millisecond; once armed, records every observation of a backend
    that reports ``cache_is_fresh`` while its checkpoint (read after that) is ``wrong``.

    It runs in a thread of its own; an asyncio backend (behind its proxy) is read on its loop,
    each read as a coroutine of that loop would make it."""

    def __init__(self, backends: Sequence[Any],
                 wrong: Callable[[RunCheckpoint | None], bool]) -> None:  # fmt: skip
        self.backends = list(backends)
        self.wrong = wrong
        self.lies: list[str] = []
        self.observations = 0
        self._armed_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshness-monitor", daemon=True)
        self._thread.start()

    def arm(self, at: float | None = None) -> None:
        self._armed_at = time.monotonic() if at is None else at

    def _run(self) -> None:
        while not self._stop.is_set():
            for index, backend in enumerate(self.backends):
                now = time.monotonic()
                if not backend.cache_is_fresh:
                    continue
                cp = backend.get_checkpoint()
                armed = self._armed_at
                self.observations += 1
                if armed is not None and now >= armed and self.wrong(cp):
                    self.lies.append(
                        f"backend {index} fresh at +{now - armed:.3f}s showing "
                        f"task={cp.task if cp else None!r} "
                        f"status={cp.status.value if cp else None} v={backend.version}"
                    )
            time.sleep(0.001)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.lies


# ------------------------------------------------------------------------------ a stalling proxy


class _Pipe:
    __slots__ = ("client", "closed", "flowing", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket, flowing: bool) -> None:
        self.client = client
        self.upstream = upstream
        self.flowing = threading.Event()
        if flowing:
            self.flowing.set()
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.flowing.set()  # a held chunk is then dropped by the failing send
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class StallProxy:
    """A TCP proxy on 127.0.0.1 to a Redis port that can *stall*: stop forwarding in both
    directions without closing a socket (as a dead network path does until TCP gives up).

    :meth:`stall` stalls every open connection and, with ``new_connections=True``, every one
    opened later; :meth:`unstall` lets everything flow again (held bytes first, in order).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._lock = threading.Lock()
        self._pipes: set[_Pipe] = set()
        self._stall_new = False
        self._stopping = threading.Event()
        self.connections = 0
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((LOOPBACK, 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="stall-proxy", daemon=True)

    def __enter__(self) -> StallProxy:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.close()
        self._acceptor.join(timeout=5)

    def stall(self, *, new_connections: bool) -> None:
        with self._lock:
            self._stall_new = new_connections
            for pipe in self._pipes:
                pipe.flowing.clear()

    def unstall(self) -> None:
        with self._lock:
            self._stall_new = False
            for pipe in self._pipes:
                pipe.flowing.set()

    def _accept(self) -> None:
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
            with self._lock:
                pipe = _Pipe(client, upstream, flowing=not self._stall_new)
                self._pipes.add(pipe)
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pipe, src, dst), daemon=True).start()

    def _pump(self, pipe: _Pipe, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                pipe.flowing.wait()
                if pipe.closed:
                    return
                dst.sendall(data)
        except OSError:
            return
        finally:
            pipe.close()
            with self._lock:
                self._pipes.discard(pipe)


# ------------------------------------------------------------------------------ the tools


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
def test_delayed_notices_are_late_on_this_front_end(redis_client: Client, fe: FrontEnd) -> None:
    """The delay reaches the front end's real subscriber connection (else the cases below
    could pass without any lag): with the gate at 0.6 s, the health-check PING replies come
    later than ``max_staleness`` and the cache stops vouching; a change arrives late; once
    the gate is lifted, it is fresh and current again."""
    w_client = fe.client()
    gate = fe.delay_notices(w_client)
    watcher = fe.backend(w_client, max_staleness=0.2)
    writer = fe.backend(watch=False)
    run_id = uuid.uuid4()
    writer.init_run(run_id, "delayed", "/d")
    assert watcher.open_run(run_id) is not None
    assert eventually(lambda: is_fresh_and_current(watcher, redis_client))
    time.sleep(0.5)
    assert watcher.cache_is_fresh  # no delay: the PINGs keep it fresh
    gate.seconds = 0.6
    assert eventually(lambda: not watcher.cache_is_fresh, 1.0, 0.005), "the delay had no effect"
    gate.seconds = 0.0
    assert eventually(lambda: is_fresh_and_current(watcher, redis_client)), describe(watcher)


# ------------------------------------------------------------------------------ 1. fork

CHILDREN = 4
WRITES_PER_CHILD = 30


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.server), "fakeredis"])
def shared_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server several processes reach: a flushed real redis-server, or a TcpFakeServer."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_url")
        return
    port = find_free_port()
    fake = fakeredis.TcpFakeServer((LOOPBACK, port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)  # fmt: skip
    thread.start()
    try:
        yield f"redis://{LOOPBACK}:{port}/0"
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(timeout=5)


def _count_installs() -> list[float]:
    """In a forked child: note every cache install (a load put in the cache), before it."""
    installs: list[float] = []
    install = cache_mod.RunCache.install

    def counting_install(self: Any, state: Any, generation: int) -> bool:
        installs.append(time.monotonic())  # before: a fresh report can only follow it
        return install(self, state, generation)

    cache_mod.RunCache.install = counting_install  # type: ignore[method-assign]  # this child only
    return installs


def _fork_writer(backend: RedisCheckpointBackend, run_id: uuid.UUID, index: int, url: str,
                 barrier: Any) -> dict[str, Any]:  # fmt: skip
    """In a forked child: write through the inherited backend, then converge."""
    fresh_at_fork = backend.cache_is_fresh  # the parent's cache cannot vouch here
    installs = _count_installs()
    barrier.wait(timeout=30)  # every child writes at the same time
    acked, errors = 0, []
    for i in range(WRITES_PER_CHILD):
        agent = uuid.UUID(int=((index + 1) << 64) | (i + 1))
        try:
            backend.append_event(agent_done(run_id, agent, tokens=1))
            acked += 1
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    barrier.wait(timeout=60)  # every write is done: the run no longer changes
    client = redis.Redis.from_url(url)
    try:
        converged = eventually(lambda: is_fresh_and_current(backend, client), 10.0, 0.01)
        synced = backend.sync() == load(client, run_id)
    finally:
        client.close()
    return {
        "acked": acked, "errors": errors, "writer": backend._writer_id,
        "fresh_at_fork": fresh_at_fork, "installs": len(installs),
        "converged": converged, "synced": synced,
    }  # fmt: skip


def _fork_child(backend: RedisCheckpointBackend, run_id: uuid.UUID, index: int, url: str,
                barrier: Any, out: Any) -> None:  # fmt: skip
    try:
        out.put(("ok", index, _fork_writer(backend, run_id, index, url, barrier)))
    except BaseException:
        out.put(("error", index, traceback.format_exc()))


def _collect(out: Any, count: int, bound: float) -> dict[int, Any]:
    deadline = time.monotonic() + bound
    got: dict[int, Any] = {}
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for the children ({len(got)}/{count})")
        kind, index, payload = out.get(timeout=left)
        if kind == "error":
            raise AssertionError(f"child {index} failed:\n{payload}")
        got[index] = payload
    return got


def _reap(procs: Sequence[Any]) -> None:
    for proc in procs:
        proc.join(timeout=10)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork of a threaded process
def test_forked_children_write_exactly_once(shared_url: str) -> None:
    ctx = multiprocessing.get_context("fork")
    client = redis.Redis.from_url(shared_url)
    parent = RedisCheckpointBackend(client, watch=True)
    run_id = uuid.uuid4()
    parent.init_run(run_id, "forked", "/tmp/forked")
    assert eventually(lambda: parent.cache_is_fresh)
    barrier, out = ctx.Barrier(CHILDREN), ctx.Queue()
    procs = [ctx.Process(target=_fork_child, args=(parent, run_id, i, shared_url, barrier, out),
                         daemon=True) for i in range(CHILDREN)]  # fmt: skip
    try:
        for proc in procs:
            proc.start()
        reports = _collect(out, CHILDREN, 120.0)
    finally:
        _reap(procs)
    try:
        for index, report in sorted(reports.items()):
            assert report["errors"] == [], (index, report)
            assert report["fresh_at_fork"] is False, (index, report)
            assert report["installs"] >= 1, (index, report)
            assert report["converged"] and report["synced"], (index, report)
        acked = sum(report["acked"] for report in reports.values())
        assert acked == CHILDREN * WRITES_PER_CHILD

        reader = RedisCheckpointBackend(redis.Redis.from_url(shared_url), watch=False)
        try:
            cp = reader.open_run(run_id)
            assert cp is not None
            log = reader.get_event_log()
            assert len(log) == acked  # every acknowledged write stored exactly once
            assert len({e.agent_id for e in log if isinstance(e, AgentDone)}) == acked
            assert cp.total_tokens == acked and len(cp.agent_results) == acked
            keys = reader.keys
            assert keys is not None
            writers = {k.decode() for k in reader.client.hgetall(keys.writers)}
        finally:
            reader.client.close()
        children = [report["writer"] for report in reports.values()]
        assert len(set(children)) == CHILDREN and parent._writer_id not in children
        assert writers == {parent._writer_id, *children}
        # the parent watched it all happen
        assert eventually(lambda: is_fresh_and_current(parent, client))
    finally:
        parent.close()
        client.close()


def _fork_prober(backend: RedisCheckpointBackend, run_id: uuid.UUID, out: Any) -> None:
    """In a forked child with a second thread that reads ``cache_is_fresh`` all along: no
    report of fresh may come before the child's first reload. The moment the child sets up
    its own listener (inside the fork handling of the first call) is sampled as well, so the
    window is not left to chance."""
    try:
        installs = _count_installs()
        samples: list[tuple[str, bool, int]] = []
        spied: list[bool] = []
        for_client = ChangeListener.for_client.__func__  # type: ignore[attr-defined]

        main = threading.current_thread()

        def spying_for_client(cls: Any, client: Any) -> Any:
            if threading.current_thread() is main and not spied:
                spied.append(True)  # another thread reads while the child sets up its listener
                seen: list[bool] = []
                reader = threading.Thread(target=lambda: seen.append(backend.cache_is_fresh))
                reader.start()
                reader.join(0.5)  # a reader that blocks meanwhile is no lie
                samples.append(("listener set up", bool(seen and seen[0]), len(installs)))
            return for_client(cls, client)

        ChangeListener.for_client = classmethod(spying_for_client)  # type: ignore[method-assign,assignment]
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                samples.append(("poll", backend.cache_is_fresh, len(installs)))
                time.sleep(0.0002)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        time.sleep(0.01)
        backend.append_event(agent_done(run_id))
        deadline = time.monotonic() + 10  # keep sampling until the child's first reload
        while not installs and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.01)
        stop.set()
        poller.join(timeout=5)
        lies = [s for s in samples if s[1] and s[2] == 0]
        out.put(("ok", 0, (lies[:5], len(samples), len(installs))))
    except BaseException:
        out.put(("error", 0, traceback.format_exc()))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_never_reports_fresh_before_reloading(shared_url: str) -> None:
    ctx = multiprocessing.get_context("fork")
    client = redis.Redis.from_url(shared_url)
    parent = RedisCheckpointBackend(client, watch=True)
    run_id = uuid.uuid4()
    parent.init_run(run_id, "forked prober", "/tmp/forked")
    assert eventually(lambda: parent.cache_is_fresh)
    out = ctx.Queue()
    proc = ctx.Process(target=_fork_prober, args=(parent, run_id, out), daemon=True)
    try:
        proc.start()
        kind, _, payload = out.get(timeout=60)
    finally:
        _reap([proc])
        parent.close()
        client.close()
    assert kind == "ok", payload
    lies, count, installs = payload
    assert count > 0 and installs >= 1
    assert lies == [], f"fresh in the child before any reload: {lies}"


def _fork_reader(backend: RedisCheckpointBackend, ready: Any, cancelled: Any, out: Any) -> None:
    """In a forked child: only read (as a worker polling for a cancel does)."""
    try:
        ready.set()
        assert cancelled.wait(30)
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            fresh = backend.cache_is_fresh
            cp = backend.get_checkpoint()
            status = cp.status if cp is not None else None
            if fresh and status is not CheckpointStatus.CANCELLED:
                out.put(("lie", 0, f"fresh while showing {status} after the cancel"))
                return
            if fresh and status is CheckpointStatus.CANCELLED:
                break
            time.sleep(0.005)
        cp = backend.get_checkpoint()
        out.put(("ok", 0, (cp.status.value if cp else None, backend.cache_is_fresh)))
    except BaseException:
        out.put(("error", 0, traceback.format_exc()))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_forked_reader_sees_the_parents_cancel(shared_url: str) -> None:
    ctx = multiprocessing.get_context("fork")
    client = redis.Redis.from_url(shared_url)
    parent = RedisCheckpointBackend(client, watch=True)
    run_id = uuid.uuid4()
    parent.init_run(run_id, "forked reader", "/tmp/forked")
    assert eventually(lambda: parent.cache_is_fresh)
    ready, cancelled, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_fork_reader, args=(parent, ready, cancelled, out), daemon=True)
    try:
        proc.start()
        assert ready.wait(30)
        parent.cancel()
        cancelled.set()
        kind, _, payload = out.get(timeout=60)
    finally:
        _reap([proc])
        parent.close()
        client.close()
    assert kind == "ok", payload
    assert payload == ("cancelled", True), f"the forked reader never caught up: {payload}"


# ------------------------------------------------------------------------------ 2. no-op cancel


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@pytest.mark.parametrize("lag", ["watch=False", "delayed 0.05s", "delayed 0.4s", "dropped"])
def test_noop_cancel_from_a_lagging_cache(redis_client: Client, fe: FrontEnd, lag: str) -> None:
    """B completes the run; A, which has not seen it, cancels (a no-op: nothing changes, no
    version is bumped). A's cache must then show the completed run, not "running@v1"."""
    a_client = fe.client()
    gate = fe.delay_notices(a_client)
    lagging = fe.backend(a_client, watch=lag != "watch=False")
    other = fe.backend(watch=False)
    run_id = uuid.uuid4()
    other.init_run(run_id, "no-op cancel", "/d")
    assert lagging.open_run(run_id) is not None
    if lag != "watch=False":
        assert eventually(lambda: lagging.cache_is_fresh)
    listener = fe.listener(a_client)
    if lag == "dropped":
        fe.here(setattr, listener, "_targets", lambda channel: [])
    elif lag.startswith("delayed"):
        gate.seconds = float(lag.split()[1].rstrip("s"))
    try:
        for n in range(3):
            other.append_event(agent_done(run_id, tokens=10 + n))
        other.upsert_agent_result(result(uuid.uuid4(), 5))
        other.append_event(completed(run_id))
        truth = load(redis_client, run_id)
        assert truth is not None and truth.status is CheckpointStatus.COMPLETED
        if lag == "watch=False":  # (delayed notices may have arrived on a loaded machine)
            before = lagging.get_checkpoint()
            assert before is not None and before.status is CheckpointStatus.RUNNING

        lagging.cancel()  # a no-op on the server
        assert load(redis_client, run_id) == truth  # really a no-op
        cp = lagging.get_checkpoint()
        assert cp == truth, "the no-op cancel left the lagging cache behind"
        assert cp is not None and cp.status is CheckpointStatus.COMPLETED
        assert cp.total_tokens == truth.total_tokens == 33
        assert lagging.version == other.version
        assert not lagging.can_resume()
    finally:
        gate.seconds = 0.0
        with contextlib.suppress(AttributeError):
            fe.here(delattr, listener, "_targets")
    if lag != "watch=False":  # the late (or missing) notices do not move it back
        assert eventually(lambda: is_fresh_and_current(lagging, redis_client)), describe(lagging)
    else:
        assert not lagging.cache_is_fresh
    assert lagging.get_checkpoint() == truth
    assert lagging.sync() == truth


# ------------------------------------------------------------------------------ 3. stalled link


@pytest.mark.parametrize("redis_target", REDIS_ONLY)
@pytest.mark.parametrize("recovery", ["unstall", "replace", "sync"])
def test_stalled_subscriber(
    redis_server: LocalRedisServer, redis_client: Client, fe: FrontEnd, recovery: str
) -> None:
    """``unstall``: every connection (new ones too) stalls for 3 s, then flows again.
    ``replace``: the stalled connections stay stalled for good; the library must replace its
    subscriber (after ~1.5 s of unanswered PINGs) and command connections by itself.
    ``sync``: stalled for good too, and ``sync()`` at once must come back with the cancel (the
    pooled command connections are stalled as well: it may need the retry policy to get past
    them), then the cache converges."""
    max_staleness = 0.5
    direct = redis_client
    with StallProxy(redis_server.port) as proxy:
        proxied = fe.client_to(proxy.port, socket_timeout=1.0, socket_connect_timeout=2.0)
        stalled = fe.backend_type(proxied, max_staleness=max_staleness)
        operator = fe.backend(watch=False)
        run_id = uuid.uuid4()
        operator.init_run(run_id, "stalled", "/d")
        operator.append_event(agent_done(run_id, tokens=3))
        monitor: FreshnessMonitor | None = None
        try:
            assert stalled.open_run(run_id) is not None
            assert eventually(lambda: stalled.cache_is_fresh, 5.0)
            assert stalled.get_checkpoint() == load(direct, run_id)

            proxy.stall(new_connections=recovery == "unstall")
            stalled_at = time.monotonic()
            assert eventually(lambda: not stalled.cache_is_fresh, max_staleness + 0.5, 0.001), (
                "still fresh with its subscriber connection stalled"
            )
            went_stale = time.monotonic() - stalled_at
            assert went_stale <= max_staleness + 0.5

            monitor = FreshnessMonitor(
                [stalled], lambda cp: cp is None or cp.status is not CheckpointStatus.CANCELLED
            )
            operator.cancel()
            monitor.arm()  # from now on, fresh means it has the cancel
            truth = load(direct, run_id)
            assert truth is not None and truth.status is CheckpointStatus.CANCELLED
            if recovery == "unstall":
                time.sleep(3.0)
                cp = stalled.get_checkpoint()
                assert cp is not None and cp.status is CheckpointStatus.RUNNING  # it is stuck
                assert not stalled.cache_is_fresh
                proxy.unstall()
            elif recovery == "sync":
                assert stalled.sync() == truth
                assert stalled.get_checkpoint() == truth
            bound = 5.0 if recovery == "unstall" else 10.0
            assert eventually(lambda: is_fresh_and_current(stalled, direct), bound, 0.01), (
                f"did not converge: {describe(stalled)}"
            )
            cp = stalled.get_checkpoint()
            assert cp is not None and cp.status is CheckpointStatus.CANCELLED
            assert stalled.sync() == truth
            assert eventually(lambda: monitor.observations > 0, 1.0)  # it did look
            lies = monitor.stop()
            assert lies == [], lies[:5]
            if recovery != "unstall":
                assert proxy.connections >= 3  # new subscriber and command connections
        finally:
            if monitor is not None:
                monitor.stop()
            proxy.unstall()
            stalled.close()
            fe.close_client(proxied)


# ------------------------------------------------------------------------------ 4. re-created run

OLD_TASK, NEW_TASK = "old incarnation", "new incarnation"


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@pytest.mark.parametrize("how", ["delete", "flushall"])
def test_recreated_run_is_followed(redis_client: Client, fe: FrontEnd, how: str) -> None:
    shared = fe.client()
    reader, writer = fe.backend(), fe.backend(shared)
    sibling = fe.backend(shared)  # the same client and listener as the writer
    admin = fe.backend(watch=False)
    blind = fe.backend(watch=False)  # sees only its own writes
    run_id = uuid.uuid4()
    writer.init_run(run_id, OLD_TASK, "/old")
    writer.append_event(agent_done(run_id, tokens=40))
    writer.upsert_agent_result(result(uuid.uuid4(), 2))
    assert reader.open_run(run_id) is not None
    assert sibling.open_run(run_id) is not None
    assert blind.open_run(run_id) is not None
    bound = (reader, writer, sibling)
    assert eventually(lambda: all(is_fresh_and_current(b, redis_client) for b in bound))
    monitor = FreshnessMonitor(bound, lambda cp: cp is None or cp.task != NEW_TASK)
    try:
        if how == "delete":
            assert admin.delete_run(run_id) is True
            assert eventually(lambda: not any(b.cache_is_fresh for b in bound))
        else:
            redis_client.flushall()  # the server lost its data: nobody is told
        with pytest.raises(RunNotFoundError):  # a late write never brings the run back
            writer.append_event(agent_done(run_id))
        assert load(redis_client, run_id) is None

        admin.init_run(run_id, NEW_TASK, "/new")
        monitor.arm(time.monotonic() + reader.max_staleness)
        assert eventually(lambda: all(is_fresh_and_current(b, redis_client) for b in bound)), [
            describe(b) for b in bound]  # fmt: skip
        for backend in bound:
            cp = backend.get_checkpoint()
            assert cp is not None and cp.task == NEW_TASK and len(cp.agent_results) == 0
            assert cp.total_tokens == 0

        # the old writer, still bound: its write goes to the new incarnation, and shows
        agent = uuid.uuid4()
        writer.append_event(agent_done(run_id, agent, tokens=7))
        mine = writer.get_checkpoint()
        assert mine is not None and mine.task == NEW_TASK and set(mine.agent_results) == {agent}
        assert mine.total_tokens == 7
        assert mine == load(redis_client, run_id)
        assert eventually(lambda: all(is_fresh_and_current(b, redis_client) for b in bound))

        # a writer that does not watch learns of the new incarnation from its own write
        other = uuid.uuid4()
        blind.append_event(agent_done(run_id, other, tokens=5))
        theirs = blind.get_checkpoint()
        assert theirs is not None and theirs.task == NEW_TASK
        assert set(theirs.agent_results) == {agent, other} and theirs.total_tokens == 12
        assert theirs == load(redis_client, run_id)
        assert not blind.cache_is_fresh  # watch=False never vouches
        assert eventually(lambda: all(is_fresh_and_current(b, redis_client) for b in bound))
        assert eventually(lambda: monitor.observations > 0, 1.0)  # it did look (a loaded machine
        # may not have run the monitor thread yet: every bound backend is fresh now)
        lies = monitor.stop()
        assert lies == [], lies[:5]
    finally:
        monitor.stop()


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
def test_a_write_told_the_run_is_gone_stops_vouching(redis_client: Client, fe: FrontEnd) -> None:
    """After FLUSHALL nobody is told, but a write that got LUFT_NO_RUN was: its cache must not
    go on reporting fresh (and ``sync()`` must say the run no longer exists)."""
    writer = fe.backend()
    run_id = uuid.uuid4()
    writer.init_run(run_id, OLD_TASK, "/old")
    assert eventually(lambda: writer.cache_is_fresh)
    redis_client.flushall()
    with pytest.raises(RunNotFoundError):
        writer.append_event(agent_done(run_id))
    time.sleep(writer.max_staleness + 0.1)
    assert not writer.cache_is_fresh, "fresh, about a run the server said does not exist"
    assert writer.sync() is None


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
def test_a_late_delete_notice_does_not_strand_a_reloaded_cache(
    redis_client: Client, fe: FrontEnd
) -> None:
    """The reader's notices lag (0.3 s, more than its max_staleness): it reloads the
    re-created run with sync(); the old incarnation's delete notice arrives afterwards. The
    cache must end fresh on the new incarnation."""
    r_client = fe.client()
    gate = fe.delay_notices(r_client)
    reader = fe.backend(r_client, max_staleness=0.2)
    admin = fe.backend(watch=False)
    run_id = uuid.uuid4()
    admin.init_run(run_id, OLD_TASK, "/old")
    assert reader.open_run(run_id) is not None
    assert eventually(lambda: is_fresh_and_current(reader, redis_client))
    monitor = FreshnessMonitor([reader], lambda cp: cp is None or cp.task != NEW_TASK)
    try:
        gate.seconds = 0.3
        admin.delete_run(run_id)
        admin.init_run(run_id, NEW_TASK, "/new")
        monitor.arm(time.monotonic() + reader.max_staleness)
        assert eventually(lambda: not reader.cache_is_fresh)
        cp = reader.sync()
        assert cp is not None and cp.task == NEW_TASK
        time.sleep(0.5)  # the delayed delete and init notices arrive now
        gate.seconds = 0.0
        assert eventually(lambda: is_fresh_and_current(reader, redis_client)), describe(reader)
        lies = monitor.stop()
        assert lies == [], lies[:5]
    finally:
        gate.seconds = 0.0
        monitor.stop()


# ------------------------------------------------------------------------------ 5. slow WAIT


@pytest.mark.parametrize("redis_target", REDIS_ONLY)
def test_slow_wait_does_not_delay_notices(redis_client: Client, fe: FrontEnd) -> None:
    """``slow`` writes three times with a WAIT for a replica that does not exist (each write
    returns NotDurableError after 1 s); ``watcher`` shares its client. Every notice written
    meanwhile reaches the watcher within 0.3 s."""
    shared, direct = fe.client(), fe.client()
    slow = fe.backend(shared, durability=Durability(replicas=1, timeout_ms=1000))
    watcher = fe.backend(shared)
    feeder = fe.backend(direct, watch=False)
    slow_run, fed_run = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(NotDurableError):  # no replica: applied, but not durable
        slow.init_run(slow_run, "slow writes", "/d")
    feeder.init_run(fed_run, "fed", "/d")
    assert watcher.open_run(fed_run) is not None
    assert eventually(lambda: is_fresh_and_current(watcher, redis_client))
    waits: list[float] = []
    unexpected: list[BaseException] = []
    started = threading.Event()

    def write_slowly() -> None:
        started.set()
        for _ in range(3):
            begin = time.monotonic()
            try:
                slow.append_event(agent_done(slow_run))
            except NotDurableError:
                waits.append(time.monotonic() - begin)
            except BaseException as exc:
                unexpected.append(exc)

    thread = threading.Thread(target=write_slowly, daemon=True)
    thread.start()
    assert started.wait(BOUND)
    latencies: list[float] = []
    n = 0
    while thread.is_alive():
        n += 1
        feeder.append_event(Log(run_id=fed_run, level=LogLevel.INFO, msg=f"tick {n}"))
        written, target = time.monotonic(), feeder.version
        while watcher.version < target and time.monotonic() - written < 2.0:
            time.sleep(0.001)
        latencies.append(time.monotonic() - written)
        time.sleep(max(0.0, 0.05 - (time.monotonic() - written)))
    thread.join(timeout=10)
    assert unexpected == []
    assert len(waits) == 3 and min(waits) >= 0.9, waits  # each WAIT really took ~1 s
    assert max(latencies) < 0.3, (
        f"notices held up behind a slow WAIT: max {max(latencies):.3f}s, "
        f"sorted tail {sorted(latencies)[-5:]}"
    )
    assert len(latencies) >= 20  # sampled all along the three WAITs
    assert eventually(lambda: is_fresh_and_current(watcher, redis_client))
    assert slow.get_checkpoint() == load(redis_client, slow_run)  # the writes were applied
    cp = slow.get_checkpoint()
    assert cp is not None and cp.total_tokens == 3


# ------------------------------------------------------------------------------ 6. property

MAX_STALENESS = 0.2
DELAYS = (0.0, 0.1, 0.35)
"""Notice delays for the "delay" step: none, less than max_staleness, more."""

OPS = ("append", "complete", "cancel", "reset", "upsert", "save", "recreate", "delay", "drop",
       "kill")  # fmt: skip

steps_strategy = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 2), st.integers(0, 2)), min_size=1,
    max_size=8,
)  # fmt: skip


class _World:
    """Three backends on one run: two watching (own clients, delayable notices), one not;
    ``truth_client`` (sync) reads what is stored."""

    def __init__(self, fe: FrontEnd, truth_client: Client, redis_target: str) -> None:
        self.fe = fe
        self.real_server = redis_target != "fakeredis"
        self.clients = [fe.client() for _ in range(3)]
        self.truth_client = truth_client
        self.gates = [fe.delay_notices(self.clients[0]), fe.delay_notices(self.clients[1])]
        self.backends = [
            fe.backend_type(self.clients[0], max_staleness=MAX_STALENESS),
            fe.backend_type(self.clients[1], max_staleness=MAX_STALENESS),
            fe.backend_type(self.clients[2], watch=False),
        ]
        self.run_id = uuid.uuid4()
        self.counter = 0
        self.kills = 0
        self.killed = 0

    def start(self) -> None:
        self.backends[0].init_run(self.run_id, "task 0", "/d")
        for backend in self.backends[1:]:
            assert backend.open_run(self.run_id) is not None

    def close(self) -> None:
        for gate in self.gates:
            gate.seconds = 0.0
        for backend in self.backends:
            backend.close()
        for client in self.clients:
            self.fe.close_client(client)

    def truth(self) -> RunCheckpoint | None:
        return load(self.truth_client, self.run_id)

    def kill_subscribers(self, who: int) -> None:
        """The server closes every pub/sub connection (CLIENT KILL TYPE pubsub); fakeredis has
        no CLIENT KILL, so there the listener drops its connections."""
        self.kills += 1
        if self.real_server:
            admin: Any = self.truth_client
            self.killed += int(admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))
        else:
            self.fe.drop_connections(self.clients[who])

    def step(self, op: str, who: int, arg: int) -> None:
        self.counter += 1
        n, run_id = self.counter, self.run_id
        actor = self.backends[who]
        if op == "append":
            actor.append_event(agent_done(run_id, tokens=arg + 1))
        elif op == "complete":
            actor.append_event(completed(run_id))
        elif op == "cancel":
            actor.cancel()
        elif op == "reset":
            with contextlib.suppress(NotResumableError):
                actor.reset_status_to_running()
        elif op == "upsert":
            actor.upsert_agent_result(result(uuid.UUID(int=arg + 1), n))
        elif op == "save":
            cp = actor.get_checkpoint()
            assert cp is not None
            actor.save_checkpoint(cp)
        elif op == "recreate":
            assert actor.delete_run() is True
            actor.init_run(run_id, f"task {n}", "/d")
        elif op == "delay" and who < len(self.gates):
            self.gates[who].seconds = DELAYS[arg]
        elif op == "drop" and who < len(self.gates):
            self.fe.drop_connections(self.clients[who])
        elif op == "kill" and who < len(self.gates):
            self.kill_subscribers(who)

    def server_tip(self) -> tuple[str, int]:
        """The stored run's ``(incarnation, version)``."""
        keys = self.backends[0].keys or self.backends[1].keys
        assert keys is not None
        inc, version = self.truth_client.hmget(keys.run, ["incarnation", "version"])
        text = inc.decode() if isinstance(inc, bytes) else str(inc or "")
        return text, int(version or 0)

    def check(self, label: str) -> None:
        """Invariant 5: a cache reporting fresh equals a fresh load (every change is older
        than max_staleness now). Invariant 2: a cache whose (incarnation, version) is the
        stored one holds exactly the stored state, whether it reports fresh or not."""
        truth, tip = self.truth(), self.server_tip()
        for index, backend in enumerate(self.backends):
            fresh, claimed, seen = self.fe.here(_observe, self.fe.inner(backend))
            if fresh:
                assert seen == truth, (
                    f"{label}: backend {index} reports fresh but differs from a fresh load: "
                    f"{describe(backend)}; stored {tip} task={truth.task if truth else None!r} "
                    f"status={truth.status.value if truth else None}"
                )
            if claimed == tip:
                assert seen == truth, (
                    f"{label}: backend {index} claims the stored version {tip} but holds "
                    f"another state: {describe(backend)}"
                )
        assert not self.backends[2].cache_is_fresh  # watch=False never vouches


def _observe(backend: Any) -> tuple[bool, Any, RunCheckpoint | None]:
    """``(cache_is_fresh, the cache's (incarnation, version), get_checkpoint())``, read in this
    order (by :meth:`FrontEnd.here`: for asyncio, in one go on the loop)."""
    fresh = backend.cache_is_fresh
    binding = backend._binding
    assert binding is not None
    return fresh, binding.cache.tip, backend.get_checkpoint()


def _play(world: _World, steps: list[tuple[str, int, int]]) -> None:
    """Run ``steps``, checking the invariants after each, then lift every delay and wait
    until every notice of the last step has arrived."""
    world.start()
    assert eventually(lambda: all(b.cache_is_fresh for b in world.backends[:2]))
    for k, (op, who, arg) in enumerate(steps):
        world.step(op, who, arg)
        time.sleep(MAX_STALENESS + 0.05)  # every change of this step is older than that now
        world.check(f"after step {k} {(op, who, arg)} of {steps}")
    for gate in world.gates:
        gate.seconds = 0.0
    time.sleep(max(DELAYS) + MAX_STALENESS)
    if world.kills and world.real_server:
        assert world.killed >= 1, "CLIENT KILL TYPE pubsub found no subscriber connection"


PROPERTY = settings(
    max_examples=_examples(15),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@PROPERTY
@given(steps=steps_strategy)
@example(steps=[("delay", 0, 2), ("kill", 0, 0), ("append", 1, 0), ("recreate", 2, 0)])
def test_random_interleavings(
    fe: FrontEnd, open_client: Callable[[], Client], redis_target: str,
    steps: list[tuple[str, int, int]],
) -> None:  # fmt: skip
    """After every step: fresh means equal to a fresh load, and a cache at the stored
    version holds the stored state. In the end every backend converges on ``sync()``."""
    world = _World(fe, open_client(), redis_target)
    try:
        _play(world, steps)
        truth = world.truth()
        assert truth is not None
        for index, backend in enumerate(world.backends):
            assert backend.sync() == truth, f"backend {index} did not converge on sync()"
            assert backend.get_checkpoint() == truth
        world.check("after sync()")
    finally:
        world.close()


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@settings(PROPERTY, max_examples=_examples(5))
@given(steps=steps_strategy)
@example(steps=[("recreate", 1, 0)])  # b0 watches while b1 deletes and re-creates the run
@example(steps=[("delay", 1, 2), ("kill", 1, 0), ("cancel", 0, 0)])
def test_random_interleavings_regain_freshness_unaided(
    fe: FrontEnd, open_client: Callable[[], Client], redis_target: str,
    steps: list[tuple[str, int, int]],
) -> None:  # fmt: skip
    """The same, but nobody calls ``sync()``: once the notices flow again, every watching
    backend becomes fresh and current by itself ("every path into STALE also schedules the
    work that leads back out")."""
    world = _World(fe, open_client(), redis_target)
    try:
        _play(world, steps)
        for index, backend in enumerate(world.backends[:2]):
            assert eventually(
                functools.partial(is_fresh_and_current, backend, world.truth_client)
            ), f"watching backend {index} stayed stale: {describe(backend)}"
    finally:
        world.close()


# ------------------------------------------------------------- 7. leases over a dead network


def _enter(fe: FrontEnd, lease: Any) -> None:
    """``with lease:`` begins: its heartbeat starts."""
    fe.here(lease.__enter__ if fe.loop is None else lease.__aenter__)


def _exit(fe: FrontEnd, lease: Any) -> None:
    fe.here(lease.__exit__ if fe.loop is None else lease.__aexit__, None, None, None)


def _claimed(fe: FrontEnd, holder: Any, lease_for: float) -> tuple[uuid.UUID, Any]:
    boss = fe.backend(watch=False)
    run_id = uuid.uuid4()
    boss.init_run(run_id, "a holder cut off", "/d")
    boss.submit_agents([AgentTask(uuid.uuid4(), 0, None)])
    assert holder.open_run(run_id) is not None
    lease = holder.claim_agent("zombie", lease_for=lease_for)
    assert lease is not None
    return run_id, lease


@pytest.mark.parametrize("redis_target", REDIS_ONLY)
def test_a_partitioned_holder_learns_it_lost_its_lease(
    fe: FrontEnd, redis_server: LocalRedisServer, redis_client: Any
) -> None:
    """A holder whose client has no socket timeout (as ``from_url`` makes them) is cut off:
    the network drops its packets without closing anything, so the heartbeat's renew waits
    for ever on its socket. ``lease.lost`` still turns True within the lease's time (the
    deadline is kept on the local monotonic clock, and the renew gives up when it passes),
    another worker takes the task over, and leaving ``with lease:`` does not hang."""
    lease_for = 1.0
    with StallProxy(redis_server.port) as proxy:
        holder = fe.backend_type(fe.client_to(proxy.port), watch=False)
        try:
            run_id, lease = _claimed(fe, holder, lease_for)
            _enter(fe, lease)
            proxy.stall(new_connections=True)
            cut = time.monotonic()
            assert eventually(lambda: fe.here(getattr, lease, "lost"), lease_for + 1.0, 0.005)
            assert time.monotonic() - cut <= lease_for + 0.5
            rescuer = fe.backend(watch=False)
            assert rescuer.open_run(run_id) is not None
            taken = rescuer.claim_agent("rescuer", lease_for=30.0, timeout=5.0)
            assert taken is not None and taken.token > lease.token
            left_at = time.monotonic()
            _exit(fe, lease)
            assert time.monotonic() - left_at <= lease_for + 0.5
        finally:
            proxy.unstall()
            holder.close()


@pytest.mark.parametrize("redis_target", REDIS_ONLY)
@pytest.mark.parametrize("skew", [-3600.0, 3600.0], ids=["clock-behind", "clock-ahead"])
def test_a_renew_is_bounded_by_the_lease_not_the_wall_clock(
    fe: FrontEnd, redis_server: LocalRedisServer, redis_client: Any, skew: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With the client's wall clock an hour off the server's, a renew that cannot reach Redis
    gives up when the lease's own time runs out (measured on the monotonic clock from the
    claim), not an hour later; and a renew that can reach it succeeds, however far off the
    wall clock is."""
    lease_for = 1.0
    real_time = time.time
    with StallProxy(redis_server.port) as proxy:
        holder = fe.backend_type(fe.client_to(proxy.port, socket_timeout=0.2), watch=False)
        try:
            _, lease = _claimed(fe, holder, lease_for)
            monkeypatch.setattr(time, "time", lambda: real_time() + skew)
            fe.here(lease.renew)  # reachable: fine whatever the wall clock says
            assert not fe.here(getattr, lease, "lost")
            proxy.stall(new_connections=True)
            started = time.monotonic()
            with pytest.raises(LuftConnectionError):
                fe.here(lease.renew)
            assert time.monotonic() - started <= lease_for + 0.5
        finally:
            monkeypatch.setattr(time, "time", real_time)
            proxy.unstall()
            holder.close()
