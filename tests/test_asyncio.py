"""``AsyncRedisCheckpointBackend``: the asyncio front end over the same core as the sync one.

* concurrency through ``asyncio.gather`` on one backend, and two backends writing at once;
* coherence with a sync backend in another process (``spawn``) on a real redis-server;
* refusal of the wrong kind of client (both ways);
* ``cache_is_fresh``, ``subscribe`` with plain and coroutine callbacks, ``wait_for_change``;
* exactly-once writes through lost replies (a small asyncio TCP proxy);
* fork detection, ``from_url``, durability, the live feed in a task, listener recovery, and a
  ``CLUSTER FAILOVER`` of the run's slot (``redis_cluster_replicas``, marked ``slow``).

The contract itself (every operation, the cache equal to a fresh load after every step, the
random-operations property) is tests/test_backend.py's conformance suite, which runs on this
front end too (``frontend="async"``, through conftest.py's ``AsyncBackendProxy``), and so do
the hostile cases of tests/test_hostile.py; this file has what only asyncio code can show.

Runs on fakeredis (``FakeAsyncRedis``), a private redis-server and a private 3-master cluster
(the ``redis_target`` fixture of ``conftest.py``). pytest-asyncio is not used: each test runs
its coroutine with :func:`asyncio.run`, bounded by :data:`TEST_TIMEOUT`. The spawned child runs
this very file with :func:`runpy.run_path` (as ``_CHILD_RUN_NAME``): pytest imports test files
with ``--import-mode=importlib``, which a spawned child could not import by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import runpy
import time
import traceback
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot

import luft_redis
from luft_redis import (
    AgentDone,
    AgentSessionCheckpoint,
    AgentStatus,
    AsyncRedisCheckpointBackend,
    CheckpointStatus,
    Durability,
    Finding,
    Log,
    LogLevel,
    NotDurableError,
    RedisCheckpointBackend,
    RetryPolicy,
    RunCheckpoint,
    RunNotFoundError,
    Severity,
    TokenUsage,
)
from luft_redis import errors as luft_errors
from luft_redis.asyncio import AsyncChangeListener
from luft_redis.asyncio import index as async_index
from luft_redis.tools.server import LOOPBACK, LocalRedisCluster, LocalRedisServer

_CHILD_RUN_NAME = "_luft_asyncio_child"
TEST_TIMEOUT = 60.0
"""Seconds one test's coroutine may take in all."""
BOUND = 5.0
"""Seconds any single wait may take: far above the expected milliseconds."""
GENEROUS = RetryPolicy(max_attempts=30, deadline=30.0, initial_delay=0.002, max_delay=0.05)

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------------------ targets


class Target:
    """Makes asyncio (and sync) clients to the current target; call :meth:`client` on the
    loop that will use the client."""

    def __init__(self, kind: str, *, fake: fakeredis.FakeServer | None = None,
                 url: str = "", nodes: list[tuple[str, int]] | None = None) -> None:  # fmt: skip
        self.kind = kind
        self.fake = fake
        self.url = url
        self.nodes = nodes or []

    def client(self) -> Any:
        """A new asyncio client (``decode_responses=False``)."""
        if self.kind == "fakeredis":
            return fakeredis.FakeAsyncRedis(server=self.fake)
        if self.kind == "redis":
            return redis.asyncio.Redis.from_url(self.url)
        host, port = self.nodes[0]
        return redis.asyncio.cluster.RedisCluster(host=host, port=port)

    def sync_client(self) -> Any:
        if self.kind == "fakeredis":
            return fakeredis.FakeRedis(server=self.fake)
        if self.kind == "redis":
            return redis.Redis.from_url(self.url)
        host, port = self.nodes[0]
        return redis.cluster.RedisCluster(host=host, port=port)


@pytest.fixture
def target(redis_target: str, request: pytest.FixtureRequest) -> Target:
    """The current target, emptied."""
    if redis_target == "fakeredis":
        return Target("fakeredis", fake=fakeredis.FakeServer())
    if redis_target == "redis":
        server: LocalRedisServer = request.getfixturevalue("redis_server")
        with redis.Redis.from_url(server.url) as conn:
            conn.flushall()
        return Target("redis", url=server.url)
    cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    return Target("cluster", nodes=cluster.startup_nodes)


