"""The in-process copy of one run's checkpoint, kept by applying what the server says changed.

Two layers, neither of which does any I/O:

* :class:`RunState` is the run decoded as of one ``(incarnation, version)``. It changes only by
  applying a script's :class:`~luft_redis.delta.Delta`, record by record, through the same
  decoders that :meth:`RunState.from_load` uses for a whole load. It knows no state rule: the
  rules of contract §5 live in the Lua scripts alone.
* :class:`RunCache` is what a backend holds: the last decoded state plus the chain of deltas
  received since (from its own writes' replies and other processes' notices), applied lazily
  when somebody reads. It accepts a delta only when the delta's "before" equals the chain's
  tip; anything else (a gap, another incarnation, an unknown format) marks the cache stale, and
  the front end reloads it. See ``docs/coherence.md`` and ``../shared/design/coherence.md``.

Reads are O(1) when nothing is pending: the state keeps an immutable
:class:`~luft_redis.types.RunCheckpoint` snapshot built from persistent maps
(``immutables.Map``, handed out wrapped in O(1) as :class:`~luft_redis.types.FrozenMap`), so a
change to one agent costs O(log n).
"""

from __future__ import annotations

import collections
import enum
import gc
import itertools
import logging
import operator
import re
import threading
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import immutables

from . import codec
from . import types as t
from .delta import Delta
from .errors import CorruptDataError
from .forks import on_fork
from .keys import SCHEMA_VERSION, RunKeys

__all__ = ["Offer", "RunCache", "RunState", "finding_segments"]

Segment = tuple[str, tuple[t.Finding, ...]]

logger = logging.getLogger(__name__)


