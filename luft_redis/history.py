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
from typing import Any, NamedTuple

from . import types as t
from .cache import RunState
from .delta import split_indexed
from .errors import CorruptDataError, ValidationError
from .keys import RunKeys
from .wire import entry_id

__all__ = [
    "DEFAULT_HISTORY_PAGE",
    "Entry",
    "HistoryPoint",
    "Point",
    "Version",
    "base_incarnation",
    "fold",
    "parse_at",
    "parse_entry",
    "stream_id_ms",
]

DEFAULT_HISTORY_PAGE = 1000
"""Entries read per XRANGE/XREVRANGE of the history stream."""

_STREAM_ID = re.compile(r"(0|[1-9][0-9]{0,19})-(0|[1-9][0-9]{0,19})")
_FIELDS = frozenset({b"v", b"op", b"d", b"z", b"t", b"e", b"l"})
_FAST_FIELDS = frozenset({b"v", b"op", b"d", b"z"})
"""The fields of an entry read without further checks (t and e are checked each time)."""


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


class Entry(NamedTuple):
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
    log_last: str | None = None
    """``l`` (a base): the log's last event before this change's own events (None: an empty
    log); every event up to it came before the base."""

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


_OPS: dict[bytes, str] = {}
"""Operation names seen, decoded once."""


def parse_entry(key: str, raw_id: Any, fields: Any) -> Entry:
    """A history entry from an XRANGE reply's ``(id, fields)``: CorruptDataError naming the
    key and the field when it is not one this version wrote."""
    eid = raw_id.decode() if type(raw_id) is bytes else entry_id(raw_id)
    if type(fields) is dict and all(type(k) is bytes for k in fields):
        values: dict[bytes, Any] = fields
    elif isinstance(fields, dict):
        values = {k if isinstance(k, bytes) else str(k).encode(): v for k, v in fields.items()}
    else:
        flat = list(fields)
        values = dict(zip(flat[::2], flat[1::2], strict=True))
    get = values.get
    raw_v: Any = get(b"v")
    raw_op, d, z = get(b"op"), get(b"d"), get(b"z")
    op = _OPS.get(raw_op) if type(raw_op) is bytes else None
    if (len(values) > 3 or not values.keys() <= _FAST_FIELDS or op is None
            or type(raw_v) is not bytes or not raw_v.isdigit() or len(raw_v) > 20
            or (d is not None and z is not None)):  # fmt: skip
        op = _check_entry(f"{key} {eid}", values)
    raw_t, raw_e, raw_l = get(b"t"), get(b"e"), get(b"l")
    return Entry(int(raw_v), eid, op, z if z is not None else d, z is not None,
                 int(raw_t) if raw_t is not None else None,
                 entry_id(raw_e) if raw_e is not None else None,
                 entry_id(raw_l) if raw_l is not None else None)  # fmt: skip


def _check_entry(where: str, values: dict[bytes, Any]) -> str:
    """The operation of an entry off the fast path, every field checked (CorruptDataError)."""
    unknown = set(values) - _FIELDS
    if unknown:
        raise CorruptDataError(where, entry_id(min(unknown)), "not a field of a history entry")
    raw_v, raw_op = values.get(b"v"), values.get(b"op")
    if not isinstance(raw_v, bytes) or not raw_v.isdigit() or len(raw_v) > 20:
        raise CorruptDataError(where, "v", "is not a version")
    if (not isinstance(raw_op, bytes) or not raw_op or len(raw_op) > 32
            or not raw_op.replace(b"_", b"").isalpha() or not raw_op.isascii()):  # fmt: skip
        raise CorruptDataError(where, "op", "is not an operation name")
    if values.get(b"d") is not None and values.get(b"z") is not None:
        raise CorruptDataError(where, "z", "an entry holds d or z, not both")
    raw_t = values.get(b"t")
    if raw_t is not None and (not raw_t.isdigit() or len(raw_t) > 20):
        raise CorruptDataError(where, "t", "is not unix seconds")
    for name in (b"e", b"l"):
        raw = values.get(name)
        if raw is not None and _STREAM_ID.fullmatch(entry_id(raw)) is None:
            raise CorruptDataError(where, name.decode(), "is not a stream id")
    if len(_OPS) < 256:
        _OPS[raw_op] = raw_op.decode()
    return raw_op.decode()


