"""Hostile cases for the asyncio front end's cache coherence (the twin of tests/test_hostile.py).

Every test here would fail on an :class:`AsyncRedisCheckpointBackend` whose cache is wrong while
it says it is fresh, or that never finds its way back to fresh:

1. ``test_stalled_subscriber``: the connections through a proxy stop forwarding without a FIN;
   ``cache_is_fresh`` turns False within ``max_staleness`` plus a margin, never reports fresh
   with the pre-cancel state, and ``await sync()`` (or the link coming back) recovers.
2. ``test_recreated_run_is_followed``: the run is deleted and re-created, or the server loses
   its data (FLUSHALL) and the run is re-created; every bound backend (two of them sharing one
   client and listener) follows the new incarnation, and the old writer's next write shows in
   its own cache at once.
3. ``test_noop_cancel_from_a_lagging_cache``: ``await cancel()`` of a run another process
   completed meanwhile (a no-op on the server), from a cache that lags (``watch=False`` or
   notices delayed): the cache then equals a fresh load.
4. ``test_slow_wait_does_not_delay_notices``: a backend writing with a ``WAIT`` that takes 1 s
   does not hold up the notices of another backend on the same client: each notice written
   while a slow write is in flight reaches the watcher before that write returns.
5. ``test_random_interleavings`` (hypothesis): random operations, notice delays, reconnects
   (``CLIENT KILL TYPE pubsub`` on a real server) and re-creations over three backends; after
   every step a cache that reports fresh equals a fresh load; in the end ``await sync()``
   converges everywhere (``..._regain_freshness_unaided``: without ``sync()``).

Not here because tests/test_asyncio.py has them: use in a forked child (``ForkedError``),
coherence between a sync process and an async one, and exactly-once writes through a fault
proxy with an async client.

Runs on fakeredis (``FakeAsyncRedis``) and a private redis-server (marked ``server``). As in
tests/test_asyncio.py, each test runs its coroutine with :func:`asyncio.run`, bounded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentStatus,
    AsyncRedisCheckpointBackend,
    CheckpointStatus,
    Durability,
    Log,
    LogLevel,
    NotDurableError,
    NotResumableError,
    RunCheckpoint,
    RunDone,
    RunNotFoundError,
    RunStatus,
    TokenUsage,
)
from luft_redis.asyncio import AsyncChangeListener
from luft_redis.tools.server import LOOPBACK, LocalRedisServer

pytestmark = pytest.mark.timeout(300)

TEST_TIMEOUT = 120.0
"""Seconds one test's coroutine may take in all."""
BOUND = 5.0
"""Seconds any convergence may take (far above the expected milliseconds)."""

FAKE_AND_REDIS = ["fakeredis", pytest.param("redis", marks=pytest.mark.server)]


# ------------------------------------------------------------------------------ helpers


def run(main: Callable[[], Coroutine[Any, Any, None]], timeout: float = TEST_TIMEOUT) -> None:
    """Run ``main()`` on a new event loop, failing when it takes longer than ``timeout``."""

    async def bounded() -> None:
        await asyncio.wait_for(main(), timeout)

    asyncio.run(bounded())


async def eventually(predicate: Callable[[], bool], bound: float = BOUND,
                     step: float = 0.002) -> bool:  # fmt: skip
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return predicate()


class Target:
    """Makes asyncio clients to the current target (call :meth:`client` on the loop that will
    use it) and loads runs as a new backend sees them."""

    def __init__(self, kind: str, *, fake: fakeredis.FakeServer | None = None,
                 url: str = "") -> None:  # fmt: skip
        self.kind = kind
        self.fake = fake
        self.url = url
        self.made: list[Any] = []

    def client(self) -> Any:
        client: Any
        if self.kind == "fakeredis":
            client = fakeredis.FakeAsyncRedis(server=self.fake)
        else:
            client = redis.asyncio.Redis.from_url(self.url)
        self.made.append(client)
        return client

    async def load(self, run_id: uuid.UUID) -> RunCheckpoint | None:
        """The run as stored now, read by a new backend (no cache of its own to trust)."""
        client = self.client()
        try:
            return await AsyncRedisCheckpointBackend(client, watch=False).open_run(run_id)
        finally:
            self.made.remove(client)
            await client.aclose()

    async def aclose(self, backends: Sequence[AsyncRedisCheckpointBackend] = ()) -> None:
        for backend in backends:
            await backend.aclose()
        for client in self.made:
            listener = AsyncChangeListener.existing(client)
            if listener is not None:
                await listener.aclose()
            await client.aclose()
        self.made.clear()


