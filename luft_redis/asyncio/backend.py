"""``AsyncRedisCheckpointBackend``: luft's ``CheckpointBackend`` contract on Redis.

A thin front end: arguments are built by :mod:`luft_redis.wire`, every change is one Lua script
whose reply is a :class:`~luft_redis.delta.Delta`, and the in-process
:class:`~luft_redis.cache.RunCache` applies deltas (its own writes' and, through the change
listener, every other process's). This module only does the I/O around them.

This is the hand-written asyncio source; the sync :mod:`luft_redis._sync.backend`
(:class:`luft_redis.RedisCheckpointBackend`) is generated from it by ``.ci/unasync.py``, and
:mod:`luft_redis.runtime` names every difference that is more than a rename.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from .. import types as t
from ..cache import Offer, RunCache, RunState
from ..connect import Durability, check_async_client, make_async_client
from ..delta import Delta, UnknownFormat, parse_delta
from ..errors import (
    BackendError,
    CorruptDataError,
    ForkedError,
    LeaseLostError,
    LimiterNotFoundError,
    LuftRedisError,
    RunNotBoundError,
    RunNotFoundError,
    ValidationError,
)
from ..forks import fork_generation, fork_lock
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
from ..history import HistoryPoint, Version
from ..index import finishes, score_of
from ..keys import (
    DEFAULT_POOL,
    DEFAULT_PREFIX,
    TOMBSTONE_TTL,
    PoolKeys,
    limiter_key,
    limiter_take_memo,
    pool_keys,
    pool_name_from_key,
    run_id_from_key,
    run_keys,
    run_pattern,
    tombstone_key,
)
from ..limits import (
    DEFAULT_BURST,
    LIMITED_TRIES,
    MAX_TOKENS,
    MISSING_LIMITER_WAIT,
    limit_args,
)
from ..links import DEFAULT_MAX_STALENESS
from ..pools import (
    LEAVE_ARGS,
    MEMBERSHIP_FIELDS,
    SWEEP_INTERVAL,
    SWEEP_SIZE,
    Membership,
    Picked,
    PoolWatch,
    add_args,
    check_max_leases,
    correction,
    lease_member,
    leave_args,
    membership_of,
    membership_of_join,
    membership_of_run,
    parse_pick,
    pick_args,
)
from ..retry import DEFAULT_RETRY, RetryPolicy
from ..runtime import (
    AsyncLock,
    AsyncSignal,
    AsyncStateLock,
    async_adopts_fork,
    async_cluster_ready,
    async_run_callback,
    async_sleep,
    async_within,
)
from ..scripts import Function, translate_error
from ..tasks import (
    DEFAULT_MAX_ATTEMPTS,
    RELEASE_FLOOR,
    RENEW_FLOOR,
    AgentTask,
    Claim,
    TaskInfo,
    attempts_arg,
    fence_arg,
    lease_ms,
    parse_claim,
    parse_tasks,
    submit_args,
)
from ..tracing import traced
from ..watch import Watch
from ..wire import (
    DEFAULT_MAX_PAYLOAD_SIZE,
    LogEntry,
    Sent,
    check_uuid,
    decode_entry,
    entry_id,
    page_after,
    xread_entries,
)
from .fcall import (
    AsyncWriteLane,
    call_durably,
    call_function,
    index_add,
    index_remove,
    raise_lost_redirect,
)
from .history import read_history, state_at
from .lease import AsyncAgentLease
from .listener import AsyncChangeListener, AsyncRefresher, weak_work
from .restore import import_checkpoint

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "AgentTask",
    "AsyncAgentLease",
    "AsyncCheckpointBackend",
    "AsyncRedisCheckpointBackend",
    "ChangeCallback",
    "Durability",
    "LogEntry",
]

logger = logging.getLogger(__name__)

ChangeCallback = Callable[[t.RunCheckpoint], object]
"""A change callback: a function (for asyncio also a coroutine function, run as a task)."""


@runtime_checkable
class AsyncCheckpointBackend(Protocol):
    """The 12 operations of luft's ``CheckpointBackend`` trait (``luft_core/state.rs``)."""

    async def init_run(self, run_id: uuid.UUID, task: str, run_dir: str) -> None: ...

    async def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any
    ) -> None: ...

    async def open_run(self, run_id: uuid.UUID) -> t.RunCheckpoint | None: ...

    async def append_event(self, event: t.AgentEvent) -> None: ...

    async def upsert_agent_result(self, cache: t.AgentResultCache) -> None: ...

    async def upsert_agent_session(self, session: t.AgentSessionCheckpoint) -> None: ...

    async def get_event_log(self) -> list[t.AgentEvent]: ...

    def can_resume(self) -> bool: ...

    async def reset_status_to_running(self) -> None: ...

    async def cancel(self) -> None: ...

    async def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None: ...