class RunState:
    """One run's checkpoint as of ``(incarnation, version)``; see the module docstring."""

    __slots__ = (
        "_findings",
        "_phases",
        "_segments",
        "_started",
        "_unbuilt",
        "created_at",
        "current_phase",
        "incarnation",
        "keys",
        "log_trimmed",
        "results",
        "run_dir",
        "run_id",
        "sessions",
        "snapshot",
        "status",
        "task",
        "total_tokens",
        "updated_at",
        "version",
        "workflow_meta",
    )

    def __init__(self, run_id: uuid.UUID, keys: RunKeys) -> None:
        self.run_id = run_id
        self.keys = keys
        self.incarnation = ""
        self.version = 0
        self.task = ""
        self.run_dir = ""
        self.workflow_meta: Any = None
        self.status = t.CheckpointStatus.RUNNING
        self.current_phase = 0
        self.total_tokens = 0
        self.created_at = 0
        self.updated_at = 0
        self.log_trimmed = False
        """The run field log_trimmed (retention: the event log lost its oldest entries)."""
        self.results: immutables.Map[uuid.UUID, t.AgentResultCache] = immutables.Map()
        self.sessions: immutables.Map[uuid.UUID, t.AgentSessionCheckpoint] = immutables.Map()
        self._phases: dict[int, t.PhaseSummary] = {}
        self._started: dict[uuid.UUID, None] = {}
        self._segments: dict[str, tuple[t.Finding, ...]] = {}
        self._findings: tuple[t.Finding, ...] = ()
        self._unbuilt: tuple[bool, bool] | None = None
        """Set while ``snapshot`` lags the state (deltas applied with ``build=False``):
        whether the phases and the started agents changed since it was built."""
        self.snapshot = self._build()

    def _build(self, phases: bool = True, started: bool = True) -> t.RunCheckpoint:
        """The snapshot of the state; the phase and started tuples of the previous snapshot
        are reused unless ``phases``/``started`` say they changed (they are O(n) to copy)."""
        old = getattr(self, "snapshot", None)
        return t.RunCheckpoint._trusted(
            run_id=self.run_id,
            task=self.task,
            status=self.status,
            current_phase=self.current_phase,
            completed_phases=tuple(self._phases.values()) if phases or old is None
            else old.completed_phases,
            agent_results=t.FrozenMap._wrap(self.results),
            agent_sessions=old.agent_sessions  # unchanged (most changes touch no session)
            if old is not None and old.agent_sessions._map is self.sessions
            else t.FrozenMap._wrap(self.sessions),
            findings=self._findings,
            total_tokens=self.total_tokens,
            created_at=self.created_at,
            updated_at=self.updated_at,
            workflow_meta=self.workflow_meta,
            started_agent_ids=tuple(self._started) if started or old is None
            else old.started_agent_ids,
        )

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def from_load(cls, run_id: uuid.UUID, keys: RunKeys, reply: Sequence[Any]) -> RunState:
        """Decode the reply of load-12.lua (or a Z record), checking every field
        (:class:`CorruptDataError` naming key and field).

        A big reply is decoded with the cyclic garbage collector paused (when it was on):
        the decode allocates a record per result and finding, none of them in a cycle, and
        each collection those allocations trigger would traverse the reply's lists and every
        record made so far again (a fifth of the decode of 10,000 results)."""
        size = len(reply[2]) if isinstance(reply, list) and len(reply) == 7 and isinstance(
            reply[2], list) else 0  # fmt: skip
        if size < PAUSE_GC_FIELDS or not gc.isenabled():
            return _Loader(run_id, keys).load(reply)
        gc.disable()
        try:
            return _Loader(run_id, keys).load(reply)
        finally:
            gc.enable()

    @classmethod
    def from_whole(cls, run_id: uuid.UUID, keys: RunKeys, delta: Delta) -> RunState:
        """The state carried by a whole-state delta (init_run, save_checkpoint)."""
        return cls.from_load(run_id, keys, _whole_parts(delta, keys))

    # -- applying deltas -------------------------------------------------------------------

    def finish(self) -> None:
        """Build ``snapshot`` if deltas were applied without building it."""
        unbuilt = self._unbuilt
        if unbuilt is not None:
            self._unbuilt = None
            self.snapshot = self._build(phases=unbuilt[0], started=unbuilt[1])

    def apply(self, delta: Delta, build: bool = True) -> RunState:
        """The state after ``delta`` (whose "before" is this state): this object, changed in
        place, or a new one for a whole-state delta. With ``build=False`` the snapshot is
        left for :meth:`finish` (or the next ``apply``) to build: a batch of deltas builds
        it once.

        Every record is decoded before anything changes, so a delta that cannot be read
        (CorruptDataError/ValueError: the caller reloads) leaves the state as it was.
        """
        if delta.whole:
            return RunState.from_whole(self.run_id, self.keys, delta)
        parts = delta.records()
        loader = _Loader(self.run_id, self.keys, delta.sent)
        keys = self.keys
        run_fields: dict[str, Any] = {}
        results: list[tuple[uuid.UUID, t.AgentResultCache | None]] = []
        sessions: list[tuple[uuid.UUID, t.AgentSessionCheckpoint | None]] = []
        phases: list[tuple[int, t.PhaseSummary | None]] = []
        started: list[uuid.UUID] = []
        segments: list[tuple[str, tuple[t.Finding, ...] | None]] = []
        blobs: dict[str, bytes] = {}  # F records' blobs by segment (an E res may name one)
        i, n = 0, len(parts)
        while i < n:
            tag = parts[i]
            if tag == b"R":
                name, raw = parts[i + 1].decode(), parts[i + 2]
                hi = _RUN_UINTS.get(name)
                if hi is not None and raw.isdigit() and (raw[0] != 48 or len(raw) == 1):
                    value = int(raw)  # the common case: a number (checked slowly otherwise)
                    run_fields[name] = value if value <= hi else self._run_field(
                        loader, name, raw)  # fmt: skip
                else:
                    run_fields[name] = self._run_field(loader, name, raw)
                i += 3
            elif tag == b"E":
                section, entity, count = parts[i + 1], parts[i + 2].decode(), int(parts[i + 3])
                end = i + 4 + 2 * count
                if end > n or count < 0:
                    raise ValueError("truncated entity record")
                attrs = dict(zip(parts[i + 4 : end : 2], parts[i + 5 : end : 2], strict=True))
                i = end
                if section == b"res":
                    aid = loader._agent_id(keys.results, entity)
                    if attrs.get(b"findings") == b"":
                        if entity not in blobs:
                            raise ValueError(f"E res {entity} names a findings blob not sent")
                        attrs[b"findings"] = blobs[entity]
                    results.append((aid, loader._result(aid, entity, attrs) if attrs else None))
                elif section == b"ses":
                    aid = loader._agent_id(keys.sessions, entity)
                    fields = {f"{entity}:{name.decode()}": value for name, value in attrs.items()}
                    sessions.append((aid, loader._sessions(fields)[aid] if fields else None))
                elif section == b"ph":
                    pid = loader._uint(keys.phases, entity, entity.encode(), t.U32_MAX)
                    fields = {f"{entity}:{name.decode()}": value for name, value in attrs.items()}
                    phases.append((pid, loader._phases(fields)[pid] if fields else None))
                else:
                    raise ValueError(f"unknown delta section {section[:8]!r}")
            elif tag == b"S":
                started += loader._started({parts[i + 1].decode(): parts[i + 2]})
                i += 3
            elif tag == b"F":
                seg = parts[i + 1].decode()
                blobs[seg] = parts[i + 2]
                found = loader._findings(parts[i + 2], key=keys.findings, field=seg)
                segments.append((seg, found))
                i += 3
            elif tag == b"X":
                segments.append((parts[i + 1].decode(), None))
                i += 2
            else:
                raise ValueError(f"unknown delta record {tag[:8]!r}")
        # everything decoded: change the state (nothing below can fail)
        for name, value in run_fields.items():
            if name in _RUN_ATTRS:
                setattr(self, name, value)
        for aid, result in results:
            self.results = self.results.set(aid, result) if result else self.results.delete(aid)
        for aid, session in sessions:
            self.sessions = (self.sessions.set(aid, session) if session
                             else self.sessions.delete(aid))  # fmt: skip
        for pid, phase in phases:
            if phase is None:
                self._phases.pop(pid, None)
            else:
                self._phases[pid] = phase
        for aid in started:
            self._started.setdefault(aid)
        rebuild = False
        for seg, group in segments:
            if group is None:
                rebuild = self._segments.pop(seg, None) is not None or rebuild
            elif seg in self._segments or rebuild:
                self._segments[seg] = group
                rebuild = True
            else:  # a new segment goes at the end: no rebuild of the whole list
                self._segments[seg] = group
                self._findings += group
        if rebuild:
            self._findings = tuple(itertools.chain.from_iterable(self._segments.values()))
        unbuilt = self._unbuilt
        if unbuilt is not None:
            phases_changed = unbuilt[0] or bool(phases)
            started_changed = unbuilt[1] or bool(started)
        else:
            phases_changed, started_changed = bool(phases), bool(started)
        if build:
            self._unbuilt = None
            self.snapshot = self._build(phases=phases_changed, started=started_changed)
        else:
            self._unbuilt = (phases_changed, started_changed)
        return self

    def rebuild(self) -> t.RunCheckpoint:
        """Build ``snapshot`` anew from the state (after fields were set directly, as a
        history fold sets ``version`` and ``updated_at``) and return it."""
        self._unbuilt = None
        self.snapshot = self._build()
        return self.snapshot

    def _run_field(self, loader: _Loader, name: str, raw: bytes) -> Any:
        k = self.keys.run
        if name == "status":
            return loader._status(raw)
        if name == "current_phase":
            return loader._uint(k, name, raw, t.U32_MAX)
        if name in ("version", "updated_at", "total_tokens", "created_at"):
            return loader._uint(k, name, raw)
        if name == "workflow_meta":
            return codec.decode_json(raw, key=k, field=name)
        if name == "log_trimmed":
            return loader._flag(k, name, raw)
        return loader._text(k, name, raw)


PAUSE_GC_FIELDS = 20_000
"""Items of the results hash's reply (field names and values: 9 a result) from which a load
is decoded with the cyclic garbage collector paused (:meth:`RunState.from_load`)."""

_RESULT_STATUS = {status.encode(): status for status in t.AGENT_RESULT_STATUSES}
"""A result's stored status -> its text (the valid ones; anything else is checked slowly)."""

