"""A run's history (no I/O): its stream entries read, a point of it named, a state folded.

Every script that makes a version adds one entry to the run's history stream (``lua/includes/
history.lua``, docs/redis-layout.md): a *base* (``z``: the whole state after the change) or a
*change* (``d``: the records of the change notice the same script published, which every cache
applies). The state at version ``v`` is the last base at or before ``v`` with the changes after
it applied in order by :meth:`luft_redis.cache.RunState.apply`, the code that keeps every
cache, so a past state is decoded exactly as ``open_run`` decodes the present one.

The I/O is in :mod:`luft_redis.asyncio.history` (and the generated
:mod:`luft_redis._sync.history`); the backends' ``history``, ``checkpoint_at`` and
``fork_run`` call it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from . import types as t
from .cache import RunState
from .delta import Delta, split_indexed
from .errors import CorruptDataError, ValidationError
from .keys import RunKeys

__all__ = [
    "DEFAULT_HISTORY_PAGE",
    "Entry",
    "HistoryPoint",
    "Point",
    "Version",
    "fold",
    "parse_at",
    "parse_entry",
    "stream_id_ms",
]

DEFAULT_HISTORY_PAGE = 500
"""Entries read per XRANGE/XREVRANGE of the history stream."""

_STREAM_ID = re.compile(r"(0|[1-9][0-9]{0,19})-(0|[1-9][0-9]{0,19})")
_FIELDS = frozenset({b"v", b"op", b"d", b"z", b"t", b"e"})


@dataclasses.dataclass(frozen=True, slots=True)
class Version:
    """One version of a run, as its history entry tells it."""

    version: int
    """The run's version after the change (``backend.version``)."""
    id: str
    """The history entry's stream id (``<ms>-<seq>``, the server's clock)."""
    time: dt.datetime
    """When the version was made: the entry id's milliseconds, UTC."""
    op: str
    """The operation: ``init``, ``append``, ``result``, ``session``, ``claim``, ``save``..."""
    event_id: str | None
    """An ``append``: the id of the last event it appended (its log entry)."""
    base: bool
    """True when the entry holds the whole state (init, save, restore, or where the history
    starts again)."""
    changes: tuple[str, ...]
    """What changed, one short text each: ``status completed``, ``result <agent> ok``,
    ``started <agent>``, ``phase 2``, ``findings <segment>``... (empty: only the version and
    ``updated_at``, as a claim's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One history entry as stored (checked): what :func:`fold` applies."""

    version: int
    id: str
    op: str
    body: bytes | None
    """``d`` or ``z``: the records (None: a change of nothing but the version)."""
    base: bool
    updated_at: int | None
    """``t``: the change's ``updated_at`` when it is not the id's second."""
    event: str | None
    """``e``: the last appended event's id, when it is not the entry's own."""

    @property
    def event_id(self) -> str | None:
        """The id of the last event an ``append`` appended (None for other operations)."""
        if self.op != "append":
            return None
        return self.event or self.id

    @property
    def seconds(self) -> int:
        """The change's ``updated_at``."""
        return self.updated_at if self.updated_at is not None else stream_id_ms(self.id) // 1000

    def describe(self, key: str) -> Version:
        """This entry as a :class:`Version` (its records read for ``changes``)."""
        ms = stream_id_ms(self.id)
        return Version(self.version, self.id, dt.datetime.fromtimestamp(ms / 1000, dt.UTC),
                       self.op, self.event_id, self.base, _changes(self, key))  # fmt: skip


def stream_id_ms(entry_id: str) -> int:
    """The milliseconds of a stream id ``<ms>-<seq>``."""
    return int(entry_id.partition("-")[0])


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def parse_entry(key: str, raw_id: Any, fields: Any) -> Entry:
    """A history entry from an XRANGE reply's ``(id, fields)``: CorruptDataError naming the
    key and the field when it is not one this version wrote."""
    entry_id = _text(raw_id)
    if isinstance(fields, dict):
        values = {k if isinstance(k, bytes) else str(k).encode(): v for k, v in fields.items()}
    else:
        flat = list(fields)
        values = dict(zip(flat[::2], flat[1::2], strict=True))
    where = f"{key} {entry_id}"
    unknown = set(values) - _FIELDS
    if unknown:
        raise CorruptDataError(where, _text(min(unknown)), "not a field of a history entry")
    raw_v, raw_op = values.get(b"v"), values.get(b"op")
    if not isinstance(raw_v, bytes) or not raw_v.isdigit() or len(raw_v) > 20:
        raise CorruptDataError(where, "v", "is not a version")
    if not isinstance(raw_op, bytes) or not raw_op or not raw_op.isascii():
        raise CorruptDataError(where, "op", "is not an operation name")
    d, z = values.get(b"d"), values.get(b"z")
    if d is not None and z is not None:
        raise CorruptDataError(where, "z", "an entry holds d or z, not both")
    raw_t, raw_e = values.get(b"t"), values.get(b"e")
    if raw_t is not None and (not raw_t.isdigit() or len(raw_t) > 20):
        raise CorruptDataError(where, "t", "is not unix seconds")
    if raw_e is not None and _STREAM_ID.fullmatch(_text(raw_e)) is None:
        raise CorruptDataError(where, "e", "is not a stream id")
    return Entry(int(raw_v), entry_id, raw_op.decode(), z if z is not None else d,
                 z is not None, int(raw_t) if raw_t is not None else None,
                 _text(raw_e) if raw_e is not None else None)  # fmt: skip


def _delta(entry: Entry) -> Delta:
    op = b"save" if entry.base else b"change"  # a base is read as a whole-state delta
    return Delta("", entry.version - 1, "", entry.version, op, entry.body or b"", 0)