class _Stored:
    """A run's keys as stored at one version, as bytes: what ``load`` would have read then.

    A change's records say what its script stored (``R`` a run field, ``E`` an entity's
    attributes as stored after the write, ``S`` a started agent's value, ``F``/``X`` a finding
    segment set or removed: includes/delta.lua), so the state of a version is its base with
    the records of the changes after it applied to the stored bytes, in order; it is decoded
    once, at the end, by the decoder of ``open_run``."""

    __slots__ = ("entities", "findings", "order", "run", "started")

    def __init__(self, parts: list[Any]) -> None:
        flat = parts[0]
        self.run: dict[bytes, bytes] = dict(zip(flat[::2], flat[1::2], strict=True))
        self.entities: dict[bytes, dict[bytes, dict[bytes, bytes]]] = {
            section: _grouped(parts[i]) for section, i in ((b"ph", 1), (b"res", 2), (b"ses", 3))
        }
        self.started: dict[bytes, bytes] = dict(zip(parts[4][::2], parts[4][1::2], strict=True))
        self.findings: dict[bytes, bytes] = dict(zip(parts[5][::2], parts[5][1::2], strict=True))
        self.order: list[bytes] = list(parts[6])

    def apply(self, parts: list[bytes]) -> None:
        """The records of one change (ValueError/IndexError/KeyError when malformed)."""
        blobs: dict[bytes, bytes] = {}
        i, n = 0, len(parts)
        while i < n:
            tag = parts[i]
            if tag == b"R":
                self.run[parts[i + 1]] = parts[i + 2]
                i += 3
            elif tag == b"E":
                section, entity, count = parts[i + 1], parts[i + 2], int(parts[i + 3])
                end = i + 4 + 2 * count
                if end > n or count < 0:
                    raise ValueError("truncated entity record")
                attrs = dict(zip(parts[i + 4 : end : 2], parts[i + 5 : end : 2], strict=True))
                if section == b"res" and attrs.get(b"findings") == b"":
                    attrs[b"findings"] = blobs[entity]  # the blob of this change's F record
                if attrs:
                    self.entities[section][entity] = attrs
                else:
                    self.entities[section].pop(entity, None)
                i = end
            elif tag == b"P":  # what changed: n attributes set, then m removed
                section, entity, count = parts[i + 1], parts[i + 2], int(parts[i + 3])
                end = i + 4 + 2 * count
                removed = int(parts[end])
                if count < 0 or removed < 0 or end + 1 + removed > n:
                    raise ValueError("truncated patch record")
                table = self.entities[section]
                attrs = dict(table.get(entity, {}))
                attrs.update(zip(parts[i + 4 : end : 2], parts[i + 5 : end : 2], strict=True))
                for name in parts[end + 1 : end + 1 + removed]:
                    attrs.pop(name, None)
                if attrs:
                    table[entity] = attrs
                else:
                    table.pop(entity, None)
                i = end + 1 + removed
            elif tag == b"S":
                self.started[parts[i + 1]] = parts[i + 2]
                i += 3
            elif tag == b"F":
                segment = parts[i + 1]
                if segment not in self.findings:
                    self.order.append(segment)
                self.findings[segment] = blobs[segment] = parts[i + 2]
                i += 3
            elif tag == b"X":
                if self.findings.pop(parts[i + 1], None) is not None:
                    self.order.remove(parts[i + 1])
                i += 2
            else:
                raise ValueError(f"unknown record {tag[:8]!r}")

    def reply(self) -> list[list[bytes]]:
        """The seven parts of ``load``'s reply."""
        entities = [_flat_grouped(self.entities[s]) for s in (b"ph", b"res", b"ses")]
        return [_flat(self.run), *entities, _flat(self.started), _flat(self.findings),
                self.order]  # fmt: skip