_RUN_UINTS = {
    "version": t.U64_MAX, "updated_at": t.U64_MAX, "total_tokens": t.U64_MAX,
    "created_at": t.U64_MAX, "current_phase": t.U32_MAX,
}  # fmt: skip
"""Run fields that are unsigned integers, with their largest value (see ``_run_field``)."""

_RUN_ATTRS = frozenset({
    "version", "updated_at", "status", "current_phase", "total_tokens", "incarnation",
    "created_at", "task", "workflow_meta", "log_trimmed",
})  # fmt: skip
"""Run hash fields that are part of the cached state (others: schema, run_id, run_dir,
phases, are not checkpoint fields)."""


_RESULT_COLUMNS = (
    "status", "phase_id", "tokens", "completed_at", "output", "findings", *t.RESULT_TEXT_FIELDS,
)  # fmt: skip
"""Every attribute a result has in the results hash (docs/redis-layout.md)."""

_RESULT_TEXTS = [(name, name.encode()) for name in t.RESULT_TEXT_FIELDS]
"""A result's optional text attributes, with their names as bytes (the reply's)."""
_RESULT_CODE = {b":" + attr.encode(): i for i, attr in enumerate(_RESULT_COLUMNS)}
_ID_PART, _ATTR_PART = slice(0, 36), slice(36, None)

_RESULT_SETTERS = list(zip(
    t.slot_setters(t.AgentResultCache, [f.name for f in t.AgentResultCache._field_specs()]),
    [f.name for f in t.AgentResultCache._field_specs()], strict=True,
))  # fmt: skip
_UUID_INT, _UUID_SAFE = t.slot_setters(uuid.UUID, ("int", "is_safe"))
_UUID_TEXT = rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UUIDS = re.compile(_UUID_TEXT + rb"(?:\n" + _UUID_TEXT + rb")*")
"""Canonical agent ids (``str(uuid)``), one a line."""
_STARTED = re.compile(rb"(?:0|[1-9][0-9]{0,19}) (?:0|[1-9][0-9]{0,9})"
                      rb"(?:\n(?:0|[1-9][0-9]{0,19}) (?:0|[1-9][0-9]{0,9}))*")
"""The values of the started hash, ``<seq> <phase_id>``, one a line."""
_UINTS = re.compile(rb"(?:0|[1-9][0-9]{0,19})(?:\n(?:0|[1-9][0-9]{0,19}))*")


def _uints(col: list[bytes | None], hi: int) -> list[int] | None:
    """The values of a column of stored unsigned integers (all present, canonical decimal,
    at most ``hi``), checked in one regex pass; else None."""
    if not col:
        return []
    joined = b"\n".join(col)  # type: ignore[arg-type]  # TypeError on an absent one
    if joined.count(b"\n") != len(col) - 1 or not _UINTS.fullmatch(joined):
        return None
    values = list(map(int, col))  # type: ignore[arg-type]
    return values if max(values) <= hi else None


def _texts(col: list[bytes | None]) -> list[str | None]:
    """A column of optional text attributes (UnicodeDecodeError on one that is not UTF-8)."""
    if None not in col:
        return list(map(bytes.decode, col))  # type: ignore[arg-type]
    return [None if v is None else v.decode() for v in col]


def _decoded(col: list[bytes | None], many: Any, one: Any) -> list[Any] | None:
    """A column of optional blobs decoded by ``many`` (codec's bulk decoders), the blobs it
    leaves out by ``one`` (the per-blob decoder); None when one of them is corrupt (the
    per-result path then names it)."""
    blobs = [v for v in col if v is not None]
    found: dict[bytes, Any] = many(blobs)
    if len(found) != len(set(blobs)):
        for blob in blobs:
            if blob not in found:
                try:
                    found[blob] = one(blob, key="", field="")
                except CorruptDataError:
                    return None
    return [None if v is None else found[v] for v in col]


def _whole_parts(delta: Delta, keys: RunKeys) -> list[Any]:
    """The 7 counted parts of a Z record, shaped as load-12.lua's reply."""
    parts = delta.records()
    if not parts or parts[0] != b"Z":
        raise CorruptDataError(keys.run, "", f"{delta.op!r} delta lacks the whole state")
    out: list[Any] = []
    i = 1
    for _ in range(7):
        count = int(parts[i])
        out.append(parts[i + 1 : i + 1 + count])
        i += 1 + count
    if i != len(parts):
        raise ValueError("whole-state record has trailing parts")
    return out


RECENT = 64
"""How many applied deltas :attr:`RunCache.recent` remembers."""


class Offer(enum.Enum):
    """What :meth:`RunCache.offer` did with a delta."""

    APPLIED = "applied"
    """It continues the chain: queued, and counted as applied."""
    OLD = "old"
    """The cache already has it (or a later state of the same incarnation)."""
    BEHIND = "behind"
    """It comes after versions the cache lacks (same incarnation): wait for them, or reload."""
    FOREIGN = "foreign"
    """Another incarnation, a deleted run, or an unreadable delta: reload."""