@pytest.fixture
def target(redis_target: str, request: pytest.FixtureRequest) -> Target:
    """The current target, emptied."""
    if redis_target == "fakeredis":
        return Target("fakeredis", fake=fakeredis.FakeServer())
    server: LocalRedisServer = request.getfixturevalue("redis_server")
    with redis.Redis.from_url(server.url) as conn:
        conn.flushall()
    return Target("redis", url=server.url)


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


def describe(backend: AsyncRedisCheckpointBackend) -> str:
    cp = backend.get_checkpoint()
    shown = "unbound" if cp is None else f"task={cp.task!r} status={cp.status.value}"
    return f"fresh={backend.cache_is_fresh} v={backend.version} {shown}"


async def all_fresh_and_current(backends: Sequence[AsyncRedisCheckpointBackend],
                                target: Target) -> bool:  # fmt: skip
    """Every backend is fresh and (read after that) equal to what is stored."""
    for backend in backends:
        if not backend.cache_is_fresh:
            return False
        run_id = backend.run_id
        assert run_id is not None
        if backend.get_checkpoint() != await target.load(run_id):
            return False
    return True


async def converges(backends: Sequence[AsyncRedisCheckpointBackend], target: Target,
                    bound: float = BOUND) -> bool:  # fmt: skip
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if await all_fresh_and_current(backends, target):
            return True
        await asyncio.sleep(0.01)
    return await all_fresh_and_current(backends, target)


class FreshnessMonitor:
    """A task on the loop that looks at backends every millisecond; once armed, records every
    observation of a backend reporting ``cache_is_fresh`` while its checkpoint is ``wrong``."""

    def __init__(self, backends: Sequence[AsyncRedisCheckpointBackend],
                 wrong: Callable[[RunCheckpoint | None], bool]) -> None:  # fmt: skip
        self.backends = list(backends)
        self.wrong = wrong
        self.lies: list[str] = []
        self.observations = 0
        self._armed_at: float | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    def arm(self, at: float | None = None) -> None:
        self._armed_at = time.monotonic() if at is None else at

    async def _run(self) -> None:
        while True:
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
            await asyncio.sleep(0.001)

    async def stop(self) -> list[str]:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.lies


class NoticeDelay:
    """How late a delayed subscriber connection hands over its messages (seconds)."""

    def __init__(self) -> None:
        self.seconds = 0.0


class DelayedPubSub:
    """An asyncio pub/sub connection whose messages arrive ``gate.seconds`` late, in order.

    Notices, subscription confirmations and PING replies are held alike, so the listener's
    health check sees exactly the lag a slow network would give it.
    """

    def __init__(self, inner: Any, gate: NoticeDelay) -> None:
        self._inner = inner
        self._gate = gate
        self._held: collections.deque[tuple[float, Any]] = collections.deque()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _pull(self, timeout: float) -> None:
        message = await self._inner.get_message(timeout=timeout)
        while message is not None:
            self._held.append((time.monotonic(), message))
            message = await self._inner.get_message(timeout=0)

    async def get_message(self, ignore_subscribe_messages: bool = False,
                          timeout: float | None = 0.0) -> Any:  # fmt: skip
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            await self._pull(0)
            now = time.monotonic()
            delay = self._gate.seconds
            if self._held and now - self._held[0][0] >= delay:
                return self._held.popleft()[1]
            if now >= deadline:
                return None
            wait = deadline - now
            if self._held:
                wait = min(wait, self._held[0][0] + delay - now)
            await self._pull(max(wait, 0.001))


def delay_notices(client: Any) -> NoticeDelay:
    """Route the subscriber connections of ``client``'s listener on the running loop through a
    :class:`DelayedPubSub` (call before the first backend on ``client`` binds a run)."""
    listener = AsyncChangeListener.for_client(client)
    gate = NoticeDelay()
    opener = listener._open_pubsub

    async def open_delayed(link: Any) -> Any:
        return DelayedPubSub(await opener(link), gate)

    listener._open_pubsub = open_delayed  # type: ignore[method-assign]
    return gate


# ------------------------------------------------------------------------------ a stalling proxy


