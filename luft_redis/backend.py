"""``RedisCheckpointBackend``: luft's ``CheckpointBackend`` contract on Redis, for sync code.

A thin front end: arguments are built by :mod:`luft_redis.wire`, every change is one Lua script
whose reply is a :class:`~luft_redis.delta.Delta`, and the in-process
:class:`~luft_redis.cache.RunCache` applies deltas (its own writes' and, through the
:mod:`~luft_redis.listener`, every other process's). This module only does the I/O around them.
The asyncio twin is :class:`luft_redis.asyncio.AsyncRedisCheckpointBackend`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from . import types as t
from .cache import Offer, RunCache, RunState
from .coherence import DEFAULT_MAX_STALENESS, Watch, fork_generation, fork_lock
from .connect import Durability, check_sync_client, make_client
from .delta import Delta, UnknownFormat, parse_delta
from .errors import (
    BackendError,
    CorruptDataError,
    LuftRedisError,
    RunNotBoundError,
    RunNotFoundError,
    ValidationError,
)
from .fcall import call_function
from .frontend import (
    _UNBOUND,
    DEFAULT_PAGE_SIZE,
    GAP_WAIT,
    REDIS_ERRORS,
    REFRESH_RETRY_DELAY,
    SUBSCRIBE_TIMEOUT,
    Binding,
    FrontEnd,
)
from .index import finishes, index_add, index_remove, score_of
from .keys import (
    DEFAULT_PREFIX,
    TOMBSTONE_TTL,
    run_id_from_key,
    run_keys,
    run_pattern,
    tombstone_key,
)
from .listener import ChangeListener, Refresher, weak_work
from .retry import DEFAULT_RETRY, RetryPolicy
from .scripts import Function, is_function_missing, translate_error
from .tracing import traced
from .wire import (
    DEFAULT_MAX_PAYLOAD_SIZE,
    LogEntry,
    check_uuid,
    decode_entry,
    entry_id,
    page_after,
    xread_entries,
)

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "CheckpointBackend",
    "Durability",
    "LogEntry",
    "RedisCheckpointBackend",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@runtime_checkable
class CheckpointBackend(Protocol):
    """The 12 operations of luft's ``CheckpointBackend`` trait (``luft_core/state.rs``)."""

    def init_run(self, run_id: uuid.UUID, task: str, run_dir: str) -> None: ...

    def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any
    ) -> None: ...

    def open_run(self, run_id: uuid.UUID) -> t.RunCheckpoint | None: ...

    def append_event(self, event: t.AgentEvent) -> None: ...

    def upsert_agent_result(self, cache: t.AgentResultCache) -> None: ...

    def upsert_agent_session(self, session: t.AgentSessionCheckpoint) -> None: ...

    def get_event_log(self) -> list[t.AgentEvent]: ...

    def can_resume(self) -> bool: ...

    def reset_status_to_running(self) -> None: ...

    def cancel(self) -> None: ...

    def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None: ...