class RunCache:
    """A bound run's cache: a decoded state plus the chain of deltas received since.

    Thread-safe, and no method does I/O. ``offer`` (called by a listener thread or a writer)
    takes only a short lock and never decodes; reads decode pending deltas on the reading
    thread. Staleness is counted in generations: every event that may have made the cache
    miss a change (a gap, a resubscription, a foreign incarnation) bumps the generation, and a
    reload that *started* at the current generation makes the cache synced again.
    """

    def __init__(self, run_id: uuid.UUID, keys: RunKeys) -> None:
        self.run_id = run_id
        self.keys = keys
        self._lock = threading.Lock()  # the chain: held for O(1) work only
        self._apply_lock = threading.Lock()  # decoding and installing
        self._state: RunState | None = None
        self._early: list[Delta] = []  # deltas offered before the first state
        self._pending: list[Delta] = []
        self._tip: tuple[str, int] = ("", 0)
        self._generation = 1  # starts stale: nothing loaded
        self._synced = 0
        self._gone = False
        self._changes = 0  # counts every change of tip, for waiters
        self.current: t.RunCheckpoint | None = None
        """The checkpoint when nothing is queued, else None: what a read returns at once."""
        self.last_payload: bytes | None = None
        """The bytes of the last delta that continued the chain: the notice of a write whose
        reply came first (or the reply of one whose notice came first) is these same bytes,
        and a listener drops it with one comparison, before parsing anything."""
        self.recent: dict[bytes, None] = {}
        """The bytes of the last ``RECENT`` deltas that continued the chain (not whole-state
        ones), oldest first: a listener that reads its notices in batches (see
        ``COALESCE_SECONDS`` in :mod:`luft_redis._sync.listener`) finds this process's own notices
        here, and drops them without parsing."""
        _LIVE.add(self)

    # -- reads (no I/O) --------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._state is not None

    @property
    def tip(self) -> tuple[str, int]:
        """``(incarnation, version)`` including the queued deltas."""
        return self._tip

    @property
    def change_count(self) -> int:
        """Increases with every change of the tip (for waiters: versions may restart)."""
        return self._changes

    @property
    def synced(self) -> bool:
        """No change is known to be missing (what ``cache_is_fresh`` needs from the cache)."""
        return self._synced == self._generation and not self._gone and self._state is not None

    @property
    def gone(self) -> bool:
        """The run was deleted (a notice or a load said so)."""
        return self._gone

    @property
    def generation(self) -> int:
        return self._generation

    def state(self) -> RunState | None:
        """The decoded state with every queued delta applied (CPU work only)."""
        state = self._state
        if not self._pending or state is None:
            return state
        with self._apply_lock:
            with self._lock:
                pending, self._pending = self._pending, []
            state = self._state
            assert state is not None
            last = len(pending) - 1
            try:
                for i, delta in enumerate(pending):  # one snapshot, built after the last
                    state = state.apply(delta, build=i == last)
            except (CorruptDataError, ValueError, IndexError, KeyError):
                logger.error(
                    "run %s: a change could not be applied; the cache is stale until reloaded",
                    self.run_id, exc_info=True)  # fmt: skip
                good = self._state
                assert good is not None
                good.finish()  # it may hold the deltas before the bad one
                with self._lock:
                    self._pending = []
                    self._tip = (good.incarnation, good.version)
                    self._generation += 1
                    self.current = good.snapshot
                return good
            with self._lock:
                self._state = state
                if not self._pending:
                    self.current = state.snapshot
            return state

    def snapshot(self) -> t.RunCheckpoint | None:
        """The checkpoint with every queued delta applied (O(1) when nothing is queued)."""
        state = self.state()
        if state is None:
            return None
        snapshot = state.snapshot
        with self._lock:
            if not self._pending and self._state is state:
                self.current = snapshot
        return snapshot

    # -- changes (no I/O) ------------------------------------------------------------------

    def offer(self, delta: Delta) -> Offer:
        """Queue ``delta`` when it continues the chain; see :class:`Offer`."""
        with self._lock:
            if self._state is None:
                self._early.append(delta)
                return Offer.APPLIED
            return self._offer_locked(delta)

    def _offer_locked(self, delta: Delta) -> Offer:
        inc, version = self._tip
        if delta.deleted:
            if delta.inc_before != inc:  # another incarnation's delete: reload to see
                return Offer.FOREIGN
            self._gone = True
            self._generation += 1
            self._bump()
            return Offer.FOREIGN
        if not delta.changed or delta.replay:
            if delta.inc_after == inc and delta.v_after <= version:
                return Offer.OLD
            return Offer.BEHIND if delta.inc_after == inc else Offer.FOREIGN
        if delta.inc_before == inc and delta.v_before == version:
            self.current = None
            self._pending.append(delta)
            self._tip = (delta.inc_after, delta.v_after)
            payload = self.last_payload = delta.payload
            if not delta.whole:  # (a whole state can be large: only the last one is kept)
                recent = self.recent
                recent[payload] = None
                if len(recent) > RECENT:
                    del recent[next(iter(recent))]
            self._bump()
            return Offer.APPLIED
        if delta.inc_after == inc and delta.v_after <= version:
            return Offer.OLD
        if delta.whole and delta.inc_after == inc:  # a newer whole state: applies anywhere
            self.current = None
            self._pending = [delta]
            self._tip = (delta.inc_after, delta.v_after)
            self._bump()
            return Offer.APPLIED
        if delta.inc_before == inc and delta.v_before > version:
            return Offer.BEHIND
        return Offer.FOREIGN

    def _bump(self) -> None:
        self._changes += 1

    def mark_stale(self) -> None:
        """A change may have been missed: stale until a reload that starts after this."""
        with self._lock:
            self._generation += 1
            self._changes += 1

    def install(self, state: RunState | None, generation: int) -> bool:
        """Install a load taken when the generation was ``generation`` (None: the run does
        not exist). Returns False when the load is older than what the cache holds."""
        with self._apply_lock, self._lock:
            current = self._state
            if state is None:
                self._gone = True
                if generation == self._generation:
                    self._synced = generation
                self._bump()
                return True
            inc, version = self._tip
            if current is not None and state.incarnation == inc and state.version < version:
                # a load older than the chain (notices overtook it): keep the chain
                if generation == self._generation and not self._gone:
                    self._synced = generation
                return False
            queued = self._early + self._pending
            self._early = []
            self._state = state
            self.current = None
            self._pending = []
            self._tip = (state.incarnation, state.version)
            self._gone = False
            for delta in queued:
                if delta.inc_after == state.incarnation and delta.v_after <= state.version:
                    continue
                if self._offer_locked(delta) is not Offer.APPLIED:
                    self._generation += 1  # something did not fit: reload again
            if generation == self._generation:
                self._synced = max(self._synced, generation)
            if not self._pending:
                self.current = state.snapshot
            self._bump()
            return True

    def reset_locks(self) -> None:
        """In a forked child: locks held by the parent's other threads are gone with them."""
        self.current = None
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()
        self._generation += 1


_LIVE: weakref.WeakSet[RunCache] = weakref.WeakSet()


def forget_snapshots() -> None:
    """In a forked child: no read may take a cache's snapshot before its backend has adopted
    the fork (the slow path of a read does that)."""
    for cache in list(_LIVE):
        cache.current = None


