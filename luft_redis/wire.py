"""The wire: checked script arguments for every operation, and stream entries back (no I/O).

Both front ends (:mod:`luft_redis._sync.backend`, :mod:`luft_redis.asyncio`) build their script
calls here, so a value is validated and encoded one way only. Numbers travel as decimal
strings; an optional argument is ``"n"`` (null) or ``"s"`` followed by the value.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from . import codec
from . import types as t
from .cache import finding_segments
from .errors import (
    CorruptDataError,
    PayloadTooLargeError,
    RunMismatchError,
    ValidationError,
)
from .keys import SCHEMA_VERSION

__all__ = [
    "DEFAULT_MAX_PAYLOAD_SIZE",
    "Encoder",
    "LogEntry",
    "Sent",
    "check_str",
    "check_type",
    "check_uuid",
    "decode_entry",
    "entry_fields",
    "entry_id",
    "xread_entries",
]

DEFAULT_MAX_PAYLOAD_SIZE = 4 * 1024 * 1024
"""Largest stored form of one event, one result's output or findings, or workflow_meta."""

_T = TypeVar("_T")


class LogEntry(NamedTuple):
    """An event of the log with its stream entry id (to resume reading after it)."""

    id: str
    event: t.AgentEvent


Sent = dict[str | bytes, Any]
"""What one write sent, by the text or bytes the server echoes back in its delta: an agent's id
text -> its UUID, a stored blob -> the value it was encoded from. The cache applies the
write's own delta from it instead of decoding bytes this process just encoded (see
:meth:`luft_redis.cache.RunState.apply`); a notice of another process has none."""

if (codec.nested_position("agent_done", "output"),
        codec.nested_position("agent_done", "findings")) != (0, 1):  # pragma: no cover
    raise RuntimeError("wire.Encoder.event expects an agent_done's data to start with "
                       "its output and findings")
_FILLS = tuple(name for name in t.RESULT_TEXT_FIELDS
               if name in {s.name for s in t.AgentDone._field_specs()})  # fmt: skip
"""An agent_done's fields that are also optional text fields of a result (none yet): the
script fills the result's from them where it lacks them, as it does its output."""
_AT = codec.DATA_BODY + 1
"""The 1-based offset of the first nested field (an agent_done's output) in ``data``."""


def opt(value: str | bytes | None) -> str | bytes:
    """Optional script argument: ``"n"`` for None, ``"s<value>"`` otherwise."""
    if value is None:
        return "n"
    if isinstance(value, bytes):
        return b"s" + value
    return "s" + value