class StallProxy:
    """An asyncio TCP proxy on 127.0.0.1 to a Redis port that can *stall*: stop forwarding in
    both directions without closing a socket (as a dead network path does until TCP gives up).

    :meth:`stall` stalls every open connection and, with ``new_connections=True``, every one
    opened later; :meth:`unstall` lets everything flow again (held bytes first, in order).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        self._stall_new = False
        self._gates: set[asyncio.Event] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stall(self, *, new_connections: bool) -> None:
        self._stall_new = new_connections
        for gate in self._gates:
            gate.clear()

    def unstall(self) -> None:
        self._stall_new = False
        for gate in self._gates:
            gate.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            writer.close()
            return
        gate = asyncio.Event()
        if not self._stall_new:
            gate.set()
        self._gates.add(gate)
        self._writers.update((writer, up_writer))
        self.connections += 1
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pump(gate, src, dst, writer,
                                                                     up_writer))  # fmt: skip
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, gate: asyncio.Event, src: asyncio.StreamReader,
                    dst: asyncio.StreamWriter, *ends: asyncio.StreamWriter) -> None:  # fmt: skip
        try:
            while data := await src.read(65536):
                await gate.wait()
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._gates.discard(gate)
            for end in ends:
                self._writers.discard(end)
                end.close()


# ------------------------------------------------------------------------------ 1. stalled link


@pytest.mark.server
@pytest.mark.parametrize("recovery", ["unstall", "replace"])
def test_stalled_subscriber(redis_server: LocalRedisServer, recovery: str) -> None:
    """``unstall``: every connection (new ones too) stalls for 3 s, then flows again.
    ``replace``: the stalled connections stay stalled for good; ``await sync()`` reloads
    through a new command connection, and the listener replaces its subscriber by itself."""
    max_staleness = 0.5
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()
    target = Target("redis", url=redis_server.url)

    async def main() -> None:
        proxy = StallProxy(redis_server.port)
        await proxy.start()
        proxied = redis.asyncio.Redis(host=LOOPBACK, port=proxy.port, socket_timeout=1.0,
                                      socket_connect_timeout=2.0,
                                      retry=AsyncRetry(NoBackoff(), 0))  # fmt: skip
        stalled = AsyncRedisCheckpointBackend(proxied, max_staleness=max_staleness)
        operator = AsyncRedisCheckpointBackend(target.client(), watch=False)
        run_id = uuid.uuid4()
        monitor: FreshnessMonitor | None = None
        try:
            await operator.init_run(run_id, "stalled", "/d")
            await operator.append_event(agent_done(run_id, tokens=3))
            assert await stalled.open_run(run_id) is not None
            assert await eventually(lambda: stalled.cache_is_fresh)
            assert stalled.get_checkpoint() == await target.load(run_id)

            proxy.stall(new_connections=recovery == "unstall")
            stalled_at = time.monotonic()
            assert await eventually(lambda: not stalled.cache_is_fresh, max_staleness + 1.0,
                                    0.001), "still fresh with its subscriber connection stalled"
            went_stale = time.monotonic() - stalled_at
            assert went_stale <= max_staleness + 1.0

            monitor = FreshnessMonitor(
                [stalled], lambda cp: cp is None or cp.status is not CheckpointStatus.CANCELLED
            )
            await operator.cancel()
            monitor.arm()  # from now on, fresh means it has the cancel
            truth = await target.load(run_id)
            assert truth is not None and truth.status is CheckpointStatus.CANCELLED
            if recovery == "unstall":
                await asyncio.sleep(3.0)
                cp = stalled.get_checkpoint()
                assert cp is not None and cp.status is CheckpointStatus.RUNNING  # it is stuck
                assert not stalled.cache_is_fresh
                proxy.unstall()
            else:
                # the pooled command connections are stalled too: sync() may need the retry
                # policy to get past them, but it must come back with the cancel
                assert await stalled.sync() == truth
                assert stalled.get_checkpoint() == truth
            bound = BOUND if recovery == "unstall" else 2 * BOUND
            assert await converges([stalled], target, bound), describe(stalled)
            assert await stalled.sync() == truth
            assert monitor.observations > 0  # it did look
            lies = await monitor.stop()
            assert lies == [], lies[:5]
            if recovery == "replace":
                assert proxy.connections >= 3  # new subscriber and command connections
        finally:
            if monitor is not None:
                await monitor.stop()
            proxy.unstall()
            await stalled.aclose()
            listener = AsyncChangeListener.existing(proxied)
            if listener is not None:
                await listener.aclose()
            await proxied.aclose()
            await target.aclose([operator])
            await proxy.stop()

    run(main)


# ------------------------------------------------------------------------------ 2. re-created run

OLD_TASK, NEW_TASK = "old incarnation", "new incarnation"


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@pytest.mark.parametrize("how", ["delete", "flushall"])
def test_recreated_run_is_followed(target: Target, how: str) -> None:
    async def main() -> None:
        shared = target.client()
        reader, writer = AsyncRedisCheckpointBackend(target.client()), \
            AsyncRedisCheckpointBackend(shared)  # fmt: skip
        sibling = AsyncRedisCheckpointBackend(shared)  # same client and listener as writer
        admin = AsyncRedisCheckpointBackend(target.client(), watch=False)
        blind = AsyncRedisCheckpointBackend(target.client(), watch=False)  # only its own writes
        bound = (reader, writer, sibling)
        run_id = uuid.uuid4()
        monitor: FreshnessMonitor | None = None
        try:
            await writer.init_run(run_id, OLD_TASK, "/old")
            await writer.append_event(agent_done(run_id, tokens=40))
            await writer.upsert_agent_result(result(uuid.uuid4(), 2))
            assert await reader.open_run(run_id) is not None
            assert await sibling.open_run(run_id) is not None
            assert await blind.open_run(run_id) is not None
            assert await converges(bound, target), [describe(b) for b in bound]
            monitor = FreshnessMonitor(bound, lambda cp: cp is None or cp.task != NEW_TASK)
            if how == "delete":
                assert await admin.delete_run(run_id) is True
                assert await eventually(lambda: not any(b.cache_is_fresh for b in bound))
            else:
                await admin.client.flushall()  # the server lost its data: nobody is told
            with pytest.raises(RunNotFoundError):  # a late write never brings the run back
                await writer.append_event(agent_done(run_id))
            assert await target.load(run_id) is None

            await admin.init_run(run_id, NEW_TASK, "/new")
            monitor.arm(time.monotonic() + reader.max_staleness)
            assert await converges(bound, target), [describe(b) for b in bound]
            for backend in bound:
                cp = backend.get_checkpoint()
                assert cp is not None and cp.task == NEW_TASK and len(cp.agent_results) == 0
                assert cp.total_tokens == 0

            # the old writer, still bound: its write goes to the new incarnation, and shows
            agent = uuid.uuid4()
            await writer.append_event(agent_done(run_id, agent, tokens=7))
            mine = writer.get_checkpoint()
            assert mine is not None and mine.task == NEW_TASK
            assert set(mine.agent_results) == {agent} and mine.total_tokens == 7
            assert mine == await target.load(run_id)
            assert await converges(bound, target), [describe(b) for b in bound]

            # a writer that does not watch learns of the new incarnation from its own write
            other = uuid.uuid4()
            await blind.append_event(agent_done(run_id, other, tokens=5))
            theirs = blind.get_checkpoint()
            assert theirs is not None and theirs.task == NEW_TASK
            assert set(theirs.agent_results) == {agent, other} and theirs.total_tokens == 12
            assert theirs == await target.load(run_id)
            assert not blind.cache_is_fresh  # watch=False never vouches
            assert await converges(bound, target), [describe(b) for b in bound]
            assert monitor.observations > 0
            lies = await monitor.stop()
            assert lies == [], lies[:5]
        finally:
            if monitor is not None:
                await monitor.stop()
            await target.aclose([reader, writer, sibling, admin, blind])

    run(main)


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
def test_a_late_delete_notice_does_not_strand_a_reloaded_cache(target: Target) -> None:
    """The reader's notices lag (0.3 s, more than its max_staleness): it reloads the re-created
    run with ``await sync()``; the old incarnation's delete notice arrives afterwards. The cache
    must end fresh on the new incarnation."""

    async def main() -> None:
        r_client = target.client()
        gate = delay_notices(r_client)
        reader = AsyncRedisCheckpointBackend(r_client, max_staleness=0.2)
        admin = AsyncRedisCheckpointBackend(target.client(), watch=False)
        run_id = uuid.uuid4()
        monitor: FreshnessMonitor | None = None
        try:
            await admin.init_run(run_id, OLD_TASK, "/old")
            assert await reader.open_run(run_id) is not None
            assert await converges([reader], target)
            monitor = FreshnessMonitor([reader], lambda cp: cp is None or cp.task != NEW_TASK)
            gate.seconds = 0.3
            await admin.delete_run(run_id)
            await admin.init_run(run_id, NEW_TASK, "/new")
            monitor.arm(time.monotonic() + reader.max_staleness)
            assert await eventually(lambda: not reader.cache_is_fresh)
            cp = await reader.sync()
            assert cp is not None and cp.task == NEW_TASK
            await asyncio.sleep(0.5)  # the delayed delete and init notices arrive now
            gate.seconds = 0.0
            assert await converges([reader], target), describe(reader)
            lies = await monitor.stop()
            assert lies == [], lies[:5]
        finally:
            gate.seconds = 0.0
            if monitor is not None:
                await monitor.stop()
            await target.aclose([reader, admin])

    run(main)


# ------------------------------------------------------------------------------ 3. no-op cancel


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@pytest.mark.parametrize("lag", ["watch=False", "delayed 0.05s", "delayed 0.4s"])
def test_noop_cancel_from_a_lagging_cache(target: Target, lag: str) -> None:
    """B completes the run; A, which has not seen it, cancels (a no-op: nothing changes, no
    version is bumped). A's cache must then show the completed run, not "running@v1"."""

    async def main() -> None:
        a_client = target.client()
        gate = delay_notices(a_client)
        lagging = AsyncRedisCheckpointBackend(a_client, watch=lag != "watch=False")
        other = AsyncRedisCheckpointBackend(target.client(), watch=False)
        run_id = uuid.uuid4()
        try:
            await other.init_run(run_id, "no-op cancel", "/d")
            assert await lagging.open_run(run_id) is not None
            if lag != "watch=False":
                assert await eventually(lambda: lagging.cache_is_fresh)
                gate.seconds = float(lag.split()[1].rstrip("s"))
            for n in range(3):
                await other.append_event(agent_done(run_id, tokens=10 + n))
            await other.upsert_agent_result(result(uuid.uuid4(), 5))
            await other.append_event(completed(run_id))
            truth = await target.load(run_id)
            assert truth is not None and truth.status is CheckpointStatus.COMPLETED
            if lag == "watch=False":  # (delayed notices may have arrived on a loaded machine)
                before = lagging.get_checkpoint()
                assert before is not None and before.status is CheckpointStatus.RUNNING

            await lagging.cancel()  # a no-op on the server
            assert await target.load(run_id) == truth  # really a no-op
            cp = lagging.get_checkpoint()
            assert cp == truth, "the no-op cancel left the lagging cache behind"
            assert cp is not None and cp.status is CheckpointStatus.COMPLETED
            assert cp.total_tokens == truth.total_tokens == 33
            assert lagging.version == other.version
            assert not lagging.can_resume()
            gate.seconds = 0.0
            if lag != "watch=False":  # the late notices do not move it back
                assert await converges([lagging], target), describe(lagging)
            else:
                assert not lagging.cache_is_fresh
            assert lagging.get_checkpoint() == truth
            assert await lagging.sync() == truth
        finally:
            gate.seconds = 0.0
            await target.aclose([lagging, other])

    run(main)