on_fork(forget_snapshots)


def finding_segments(cp: t.RunCheckpoint) -> list[Segment]:
    """Split ``cp.findings`` into stored segments (contract §5, findings, on save).

    A finding that also appears in ``cp.agent_results[a].findings`` belongs to agent ``a``: a
    later update for ``a`` replaces it. Consecutive findings of one owner form one segment,
    named by the agent id (``"<id>#2"``, ... when the same agent owns a later, separate run of
    findings); findings no agent owns form segments ``"~<n>"``.
    """
    owners: dict[t.Finding, list[uuid.UUID]] = {}
    for agent_id, result in cp.agent_results.items():
        for finding in result.findings:
            owners.setdefault(finding, []).append(agent_id)
    segments: list[tuple[str, list[t.Finding]]] = []
    owner_of_last: uuid.UUID | None = None
    seen: dict[uuid.UUID, int] = {}
    unowned = 0
    for finding in cp.findings:
        candidates = owners.get(finding)
        owner: uuid.UUID | None = None
        if candidates:
            owner = owner_of_last if owner_of_last in candidates else candidates[0]
            candidates.remove(owner)
        if segments and owner == owner_of_last and (owner is not None or segments[-1][0][0] == "~"):
            segments[-1][1].append(finding)
            continue
        if owner is None:
            unowned += 1
            seg = f"~{unowned}"
        else:
            n = seen[owner] = seen.get(owner, 0) + 1
            seg = str(owner) if n == 1 else f"{owner}#{n}"
        segments.append((seg, [finding]))
        owner_of_last = owner
    return [(seg, tuple(group)) for seg, group in segments]


_NOTHING: Mapping[Any, Any] = immutables.Map()
"""No value sent (an empty mapping, and the marker of a value not found in one)."""