def run(main: Callable[[], Coroutine[Any, Any, None]], timeout: float = TEST_TIMEOUT) -> None:
    """Run ``main()`` on a new event loop, failing when it takes longer than ``timeout``."""

    async def bounded() -> None:
        await asyncio.wait_for(main(), timeout)

    asyncio.run(bounded())


class Backends:
    """Backends on their own clients to one target, all closed by :meth:`aclose`."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.made: list[AsyncRedisCheckpointBackend] = []
        self.clients: list[Any] = []

    def make(self, **kwargs: Any) -> AsyncRedisCheckpointBackend:
        client = self.target.client()
        self.clients.append(client)
        backend = AsyncRedisCheckpointBackend(client, **kwargs)
        self.made.append(backend)
        return backend

    async def fresh(self, run_id: uuid.UUID) -> RunCheckpoint:
        """The run as a new backend on a new client loads it."""
        client = self.target.client()
        try:
            other = AsyncRedisCheckpointBackend(client, watch=False)
            cp = await other.open_run(run_id)
            assert cp is not None
            return cp
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        for backend in self.made:
            await backend.aclose()
        for client in self.clients:
            listener = AsyncChangeListener.existing(client)
            if listener is not None:
                await listener.aclose()
            await client.aclose()


async def eventually(predicate: Callable[[], bool], bound: float = BOUND) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.002)
    return predicate()


def done(run_id: uuid.UUID, agent: uuid.UUID | None = None, tokens: int = 10) -> AgentDone:
    agent = agent or uuid.uuid4()
    return AgentDone(
        run_id=run_id, agent_id=agent, status=AgentStatus.OK,
        tokens=TokenUsage(input=tokens, output=1), elapsed_ms=1,
        findings=(Finding(kind="k", severity=Severity.LOW, title=str(agent), detail="d"),),
    )  # fmt: skip


# ------------------------------------------------------------------------------ 1. the live feed


def test_the_live_feed_follows_in_a_task(target: Target) -> None:
    """``iter_events`` following the log in a task while another coroutine writes (what the
    log holds, read from a stream id, and ``"$"`` when nothing is new, is
    tests/test_backend.py's ``test_event_log_from_a_stream_id``, on both front ends)."""

    async def main() -> None:
        backends = Backends(target)
        try:
            b, reader = backends.make(), backends.make()
            run_id = uuid.uuid4()
            await b.init_run(run_id, "feed", "/tmp/feed")
            await reader.open_run(run_id)
            first = Log(run_id=run_id, level=LogLevel.INFO, msg="m0")
            await b.append_events([first])
            got = [entry async for entry in reader.iter_events(follow=False)]
            assert [entry.event for entry in got] == [first]

            async def follow() -> list[Any]:
                seen = []
                async for entry in reader.iter_events(got[-1].id, timeout=BOUND, block_ms=50):
                    seen.append(entry.event)
                    if len(seen) == 2:
                        break
                return seen

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.05)
            later = [done(run_id, tokens=1), Log(run_id=run_id, level=LogLevel.WARN, msg="w")]
            for event in later:
                await b.append_event(event)
            assert await follower == later
        finally:
            await backends.aclose()

    run(main)


# ------------------------------------------------------------------------------ 2. gather


def test_concurrent_writes_on_one_backend(target: Target) -> None:
    async def main() -> None:
        backends = Backends(target)
        try:
            b = backends.make()
            run_id = uuid.uuid4()
            await b.init_run(run_id, "gather", "/tmp/gather")
            await asyncio.gather(*(b.append_event(done(run_id, tokens=9)) for _ in range(50)))
            cp = b.get_checkpoint()
            assert cp is not None
            assert cp.total_tokens == 50 * 10 and len(cp.agent_results) == 50
            assert len(await b.get_event_log()) == 50
            assert cp == await backends.fresh(run_id)
            # results and sessions too, mixed with events
            agents = [uuid.uuid4() for _ in range(20)]
            await asyncio.gather(*(
                b.upsert_agent_session(AgentSessionCheckpoint(
                    agent_id=a, session_id=str(a), status="s", updated_at=1))
                for a in agents
            ), *(b.append_event(done(run_id, a, tokens=1)) for a in agents))  # fmt: skip
            cp = b.get_checkpoint()
            assert cp is not None and cp.total_tokens == 500 + 20 * 2
            assert set(agents) <= set(cp.agent_sessions) and len(cp.agent_results) == 70
            assert cp == await backends.fresh(run_id)
        finally:
            await backends.aclose()

    run(main)


