"""``AsyncRedisCheckpointBackend``: luft's ``CheckpointBackend`` contract on Redis, for asyncio.

The asyncio twin of :class:`luft_redis.RedisCheckpointBackend`, over the same I/O-free core:
arguments are built by :mod:`luft_redis.wire`, every change is one Lua script whose reply is a
:class:`~luft_redis.delta.Delta`, and the :class:`~luft_redis.cache.RunCache` applies deltas
(its own writes' and, through :mod:`luft_redis.asyncio.listener`, every other process's). This
module only does the I/O around them, with ``await``; operations have the sync names, errors
and semantics.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import redis.exceptions

from .. import types as t
from ..cache import Offer, RunCache, RunState
from ..cluster import araise_lost_redirect
from ..coherence import DEFAULT_MAX_STALENESS, Watch, fork_generation
from ..connect import Durability, check_async_client, is_cluster, make_client
from ..delta import Delta, UnknownFormat, parse_delta
from ..errors import (
    BackendError,
    CorruptDataError,
    ForkedError,
    LuftRedisError,
    RunNotBoundError,
    RunNotFoundError,
    ValidationError,
)
from ..frontend import (
    _UNBOUND,
    DEFAULT_PAGE_SIZE,
    GAP_WAIT,
    REDIS_ERRORS,
    REFRESH_RETRY_DELAY,
    SUBSCRIBE_TIMEOUT,
    Binding,
    FrontEnd,
)
from ..index import finishes, index_add_async, index_remove_async, score_of
from ..keys import (
    DEFAULT_PREFIX,
    TOMBSTONE_TTL,
    run_id_from_key,
    run_keys,
    run_pattern,
    tombstone_key,
)
from ..retry import DEFAULT_RETRY, RetryPolicy
from ..scripts import Function, cluster_route, is_function_missing, translate_error
from ..tracing import traced
from ..wire import (
    DEFAULT_MAX_PAYLOAD_SIZE,
    LogEntry,
    check_uuid,
    decode_entry,
    entry_id,
    page_after,
    xread_entries,
)
from .listener import AsyncChangeListener, AsyncRefresher, Signal, weak_work

__all__ = ["AsyncRedisCheckpointBackend", "ChangeCallback"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_PRIMED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The asyncio RedisCluster clients that loaded the library on every primary."""

ChangeCallback = Callable[[t.RunCheckpoint], object]
"""A change callback: a function, or a coroutine function (its coroutine runs as a task)."""


