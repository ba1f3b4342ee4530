"""``RedisCheckpointBackend``: luft's ``CheckpointBackend`` contract on Redis.

One backend serves one run at a time (``init_run``/``open_run`` bind it). Every state change is
one Lua script run atomically in Redis; reads of the checkpoint are answered from the in-process
:class:`~luft_redis.cache.RunState`. Many backends may share one client and its pool.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import redis
import redis.cluster

from . import codec
from . import types as t
from .cache import RunState, finding_segments
from .errors import (
    ConfigurationError,
    CorruptDataError,
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
from .scripts import Scripts, translate_error

__all__ = ["DEFAULT_PAGE_SIZE", "CheckpointBackend", "RedisCheckpointBackend"]

logger = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 1000
"""Stream entries fetched per XRANGE call by :meth:`RedisCheckpointBackend.iter_event_log`."""

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


class RedisCheckpointBackend:
    """luft's checkpoint backend on Redis.

    ``client`` is a redis-py ``Redis``, ``RedisCluster`` or fakeredis client created with
    ``decode_responses=False`` (the default); ``prefix`` namespaces the keys
    (``<prefix>:{<run-id>}:...``, see ``docs/redis-layout.md``).
    """

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX) -> None:
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
        self._lock = threading.RLock()
        self._run_id: uuid.UUID | None = None
        self._keys: RunKeys | None = None
        self._key_list: list[str] = []
        self._state: RunState | None = None
        self._owns_client = False

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, cluster: bool = False, **client_kwargs: Any
    ) -> RedisCheckpointBackend:
        """A backend with its own client for ``url`` (``redis://``, ``rediss://``, ``unix://``).

        ``cluster=True`` makes a ``RedisCluster`` client; ``client_kwargs`` go to the client.
        The client is closed by :meth:`close`.
        """
        client_kwargs["decode_responses"] = False
        client: Any
        if cluster:
            client = redis.cluster.RedisCluster.from_url(url, **client_kwargs)
        else:
            client = redis.Redis.from_url(url, **client_kwargs)
        backend = cls(client, prefix=prefix)
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

    def close(self) -> None:
        """Unbind the run; close the client if :meth:`from_url` made it."""
        with self._lock:
            self._run_id = self._keys = self._state = None
            self._key_list = []
            if self._owns_client:
                self._client.close()

    def __enter__(self) -> RedisCheckpointBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisCheckpointBackend prefix={self._prefix!r} run={self._run_id}>"

    def _bind(self, run_id: uuid.UUID) -> RunKeys:
        keys = run_keys(self._prefix, run_id)
        self._run_id, self._keys, self._key_list = run_id, keys, list(keys)
        return keys

    def _need_run(self, operation: str) -> RunState:
        state = self._state
        if state is None:
            raise RunNotBoundError(operation)
        return state

    def _call(self, script: Any, args: Sequence[Any], keys: list[str] | None = None) -> Any:
        try:
            return script(keys=keys or self._key_list, args=args)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise translate_error(exc, run_id=self._run_id) from exc

    def _after_write(self, reply: Any) -> tuple[int, int, bool]:
        """(version, now, in_sequence) of a script reply; reloads the state on a gap."""
        version, now = int(reply[0]), int(reply[1])
        state = self._state
        assert state is not None
        if version == state.version + 1:
            return version, now, True
        logger.debug("run %s: version %d after %d, reloading", self._run_id, version, state.version)
        self._reload()
        return version, now, False

    def _reload(self) -> None:
        assert self._run_id is not None and self._keys is not None
        reply = self._call(self._scripts.load, ())
        if reply == 0 or reply is None:
            raise RunNotFoundError(self._run_id)
        self._state = RunState.from_load(self._run_id, self._keys, reply)

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
        blob = None if meta is None else codec.encode_json(meta)
        keys = run_keys(self._prefix, rid)
        with self._lock:
            reply = self._call(
                self._scripts.init_run,
                (str(rid), task, run_dir, _opt(blob), SCHEMA_VERSION),
                keys=list(keys),
            )
            self._bind(rid)
            self._state = RunState(rid, task, run_dir, meta, int(reply[1]), int(reply[0]))

    def open_run(self, run_id: uuid.UUID) -> t.RunCheckpoint | None:
        """Load run ``run_id`` (not its event log) and bind to it; None if it does not exist."""
        rid = _check_uuid(run_id, "run_id")
        keys = run_keys(self._prefix, rid)
        with self._lock:
            reply = self._call(self._scripts.load, (), keys=list(keys))
            if reply == 0 or reply is None:
                return None
            state = RunState.from_load(rid, keys, reply)
            self._bind(rid)
            self._state = state
            return state.snapshot

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
        state = self._need_run("append_event")
        event = _check_type(event, t.AgentEvent, "event")
        if event.run_id is not None and event.run_id != self._run_id:
            raise RunMismatchError(
                "run_id", f"event of run {event.run_id} cannot go into run {self._run_id}"
            )
        if event.run_id is None and not isinstance(event, t.SignalReceived):
            raise ValidationError("run_id", "only signal_received may have a null run_id")
        args: list[Any] = [event.TYPE, codec.encode_event(event)]
        if isinstance(event, t.AgentStarted):
            args += (str(event.agent_id), str(event.phase_id))
        elif isinstance(event, t.AgentDone):
            total = event.tokens.total()
            if total > t.U64_MAX:
                raise ValidationError("tokens", "input + output exceeds 2^64-1")
            args += (
                str(event.agent_id), event.status.cache_str, str(total),
                _opt(None if event.output is None else codec.encode_json(event.output)),
                _opt(codec.encode_findings(event.findings) if event.findings else None),
            )  # fmt: skip
        elif isinstance(event, t.PhaseStarted):
            args += (
                str(event.phase_id), event.label, str(event.planned),
                _opt(event.description), _opt(event.role),
            )  # fmt: skip
        elif isinstance(event, t.PhaseDone):
            args += (str(event.phase_id), str(event.ok), str(event.failed))
        elif isinstance(event, t.RunDone):
            total = event.total_tokens.total()
            if total > t.U64_MAX:
                raise ValidationError("total_tokens", "input + output exceeds 2^64-1")
            args += (event.status.value, str(total))
        with self._lock:
            reply = self._call(self._scripts.append_event, args)
            version, now, in_sequence = self._after_write(reply)
            state = self._need_run("append_event")
            if in_sequence:
                state.apply_event(event, now, version)
                self._check_echo(state, reply)

    def _check_echo(self, state: RunState, reply: Any) -> None:
        """Compare the script's view of the run fields with the cache's; reload if they differ."""
        status, phase, total = (x.decode() if isinstance(x, bytes) else str(x) for x in reply[3:6])
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
            _opt(None if cache.output is None else codec.encode_json(cache.output)),
            _opt(codec.encode_findings(cache.findings) if cache.findings else None),
            _opt(cache.cache_key_hash), _opt(cache.description), _opt(cache.role),
        )  # fmt: skip
        with self._lock:
            reply = self._call(self._scripts.upsert_agent_result, args)
            version, now, in_sequence = self._after_write(reply)
            if in_sequence:
                self._need_run("upsert_agent_result").apply_result(cache, now, version)

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
            reply = self._call(self._scripts.upsert_agent_session, args)
            version, now, in_sequence = self._after_write(reply)
            if in_sequence:
                self._need_run("upsert_agent_session").apply_session(session, now, version)

    def cancel(self) -> None:
        """running -> cancelled; a completed or failed run is left as it is (no error)."""
        self._status_change("cancel", self._scripts.cancel)

    def reset_status_to_running(self) -> None:
        """failed/cancelled/running -> running; :class:`NotResumableError` on a completed run."""
        self._status_change("reset_status_to_running", self._scripts.reset_status_to_running)

    def _status_change(self, operation: str, script: Any) -> None:
        self._need_run(operation)
        with self._lock:
            reply = self._call(script, ())
            state = self._need_run(operation)
            version = int(reply[0])
            if version == state.version:
                return  # no change
            version, now, in_sequence = self._after_write(reply)
            if in_sequence:
                status = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
                self._need_run(operation).apply_status(t.CheckpointStatus(status), now, version)

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
            _opt(None if cp.workflow_meta is None else codec.encode_json(cp.workflow_meta)),
            str(len(cp.completed_phases)),
        ]  # fmt: skip
        for p in cp.completed_phases:
            args += (str(p.phase_id), p.label, str(p.planned), str(p.ok), str(p.failed),
                     _opt(p.description), _opt(p.role))  # fmt: skip
        args.append(str(len(cp.agent_results)))
        for r in cp.agent_results.values():
            args += (
                str(r.agent_id), str(r.phase_id), r.status, str(r.tokens), str(r.completed_at),
                _opt(None if r.output is None else codec.encode_json(r.output)),
                _opt(codec.encode_findings(r.findings) if r.findings else None),
                _opt(r.cache_key_hash), _opt(r.description), _opt(r.role),
            )  # fmt: skip
        args.append(str(len(cp.agent_sessions)))
        for s in cp.agent_sessions.values():
            args += (
                str(s.agent_id), _opt(s.backend_id), _opt(s.protocol_session_id), s.session_id,
                s.status, str(s.updated_at), "true" if s.resumable else "false",
            )  # fmt: skip
        args.append(str(len(started)))
        args += (str(a) for a in started)
        args.append(str(len(segments)))
        for seg, group in segments:
            args += (seg, codec.encode_findings(group))
        with self._lock:
            reply = self._call(self._scripts.save_checkpoint, args)
            version, now, in_sequence = self._after_write(reply)
            if in_sequence:
                self._need_run("save_checkpoint").apply_save(cp, segments, now, version)

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
                yield self._decode_entry(run_id, keys.events, entry_id, fields)
            if len(page) < page_size:
                return
            last = page[-1][0]
            lower = "(" + (last.decode() if isinstance(last, bytes) else str(last))

    @staticmethod
    def _decode_entry(run_id: uuid.UUID, key: str, entry_id: Any, fields: Any) -> t.AgentEvent:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        type_raw, blob = fields.get(b"type"), fields.get(b"data")
        if not isinstance(type_raw, bytes) or not isinstance(blob, bytes):
            raise CorruptDataError(key, f"entry {eid}", "lacks its type or data field")
        return codec.decode_event(
            type_raw.decode("utf-8", "replace"), blob, run_id, key=key, entry_id=eid
        )