def test_two_backends_writing_at_once_converge(target: Target) -> None:
    """Interleaved writers on separate clients: each write's reply may be ahead of its cache
    (the other's notice not in yet): it waits for the notices or reloads, never guesses."""

    async def main() -> None:
        backends = Backends(target)
        try:
            one, two = backends.make(), backends.make()
            run_id = uuid.uuid4()
            await one.init_run(run_id, "two", "/tmp/two")
            await two.open_run(run_id)
            await asyncio.gather(*(
                (one if i % 2 else two).append_event(done(run_id, tokens=i)) for i in range(60)
            ))  # fmt: skip
            fresh = await backends.fresh(run_id)
            assert fresh.total_tokens == sum(range(60)) + 60
            assert await eventually(lambda: one.get_checkpoint() == fresh == two.get_checkpoint())
            assert one.version == two.version
            assert len(await two.get_event_log()) == 60
        finally:
            await backends.aclose()

    run(main)


# ------------------------------------------------------------------------------ 3. processes


def test_a_sync_process_and_an_async_watcher(redis_server: LocalRedisServer) -> None:
    """A spawned process writes with the sync backend; this process's async cache follows."""
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()
    url, run_id, count = redis_server.url, uuid.uuid4(), 40

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url)
        watcher = AsyncRedisCheckpointBackend(client)
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        proc: Any = None
        try:
            await watcher.init_run(run_id, "fleet", "/tmp/fleet")
            assert await eventually(lambda: watcher.cache_is_fresh)
            start = watcher.version
            changes: list[int] = []
            watcher.subscribe(lambda cp: changes.append(cp.total_tokens))
            proc = ctx.Process(
                target=runpy.run_path, args=(__file__,), daemon=True,
                kwargs={"init_globals": {"_CHILD_ARGS": {"url": url, "run_id": str(run_id),
                                                         "count": count, "out": out}},
                        "run_name": _CHILD_RUN_NAME},
            )  # fmt: skip
            proc.start()
            assert await watcher.wait_for_change(start, timeout=30), "no change arrived"
            assert await eventually(lambda: watcher.version >= start + count, 30)
            await asyncio.to_thread(proc.join, 30)
            assert proc.exitcode == 0, out.get(timeout=1) if not out.empty() else proc.exitcode
            cp = watcher.get_checkpoint()
            assert cp is not None and cp.total_tokens == count * 3
            loader = AsyncRedisCheckpointBackend(redis.asyncio.Redis.from_url(url), watch=False)
            assert await loader.open_run(run_id) == cp
            await loader.client.aclose()
            assert watcher.version == start + count
            assert await eventually(lambda: watcher.cache_is_fresh)
            assert await eventually(lambda: bool(changes) and changes[-1] == count * 3)
        finally:
            if proc is not None and proc.is_alive():
                proc.kill()
            await watcher.aclose()
            await client.aclose()

    run(main, 120)


def _child_main(a: dict[str, Any]) -> None:
    try:
        run_id = uuid.UUID(a["run_id"])
        with RedisCheckpointBackend.from_url(a["url"]) as backend:
            assert backend.open_run(run_id) is not None
            for _ in range(a["count"]):
                backend.append_event(AgentDone(
                    run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                    tokens=TokenUsage(input=2, output=1), elapsed_ms=1))  # fmt: skip
    except BaseException:
        a["out"].put(traceback.format_exc())
        raise


# ------------------------------------------------------------------------------ 4. refusal


