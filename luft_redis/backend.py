"""``RedisCheckpointBackend``: luft's ``CheckpointBackend`` contract on Redis.

One backend serves one run at a time (``init_run``/``open_run`` bind it). Every state change is
one Lua script run atomically in Redis; reads of the checkpoint are answered from the in-process
:class:`~luft_redis.cache.RunState`. Many backends may share one client and its pool.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import redis
import redis.cluster
import redis.sentinel

from . import codec
from . import types as t
from .cache import RunState, finding_segments
from .errors import (
    ConfigurationError,
    CorruptDataError,
    LuftRedisError,
    NotDurableError,
    PayloadTooLargeError,
    RunMismatchError,
    RunNotBoundError,
    RunNotFoundError,
    ValidationError,
)
from .keys import (
    DEFAULT_PREFIX,
    SCHEMA_VERSION,
    RunKeys,
    check_prefix,
    run_id_from_key,
    run_keys,
    run_pattern,
)
from .listener import ChangeListener, parse_notice
from .retry import DEFAULT_RETRY, NO_RETRY, RetryPolicy
from .scripts import Scripts, translate_error

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "CheckpointBackend",
    "Durability",
    "LogEntry",
    "RedisCheckpointBackend",
    "sentinel_client",
]

logger = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 1000
"""Stream entries fetched per XRANGE call by :meth:`RedisCheckpointBackend.iter_event_log`."""

SUBSCRIBE_TIMEOUT = 2.0
"""Seconds ``init_run``/``open_run`` wait for the change subscription before loading anyway
(the cache then reports ``cache_is_fresh == False`` until the listener catches up)."""

DEFAULT_MAX_PAYLOAD_SIZE = 4 * 1024 * 1024
"""Largest stored form of one event, one result's output or findings, or workflow_meta."""

GAP_WAIT = 0.1
"""Seconds a write waits for the listener to deliver other processes' changes that came
before it, before it reloads the run instead."""

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

    def get_checkpoint(self) -> t.RunCheckpoint | None: ...

    def get_findings(self) -> Sequence[t.Finding]: ...

    def get_event_log(self) -> list[t.AgentEvent]: ...

    def can_resume(self) -> bool: ...

    def reset_status_to_running(self) -> None: ...

    def cancel(self) -> None: ...

    def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None: ...


def _opt(value: str | bytes | None) -> str | bytes:
    """Optional script argument: ``"n"`` for None, ``"s<value>"`` otherwise."""
    if value is None:
        return "n"
    if isinstance(value, bytes):
        return b"s" + value
    return "s" + value


def _check_uuid(value: Any, field: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ValidationError(field, f"{value!r} is not a UUID")


def _check_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    return value


def _check_type(value: Any, cls: type[_T], field: str) -> _T:
    if not isinstance(value, cls):
        raise ValidationError(field, f"expected {cls.__name__}, got {type(value).__name__}")
    return value


def _is_cluster(client: Any) -> bool:
    return isinstance(client, redis.cluster.RedisCluster)


@dataclasses.dataclass(frozen=True, slots=True)
class Durability:
    """Wait for ``replicas`` replicas to acknowledge each write, at most ``timeout_ms`` ms."""

    replicas: int = 1
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.timeout_ms < 0:
            raise ConfigurationError("durability needs replicas >= 1 and timeout_ms >= 0")


def sentinel_client(url: str, **client_kwargs: Any) -> Any:
    """A client for the primary named in ``redis+sentinel://[:pw@]h:p[,h:p...]/<service>[/<db>]``.

    The client asks the Sentinels for the current primary on every (re)connection, so it follows
    a failover; ``rediss+sentinel://`` uses TLS to the Redis servers.
    """
    parsed = urllib.parse.urlsplit(url)
    netloc = parsed.netloc.rpartition("@")[2]
    password = urllib.parse.unquote(parsed.netloc.rpartition("@")[0].partition(":")[2]) or None
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"sentinel address {part!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    path = [p for p in parsed.path.split("/") if p]
    if not path:
        raise ConfigurationError("a sentinel URL needs the service name: .../<service>[/<db>]")
    service, db = path[0], int(path[1]) if len(path) > 1 else 0
    if password is not None:
        client_kwargs.setdefault("password", password)
    if parsed.scheme.startswith("rediss"):
        client_kwargs.setdefault("ssl", True)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        hosts, socket_timeout=client_kwargs.get("socket_timeout")
    )
    return sentinel.master_for(service, db=db, **client_kwargs)  # type: ignore[no-untyped-call]


class LogEntry(NamedTuple):
    """An event of the log with its stream entry id (to resume reading after it)."""

    id: str
    event: t.AgentEvent


