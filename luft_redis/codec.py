"""The stored (binary) forms of contract values, and their decoding with explicit checks.

Blobs are msgpack, each behind a two-byte header: ``0xC1`` (a byte msgpack never uses) and the
number of the stored format that wrote it (:data:`FORMAT`). A blob without the header was
written by 0.1.0: format 1. Readers accept every format this library ever wrote and refuse a
newer one with a :class:`~luft_redis.errors.CorruptDataError` that names its number.

Events use a compact positional form (field names are not stored, they are the schema's): a
msgpack array of the variant's fields in the order of :data:`FIELDS`, where

* the run id is left out (it is the stream's; ``signal_received`` keeps a flag for ``null``),
* UUIDs are 16 raw bytes,
* timestamps are msgpack timestamps (extension type -1: seconds and nanoseconds) in format 2,
  integer microseconds since the epoch in format 1,
* enums are their code in :data:`ENUM_CODES`, nested records arrays of the same kind,
* trailing fields equal to their default are dropped.

The tables fix every position and code for good; ``docs/redis-layout.md`` documents them, and
``tests/golden/`` holds blobs and runs of every format, read by the tests forever after.

Decoding checks every value as :mod:`luft_redis.types` does for JSON, and reports anything that
does not fit as :class:`~luft_redis.errors.CorruptDataError` naming the key and field. msgpack
is unpacked with size limits; nothing stored is ever evaluated or unpickled.
"""

from __future__ import annotations

import collections
import datetime as _dt
import itertools
import operator
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from . import types as t
from .errors import CorruptDataError, ValidationError

__all__ = [
    "BLOB_HEADER",
    "DATA_BODY",
    "DELTA_KIND_CODES",
    "EMPTY_LIST",
    "ENTRY_NAMES",
    "ENUM_CODES",
    "FIELDS",
    "FORMAT",
    "FORMATS",
    "MAX_BLOB_SIZE",
    "TOKEN_NAMES",
    "decode_entry",
    "decode_event",
    "decode_findings",
    "decode_json",
    "encode_entry",
    "encode_entry_parts",
    "encode_event",
    "encode_findings",
    "encode_json",
    "nested_position",
    "stored_blob",
]

MAX_BLOB_SIZE = 512 * 1024 * 1024
"""Largest blob the decoder accepts (Redis' own limit for a string)."""

EMPTY_LIST = msgpack.packb([])
"""msgpack of an empty array: what the Lua scripts take for "no findings" (an argument they
receive, never a stored blob: luft-redis sends no encoded empty finding list)."""

FORMAT = 3
"""The stored format this version writes: the byte after :data:`MARKER` in every blob, and
the layout of a stream entry (format 3: readable fields, see :func:`encode_entry`)."""

FORMATS = (1, 2, 3)
"""Every stored format this version reads: 1 (0.1.0, no header), 2 and 3. Formats 2 and 3
write the same blob bodies; they differ in the stream entry (``type`` and one ``data`` blob of
the whole event in format 1 and 2, plain-text fields in format 3)."""

MARKER = 0xC1
"""First byte of a blob with a format header (msgpack never uses it)."""

_HEADER = bytes((MARKER, FORMAT))
_HEADER_2 = bytes((MARKER, 2))
_US = _dt.timedelta(microseconds=1)

Packer = Callable[[Any], Any]
Unpacker = Callable[[Any, str], Any]


# --------------------------------------------------------------------------------------------
# The tables of the stored form: field positions and enum codes, fixed once written.
#
# A record is stored as the array of its fields in the order given here, never in the order
# of the Python declaration. A field added to a record is appended to its tuple (and must have
# a default, which is what older blobs, lacking it, read as); an enum member gets the next
# free code. Nothing is ever renumbered, reordered or removed: stored data depends on it.
# ``_check_tables`` below refuses to import when a record or enum and its table disagree.
# --------------------------------------------------------------------------------------------

FIELDS: dict[str, tuple[str, ...]] = {
    # value types inside events and finding lists
    "TokenUsage": ("input", "output", "cache_read", "cache_write"),
    "Location": ("file", "line"),
    "Finding": ("kind", "severity", "title", "detail", "location", "evidence", "data"),
    "PlanPhase": ("label", "dynamic", "description"),
    # progress deltas (after their kind code, see DELTA_KIND_CODES)
    "ProgressMessage": ("text",),
    "ProgressToolCall": ("name", "summary"),
    "ProgressFileEdit": ("path",),
    "ProgressTokens": ("usage",),
    # events, by "type"; the run id is not stored (it is the stream's), except for
    # signal_received, whose array starts with a flag: true = the stream's run id, false = null
    "run_started": ("task", "ts"),
    "phase_started": ("phase_id", "label", "planned", "description", "role", "ts"),
    "agent_started": ("phase_id", "agent_id", "prompt_preview", "model", "description", "role",
                      "name", "agent_seq", "ts"),
    "agent_progress": ("agent_id", "delta"),
    "acp_raw": ("agent_id", "kind", "raw"),
    "acp_request": ("agent_id", "method", "raw"),
    "agent_done": ("agent_id", "status", "tokens", "elapsed_ms", "name", "agent_seq", "ts",
                   "output", "findings", "prompt", "retry_count"),
    "phase_done": ("phase_id", "ok", "failed", "ts"),
    "run_done": ("status", "total_tokens", "report", "ts"),
    "log": ("agent_id", "level", "msg"),
    "budget_set": ("time_limit_ms", "max_rounds"),
    "report_emitted": ("phase_id", "report"),
    "parallel_started": ("phase_id", "span_id", "count"),
    "parallel_done": ("phase_id", "span_id", "ok", "failed", "results", "elapsed_ms"),
    "workflow_started": ("span_id", "path", "args"),
    "workflow_done": ("span_id", "path", "report", "elapsed_ms", "error"),
    "converge_started": ("phase_id", "span_id", "items", "max_rounds"),
    "converge_done": ("phase_id", "span_id", "rounds", "converged", "surviving", "result",
                      "elapsed_ms", "error"),
    "pipeline_started": ("total_stages", "items"),
    "pipeline_stage_started": ("stage_index", "label", "agents_in_stage"),
    "pipeline_item_done": ("stage_index", "item_index", "status", "tokens", "elapsed_ms"),
    "pipeline_done": ("stages_completed", "total_ok", "total_failed"),
    "schema_retry": ("agent_id", "attempt", "max"),
    "plan_preview": ("reasoning", "phases"),
    "signal_received": ("signal", "ts"),
}  # fmt: skip
"""Field positions of every record stored as an array (events by their ``"type"``)."""