def test_each_backend_refuses_the_other_kind_of_client() -> None:
    sync_clients: list[Any] = [fakeredis.FakeRedis(), redis.Redis(host=LOOPBACK, port=1)]
    for client in sync_clients:
        with pytest.raises(luft_errors.ClientTypeError) as caught:
            AsyncRedisCheckpointBackend(client)
        err = caught.value
        assert isinstance(err, TypeError) and isinstance(err, luft_redis.LuftRedisError)
        assert type(client).__name__ in str(err)
        assert "luft_redis.RedisCheckpointBackend with it" in str(err)

    async def main() -> None:
        async_clients: list[Any] = [
            fakeredis.FakeAsyncRedis(),
            redis.asyncio.Redis(host=LOOPBACK, port=1),
            redis.asyncio.cluster.RedisCluster(host=LOOPBACK, port=1),
        ]
        for client in async_clients:
            with pytest.raises(luft_errors.ClientTypeError) as caught:
                RedisCheckpointBackend(client)
            err = caught.value
            assert isinstance(err, TypeError) and isinstance(err, luft_redis.LuftRedisError)
            assert "luft_redis.AsyncRedisCheckpointBackend" in str(err)
            AsyncRedisCheckpointBackend(client)  # the right kind is accepted
        decoding = redis.asyncio.Redis(host=LOOPBACK, port=1, decode_responses=True)
        with pytest.raises(luft_errors.ConfigurationError) as refused:
            AsyncRedisCheckpointBackend(decoding)
        assert not isinstance(refused.value, TypeError)
        with pytest.raises(luft_errors.ConfigurationError):
            AsyncRedisCheckpointBackend(fakeredis.FakeAsyncRedis(), max_staleness=0)
        AsyncRedisCheckpointBackend(async_clients[2], durability=Durability())  # Cluster too

    run(main)


# ------------------------------------------------------------------------------ 5. freshness


def test_cache_is_fresh_and_subscribe(target: Target) -> None:
    async def main() -> None:
        backends = Backends(target)
        try:
            writer, reader = backends.make(), backends.make()
            unwatched = backends.make(watch=False)
            run_id = uuid.uuid4()
            assert not reader.cache_is_fresh
            await writer.init_run(run_id, "fresh", "/tmp/fresh")
            assert await reader.open_run(run_id) is not None
            assert await unwatched.open_run(run_id) is not None
            assert await eventually(lambda: writer.cache_is_fresh and reader.cache_is_fresh)
            assert not unwatched.cache_is_fresh

            plain: list[int] = []
            coro: list[int] = []
            got = asyncio.Event()

            async def on_change_async(cp: RunCheckpoint) -> None:
                await asyncio.sleep(0)
                coro.append(cp.total_tokens)
                got.set()

            unsubscribe_plain = reader.subscribe(lambda cp: plain.append(cp.total_tokens))
            reader.subscribe(on_change_async)
            mine: list[int] = []
            writer.subscribe(lambda cp: mine.append(cp.total_tokens))

            before = reader.version
            await writer.append_event(done(run_id, tokens=41))
            assert await reader.wait_for_change(before, timeout=BOUND)
            await asyncio.wait_for(got.wait(), BOUND)
            assert plain[-1] == 42 and coro[-1] == 42
            assert mine, "the writer's own change reaches its callbacks"
            assert reader.get_checkpoint() == writer.get_checkpoint()
            assert await eventually(lambda: reader.cache_is_fresh)

            unsubscribe_plain()
            seen = len(plain)
            got.clear()
            await writer.append_event(done(run_id, tokens=1))
            await asyncio.wait_for(got.wait(), BOUND)
            assert coro[-1] == 44 and len(plain) == seen

            # sync() answers from the cache when fresh, reloads otherwise
            assert await reader.sync() == writer.get_checkpoint()
            assert await unwatched.sync() == writer.get_checkpoint()
            assert not await reader.wait_for_change(timeout=0.05)

            # a delete reaches the watcher: not fresh any more, its writes fail
            assert await writer.delete_run() is True
            assert await eventually(lambda: not reader.cache_is_fresh)
            with pytest.raises(RunNotFoundError):
                await reader.append_event(done(run_id))
            assert await reader.sync() is None
        finally:
            await backends.aclose()

    run(main)