class AsyncRedisCheckpointBackend(FrontEnd):
    """luft's checkpoint backend on Redis (asyncio front end).

    ``client`` is a ``redis.asyncio.Redis``, ``redis.asyncio.cluster.RedisCluster`` or
    ``fakeredis.FakeAsyncRedis`` created with ``decode_responses=False`` (the default); many
    backends may share one client. A sync client is refused
    (:class:`~luft_redis.errors.ClientTypeError`): use :class:`luft_redis.RedisCheckpointBackend`.
    The options are those of the sync backend: ``prefix``, ``watch``, ``retry``,
    ``durability``, ``max_payload_size``, ``max_staleness``, ``expire_finished_after`` and
    ``max_events``.

    Every operation that talks to Redis is a coroutine with the sync name and semantics;
    :meth:`get_checkpoint`, :meth:`get_findings` and :meth:`can_resume` are plain methods
    answered from the cache. The change listener and the refresher are tasks on the running
    loop (one of each per client and loop). Release the backend with ``async with`` or
    :meth:`aclose`.

    ``expire_finished_after=timedelta(...)``: a run this backend finishes (completed, failed,
    cancelled) expires that long after, every key at once; resuming it removes the TTL.
    ``max_events=N``: this backend's appends trim the run's event log to about ``N`` entries
    (see :attr:`log_trimmed`). Both are off by default; see :mod:`luft_redis.retention`.

    Forking: asyncio does not survive ``os.fork()``; a backend made before a fork raises
    :class:`~luft_redis.errors.ForkedError` in the child: create the backend after the fork.
    """

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        watch: bool = True,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        durability: Durability | None = None,
        max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        expire_finished_after: timedelta | None = None,
        max_events: int | None = None,
    ) -> None:
        check_async_client(client)
        self._configure(client, prefix=prefix, watch=watch, retry=retry, durability=durability,
                        max_payload_size=max_payload_size, max_staleness=max_staleness)  # fmt: skip
        self._configure_retention(expire_finished_after, max_events)
        self._callbacks: dict[int, ChangeCallback] = {}
        self._next_callback = 0
        self._tasks: set[asyncio.Future[Any]] = set()
        self._waiting = 0
        self._changed = Signal()
        self._fork = fork_generation()
        self._writer_id = uuid.uuid4().hex
        self._op_seq = 0
        self._io_lock = asyncio.Lock()  # one write at a time: operation numbers in order
        self._bind_lock = asyncio.Lock()  # one init_run/open_run at a time

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        cluster: bool = False,
        watch: bool = True,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        durability: Durability | None = None,
        max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        expire_finished_after: timedelta | None = None,
        max_events: int | None = None,
        **client_kwargs: Any,
    ) -> AsyncRedisCheckpointBackend:
        """A backend with its own asyncio client for ``url``, closed by :meth:`aclose`.

        The URLs of :meth:`luft_redis.RedisCheckpointBackend.from_url`: ``redis://``,
        ``rediss://`` (TLS), ``unix://`` (``cluster=True``: a ``RedisCluster``) and
        ``redis+sentinel://[:password@]host:port[,host:port...]/<service>[/<db>]``.
        ``client_kwargs`` go to the client.
        """
        client = make_client(url, cluster=cluster, asyncio=True, **client_kwargs)
        backend = cls(client, prefix=prefix, watch=watch, retry=retry, durability=durability,
                      max_payload_size=max_payload_size, max_staleness=max_staleness,
                      expire_finished_after=expire_finished_after,
                      max_events=max_events)  # fmt: skip
        backend._owns_client = True
        return backend

    # -- plumbing --------------------------------------------------------------------------

    @property
    def cache_is_fresh(self) -> bool:
        """True only when the cache can vouch for itself: no change committed more than
        ``max_staleness`` seconds ago is missing from it (the conditions of
        :attr:`luft_redis.RedisCheckpointBackend.cache_is_fresh`)."""
        return self._fork == fork_generation() and self._fresh(self._binding)

    async def aclose(self) -> None:
        """Unbind the run and stop watching it; close the client if :meth:`from_url` made it.

        When nothing else watches through the client, its listener task stops here and
        returns its subscriber connection, so the client can be closed right after.
        """
        self._unbind()
        if self._fork != fork_generation():
            return  # the connections are the parent's: leave them alone
        listener = AsyncChangeListener.existing(self._client)
        if listener is not None and (self._owns_client or listener.idle):
            await listener.aclose()
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncRedisCheckpointBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_fork(self) -> None:
        if self._fork != fork_generation():
            raise ForkedError(
                "this AsyncRedisCheckpointBackend was made before os.fork(): asyncio clients, "
                "tasks and locks do not survive a fork; create the backend after the fork"
            )

    # -- binding ---------------------------------------------------------------------------

    def _start_watch(self, binding: Binding) -> None:
        if not self._watching:
            return
        listener = AsyncChangeListener.for_client(self._client)
        watch = Watch(binding.cache, binding.channel, self._on_work, self._counters)
        binding.listener, binding.watch = listener, watch
        self._want_changes(binding)
        listener.watch(watch, self._max_staleness)

    @staticmethod
    def _stop_watch(binding: Binding) -> None:
        if binding.watch is not None and binding.listener is not None:
            binding.listener.unwatch(binding.watch)

    async def _prepare(self, run_id: uuid.UUID) -> Binding:
        """A new binding for ``run_id``, watched and (briefly) waited for."""
        keys = run_keys(self._prefix, run_id)
        binding = Binding(run_id, keys, RunCache(run_id, keys))
        if self._watching and is_cluster(self._client):
            try:  # the slot map, so that the listener subscribes on the right node at once
                await self._client.initialize()
            except REDIS_ERRORS as exc:
                raise translate_error(exc, run_id=run_id, prefix=self._prefix) from exc
        self._start_watch(binding)
        if binding.listener is not None:
            await binding.listener.wait_subscribed(binding.channel, SUBSCRIBE_TIMEOUT)
            refused = self._refused(binding.listener, run_id)
            if refused is not None:
                self._stop_watch(binding)
                raise refused
        return binding

    def _adopt(self, binding: Binding) -> None:
        old, self._binding = self._binding, binding
        self._reader = binding.cache
        self._emitted = None
        if old is not None:
            self._stop_watch(old)
        self._changed.notify()
        if binding.watch is not None and not binding.cache.synced:
            self._on_work(binding.watch)  # a confirmation came during the load: reload
        self._emit()

    def _unbind(self) -> None:
        old, self._binding = self._binding, None
        self._reader = _UNBOUND
        if old is not None:
            self._stop_watch(old)
        self._changed.notify()

    def _want_changes(self, binding: Binding) -> None:
        """Ask the watch for every applied notice while callbacks or waiters want them."""
        if binding.watch is not None:
            binding.watch.wants_changes = bool(self._callbacks) or self._waiting > 0

    def _on_work(self, watch: Watch) -> None:
        """From the listener task: a change, a reload or callbacks are due (never blocks)."""
        self._changed.notify()
        binding = self._binding
        if binding is None or binding.watch is not watch:
            return
        if not watch.cache.synced or self._callbacks:
            AsyncRefresher.for_client(self._client).schedule(id(self), weak_work(self, "_refresh"))

    async def _refresh(self) -> None:
        """On the refresher task: reload when stale, then run the change callbacks."""
        binding = self._binding
        if binding is None or self._fork != fork_generation():
            return
        if not binding.cache.synced:
            try:
                await self._reload(binding)
            except LuftRedisError as exc:
                # corrupt data is an operator's problem (ERROR); anything else passes (INFO)
                level = logging.ERROR if isinstance(exc, CorruptDataError) else logging.INFO
                logger.log(level, "run %s: reload failed (%s); trying again", binding.run_id, exc)
                await asyncio.sleep(REFRESH_RETRY_DELAY)
                if binding.watch is not None:
                    self._on_work(binding.watch)
                return
        self._emit()

    async def _reload(self, binding: Binding) -> RunState | None:
        """Load the run now and install it in ``binding``'s cache (I/O; no lock held)."""
        cache = binding.cache
        generation = cache.generation
        self._counters.reloads += 1
        reply = await self._call(self._scripts.load, (), binding.key_list, binding.run_id)
        state = None if reply == 0 or reply is None else RunState.from_load(
            binding.run_id, binding.keys, reply)  # fmt: skip
        cache.install(state, generation)
        self._changed.notify()
        if state is None:
            logger.info("run %s no longer exists; the cache keeps its last state",
                        binding.run_id)  # fmt: skip
        return state

    # -- I/O -------------------------------------------------------------------------------

    async def _fcall(self, fn: Function, keys: list[str], args: Sequence[Any]) -> Any:
        """One attempt of ``fn`` (one round trip when the library is loaded; on "Function
        not found", FUNCTION LOAD on that node and the FCALL once more)."""
        client = self._client
        command = fn.command(keys, args)
        if not self._cluster:
            try:
                return await client.execute_command(*command)
            except redis.exceptions.ResponseError as exc:
                if not is_function_missing(exc):
                    raise
            logger.info("loading the Redis Functions library %s", self._library.name)
            await client.execute_command(*self._library.load_command)
            return await client.execute_command(*command)
        await client.initialize()  # no I/O once done (again after a connection error)
        if client not in _PRIMED:
            await self._prime_cluster()
        try:
            return await client.execute_command(*command, **cluster_route(client, keys))
        except redis.exceptions.ResponseError as exc:
            route = cluster_route(client, keys)
            if not route or not is_function_missing(exc):  # no node known to load it on
                raise
        except AttributeError as exc:  # redirected to a node redis-py does not know: a reshard
            await araise_lost_redirect(client, exc, self._library.load_command)
            raise
        logger.info("loading the Redis Functions library %s on %s", self._library.name,
                    route["target_nodes"].name)  # fmt: skip
        await client.execute_command(*self._library.load_command, **route)
        return await client.execute_command(*command, **route)

    async def _prime_cluster(self) -> None:
        """Load the library on every primary, once per client (a node added or promoted later
        gets it on its first "Function not found")."""
        client = self._client
        _PRIMED.add(client)
        try:
            await client.execute_command(*self._library.load_command,
                                         target_nodes=client.get_primaries())  # fmt: skip
        except REDIS_ERRORS as exc:
            logger.info("loading %s on every primary failed (%s); each node loads it on its "
                        "first miss", self._library.name, exc)  # fmt: skip

    async def _call(self, fn: Function, args: Sequence[Any], keys: list[str],
                    run_id: object) -> Any:  # fmt: skip
        return await self._retried(lambda: self._fcall(fn, keys, args), run_id)

    async def _retried(self, attempt: Callable[[], Awaitable[_T]], run_id: object) -> _T:
        """``await attempt()`` under the retry policy, counted in :meth:`stats`; redis-py's
        errors translated."""
        counters = self._counters
        attempts = 0

        def counted() -> Awaitable[_T]:
            nonlocal attempts
            attempts += 1
            return attempt()

        started = time.perf_counter()
        try:
            return await self._retry.acall(counted)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run_id, prefix=self._prefix) from exc
        finally:
            counters.wait_seconds += time.perf_counter() - started
            if attempts > 1:
                counters.retries += attempts - 1

    async def _execute(self, fn: Function, args: Sequence[Any], keys: list[str],
                       run_id: object) -> tuple[Any, int | None]:  # fmt: skip
        """Run a writing script once, exactly: its operation id is made before any attempt.

        With ``durability``, ``WAIT`` goes in the same round trip (a pipeline); returns the
        reply and the number of replicas that acknowledged (None without durability).
        """
        durability = self._durability
        async with self._io_lock:
            self._op_seq += 1
            full = (self._writer_id, str(self._op_seq), *args)
            if durability is None:
                reply = await self._call(fn, full, keys, run_id)
                self._counters.writes += 1
                return reply, None
            command = fn.command(keys, full)
            wait = ("WAIT", durability.replicas, durability.timeout_ms)

            async def send() -> tuple[Any, Any]:
                pipe = self._client.pipeline(transaction=False)
                pipe.execute_command(*command)
                pipe.execute_command(*wait)
                result, count = await pipe.execute(raise_on_error=False)
                return result, count

            async def attempt() -> tuple[Any, int]:
                result, count = await send()
                if is_function_missing(result):  # nothing ran; the WAIT waited for nothing
                    logger.info("loading the Redis Functions library %s", self._library.name)
                    await self._client.execute_command(*self._library.load_command)
                    result, count = await send()
                for reply in (result, count):
                    if isinstance(reply, Exception):
                        raise reply
                return result, int(count)

            replied = await self._retried(attempt, run_id)
            self._counters.writes += 1
            return replied

    async def _write(self, fn: Function, args: Sequence[Any], binding: Binding) -> Delta:
        """Run a writing script exactly once and apply its delta to ``binding``'s cache;
        NotDurableError (after it was applied) when too few replicas acknowledged it."""
        try:
            reply, acked = await self._execute(
                fn, self._with_retention(args), binding.key_list, binding.run_id)
        except RunNotFoundError:
            binding.cache.install(None, binding.cache.generation)  # the server says: gone
            raise
        delta = await self._absorb(binding, reply)
        if delta.replay:
            self._counters.replays += 1
        self._emit()
        self._check_durable(acked)
        return delta

    async def _absorb(self, binding: Binding, reply: Any) -> Delta:
        """Apply a write's delta: at once when it continues the cache; after the notices of
        the versions in between when they are on their way; else by a reload."""
        cache = binding.cache
        try:
            delta = parse_delta(bytes(reply))
        except (UnknownFormat, ValueError, TypeError) as exc:
            raise BackendError(f"unexpected reply from a luft-redis script: {exc}") from exc
        outcome = cache.offer(delta)
        if outcome is Offer.BEHIND and self.cache_is_fresh:
            want = delta.v_after if not delta.changed or delta.replay else delta.v_before
            await self._wait(
                binding, lambda: cache.tip[0] != delta.inc_before or cache.tip[1] >= want,
                GAP_WAIT,
            )  # fmt: skip
            outcome = cache.offer(delta)
        if outcome in (Offer.BEHIND, Offer.FOREIGN):
            try:
                await self._reload(binding)
            except LuftRedisError as exc:  # the write is applied: report staleness instead
                logger.info("run %s: reload after a write failed (%s)", binding.run_id, exc)
                cache.mark_stale()
                if binding.watch is not None:
                    self._on_work(binding.watch)
        self._changed.notify()
        return delta

    async def _wait(self, binding: Binding, predicate: Callable[[], bool],
                    timeout: float | None) -> bool:  # fmt: skip
        """Wait until ``predicate()`` holds, woken by every change the cache receives."""
        self._waiting += 1
        self._want_changes(binding)
        try:
            return await self._changed.wait_for(predicate, timeout)
        finally:
            self._waiting -= 1
            self._want_changes(binding)

    def _emit(self) -> None:
        """Wake waiters and run the change callbacks once per new version."""
        self._changed.notify()
        binding = self._binding
        if binding is None or not self._callbacks:
            return
        tip = binding.cache.tip
        if tip == self._emitted:
            return
        snapshot = binding.cache.snapshot()
        self._emitted = tip
        if snapshot is None:
            return
        for callback in list(self._callbacks.values()):
            try:
                result = callback(snapshot)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._tasks.add(task)
                    task.add_done_callback(self._callback_done)
            except Exception:
                logger.exception("change callback %r failed", callback)

    def _callback_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("change callback failed", exc_info=task.exception())

    # -- change API ------------------------------------------------------------------------

    @traced("sync")
    async def sync(self) -> t.RunCheckpoint | None:
        """The checkpoint, reloaded first unless the cache can vouch for itself
        (:attr:`cache_is_fresh`) and the run is running (a finished run may have expired,
        which publishes no notice: see ``expire_finished_after``); None when the run no longer
        exists."""
        binding = self._need_run("sync")
        if not self.cache_is_fresh or self._may_have_expired(binding):
            await self._reload(binding)
            self._emit()
        if binding.cache.gone:
            return None
        return binding.cache.snapshot()

    async def wait_for_change(
        self, after_version: int | None = None, timeout: float | None = None
    ) -> bool:
        """Wait until the run's version passes ``after_version`` (default: the current one)
        or the run is replaced or deleted; True if it did, False when ``timeout`` passed.
        Returns True as well when this backend is bound to another run (or unbound)
        meanwhile."""
        binding = self._need_run("wait_for_change")
        cache = binding.cache
        inc, version = cache.tip
        base = version if after_version is None else after_version

        def changed() -> bool:
            tip = cache.tip
            return tip[1] > base or tip[0] != inc or cache.gone or self._binding is not binding

        return await self._wait(binding, changed, timeout)

    def subscribe(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(checkpoint)`` after changes of the bound run; returns a function
        that unsubscribes.

        ``callback`` may be a function or a coroutine function (its coroutine is run as a task).
        Callbacks run on the client's refresher task (other processes' changes) or in the
        writing coroutine (this backend's): keep them short and do not block in them.
        """
        self._check_fork()
        key = self._next_callback
        self._next_callback += 1
        self._callbacks[key] = callback
        binding = self._binding
        if binding is not None:
            self._want_changes(binding)
            self._emitted = binding.cache.tip

        def unsubscribe() -> None:
            self._callbacks.pop(key, None)
            current = self._binding
            if current is not None:
                self._want_changes(current)

        return unsubscribe

    # -- run lifecycle ---------------------------------------------------------------------

    @traced("init_run", run_arg=True)
    async def init_run(self, run_id: uuid.UUID, task: str, run_dir: str) -> None:
        """Create a new run and bind to it. :class:`RunExistsError` if it exists (then nothing
        changed, and this backend stays bound as it was)."""
        await self._init(run_id, task, run_dir, None, with_meta=False)

    @traced("init_run_with_meta", run_arg=True)
    async def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any
    ) -> None:
        """``init_run`` with ``workflow_meta`` (any JSON) stored, in one atomic step."""
        await self._init(run_id, task, run_dir, workflow_meta, with_meta=True)

    async def _init(self, run_id: Any, task: Any, run_dir: Any, meta: Any, *,
                    with_meta: bool) -> None:  # fmt: skip
        self._check_fork()
        rid, args = self._encoder.init_run(run_id, task, run_dir, meta, with_meta=with_meta)
        async with self._bind_lock:
            binding = await self._prepare(rid)
            generation = binding.cache.generation
            try:
                reply, acked = await self._execute(self._scripts.init_run, args,
                                                   binding.key_list, rid)  # fmt: skip
                delta = parse_delta(bytes(reply))
                state = RunState.from_whole(rid, binding.keys, delta)
            except BaseException:
                self._stop_watch(binding)
                raise
            binding.cache.install(state, generation)
            self._adopt(binding)
            await self._index(binding)
        self._check_durable(acked)

    async def _index(self, binding: Binding) -> None:
        """ZADD the run to the run index (luft_redis.index), after a lifecycle change."""
        await index_add_async(self._client, self._retry, self._prefix, binding.run_id,
                              score_of(binding.cache.snapshot()))  # fmt: skip

    @traced("open_run", run_arg=True)
    async def open_run(self, run_id: uuid.UUID) -> t.RunCheckpoint | None:
        """Load run ``run_id`` (not its event log) and bind to it; None if it does not exist
        (this backend then stays bound as it was)."""
        self._check_fork()
        rid = check_uuid(run_id, "run_id")
        async with self._bind_lock:
            binding = await self._prepare(rid)
            try:
                state = await self._reload(binding)
            except BaseException:
                self._stop_watch(binding)
                raise
            if state is None:
                self._stop_watch(binding)
                return None
            self._adopt(binding)
            return binding.cache.snapshot()

    @traced("delete_run", run_arg=True)
    async def delete_run(self, run_id: uuid.UUID | None = None) -> bool:
        """Delete a run (default: the bound one) with its event log; True if it existed.

        Every key of the run goes in one atomic step; backends watching it are told (see
        :meth:`luft_redis.RedisCheckpointBackend.delete_run`). This backend is unbound if it
        was bound to that run.
        """
        self._check_fork()
        rid = self.run_id if run_id is None else check_uuid(run_id, "run_id")
        if rid is None:
            raise RunNotBoundError("delete_run")
        keys = [*run_keys(self._prefix, rid), tombstone_key(self._prefix, rid)]
        ttl = (str(TOMBSTONE_TTL),)
        existed, acked = await self._execute(self._scripts.delete_run, ttl, keys, rid)
        await index_remove_async(self._client, self._retry, self._prefix, rid)
        if rid == self.run_id:
            self._unbind()
        self._check_durable(acked)
        return bool(int(existed))

    @traced("list_runs")
    async def list_runs(self) -> list[uuid.UUID]:
        """The ids of every run stored under this prefix (SCAN of the keyspace), sorted."""
        self._check_fork()
        found: set[uuid.UUID] = set()
        try:
            async for raw in self._client.scan_iter(match=run_pattern(self._prefix), count=1000):
                key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                run_id = run_id_from_key(self._prefix, key)
                if run_id is not None:
                    found.add(run_id)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, prefix=self._prefix) from exc
        return sorted(found)

    # -- writes ----------------------------------------------------------------------------

    @traced("append_event")
    async def append_event(self, event: t.AgentEvent) -> None:
        """Append ``event`` to the run's log and apply contract §5's rules, atomically."""
        await self._append((event,))

    @traced("append_events")
    async def append_events(self, events: Sequence[t.AgentEvent]) -> None:
        """Append ``events`` in order, applying §5's rules to each, as one atomic change
        (one round trip; either every event is stored or none is)."""
        await self._append(events)

    async def _append(self, events: Sequence[t.AgentEvent]) -> None:
        binding = self._need_run("append_events")
        args = self._encoder.events(events, binding.run_id)
        if args == ["0"]:
            return
        await self._write(self._scripts.append_events, args, binding)
        if finishes(events):
            await self._index(binding)

    @traced("upsert_agent_result")
    async def upsert_agent_result(self, cache: t.AgentResultCache) -> None:
        """Insert or replace ``agent_results[cache.agent_id]`` (no tokens, no event)."""
        binding = self._need_run("upsert_agent_result")
        await self._write(self._scripts.upsert_agent_result, self._encoder.result(cache), binding)

    @traced("upsert_agent_session")
    async def upsert_agent_session(self, session: t.AgentSessionCheckpoint) -> None:
        """Insert or replace ``agent_sessions[session.agent_id]``."""
        binding = self._need_run("upsert_agent_session")
        args = self._encoder.session(session)
        await self._write(self._scripts.upsert_agent_session, args, binding)

    @traced("cancel")
    async def cancel(self) -> None:
        """running -> cancelled; a completed or failed run is left as it is (no error)."""
        binding = self._need_run("cancel")
        await self._write(self._scripts.cancel, (), binding)
        await self._index(binding)

    @traced("reset_status_to_running")
    async def reset_status_to_running(self) -> None:
        """failed/cancelled/running -> running; :class:`NotResumableError` on a completed run."""
        binding = self._need_run("reset_status_to_running")
        await self._write(self._scripts.reset_status_to_running, (), binding)
        await self._index(binding)

    @traced("save_checkpoint")
    async def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None:
        """Replace the run's whole state (not its event log) with ``checkpoint``, atomically."""
        binding = self._need_run("save_checkpoint")
        args = self._encoder.save(checkpoint, binding.run_id)
        await self._write(self._scripts.save_checkpoint, args, binding)
        if checkpoint.status is not t.CheckpointStatus.RUNNING:
            await self._index(binding)

    # -- reads -----------------------------------------------------------------------------

    @traced("get_event_log")
    async def get_event_log(self) -> list[t.AgentEvent]:
        """Every event of the run, in append order."""
        return [event async for event in self.iter_event_log()]

    async def iter_event_log(
        self, *, start: str = "-", page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[t.AgentEvent]:
        """The run's events in append order, fetched ``page_size`` entries per XRANGE.

        ``start`` is a stream id to begin at (inclusive), ``"-"`` for the beginning.
        """
        binding = self._need_run("iter_event_log")
        if page_size < 1:
            raise ValidationError("page_size", "must be at least 1")
        run_id, key = binding.run_id, binding.keys.events
        lower = start
        while True:
            try:
                page = await self._client.xrange(key, min=lower, max="+", count=page_size)
            except REDIS_ERRORS as exc:
                raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc
            for raw_id, fields in page:
                yield decode_entry(run_id, key, entry_id(raw_id), fields)
            if len(page) < page_size:
                return
            lower = page_after(page)

    async def iter_events(
        self,
        from_id: str | None = None,
        *,
        follow: bool = True,
        timeout: float | None = None,
        block_ms: int = 1000,
        count: int = 100,
    ) -> AsyncIterator[LogEntry]:
        """Yield the run's events as :class:`LogEntry` ``(id, event)``, following new ones.

        Starts after stream id ``from_id`` (``None``: from the first event; ``"$"``: only events
        appended from now on). With ``follow=True`` it waits for new events with
        ``XREAD BLOCK`` and stops once ``timeout`` seconds pass without one (``None``: never);
        with ``follow=False`` it stops at the end of the log.
        """
        binding = self._need_run("iter_events")
        run_id, key = binding.run_id, binding.keys.events
        last = "0-0" if from_id is None else from_id
        loop = asyncio.get_running_loop()
        try:
            if last == "$":
                newest = await self._client.xrevrange(key, count=1)
                last = entry_id(newest[0][0]) if newest else "0-0"
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc
        idle_since = loop.time()
        while True:
            block = block_ms if follow else None
            if follow and timeout is not None:
                left = timeout - (loop.time() - idle_since)
                if left <= 0:
                    return
                block = max(1, min(block_ms, int(left * 1000)))
            try:
                reply = await self._client.xread({key: last}, count=count, block=block)
            except REDIS_ERRORS as exc:
                raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc
            entries = xread_entries(reply)
            for raw_id, fields in entries:
                last = entry_id(raw_id)
                yield LogEntry(last, decode_entry(run_id, key, last, fields))
            if entries:
                idle_since = loop.time()
            elif not follow:
                return