ENUM_CODES: dict[str, dict[str, int]] = {
    "Severity": {"info": 0, "low": 1, "medium": 2, "high": 3, "critical": 4},
    "AgentStatus": {"Ok": 0, "Error": 1, "Cancelled": 2, "TimedOut": 3},
    "RunStatus": {"completed": 0, "failed": 1, "cancelled": 2, "partial": 3},
    "LogLevel": {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4},
}
"""The stored code of every enum member, by enum and JSON value."""

DELTA_KIND_CODES: dict[str, int] = {"message": 0, "tool_call": 1, "file_edit": 2, "tokens": 3}
"""The code that starts a stored progress delta, by its ``"kind"``."""

_WIDER: dict[int, dict[tuple[str, str], t._Kind]] = {
    1: {
        ("Location", "line"): t._OptionalKind(t._IntKind("u64", t.U64_MAX)),
        ("budget_set", "max_rounds"): t._OptionalKind(t._IntKind("u64", t.U64_MAX)),
    },
}
"""Per format, fields that luft types as u32 but that format accepted (and stored) up to
2^64-1: read back with the width they were written with, so a stored run stays readable."""

_DELTA_CODE = {t._DELTA_KINDS[kind]: code for kind, code in DELTA_KIND_CODES.items()}
_DELTA_BY_CODE = {code: cls for cls, code in _DELTA_CODE.items()}


def _check_tables() -> None:
    """Every stored record and enum matches its table exactly (run at import)."""
    stored: list[type[t.Record]] = [
        t.TokenUsage, t.Location, t.Finding, t.PlanPhase, *t._DELTA_KINDS.values(),
        *t.EVENT_TYPES.values(),
    ]  # fmt: skip
    names = {_table_name(cls) for cls in stored}
    if set(FIELDS) != names:
        raise RuntimeError(f"codec.FIELDS lacks or has extra records: {set(FIELDS) ^ names}")
    for cls in stored:
        declared = {s.name for s in cls._field_specs()} - (
            {"run_id"} if issubclass(cls, t.AgentEvent) else set()
        )
        table = FIELDS[_table_name(cls)]
        if len(set(table)) != len(table) or set(table) != declared:
            raise RuntimeError(
                f"codec.FIELDS[{_table_name(cls)!r}] does not match the fields of "
                f"{cls.__name__}: append a new field at the end, never reorder"
            )
    enums = {k.enum.__name__: k.enum for cls in stored for s in cls._field_specs()
             for k in _kinds(s.kind) if isinstance(k, t._EnumKind)}  # fmt: skip
    if set(ENUM_CODES) != set(enums):
        raise RuntimeError(f"codec.ENUM_CODES lacks or has extra enums: {set(ENUM_CODES)}")
    for name, codes in [*ENUM_CODES.items(), ("ProgressDelta", DELTA_KIND_CODES)]:
        values = set(t._DELTA_KINDS) if name == "ProgressDelta" else {
            m.value for m in enums[name]}  # fmt: skip
        if set(codes) != values or len(set(codes.values())) != len(codes):
            raise RuntimeError(f"codec codes of {name} do not match its members: give a new "
                               "member the next free code, never renumber")  # fmt: skip


def _kinds(kind: t._Kind) -> list[t._Kind]:
    """``kind`` and the kinds inside it (optional, tuple)."""
    if isinstance(kind, t._OptionalKind):
        return [kind, *_kinds(kind.inner)]
    if isinstance(kind, t._TupleKind):
        return [kind, *_kinds(kind.item)]
    return [kind]


class _Bad(Exception):
    """A stored value does not fit its schema; carries the path inside the blob."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message

    def inside(self, path: str, step: str) -> _Bad:
        """This error, seen from the value at ``path`` that holds the failing one at ``step``
        (a field name, or ``[i]``). Nested values are decoded with an empty path and prefixed
        only when they fail, so decoding builds no path strings."""
        inner = self.path
        if inner and not inner.startswith("["):
            inner = "." + inner
        full = step + inner
        if path:
            full = path + ("" if full.startswith("[") else ".") + full
        return _Bad(full, self.message)


class _Newer(Exception):
    """A blob of a stored format newer than this version reads."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"stored format {version} was written by a newer luft-redis; this version reads "
            f"formats {FORMATS[0]} to {FORMATS[-1]}: upgrade luft-redis to read it"
        )


def _open(blob: bytes) -> tuple[int, Any]:
    """(format, unpacked body) of a blob. unpackb bounds every str/bin/array/map length by
    len(blob); extension types other than msgpack's timestamp (at most 12 bytes) come back as
    ``ExtType`` and fail the type checks."""
    if len(blob) > MAX_BLOB_SIZE:
        raise ValueError(f"blob of {len(blob)} bytes exceeds {MAX_BLOB_SIZE}")
    fmt, body = 1, memoryview(blob)
    if blob[:1] == b"\xc1":
        if len(blob) < 2:
            raise _Bad("", "truncated format header")
        fmt = blob[1]
        if fmt > FORMATS[-1]:
            raise _Newer(fmt)
        if fmt not in FORMATS or fmt == 1:  # format 1 has no header
            raise _Bad("", f"unknown stored format {fmt}")
        body = body[2:]
    return fmt, msgpack.unpackb(
        body, raw=False, strict_map_key=True, use_list=True, max_ext_len=12
    )


# --------------------------------------------------------------------------------------------
# Per-kind packers and unpackers, built once per record class from the types' field specs
# --------------------------------------------------------------------------------------------


def _ident(value: Any) -> Any:
    return value