def test_listener_recovers_from_a_lost_connection(target: Target) -> None:
    async def main() -> None:
        backends = Backends(target)
        try:
            watcher, writer = backends.make(), backends.make()
            run_id = uuid.uuid4()
            await writer.init_run(run_id, "loss", "/tmp/loss")
            await watcher.open_run(run_id)
            assert await eventually(lambda: watcher.cache_is_fresh)
            listener = AsyncChangeListener.existing(watcher.client)
            assert listener is not None and listener.connected
            listener.drop_connections_for_tests()
            assert await eventually(lambda: not watcher.cache_is_fresh)
            await writer.append_event(done(run_id, tokens=4))  # during the outage
            assert await eventually(lambda: watcher.cache_is_fresh)
            assert await eventually(
                lambda: getattr(watcher.get_checkpoint(), "total_tokens", 0) == 5)
            await writer.append_event(done(run_id, tokens=6))  # after it
            assert await eventually(
                lambda: getattr(watcher.get_checkpoint(), "total_tokens", 0) == 12)
            assert watcher.get_checkpoint() == await backends.fresh(run_id)
        finally:
            await backends.aclose()

    run(main)


@pytest.mark.slow
def test_the_listener_follows_a_cluster_failover(redis_cluster_replicas: LocalRedisCluster) -> None:
    """CLUSTER FAILOVER of the run's slot: the old primary drops the shard subscription
    (an unrequested ``sunsubscribe``); the listener refreshes the topology, subscribes on the
    new primary, and the cache is fresh again and sees later changes."""
    cluster = redis_cluster_replicas
    cluster.flushall()
    target = Target("cluster", nodes=cluster.startup_nodes)

    async def main() -> None:
        backends = Backends(target)
        try:
            writer, watcher = backends.make(retry=GENEROUS), backends.make(retry=GENEROUS)
            run_id = uuid.uuid4()
            await writer.init_run(run_id, "failover", "/tmp/failover")
            await watcher.open_run(run_id)
            assert await eventually(lambda: watcher.cache_is_fresh)
            assert watcher.keys is not None
            slot = key_slot(watcher.keys.changes.encode())
            primary = cluster.primary_for_slot(slot)
            replica = cluster.replicas_of(primary)[0]
            with redis.Redis(host=replica.host, port=replica.port) as conn:
                conn.execute_command("CLUSTER", "FAILOVER")

            assert await eventually(lambda: cluster.is_primary(slot, replica), 30), \
                "the failover did not happen"
            assert await eventually(lambda: not watcher.cache_is_fresh, 10)
            await writer.append_event(done(run_id, tokens=6))
            assert await eventually(lambda: watcher.cache_is_fresh, 20)
            assert await eventually(
                lambda: getattr(watcher.get_checkpoint(), "total_tokens", 0) == 7, 10)
            before = watcher.version
            await writer.append_event(done(run_id, tokens=1))
            assert await watcher.wait_for_change(before, timeout=10)
            assert await eventually(
                lambda: getattr(watcher.get_checkpoint(), "total_tokens", 0) == 9, 10)
            assert watcher.get_checkpoint() == await backends.fresh(run_id)
        finally:
            await backends.aclose()

    run(main, 120)


# ------------------------------------------------------------------------------ 6. lost replies