# ------------------------------------------------------------------------------ 4. slow WAIT


@pytest.mark.server
def test_slow_wait_does_not_delay_notices(redis_server: LocalRedisServer) -> None:
    """``slow`` writes three times with a WAIT for a replica that does not exist (each write
    returns NotDurableError after 1 s); ``watcher`` shares its client. Every notice written
    while a slow write is in flight (and not in its last 0.5 s) reaches the watcher before that
    slow write returns."""
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()
    target = Target("redis", url=redis_server.url)

    async def main() -> None:
        shared = target.client()
        slow = AsyncRedisCheckpointBackend(
            shared, durability=Durability(replicas=1, timeout_ms=1000))  # fmt: skip
        watcher = AsyncRedisCheckpointBackend(shared)
        feeder = AsyncRedisCheckpointBackend(target.client(), watch=False)
        slow_run, fed_run = uuid.uuid4(), uuid.uuid4()
        try:
            with pytest.raises(NotDurableError):  # no replica: applied, but not durable
                await slow.init_run(slow_run, "slow writes", "/d")
            await feeder.init_run(fed_run, "fed", "/d")
            assert await watcher.open_run(fed_run) is not None
            assert await converges([watcher], target)

            # (start, end) of each slow write; end None while in flight
            spans: list[list[float | None]] = []
            unexpected: list[BaseException] = []

            async def write_slowly() -> None:
                for _ in range(3):
                    span: list[float | None] = [time.monotonic(), None]
                    spans.append(span)
                    try:
                        await slow.append_event(agent_done(slow_run))
                    except NotDurableError:
                        pass
                    except BaseException as exc:
                        unexpected.append(exc)
                    span[1] = time.monotonic()

            # (slow write in flight when written, time written, seen while it was in flight)
            ticks: list[tuple[int, float, bool]] = []

            async def tick(n: int) -> None:
                span, index = spans[-1], len(spans) - 1
                await feeder.append_event(Log(run_id=fed_run, level=LogLevel.INFO, msg=f"t{n}"))
                written, want = time.monotonic(), feeder.version
                await eventually(lambda: watcher.version >= want or span[1] is not None,
                                 BOUND, 0.001)  # fmt: skip
                ticks.append((index, written, watcher.version >= want and span[1] is None))
                assert await eventually(lambda: watcher.version >= want, BOUND, 0.001)

            writing = asyncio.get_running_loop().create_task(write_slowly())
            n = 0
            while not writing.done():
                if not spans or spans[-1][1] is not None:
                    await asyncio.sleep(0.005)
                    continue
                n += 1
                await tick(n)
                await asyncio.sleep(0.05)
            await writing
            assert unexpected == []
            assert len(spans) == 3
            durations = [end - start for start, end in spans if end is not None and start]
            assert len(durations) == 3 and min(durations) >= 0.9, durations  # WAIT took ~1 s
            late = [(i, round(w - spans[i][0], 3)) for i, w, seen in ticks  # type: ignore[operator]
                    if not seen and spans[i][1] - w > 0.5]  # type: ignore[operator]  # fmt: skip
            assert late == [], f"notices held up behind a slow WAIT (write, written at): {late}"
            for index in range(3):  # sampled all along each WAIT
                assert sum(1 for i, _, seen in ticks if i == index and seen) >= 2, ticks
            assert await converges([watcher], target)
            cp = slow.get_checkpoint()
            assert cp == await target.load(slow_run)  # the writes were applied
            assert cp is not None and cp.total_tokens == 3
        finally:
            await target.aclose([slow, watcher, feeder])

    run(main)