def check_uuid(value: Any, field: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ValidationError(field, f"{value!r} is not a UUID")


def check_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    return t.check_text(value, field)


def check_type(value: Any, cls: type[_T], field: str) -> _T:
    if not isinstance(value, cls):
        raise ValidationError(field, f"expected {cls.__name__}, got {type(value).__name__}")
    return value


class Encoder:
    """Builds each operation's script arguments (after the writer id and operation number)."""

    __slots__ = ("max_payload_size",)

    def __init__(self, max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE) -> None:
        self.max_payload_size = max_payload_size

    def limit(self, blob: bytes, field: str) -> bytes:
        """``blob`` if within ``max_payload_size``, else :class:`PayloadTooLargeError`."""
        if len(blob) > self.max_payload_size:
            raise PayloadTooLargeError(field, len(blob), self.max_payload_size)
        return blob

    def init_run(self, run_id: Any, task: Any, run_dir: Any, meta: Any, *,
                 with_meta: bool) -> tuple[uuid.UUID, list[Any]]:  # fmt: skip
        """(run id, arguments) of init_run-12.lua; a new incarnation each call."""
        rid = check_uuid(run_id, "run_id")
        task = check_str(task, "task")
        run_dir = check_str(run_dir, "run_dir")
        frozen = t.freeze_json(meta, "workflow_meta") if with_meta else None
        blob = None if frozen is None else self.limit(codec.encode_json(frozen), "workflow_meta")
        return rid, [str(rid), task, run_dir, opt(blob), SCHEMA_VERSION, uuid.uuid4().hex]

    def events(self, events: Any, run_id: uuid.UUID, sent: Sent | None = None) -> list[Any]:
        """Arguments of append_events-12.lua for a batch (ValidationError naming the event);
        what they hold goes into ``sent`` too."""
        if type(events) is tuple or type(events) is list:
            batch = events
        elif isinstance(events, t.AgentEvent) or not isinstance(events, Iterable):
            raise ValidationError("events", f"expected a sequence of events, got {events!r:.80}")
        else:
            batch = list(events)
        if len(batch) == 1:
            args = self.event(batch[0], "event", run_id, sent)
            args.insert(0, "1")
            return args
        args = [str(len(batch))]
        for i, event in enumerate(batch):
            args += self.event(event, f"events[{i}]", run_id, sent)
        return args

    def event(self, event: Any, field: str, run_id: uuid.UUID,
              sent: Sent | None = None) -> list[Any]:  # fmt: skip
        event = check_type(event, t.AgentEvent, field)
        if event.run_id is not run_id and event.run_id is not None and event.run_id != run_id:
            raise RunMismatchError(
                f"{field}.run_id", f"event of run {event.run_id} cannot go into run {run_id}"
            )
        if event.run_id is None and not isinstance(event, t.SignalReceived):
            raise ValidationError(f"{field}.run_id", "only signal_received may have a null run_id")
        entry, parts = codec.encode_entry_parts(event)
        # an upper bound first (a character is at most 4 bytes), the exact size when it is
        # not clearly within the limit
        if 4 * sum(map(len, entry)) > self.max_payload_size:
            size = sum(len(v) if isinstance(v, bytes) else len(v.encode()) for v in entry)
            if size > self.max_payload_size:
                raise PayloadTooLargeError(field, size, self.max_payload_size)
        stored = entry  # the entry, as append_events-12.lua reads it: its length first
        stored.insert(0, str(len(entry)))
        # the rule arguments, packed as append_events-12.lua reads them ("<a> <b>": one string
        # of space-separated ids, names and decimals, none of which holds a space)
        # an agent_done's output and findings are sent once, in the entry's data: the script
        # cuts them out (where they are, and the blob header to put before them)
        if isinstance(event, t.AgentDone):
            total = event.tokens.total()
            if total > t.U64_MAX:
                raise ValidationError(f"{field}.tokens", "input + output exceeds 2^64-1")
            aid = str(event.agent_id)
            # (parts: [output, findings], trailing defaults left out; a null output is packed)
            o_len = len(parts[0]) if event.output is not None else 0
            f_len = len(parts[1]) if event.findings else 0
            f_at = _AT + len(parts[0]) if f_len else 0
            if sent is not None:
                sent[aid] = event.agent_id
                if o_len:
                    sent[codec.stored_blob(parts[0])] = event.output
                if f_len:
                    sent[codec.stored_blob(parts[1])] = event.findings
            stored += (f"{aid} {event.status.cache_str} {total} {_AT if o_len else 0} {o_len} "
                       f"{f_at} {f_len} {len(_FILLS)}", codec.BLOB_HEADER)  # fmt: skip
            for name in _FILLS:
                stored += (name, opt(getattr(event, name)))
            return stored
        if isinstance(event, t.AgentStarted):
            aid = str(event.agent_id)
            if sent is not None:
                sent[aid] = event.agent_id
            return [*stored, f"{aid} {event.phase_id}"]
        if isinstance(event, t.PhaseStarted):
            return [*stored, f"{event.phase_id} {event.planned}", event.label,
                    opt(event.description), opt(event.role)]  # fmt: skip
        if isinstance(event, t.PhaseDone):
            return [*stored, f"{event.phase_id} {event.ok} {event.failed}"]
        if isinstance(event, t.RunDone):
            total = event.total_tokens.total()
            if total > t.U64_MAX:
                raise ValidationError(f"{field}.total_tokens", "input + output exceeds 2^64-1")
            return [*stored, f"{event.status.value} {total}"]
        return stored

    def result(self, cache: Any, sent: Sent | None = None) -> list[Any]:
        """Arguments of upsert_agent_result-12.lua (what they hold goes into ``sent`` too)."""
        r = check_type(cache, t.AgentResultCache, "cache")
        return self._result_fields(r, "cache", sent)

    def _result_fields(self, r: t.AgentResultCache, field: str,
                       sent: Sent | None = None) -> list[Any]:  # fmt: skip
        aid = str(r.agent_id)
        output = findings = None
        if r.output is not None:
            output = self.limit(codec.encode_json(r.output), f"{field}.output")
        if r.findings:
            findings = self.limit(codec.encode_findings(r.findings), f"{field}.findings")
        if sent is not None:
            sent[aid] = r.agent_id
            if output is not None:
                sent[output] = r.output
            if findings is not None:
                sent[findings] = r.findings
        return [aid, str(r.phase_id), r.status, str(r.tokens), str(r.completed_at), opt(output),
                opt(findings), *(opt(getattr(r, name)) for name in t.RESULT_TEXT_FIELDS)]

    @staticmethod
    def session(session: Any, sent: Sent | None = None) -> list[Any]:
        """Arguments of upsert_agent_session-12.lua (its agent id goes into ``sent`` too)."""
        s = check_type(session, t.AgentSessionCheckpoint, "session")
        aid = str(s.agent_id)
        if sent is not None:
            sent[aid] = s.agent_id
        return [
            aid, opt(s.backend_id), opt(s.protocol_session_id),
            s.session_id, s.status, str(s.updated_at), "true" if s.resumable else "false",
        ]  # fmt: skip

    def save(self, checkpoint: Any, run_id: uuid.UUID | None) -> list[Any]:
        """Arguments of save_checkpoint-12.lua for ``checkpoint`` of the bound run."""
        cp = check_type(checkpoint, t.RunCheckpoint, "checkpoint")
        if cp.run_id != run_id:
            raise RunMismatchError(
                "run_id", f"checkpoint of run {cp.run_id} cannot replace run {run_id}"
            )
        phase_ids = [p.phase_id for p in cp.completed_phases]
        if len(set(phase_ids)) != len(phase_ids):
            raise ValidationError("completed_phases", "phase ids must be unique")
        started = list(dict.fromkeys(cp.started_agent_ids))
        segments = finding_segments(cp)
        args: list[Any] = [
            cp.task, cp.status.value, str(cp.current_phase), str(cp.total_tokens),
            str(cp.created_at),
            opt(None if cp.workflow_meta is None
                else self.limit(codec.encode_json(cp.workflow_meta), "workflow_meta")),
            str(len(cp.completed_phases)),
        ]  # fmt: skip
        for p in cp.completed_phases:
            args += (str(p.phase_id), p.label, str(p.planned), str(p.ok), str(p.failed),
                     opt(p.description), opt(p.role))  # fmt: skip
        args.append(str(len(cp.agent_results)))
        for r in cp.agent_results.values():
            args += self._result_fields(r, f"agent_results.{r.agent_id}")
        args.append(str(len(cp.agent_sessions)))
        for sess in cp.agent_sessions.values():
            args += self.session(sess)
        args.append(str(len(started)))
        args += (str(a) for a in started)
        args.append(str(len(segments)))
        for seg, group in segments:
            args += (seg, codec.encode_findings(group))
        return args


def entry_id(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def entry_fields(event: t.AgentEvent) -> list[str | bytes]:
    """The stream entry of ``event`` as XADD takes it: ``[field, value, ...]``."""
    return codec.encode_entry(event)


def decode_entry(run_id: uuid.UUID, key: str, eid: str, fields: Any) -> t.AgentEvent:
    """The event of one stream entry of any format (CorruptDataError naming key and entry).

    An entry's format is its ``data`` blob's: 1 or 2, the whole event in that blob; 3, plain
    text fields and the nested ones in ``data``, or no ``data`` when nothing is nested
    (``docs/redis-layout.md``). A log upgraded in flight holds both, so each entry is decoded
    by its own."""
    type_raw, blob = fields.get(b"type"), fields.get(b"data")
    if not isinstance(type_raw, bytes) or not isinstance(blob, bytes | None):
        raise CorruptDataError(key, f"entry {eid}", "lacks its type field")
    type_name = type_raw.decode("utf-8", "replace")
    if blob is None or codec.entry_format(blob) == 3:
        return codec.decode_entry(type_name, fields, run_id, key=key, entry_id=eid)
    # formats 1 and 2; a newer or unknown format is refused there, naming it
    return codec.decode_event(type_name, blob, run_id, key=key, entry_id=eid)


def xread_entries(reply: Any) -> list[Any]:
    """The entries of an XREAD reply for one stream (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        out: list[Any] = []
        for value in reply.values():
            out.extend(value[0] if value and isinstance(value[0], list) else value)
        return out
    return [entry for _, entries in reply for entry in entries]


def page_after(page: Sequence[Any]) -> str:
    """The XRANGE lower bound that continues after the last entry of ``page``."""
    return "(" + entry_id(page[-1][0])
