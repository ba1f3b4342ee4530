"""What a backend builds on without doing I/O: options, the binding, and the reads.

No method here talks to Redis. :class:`FrontEnd` holds a backend's options and its current
:class:`Binding`, and answers the reads of luft's trait (``get_checkpoint()``,
``get_findings()``, ``can_resume()``) and the plain properties from the cache. The backend's
I/O (:mod:`luft_redis.asyncio.backend`, and the sync :mod:`luft_redis._sync.backend` generated from
it) is built on it; it imports :mod:`luft_redis.retry` and :mod:`luft_redis.tracing` only for
their checks and types (which errors are redis-py's, which refusals are final, the tracer).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from . import types as t
from .cache import RunCache
from .connect import Durability, is_cluster
from .errors import ConfigurationError, LuftRedisError, NotDurableError, RunNotBoundError
from .keys import RunKeys, check_prefix
from .pools import Membership
from .retention_core import RetentionOptions
from .retry import NO_RETRY, REDIS_ERRORS, RetryPolicy, is_access_error
from .scripts import library, translate_error
from .stats import BackendStats, Counters
from .tracing import OperationTracer
from .watch import Watch
from .wire import Encoder

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "GAP_WAIT",
    "REDIS_ERRORS",
    "REFRESH_RETRY_DELAY",
    "SUBSCRIBE_TIMEOUT",
    "Binding",
    "FrontEnd",
]

DEFAULT_PAGE_SIZE = 1000
"""Stream entries fetched per XRANGE call by ``iter_event_log``."""

SUBSCRIBE_TIMEOUT = 2.0
"""Seconds ``init_run``/``open_run`` wait for the change subscription before loading anyway
(the cache then reports ``cache_is_fresh == False`` until the listener catches up)."""

GAP_WAIT = 0.1
"""Seconds a write whose reply is ahead of the cache waits for the notices of the versions in
between (published before the reply) before it reloads the run instead."""

REFRESH_RETRY_DELAY = 0.2
"""Seconds the refresher waits before it tries a failed reload again."""



class Binding:
    """The run a backend is bound to: its keys, cache, watch and listener (replaced whole on
    rebind, so a concurrent operation keeps the run it started with)."""

    __slots__ = ("cache", "channel", "followers", "key_list", "keys", "listener", "pool",
                 "run_id", "watch")  # fmt: skip

    def __init__(self, run_id: uuid.UUID, keys: RunKeys, cache: RunCache) -> None:
        self.run_id = run_id
        self.keys = keys
        self.key_list = list(keys)
        self.cache = cache
        self.channel = keys.changes.encode()
        self.watch: Watch | None = None
        self.listener: Any = None
        """The front end's change listener carrying ``watch`` (None with ``watch=False``,
        but while a claim waits: see ``followers``)."""
        self.followers = 0
        """Claims waiting on a ``watch=False`` backend: they watch the run meanwhile."""
        self.pool: Membership | None = None
        """The run's pool membership as last read or written here (luft_redis.pools): a
        write that may give the run claimable work wakes it in that pool."""


class _Unbound:
    """Stands for the cache while no run is bound: reads find no snapshot."""

    __slots__ = ()
    current: t.RunCheckpoint | None = None


_UNBOUND = _Unbound()


class FrontEnd:
    """The I/O-free half of a backend; see the module docstring."""

    _binding: Binding | None
    _fork: int
    """The fork generation (forks.fork_generation()) this backend last adopted."""

    def _configure(
        self,
        client: Any,
        *,
        prefix: str,
        watch: bool,
        retry: RetryPolicy | None,
        durability: Durability | None,
        max_payload_size: int,
        max_staleness: float,
    ) -> None:
        """Check and keep the options both front ends take (ConfigurationError)."""
        self._client = client
        self._prefix = check_prefix(prefix)
        self._library = library()
        self._scripts = self._library.ops
        self._cluster = is_cluster(client)
        self._retry = retry if retry is not None else NO_RETRY
        self._durability = durability
        if max_payload_size < 1:
            raise ConfigurationError("max_payload_size must be positive")
        if not max_staleness > 0:
            raise ConfigurationError("max_staleness must be positive")
        self._encoder = Encoder(max_payload_size)
        self._max_staleness = float(max_staleness)
        self._watching = watch
        self._emitted: tuple[str, int] | None = None
        self._binding = None
        self._reader: RunCache | _Unbound = _UNBOUND
        self._owns_client = False
        self._counters = Counters()
        self._tracer = OperationTracer(client, self._prefix)

    def _check_fork(self) -> None:
        """What a front end does when used in a forked child (before any operation)."""
        raise NotImplementedError

    # -- retention (see luft_redis.retention) ----------------------------------------------

    _retention: RetentionOptions = RetentionOptions()

    def _configure_retention(self, expire_finished_after: Any, max_events: Any) -> None:
        """Check and keep the retention options (ConfigurationError)."""
        self._retention = RetentionOptions.make(expire_finished_after, max_events)

    def _with_options(self, args: Any, fence: str) -> Any:
        """A writing script's arguments with its two option slots appended: ``fence`` and the
        retention options (``lua/includes/options.lua``)."""
        return (*args, fence, self._retention.script_arg)

    @property
    def expire_finished_after(self) -> dt.timedelta | None:
        """The TTL a run gets when this backend finishes it (None: never expires)."""
        return self._retention.expire_finished_after

    @property
    def max_events(self) -> int | None:
        """This backend's appends trim the event log to about this many entries (None: never)."""
        return self._retention.max_events

    @staticmethod
    def _may_have_expired(binding: Binding) -> bool:
        """The cached run is finished: Redis may have expired it since, without a notice (any
        backend may have set a TTL), so ``sync()`` asks Redis."""
        snapshot = binding.cache.snapshot()
        return snapshot is not None and snapshot.status is not t.CheckpointStatus.RUNNING

    @property
    def log_trimmed(self) -> bool:
        """True when the bound run's event log lost its oldest entries to ``max_events``
        trimming (by any backend), so :meth:`get_event_log` no longer returns the whole log.

        From the cache (no I/O): the run field ``log_trimmed``, set by the append that first
        trimmed the log and carried to every process by the change notices. False when
        unbound."""
        binding = self._binding
        state = binding.cache.state() if binding is not None else None
        return state is not None and state.log_trimmed

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
        binding = self._binding
        return binding.run_id if binding else None

    @property
    def keys(self) -> RunKeys | None:
        """The Redis keys of the bound run, or None."""
        binding = self._binding
        return binding.keys if binding else None

    @property
    def version(self) -> int:
        """The run's change counter as this process last saw it (0 when unbound)."""
        binding = self._binding
        return binding.cache.tip[1] if binding else 0

    @property
    def max_staleness(self) -> float:
        """Seconds: the bound behind :attr:`cache_is_fresh`."""
        return self._max_staleness

    def _fresh(self, binding: Binding | None) -> bool:
        """The cache can vouch for itself (see ``cache_is_fresh``)."""
        if binding is None or binding.listener is None:
            return False
        return binding.cache.synced and bool(
            binding.listener.healthy(binding.channel, self._max_staleness)
        )

    def _need_run(self, operation: str) -> Binding:
        self._check_fork()
        binding = self._binding
        if binding is None:
            raise RunNotBoundError(operation)
        return binding

    def _refused(self, listener: Any, run_id: uuid.UUID) -> LuftRedisError | None:
        """The typed error when the change subscription was refused for good (a password,
        an ACL or TLS: see retry.is_access_error), else None (a transient failure: the
        listener keeps trying and the load's retry policy decides)."""
        failure = getattr(listener, "failure", None)
        if failure is None or not is_access_error(failure):
            return None
        error = translate_error(failure, run_id=run_id, prefix=self._prefix, command="SSUBSCRIBE")
        error.__cause__ = failure
        return error

    def _check_durable(self, acked: int | None) -> None:
        """NotDurableError when a durable write reached fewer replicas than asked for."""
        durability = self._durability
        if durability is not None and acked is not None and acked < durability.replicas:
            raise NotDurableError(durability.replicas, acked)

    # -- the reads of luft's trait: from the cache, never I/O ------------------------------

    def get_checkpoint(self) -> t.RunCheckpoint | None:
        """The current checkpoint from the in-process cache (no I/O); None when unbound."""
        snapshot = self._reader.current  # None when unbound, queued changes, or forked
        if snapshot is not None:
            return snapshot
        self._check_fork()
        binding = self._binding
        return binding.cache.snapshot() if binding is not None else None

    def get_findings(self) -> tuple[t.Finding, ...]:
        """The run's findings (contract §5, findings) from the cache; () when unbound."""
        snapshot = self.get_checkpoint()
        return snapshot.findings if snapshot is not None else ()

    def can_resume(self) -> bool:
        """Status is running, failed or cancelled (from the cache); False when unbound."""
        snapshot = self.get_checkpoint()
        return snapshot is not None and snapshot.status is not t.CheckpointStatus.COMPLETED

    # -- observability ---------------------------------------------------------------------

    def stats(self) -> BackendStats:
        """This backend's counters (no I/O; see :mod:`luft_redis.stats` for each field)."""
        binding = self._binding
        listener = binding.listener if binding is not None else None
        age = listener.health_age(binding.channel) if listener is not None and binding else None
        return self._counters.snapshot(age)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} prefix={self._prefix!r} run={self.run_id}>"