# ------------------------------------------------------------------------------ 5. property

MAX_STALENESS = 0.2
DELAYS = (0.0, 0.1, 0.35)
"""Notice delays for the "delay" step: none, less than max_staleness, more."""

OPS = ("append", "complete", "cancel", "reset", "upsert", "save", "recreate", "delay", "kill")

steps_strategy = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 2), st.integers(0, 2)), min_size=1,
    max_size=8,
)  # fmt: skip


class _World:
    """Three backends on one run: two watching (own clients, delayable notices), one not."""

    def __init__(self, target: Target) -> None:
        self.target = target
        clients = [target.client() for _ in range(3)]
        self.gates = [delay_notices(clients[0]), delay_notices(clients[1])]
        self.backends = [
            AsyncRedisCheckpointBackend(clients[0], max_staleness=MAX_STALENESS),
            AsyncRedisCheckpointBackend(clients[1], max_staleness=MAX_STALENESS),
            AsyncRedisCheckpointBackend(clients[2], watch=False),
        ]
        self.admin = target.client()
        self.run_id = uuid.uuid4()
        self.counter = 0
        self.kills = 0
        self.killed = 0

    async def start(self) -> None:
        await self.backends[0].init_run(self.run_id, "task 0", "/d")
        for backend in self.backends[1:]:
            assert await backend.open_run(self.run_id) is not None

    async def aclose(self) -> None:
        for gate in self.gates:
            gate.seconds = 0.0
        await self.target.aclose(self.backends)

    async def truth(self) -> RunCheckpoint | None:
        return await self.target.load(self.run_id)

    async def kill_subscribers(self, who: int) -> None:
        """Reconnect: the server closes every pub/sub connection (CLIENT KILL TYPE pubsub);
        fakeredis has no CLIENT KILL, so there the listener drops its connection."""
        self.kills += 1
        if self.target.kind == "redis":
            self.killed += int(await self.admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))
            return
        listener = AsyncChangeListener.existing(self.backends[who].client)
        assert listener is not None
        listener.drop_connections_for_tests()

    async def step(self, op: str, who: int, arg: int) -> None:
        self.counter += 1
        n, run_id = self.counter, self.run_id
        actor = self.backends[who]
        if op == "append":
            await actor.append_event(agent_done(run_id, tokens=arg + 1))
        elif op == "complete":
            await actor.append_event(completed(run_id))
        elif op == "cancel":
            await actor.cancel()
        elif op == "reset":
            with contextlib.suppress(NotResumableError):
                await actor.reset_status_to_running()
        elif op == "upsert":
            await actor.upsert_agent_result(result(uuid.UUID(int=arg + 1), n))
        elif op == "save":
            cp = actor.get_checkpoint()
            assert cp is not None
            await actor.save_checkpoint(cp)
        elif op == "recreate":
            assert await actor.delete_run() is True
            await actor.init_run(run_id, f"task {n}", "/d")
        elif op == "delay" and who < len(self.gates):
            self.gates[who].seconds = DELAYS[arg]
        elif op == "kill" and who < len(self.gates):
            await self.kill_subscribers(who)

    async def server_tip(self) -> tuple[str, int]:
        """The stored run's ``(incarnation, version)``."""
        keys = self.backends[0].keys or self.backends[1].keys
        assert keys is not None
        inc, version = await self.admin.hmget(keys.run, ["incarnation", "version"])
        text = inc.decode() if isinstance(inc, bytes) else str(inc or "")
        return text, int(version or 0)

    async def check(self, label: str) -> None:
        """A cache reporting fresh equals a fresh load (every change is older than
        max_staleness now); a cache whose (incarnation, version) is the stored one holds
        exactly the stored state, whether it reports fresh or not."""
        truth, tip = await self.truth(), await self.server_tip()
        for index, backend in enumerate(self.backends):
            fresh = backend.cache_is_fresh
            binding = backend._binding
            assert binding is not None
            claimed = binding.cache.tip
            seen = backend.get_checkpoint()
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


