"""The in-process copy of one run's checkpoint.

:class:`RunState` holds the run as last seen at ``version`` and applies each change with the
same rules the Lua scripts apply in Redis (contract §5), so a backend sees its own writes at
once and ``get_checkpoint()`` never does network I/O. The scripts stay the authority: every
write returns the run's new version, and a version that is not the next one means another
process wrote in between, so the backend reloads the state instead of guessing.

Reads are O(1): the state keeps an immutable :class:`~luft_redis.types.RunCheckpoint`
snapshot, rebuilt on each change from persistent maps (``immutables.Map``), so a change to one
agent costs O(log n) and callers can never mutate what the cache holds.
"""

from __future__ import annotations

import gc
import itertools
import uuid
from collections.abc import Sequence
from typing import Any

import immutables

from . import codec
from . import types as t
from .errors import CorruptDataError
from .keys import SCHEMA_VERSION, RunKeys

__all__ = ["RunState", "finding_segments"]

Segment = tuple[str, tuple[t.Finding, ...]]


class RunState:
    """One run's checkpoint as of ``version``; see the module docstring."""

    __slots__ = (
        "_extras",
        "_findings",
        "_phases",
        "_segments",
        "_started",
        "_started_phase",
        "created_at",
        "current_phase",
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

    def __init__(self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any,
                 now: int, version: int) -> None:  # fmt: skip
        self.run_id = run_id
        self.task = task
        self.run_dir = run_dir
        self.workflow_meta = workflow_meta
        self.status = t.CheckpointStatus.RUNNING
        self.current_phase = 0
        self.total_tokens = 0
        self.created_at = now
        self.updated_at = now
        self.version = version
        self.results: immutables.Map[uuid.UUID, t.AgentResultCache] = immutables.Map()
        self.sessions: immutables.Map[uuid.UUID, t.AgentSessionCheckpoint] = immutables.Map()
        self._phases: dict[int, t.PhaseSummary] = {}
        self._started: list[uuid.UUID] = []
        self._started_phase: dict[uuid.UUID, int] = {}
        # finding segments by id, in list order; "<agent>#<n>" extras exist only after a save
        self._segments: dict[str, tuple[t.Finding, ...]] = {}
        self._findings: tuple[t.Finding, ...] = ()
        self._extras: set[str] = set()
        self.snapshot = self._build()

    # -- snapshot --------------------------------------------------------------------------

    def _build(self) -> t.RunCheckpoint:
        return t.RunCheckpoint._trusted(
            run_id=self.run_id,
            task=self.task,
            status=self.status,
            current_phase=self.current_phase,
            completed_phases=tuple(self._phases.values()),
            agent_results=self.results,
            agent_sessions=self.sessions,
            findings=self._findings,
            total_tokens=self.total_tokens,
            created_at=self.created_at,
            updated_at=self.updated_at,
            workflow_meta=self.workflow_meta,
            started_agent_ids=tuple(self._started),
        )

    def _commit(self, now: int, version: int) -> None:
        self.updated_at = now
        self.version = version
        self.snapshot = self._build()

    # -- changes, mirroring the Lua scripts ------------------------------------------------

    def apply_events(self, events: Sequence[t.AgentEvent], now: int, version: int) -> None:
        """Apply a batch of events, in order, as append_events-10.lua does (one version)."""
        for event in events:
            self._apply_event(event, now)
        self._commit(now, version)

    def _apply_event(self, event: t.AgentEvent, now: int) -> None:
        if isinstance(event, t.AgentStarted):
            if event.agent_id not in self._started_phase:
                self._started.append(event.agent_id)
            self._started_phase[event.agent_id] = event.phase_id
        elif isinstance(event, t.AgentDone):
            self._apply_agent_done(event, now)
        elif isinstance(event, t.PhaseStarted):
            old = self._phases.get(event.phase_id)
            self._phases[event.phase_id] = t.PhaseSummary._trusted(
                phase_id=event.phase_id, label=event.label, planned=event.planned,
                ok=old.ok if old else 0, failed=old.failed if old else 0,
                description=event.description, role=event.role,
            )  # fmt: skip
            self.current_phase = max(self.current_phase, event.phase_id)
        elif isinstance(event, t.PhaseDone):
            old = self._phases.get(event.phase_id)
            if old is None:
                old = t.PhaseSummary._trusted(
                    phase_id=event.phase_id, label="", planned=0, ok=0, failed=0,
                    description=None, role=None,
                )  # fmt: skip
            self._phases[event.phase_id] = old._replace(ok=event.ok, failed=event.failed)
            self.current_phase = max(self.current_phase, event.phase_id)
        elif isinstance(event, t.RunDone):
            final = event.status is not t.RunStatus.PARTIAL
            if final and self.status not in (t.CheckpointStatus.COMPLETED,
                                             t.CheckpointStatus.CANCELLED):  # fmt: skip
                self.status = t.CheckpointStatus(event.status.value)
            reported = event.total_tokens.total()
            if reported > 0:
                self.total_tokens = reported

    def _apply_agent_done(self, event: t.AgentDone, now: int) -> None:
        old = self.results.get(event.agent_id)
        if old is None:
            phase_id, completed_at = self._started_phase.get(event.agent_id, 0), now
            cache_key_hash = description = role = None
            output, findings = event.output, event.findings
        else:
            phase_id, completed_at = old.phase_id, old.completed_at
            cache_key_hash, description, role = old.cache_key_hash, old.description, old.role
            output = old.output if old.output is not None else event.output
            findings = old.findings if old.findings else event.findings
        self.results = self.results.set(
            event.agent_id,
            t.AgentResultCache._trusted(
                agent_id=event.agent_id, phase_id=phase_id, status=event.status.cache_str,
                output=output, findings=findings, tokens=event.tokens.total(),
                completed_at=completed_at, cache_key_hash=cache_key_hash,
                description=description, role=role,
            ),
        )  # fmt: skip
        if (old is None or not old.findings) and event.findings:
            self._set_agent_findings(event.agent_id, event.findings)
        self.total_tokens += event.tokens.total()

    def apply_result(self, result: t.AgentResultCache, now: int, version: int) -> None:
        """Apply ``upsert_agent_result`` as upsert_agent_result-10.lua does."""
        self.results = self.results.set(result.agent_id, result)
        self._set_agent_findings(result.agent_id, result.findings)
        self._commit(now, version)

    def apply_session(self, session: t.AgentSessionCheckpoint, now: int, version: int) -> None:
        self.sessions = self.sessions.set(session.agent_id, session)
        self._commit(now, version)

    def apply_status(self, status: t.CheckpointStatus, now: int, version: int) -> None:
        """A status change by cancel/reset."""
        self.status = status
        self._commit(now, version)

    def _set_agent_findings(self, agent_id: uuid.UUID, findings: tuple[t.Finding, ...]) -> None:
        """Mirror of set_agent_findings in lua/includes/common.lua."""
        seg = str(agent_id)
        segments = self._segments
        if seg not in segments:
            if findings:  # a new agent's findings go at the end
                segments[seg] = findings
                self._findings += findings
            return
        if findings:
            segments[seg] = findings
        else:
            del segments[seg]
        if seg in self._extras:  # further groups of this agent written by a save: dropped
            self._extras.discard(seg)
            for sid in [sid for sid in segments if sid.startswith(f"{seg}#")]:
                del segments[sid]
        self._findings = tuple(itertools.chain.from_iterable(segments.values()))

    def apply_save(self, cp: t.RunCheckpoint, segments: list[Segment], now: int,
                   version: int) -> None:  # fmt: skip
        """Apply ``save_checkpoint(cp)`` as save_checkpoint-10.lua does."""
        self.task, self.status = cp.task, cp.status
        self.current_phase, self.total_tokens = cp.current_phase, cp.total_tokens
        self.created_at, self.workflow_meta = cp.created_at, cp.workflow_meta
        self._phases = {p.phase_id: p for p in cp.completed_phases}
        self.results = immutables.Map(cp.agent_results)
        self.sessions = immutables.Map(cp.agent_sessions)
        self._started = list(dict.fromkeys(cp.started_agent_ids))
        self._started_phase = {a: self._started_phase.get(a, 0) for a in self._started}
        self._segments = dict(segments)
        self._extras = _extras(self._segments)
        self._findings = tuple(cp.findings)
        self._commit(now, version)

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def from_load(cls, run_id: uuid.UUID, keys: RunKeys, reply: Sequence[Any]) -> RunState:
        """Decode the reply of load-10.lua, checking every field (CorruptDataError)."""
        # Decoding makes many small objects and no cycles: the cyclic GC would only rescan
        # the growing heap again and again (about a third of the time for 10,000 agents).
        enabled = gc.isenabled()
        gc.disable()
        try:
            return _Loader(run_id, keys).load(reply)
        finally:
            if enabled:
                gc.enable()


def _extras(segments: dict[str, tuple[t.Finding, ...]]) -> set[str]:
    """Agents with further finding groups ("<agent>#<n>") besides their own segment."""
    return {sid.partition("#")[0] for sid in segments if "#" in sid}


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


class _Loader:
    """Decodes load-10.lua's reply; every problem is a CorruptDataError naming key and field."""

    def __init__(self, run_id: uuid.UUID, keys: RunKeys) -> None:
        self.run_id = run_id
        self.keys = keys
        self._ids: dict[str, uuid.UUID] = {}
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

    def _agent_id(self, key: str, text: str) -> uuid.UUID:
        agent_id = self._ids.get(text)
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
        found = self._findings_seen.get(blob)
        if found is None:
            found = self._findings_seen[blob] = codec.decode_findings(blob, key=key, field=field)
        return found

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
            raise CorruptDataError(k, "schema", f"schema {schema!r} is not supported")
        stored_id = self._text(k, "run_id", need("run_id"))
        if stored_id != str(self.run_id):
            raise CorruptDataError(k, "run_id", f"{stored_id!r} does not match the key")
        status_text = self._text(k, "status", need("status"))
        try:
            status = t.CheckpointStatus(status_text)
        except ValueError:
            raise CorruptDataError(k, "status", f"{status_text!r} is not a status") from None
        meta_raw = run.get("workflow_meta")
        meta = None if meta_raw is None else codec.decode_json(
            meta_raw, key=k, field="workflow_meta")  # fmt: skip
        state = RunState(
            self.run_id,
            self._text(k, "task", need("task")),
            self._text(k, "run_dir", need("run_dir")),
            meta,
            self._uint(k, "created_at", need("created_at")),
            self._uint(k, "version", need("version")),
        )
        state.status = status
        state.current_phase = self._uint(k, "current_phase", need("current_phase"), t.U32_MAX)
        state.total_tokens = self._uint(k, "total_tokens", need("total_tokens"))
        state.updated_at = self._uint(k, "updated_at", need("updated_at"))
        state._phases = self._phases(self._hash(keys.phases, phases_raw))
        state.results = self._results(self._hash(keys.results, results_raw))
        state.sessions = self._sessions(self._hash(keys.sessions, sessions_raw))
        state._started, state._started_phase = self._started(self._hash(keys.started, started_raw))
        state._segments = dict(self._segments(self._hash(keys.findings, seg_raw), order_raw))
        state._extras = _extras(state._segments)
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

    def _results(self, fields: dict[str, bytes]) -> immutables.Map[uuid.UUID, t.AgentResultCache]:
        key = self.keys.results
        out: dict[uuid.UUID, t.AgentResultCache] = {}
        for aid_text, attrs in self._entity(key, fields).items():
            agent_id = self._agent_id(key, aid_text)
            f = f"{aid_text}:"
            for name in ("status", "phase_id", "tokens", "completed_at"):
                if name not in attrs:
                    raise CorruptDataError(key, f + name, "is missing")
            status = self._text(key, f + "status", attrs["status"])
            if status not in t.AGENT_RESULT_STATUSES:
                raise CorruptDataError(key, f + "status", f"{status!r} is not an agent status")
            output = attrs.get("output")
            findings = attrs.get("findings")
            out[agent_id] = t.AgentResultCache._trusted(
                agent_id=agent_id,
                phase_id=self._uint(key, f + "phase_id", attrs["phase_id"], t.U32_MAX),
                status=status,
                output=None if output is None else codec.decode_json(
                    output, key=key, field=f + "output"),
                findings=() if findings is None else self._findings(
                    findings, key=key, field=f + "findings"),
                tokens=self._uint(key, f + "tokens", attrs["tokens"]),
                completed_at=self._uint(key, f + "completed_at", attrs["completed_at"]),
                cache_key_hash=self._opt(key, f + "cache_key_hash", attrs, "cache_key_hash"),
                description=self._opt(key, f + "description", attrs, "description"),
                role=self._opt(key, f + "role", attrs, "role"),
            )  # fmt: skip
        return immutables.Map(out)

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

    def _started(
        self, fields: dict[str, bytes]
    ) -> tuple[list[uuid.UUID], dict[uuid.UUID, int]]:
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
        return [a for _, a, _ in found], {a: p for _, a, p in found}

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