def _unpack_int(hi: int, name: str) -> Unpacker:
    def unpack(x: Any, path: str) -> int:
        if type(x) is not int or not 0 <= x <= hi:
            raise _Bad(path, f"expected {name}, got {x!r}")
        return x

    return unpack


def _unpack_str(x: Any, path: str) -> str:
    if type(x) is not str:
        raise _Bad(path, f"expected a string, got {type(x).__name__}")
    return x


def _unpack_bool(x: Any, path: str) -> bool:
    if type(x) is not bool:
        raise _Bad(path, f"expected a boolean, got {type(x).__name__}")
    return x


def _unpack_uuid(x: Any, path: str) -> uuid.UUID:
    if type(x) is not bytes or len(x) != 16:
        raise _Bad(path, "expected 16 bytes of UUID")
    return uuid.UUID(bytes=x)


def _pack_ts_us(value: t.Timestamp) -> int:
    """Format 1: integer microseconds since the epoch (nanoseconds dropped)."""
    return (value - t.EPOCH) // _US


def _unpack_ts_us(x: Any, path: str) -> t.Timestamp:
    if type(x) is not int:
        raise _Bad(path, "expected integer microseconds")
    try:
        return t.Timestamp.from_unix_nanos(x * 1000)
    except OverflowError:
        raise _Bad(path, f"timestamp {x} out of range") from None


def _pack_ts_ns(value: t.Timestamp) -> msgpack.Timestamp:
    """Format 2: a msgpack timestamp, to the nanosecond."""
    seconds, nanos = divmod(value.unix_nanos(), 1_000_000_000)
    return msgpack.Timestamp(seconds, nanos)


def _unpack_ts_ns(x: Any, path: str) -> t.Timestamp:
    if type(x) is not msgpack.Timestamp:
        raise _Bad(path, "expected a msgpack timestamp")
    try:
        return t.Timestamp.from_unix_nanos(x.seconds * 1_000_000_000 + x.nanoseconds)
    except (OverflowError, ValueError):
        raise _Bad(path, f"timestamp {x.seconds}s {x.nanoseconds}ns is out of range") from None


_TS_CODECS: dict[int, tuple[Packer, Unpacker]] = {
    1: (_pack_ts_us, _unpack_ts_us),
    2: (_pack_ts_ns, _unpack_ts_ns),
    3: (_pack_ts_ns, _unpack_ts_ns),  # no blob of format 3 holds one: ts is an entry field
}


def _unpack_json(x: Any, path: str) -> Any:
    try:
        return t.freeze_json(x, path)
    except ValidationError as exc:
        raise _Bad(exc.field, exc.message) from None


def _optional(pack: Packer, unpack: Unpacker) -> tuple[Packer, Unpacker]:
    def opt_pack(value: Any) -> Any:
        return None if value is None else pack(value)

    if pack is _ident:  # None packs as itself
        opt_pack = _ident

    def opt_unpack(x: Any, path: str) -> Any:
        return None if x is None else unpack(x, path)

    return opt_pack, opt_unpack


def _tuple(pack: Packer, unpack: Unpacker) -> tuple[Packer, Unpacker]:
    def tuple_pack(value: Any) -> Any:
        return [pack(v) for v in value]

    if pack is _ident:  # msgpack packs a tuple as an array, as it does a list
        tuple_pack = _ident

    def tuple_unpack(x: Any, path: str) -> tuple[Any, ...]:
        if type(x) is not list:
            raise _Bad(path, "expected an array")
        try:
            return tuple([unpack(v, "") for v in x])
        except _Bad as exc:
            for i, v in enumerate(x):  # find which item failed (errors only)
                try:
                    unpack(v, "")
                except _Bad:
                    raise exc.inside(path, f"[{i}]") from None
            raise  # pragma: no cover - the same values failed once

    return tuple_pack, tuple_unpack


def _enum(enum_cls: type[t._StrEnum]) -> tuple[Packer, Unpacker]:
    codes = ENUM_CODES[enum_cls.__name__]
    index = {enum_cls(value): code for value, code in codes.items()}
    members = {code: member for member, code in index.items()}

    def enum_pack(value: Any) -> int:
        return index[value]

    def enum_unpack(x: Any, path: str) -> Any:
        member = members.get(x) if type(x) is int else None
        if member is None:
            raise _Bad(path, f"{x!r} is not a {enum_cls.__name__} code")
        return member

    return enum_pack, enum_unpack


def _delta(fmt: int) -> tuple[Packer, Unpacker]:
    def delta_pack(value: Any) -> list[Any]:
        return [_DELTA_CODE[type(value)], *_record_codec(type(value), fmt)[0](value)]

    def delta_unpack(x: Any, path: str) -> Any:
        if type(x) is not list or not x or type(x[0]) is not int or x[0] not in _DELTA_BY_CODE:
            raise _Bad(path, "expected a progress delta")
        return _record_codec(_DELTA_BY_CODE[x[0]], fmt)[1](x[1:], path)

    return delta_pack, delta_unpack


def _kind_codec(kind: t._Kind, fmt: int) -> tuple[Packer, Unpacker]:
    if isinstance(kind, t._IntKind):
        return _ident, _unpack_int(kind.hi, kind.name)
    if isinstance(kind, t._StrKind):
        return _ident, _unpack_str
    if isinstance(kind, t._BoolKind):
        return _ident, _unpack_bool
    if isinstance(kind, t._UuidKind):
        return (lambda v: v.bytes), _unpack_uuid
    if isinstance(kind, t._TsKind):
        return _TS_CODECS[fmt]
    if isinstance(kind, t._JsonKind):
        return _ident, _unpack_json
    if isinstance(kind, t._EnumKind):
        return _enum(kind.enum)
    if isinstance(kind, t._OptionalKind):
        return _optional(*_kind_codec(kind.inner, fmt))
    if isinstance(kind, t._TupleKind):
        return _tuple(*_kind_codec(kind.item, fmt))
    if isinstance(kind, t._RecordKind):
        return _record_codec(kind.cls, fmt)
    if isinstance(kind, t._DeltaKind):
        return _delta(fmt)
    raise TypeError(f"no stored form for {kind!r}")