async def _play(world: _World, steps: list[tuple[str, int, int]]) -> None:
    """Run ``steps``, checking the invariants after each, then lift every delay and wait
    until every notice of the last step has arrived."""
    await world.start()
    assert await eventually(lambda: all(b.cache_is_fresh for b in world.backends[:2]))
    for k, (op, who, arg) in enumerate(steps):
        await world.step(op, who, arg)
        await asyncio.sleep(MAX_STALENESS + 0.05)  # every change of this step is older now
        await world.check(f"after step {k} {(op, who, arg)} of {steps}")
    for gate in world.gates:
        gate.seconds = 0.0
    await asyncio.sleep(max(DELAYS) + MAX_STALENESS)
    if world.kills and world.target.kind == "redis":
        assert world.killed >= 1, "CLIENT KILL TYPE pubsub found no subscriber connection"


PROPERTY = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@PROPERTY
@given(steps=steps_strategy)
@example(steps=[("delay", 0, 2), ("kill", 0, 0), ("append", 1, 0), ("recreate", 2, 0)])
def test_random_interleavings(target: Target, steps: list[tuple[str, int, int]]) -> None:
    """After every step: fresh means equal to a fresh load, and a cache at the stored
    version holds the stored state. In the end every backend converges on ``await sync()``."""

    async def main() -> None:
        world = _World(target)
        try:
            await _play(world, steps)
            truth = await world.truth()
            assert truth is not None
            for index, backend in enumerate(world.backends):
                assert await backend.sync() == truth, f"backend {index} did not converge"
                assert backend.get_checkpoint() == truth
            await world.check("after sync()")
        finally:
            await world.aclose()

    run(main)


@pytest.mark.parametrize("redis_target", FAKE_AND_REDIS)
@settings(PROPERTY, max_examples=5)
@given(steps=steps_strategy)
@example(steps=[("recreate", 1, 0)])  # b0 watches while b1 deletes and re-creates the run
@example(steps=[("delay", 1, 2), ("kill", 1, 0), ("cancel", 0, 0)])
def test_random_interleavings_regain_freshness_unaided(
    target: Target, steps: list[tuple[str, int, int]]
) -> None:
    """The same, but nobody calls ``sync()``: once the notices flow again, every watching
    backend becomes fresh and current by itself."""

    async def main() -> None:
        world = _World(target)
        try:
            await _play(world, steps)
            for index, backend in enumerate(world.backends[:2]):
                assert await converges([backend], target), (
                    f"watching backend {index} stayed stale: {describe(backend)}"
                )
        finally:
            await world.aclose()

    run(main)