class _Loader:
    """Decodes load-12.lua's reply; every problem is a CorruptDataError naming key and field."""

    def __init__(self, run_id: uuid.UUID, keys: RunKeys,
                 sent: Mapping[str | bytes, Any] | None = None) -> None:  # fmt: skip
        self.run_id = run_id
        self.keys = keys
        self._sent: Mapping[str | bytes, Any] = _NOTHING if sent is None else sent
        """What this process' own write sent (:data:`luft_redis.wire.Sent`): the values of the
        ids and blobs its delta echoes, taken as they are instead of decoded again."""
        self._ids: dict[str, uuid.UUID] = {}
        self._id_bytes: dict[bytes, uuid.UUID] = {}
        """The ids of the results, by their stored text (bulk decoding of the other hashes)."""
        self._findings_seen: dict[bytes, tuple[t.Finding, ...]] = {}

    def _text(self, key: str, field: str, raw: Any) -> str:
        if type(raw) is bytes:
            try:
                return raw.decode()
            except UnicodeDecodeError:
                raise CorruptDataError(key, field, "is not UTF-8 text") from None
        if isinstance(raw, bytes):
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise CorruptDataError(key, field, "is not UTF-8 text") from None
        if isinstance(raw, str):
            return raw
        raise CorruptDataError(key, field, f"unexpected reply {raw!r}")

    def _uint(self, key: str, field: str, raw: Any, hi: int = t.U64_MAX) -> int:
        if type(raw) is bytes and raw.isdigit() and (raw[0] != 48 or len(raw) == 1):
            value = int(raw)  # bytes.isdigit() accepts ASCII digits only
            if value <= hi:
                return value
        text = self._text(key, field, raw)
        if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
            raise CorruptDataError(key, field, f"{text!r} is not an unsigned integer")
        value = int(text)
        if value > hi:
            raise CorruptDataError(key, field, f"{value} is out of range")
        return value

    def _hash(self, key: str, flat: Any) -> dict[str, bytes]:
        if isinstance(flat, dict):  # RESP3 clients may hand back maps
            items = list(flat.items())
        elif isinstance(flat, list) and len(flat) % 2 == 0:
            items = list(zip(flat[::2], flat[1::2], strict=True))
        else:
            raise CorruptDataError(key, "", "unexpected reply shape")
        try:
            return {k.decode(): v for k, v in items}
        except (UnicodeDecodeError, AttributeError):
            return {self._text(key, "<field name>", k): v for k, v in items}

    def _entity(self, key: str, fields: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
        out: dict[str, dict[str, bytes]] = {}
        for name, value in fields.items():
            owner, sep, attr = name.partition(":")
            if not sep or not attr:
                raise CorruptDataError(key, name, "field name is not <id>:<attribute>")
            out.setdefault(owner, {})[attr] = value
        return out

    def _flag(self, key: str, field: str, raw: Any) -> bool:
        """A run flag field: only ``1`` is valid (an absent field is false)."""
        if raw != b"1":
            raise CorruptDataError(key, field, f"{bytes(raw)[:40]!r} is not 1")
        return True

    def _agent_id(self, key: str, text: str) -> uuid.UUID:
        agent_id = self._ids.get(text) or self._sent.get(text)
        if agent_id is not None:
            return agent_id
        try:
            agent_id = uuid.UUID(text)
        except ValueError:
            raise CorruptDataError(key, text, "is not an agent id") from None
        if str(agent_id) != text:
            raise CorruptDataError(key, text, "is not a canonical agent id")
        self._ids[text] = agent_id
        return agent_id

    def _findings(self, blob: bytes, key: str, field: str) -> tuple[t.Finding, ...]:
        """Decoded findings; an agent's segment repeats its result's blob: decoded once."""
        found = self._findings_seen.get(blob) or self._sent.get(blob)
        if found is None:
            found = self._findings_seen[blob] = codec.decode_findings(blob, key=key, field=field)
        return found

    def _json(self, blob: bytes, key: str, field: str) -> Any:
        """A stored JSON value (the one this process' write sent, when it did)."""
        value = self._sent.get(blob, _NOTHING)
        return codec.decode_json(blob, key=key, field=field) if value is _NOTHING else value

    def _opt(self, key: str, field: str, attrs: dict[str, bytes], name: str) -> str | None:
        raw = attrs.get(name)
        return None if raw is None else self._text(key, field, raw)

    def load(self, reply: Sequence[Any]) -> RunState:
        keys = self.keys
        if not isinstance(reply, list) or len(reply) != 7:
            raise CorruptDataError(keys.run, "", "unexpected reply shape from load")
        run_raw, phases_raw, results_raw, sessions_raw, started_raw, seg_raw, order_raw = reply
        run = self._hash(keys.run, run_raw)
        k = keys.run

        def need(field: str) -> bytes:
            if field not in run:
                raise CorruptDataError(k, field, "is missing")
            return run[field]

        schema = self._text(k, "schema", need("schema"))
        if schema != SCHEMA_VERSION:
            if schema.isascii() and schema.isdigit() and int(schema) > int(SCHEMA_VERSION):
                raise CorruptDataError(k, "schema", (
                    f"schema {schema} was written by a newer luft-redis; this version reads "
                    f"schema {SCHEMA_VERSION}: upgrade luft-redis to read it"))  # fmt: skip
            raise CorruptDataError(k, "schema", f"schema {schema!r} is not supported")
        stored_id = self._text(k, "run_id", need("run_id"))
        if stored_id != str(self.run_id):
            raise CorruptDataError(k, "run_id", f"{stored_id!r} does not match the key")
        status = self._status(need("status"))
        meta_raw = run.get("workflow_meta")
        meta = None if meta_raw is None else codec.decode_json(
            meta_raw, key=k, field="workflow_meta")  # fmt: skip
        state = RunState(self.run_id, keys)
        state.task = self._text(k, "task", need("task"))
        state.run_dir = self._text(k, "run_dir", need("run_dir"))
        state.workflow_meta = meta
        state.created_at = self._uint(k, "created_at", need("created_at"))
        state.version = self._uint(k, "version", need("version"))
        inc = run.get("incarnation")  # absent in runs written by 0.1.0
        state.incarnation = "" if inc is None else self._text(k, "incarnation", inc)
        state.status = status
        state.current_phase = self._uint(k, "current_phase", need("current_phase"), t.U32_MAX)
        state.total_tokens = self._uint(k, "total_tokens", need("total_tokens"))
        state.updated_at = self._uint(k, "updated_at", need("updated_at"))
        trimmed = run.get("log_trimmed")
        state.log_trimmed = trimmed is not None and self._flag(k, "log_trimmed", trimmed)
        state._phases = self._phases(self._hash(keys.phases, phases_raw))
        state.results = self._results_raw(results_raw)
        state.sessions = self._sessions(self._hash(keys.sessions, sessions_raw))
        started = self._started_bulk(started_raw)
        if started is None:
            started = self._started(self._hash(keys.started, started_raw))
        state._started = dict.fromkeys(started)
        segments = self._segments_bulk(seg_raw, order_raw)
        if segments is None:
            segments = self._segments(self._hash(keys.findings, seg_raw), order_raw)
        state._segments = dict(segments)
        state._findings = tuple(itertools.chain.from_iterable(state._segments.values()))
        state.snapshot = state._build()
        return state

    def _phases(self, fields: dict[str, bytes]) -> dict[int, t.PhaseSummary]:
        key = self.keys.phases
        found: list[tuple[int, t.PhaseSummary]] = []
        for pid_text, attrs in self._entity(key, fields).items():
            f = f"{pid_text}:"
            pid = self._uint(key, f + "seq", pid_text.encode(), t.U32_MAX)
            for name in ("seq", "label", "planned", "ok", "failed"):
                if name not in attrs:
                    raise CorruptDataError(key, f + name, "is missing")
            found.append((
                self._uint(key, f + "seq", attrs["seq"]),
                t.PhaseSummary._trusted(
                    phase_id=pid, label=self._text(key, f + "label", attrs["label"]),
                    planned=self._uint(key, f + "planned", attrs["planned"]),
                    ok=self._uint(key, f + "ok", attrs["ok"]),
                    failed=self._uint(key, f + "failed", attrs["failed"]),
                    description=self._opt(key, f + "description", attrs, "description"),
                    role=self._opt(key, f + "role", attrs, "role"),
                ),
            ))  # fmt: skip
        found.sort(key=lambda item: item[0])
        return {p.phase_id: p for _, p in found}

    def _entities_raw(self, key: str, flat: Any) -> dict[str, dict[bytes, bytes]]:
        """A raw HGETALL reply of ``<id>:<attribute>`` fields grouped by id, in one pass; the
        attribute names stay bytes (as a delta's ``E res`` record has them)."""
        if isinstance(flat, dict):
            pairs: Any = flat.items()
        elif isinstance(flat, list) and len(flat) % 2 == 0:
            it = iter(flat)
            pairs = zip(it, it, strict=False)  # even length checked above
        else:
            raise CorruptDataError(key, "", "unexpected reply shape")
        grouped: dict[bytes, dict[bytes, bytes]] = {}
        get = grouped.get
        for raw_name, value in pairs:
            if type(raw_name) is not bytes:
                raw_name = self._text(key, "<field name>", raw_name).encode()
            owner, sep, attr = raw_name.partition(b":")
            if not sep or not attr:
                name = self._text(key, "<field name>", raw_name)
                raise CorruptDataError(key, name, "field name is not <id>:<attribute>")
            group = get(owner)
            if group is None:
                grouped[owner] = {attr: value}
            else:
                group[attr] = value
        try:
            return {owner.decode(): attrs for owner, attrs in grouped.items()}
        except UnicodeDecodeError:
            for owner in grouped:
                self._text(key, "<field name>", owner)  # names the first one that is not text
            raise  # pragma: no cover - one of them failed to decode above

    def _results_raw(self, flat: Any) -> immutables.Map[uuid.UUID, t.AgentResultCache]:
        fast = self._results_bulk(flat)
        if fast is not None:
            return fast
        key = self.keys.results
        result = self._result
        agent_id = self._agent_id
        return immutables.Map({
            (aid := agent_id(key, aid_text)): result(aid, aid_text, attrs)
            for aid_text, attrs in self._entities_raw(key, flat).items()
        })  # fmt: skip

    def _results_bulk(self, flat: Any) -> immutables.Map[uuid.UUID, t.AgentResultCache] | None:
        """The results of a well-formed HGETALL reply, decoded column by column in C-level
        passes (``map``, set checks, one regex per number column), or None when any check
        doubts it: the per-result path then decodes it and names what is wrong. Accepts
        exactly what that path accepts (tests/test_bad_input.py, test_fuzz.py)."""
        if type(flat) is not list or len(flat) % 2 or not flat:
            return None
        try:
            return self._results_columns(flat)
        except (TypeError, ValueError, UnicodeDecodeError):
            return None

    def _results_columns(
        self, flat: list[Any]
    ) -> immutables.Map[uuid.UUID, t.AgentResultCache] | None:
        # every name is "<36-character id>:<attribute>": split in C-level slices. The big
        # temporary lists go as soon as they are used: the cyclic GC's young collections,
        # triggered by the records built below, would traverse them again and again.
        names: list[bytes] = flat[0::2]
        heads: list[bytes] = list(map(
            operator.getitem, names, itertools.repeat(_ID_PART)))  # type: ignore[arg-type]
        codes: list[int | None] = list(map(_RESULT_CODE.get, map(  # type: ignore[arg-type]
            operator.getitem, names, itertools.repeat(_ATTR_PART))))  # fmt: skip
        del names
        if None in codes:  # another attribute, or another shape of name
            return None
        owners = list(itertools.compress(heads, map(operator.not_, codes)))  # status: code 0
        ids = self._ids_bulk(owners)
        if ids is None:
            return None
        n, width = len(owners), len(_RESULT_COLUMNS)
        row = dict(zip(owners, range(0, n * width, width), strict=True))
        if len(row) != n:  # pragma: no cover - HGETALL names are distinct
            return None
        where = list(map(row.get, heads))
        del heads, row
        if None in where:  # an attribute of an id with no status
            return None
        table: list[bytes | None] = [None] * (n * width)
        collections.deque(map(
            table.__setitem__, map(operator.add, where, codes), flat[1::2]), 0)  # fmt: skip
        del where, codes
        cols = {attr: table[i::width] for i, attr in enumerate(_RESULT_COLUMNS)}
        del table
        status = list(map(_RESULT_STATUS.get, cols["status"]))  # type: ignore[arg-type]
        phase = _uints(cols["phase_id"], t.U32_MAX)
        tokens = _uints(cols["tokens"], t.U64_MAX)
        completed = _uints(cols["completed_at"], t.U64_MAX)
        if None in status or phase is None or tokens is None or completed is None:
            return None
        output = _decoded(cols["output"], codec.decode_json_many, codec.decode_json)
        findings = _decoded(cols["findings"], codec.decode_findings_many, codec.decode_findings)
        if output is None or findings is None:
            return None
        self._findings_seen.update(
            (blob, found) for blob, found in zip(cols["findings"], findings, strict=True)
            if blob is not None)  # fmt: skip
        columns: dict[str, Any] = {
            "agent_id": ids, "phase_id": phase, "status": status, "output": output,
            "findings": [() if f is None else f for f in findings], "tokens": tokens,
            "completed_at": completed,
            **{name: _texts(cols[name]) for name in t.RESULT_TEXT_FIELDS},
        }  # fmt: skip
        records = list(map(object.__new__, itertools.repeat(t.AgentResultCache, n)))
        for setter, name in _RESULT_SETTERS:
            collections.deque(map(setter, records, columns[name]), 0)
        return immutables.Map(zip(ids, records, strict=True))

    def _ids_bulk(self, texts: list[bytes]) -> list[uuid.UUID] | None:
        """The agent ids named by ``texts`` (canonical UUID text, checked in one regex
        pass), remembered for the other hashes of the load; None if one is not."""
        joined = b"\n".join(texts)
        if texts and (joined.count(b"\n") != len(texts) - 1 or not _UUIDS.fullmatch(joined)):
            return None
        ids = list(map(object.__new__, itertools.repeat(uuid.UUID, len(texts))))
        ints = map(int, map(bytes.replace, texts, itertools.repeat(b"-"),
                            itertools.repeat(b"")), itertools.repeat(16))  # fmt: skip
        collections.deque(map(_UUID_INT, ids, ints), 0)
        collections.deque(map(_UUID_SAFE, ids, itertools.repeat(uuid.SafeUUID.unknown)), 0)
        self._ids.update(zip(map(bytes.decode, texts), ids, strict=True))
        self._id_bytes.update(zip(texts, ids, strict=True))
        return ids

    def _result(self, agent_id: uuid.UUID, aid_text: str,
                attrs: dict[bytes, bytes]) -> t.AgentResultCache:  # fmt: skip
        """One result from its attributes (name -> stored value, both bytes), every field
        checked (the field names for an error are built only when there is one)."""
        key = self.keys.results
        get = attrs.get
        status_raw, phase_raw = get(b"status"), get(b"phase_id")
        tokens_raw, completed_raw = get(b"tokens"), get(b"completed_at")
        if status_raw is None or phase_raw is None or tokens_raw is None or completed_raw is None:
            for name in ("status", "phase_id", "tokens", "completed_at"):
                if name.encode() not in attrs:
                    raise CorruptDataError(key, f"{aid_text}:{name}", "is missing")
        status = _RESULT_STATUS.get(status_raw)  # type: ignore[arg-type]
        if status is None:
            text = self._text(key, f"{aid_text}:status", status_raw)
            if text not in t.AGENT_RESULT_STATUSES:
                raise CorruptDataError(
                    key, f"{aid_text}:status", f"{text!r} is not an agent status")
            status = text
        output, findings = get(b"output"), get(b"findings")
        texts = {name: None if (raw := get(code)) is None else self._str(key, aid_text, name, raw)
                 for name, code in _RESULT_TEXTS}  # fmt: skip
        return t.AgentResultCache._trusted(
            agent_id=agent_id,
            phase_id=self._num(key, aid_text, "phase_id", phase_raw, t.U32_MAX),
            status=status,
            output=None if output is None else self._json(
                output, key=key, field=f"{aid_text}:output"),
            findings=() if findings is None else self._findings(
                findings, key=key, field=f"{aid_text}:findings"),
            tokens=self._num(key, aid_text, "tokens", tokens_raw),
            completed_at=self._num(key, aid_text, "completed_at", completed_raw),
            **texts,
        )  # fmt: skip

    def _num(self, key: str, owner: str, name: str, raw: Any, hi: int = t.U64_MAX) -> int:
        """``_uint`` of attribute ``name`` of ``owner``, naming the field only on error."""
        if type(raw) is bytes and raw.isdigit() and (raw[0] != 48 or len(raw) == 1):
            value = int(raw)
            if value <= hi:
                return value
        return self._uint(key, f"{owner}:{name}", raw, hi)

    def _str(self, key: str, owner: str, name: str, raw: Any) -> str:
        """``_text`` of attribute ``name`` of ``owner``, naming the field only on error."""
        if type(raw) is bytes:
            try:
                return raw.decode()
            except UnicodeDecodeError:
                pass
        return self._text(key, f"{owner}:{name}", raw)

    def _sessions(
        self, fields: dict[str, bytes]
    ) -> immutables.Map[uuid.UUID, t.AgentSessionCheckpoint]:
        key = self.keys.sessions
        out: dict[uuid.UUID, t.AgentSessionCheckpoint] = {}
        for aid_text, attrs in self._entity(key, fields).items():
            agent_id = self._agent_id(key, aid_text)
            f = f"{aid_text}:"
            for name in ("session_id", "status", "updated_at", "resumable"):
                if name not in attrs:
                    raise CorruptDataError(key, f + name, "is missing")
            resumable = self._text(key, f + "resumable", attrs["resumable"])
            if resumable not in ("true", "false"):
                raise CorruptDataError(key, f + "resumable", f"{resumable!r} is not a bool")
            out[agent_id] = t.AgentSessionCheckpoint._trusted(
                agent_id=agent_id,
                backend_id=self._opt(key, f + "backend_id", attrs, "backend_id"),
                protocol_session_id=self._opt(
                    key, f + "protocol_session_id", attrs, "protocol_session_id"),
                session_id=self._text(key, f + "session_id", attrs["session_id"]),
                status=self._text(key, f + "status", attrs["status"]),
                updated_at=self._uint(key, f + "updated_at", attrs["updated_at"]),
                resumable=resumable == "true",
            )  # fmt: skip
        return immutables.Map(out)

    def _status(self, raw: Any) -> t.CheckpointStatus:
        text = self._text(self.keys.run, "status", raw)
        try:
            return t.CheckpointStatus(text)
        except ValueError:
            raise CorruptDataError(self.keys.run, "status", f"{text!r} is not a status") from None

    def _started_bulk(self, flat: Any) -> list[uuid.UUID] | None:
        """``_started`` of a well-formed HGETALL reply in C-level passes (the ids known from
        the results, one regex for the values), or None: ``_started`` then decides."""
        if type(flat) is not list or len(flat) % 2:
            return None
        names, values = flat[0::2], flat[1::2]
        try:
            ids = list(map(self._id_bytes.get, names))
            joined = b"\n".join(values)
        except TypeError:
            return None
        if None in ids or joined.count(b"\n") != len(values) - 1:
            return None
        if len(set(names)) != len(names):  # a name twice: the per-field path keeps its last
            return None
        if values and not _STARTED.fullmatch(joined):
            return None
        numbers = list(map(int, joined.split()))
        seqs = numbers[0::2]
        if values and (max(seqs) > t.U64_MAX or max(numbers[1::2]) > t.U32_MAX):
            return None
        order = sorted(range(len(ids)), key=seqs.__getitem__)
        return list(map(ids.__getitem__, order))  # type: ignore[arg-type]

    def _started(self, fields: dict[str, bytes]) -> list[uuid.UUID]:
        key = self.keys.started
        found: list[tuple[int, uuid.UUID, int]] = []
        for aid_text, raw in fields.items():
            agent_id = self._agent_id(key, aid_text)
            seq_text, sep, phase_text = self._text(key, aid_text, raw).partition(" ")
            if not sep:
                raise CorruptDataError(key, aid_text, "is not '<seq> <phase_id>'")
            found.append((
                self._uint(key, aid_text, seq_text.encode()), agent_id,
                self._uint(key, aid_text, phase_text.encode(), t.U32_MAX),
            ))  # fmt: skip
        found.sort(key=lambda item: item[0])
        return [a for _, a, _ in found]

    def _segments_bulk(self, flat: Any, order_raw: Any) -> list[Segment] | None:
        """``_segments`` of well-formed replies in C-level passes (the blobs the results
        share decoded once), or None: ``_segments`` then decides."""
        if type(flat) is not list or len(flat) % 2 or type(order_raw) is not list:
            return None
        try:
            blobs = dict(zip(flat[0::2], flat[1::2], strict=True))
            names = list(map(bytes.decode, order_raw))
        except (TypeError, UnicodeDecodeError):
            return None
        found = list(map(blobs.get, order_raw))
        if not len(blobs) == len(order_raw) == len(set(order_raw)) or None in found:
            return None
        seen = self._findings_seen
        new = [blob for blob in found if blob not in seen]
        if new:
            decoded = _decoded(new, codec.decode_findings_many, codec.decode_findings)
            if decoded is None:
                return None
            seen.update(zip(new, decoded, strict=True))  # type: ignore[arg-type]
        return list(zip(names, map(seen.__getitem__, found), strict=True))  # type: ignore[arg-type]

    def _segments(self, blobs: dict[str, bytes], order_raw: Any) -> list[Segment]:
        key, order_key = self.keys.findings, self.keys.findings_order
        if not isinstance(order_raw, list):
            raise CorruptDataError(order_key, "", "unexpected reply shape")
        out: list[Segment] = []
        for raw in order_raw:
            seg = self._text(order_key, "<element>", raw)
            if seg not in blobs:
                raise CorruptDataError(key, seg, "is listed in the order but missing")
            out.append((seg, self._findings(blobs.pop(seg), key=key, field=seg)))
        if blobs:
            raise CorruptDataError(key, next(iter(blobs)), "is not listed in the order")
        return out