class AsyncRedisCheckpointBackend(FrontEnd):
    """luft's checkpoint backend on Redis (asyncio front end).

    ``client`` is a ``redis.asyncio.Redis``, ``redis.asyncio.cluster.RedisCluster`` or
    ``fakeredis.FakeAsyncRedis`` client created with ``decode_responses=False`` (the default);
    many backends may share one client. A client of the other kind is refused
    (:class:`~luft_redis.errors.ClientTypeError`). ``prefix`` namespaces the keys
    (``<prefix>:{<run-id>}:...``, see ``docs/redis-layout.md``).

    ``watch=True`` (the default) keeps the cache coherent with every other process writing to
    the run (see :attr:`cache_is_fresh`); ``max_staleness`` (seconds, default 1) bounds how old
    a change may be that a cache reporting fresh has not applied. With ``watch=False`` the cache
    sees this backend's writes (and catches up on each of them) and never reports fresh.

    ``retry`` is the :class:`~luft_redis.retry.RetryPolicy` for transient Redis failures
    (``None``: one attempt). Writes apply exactly once, however often they are retried.

    ``max_payload_size`` bounds the stored form of one event, one result's output or findings,
    and ``workflow_meta`` (default 4 MiB); a larger value raises
    :class:`~luft_redis.errors.PayloadTooLargeError` and nothing is stored.

    ``durability=Durability(replicas=1, timeout_ms=1000)`` makes every write wait (``WAIT``, in
    the same round trip) until that many replicas have it, and raise
    :class:`~luft_redis.errors.NotDurableError` when fewer did in time (the write itself is
    applied on the primary; the error says it could be lost if the primary fails now).

    ``expire_finished_after=timedelta(...)``: a run this backend finishes (completed, failed,
    cancelled) expires that long after, every key at once; resuming it removes the TTL.
    ``max_events=N``: this backend's appends trim the run's event log to about ``N`` entries
    (see :attr:`log_trimmed`). Both are off by default; see :mod:`luft_redis.retention`.

    ``max_attempts`` (default 3): after that many failed attempts of an agent task claimed
    through this backend (lapsed leases, non-ok ``agent_done``, exceptions leaving
    ``with lease``) the task is dead until the run is resumed (docs/leases.md).

    Operations that talk to Redis are coroutines; :meth:`get_checkpoint`, :meth:`get_findings`
    and :meth:`can_resume` are answered from the cache. The change listener and the refresher
    are tasks on the running loop, one of each per client and loop. Release the backend with
    ``async with`` or :meth:`aclose`.

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
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        check_async_client(client)
        self._configure(client, prefix=prefix, watch=watch, retry=retry, durability=durability,
                        max_payload_size=max_payload_size, max_staleness=max_staleness)  # fmt: skip
        self._configure_retention(expire_finished_after, max_events)
        self._max_attempts = attempts_arg(max_attempts)
        self._lane = None if self._cluster else AsyncWriteLane.for_client(client)
        self._callbacks: dict[int, ChangeCallback] = {}
        self._next_callback = 0
        self._waiting = 0
        self._fork = fork_generation()
        self._new_identity()

    def _new_identity(self) -> None:
        """A writer identity and locks of this process (also after a fork)."""
        self._writer_id = uuid.uuid4().hex
        self._op_seq = 0
        self._pick_seq = 0
        self._picked: dict[str, Picked] = {}  # per pool name: picks not tried yet (not a fork's)
        self._io_lock = AsyncLock()  # one write at a time: operation numbers in order
        self._bind_lock = AsyncLock()  # one init_run/open_run at a time
        self._take_lock = AsyncLock()  # one limiter take at a time (its memo holds the last)
        self._state_lock = AsyncStateLock()  # callbacks and waiters
        self._changed = AsyncSignal()  # wakes waiters: a change, a rebind

    def _check_fork(self) -> None:
        """In a forked child: new identity and connections; the cache reloads before fresh.

        ``self._fork`` changes last, so no thread of the child sees the parent's identity,
        listener or cache vouched for meanwhile (``cache_is_fresh`` compares it first)."""
        if self._fork == fork_generation():
            return
        if not async_adopts_fork():
            raise ForkedError(
                f"this {type(self).__name__} was made before os.fork(): asyncio clients, tasks "
                "and locks do not survive a fork; create the backend after the fork"
            )
        with fork_lock():
            generation = fork_generation()
            if self._fork == generation:
                return
            binding = self._binding
            if binding is not None:
                binding.cache.reset_locks()  # stale until reloaded in this process
            self._new_identity()
            if binding is not None:
                self._start_watch(binding)
            self._fork = generation

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
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        **client_kwargs: Any,
    ) -> AsyncRedisCheckpointBackend:
        """A backend with its own client for ``url``, closed by :meth:`aclose`.

        ``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs make a ``Redis`` client
        (``cluster=True``: a ``RedisCluster``); ``redis+sentinel://[:password@]host:port[,host:
        port...]/<service>[/<db>]`` asks those Sentinels for the primary of ``<service>`` and
        follows failovers. ``client_kwargs`` go to the client.
        """
        client = make_async_client(url, cluster=cluster, **client_kwargs)
        backend = cls(client, prefix=prefix, watch=watch, retry=retry, durability=durability,
                      max_payload_size=max_payload_size, max_staleness=max_staleness,
                      expire_finished_after=expire_finished_after,
                      max_events=max_events, max_attempts=max_attempts)  # fmt: skip
        backend._owns_client = True
        return backend

    # -- plumbing --------------------------------------------------------------------------

    @property
    def cache_is_fresh(self) -> bool:
        """True only when the cache can vouch for itself: no change committed more than
        ``max_staleness`` seconds ago is missing from it.

        That needs ``watch=True``, a bound run, the run's channel subscribed on the node that
        owns its slot now, a health-check PING on that connection answered within
        ``max_staleness``, and every version seen so far applied (queued changes count). While
        it is False, reads still answer from the cache; :meth:`sync` reloads.
        """
        if self._fork != fork_generation() and async_adopts_fork():
            self._check_fork()
        return self._fork == fork_generation() and self._fresh(self._binding)

    async def aclose(self) -> None:
        """Unbind the run and stop watching it (at once: when nothing else watches through
        the client, its subscriber connections are closed before this returns); close the
        client if :meth:`from_url` made it."""
        self._unbind()
        forked = self._fork != fork_generation()
        if self._lane is not None:
            await self._lane.aclose()
        if not forked:  # else the connections are the parent's: leave them alone
            listener = AsyncChangeListener.existing(self._client)
            if listener is not None:
                await listener.release(force=self._owns_client)
        if self._owns_client and (not forked or async_adopts_fork()):
            await self._client.aclose()

    async def __aenter__(self) -> AsyncRedisCheckpointBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- binding ---------------------------------------------------------------------------

    def _start_watch(self, binding: Binding, *, always: bool = False) -> None:
        if not self._watching and not always:
            return
        listener = AsyncChangeListener.for_client(self._client)
        watch = Watch(binding.cache, binding.channel, self._on_work, self._counters)
        binding.listener, binding.watch = listener, watch
        self._want_changes(binding)
        AsyncRefresher.for_client(self._client).hold(watch)  # started here, at our priority
        listener.watch(watch, self._max_staleness)

    def _stop_watch(self, binding: Binding) -> None:
        watch = binding.watch
        if watch is not None and binding.listener is not None:
            binding.listener.unwatch(watch)
            AsyncRefresher.for_client(self._client).release(watch)

    async def _prepare(self, run_id: uuid.UUID) -> Binding:
        """A new binding for ``run_id``, watched and (briefly) waited for."""
        keys = run_keys(self._prefix, run_id)
        binding = Binding(run_id, keys, RunCache(run_id, keys))
        if self._watching and self._cluster:
            try:  # the slot map, so that the listener subscribes on the right node at once
                await async_cluster_ready(self._client)
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
        self._changed.notify()  # waiters on the old run look again
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
        """From the listener: a change, a reload or callbacks are due (never blocks)."""
        self._changed.notify()
        binding = self._binding
        if binding is None or binding.watch is not watch:
            return
        if not watch.cache.synced or self._callbacks:
            AsyncRefresher.for_client(self._client).schedule(id(self), weak_work(self, "_refresh"))

    async def _refresh(self) -> None:
        """On the refresher: reload when stale, then run the change callbacks."""
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
                await async_sleep(REFRESH_RETRY_DELAY)
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
        if state is not None:
            binding.pool = membership_of_run(reply[0], binding.keys.run)
        cache.install(state, generation)
        self._changed.notify()
        if state is None:
            logger.info("run %s no longer exists; the cache keeps its last state",
                        binding.run_id)  # fmt: skip
        return state

    # -- I/O -------------------------------------------------------------------------------

    async def _fcall(self, fn: Function, keys: list[str], args: Sequence[Any]) -> Any:
        """One attempt of ``fn`` (see :func:`luft_redis._sync.fcall.call_function`)."""
        return await call_function(self._client, fn, keys, args, cluster=self._cluster)

    async def _call(self, fn: Function, args: Sequence[Any], keys: list[str],
                    run_id: object) -> Any:  # fmt: skip
        """``fn`` under the retry policy."""
        return await self._retried(lambda: self._fcall(fn, keys, args), run_id)

    async def _retried(self, attempt: Callable[[], Any], run_id: object,
                       policy: RetryPolicy | None = None) -> Any:
        """``attempt()`` under the retry policy (``policy``, else the backend's), counted in
        :meth:`stats`; redis-py's errors translated."""
        counters = self._counters
        attempts = 0

        def counted() -> Any:
            nonlocal attempts
            attempts += 1
            return attempt()

        started = time.perf_counter()
        try:
            return await (policy or self._retry).acall(counted)
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
                lane = self._lane
                if lane is None:
                    reply = await self._call(fn, full, keys, run_id)
                else:  # the lean path (its connection is this write lock's)
                    reply = await self._retried(lambda: lane.call(fn, keys, full), run_id)
                self._counters.writes += 1
                return reply, None
            wait = ("WAIT", durability.replicas, durability.timeout_ms)

            async def attempt() -> tuple[Any, int]:
                result, count = await call_durably(self._client, fn, keys, full, wait,
                                                   cluster=self._cluster)  # fmt: skip
                for reply in (result, count):
                    if isinstance(reply, Exception):
                        raise reply
                return result, int(count)

            replied: tuple[Any, int] = await self._retried(attempt, run_id)
            self._counters.writes += 1
            return replied

    async def _write(self, fn: Function, args: Sequence[Any], binding: Binding,
                     lease: AsyncAgentLease | None = None, *, fence: str = "",
                     options: bool = True, sent: Sent | None = None) -> Delta:  # fmt: skip
        """Run a writing script exactly once and apply its delta to ``binding``'s cache;
        NotDurableError (after it was applied) when too few replicas acknowledged it. With
        ``options``, ``fence`` and the retention options go in the script's two option slots
        (``lua/includes/options.lua``). ``sent``: what the arguments hold (the encoder's)."""
        if options:
            args = self._with_options(args, fence)
        return (await self._write_reply(fn, args, binding, lease, sent))[1]

    async def _write_reply(self, fn: Function, args: Sequence[Any], binding: Binding,
                           lease: AsyncAgentLease | None = None,
                           sent: Sent | None = None) -> tuple[Any, Delta]:  # fmt: skip
        """:meth:`_write` for a script whose reply may be an array led by the delta: the
        reply as it came, and the delta applied."""
        try:
            reply, acked = await self._execute(fn, args, binding.key_list, binding.run_id)
        except RunNotFoundError:
            binding.cache.install(None, binding.cache.generation)  # the server says: gone
            raise
        except LeaseLostError:
            if lease is not None:
                lease.lost = True
            raise
        delta = await self._absorb(binding, reply[0] if isinstance(reply, list) else reply, sent)
        if delta.replay:
            self._counters.replays += 1
        self._emit()
        self._check_durable(acked)
        return reply, delta

    async def _absorb(self, binding: Binding, reply: Any, sent: Sent | None = None) -> Delta:
        """Apply a write's delta: at once when it continues the cache; after the notices of
        the versions in between when they are on their way; else by a reload."""
        cache = binding.cache
        try:
            delta = parse_delta(bytes(reply))
        except (UnknownFormat, ValueError, TypeError) as exc:
            raise BackendError(f"unexpected reply from a luft-redis script: {exc}") from exc
        delta.sent = sent
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
        return delta  # (the caller's _emit() wakes the waiters)

    async def _wait(self, binding: Binding, predicate: Callable[[], bool],
                    timeout: float | None) -> bool:  # fmt: skip
        """Wait until ``predicate()`` holds, woken by every change the cache receives."""
        with self._state_lock:
            self._waiting += 1
            self._want_changes(binding)
        try:
            return await self._changed.wait_for(predicate, timeout)
        finally:
            with self._state_lock:
                self._waiting -= 1
                self._want_changes(binding)

    def _emit(self) -> None:
        """Wake waiters and run the change callbacks once per new version."""
        self._changed.notify()
        binding = self._binding
        if binding is None or not self._callbacks:
            return
        with self._state_lock:
            if self._binding is not binding:
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
                    async_run_callback(callback, snapshot)
                except Exception:
                    logger.exception("change callback %r failed", callback)

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

        Callbacks run on the client's refresher (other processes' changes) or in the writing
        thread or coroutine (this backend's): keep them short and do not block in them. For
        asyncio, a coroutine function's coroutine runs as a task.
        """
        self._check_fork()
        with self._state_lock:
            key = self._next_callback
            self._next_callback += 1
            self._callbacks[key] = callback
            binding = self._binding
            if binding is not None:
                self._want_changes(binding)
                self._emitted = binding.cache.tip

        def unsubscribe() -> None:
            with self._state_lock:
                self._callbacks.pop(key, None)
                current = self._binding
                if current is not None:
                    self._want_changes(current)

        return unsubscribe

    # -- run lifecycle ---------------------------------------------------------------------

    @traced("init_run", run_arg=True)
    async def init_run(self, run_id: uuid.UUID, task: str, run_dir: str, *,
                       pool: str | None = None) -> None:  # fmt: skip
        """Create a new run and bind to it. :class:`RunExistsError` if it exists (then nothing
        changed, and this backend stays bound as it was). ``pool=``: the run joins that pool
        (:meth:`join_pool` with its defaults) right after."""
        await self._init(run_id, task, run_dir, None, with_meta=False)
        if pool is not None:
            await self.join_pool(pool)

    @traced("init_run_with_meta", run_arg=True)
    async def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any, *,
        pool: str | None = None,
    ) -> None:  # fmt: skip
        """``init_run`` with ``workflow_meta`` (any JSON) stored, in one atomic step."""
        await self._init(run_id, task, run_dir, workflow_meta, with_meta=True)
        if pool is not None:
            await self.join_pool(pool)

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
                if delta.replay:  # a retry after a lost reply: the run is the first attempt's,
                    self._counters.replays += 1  # and the replay carries no state: load it
                    await self._reload(binding)
                else:
                    binding.cache.install(RunState.from_whole(rid, binding.keys, delta),
                                          generation)  # fmt: skip
            except BaseException:
                self._stop_watch(binding)
                raise
            self._adopt(binding)
            await self._index(binding)
        self._check_durable(acked)

    async def _index(self, binding: Binding) -> None:
        """ZADD the run to the run index (luft_redis.index), after a lifecycle change."""
        await index_add(self._client, self._retry, self._prefix, binding.run_id,
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

        Every key of the run goes in one atomic step. Backends watching it are told: their
        caches stop being fresh, and their writes raise :class:`RunNotFoundError` (a run is
        never brought back by a late write; ``init_run`` makes a new one). This backend is
        unbound if it was bound to that run.
        """
        self._check_fork()
        rid = self._run_arg(run_id, "delete_run")
        keys = [*run_keys(self._prefix, rid), tombstone_key(self._prefix, rid)]
        ttl = (str(TOMBSTONE_TTL),)
        existed, acked = await self._execute(self._scripts.delete_run, ttl, keys, rid)
        await index_remove(self._client, self._retry, self._prefix, rid)
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
    async def append_event(self, event: t.AgentEvent, *,
                           lease: AsyncAgentLease | None = None) -> None:  # fmt: skip
        """Append ``event`` to the run's log and apply contract §5's rules, atomically.

        With ``lease=``, the write is fenced: applied only while the lease is the task's
        current one, else :class:`~luft_redis.errors.LeaseLostError` and nothing is written
        (see :meth:`claim_agent`)."""
        await self._append((event,), lease)

    @traced("append_events")
    async def append_events(self, events: Sequence[t.AgentEvent], *,
                            lease: AsyncAgentLease | None = None) -> None:  # fmt: skip
        """Append ``events`` in order, applying §5's rules to each, as one atomic change.

        One round trip for the whole batch; either every event is stored or none is. With
        ``lease=`` the batch is fenced, and an event of another agent refuses it whole
        (:class:`~luft_redis.errors.ValidationError`).
        """
        await self._append(events, lease)

    async def _append(self, events: Sequence[t.AgentEvent],
                      lease: AsyncAgentLease | None) -> None:  # fmt: skip
        binding = self._need_run("append_events")
        sent: Sent = {}
        args = self._encoder.events(events, binding.run_id, sent)
        if args == ["0"]:
            return
        fence = "" if lease is None else self._fence(
            lease, binding, "events", [getattr(event, "agent_id", None) for event in events])
        delta = await self._write(self._scripts.append_events, args, binding, lease,
                                  fence=fence, sent=sent)  # fmt: skip
        if lease is not None and any(
                isinstance(e, t.AgentDone) and e.agent_id == lease.agent_id for e in events):
            lease.finished = True  # the script ended the lease (done, or ready again)
            if lease.pool_capped:
                await self._pool_lease(lease, end=True)
            await self._pool_wake(binding, delta)  # a task ready again, or a lease slot free
            if lease.limiter is not None:  # what the claim reserved, settled
                done = [e for e in events if isinstance(e, t.AgentDone)
                        and e.agent_id == lease.agent_id]  # fmt: skip
                used = max(done[-1].tokens.total(), lease.reported)
                await self._report_tokens(lease, min(used, MAX_TOKENS), True)
        if finishes(events):
            await self._index(binding)

    @traced("upsert_agent_result")
    async def upsert_agent_result(self, cache: t.AgentResultCache, *,
                                  lease: AsyncAgentLease | None = None) -> None:  # fmt: skip
        """Insert or replace ``agent_results[cache.agent_id]`` (no tokens, no event); fenced
        with ``lease=`` (see :meth:`append_event`)."""
        binding = self._need_run("upsert_agent_result")
        sent: Sent = {}
        args = self._encoder.result(cache, sent)
        fence = "" if lease is None else self._fence(lease, binding, "cache", [cache.agent_id])
        await self._write(self._scripts.upsert_agent_result, args, binding, lease, fence=fence,
                          sent=sent)  # fmt: skip

    @traced("upsert_agent_session")
    async def upsert_agent_session(self, session: t.AgentSessionCheckpoint, *,
                                   lease: AsyncAgentLease | None = None) -> None:  # fmt: skip
        """Insert or replace ``agent_sessions[session.agent_id]``; fenced with ``lease=``."""
        binding = self._need_run("upsert_agent_session")
        sent: Sent = {}
        args = self._encoder.session(session, sent)
        fence = "" if lease is None else self._fence(
            lease, binding, "session", [session.agent_id])
        await self._write(self._scripts.upsert_agent_session, args, binding, lease, fence=fence,
                          sent=sent)  # fmt: skip

    def _fence(self, lease: AsyncAgentLease, binding: Binding, field: str,
               agents: Sequence[uuid.UUID | None]) -> str:  # fmt: skip
        """The fence argument of a write with ``lease`` (ValidationError for a lease of another
        run or backend, or data of another agent; LeaseLostError in a forked child)."""
        if not isinstance(lease, AsyncAgentLease):
            raise ValidationError("lease", f"expected an agent lease, got {type(lease).__name__}")
        if lease.run_id != binding.run_id:
            raise ValidationError("lease", f"the lease is of run {lease.run_id}, "
                                           f"not of the bound run {binding.run_id}")  # fmt: skip
        for agent in agents:
            if agent is not None and agent != lease.agent_id:
                raise ValidationError(field, f"holds data of agent {agent}; the lease is of "
                                             f"agent {lease.agent_id}")  # fmt: skip
        if lease.forked:
            raise LeaseLostError(str(lease.agent_id), str(lease.token), None)
        return fence_arg(lease.agent_id, lease.token, lease.incarnation)

    # -- agent tasks and leases (docs/leases.md) -------------------------------------------

    @traced("submit_agents")
    async def submit_agents(self, tasks: Iterable[AgentTask], *, max_attempts: int | None = None,
                            pool: str | None = None, limiter: str | None = None,
                            expected_tokens: int = 0) -> None:  # fmt: skip
        """Add agent tasks for workers to claim, atomically for the batch. Submitting an agent
        again as it was changes nothing; with another phase, payload, limiter or expected
        tokens it is a :class:`~luft_redis.errors.ValidationError` (nothing changed). On a run that
        is not running: :class:`~luft_redis.errors.RunNotRunningError`. Each new task keeps
        ``max_attempts`` (default: this backend's): whoever claims it, it is dead after that
        many failed attempts.

        ``pool=``: the run joins that pool first, with :meth:`join_pool`'s defaults, unless
        it is in it already (then its weight, priority and limits stay as they are). A run in
        a pool is woken there after the submit, so a claim from the pool finds the new
        tasks.

        ``limiter=`` and ``expected_tokens=``: the rate limiter and expected tokens of the
        tasks that name none (:class:`~luft_redis.tasks.AgentTask`). Every limiter named must
        have been set (:meth:`set_rate_limit`), else
        :class:`~luft_redis.errors.LimiterNotFoundError` and nothing is submitted."""
        binding = self._need_run("submit_agents")
        attempts = self._max_attempts if max_attempts is None else max_attempts
        args = submit_args(tasks, self._encoder.max_payload_size, attempts, limiter,
                           expected_tokens)  # fmt: skip
        for name in {args[i] for i in range(5, len(args), 5) if args[i]}:
            await self._need_limiter(name)
        if pool is not None and (binding.pool is None or binding.pool.pool != pool):
            await self._join(binding, Membership(pool), keep=True)
        if args[1] == "0":
            return
        delta = await self._write(self._scripts.submit_agents, args, binding)
        await self._pool_wake(binding, delta)

    @traced("claim_agent")
    async def claim_agent(self, worker: str, *, lease_for: float = 30.0, timeout: float = 0.0,
                          pool: str | None = None) -> AsyncAgentLease | None:  # fmt: skip
        """Claim one agent task with a lease of ``lease_for`` seconds (server clock): the
        oldest ready task, else the one whose lease lapsed longest ago (a lapse is a failed
        attempt). None when nothing is claimable within ``timeout`` seconds, or when the run
        is not running. A blocked claim wakes on the run's change notices (a submit, a
        release, a failed finish) and when the earliest lease lapses, never by polling.

        A claim retried after a lost reply returns the same lease. ``worker`` names the holder
        (``host:pid`` is a good name); it is shown by :meth:`agent_tasks`.

        ``pool=``: claim from any running run of that pool instead (docs/pools.md): its runs
        share the workers by weight, higher priority first; this backend binds to the run of
        the lease (without loading it: :meth:`sync` or :meth:`open_run` does). A blocked claim
        wakes when a run of the pool gets claimable work. Hold one lease at a time per backend
        when claiming from a pool.
        """
        if not isinstance(worker, str) or not worker or any(c.isspace() for c in worker):
            raise ValidationError("worker", "must be a non-empty name without white space")
        duration = lease_ms(lease_for)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValidationError("timeout", "must be a number of seconds >= 0")
        deadline = time.monotonic() + timeout
        if pool is not None:
            self._check_fork()
            picked = self._picked.get(pool)
            if picked is None:  # (the pool's name is checked once, by pool_keys)
                picked = self._picked[pool] = Picked(pool_keys(self._prefix, pool), pool)
            return await self._claim_from_pool(picked, worker, duration, deadline)
        binding = self._need_run("claim_agent")
        following = False
        try:
            while True:
                claim, delta, sent = await self._claim_limited(binding, worker, duration, "")
                if claim.agent_id is not None:
                    return AsyncAgentLease(self, claim, worker, duration, sent)
                left = deadline - time.monotonic()
                if claim.not_running is not None or left <= 0:
                    return None
                if not self._watching and not following:
                    # watch=False: follow the run's notices while this claim waits (a submit
                    # wakes it), subscribed before it looks again (no wake-up lost between)
                    following = True
                    await self._follow(binding)
                    continue
                wait = left if claim.wait_ms is None else min(left, claim.wait_ms / 1000 + 0.002)
                await self.wait_for_change(delta.v_after, timeout=wait)
        finally:
            if following:
                self._unfollow(binding)

    async def _claim_limited(self, binding: Binding, worker: str, duration: int,
                             pool: str) -> tuple[Claim, Delta, float]:  # fmt: skip
        """One claim in ``binding``'s run (claim_agent-12.lua) and when it was sent. When the
        task it meets names a rate limiter, take from the limiter first, then claim with it;
        out of budget, a claim without a lease whose ``wait_ms`` is the limiter's. A take
        that no lease of its limiter follows is given back. A limiter that does not exist
        raises LimiterNotFoundError for a bound claim; for a claim from a pool it is logged
        and the run waits MISSING_LIMITER_WAIT in the pool, so one run cannot stop a fleet."""
        held: Claim | None = None  # the limiter taken from, and what was taken
        for tries in range(LIMITED_TRIES):
            sent = time.monotonic()
            args = (worker, str(duration), str(self._max_attempts), pool,
                    held.limiter or "" if held is not None else "")  # fmt: skip
            try:
                reply, delta = await self._write_reply(self._scripts.claim_agent, args, binding)
            except BaseException:
                if held is not None and held.limiter is not None:  # not used: given back
                    await self._settle(held.limiter, -1, -held.expected_tokens)
                raise
            _, claim = parse_claim(reply, binding.keys.tasks)
            if held is not None and held.limiter is not None:
                if claim.agent_id is None or claim.limiter != held.limiter:
                    await self._settle(held.limiter, -1, -held.expected_tokens)  # not used
                elif claim.expected_tokens != held.expected_tokens:
                    # another task of that limiter (the first went to another worker): what
                    # was taken becomes this task's reservation
                    await self._settle(held.limiter, 0,
                                       claim.expected_tokens - held.expected_tokens)  # fmt: skip
            held = None
            if claim.agent_id is not None or claim.limiter is None:
                return claim, delta, sent
            if tries == LIMITED_TRIES - 1:
                break
            try:
                wait = await self._limit_take(claim.limiter, "admit", 1, claim.expected_tokens)
            except LimiterNotFoundError as exc:
                if not pool:
                    raise
                logger.error("run %s in pool %s: its next task names a rate limiter that does "
                             "not exist (%s); the pool serves its other runs, and tries it "
                             "again in %g s", binding.run_id, pool, exc.key,
                             MISSING_LIMITER_WAIT)  # fmt: skip
                wait = round(MISSING_LIMITER_WAIT * 1000)
            if wait:
                return Claim(None, wait_ms=wait, limiter=claim.limiter), delta, sent
            held = claim
        return Claim(None, wait_ms=0), delta, sent  # (tasks of other limiters came first)

    async def _follow(self, binding: Binding) -> None:
        """Watch ``binding``'s run for a waiting claim of a ``watch=False`` backend."""
        binding.followers += 1
        if binding.followers == 1:
            if self._cluster:
                try:  # the slot map, so that the listener subscribes on the right node
                    await async_cluster_ready(self._client)
                except REDIS_ERRORS as exc:
                    raise translate_error(exc, run_id=binding.run_id,
                                          prefix=self._prefix) from exc  # fmt: skip
            self._start_watch(binding, always=True)
        assert binding.listener is not None
        await binding.listener.wait_subscribed(binding.channel, SUBSCRIBE_TIMEOUT)

    def _unfollow(self, binding: Binding) -> None:
        binding.followers -= 1
        if binding.followers == 0:
            self._stop_watch(binding)
            binding.watch = binding.listener = None

    # -- pools (docs/pools.md) -------------------------------------------------------------

    @traced("join_pool")
    async def join_pool(self, pool: str = DEFAULT_POOL, *, weight: int = 1, priority: int = 0,
                        max_leases: int | None = None,
                        max_tokens: int | None = None) -> None:  # fmt: skip
        """The bound run joins ``pool`` (or changes its place in it): a claim from the pool
        may hand out its agents. ``weight`` (1-1000) is its share of the pool's workers
        against the other runs'; ``priority`` (0-9): the agents of runs of a higher priority
        go first. ``max_leases``: at most that many of its agents leased at once;
        ``max_tokens``: once the run's ``total_tokens`` reaches it, no agent of it is handed
        out (bound claims included) until it is raised. A run is in one pool at a time;
        joining another leaves the first. Kept in the run hash (plain-text fields)."""
        binding = self._need_run("join_pool")
        await self._join(binding, Membership(pool, weight, priority, max_leases, max_tokens))

    async def _join(self, binding: Binding, member: Membership, *, keep: bool = False) -> None:
        """join_pool-12.lua, then the old pool's index and the new one's (``keep``: a run in
        that pool already keeps its weight, priority and limits)."""
        reply, delta = await self._write_reply(self._scripts.join_pool, member.join_args(keep),
                                               binding)  # fmt: skip
        binding.pool = membership_of_join(reply, binding.keys.run)
        await self._leave_previous(binding, reply, member.pool)
        await self._pool_wake(binding, delta)

    def pool_membership(self) -> Membership | None:
        """The bound run's pool, weight, priority and limits as last loaded or written here
        (None: in no pool, or no run bound). With ``total_tokens`` from the checkpoint,
        :meth:`~luft_redis.pools.Membership.over_budget` says whether it is held back."""
        binding = self._binding
        return None if binding is None else binding.pool

    @traced("leave_pool")
    async def leave_pool(self) -> None:
        """The bound run leaves its pool (nothing happens when it is in none)."""
        binding = self._need_run("leave_pool")
        reply, _ = await self._write_reply(self._scripts.join_pool, LEAVE_ARGS, binding)
        binding.pool = None
        await self._leave_previous(binding, reply, None)

    async def _leave_previous(self, binding: Binding, reply: Any, now: str | None) -> None:
        """Take the run out of the index of the pool it was in before (join_pool's reply)."""
        before = reply[1].decode() if isinstance(reply, list) and reply[1] else None
        if before is not None and before != now:
            keys = pool_keys(self._prefix, before)
            await self._pool_call(self._scripts.pool_add, keys,
                                  leave_args(keys.wake, binding.run_id))  # fmt: skip

    async def _pool_call(self, fn: Function, keys: PoolKeys | str, args: Sequence[str],
                         *more: str) -> Any:  # fmt: skip
        """One pool script (on the pool's keys, or one key, and ``more``), retried by the
        backend's policy."""
        key_list = [keys, *more] if isinstance(keys, str) else [*keys, *more]
        return await self._retried(
            lambda: call_function(self._client, fn, key_list, args, cluster=self._cluster), None)

    async def _pool_wake(self, binding: Binding, delta: Delta) -> None:
        """After a write that may give ``binding``'s run claimable work: wake it in its pool.
        A failure is logged, not raised (the write is applied; a claim's sweep finds it)."""
        member = binding.pool
        if member is None:
            return
        keys = pool_keys(self._prefix, member.pool)
        tag = f"{delta.inc_after or '-'} {delta.v_after}"
        try:
            await self._pool_call(self._scripts.pool_add, keys,
                                  add_args(keys.wake, binding.run_id, member, tag))  # fmt: skip
        except LuftRedisError as exc:
            logger.warning("run %s: waking it in pool %s failed (%s); a claim's sweep will "
                           "find it", binding.run_id, member.pool, exc)  # fmt: skip

    async def _claim_from_pool(self, picked: Picked, worker: str, duration: int,
                               deadline: float) -> AsyncAgentLease | None:  # fmt: skip
        """Try the runs picked for this backend, pick more when none is left; correct the
        pool's index with what the tries found (in the next pick)."""
        keys = picked.keys
        watch: PoolWatch | None = None
        swept = time.monotonic()
        try:
            while True:
                candidate = picked.next(time.monotonic())
                if candidate is not None:
                    run_id, weight, priority = candidate
                    lease, fix = await self._claim_in(run_id, picked, weight, priority,
                                                      worker, duration)  # fmt: skip
                    if lease is not None:
                        if picked.capped:  # the pool counts it against its max_leases
                            lease.pool_capped = True
                            await self._pool_lease(lease, keys.pick_memo(self._writer_id))
                        return lease
                    picked.found(fix)
                    continue
                wakes = watch.wakes if watch is not None else 0
                self._pick_seq += 1  # one number for every retry of this pick
                reply = await self._pool_call(
                    self._scripts.pool_pick, keys, pick_args(keys.wake, self._pick_seq,
                                                             picked.fixes, picked.size),
                    keys.pick_memo(self._writer_id), keys.leases)  # fmt: skip
                picked.fixes = []
                pick = parse_pick(reply, keys.ready)
                if pick.runs:
                    picked.got(pick, time.monotonic())
                    continue
                now = time.monotonic()
                if now >= deadline:
                    return None
                if watch is None:  # subscribed before it looks again: no wake-up lost
                    watch = await self._watch_pool(keys)
                    continue
                if now - swept >= SWEEP_INTERVAL:
                    swept = now
                    if await self._sweep_pool(keys):
                        continue
                wait = min(deadline - now, swept + SWEEP_INTERVAL - now + 0.001)
                if pick.wait_ms is not None:
                    wait = min(wait, pick.wait_ms / 1000 + 0.002)
                await self._changed.wait_for(_woken(watch, wakes), wait)
        finally:
            if watch is not None:
                AsyncChangeListener.for_client(self._client).unwatch(watch)

    async def _claim_in(
        self, run_id: uuid.UUID, picked: Picked, weight: int, priority: int, worker: str,
        duration: int,
    ) -> tuple[AsyncAgentLease | None, tuple[str, str, str, str]]:  # fmt: skip
        """Claim in run ``run_id`` for a claim from the pool of ``picked``: the lease, or the
        correction of the pool's index."""
        pool = picked.pool
        binding = self._binding
        if binding is None or binding.run_id != run_id:
            async with self._bind_lock:
                binding = await self._prepare(run_id)
                self._adopt(binding)
        if binding.pool is None or binding.pool.pool != pool:
            binding.pool = picked.member(weight, priority)
        try:
            claim, delta, sent = await self._claim_limited(binding, worker, duration, pool)
        except RunNotFoundError:
            return None, correction(run_id, None, "")
        if claim.agent_id is not None:
            lease = AsyncAgentLease(self, claim, worker, duration, sent)
            lease.pool = binding.pool
            return lease, ("", "", "", "")
        return None, correction(run_id, claim, f"{delta.inc_after or '-'} {delta.v_after}")

    @traced("configure_pool")
    async def configure_pool(self, pool: str, *, max_leases: int | None = None) -> None:
        """Set pool ``pool``'s limits (needs no bound run): ``max_leases``, at most that many
        agents leased at once across its runs through claims from the pool (None: no limit).
        A claim from a pool at its limit waits until one of its leases ends (finished,
        released, lapsed) or the limit is raised. Bound claims of its runs are not counted:
        a run's own ``max_leases`` (:meth:`join_pool`) limits those."""
        keys = pool_keys(self._prefix, pool)
        await self._pool_call(self._scripts.pool_lease, keys.pool,
                              [keys.wake, "limit", check_max_leases(max_leases)],
                              keys.leases)  # fmt: skip

    async def _pool_lease(self, lease: AsyncAgentLease, hold: str = "", end: bool = False,
                          expires_ms: int | None = None) -> None:  # fmt: skip
        """Report a lease claimed under its pool's max_leases to the pool: claimed or renewed
        (its expiry; ``hold``: the pick's hold it replaces), or ended. A failure is logged,
        not raised: the lease stands; the pool counts it again at its next renew, or its
        entry ends with its expiry."""
        assert lease.pool is not None
        keys = pool_keys(self._prefix, lease.pool.pool)
        member = lease_member(lease.run_id, lease.agent_id, lease.token)
        if end:
            args = [keys.wake, "end", member]
        elif expires_ms is None:  # claimed: the lease replaces the pick's hold
            args = [keys.wake, "lease", member, str(round(lease.expires_at * 1000)), hold]
        else:  # renewed: moved, never added back (it may have ended meanwhile)
            args = [keys.wake, "renew", member, str(expires_ms), ""]
        try:
            await self._pool_call(self._scripts.pool_lease, keys.pool, args, keys.leases)
        except LuftRedisError as exc:
            logger.warning("pool %s: reporting the lease of agent %s failed (%s)",
                           lease.pool.pool, lease.agent_id, exc)  # fmt: skip

    async def _watch_pool(self, keys: PoolKeys) -> PoolWatch:
        """Subscribe to the pool's wake channel (through the client's change listener)."""
        if self._cluster:
            try:  # the slot map, so that the listener subscribes on the right node
                await async_cluster_ready(self._client)
            except REDIS_ERRORS as exc:
                raise translate_error(exc, prefix=self._prefix) from exc
        watch = PoolWatch(keys.wake.encode(), self._changed.notify)
        listener = AsyncChangeListener.for_client(self._client)
        listener.watch(watch, self._max_staleness)
        await listener.wait_subscribed(watch.channel, SUBSCRIBE_TIMEOUT)
        return watch

    async def _sweep_pool(self, keys: PoolKeys) -> bool:
        """Look at up to SWEEP_SIZE members of the pool: wake those with queued tasks (their
        writer died before its wake), take out those gone. True when one was woken."""
        try:
            members = await self._client.srandmember(keys.members, SWEEP_SIZE)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, prefix=self._prefix) from exc
        pool = pool_name_from_key(self._prefix, keys.pool) or ""
        woke = False
        for raw in members or ():
            try:
                run_id = uuid.UUID(bytes(raw).decode())
            except ValueError:
                continue
            rk = run_keys(self._prefix, run_id)
            try:
                status, *fields = await self._client.hmget(rk.run, "status",
                                                           *MEMBERSHIP_FIELDS)  # fmt: skip
                head = await self._client.zrange(rk.queue, 0, 0)
            except REDIS_ERRORS as exc:
                raise translate_error(exc, run_id=run_id, prefix=self._prefix) from exc
            try:
                member = membership_of(fields, rk.run)
            except CorruptDataError as exc:
                logger.warning("pool %s: run %s not woken: %s", pool, run_id, exc)
                continue
            if status != b"running" or member is None or member.pool != pool:
                await self._pool_call(self._scripts.pool_add, keys, leave_args(keys.wake, run_id))
            elif head:
                await self._pool_call(self._scripts.pool_add, keys,
                                      add_args(keys.wake, run_id, member, ""))  # fmt: skip
                woke = True
        return woke

    # -- rate limits (docs/pools.md) -------------------------------------------------------

    @traced("set_rate_limit")
    async def set_rate_limit(self, name: str, *, requests_per_minute: int | None = None,
                             tokens_per_minute: int | None = None,
                             burst: float = DEFAULT_BURST) -> None:  # fmt: skip
        """Define (or change) the rate limiter ``name``, shared by every run and pool under
        this prefix (one per model or provider): at most ``requests_per_minute`` claims of
        its tasks and ``tokens_per_minute`` tokens (reserved by their claims, then settled by
        what the agents report), GCRA-paced, ``burst`` seconds of budget ahead at most. A
        claim whose task names it takes from it first; out of budget, the claim waits the
        time the limiter says. Changing the rates keeps the budget already spent. Needs no
        bound run."""
        key = limiter_key(self._prefix, name)
        args = limit_args(requests_per_minute, tokens_per_minute, burst)
        fn = self._scripts.limit_set
        await self._retried(
            lambda: call_function(self._client, fn, [key], args, cluster=self._cluster), None)

    @traced("delete_rate_limit")
    async def delete_rate_limit(self, name: str) -> bool:
        """Delete the rate limiter ``name`` (True when it existed). Claims of tasks that still
        name it raise :class:`~luft_redis.errors.LimiterNotFoundError` until it is set again."""
        key = limiter_key(self._prefix, name)
        try:
            return bool(await self._client.delete(key))
        except REDIS_ERRORS as exc:
            raise translate_error(exc, prefix=self._prefix) from exc

    async def _need_limiter(self, name: str) -> None:
        """LimiterNotFoundError unless the limiter ``name`` exists."""
        key = limiter_key(self._prefix, name)
        try:
            found = await self._client.exists(key)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, prefix=self._prefix) from exc
        if not found:
            raise LimiterNotFoundError(key)

    async def _limit_take(self, name: str, mode: str, requests: int, tokens: int) -> int:
        """limit_take-2.lua: 0 when taken, else the ms until the limiter admits."""
        key = limiter_key(self._prefix, name)
        keys = [key, limiter_take_memo(key, self._writer_id)]
        fn = self._scripts.limit_take
        async with self._take_lock:  # the memo keeps one take per backend: one at a time
            self._pick_seq += 1  # one number for every retry of this take
            args = [str(self._pick_seq), mode, str(requests), str(tokens)]
            reply = await self._retried(
                lambda: call_function(self._client, fn, keys, args, cluster=self._cluster), None)
        text = bytes(reply).decode() if isinstance(reply, bytes) else str(reply)
        if not text.isdigit():
            raise BackendError(f"limit_take replied {text[:40]!r}")
        return int(text)

    async def _settle(self, name: str, requests: int, tokens: int) -> None:
        """Charge the limiter ``name`` (negative: give back). A failure is logged, not raised:
        the write it follows is applied; the limiter only counts less (or more)."""
        try:
            await self._limit_take(name, "charge", requests, tokens)
        except LuftRedisError as exc:
            logger.warning("rate limiter %s: charging %d requests and %d tokens failed (%s)",
                           name, requests, tokens, exc)  # fmt: skip

    async def _report_tokens(self, lease: AsyncAgentLease, used: int, final: bool) -> None:
        """The lease's agent has used ``used`` tokens in all: charge its limiter what exceeds
        what it was charged (``final``: settle exactly, giving back a reservation not used)."""
        extra = used - lease.charged
        if lease.limiter is None or extra == 0 or (extra < 0 and not final):
            return
        lease.charged = used
        await self._settle(lease.limiter, 0, extra)

    @traced("agent_tasks")
    async def agent_tasks(self) -> list[TaskInfo]:
        """Every agent task of the bound run, in submit order: state, holder, attempt,
        failures, token, lease expiry (server clock) and payload."""
        binding = self._need_run("agent_tasks")
        reply = await self._call(self._scripts.agent_tasks, (), binding.key_list, binding.run_id)
        return parse_tasks(reply, binding.keys.tasks)

    async def _renew_lease(self, lease: AsyncAgentLease) -> tuple[str, int]:
        """RENEW: ("ok" | "ended" | "released" | "cancelled", new expiry in unix ms); retried
        within the lease's remaining time, not the backend's retry budget."""
        binding = self._lease_binding(lease, "renew")
        left = max(RENEW_FLOOR, lease.time_left())  # (the monotonic clock, never the wall)
        policy = RetryPolicy(max_attempts=self._retry.max_attempts, deadline=left,
                             initial_delay=self._retry.initial_delay,
                             max_delay=min(self._retry.max_delay, left / 4))  # fmt: skip
        args = (self._writer_id, "0", str(lease.agent_id), str(lease.token), lease.incarnation,
                str(lease.lease_ms))  # fmt: skip
        fn, keys = self._scripts.renew_lease, binding.key_list
        reply = await async_within(
            lambda: self._retried(lambda: self._fcall(fn, keys, args), binding.run_id, policy),
            left, "renewing the lease")
        outcome = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if outcome == "ok" and lease.pool_capped:  # the pool's count follows the lease
            await self._pool_lease(lease, expires_ms=int(reply[1]))
        return outcome, int(reply[1])

    async def _release_lease(self, lease: AsyncAgentLease, failed: bool) -> None:
        binding = self._lease_binding(lease, "release")
        args = (str(lease.agent_id), str(lease.token), lease.incarnation, "1" if failed else "0")
        bound = max(lease.time_left(), RELEASE_FLOOR)  # a partitioned holder never hangs here
        delta = await async_within(lambda: self._write(self._scripts.release_lease, args,
                                                       binding, lease, options=False),
                                   bound, "releasing the lease")  # fmt: skip
        if lease.pool_capped:
            await self._pool_lease(lease, end=True)
        await self._pool_wake(binding, delta)

    def _lease_binding(self, lease: AsyncAgentLease, op: str) -> Binding:
        """The binding of ``lease``'s run: the bound one, or (after a claim from a pool moved
        this backend to another run) one of its own, whose cache nobody reads."""
        binding = self._need_run(op)
        if binding.run_id == lease.run_id:
            return binding
        keys = run_keys(self._prefix, lease.run_id)
        own = Binding(lease.run_id, keys, RunCache(lease.run_id, keys))
        own.pool = lease.pool  # (a release wakes the run in the pool it was claimed from)
        return own

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
        delta = await self._write(self._scripts.reset_status_to_running, (), binding)
        await self._index(binding)
        await self._pool_wake(binding, delta)  # its tasks are ready again

    @traced("save_checkpoint")
    async def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None:
        """Replace the run's whole state (not its event log) with ``checkpoint``, atomically."""
        binding = self._need_run("save_checkpoint")
        args = self._encoder.save(checkpoint, binding.run_id)
        await self._write(self._scripts.save_checkpoint, args, binding)
        if checkpoint.status is not t.CheckpointStatus.RUNNING:
            await self._index(binding)

    # -- reads (get_checkpoint, get_findings, can_resume: FrontEnd, from the cache) --------

    async def _read(self, run_id: uuid.UUID, key: str, method: Callable[..., Any], *args: Any,
                    **kwargs: Any) -> Any:  # fmt: skip
        """``method(*args, **kwargs)``: one read of the run's log, redis-py's errors typed; a
        Cluster redirect to a node the client does not know yet (a live reshard) refreshes the
        topology first."""
        try:
            try:
                return await method(*args, **kwargs)
            except AttributeError as exc:
                await raise_lost_redirect(self._client, exc)
                raise
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc

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
            page = await self._read(run_id, key, self._client.xrange, key, min=lower, max="+",
                                    count=page_size)  # fmt: skip
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
        appended after the iteration starts). With ``follow=True`` it waits for new events with
        ``XREAD BLOCK`` and stops once ``timeout`` seconds pass without one (``None``: never);
        with ``follow=False`` it stops at the end of the log.
        """
        binding = self._need_run("iter_events")
        run_id, key = binding.run_id, binding.keys.events
        last = "0-0" if from_id is None else from_id
        if last == "$":
            newest = await self._read(run_id, key, self._client.xrevrange, key, count=1)
            last = entry_id(newest[0][0]) if newest else "0-0"
        idle_since = time.monotonic()
        while True:
            block = block_ms if follow else None
            if follow and timeout is not None:
                left = timeout - (time.monotonic() - idle_since)
                if left <= 0:
                    return
                block = max(1, min(block_ms, int(left * 1000)))
            reply = await self._read(run_id, key, self._client.xread, {key: last}, count=count,
                                     block=block)  # fmt: skip
            entries = xread_entries(reply)
            for raw_id, fields in entries:
                last = entry_id(raw_id)
                yield LogEntry(last, decode_entry(run_id, key, last, fields))
            if entries:
                idle_since = time.monotonic()
            elif not follow:
                return

    # -- history: past states and forks (luft_redis.history) -------------------------------

    def _run_arg(self, run_id: uuid.UUID | None, operation: str) -> uuid.UUID:
        """``run_id`` checked, or the bound run's id (RunNotBoundError when there is none)."""
        rid = self.run_id if run_id is None else check_uuid(run_id, "run_id")
        if rid is None:
            raise RunNotBoundError(operation)
        return rid

    @traced("history", run_arg=True)
    async def history(self, run_id: uuid.UUID | None = None, *, start: str = "-",
                      end: str = "+", count: int = 100,
                      reverse: bool = False) -> list[Version]:  # fmt: skip
        """Up to ``count`` versions of a run (default: the bound one), each with its history
        id, time, operation, event id and what changed, between the history ids ``start``
        and ``end`` (``"(<id>"``: after, or before, that id; ``"-"``/``"+"``: no bound):
        oldest first, or newest first with ``reverse``. The next page starts after the last
        id shown (``start="(<id>"``, or ``end="(<id>"`` with ``reverse``)."""
        self._check_fork()
        rid = self._run_arg(run_id, "history")
        keys = run_keys(self._prefix, rid)
        return await read_history(self._client, keys, rid, start=start, end=end, count=count,
                                  reverse=reverse)  # fmt: skip

    @traced("checkpoint_at", run_arg=True)
    async def checkpoint_at(self, run_id: uuid.UUID | None = None, *,
                            at: HistoryPoint) -> t.RunCheckpoint:  # fmt: skip
        """The run's checkpoint (default: the bound run's) exactly as ``get_checkpoint()``
        returned it at ``at``: a version (``int``), an event id (``"<ms>-<seq>"``: the
        version that appended it) or a time (``datetime``, ISO 8601 text: the last version
        made at or before it). :class:`HistoryUnavailableError` for a point before the run's
        history starts (it says where); ValidationError for one after its last version."""
        self._check_fork()
        rid = self._run_arg(run_id, "checkpoint_at")
        past = await state_at(self._client, run_keys(self._prefix, rid), rid, at)
        return past.checkpoint

    @traced("fork_run", run_arg=True)
    async def fork_run(self, run_id: uuid.UUID | None = None, *, at: HistoryPoint,
                       new_run_id: uuid.UUID | None = None,
                       task: str | None = None) -> uuid.UUID:  # fmt: skip
        """A new run whose state is the run's (default: the bound run's) at ``at`` (as
        :meth:`checkpoint_at` reads it) and whose log is the run's events up to that point;
        returns its id (``new_run_id``, else a new one). ``task``: its task text (default:
        the parent's). The run field ``parent`` (``"<run id> <version>"``) records where it
        came from. The parent's agent tasks whose agent has no ``ok`` result at that point
        are submitted to the new run, ready to be claimed again; a parent in a pool puts the
        new run in the same pool, with the same weight and priority. The parent is only
        read. RunExistsError when ``new_run_id`` exists."""
        self._check_fork()
        parent = self._run_arg(run_id, "fork_run")
        child = uuid.uuid4() if new_run_id is None else check_uuid(new_run_id, "new_run_id")
        if child == parent:
            raise ValidationError("new_run_id", "is the id of the run forked")
        keys = run_keys(self._prefix, parent)
        past = await state_at(self._client, keys, parent, at)
        cp = past.checkpoint._replace(run_id=child,
                                      task=past.checkpoint.task if task is None else task)
        values = await self._read(parent, keys.run, self._client.hmget, keys.run,
                                  ["run_dir", *MEMBERSHIP_FIELDS])  # fmt: skip
        member = membership_of(values[1:], keys.run)
        events: list[tuple[str, t.AgentEvent]] = []
        if past.last_event is not None:
            page = await self._read(parent, keys.events, self._client.xrange, keys.events,
                                    min="-", max=past.last_event)  # fmt: skip
            for raw_id, fields in page:
                event = decode_entry(parent, keys.events, entry_id(raw_id), fields)
                if getattr(event, "run_id", None) == parent:
                    event = event._replace(run_id=child)
                events.append((entry_id(raw_id), event))
        tasks = await self._call(self._scripts.agent_tasks, (), list(keys), parent)
        again = [AgentTask(i.agent_id, i.phase_id, i.payload, i.limiter)
                 for i in parse_tasks(tasks, keys.tasks)
                 if (r := cp.agent_results.get(i.agent_id)) is None
                 or r.status != t.ResultStatus.OK.value]  # fmt: skip
        if again and cp.status is not t.CheckpointStatus.RUNNING:
            raise ValidationError(  # (checked before anything is written)
                "at", f"the run is {cp.status.value} at {past.entry.version}: its agent tasks "
                "could not be ready again; fork from a version where it was running")
        run_dir = values[0].decode() if isinstance(values[0], bytes) else (values[0] or "")
        await import_checkpoint(self._client, cp, events, prefix=self._prefix, run_dir=run_dir,
                                replace=False, max_payload_size=self._encoder.max_payload_size,
                                progress=None, total=len(events),
                                parent=f"{parent} {past.entry.version}")  # fmt: skip
        if again or member is not None:
            fork = type(self)(self._client, prefix=self._prefix, watch=False, retry=self._retry)
            try:
                await fork.open_run(child)
                if member is not None:
                    await fork.join_pool(member.pool, weight=member.weight,
                                         priority=member.priority, max_leases=member.max_leases,
                                         max_tokens=member.max_tokens)  # fmt: skip
                if again:
                    await fork.submit_agents(again)
            except BaseException:  # no half-made fork: its tasks or pool could not follow
                logger.error("run %s: fork of run %s incomplete; deleting it", child, parent)
                try:
                    await fork.delete_run(child)
                except Exception:
                    logger.exception("run %s: could not delete the incomplete fork", child)
                raise
            finally:
                await fork.aclose()
        logger.info("run %s: forked from run %s at version %d (%d events, %d tasks again)",
                    child, parent, past.entry.version, len(events), len(again))  # fmt: skip
        return child


def _woken(watch: PoolWatch, wakes: int) -> Callable[[], bool]:
    """True once ``watch`` counted a wake after ``wakes``."""
    return lambda: watch.wakes != wakes