def _grouped(flat: Sequence[bytes]) -> dict[bytes, dict[bytes, bytes]]:
    """``<id>:<attr>`` fields of a hash as {id: {attr: value}}."""
    out: dict[bytes, dict[bytes, bytes]] = {}
    for i in range(0, len(flat), 2):
        entity, _, attr = flat[i].partition(b":")
        out.setdefault(entity, {})[attr] = flat[i + 1]
    return out


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    return [part for pair in fields.items() for part in pair]


def _flat_grouped(entities: dict[bytes, dict[bytes, bytes]]) -> list[bytes]:
    return [part for entity, attrs in entities.items() for attr, value in attrs.items()
            for part in (entity + b":" + attr, value)]  # fmt: skip


def _base(keys: RunKeys, entry: Entry) -> _Stored:
    where = f"{keys.history} {entry.id}"
    try:
        parts = split_indexed(entry.body or b"", 0)
        if not parts or parts[0] != b"Z":
            raise ValueError("not a Z record")
        out: list[Any] = []
        i = 1
        for _ in range(7):
            count = int(parts[i])
            out.append(parts[i + 1 : i + 1 + count])
            i += 1 + count
        if i != len(parts):
            raise ValueError("trailing parts")
        stored = _Stored(out)
    except (ValueError, IndexError) as exc:
        raise CorruptDataError(where, "z", f"unreadable: {exc}") from None
    if stored.run.get(b"version") != str(entry.version).encode():
        raise CorruptDataError(where, "v", f"the base holds version {stored.run.get(b'version')!r}")
    return stored


def base_incarnation(keys: RunKeys, entry: Entry) -> str:
    """The incarnation a base's run hash holds ("" for none)."""
    return entry_id(_base(keys, entry).run.get(b"incarnation", b""))


def fold(run_id: uuid.UUID, keys: RunKeys, entries: Sequence[Entry]) -> RunState:
    """The state after the last of ``entries``: a base, then the changes after it, one
    version each, in order (CorruptDataError naming the history key otherwise), decoded as
    ``open_run`` decodes a load (:meth:`luft_redis.cache.RunState.from_load`)."""
    if not entries or not entries[0].base:
        raise CorruptDataError(keys.history, "", "a fold starts at a base")
    stored = _base(keys, entries[0])
    version = entries[0].version
    for entry in entries[1:]:
        if entry.version != version + 1:
            raise CorruptDataError(f"{keys.history} {entry.id}", "v",
                                   f"version {entry.version} follows {version}")  # fmt: skip
        version = entry.version
        if entry.base:
            stored = _base(keys, entry)
            continue
        if entry.body is not None:
            try:
                stored.apply(split_indexed(entry.body, 0))
            except (ValueError, IndexError, KeyError) as exc:
                raise CorruptDataError(f"{keys.history} {entry.id}", "d",
                                       f"unreadable: {exc!r}") from None  # fmt: skip
        stored.run[b"version"] = str(version).encode()
        stored.run[b"updated_at"] = str(entry.seconds).encode()
    return RunState.from_load(run_id, keys, stored.reply())


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
        return tuple(_describe(split_indexed(entry.body, 0)))
    except (ValueError, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptDataError(f"{key} {entry.id}", "d", f"unreadable: {exc}") from None


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
        elif tag == b"P":
            section, entity, count = parts[i + 1], parts[i + 2].decode(), int(parts[i + 3])
            end = i + 4 + 2 * count
            names = [name.decode() for name in parts[i + 4 : end : 2]]
            gone = [name.decode() for name in parts[end + 1 : end + 1 + int(parts[end])]]
            what = {b"res": "result", b"ses": "session", b"ph": "phase"}.get(section, "?")
            changed = ", ".join([*names, *(f"-{name}" for name in gone)])
            yield f"{what} {_short(entity)} ({changed})"
            i = end + 1 + len(gone)
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