_RECORD_CODECS: dict[tuple[type[t.Record], int], tuple[Packer, Unpacker]] = {}


def _table_name(cls: type[t.Record]) -> str:
    return cls.TYPE if issubclass(cls, t.AgentEvent) else cls.__name__


def _record_codec(cls: type[t.Record], fmt: int = FORMAT) -> tuple[Packer, Unpacker]:
    """(pack, unpack) for a record class in stored format ``fmt``: a positional array in the
    order of :data:`FIELDS`, trailing defaults dropped."""
    codec = _RECORD_CODECS.get((cls, fmt))
    if codec is not None:
        return codec
    table = _table_name(cls)
    wider = _WIDER.get(fmt, {})
    by_name = {s.name: s for s in cls._field_specs()}
    specs = [by_name[name] for name in FIELDS[table]]
    names = [s.name for s in specs]
    codecs = [_kind_codec(wider.get((table, s.name), s.kind), fmt) for s in specs]
    packers = [c[0] for c in codecs]
    unpackers = [c[1] for c in codecs]
    defaults: list[Any] = []
    first_optional = len(specs)
    for i, spec in enumerate(specs):
        if spec.has_default:
            defaults.append(packers[i](spec.default))
        elif spec.kind.nullable:
            defaults.append(None)
        else:
            defaults.append(_NO_DEFAULT)
            first_optional = i + 1
    n = len(specs)
    # the fields' values in one C call; only the fields whose stored form differs from the
    # value (UUIDs, enums, timestamps, records...) go through a packer
    values = operator.attrgetter(*names) if n > 1 else (lambda v: (getattr(v, names[0]),))
    convert = [(i, p) for i, p in enumerate(packers) if p is not _ident]

    def pack(value: Any) -> list[Any]:
        out = list(values(value))
        for j, p in convert:
            out[j] = p(out[j])
        i = n
        while i > first_optional and out[i - 1] == defaults[i - 1]:
            i -= 1
        del out[i:]
        return out

    setters = t.slot_setters(cls, names)
    missing = [(setter, spec.default if spec.has_default else None)
               for setter, spec in zip(setters, specs, strict=True)]  # fmt: skip
    steps = list(zip(setters, unpackers, strict=True))
    new = object.__new__

    def unpack(x: Any, path: str) -> Any:
        if type(x) is not list or not first_optional <= len(x) <= n:
            raise _Bad(path, f"expected a {cls.__name__} array")
        value = new(cls)  # as cls._trusted: every field is checked here
        i = 0
        try:
            for (setter, unpacker), item in zip(steps, x, strict=False):  # x may be short
                setter(value, unpacker(item, ""))
                i += 1
        except _Bad as exc:
            raise exc.inside(path, names[i]) from None
        for setter, default in missing[len(x):]:
            setter(value, default)
        return value

    codec = (pack, unpack)
    _RECORD_CODECS[cls, fmt] = codec
    return codec


_NO_DEFAULT = object()


# --------------------------------------------------------------------------------------------
# Public encoders / decoders
# --------------------------------------------------------------------------------------------


def encode_event(event: t.AgentEvent) -> bytes:
    """The whole event as one format-2 blob (its run id left out): the ``data`` field of the
    entries formats 1 and 2 wrote. Format 3 writes readable fields instead
    (:func:`encode_entry`); this stays for tools and tests that build an older entry."""
    body = _record_codec(type(event), 2)[0](event)
    if type(event) is t.SignalReceived:
        body.insert(0, event.run_id is not None)
    return _HEADER_2 + msgpack.packb(body)  # type: ignore[no-any-return]


def decode_event(
    type_name: str, blob: bytes, run_id: uuid.UUID, *, key: str, entry_id: str
) -> t.AgentEvent:
    """Decode a stream entry of ``key`` (any format in :data:`FORMATS`) back into exactly the
    event appended."""
    where = f"entry {entry_id}"
    cls = t.EVENT_TYPES.get(type_name)
    if cls is None:
        raise CorruptDataError(key, f"{where} type", f"unknown event type {type_name!r}")
    try:
        fmt, body = _open(blob)
        if fmt >= 3:
            raise _Bad("", f"the data of a format-{fmt} entry holds only the nested fields: "
                           "decode the whole entry (codec.decode_entry)")
        if type(body) is not list:
            raise _Bad("", "expected an array")
        event_run: uuid.UUID | None = run_id
        if cls is t.SignalReceived:
            if not body or type(body[0]) is not bool:
                raise _Bad("run_id", "expected a flag")
            event_run = run_id if body.pop(0) else None
        event = _record_codec(cls, fmt)[1](body, "")
        object.__setattr__(event, "run_id", event_run)
        return event  # type: ignore[no-any-return]
    except (_Bad, _Newer) as exc:
        raise CorruptDataError(key, f"{where} data", f"{type_name}: {exc}") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, f"{where} data", f"not msgpack: {exc}") from None


def encode_json(value: Any) -> bytes:
    """The stored form of a (checked) JSON value: msgpack, in format :data:`FORMAT`."""
    blob: bytes = _HEADER + msgpack.packb(value)
    return blob


def decode_json(blob: bytes, *, key: str, field: str) -> Any:
    """The frozen JSON value stored in ``key``/``field`` (any format in :data:`FORMATS`)."""
    try:
        return _unpack_json(_open(blob)[1], "")
    except (_Bad, _Newer) as exc:
        raise CorruptDataError(key, field, str(exc)) from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, field, f"not msgpack: {exc}") from None


_check_tables()
_FINDINGS = {fmt: _tuple(*_record_codec(t.Finding, fmt)) for fmt in FORMATS}




def encode_findings(findings: tuple[t.Finding, ...]) -> bytes:
    """Stored form of a non-empty list of findings (positional arrays, like events), in format
    :data:`FORMAT`. (An empty list is never stored: see :data:`EMPTY_LIST`.)"""
    blob: bytes = _HEADER + msgpack.packb(_FINDINGS[FORMAT][0](findings))
    return blob