class LossyProxy:
    """An asyncio TCP proxy on 127.0.0.1 in front of a redis-server that breaks the connection
    around the next ``FCALL`` (every luft-redis state change is one) when armed:

    * ``lose_reply()``: the command reaches Redis and is applied; its reply is not forwarded
      and both sides are closed (the client sees a lost connection for an applied write);
    * ``lose_request()``: the connection is closed as the command arrives, before a byte of it
      reaches Redis.

    Error replies (``-ERR Function not found``, ``-LUFT_...``) are always forwarded: nothing
    was applied.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.replies_to_lose = 0
        self.requests_to_lose = 0
        self.lost = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def lose_reply(self) -> None:
        self.replies_to_lose += 1

    def lose_request(self) -> None:
        self.requests_to_lose += 1

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        self._writers.update((client_w, up_w))
        awaiting = False  # an FCALL went upstream; its reply has not begun

        def cut() -> None:
            for w in (client_w, up_w):
                w.close()

        async def upstream() -> None:
            nonlocal awaiting
            while data := await client_r.read(65536):
                if b"FCALL" in data.upper():  # also FCALL_RO
                    if self.requests_to_lose > 0:
                        self.requests_to_lose -= 1
                        self.lost += 1
                        cut()
                        return
                    awaiting = True
                up_w.write(data)
                await up_w.drain()
            cut()

        async def downstream() -> None:
            nonlocal awaiting
            while data := await up_r.read(65536):
                if awaiting and self.replies_to_lose > 0 and not data.startswith(b"-"):
                    self.replies_to_lose -= 1
                    self.lost += 1
                    cut()
                    return
                awaiting = False
                client_w.write(data)
                await client_w.drain()
            cut()

        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(upstream(), downstream())
        cut()
        self._writers.difference_update((client_w, up_w))


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "no-watch"])
def test_lost_replies_and_requests_apply_once(redis_server: LocalRedisServer, watch: bool) -> None:
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()

    async def main() -> None:
        proxy = LossyProxy(redis_server.port)
        await proxy.start()
        # redis-py's own retries off: every retry is the backend's RetryPolicy
        client = redis.asyncio.Redis(host=LOOPBACK, port=proxy.port,
                                     retry=AsyncRetry(NoBackoff(), 0))  # fmt: skip
        direct = redis.asyncio.Redis.from_url(redis_server.url)
        b = AsyncRedisCheckpointBackend(client, watch=watch, retry=GENEROUS)
        try:
            run_id = uuid.uuid4()
            await b.init_run(run_id, "faults", "/tmp/faults")
            loader = AsyncRedisCheckpointBackend(direct, watch=False)
            expected_tokens, expected_log = 0, 0
            for lose in (proxy.lose_reply, proxy.lose_request, proxy.lose_reply):
                lost = proxy.lost
                lose()
                await b.append_event(done(run_id, tokens=99))
                expected_tokens += 100
                expected_log += 1
                assert proxy.lost == lost + 1, "the fault was not injected"
                fresh = await loader.open_run(run_id)
                assert fresh is not None
                assert fresh.total_tokens == expected_tokens
                assert await direct.xlen(b.keys.events) == expected_log  # type: ignore[union-attr]
                assert await eventually(lambda f=fresh: b.get_checkpoint() == f)  # type: ignore[misc]
            proxy.lose_reply()
            await b.cancel()
            proxy.lose_reply()
            await b.reset_status_to_running()
            fresh = await loader.open_run(run_id)
            assert fresh is not None and fresh.status is CheckpointStatus.RUNNING
            assert await eventually(lambda: b.get_checkpoint() == fresh)
            assert len(await b.get_event_log()) == expected_log
        finally:
            await b.aclose()
            listener = AsyncChangeListener.existing(client)
            if listener is not None:
                await listener.aclose()
            await client.aclose()
            await direct.aclose()
            await proxy.stop()

    run(main)


# ------------------------------------------------------------------------------ the rest


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_backend_made_before_a_fork_refuses_to_work_in_the_child() -> None:
    holder: list[AsyncRedisCheckpointBackend] = []
    run_id = uuid.uuid4()

    async def make() -> None:
        b = AsyncRedisCheckpointBackend(fakeredis.FakeAsyncRedis(), watch=False)
        await b.init_run(run_id, "fork", "/tmp/fork")
        holder.append(b)

    run(make)
    backend = holder[0]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what happened through the pipe, never return
        code = 1
        try:
            os.close(read_fd)
            try:
                asyncio.run(backend.append_event(done(run_id)))
                message = "no error"
            except luft_errors.ForkedError as exc:
                message = "ForkedError " + str(exc)
                assert not backend.cache_is_fresh
                asyncio.run(backend.aclose())  # releases nothing of the parent's
                code = 0
            os.write(write_fd, message.encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + 30
    status = None
    while time.monotonic() < deadline:
        waited, status = os.waitpid(pid, os.WNOHANG)
        if waited:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    with os.fdopen(read_fd, "rb") as reader:
        message = reader.read().decode()
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, message
    assert message.startswith("ForkedError") and "after the fork" in message
    assert isinstance(luft_errors.ForkedError("x"), luft_redis.LuftRedisError)


@pytest.mark.parametrize("redis_target", ["redis", "cluster"], indirect=True)
def test_from_url_owns_and_closes_its_client(target: Target) -> None:
    async def main() -> None:
        cluster = target.kind == "cluster"
        url = target.url if not cluster else "redis://{}:{}/0".format(*target.nodes[0])
        run_id = uuid.uuid4()
        async with AsyncRedisCheckpointBackend.from_url(url, cluster=cluster,
                                                        prefix="p1") as b:  # fmt: skip
            assert b.prefix == "p1" and b.max_staleness == 1.0
            expected = redis.asyncio.cluster.RedisCluster if cluster else redis.asyncio.Redis
            assert isinstance(b.client, expected)
            await b.init_run(run_id, "url", "/tmp/url")
            assert await eventually(lambda: b.cache_is_fresh)
            await b.append_event(done(run_id))
            assert b.keys is not None and b.keys.run.startswith("p1:")
            listener = AsyncChangeListener.existing(b.client)
            assert listener is not None
        assert b.run_id is None and not b.cache_is_fresh
        assert AsyncChangeListener.existing(b.client) is None
        backends = Backends(target)
        try:
            other = backends.make(prefix="p1")
            cp = await other.open_run(run_id)
            assert cp is not None and cp.total_tokens == 11
        finally:
            await backends.aclose()

    run(main)


def test_durability_reports_a_write_too_few_replicas_acknowledged(
    redis_server: LocalRedisServer,
) -> None:
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()

    async def main() -> None:
        async with AsyncRedisCheckpointBackend.from_url(
            redis_server.url, durability=Durability(replicas=1, timeout_ms=10)
        ) as b:
            run_id = uuid.uuid4()
            with pytest.raises(NotDurableError):  # init_run waits for replicas too
                await b.init_run(run_id, "durable", "/tmp/durable")
            assert b.run_id == run_id  # created and bound all the same
            with pytest.raises(NotDurableError) as caught:
                await b.append_event(done(run_id, tokens=4))
            assert caught.value.acked == 0 and caught.value.wanted == 1
            cp = b.get_checkpoint()
            assert cp is not None and cp.total_tokens == 5  # applied all the same
            assert len(await b.get_event_log()) == 1

    run(main)


def test_retry_policy_acall() -> None:
    async def main() -> None:
        calls: list[int] = []

        async def flaky() -> str:
            calls.append(1)
            if len(calls) < 3:
                raise redis.exceptions.ConnectionError("reset")
            return "ok"

        policy = RetryPolicy(max_attempts=5, initial_delay=0.001, max_delay=0.002)
        assert await policy.acall(flaky) == "ok" and len(calls) == 3
        calls.clear()
        assert await policy.acall(lambda: flaky()) == "ok" and len(calls) == 3  # not async def

        async def broken() -> str:
            calls.append(1)
            raise redis.exceptions.ResponseError("LUFT_NO_RUN x")

        calls.clear()
        with pytest.raises(redis.exceptions.ResponseError):
            await policy.acall(broken)
        assert len(calls) == 1

        async def down() -> str:
            calls.append(1)
            raise redis.exceptions.TimeoutError("slow")

        calls.clear()
        with pytest.raises(redis.exceptions.TimeoutError):
            await RetryPolicy(max_attempts=3, initial_delay=0.001).acall(down)
        assert len(calls) == 3

    run(main)


if __name__ == _CHILD_RUN_NAME:
    _child_main(globals()["_CHILD_ARGS"])


def test_index_writes_keep_the_status_counts(target: Target) -> None:
    """The asyncio front end's index writes (init, cancel, resume, delete) keep the runs by
    status next to the index (lua/index_status-3.lua), as the sync ones do."""

    async def main() -> None:
        client = target.client()
        backend = AsyncRedisCheckpointBackend(client)
        ids = [uuid.uuid4() for _ in range(3)]
        for run_id in ids:
            await backend.init_run(run_id, "t", "d")
        await backend.cancel()
        assert (await async_index.read_counts(client, "luft")).counts["cancelled"] == 1
        await backend.reset_status_to_running()
        await backend.delete_run(ids[0])
        found = await async_index.read_counts(client, "luft")
        assert found.exact and found.counts["running"] == 2 and found.counts["cancelled"] == 0
        await backend.aclose()
        await client.aclose()

    run(main)