class RedisCheckpointBackend:
    """luft's checkpoint backend on Redis.

    ``client`` is a redis-py ``Redis``, ``RedisCluster`` or fakeredis client created with
    ``decode_responses=False`` (the default); many backends may share one client.
    ``prefix`` namespaces the keys (``<prefix>:{<run-id>}:...``, see ``docs/redis-layout.md``).

    ``watch=True`` (the default) keeps the cache coherent with every other process writing to
    the run: one listener thread per client applies their change notices (see
    :mod:`luft_redis.listener`). With ``watch=False`` the cache sees only this backend's writes
    (and catches up on the next write of its own).

    ``retry`` is the :class:`~luft_redis.retry.RetryPolicy` for transient Redis failures
    (``None``: one attempt). Writes apply exactly once, however often they are retried.

    ``max_payload_size`` bounds the stored form of one event, one result's output or findings,
    and ``workflow_meta`` (default 4 MiB); a larger value raises
    :class:`~luft_redis.errors.PayloadTooLargeError` and nothing is stored.

    ``durability=Durability(replicas=1, timeout_ms=1000)`` makes every write wait (``WAIT``, in
    the same round trip) until that many replicas have it, and raise
    :class:`~luft_redis.errors.NotDurableError` when fewer did in time (the write itself is
    applied on the primary; the error says it could be lost if the primary fails now).
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
    ) -> None:
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
        if kwargs is None and hasattr(client, "get_connection_kwargs"):
            kwargs = client.get_connection_kwargs()
        if kwargs and kwargs.get("decode_responses"):
            raise ConfigurationError(
                "the Redis client must use decode_responses=False: luft-redis stores binary blobs"
            )
        self._client = client
        self._prefix = check_prefix(prefix)
        self._scripts = Scripts(client)
        self._retry = retry if retry is not None else NO_RETRY
        if durability is not None and isinstance(client, redis.cluster.RedisCluster):
            raise ConfigurationError("durability= is not supported on Redis Cluster clients")
        self._durability = durability
        self._acked: int | None = None
        if max_payload_size < 1:
            raise ConfigurationError("max_payload_size must be positive")
        self._max_payload_size = max_payload_size
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._callbacks: dict[int, Callable[[t.RunCheckpoint], None]] = {}
        self._next_callback = 0
        self._writer_id = uuid.uuid4().hex
        self._op_seq = 0
        self._listener = ChangeListener.for_client(client) if watch else None
        self._channel: bytes | None = None
        self._state_channel: bytes | None = None  # the channel of the run _state holds
        self._buffer: list[bytes] | None = None  # notices that arrive while binding
        self._bind_lock = threading.Lock()  # one init_run/open_run at a time
        self._synced = 0  # the listener confirmation our state was loaded after
        self._run_id: uuid.UUID | None = None
        self._keys: RunKeys | None = None
        self._key_list: list[str] = []
        self._state: RunState | None = None
        self._owns_client = False

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
        **client_kwargs: Any,
    ) -> RedisCheckpointBackend:
        """A backend with its own client for ``url``, closed by :meth:`close`.

        ``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs make a ``Redis`` client
        (``cluster=True``: a ``RedisCluster``); ``redis+sentinel://[:password@]host:port[,host:
        port...]/<service>[/<db>]`` asks those Sentinels for the primary of ``<service>`` and
        follows failovers. ``client_kwargs`` go to the client.
        """
        client_kwargs["decode_responses"] = False
        client: Any
        if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
            client = sentinel_client(url, **client_kwargs)
        elif cluster:
            client = redis.cluster.RedisCluster.from_url(url, **client_kwargs)
        else:
            client = redis.Redis.from_url(url, **client_kwargs)
        backend = cls(client, prefix=prefix, watch=watch, retry=retry, durability=durability,
                      max_payload_size=max_payload_size)  # fmt: skip
        backend._owns_client = True
        return backend

    # -- plumbing --------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client this backend uses."""
        return self._client

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def run_id(self) -> uuid.UUID | None:
        """The bound run, or None."""
        return self._run_id

    @property
    def keys(self) -> RunKeys | None:
        """The Redis keys of the bound run, or None."""
        return self._keys

    @property
    def version(self) -> int:
        """The run's change counter as last seen by this backend (0 when unbound)."""
        state = self._state
        return state.version if state else 0

    @property
    def cache_is_fresh(self) -> bool:
        """True when the cache is known to reflect every change made by any process.

        That needs a bound run, ``watch=True`` and a connected listener whose subscription to
        the run was confirmed before the cache was last (re)loaded. While it is False, reads
        still answer from the cache, which then holds this process's writes only.
        """
        listener, channel = self._listener, self._channel
        if listener is None or channel is None or self._state is None:
            return False
        return listener.is_fresh(channel) and listener.confirmation(channel) == self._synced

    def close(self) -> None:
        """Unbind the run, stop watching it; close the client if :meth:`from_url` made it."""
        with self._lock:
            self._abort_binding()
            if self._owns_client:
                self._client.close()

    def __enter__(self) -> RedisCheckpointBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisCheckpointBackend prefix={self._prefix!r} run={self._run_id}>"

    def _start_binding(self, keys: RunKeys) -> bytes | None:
        """Unbind, subscribe to ``keys``'s change channel and buffer its notices until
        :meth:`_finish_binding` (called with the lock held); the channel, or None."""
        self._unwatch()
        self._run_id = self._keys = self._state = self._state_channel = None
        self._key_list = []
        if self._listener is None:
            return None
        channel = keys.changes.encode()
        self._channel = channel
        self._buffer = []
        self._listener.watch(channel, self)
        return channel

    def _wait_subscribed(self, channel: bytes | None) -> int:
        """Wait (without the lock) for the subscription; its confirmation count, or 0."""
        if channel is None or self._listener is None:
            return 0
        return self._listener.wait_confirmed(channel, SUBSCRIBE_TIMEOUT)

    def _finish_binding(self, run_id: uuid.UUID, keys: RunKeys, state: RunState,
                        synced: int) -> None:  # fmt: skip
        """Bind the loaded state, then apply the notices that arrived meanwhile (with the lock
        held)."""
        buffered, self._buffer = self._buffer or [], None
        self._bind(run_id, keys, state, synced)
        for payload in buffered:
            self._handle_notice(payload)
        listener, channel = self._listener, self._channel
        if listener is not None and channel is not None:
            confirmation = listener.confirmation(channel)
            if confirmation > synced:  # subscribed only after the load: changes may be missing
                self._resync()
                self._synced = confirmation
                self._emit()

    def _abort_binding(self) -> None:
        self._buffer = None
        self._unwatch()
        self._run_id = self._keys = self._state = self._state_channel = None
        self._key_list = []

    def _unwatch(self) -> None:
        if self._listener is not None and self._channel is not None:
            self._listener.unwatch(self._channel, self)
        self._channel = None
        self._synced = 0

    def _bind(self, run_id: uuid.UUID, keys: RunKeys, state: RunState, synced: int) -> None:
        self._run_id, self._keys, self._key_list = run_id, keys, list(keys)
        self._state = state
        self._state_channel = keys.changes.encode()
        self._synced = synced
        self._emit()

    def _limit(self, blob: bytes, field: str) -> bytes:
        """``blob`` if within ``max_payload_size``, else :class:`PayloadTooLargeError`."""
        if len(blob) > self._max_payload_size:
            raise PayloadTooLargeError(field, len(blob), self._max_payload_size)
        return blob

    def _need_run(self, operation: str) -> RunState:
        state = self._state
        if state is None:
            raise RunNotBoundError(operation)
        return state

    def _call(self, script: Any, args: Sequence[Any], keys: list[str] | None = None) -> Any:
        key_list = keys or self._key_list
        try:
            return self._retry.call(lambda: script(keys=key_list, args=args))
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise translate_error(exc, run_id=self._run_id) from exc

    def _write(self, script: Any, args: Sequence[Any], keys: list[str] | None = None) -> Any:
        """Run a writing script once, exactly: the operation id is made before any attempt.

        With ``durability`` set, ``WAIT`` goes in the same round trip (a pipeline) and the
        number of replicas that acknowledged is kept for :meth:`_check_durable`.
        """
        self._op_seq += 1
        full = (self._writer_id, str(self._op_seq), *args)
        durability = self._durability
        if durability is None:
            return self._call(script, full, keys)
        key_list = keys or self._key_list

        def attempt() -> Any:
            pipe = self._client.pipeline(transaction=False)
            script(keys=key_list, args=full, client=pipe)
            pipe.execute_command("WAIT", durability.replicas, durability.timeout_ms)
            reply, acked = pipe.execute()
            self._acked = int(acked)
            return reply

        try:
            return self._retry.call(attempt)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise translate_error(exc, run_id=self._run_id) from exc

    def _check_durable(self) -> None:
        """Raise :class:`NotDurableError` when too few replicas acknowledged the last write."""
        durability, acked = self._durability, self._acked
        if durability is not None and acked is not None and acked < durability.replicas:
            self._acked = None
            raise NotDurableError(durability.replicas, acked)

    def _after_write(self, reply: Any) -> tuple[int, int, bool]:
        """(version, now, apply) for a write's reply.

        ``apply`` is True when the change is the next version of the cache (apply it); False
        when the cache already has it (from a notice) or was reloaded to include it. When
        other processes wrote in between, their notices were published before this reply:
        the listener gets a moment to apply them before the run is reloaded.
        """
        version, now = int(reply[0]), int(reply[1])
        state = self._state
        assert state is not None
        if version == state.version + 1:
            return version, now, True
        if version > state.version + 1 and self.cache_is_fresh:
            run_id = self._run_id
            self._changed.wait_for(  # releases the lock, so the listener can apply
                lambda: self._state is None or self._state.version >= version - 1, GAP_WAIT
            )
            if self._run_id != run_id or self._state is None:
                return version, now, False  # rebound or closed meanwhile: nothing to apply
            state = self._state
            if version == state.version + 1:
                return version, now, True
        if version > state.version:
            logger.debug("run %s: version %d after %d, reloading", self._run_id, version,
                         state.version)  # fmt: skip
            self._reload()
        return version, now, False

    def _reload(self) -> None:
        assert self._run_id is not None and self._keys is not None
        reply = self._call(self._scripts.load, ())
        if reply == 0 or reply is None:
            raise RunNotFoundError(self._run_id)
        self._state = RunState.from_load(self._run_id, self._keys, reply)

    def _emit(self) -> None:
        """Wake waiters and run the change callbacks (with the lock held)."""
        self._changed.notify_all()
        state = self._state
        if state is None or not self._callbacks:
            return
        for callback in list(self._callbacks.values()):
            try:
                callback(state.snapshot)
            except Exception:
                logger.exception("change callback %r failed", callback)

    # -- change notices (called by the listener thread) ------------------------------------

    def _on_notice(self, channel: bytes, payload: bytes) -> None:
        state = self._state
        if state is not None and channel == self._state_channel and not payload.endswith(b"1:d"):
            head = payload[: payload.find(b":") + 21]
            try:  # our own writes come back too: skip them without taking the lock
                length, _, rest = head.partition(b":")
                if int(rest[: int(length)]) <= state.version:
                    return
            except ValueError:
                pass
        with self._lock:
            if channel != self._channel:
                return
            if self._buffer is not None:  # the run is being loaded: applied once it is bound
                self._buffer.append(payload)
                return
            if self._state is None or channel != self._state_channel:
                return
            self._handle_notice(payload)

    def _handle_notice(self, payload: bytes) -> None:
        """Apply one notice of the bound run (with the lock held)."""
        state = self._state
        assert state is not None
        try:
            parts = parse_notice(payload)
            version, now, op = int(parts[0]), int(parts[1]), parts[2]
        except (ValueError, IndexError):
            logger.warning("run %s: unreadable change notice, reloading", self._run_id)
            self._resync()
            self._emit()
            return
        if op == b"d":  # the run was deleted: nothing left to load
            logger.warning("run %s was deleted; the cache is no longer fresh", self._run_id)
            self._synced = -1
            self._emit()
            return
        if version <= state.version:
            return
        if version == state.version + 1:
            try:
                applied = self._apply_notice(state, op, parts[3:], now, version)
            except (LuftRedisError, ValueError, IndexError):
                logger.warning("run %s: change notice not applicable, reloading",
                               self._run_id, exc_info=True)  # fmt: skip
                applied = False
            if not applied:
                self._resync()
        else:
            self._resync()
        self._emit()

    def _resync(self) -> None:
        """Reload after a missed notice; when that fails, report the cache as not fresh until
        the next (re)subscription reloads it."""
        try:
            self._reload()
        except LuftRedisError:
            logger.warning("run %s: reload after a missed notice failed; cache not fresh",
                           self._run_id, exc_info=True)  # fmt: skip
            self._synced = -1

    def _apply_notice(
        self, state: RunState, op: bytes, parts: list[bytes], now: int, version: int
    ) -> bool:
        keys = self._keys
        assert keys is not None and self._run_id is not None
        if op == b"e":
            count = int(parts[0])
            events = []
            for i in range(count):
                type_raw, entry_id, blob = parts[1 + 3 * i : 4 + 3 * i]
                events.append(codec.decode_event(
                    type_raw.decode(), blob, self._run_id, key=keys.events,
                    entry_id=entry_id.decode(),
                ))  # fmt: skip
            state.apply_events(events, now, version)
        elif op == b"r":
            state.apply_result(_result_from_args(parts, keys.results), now, version)
        elif op == b"s":
            state.apply_session(_session_from_args(parts), now, version)
        elif op == b"c":
            state.apply_status(t.CheckpointStatus(parts[0].decode()), now, version)
        else:
            return False
        return True

    def _on_subscribed(self, channel: bytes, confirmation: int) -> None:
        with self._lock:
            if channel != self._channel or self._buffer is not None or self._state is None:
                return  # (while binding, _finish_binding compares the confirmation itself)
            if confirmation > self._synced:
                # notices may have been missed before this subscription: load the run again
                try:
                    self._reload()
                except LuftRedisError:
                    logger.warning("run %s: reload after subscribing failed; cache not fresh",
                                   self._run_id, exc_info=True)  # fmt: skip
                    return
                self._synced = confirmation
                self._emit()

    # -- change API ------------------------------------------------------------------------

    def wait_for_change(
        self, after_version: int | None = None, timeout: float | None = None
    ) -> bool:
        """Block until the run's version passes ``after_version`` (default: the current one).

        True if it did, False when ``timeout`` seconds passed first. Changes by other
        processes arrive through the listener (``watch=True``).
        """
        self._need_run("wait_for_change")
        with self._changed:
            base = self.version if after_version is None else after_version
            return self._changed.wait_for(lambda: self.version > base, timeout)

    def subscribe(self, callback: Callable[[t.RunCheckpoint], None]) -> Callable[[], None]:
        """Call ``callback(checkpoint)`` after every change of the bound run; returns a
        function that unsubscribes.

        Callbacks run in the thread that saw the change (the listener's, or the writer's),
        with the backend's lock held: keep them short and do not block in them.
        """
        with self._lock:
            key = self._next_callback
            self._next_callback += 1
            self._callbacks[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks.pop(key, None)

        return unsubscribe

    # -- run lifecycle ---------------------------------------------------------------------

    def init_run(self, run_id: uuid.UUID, task: str, run_dir: str) -> None:
        """Create a new run and bind to it. :class:`RunExistsError` if it exists."""
        self._init(run_id, task, run_dir, None, with_meta=False)

    def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any
    ) -> None:
        """``init_run`` with ``workflow_meta`` (any JSON) stored, in one atomic step."""
        self._init(run_id, task, run_dir, workflow_meta, with_meta=True)

    def _init(self, run_id: Any, task: Any, run_dir: Any, meta: Any, *, with_meta: bool) -> None:
        rid = _check_uuid(run_id, "run_id")
        task = _check_str(task, "task")
        run_dir = _check_str(run_dir, "run_dir")
        meta = t.freeze_json(meta, "workflow_meta") if with_meta else None
        blob = None if meta is None else self._limit(codec.encode_json(meta), "workflow_meta")
        keys = run_keys(self._prefix, rid)
        with self._bind_lock:
            with self._lock:
                channel = self._start_binding(keys)
            synced = self._wait_subscribed(channel)
            with self._lock:
                try:
                    reply = self._write(
                        self._scripts.init_run,
                        (str(rid), task, run_dir, _opt(blob), SCHEMA_VERSION),
                        keys=list(keys),
                    )
                except BaseException:
                    self._abort_binding()
                    raise
                state = RunState(rid, task, run_dir, meta, int(reply[1]), int(reply[0]))
                self._finish_binding(rid, keys, state, synced)
        self._check_durable()

    def open_run(self, run_id: uuid.UUID) -> t.RunCheckpoint | None:
        """Load run ``run_id`` (not its event log) and bind to it; None if it does not exist."""
        rid = _check_uuid(run_id, "run_id")
        keys = run_keys(self._prefix, rid)
        with self._bind_lock:
            with self._lock:
                channel = self._start_binding(keys)
            try:
                # without the backend's lock: the listener, shared by every backend on the
                # client, must not wait for this load (notices meanwhile are buffered)
                synced = self._wait_subscribed(channel)
                reply = self._call(self._scripts.load, (), keys=list(keys))
                state = None if reply == 0 or reply is None else RunState.from_load(
                    rid, keys, reply)  # fmt: skip
            except BaseException:
                with self._lock:
                    self._abort_binding()
                raise
            with self._lock:
                if state is None:
                    self._abort_binding()
                    return None
                self._finish_binding(rid, keys, state, synced)
                return state.snapshot

    def delete_run(self, run_id: uuid.UUID | None = None) -> bool:
        """Delete a run (default: the bound one) with its event log; True if it existed.

        Every key of the run goes in one atomic step. Backends watching it are told: their
        caches stop being fresh, and their writes raise :class:`RunNotFoundError` (a run is
        never brought back by a late write; ``init_run`` makes a new one). This backend is
        unbound if it was bound to that run.
        """
        rid = self._run_id if run_id is None else _check_uuid(run_id, "run_id")
        if rid is None:
            raise RunNotBoundError("delete_run")
        keys = run_keys(self._prefix, rid)
        with self._lock:
            existed = self._call(self._scripts.delete_run, (), keys=list(keys))
            if rid == self._run_id:
                self._abort_binding()
        return bool(int(existed))

    def list_runs(self) -> list[uuid.UUID]:
        """The ids of every run stored under this prefix (SCAN of the keyspace), sorted."""
        found: set[uuid.UUID] = set()
        try:
            for raw in self._client.scan_iter(match=run_pattern(self._prefix), count=1000):
                key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                run_id = run_id_from_key(self._prefix, key)
                if run_id is not None:
                    found.add(run_id)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise translate_error(exc) from exc
        return sorted(found)

    # -- writes ----------------------------------------------------------------------------

    def append_event(self, event: t.AgentEvent) -> None:
        """Append ``event`` to the run's log and apply contract §5's rules, atomically."""
        self.append_events((event,))

    def append_events(self, events: Sequence[t.AgentEvent]) -> None:
        """Append ``events`` in order, applying §5's rules to each, as one atomic change.

        One round trip for the whole batch; either every event is stored or none is.
        """
        self._need_run("append_events")
        if isinstance(events, t.AgentEvent) or not isinstance(events, Iterable):
            raise ValidationError("events", f"expected a sequence of events, got {events!r:.80}")
        batch = list(events)
        if not batch:
            return
        with self._lock:  # the run-id checks hold for the run the write goes to
            args: list[Any] = [str(len(batch))]
            for i, event in enumerate(batch):
                args += self._event_args(event, f"events[{i}]" if len(batch) > 1 else "event")
            reply = self._write(self._scripts.append_events, args)
            version, now, apply = self._after_write(reply)
            state = self._need_run("append_events")
            if apply:
                state.apply_events(batch, now, version)
                self._check_echo(state, reply)
            self._emit()
        self._check_durable()

    def _event_args(self, event: Any, field: str) -> list[Any]:
        event = _check_type(event, t.AgentEvent, field)
        if event.run_id is not None and event.run_id != self._run_id:
            raise RunMismatchError(
                f"{field}.run_id", f"event of run {event.run_id} cannot go into run {self._run_id}"
            )
        if event.run_id is None and not isinstance(event, t.SignalReceived):
            raise ValidationError(f"{field}.run_id", "only signal_received may have a null run_id")
        rule: tuple[Any, ...] = ()
        if isinstance(event, t.AgentStarted):
            rule = (str(event.agent_id), str(event.phase_id))
        elif isinstance(event, t.AgentDone):
            total = event.tokens.total()
            if total > t.U64_MAX:
                raise ValidationError(f"{field}.tokens", "input + output exceeds 2^64-1")
            rule = (
                str(event.agent_id), event.status.cache_str, str(total),
                _opt(None if event.output is None else codec.encode_json(event.output)),
                _opt(codec.encode_findings(event.findings) if event.findings else None),
            )  # fmt: skip
        elif isinstance(event, t.PhaseStarted):
            rule = (
                str(event.phase_id), event.label, str(event.planned),
                _opt(event.description), _opt(event.role),
            )  # fmt: skip
        elif isinstance(event, t.PhaseDone):
            rule = (str(event.phase_id), str(event.ok), str(event.failed))
        elif isinstance(event, t.RunDone):
            total = event.total_tokens.total()
            if total > t.U64_MAX:
                raise ValidationError(f"{field}.total_tokens", "input + output exceeds 2^64-1")
            rule = (event.status.value, str(total))
        return [event.TYPE, self._limit(codec.encode_event(event), field), str(len(rule)), *rule]

    def _check_echo(self, state: RunState, reply: Any) -> None:
        """Compare the script's view of the run fields with the cache's; reload if they differ."""
        status, phase, total = (x.decode() if isinstance(x, bytes) else str(x) for x in reply[2:5])
        if (status, int(phase), int(total)) != (
            state.status.value, state.current_phase, state.total_tokens
        ):
            logger.warning("run %s: cache diverged from Redis, reloading", self._run_id)
            self._reload()

    def upsert_agent_result(self, cache: t.AgentResultCache) -> None:
        """Insert or replace ``agent_results[cache.agent_id]`` (no tokens, no event)."""
        self._need_run("upsert_agent_result")
        cache = _check_type(cache, t.AgentResultCache, "cache")
        args = (
            str(cache.agent_id), str(cache.phase_id), cache.status, str(cache.tokens),
            str(cache.completed_at),
            _opt(None if cache.output is None
                 else self._limit(codec.encode_json(cache.output), "cache.output")),
            _opt(self._limit(codec.encode_findings(cache.findings), "cache.findings")
                 if cache.findings else None),
            _opt(cache.cache_key_hash), _opt(cache.description), _opt(cache.role),
        )  # fmt: skip
        with self._lock:
            reply = self._write(self._scripts.upsert_agent_result, args)
            version, now, apply = self._after_write(reply)
            if apply:
                self._need_run("upsert_agent_result").apply_result(cache, now, version)
            self._emit()
        self._check_durable()

    def upsert_agent_session(self, session: t.AgentSessionCheckpoint) -> None:
        """Insert or replace ``agent_sessions[session.agent_id]``."""
        self._need_run("upsert_agent_session")
        session = _check_type(session, t.AgentSessionCheckpoint, "session")
        args = (
            str(session.agent_id), _opt(session.backend_id), _opt(session.protocol_session_id),
            session.session_id, session.status, str(session.updated_at),
            "true" if session.resumable else "false",
        )  # fmt: skip
        with self._lock:
            reply = self._write(self._scripts.upsert_agent_session, args)
            version, now, apply = self._after_write(reply)
            if apply:
                self._need_run("upsert_agent_session").apply_session(session, now, version)
            self._emit()
        self._check_durable()

    def cancel(self) -> None:
        """running -> cancelled; a completed or failed run is left as it is (no error)."""
        self._status_change("cancel", self._scripts.cancel)

    def reset_status_to_running(self) -> None:
        """failed/cancelled/running -> running; :class:`NotResumableError` on a completed run."""
        self._status_change("reset_status_to_running", self._scripts.reset_status_to_running)

    def _status_change(self, operation: str, script: Any) -> None:
        self._need_run(operation)
        with self._lock:
            reply = self._write(script, ())
            version, now, apply = self._after_write(reply)
            if apply:
                status = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
                self._need_run(operation).apply_status(t.CheckpointStatus(status), now, version)
            self._emit()
        self._check_durable()

    def save_checkpoint(self, checkpoint: t.RunCheckpoint) -> None:
        """Replace the run's whole state (not its event log) with ``checkpoint``, atomically."""
        self._need_run("save_checkpoint")
        cp = _check_type(checkpoint, t.RunCheckpoint, "checkpoint")
        if cp.run_id != self._run_id:
            raise RunMismatchError(
                "run_id", f"checkpoint of run {cp.run_id} cannot replace run {self._run_id}"
            )
        phase_ids = [p.phase_id for p in cp.completed_phases]
        if len(set(phase_ids)) != len(phase_ids):
            raise ValidationError("completed_phases", "phase ids must be unique")
        started = list(dict.fromkeys(cp.started_agent_ids))
        segments = finding_segments(cp)
        args: list[Any] = [
            cp.task, cp.status.value, str(cp.current_phase), str(cp.total_tokens),
            str(cp.created_at),
            _opt(None if cp.workflow_meta is None
                 else self._limit(codec.encode_json(cp.workflow_meta), "workflow_meta")),
            str(len(cp.completed_phases)),
        ]  # fmt: skip
        for p in cp.completed_phases:
            args += (str(p.phase_id), p.label, str(p.planned), str(p.ok), str(p.failed),
                     _opt(p.description), _opt(p.role))  # fmt: skip
        args.append(str(len(cp.agent_results)))
        for r in cp.agent_results.values():
            args += (
                str(r.agent_id), str(r.phase_id), r.status, str(r.tokens), str(r.completed_at),
                _opt(None if r.output is None else self._limit(
                    codec.encode_json(r.output), f"agent_results.{r.agent_id}.output")),
                _opt(self._limit(codec.encode_findings(r.findings),
                                 f"agent_results.{r.agent_id}.findings")
                     if r.findings else None),
                _opt(r.cache_key_hash), _opt(r.description), _opt(r.role),
            )  # fmt: skip
        args.append(str(len(cp.agent_sessions)))
        for sess in cp.agent_sessions.values():
            args += (
                str(sess.agent_id), _opt(sess.backend_id), _opt(sess.protocol_session_id),
                sess.session_id, sess.status, str(sess.updated_at),
                "true" if sess.resumable else "false",
            )  # fmt: skip
        args.append(str(len(started)))
        args += (str(a) for a in started)
        args.append(str(len(segments)))
        for seg, group in segments:
            args += (seg, codec.encode_findings(group))
        with self._lock:
            if cp.run_id != self._run_id:  # rebound by another thread meanwhile
                raise RunMismatchError(
                    "run_id", f"checkpoint of run {cp.run_id} cannot replace run {self._run_id}"
                )
            reply = self._write(self._scripts.save_checkpoint, args)
            version, now, apply = self._after_write(reply)
            if apply:
                self._need_run("save_checkpoint").apply_save(cp, segments, now, version)
            self._emit()
        self._check_durable()

    # -- reads -----------------------------------------------------------------------------

    def get_checkpoint(self) -> t.RunCheckpoint | None:
        """The current checkpoint from the in-process cache (no I/O); None when unbound."""
        state = self._state
        return state.snapshot if state is not None else None

    def get_findings(self) -> tuple[t.Finding, ...]:
        """The run's findings (contract §5, findings) from the cache; () when unbound."""
        state = self._state
        return state.snapshot.findings if state is not None else ()

    def can_resume(self) -> bool:
        """Status is running, failed or cancelled (from the cache); False when unbound."""
        state = self._state
        return state is not None and state.status is not t.CheckpointStatus.COMPLETED

    def get_event_log(self) -> list[t.AgentEvent]:
        """Every event of the run, in append order."""
        return list(self.iter_event_log())

    def iter_event_log(
        self, *, start: str = "-", page_size: int = DEFAULT_PAGE_SIZE
    ) -> Iterator[t.AgentEvent]:
        """The run's events in append order, fetched ``page_size`` entries per XRANGE.

        ``start`` is a stream id to begin at (inclusive), ``"-"`` for the beginning.
        """
        self._need_run("iter_event_log")
        if page_size < 1:
            raise ValidationError("page_size", "must be at least 1")
        run_id, keys = self._run_id, self._keys
        assert run_id is not None and keys is not None
        lower = start
        while True:
            try:
                page = self._client.xrange(keys.events, min=lower, max="+", count=page_size)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
                raise translate_error(exc, run_id=run_id) from exc
            for entry_id, fields in page:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                yield self._decode_entry(run_id, keys.events, eid, fields)
            if len(page) < page_size:
                return
            last = page[-1][0]
            lower = "(" + (last.decode() if isinstance(last, bytes) else str(last))

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
        appended from now on). With ``follow=True`` it waits for new events with
        ``XREAD BLOCK`` and stops once ``timeout`` seconds pass without one (``None``: never);
        with ``follow=False`` it stops at the end of the log.
        """
        self._need_run("iter_events")
        run_id, keys = self._run_id, self._keys
        assert run_id is not None and keys is not None
        last = "0-0" if from_id is None else from_id
        if last == "$":
            last = self._last_entry_id(keys.events)
        idle_since = time.monotonic()
        while True:
            block = block_ms if follow else None
            if follow and timeout is not None:
                left = timeout - (time.monotonic() - idle_since)
                if left <= 0:
                    return
                block = max(1, min(block_ms, int(left * 1000)))
            try:
                reply = self._client.xread({keys.events: last}, count=count, block=block)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
                raise translate_error(exc, run_id=run_id) from exc
            entries = _xread_entries(reply)
            for entry_id, fields in entries:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                last = eid
                yield LogEntry(eid, self._decode_entry(run_id, keys.events, eid, fields))
            if entries:
                idle_since = time.monotonic()
            elif not follow:
                return

    def _last_entry_id(self, key: str) -> str:
        try:
            newest = self._client.xrevrange(key, count=1)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise translate_error(exc, run_id=self._run_id) from exc
        if not newest:
            return "0-0"
        raw = newest[0][0]
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    @staticmethod
    def _decode_entry(run_id: uuid.UUID, key: str, eid: str, fields: Any) -> t.AgentEvent:
        type_raw, blob = fields.get(b"type"), fields.get(b"data")
        if not isinstance(type_raw, bytes) or not isinstance(blob, bytes):
            raise CorruptDataError(key, f"entry {eid}", "lacks its type or data field")
        return codec.decode_event(
            type_raw.decode("utf-8", "replace"), blob, run_id, key=key, entry_id=eid
        )


def _xread_entries(reply: Any) -> list[Any]:
    """The entries of an XREAD reply for one stream (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        out: list[Any] = []
        for value in reply.values():
            out.extend(value[0] if value and isinstance(value[0], list) else value)
        return out
    return [entry for _, entries in reply for entry in entries]


def _opt_arg(raw: bytes) -> bytes | None:
    if raw == b"n":
        return None
    if not raw.startswith(b"s"):
        raise ValueError("malformed optional value in a change notice")
    return raw[1:]


def _opt_text(raw: bytes) -> str | None:
    value = _opt_arg(raw)
    return None if value is None else value.decode()


def _result_from_args(a: list[bytes], key: str) -> t.AgentResultCache:
    """The AgentResultCache of an upsert_agent_result notice (the script's arguments)."""
    agent_id = uuid.UUID(a[0].decode())
    output, findings = _opt_arg(a[5]), _opt_arg(a[6])
    field = f"{agent_id}:"
    return t.AgentResultCache._trusted(
        agent_id=agent_id, phase_id=int(a[1]), status=a[2].decode(), tokens=int(a[3]),
        completed_at=int(a[4]),
        output=None if output is None else codec.decode_json(output, key=key,
                                                             field=field + "output"),
        findings=() if findings is None else codec.decode_findings(findings, key=key,
                                                                   field=field + "findings"),
        cache_key_hash=_opt_text(a[7]), description=_opt_text(a[8]), role=_opt_text(a[9]),
    )  # fmt: skip


def _session_from_args(a: list[bytes]) -> t.AgentSessionCheckpoint:
    """The AgentSessionCheckpoint of an upsert_agent_session notice."""
    return t.AgentSessionCheckpoint._trusted(
        agent_id=uuid.UUID(a[0].decode()), backend_id=_opt_text(a[1]),
        protocol_session_id=_opt_text(a[2]), session_id=a[3].decode(), status=a[4].decode(),
        updated_at=int(a[5]), resumable=a[6] == b"true",
    )  # fmt: skip