def decode_findings(blob: bytes, *, key: str, field: str) -> tuple[t.Finding, ...]:
    """The findings stored in ``key``/``field`` (any format in :data:`FORMATS`)."""
    try:
        fmt, body = _open(blob)
        return _FINDINGS[fmt][1](body, "")  # type: ignore[no-any-return]
    except (_Bad, _Newer) as exc:
        raise CorruptDataError(key, field, str(exc)) from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, field, f"not msgpack: {exc}") from None


# --------------------------------------------------------------------------------------------
# Stream entries (format 3): the event's scalar fields as plain text, the nested ones in a blob
# --------------------------------------------------------------------------------------------

ENTRY_NAMES: dict[str, str] = {
    # the fields of the frequent events (agent_*, phase_*): one or two letters
    "agent_id": "a", "phase_id": "ph", "status": "st", "elapsed_ms": "ms", "name": "n",
    "agent_seq": "seq", "ts": "ts", "prompt": "p", "retry_count": "rc", "description": "d",
    "role": "r", "prompt_preview": "pv", "model": "m", "level": "lv",
    # the others: their name, or a short form of it
    "task": "task", "label": "label", "planned": "planned", "kind": "kind",
    "method": "method", "ok": "ok", "failed": "failed", "msg": "msg",
    "time_limit_ms": "limit_ms", "max_rounds": "max_rounds", "span_id": "span",
    "count": "count", "path": "path", "error": "error", "items": "items", "rounds": "rounds",
    "converged": "converged", "surviving": "surviving", "total_stages": "stages",
    "stage_index": "stage", "agents_in_stage": "agents", "item_index": "item",
    "stages_completed": "stages", "total_ok": "ok", "total_failed": "failed",
    "attempt": "attempt", "max": "max", "reasoning": "reasoning", "signal": "signal",
}  # fmt: skip
"""The stream field of every scalar event field in a format-3 entry, by the contract's field
name: the same name for the same field in every event type, and short, because a stream
stores the field names of every entry whose fields differ from the first entry of its node,
which in a mixed log is most entries. Fixed once written, like :data:`FIELDS`."""

TOKEN_NAMES: dict[str, str] = {
    "input": "in", "output": "out", "cache_read": "cr", "cache_write": "cw",
}  # fmt: skip
"""The stream fields of an event's token usage (``tokens``, ``total_tokens``): one per
``TokenUsage`` field, each left out when 0."""

ENTRY_RESERVED = ("type", "run", "data")
"""The stream fields of a format-3 entry that are no event field: ``type`` first (the event
type, as in formats 1 and 2), ``run`` (``null``: a ``signal_received`` without a run id) and
``data`` last: the format header then the msgpack array of the nested fields (JSON values,
lists, records, progress deltas) in the order of :data:`FIELDS`, trailing defaults left out;
no ``data`` field when that array would be empty. A reader of formats 1 and 2 decodes
``data`` as the whole event: it refuses an entry with one as written by a newer luft-redis
(``stored format 3``), and one without as lacking its data field; it never misreads one."""

_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,19}")


def _unpack_decimal(hi: int, name: str) -> Unpacker:
    def unpack_int(raw: bytes, path: str) -> int:
        value = int(raw) if _DECIMAL.fullmatch(raw) else -1
        if not 0 <= value <= hi:
            raise _Bad(path, f"expected a decimal {name}, got {raw[:40]!r}")
        return value

    return unpack_int


_U64_TEXT = _unpack_decimal(t.U64_MAX, "u64")
_NANOS = re.compile(rb"-?(?:0|[1-9][0-9]{0,20})")


def _ts_text(value: t.Timestamp) -> str:
    """A timestamp as decimal nanoseconds since the Unix epoch (negative before it): an
    integer Redis stores in 8 bytes up to the year 2262 (an RFC 3339 text takes 30)."""
    return str(value.unix_nanos())


def _unpack_ts_text(raw: bytes, path: str) -> t.Timestamp:
    if _NANOS.fullmatch(raw) and raw != b"-0":
        try:
            return t.Timestamp.from_unix_nanos(int(raw))
        except OverflowError:
            pass
    raise _Bad(path, f"expected decimal nanoseconds since the epoch, got {raw[:40]!r}")