class RedisCheckpointBackend(FrontEnd):
    """luft's checkpoint backend on Redis (sync front end).

    ``client`` is a redis-py ``Redis``, ``RedisCluster`` or fakeredis client created with
    ``decode_responses=False`` (the default); many backends may share one client. An asyncio
    client is refused (:class:`~luft_redis.errors.ClientTypeError`): use
    :class:`luft_redis.AsyncRedisCheckpointBackend`. ``prefix`` namespaces the keys
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

    Forking: a backend made before ``os.fork()`` works in the child, with a new writer
    identity, its own connections and listener, and a cache that reloads before it reports
    fresh.
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
        check_sync_client(client)
        self._configure(client, prefix=prefix, watch=watch, retry=retry, durability=durability,
                        max_payload_size=max_payload_size, max_staleness=max_staleness)  # fmt: skip
        self._configure_retention(expire_finished_after, max_events)
        self._callbacks: dict[int, Callable[[t.RunCheckpoint], None]] = {}
        self._next_callback = 0
        self._fork = fork_generation()
        self._new_identity()

    def _new_identity(self) -> None:
        """A writer identity, locks and listener of this process (also after a fork)."""
        self._writer_id = uuid.uuid4().hex
        self._op_seq = 0
        self._io_lock = threading.Lock()  # one write at a time: operation numbers in order
        self._bind_lock = threading.Lock()  # one init_run/open_run at a time
        self._emit_lock = threading.Lock()
        self._listener = ChangeListener.for_client(self._client) if self._watching else None
        self._refresher = Refresher.for_client(self._client) if self._watching else None

    def _check_fork(self) -> None:
        """In a forked child: new identity and connections; the cache reloads before fresh.

        ``self._fork`` changes last, so no thread of the child sees the parent's identity,
        listener or cache vouched for meanwhile (``cache_is_fresh`` compares it first)."""
        if self._fork == fork_generation():
            return
        with fork_lock():
            generation = fork_generation()
            if self._fork == generation:
                return
            binding = self._binding
            if binding is not None:
                binding.cache.reset_locks()  # stale until reloaded in this process
            self._new_identity()
            if binding is not None:
                binding.listener = self._listener
                binding.watch = self._start_watch(binding.cache, binding.channel)
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
        **client_kwargs: Any,
    ) -> RedisCheckpointBackend:
        """A backend with its own client for ``url``, closed by :meth:`close`.

        ``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs make a ``Redis`` client
        (``cluster=True``: a ``RedisCluster``); ``redis+sentinel://[:password@]host:port[,host:
        port...]/<service>[/<db>]`` asks those Sentinels for the primary of ``<service>`` and
        follows failovers. ``client_kwargs`` go to the client.
        """
        client = make_client(url, cluster=cluster, **client_kwargs)
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
        ``max_staleness`` seconds ago is missing from it.

        That needs ``watch=True``, a bound run, the run's channel subscribed on the node that
        owns its slot now, a health-check PING on that connection answered within
        ``max_staleness``, and every version seen so far applied (queued changes count). While
        it is False, reads still answer from the cache; :meth:`sync` reloads.
        """
        self._check_fork()
        return self._fork == fork_generation() and self._fresh(self._binding)

    def close(self) -> None:
        """Unbind the run and stop watching it (at once: when nothing else watches through
        the client, its subscriber connections are closed before this returns); close the
        client if :meth:`from_url` made it."""
        self._unbind()
        if self._listener is not None and self._fork == fork_generation():
            self._listener.release()  # when nothing else watches through the client
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> RedisCheckpointBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- binding ---------------------------------------------------------------------------

    def _start_watch(self, cache: RunCache, channel: bytes) -> Watch | None:
        listener = self._listener
        if listener is None:
            return None
        watch = Watch(cache, channel, self._on_work, self._counters)
        watch.wants_changes = bool(self._callbacks)
        if self._refresher is not None:  # started here, at this thread's priority
            self._refresher.hold(watch)
        listener.watch(watch, self._max_staleness)
        return watch

    def _stop_watch(self, watch: Watch | None) -> None:
        if watch is not None and self._listener is not None:
            self._listener.unwatch(watch)
        if watch is not None and self._refresher is not None:
            self._refresher.release(watch)

    def _prepare(self, run_id: uuid.UUID) -> Binding:
        """A new binding for ``run_id``, watched and (briefly) waited for."""
        keys = run_keys(self._prefix, run_id)
        cache = RunCache(run_id, keys)
        binding = Binding(run_id, keys, cache)
        binding.listener = self._listener
        binding.watch = self._start_watch(cache, binding.channel)
        if binding.watch is not None and self._listener is not None:
            self._listener.wait_subscribed(binding.channel, SUBSCRIBE_TIMEOUT)
            refused = self._refused(self._listener, run_id)
            if refused is not None:
                self._stop_watch(binding.watch)
                raise refused
        return binding

    def _adopt(self, binding: Binding) -> None:
        old, self._binding = self._binding, binding
        self._reader = binding.cache
        self._emitted = None
        if old is not None:
            self._stop_watch(old.watch)
            old.cache.wake()  # waiters on the old run look again
        if binding.watch is not None and not binding.cache.synced:
            self._on_work(binding.watch)  # a confirmation came during the load: reload
        self._emit()

    def _unbind(self) -> None:
        old, self._binding = self._binding, None
        self._reader = _UNBOUND
        if old is not None:
            self._stop_watch(old.watch)
            old.cache.wake()

    def _on_work(self, watch: Watch) -> None:
        """From the listener thread: a reload or callbacks are due (never blocks)."""
        refresher = self._refresher
        if refresher is not None:
            refresher.schedule(weak_work(self, "_refresh"))

    def _refresh(self) -> None:
        """On the refresher thread: reload when stale, then run the change callbacks."""
        binding = self._binding
        if binding is None or self._fork != fork_generation():
            return
        if not binding.cache.synced:
            try:
                self._reload(binding)
            except LuftRedisError as exc:
                # corrupt data is an operator's problem (ERROR); anything else passes (INFO)
                level = logging.ERROR if isinstance(exc, CorruptDataError) else logging.INFO
                logger.log(level, "run %s: reload failed (%s); trying again", binding.run_id, exc)
                time.sleep(REFRESH_RETRY_DELAY)
                if binding.watch is not None:
                    self._on_work(binding.watch)
                return
        self._emit()

    def _reload(self, binding: Binding) -> RunState | None:
        """Load the run now and install it in ``binding``'s cache (I/O; no lock held)."""
        cache = binding.cache
        generation = cache.generation
        self._counters.reloads += 1
        reply = self._call(self._scripts.load, (), binding.key_list, binding.run_id)
        state = None if reply == 0 or reply is None else RunState.from_load(
            binding.run_id, binding.keys, reply)  # fmt: skip
        cache.install(state, generation)
        if state is None:
            logger.info("run %s no longer exists; the cache keeps its last state",
                        binding.run_id)  # fmt: skip
        return state

    # -- I/O -------------------------------------------------------------------------------

    def _fcall(self, fn: Function, keys: list[str], args: Sequence[Any]) -> Any:
        """One attempt of ``fn`` (see :func:`luft_redis.fcall.call_function`)."""
        return call_function(self._client, fn, keys, args, cluster=self._cluster)

    def _call(self, fn: Function, args: Sequence[Any], keys: list[str], run_id: object) -> Any:
        return self._retried(lambda: self._fcall(fn, keys, args), run_id)

    def _retried(self, attempt: Callable[[], _T], run_id: object) -> _T:
        """``attempt()`` under the retry policy, counted in :meth:`stats`; redis-py's errors
        translated."""
        counters = self._counters
        attempts = 0

        def counted() -> _T:
            nonlocal attempts
            attempts += 1
            return attempt()

        started = time.perf_counter()
        try:
            return self._retry.call(counted)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run_id, prefix=self._prefix) from exc
        finally:
            counters.wait_seconds += time.perf_counter() - started
            if attempts > 1:
                counters.retries += attempts - 1

    def _execute(self, fn: Function, args: Sequence[Any], keys: list[str],
                 run_id: object) -> tuple[Any, int | None]:  # fmt: skip
        """Run a writing script once, exactly: its operation id is made before any attempt.

        With ``durability``, ``WAIT`` goes in the same round trip (a pipeline); returns the
        reply and the number of replicas that acknowledged (None without durability).
        """
        durability = self._durability
        with self._io_lock:
            self._op_seq += 1
            full = (self._writer_id, str(self._op_seq), *args)
            if durability is None:
                reply = self._call(fn, full, keys, run_id)
                self._counters.writes += 1
                return reply, None
            command = fn.command(keys, full)
            wait = ("WAIT", durability.replicas, durability.timeout_ms)

            def send() -> tuple[Any, Any]:
                pipe = self._client.pipeline(transaction=False)
                pipe.execute_command(*command)
                pipe.execute_command(*wait)
                result, count = pipe.execute(raise_on_error=False)
                return result, count

            def attempt() -> tuple[Any, int]:
                result, count = send()
                if is_function_missing(result):  # nothing ran; the WAIT waited for nothing
                    logger.info("loading the Redis Functions library %s", self._library.name)
                    self._client.execute_command(*self._library.load_command)
                    result, count = send()
                for reply in (result, count):
                    if isinstance(reply, Exception):
                        raise reply
                return result, int(count)

            replied = self._retried(attempt, run_id)
            self._counters.writes += 1
            return replied

    def _write(self, fn: Function, args: Sequence[Any], binding: Binding) -> Delta:
        """Run a writing script exactly once and apply its delta to ``binding``'s cache;
        NotDurableError (after it was applied) when too few replicas acknowledged it."""
        try:
            reply, acked = self._execute(
                fn, self._with_retention(args), binding.key_list, binding.run_id)
        except RunNotFoundError:
            binding.cache.install(None, binding.cache.generation)  # the server says: gone
            raise
        delta = self._absorb(binding, reply)
        if delta.replay:
            self._counters.replays += 1
        self._emit()
        self._check_durable(acked)
        return delta

    def _absorb(self, binding: Binding, reply: Any) -> Delta:
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
            cache.wait(lambda: cache.tip[0] != delta.inc_before or cache.tip[1] >= want, GAP_WAIT)
            outcome = cache.offer(delta)
        if outcome in (Offer.BEHIND, Offer.FOREIGN):
            try:
                self._reload(binding)
            except LuftRedisError as exc:  # the write is applied: report staleness instead
                logger.info("run %s: reload after a write failed (%s)", binding.run_id, exc)
                cache.mark_stale()
                if binding.watch is not None:
                    self._on_work(binding.watch)
        return delta

    def _emit(self) -> None:
        """Wake waiters and run the change callbacks once per new version."""
        binding = self._binding
        if binding is None or not self._callbacks:
            return
        with self._emit_lock:
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
                    callback(snapshot)
                except Exception:
                    logger.exception("change callback %r failed", callback)

    # -- change API ------------------------------------------------------------------------

    @traced("sync")
    def sync(self) -> t.RunCheckpoint | None:
        """The checkpoint, reloaded first unless the cache can vouch for itself
        (:attr:`cache_is_fresh`) and the run is running (a finished run may have expired,
        which publishes no notice: see ``expire_finished_after``); None when the run no longer
        exists."""
        binding = self._need_run("sync")
        if not self.cache_is_fresh or self._may_have_expired(binding):
            self._reload(binding)
            self._emit()
        if binding.cache.gone:
            return None
        return binding.cache.snapshot()

    def wait_for_change(
        self, after_version: int | None = None, timeout: float | None = None
    ) -> bool:
        """Block until the run's version passes ``after_version`` (default: the current one)
        or the run is replaced or deleted; True if it did, False when ``timeout`` passed."""
        binding = self._need_run("wait_for_change")
        cache = binding.cache
        inc, version = cache.tip
        base = version if after_version is None else after_version
        return cache.wait(
            lambda: cache.tip[1] > base or cache.tip[0] != inc or cache.gone
            or self._binding is not binding,  # rebound or closed meanwhile
            timeout,
        )

    def subscribe(self, callback: Callable[[t.RunCheckpoint], None]) -> Callable[[], None]:
        """Call ``callback(checkpoint)`` after changes of the bound run; returns a function
        that unsubscribes.

        Callbacks run on the client's refresher thread (other processes' changes) or in the
        writing thread (this backend's): keep them short and do not block in them.
        """
        key = self._next_callback
        self._next_callback += 1
        self._callbacks[key] = callback
        binding = self._binding
        if binding is not None and binding.watch is not None:
            binding.watch.wants_changes = True
        with self._emit_lock:
            if self._binding is not None:
                self._emitted = self._binding.cache.tip

        def unsubscribe() -> None:
            self._callbacks.pop(key, None)

        return unsubscribe

    # -- run lifecycle ---------------------------------------------------------------------

    @traced("init_run", run_arg=True)
    def init_run(self, run_id: uuid.UUID, task: str, run_dir: str) -> None:
        """Create a new run and bind to it. :class:`RunExistsError` if it exists (then nothing
        changed, and this backend stays bound as it was)."""
        self._init(run_id, task, run_dir, None, with_meta=False)

    @traced("init_run_with_meta", run_arg=True)
    def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any
    ) -> None:
        """``init_run`` with ``workflow_meta`` (any JSON) stored, in one atomic step."""
        self._init(run_id, task, run_dir, workflow_meta, with_meta=True)

    def _init(self, run_id: Any, task: Any, run_dir: Any, meta: Any, *, with_meta: bool) -> None:
        self._check_fork()
        rid, args = self._encoder.init_run(run_id, task, run_dir, meta, with_meta=with_meta)
        with self._bind_lock:
            binding = self._prepare(rid)
            generation = binding.cache.generation
            try:
                reply, acked = self._execute(self._scripts.init_run, args, binding.key_list, rid)
                delta = parse_delta(bytes(reply))
                state = RunState.from_whole(rid, binding.keys, delta)
            except BaseException:
                self._stop_watch(binding.watch)
                raise
            binding.cache.install(state, generation)
            self._adopt(binding)
            self._index(binding)
        self._check_durable(acked)

    def _index(self, binding: Binding) -> None:
        """ZADD the run to the run index (luft_redis.index), after a lifecycle change."""
        index_add(self._client, self._retry, self._prefix, binding.run_id,
                  score_of(binding.cache.snapshot()))  # fmt: skip

    @traced("open_run", run_arg=True)
    def open_run(self, run_id: uuid.UUID) -> t.RunCheckpoint | None:
        """Load run ``run_id`` (not its event log) and bind to it; None if it does not exist
        (this backend then stays bound as it was)."""
        self._check_fork()
        rid = check_uuid(run_id, "run_id")
        with self._bind_lock:
            binding = self._prepare(rid)
            try:
                state = self._reload(binding)
            except BaseException:
                self._stop_watch(binding.watch)
                raise
            if state is None:
                self._stop_watch(binding.watch)
                return None
            self._adopt(binding)
            return binding.cache.snapshot()

    @traced("delete_run", run_arg=True)
    def delete_run(self, run_id: uuid.UUID | None = None) -> bool:
        """Delete a run (default: the bound one) with its event log; True if it existed.

        Every key of the run goes in one atomic step. Backends watching it are told: their
        caches stop being fresh, and their writes raise :class:`RunNotFoundError` (a run is
        never brought back by a late write; ``init_run`` makes a new one). This backend is
        unbound if it was bound to that run.
        """
        self._check_fork()
        rid = self.run_id if run_id is None else check_uuid(run_id, "run_id")
        if rid is None:
            raise RunNotBoundError("delete_run")
        keys = [*run_keys(self._prefix, rid), tombstone_key(self._prefix, rid)]
        ttl = (str(TOMBSTONE_TTL),)
        existed, acked = self._execute(self._scripts.delete_run, ttl, keys, rid)
        index_remove(self._client, self._retry, self._prefix, rid)
        if rid == self.run_id:
            self._unbind()
        self._check_durable(acked)
        return bool(int(existed))

    @traced("list_runs")
    def list_runs(self) -> list[uuid.UUID]:
        """The ids of every run stored under this prefix (SCAN of the keyspace), sorted."""
        found: set[uuid.UUID] = set()
        try:
            for raw in self._client.scan_iter(match=run_pattern(self._prefix), count=1000):
                key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                run_id = run_id_from_key(self._prefix, key)
                if run_id is not None:
                    found.add(run_id)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, prefix=self._prefix) from exc
        return sorted(found)

    # -- writes ----------------------------------------------------------------------------

    @traced("append_event")
    def append_event(self, event: t.AgentEvent) -> None:
        """Append ``event`` to the run's log and apply contract §5's rules, atomically."""
        self._append((event,))

    @traced("append_events")
    def append_events(self, events: Sequence[t.AgentEvent]) -> None:
        """Append ``events`` in order, applying §5's rules to each, as one atomic change.

        One round trip for the whole batch; either every event is stored or none is.
        """
        self._append(events)

    def _append(self, events: Sequence[t.AgentEvent]) -> None:
        binding = self._need_run("append_events")
        args = self._encoder.events(events, binding.run_id)
        if args == ["0"]:
            return
        self._write(self._scripts.append_events, args, binding)
        if finishes(events):
            self._index(binding)

    @traced("upsert_agent_result")
    def upsert_agent_result(self, cache: t.AgentResultCache) -> None:
        """Insert or replace ``agent_results[cache.agent_id]`` (no tokens, no event)."""
        binding = self._need_run("upsert_agent_result")
        self._write(self._scripts.upsert_agent_result, self._encoder.result(cache), binding)

    @traced("upsert_agent_session")
    def upsert_agent_session(self, session: t.AgentSessionCheckpoint) -> None:
        """Insert or replace ``agent_sessions[session.agent_id]``."""
        binding = self._need_run("upsert_agent_session")
        self._write(self._scripts.upsert_agent_session, self._encoder.session(session), binding)

    @traced("cancel")
    def cancel(self) -> None:
        """running -> cancelled; a completed or failed run is left as it is (no error)."""
        binding = self._need_run("cancel")
        self._write(self._scripts.cancel, (), binding)
        self._index(binding)

    @traced("reset_status_to_running")
    def reset_status_to_running(self) -> None:
        """failed/cancelled/running -> running; :class:`NotResumableError` on a completed run."""
        binding = self._need_run("reset_status_to_running")
        self._write(self._scripts.reset_status_to_running, (), binding)
        self._index(binding)

    @traced("save_checkpoint")
    def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None:
        """Replace the run's whole state (not its event log) with ``checkpoint``, atomically."""
        binding = self._need_run("save_checkpoint")
        args = self._encoder.save(checkpoint, binding.run_id)
        self._write(self._scripts.save_checkpoint, args, binding)
        if checkpoint.status is not t.CheckpointStatus.RUNNING:
            self._index(binding)

    # -- reads (get_checkpoint, get_findings, can_resume: FrontEnd, from the cache) --------

    @traced("get_event_log")
    def get_event_log(self) -> list[t.AgentEvent]:
        """Every event of the run, in append order."""
        return list(self.iter_event_log())

    def iter_event_log(
        self, *, start: str = "-", page_size: int = DEFAULT_PAGE_SIZE
    ) -> Iterator[t.AgentEvent]:
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
                page = self._client.xrange(key, min=lower, max="+", count=page_size)
            except REDIS_ERRORS as exc:
                raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc
            for raw_id, fields in page:
                yield decode_entry(run_id, key, entry_id(raw_id), fields)
            if len(page) < page_size:
                return
            lower = page_after(page)

    def iter_events(
        self,
        from_id: str | None = None,
        *,
        follow: bool = True,
        timeout: float | None = None,
        block_ms: int = 1000,
        count: int = 100,
    ) -> Iterator[LogEntry]:
        """Yield the run's events as :class:`LogEntry` ``(id, event)``, following new ones.

        Starts after stream id ``from_id`` (``None``: from the first event; ``"$"``: only events
        appended after this call). With ``follow=True`` it waits for new events with
        ``XREAD BLOCK`` and stops once ``timeout`` seconds pass without one (``None``: never);
        with ``follow=False`` it stops at the end of the log.
        """
        binding = self._need_run("iter_events")
        run_id, key = binding.run_id, binding.keys.events
        last = "0-0" if from_id is None else from_id
        try:
            if last == "$":  # now, at the call: not when the iteration starts
                newest = self._client.xrevrange(key, count=1)
                last = entry_id(newest[0][0]) if newest else "0-0"
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc
        return self._follow(run_id, key, last, follow, timeout, block_ms, count)

    def _follow(
        self, run_id: uuid.UUID, key: str, last: str, follow: bool, timeout: float | None,
        block_ms: int, count: int,
    ) -> Iterator[LogEntry]:  # fmt: skip
        idle_since = time.monotonic()
        while True:
            block = block_ms if follow else None
            if follow and timeout is not None:
                left = timeout - (time.monotonic() - idle_since)
                if left <= 0:
                    return
                block = max(1, min(block_ms, int(left * 1000)))
            try:
                reply = self._client.xread({key: last}, count=count, block=block)
            except REDIS_ERRORS as exc:
                raise translate_error(exc, run_id=run_id, prefix=self._prefix, key=key) from exc
            entries = xread_entries(reply)
            for raw_id, fields in entries:
                last = entry_id(raw_id)
                yield LogEntry(last, decode_entry(run_id, key, last, fields))
            if entries:
                idle_since = time.monotonic()
            elif not follow:
                return