def fold(run_id: uuid.UUID, keys: RunKeys, entries: Sequence[Entry]) -> t.RunCheckpoint:
    """The checkpoint after the last of ``entries``: a base, then the changes after it, one
    version each, in order (CorruptDataError naming the history key otherwise)."""
    if not entries or not entries[0].base:
        raise CorruptDataError(keys.history, "", "a fold starts at a base")
    key = keys.history
    try:
        state = RunState.from_whole(run_id, keys, _delta(entries[0]))
    except (ValueError, IndexError) as exc:
        raise CorruptDataError(f"{key} {entries[0].id}", "z", f"unreadable: {exc}") from None
    if state.version != entries[0].version:
        raise CorruptDataError(f"{key} {entries[0].id}", "v",
                               f"the base holds version {state.version}")  # fmt: skip
    version = state.version
    for entry in entries[1:]:
        if entry.version != version + 1:
            raise CorruptDataError(f"{key} {entry.id}", "v",
                                   f"version {entry.version} follows {version}")  # fmt: skip
        if entry.base:
            state = RunState.from_whole(run_id, keys, _delta(entry))
            if state.version != entry.version:
                raise CorruptDataError(f"{key} {entry.id}", "v",
                                       f"the base holds version {state.version}")  # fmt: skip
        elif entry.body is not None:
            try:
                state = state.apply(_delta(entry), build=False)
            except (ValueError, IndexError) as exc:
                raise CorruptDataError(f"{key} {entry.id}", "d", f"unreadable: {exc}") from None
        if not entry.base:
            state.version = entry.version
            state.updated_at = entry.seconds
        version = entry.version
    return state.rebuild()


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """A point of a run's history: a version, an event id or a time (exactly one set)."""

    version: int | None = None
    event_id: str | None = None
    ms: int | None = None
    """A time, in unix milliseconds: the last version made at or before it."""

    def __str__(self) -> str:
        if self.version is not None:
            return f"version {self.version}"
        if self.event_id is not None:
            return f"event {self.event_id}"
        when = dt.datetime.fromtimestamp((self.ms or 0) / 1000, dt.UTC)
        return f"time {when.isoformat()}"


HistoryPoint = int | str | dt.datetime | Point
"""What ``checkpoint_at`` and ``fork_run`` take as ``at`` (see :func:`parse_at`)."""


def parse_at(at: HistoryPoint) -> Point:
    """A point from what a caller names: a version (``int``, or a decimal text), an event id
    (``"<ms>-<seq>"``), or a time (an aware ``datetime``, or ISO 8601 text; naive is UTC).
    ValidationError naming ``at`` otherwise."""
    if isinstance(at, Point):
        return at
    if isinstance(at, bool):
        raise ValidationError("at", "is a bool, not a version, event id or time")
    if isinstance(at, int):
        if at < 1 or at > t.U64_MAX:
            raise ValidationError("at", f"version {at} is not between 1 and 2^64-1")
        return Point(version=at)
    if isinstance(at, dt.datetime):
        when = at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
        return Point(ms=int(when.timestamp() * 1000))
    if isinstance(at, str):
        text = at.strip()
        if text.isdigit():
            return parse_at(int(text))
        if _STREAM_ID.fullmatch(text):
            return Point(event_id=text)
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValidationError(
                "at", f"{at!r} is not a version, an event id (<ms>-<seq>) or an ISO 8601 time"
            ) from None
        return parse_at(when)
    raise ValidationError("at", f"is a {type(at).__name__}, not a version, event id or time")


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream id as a pair of numbers, for ordering."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _short(text: str) -> str:
    return text[:8] if len(text) == 36 else text


def _changes(entry: Entry, key: str) -> tuple[str, ...]:
    """``Version.changes`` of ``entry`` (CorruptDataError when its records are unreadable)."""
    if entry.base:
        return ("whole state",)
    if entry.body is None:
        return ()
    try:
        parts = split_indexed(entry.body, 0)
    except ValueError as exc:
        raise CorruptDataError(f"{key} {entry.id}", "d", f"unreadable: {exc}") from None
    return tuple(_describe(parts))


def _describe(parts: list[bytes]) -> Iterable[str]:
    i, n = 0, len(parts)
    while i < n:
        tag = parts[i]
        if tag == b"R":
            value = parts[i + 2]
            shown = value.decode(errors="replace") if len(value) <= 40 and value.isascii() \
                else f"({len(value)} bytes)"
            yield f"{parts[i + 1].decode()} {shown}"
            i += 3
        elif tag == b"E":
            section, entity, count = parts[i + 1], parts[i + 2].decode(), int(parts[i + 3])
            attrs = dict(zip(parts[i + 4 : i + 4 + 2 * count : 2],
                             parts[i + 5 : i + 4 + 2 * count : 2], strict=True))  # fmt: skip
            name = {b"res": "result", b"ses": "session", b"ph": "phase"}.get(section, "?")
            if not count:
                yield f"{name} {_short(entity)} removed"
            elif section == b"res":
                yield f"result {_short(entity)} {attrs.get(b'status', b'?').decode()}"
            elif section == b"ses":
                yield f"session {_short(entity)} {attrs.get(b'status', b'?').decode()}"
            else:
                yield f"phase {entity}"
            i += 4 + 2 * count
        elif tag == b"S":
            yield f"started {_short(parts[i + 1].decode())}"
            i += 3
        elif tag == b"F":
            yield f"findings {_short(parts[i + 1].decode())}"
            i += 3
        elif tag == b"X":
            yield f"findings {_short(parts[i + 1].decode())} removed"
            i += 2
        else:
            raise ValueError(f"unknown record {tag[:8]!r}")