def _text(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(path, "is not UTF-8 text") from None


def _scalar_text(kind: t._Kind) -> tuple[Callable[[Any], str], Unpacker] | None:
    """(to text, from bytes) of a scalar kind (optional ones: of the inner kind; ``None`` is
    the field left out), or ``None`` for a nested kind (it goes into ``data``)."""
    if isinstance(kind, t._OptionalKind):
        return _scalar_text(kind.inner)
    if isinstance(kind, t._IntKind):
        return str, _unpack_decimal(kind.hi, kind.name)
    if isinstance(kind, t._StrKind):
        return _ident, _text
    if isinstance(kind, t._BoolKind):
        def unpack_bool(raw: bytes, path: str) -> bool:
            if raw not in (b"true", b"false"):
                raise _Bad(path, f"expected true or false, got {raw[:40]!r}")
            return raw == b"true"

        return (lambda v: "true" if v else "false"), unpack_bool
    if isinstance(kind, t._UuidKind):
        def unpack_uuid(raw: bytes, path: str) -> uuid.UUID:
            try:
                if len(raw) == 36:
                    return uuid.UUID(raw.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                pass
            raise _Bad(path, f"expected a UUID, got {raw[:40]!r}")

        return str, unpack_uuid
    if isinstance(kind, t._TsKind):
        return _ts_text, _unpack_ts_text
    if isinstance(kind, t._EnumKind):
        enum_cls = kind.enum
        members = {m.value.encode(): m for m in enum_cls}

        def unpack_enum(raw: bytes, path: str) -> Any:
            member = members.get(raw)
            if member is None:
                raise _Bad(path, f"{raw[:40]!r} is not a {enum_cls.__name__}")
            return member

        return (lambda v: v.value), unpack_enum
    return None


_ARRAYS = [bytes((0x90 | n,)) for n in range(16)]
"""The msgpack header of an array of ``n`` items (a fixarray): ``data`` is this header, then
each nested field packed on its own (what ``msgpack.packb`` of the list gives)."""


class _EntryPlan:
    """How one event type is stored as a format-3 entry (built once per type)."""

    def __init__(self, cls: type[t.AgentEvent]) -> None:
        self.cls = cls
        self.type = cls.TYPE
        by_name = {s.name: s for s in cls._field_specs()}
        # scalars: (attribute, stream name, to text, default or _NO_DEFAULT)
        self.scalars: list[tuple[str, str, Callable[[Any], str], Any]] = []
        self.tokens: list[str] = []  # attributes holding a TokenUsage (flattened)
        self.nested: list[str] = []
        self.unpack: dict[bytes, tuple[str, Unpacker]] = {}
        self.required: list[tuple[str, str]] = []  # (attribute, stream name)
        self.missing: dict[str, Any] = {}  # attribute: value when its field is left out
        for name in FIELDS[self.type]:
            spec = by_name[name]
            kind = spec.kind
            if isinstance(kind, t._RecordKind) and kind.cls is t.TokenUsage:
                self.tokens.append(name)
                self.scalars.append((name, "", _ident, _NO_DEFAULT))  # "": the token fields
                for sub, short in TOKEN_NAMES.items():
                    self.unpack[short.encode()] = (f"{name}.{sub}", _U64_TEXT)
                continue
            text = _scalar_text(kind)
            if text is None:
                self.nested.append(name)
                continue
            short = ENTRY_NAMES[name]
            if spec.has_default:
                default = spec.default
                if kind.nullable and default is not None:
                    raise RuntimeError(f"{self.type}.{name}: a nullable field with a default "
                                       "other than null has no entry form")  # fmt: skip
            elif kind.nullable:
                default = None
            else:
                default = _NO_DEFAULT
                self.required.append((name, short))
            if default is not _NO_DEFAULT:
                self.missing[name] = default
            self.scalars.append((name, short, text[0], default))
            self.unpack[short.encode()] = (name, text[1])
        names = [*ENTRY_RESERVED, *(s for _, s, _, _ in self.scalars if s)]
        if self.tokens:
            if set(TOKEN_NAMES) != set(FIELDS["TokenUsage"]):
                raise RuntimeError("codec.TOKEN_NAMES does not name every TokenUsage field")
            if len(self.tokens) > 1:
                raise RuntimeError(f"{self.type}: more than one TokenUsage field")
            names += TOKEN_NAMES.values()
        if len(set(names)) != len(names):
            raise RuntimeError(f"{self.type}: two fields share a stream field name")
        if len(self.nested) >= len(_ARRAYS):
            raise RuntimeError(f"{self.type}: more nested fields than a msgpack fixarray holds")
        self.nested_codec = [_kind_codec(by_name[n].kind, 3) for n in self.nested]
        self.nested_packers = [(n, c[0]) for n, c in zip(self.nested, self.nested_codec,
                                                         strict=True)]  # fmt: skip
        # the value of a nested field left out, and its packed form
        self.nested_values = [by_name[n].default if by_name[n].has_default
                              else (None if by_name[n].kind.nullable else _NO_DEFAULT)
                              for n in self.nested]  # fmt: skip
        self.nested_defaults = [v if v is _NO_DEFAULT else c[0](v)
                                for v, c in zip(self.nested_values, self.nested_codec,
                                                strict=True)]  # fmt: skip
        self.first_optional = max(
            (i + 1 for i, d in enumerate(self.nested_defaults) if d is _NO_DEFAULT), default=0
        )

    def compile(self) -> Callable[[t.AgentEvent], tuple[list[str | bytes], list[bytes]]]:
        """:meth:`encode` unrolled for this type (attribute reads, no loop over the fields):
        the same entry and parts, in a third of the time. The generated code names only this
        plan's own fields and functions."""
        env: dict[str, Any] = {"_header": _HEADER, "_packb": msgpack.packb, "_heads": _ARRAYS}
        lines = ["def encode(event):", f"    out = ['type', {self.type!r}]",
                 "    if event.run_id is None:", "        out += ('run', 'null')"]  # fmt: skip
        for i, (name, short, text, default) in enumerate(self.scalars):
            if not name.isidentifier():
                raise RuntimeError(f"{self.type}.{name}: not an attribute name")
            if not short:
                lines.append(f"    usage = event.{name}")
                for sub, token_name in _TOKEN_ITEMS:
                    lines += [f"    n = usage.{sub}", "    if n:",
                              f"        out += ({token_name!r}, str(n))"]  # fmt: skip
                continue
            env[f"text{i}"] = text
            call = "value" if text is _ident else f"text{i}(value)"
            lines.append(f"    value = event.{name}")
            if default is _NO_DEFAULT:
                lines.append("    if value is not None:")
            else:
                env[f"default{i}"] = default
                lines.append(f"    if not (value is None or value == default{i}):")
            lines.append(f"        out += ({short!r}, {call})")
        packs = []
        for i, (name, pack) in enumerate(self.nested_packers):
            env[f"pack{i}"] = pack
            packs.append(f"event.{name}" if pack is _ident else f"pack{i}(event.{name})")
        env["defaults"] = self.nested_defaults
        lines += [f"    body = [{', '.join(packs)}]", "    i = len(body)",
                  f"    while i > {self.first_optional} and body[i - 1] == defaults[i - 1]:",
                  "        i -= 1", "    if not i:", "        return out, []",
                  "    parts = [_packb(v) for v in body[:i]]",
                  "    out += ('data', _header + _heads[i] + b''.join(parts))",
                  "    return out, parts"]  # fmt: skip
        exec("\n".join(lines), env)  # built from this plan's own tables
        encode: Callable[[t.AgentEvent], tuple[list[str | bytes], list[bytes]]] = env["encode"]
        return encode

    def encode(self, event: t.AgentEvent) -> list[str | bytes]:
        out: list[str | bytes] = ["type", self.type]
        if event.run_id is None:
            out += ("run", "null")
        for name, short, text, default in self.scalars:
            value = getattr(event, name)
            if not short:  # a TokenUsage: its four fields, zeros left out
                for sub, token_name in _TOKEN_ITEMS:
                    n = getattr(value, sub)
                    if n:
                        out += (token_name, str(n))
                continue
            # (a required field is never compared: a Timestamp's == is Python code)
            if value is None or (default is not _NO_DEFAULT and value == default):
                continue
            out += (short, text(value))
        body = [pack(getattr(event, n)) for n, pack in self.nested_packers]
        i = len(body)
        while i > self.first_optional and body[i - 1] == self.nested_defaults[i - 1]:
            i -= 1
        if i:  # nothing nested to store: no data field
            del body[i:]
            out += ("data", _HEADER + msgpack.packb(body))
        return out

    def decode(self, fields: Any, run_id: uuid.UUID) -> t.AgentEvent:
        values: dict[str, Any] = dict(self.missing)
        usage: dict[str, int] = {}
        event_run: uuid.UUID | None = run_id
        blob: bytes | None = None
        for raw_name, raw in fields.items():
            if raw_name == b"type":
                continue
            if raw_name == b"data":
                blob = raw
                continue
            if raw_name == b"run" and self.cls is t.SignalReceived:
                if raw != b"null":
                    raise _Bad("run", f"expected null, got {raw[:40]!r}")
                event_run = None
                continue
            step = self.unpack.get(raw_name)
            if step is None:
                raise _Bad(raw_name.decode("utf-8", "replace"), f"is no field of {self.type}")
            attr, unpack = step
            value = unpack(raw, raw_name.decode())
            if "." in attr:
                usage[attr.split(".", 1)[1]] = value
            else:
                values[attr] = value
        for attr, short in self.required:
            if attr not in values:
                raise _Bad(short, "is missing")
        for name in self.tokens:
            values[name] = t.TokenUsage._trusted(**{s: usage.get(s, 0) for s in TOKEN_NAMES})
        fmt, body = _open(blob) if blob is not None else (FORMAT, [])
        if fmt < 3 or type(body) is not list or not (
                self.first_optional <= len(body) <= len(self.nested)):  # fmt: skip
            raise _Bad("data", f"expected the format-3 array of the nested fields of {self.type}")
        for i, name in enumerate(self.nested):
            if i < len(body):
                try:
                    values[name] = self.nested_codec[i][1](body[i], "")
                except _Bad as exc:
                    raise exc.inside("data", name) from None
            else:
                values[name] = self.nested_values[i]
        values["run_id"] = event_run
        return self.cls._trusted(**values)


_TOKEN_ITEMS = tuple(TOKEN_NAMES.items())
_ENTRY_PLANS = {name: _EntryPlan(cls) for name, cls in t.EVENT_TYPES.items()}
_ENTRY_ENCODERS = {name: plan.compile() for name, plan in _ENTRY_PLANS.items()}


BLOB_HEADER = _HEADER
"""The first bytes of every blob this version stores (format :data:`FORMAT`)."""

DATA_BODY = len(_HEADER) + 1
"""Bytes of an entry's ``data`` blob before its first nested field's (the header, then the
array's one-byte header: fewer than 16 nested fields)."""


def stored_blob(part: bytes) -> bytes:
    """The stored blob (format :data:`FORMAT`) of a value packed as ``part``: what
    :func:`encode_json` or :func:`encode_findings` gives for it."""
    return _HEADER + part


def nested_position(event_type: str, field: str) -> int:
    """The position of nested field ``field`` among the parts of ``event_type``'s entry
    (:func:`encode_entry_parts`)."""
    return _ENTRY_PLANS[event_type].nested.index(field)


def encode_entry(event: t.AgentEvent) -> list[str | bytes]:
    """The stream entry of ``event`` in format :data:`FORMAT`, as the flat list
    ``[field, value, ...]`` that XADD takes: ``type``, the scalar fields as plain text in the
    order of :data:`FIELDS` (names from :data:`ENTRY_NAMES`, :data:`TOKEN_NAMES`; a field equal
    to its default or null left out), ``data`` last (see :data:`ENTRY_RESERVED`)."""
    return _ENTRY_ENCODERS[event.TYPE](event)[0]


def encode_entry_parts(event: t.AgentEvent) -> tuple[list[str | bytes], list[bytes]]:
    """:func:`encode_entry`, and the msgpack bytes of each nested field ``data`` holds, in
    the order of :data:`FIELDS` (trailing defaults left out): a write stores a nested value
    once more as its own blob (:data:`_HEADER` and these bytes) without encoding it again."""
    return _ENTRY_ENCODERS[event.TYPE](event)


def entry_format(blob: bytes | None) -> int:
    """The format of the entry whose ``data`` field is ``blob`` (``None``: it has none, which
    only format 3 writes; formats 1 and 2 hold the whole event in ``data``)."""
    if blob is None:
        return FORMAT
    if blob[:1] == b"\xc1" and len(blob) >= 2:
        return blob[1]
    return 1


def decode_entry(
    type_name: str, fields: Any, run_id: uuid.UUID, *, key: str, entry_id: str
) -> t.AgentEvent:
    """The event of a format-3 stream entry of ``key`` (``fields``: its field -> value map,
    bytes to bytes). Entries of formats 1 and 2 go through :func:`decode_event`."""
    where = f"entry {entry_id}"
    plan = _ENTRY_PLANS.get(type_name)
    if plan is None:
        raise CorruptDataError(key, f"{where} type", f"unknown event type {type_name!r}")
    try:
        return plan.decode(fields, run_id)
    except _Bad as exc:  # named by its stream field
        field = re.split(r"[.\[]", exc.path, maxsplit=1)[0]
        raise CorruptDataError(key, f"{where} {field}" if field else where,
                               f"{type_name}: {exc}") from None  # fmt: skip
    except _Newer as exc:
        raise CorruptDataError(key, f"{where} data", f"{type_name}: {exc}") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, f"{where} data", f"not msgpack: {exc}") from None


# --------------------------------------------------------------------------------------------
# Bulk decoding (a cold load): many blobs in a few C-level passes
# --------------------------------------------------------------------------------------------
#
# A load decodes thousands of blobs; calling the per-field unpackers above for each one costs
# most of open_run. These decode a whole column at once with ``map`` and set checks, and accept
# exactly what the per-blob decoders accept (a value any check doubts is left out of the
# answer, and the caller decodes it with ``decode_json``/``decode_findings``, which raise the
# precise error). They never raise on bad data.

_ABSENT = object()
_FAST_HEADERS = (_HEADER, _HEADER_2)  # formats 2 and 3 write the same bodies
_BODY = slice(2, None)
_UNPACK = msgpack.unpackb
"""``_open``'s options are msgpack's defaults, but for ``max_ext_len``: an extension type of
more than 12 bytes comes back as an ``ExtType``, which every type check below refuses."""
_SEVERITIES = {code: t.Severity(v) for v, code in ENUM_CODES["Severity"].items()}
_LOCATION_SET = t.slot_setters(t.Location, ("file", "line"))
_FINDING_NAMES = FIELDS["Finding"]
_FINDING_SET = t.slot_setters(t.Finding, _FINDING_NAMES)


def _bodies(blobs: list[bytes]) -> list[Any] | None:
    """The unpacked bodies of ``blobs`` (all with a format-2/3 header), or None."""
    if blobs and max(map(len, blobs)) > MAX_BLOB_SIZE:  # pragma: no cover - Redis refuses
        return None
    try:
        heads = set(map(operator.getitem, blobs, itertools.repeat(slice(0, 2))))
        if not heads <= set(_FAST_HEADERS):
            return None
        return list(map(_UNPACK, map(operator.getitem, blobs, itertools.repeat(_BODY))))
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def decode_json_many(blobs: Iterable[bytes]) -> dict[bytes, Any]:
    """Each distinct blob -> its JSON value, for the blobs whose value is a string, a number,
    a bool or null (the others, and any bad one, are left out: see above)."""
    uniq = list(dict.fromkeys(blobs))
    bodies = _bodies(uniq)
    if bodies is None:
        return {}
    return {blob: body for blob, body in zip(uniq, bodies, strict=True)
            if type(body) in _JSON_SCALARS and (type(body) is not int or t.I64_MIN <= body
                                                <= t.U64_MAX)}  # fmt: skip


_JSON_SCALARS = frozenset({str, int, bool, type(None)})


def decode_findings_many(blobs: Iterable[bytes]) -> dict[bytes, tuple[t.Finding, ...]]:
    """Each distinct blob -> its findings (all of them, or none when one of them is doubted:
    see above); the same tuple for equal blobs."""
    uniq = list(dict.fromkeys(blobs))
    bodies = _bodies(uniq)
    if not bodies:
        return {}
    try:
        findings = _findings_columns(bodies)
    except (TypeError, ValueError, KeyError, _Bad):
        return {}
    if findings is None:
        return {}
    counts = list(map(len, bodies))
    if set(counts) == {1}:
        groups: list[tuple[t.Finding, ...]] = list(zip(findings))
    else:
        it = iter(findings)
        groups = [tuple(itertools.islice(it, n)) for n in counts]
    return dict(zip(uniq, groups, strict=True))


def _types(col: Iterable[Any]) -> set[type]:
    return set(map(type, col))


def _findings_columns(bodies: list[Any]) -> list[t.Finding] | None:
    """Every finding of ``bodies`` (format-2/3 finding lists), in order, or None."""
    if _types(bodies) != {list}:
        return None
    rows = list(itertools.chain.from_iterable(bodies))
    if not rows:
        return []
    if _types(rows) != {list}:
        return None
    lengths = set(map(len, rows))
    if min(lengths) < 4 or max(lengths) > len(_FINDING_NAMES):
        return None
    cols = list(itertools.zip_longest(*rows, fillvalue=_ABSENT))
    kind, severity, title, detail = cols[:4]
    if _types(kind) | _types(title) | _types(detail) != {str}:
        return None
    if _types(severity) != {int} or not set(severity) <= _SEVERITIES.keys():
        return None
    n = len(rows)
    columns: list[Any] = [kind, list(map(_SEVERITIES.__getitem__, severity)), title, detail]
    columns.append(_locations(cols[4]) if len(cols) > 4 else itertools.repeat(None, n))
    if len(cols) > 5:
        evidence = cols[5]
        present = [v for v in evidence if v is not _ABSENT]
        if _types(present) - {list} or _types(itertools.chain.from_iterable(present)) - {str}:
            return None
        columns.append([() if v is _ABSENT else tuple(v) for v in evidence])
    else:
        columns.append(itertools.repeat((), n))
    if len(cols) > 6:  # JSON data: checked one by one (rare)
        columns.append([None if v is _ABSENT else _unpack_json(v, "") for v in cols[6]])
    else:
        columns.append(itertools.repeat(None, n))
    if columns[4] is None:
        return None
    out = list(map(object.__new__, itertools.repeat(t.Finding, n)))
    for setter, col in zip(_FINDING_SET, columns, strict=True):
        collections.deque(map(setter, out, col), 0)
    return out


def _locations(col: Sequence[Any]) -> list[t.Location | None] | None:
    """The location column of findings (format 2/3: ``line`` a u32), or None."""
    kinds = _types(col)
    if not kinds <= {list, type(None), type(_ABSENT)}:
        return None
    if list not in kinds:
        return [None] * len(col)
    present = col if kinds == {list} else [v for v in col if type(v) is list]
    lengths = set(map(len, present))
    if min(lengths) < 1 or max(lengths) > 2:
        return None
    columns = list(itertools.zip_longest(*present, fillvalue=None))  # a short one: line None
    files = columns[0]
    lines = columns[1] if len(columns) > 1 else [None] * len(present)
    if _types(files) != {str}:
        return None
    numbers = [v for v in lines if v is not None]
    if numbers and (_types(numbers) != {int} or min(numbers) < 0 or max(numbers) > t.U32_MAX):
        return None
    locs: list[t.Location | None] = list(
        map(object.__new__, itertools.repeat(t.Location, len(present))))  # fmt: skip
    collections.deque(map(_LOCATION_SET[0], locs, files), 0)
    collections.deque(map(_LOCATION_SET[1], locs, lines), 0)
    if present is col:
        return locs
    it = iter(locs)
    return [next(it) if type(v) is list else None for v in col]
