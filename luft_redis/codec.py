"""The stored (binary) forms of contract values, and their decoding with explicit checks.

Blobs are msgpack. Events use a compact positional form (field names are not stored, they are
the schema's): a msgpack array of the variant's fields in declaration order, where

* the run id is left out (it is the stream's; ``signal_received`` keeps a flag for ``null``),
* UUIDs are 16 raw bytes, timestamps integer microseconds since the epoch,
* enums are their index in the enumeration, nested records arrays of the same kind,
* trailing fields equal to their default are dropped.

Decoding checks every value as :mod:`luft_redis.types` does for JSON, and reports anything that
does not fit as :class:`~luft_redis.errors.CorruptDataError` naming the key and field. msgpack
is unpacked with size limits; nothing stored is ever evaluated or unpickled.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from . import types as t
from .errors import CorruptDataError, ValidationError

__all__ = [
    "EMPTY_LIST",
    "MAX_BLOB_SIZE",
    "decode_event",
    "decode_findings",
    "decode_json",
    "encode_event",
    "encode_findings",
    "encode_json",
]

MAX_BLOB_SIZE = 512 * 1024 * 1024
"""Largest blob the decoder accepts (Redis' own limit for a string)."""

EMPTY_LIST = msgpack.packb([])
"""msgpack of an empty array: the stored form of an empty findings list."""

_US = _dt.timedelta(microseconds=1)

Packer = Callable[[Any], Any]
Unpacker = Callable[[Any, str], Any]


def _unpackb(blob: bytes) -> Any:
    # unpackb bounds every str/bin/array/map length by len(blob); ext types are refused.
    if len(blob) > MAX_BLOB_SIZE:
        raise ValueError(f"blob of {len(blob)} bytes exceeds {MAX_BLOB_SIZE}")
    return msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=True, max_ext_len=0)


class _Bad(Exception):
    """A stored value does not fit its schema; carries the path inside the blob."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)


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


def _pack_ts(value: _dt.datetime) -> int:
    return (value - t.EPOCH) // _US


def _unpack_ts(x: Any, path: str) -> _dt.datetime:
    if type(x) is not int:
        raise _Bad(path, "expected integer microseconds")
    try:
        return t.EPOCH + _dt.timedelta(microseconds=x)
    except OverflowError:
        raise _Bad(path, f"timestamp {x} out of range") from None


def _unpack_json(x: Any, path: str) -> Any:
    try:
        return t.freeze_json(x, path)
    except ValidationError as exc:
        raise _Bad(exc.field, exc.message) from None


def _optional(pack: Packer, unpack: Unpacker) -> tuple[Packer, Unpacker]:
    def opt_pack(value: Any) -> Any:
        return None if value is None else pack(value)

    def opt_unpack(x: Any, path: str) -> Any:
        return None if x is None else unpack(x, path)

    return opt_pack, opt_unpack


def _tuple(pack: Packer, unpack: Unpacker) -> tuple[Packer, Unpacker]:
    def tuple_pack(value: Any) -> list[Any]:
        return [pack(v) for v in value]

    def tuple_unpack(x: Any, path: str) -> tuple[Any, ...]:
        if type(x) is not list:
            raise _Bad(path, "expected an array")
        return tuple(unpack(v, f"{path}[{i}]") for i, v in enumerate(x))

    return tuple_pack, tuple_unpack


def _enum(enum_cls: type[t._StrEnum]) -> tuple[Packer, Unpacker]:
    members = list(enum_cls)
    index = {m: i for i, m in enumerate(members)}

    def enum_pack(value: Any) -> int:
        return index[value]

    def enum_unpack(x: Any, path: str) -> Any:
        if type(x) is not int or not 0 <= x < len(members):
            raise _Bad(path, f"{x!r} is not a {enum_cls.__name__} index")
        return members[x]

    return enum_pack, enum_unpack


_DELTAS = list(t._DELTA_KINDS.values())


def _delta_pack(value: Any) -> list[Any]:
    return [_DELTAS.index(type(value)), *_record_codec(type(value))[0](value)]


def _delta_unpack(x: Any, path: str) -> Any:
    if type(x) is not list or not x or type(x[0]) is not int or not 0 <= x[0] < len(_DELTAS):
        raise _Bad(path, "expected a progress delta")
    return _record_codec(_DELTAS[x[0]])[1](x[1:], path)


def _kind_codec(kind: t._Kind) -> tuple[Packer, Unpacker]:
    if isinstance(kind, t._IntKind):
        return _ident, _unpack_int(kind.hi, kind.name)
    if isinstance(kind, t._StrKind):
        return _ident, _unpack_str
    if isinstance(kind, t._BoolKind):
        return _ident, _unpack_bool
    if isinstance(kind, t._UuidKind):
        return (lambda v: v.bytes), _unpack_uuid
    if isinstance(kind, t._TsKind):
        return _pack_ts, _unpack_ts
    if isinstance(kind, t._JsonKind):
        return _ident, _unpack_json
    if isinstance(kind, t._EnumKind):
        return _enum(kind.enum)
    if isinstance(kind, t._OptionalKind):
        return _optional(*_kind_codec(kind.inner))
    if isinstance(kind, t._TupleKind):
        return _tuple(*_kind_codec(kind.item))
    if isinstance(kind, t._RecordKind):
        pack, unpack = _record_codec(kind.cls)
        return pack, unpack
    if isinstance(kind, t._DeltaKind):
        return _delta_pack, _delta_unpack
    raise TypeError(f"no stored form for {kind!r}")


_RECORD_CODECS: dict[type[t.Record], tuple[Packer, Unpacker]] = {}


def _record_codec(cls: type[t.Record]) -> tuple[Packer, Unpacker]:
    """(pack, unpack) for a record class: a positional array, trailing defaults dropped."""
    codec = _RECORD_CODECS.get(cls)
    if codec is not None:
        return codec
    is_event = issubclass(cls, t.AgentEvent)
    specs = [s for s in cls._field_specs() if not (is_event and s.name == "run_id")]
    names = [s.name for s in specs]
    codecs = [_kind_codec(s.kind) for s in specs]
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

    def pack(value: Any) -> list[Any]:
        out = [p(getattr(value, name)) for p, name in zip(packers, names, strict=True)]
        i = n
        while i > first_optional and out[i - 1] == defaults[i - 1]:
            i -= 1
        del out[i:]
        return out

    def unpack(x: Any, path: str) -> Any:
        if type(x) is not list or not first_optional <= len(x) <= n:
            raise _Bad(path, f"expected a {cls.__name__} array")
        values: dict[str, Any] = {}
        for i, name in enumerate(names):
            sub = f"{path}.{name}" if path else name
            if i < len(x):
                values[name] = unpackers[i](x[i], sub)
            else:
                spec = specs[i]
                values[name] = spec.default if spec.has_default else None
        if cls is t.AgentResultCache:
            try:
                t._check_result_status(values["status"], "status")
            except ValidationError as exc:
                raise _Bad(f"{path}.status", exc.message) from None
        return cls._trusted(**values)

    codec = (pack, unpack)
    _RECORD_CODECS[cls] = codec
    return codec


_NO_DEFAULT = object()


# --------------------------------------------------------------------------------------------
# Public encoders / decoders
# --------------------------------------------------------------------------------------------


def encode_event(event: t.AgentEvent) -> bytes:
    """The compact stored form of ``event`` (its run id left out)."""
    body = _record_codec(type(event))[0](event)
    if type(event) is t.SignalReceived:
        body.insert(0, event.run_id is not None)
    return msgpack.packb(body)  # type: ignore[no-any-return]


def decode_event(
    type_name: str, blob: bytes, run_id: uuid.UUID, *, key: str, entry_id: str
) -> t.AgentEvent:
    """Decode a stream entry of ``key`` back into exactly the event appended."""
    where = f"entry {entry_id}"
    cls = t.EVENT_TYPES.get(type_name)
    if cls is None:
        raise CorruptDataError(key, f"{where} type", f"unknown event type {type_name!r}")
    try:
        body = _unpackb(blob)
        if type(body) is not list:
            raise _Bad("", "expected an array")
        event_run: uuid.UUID | None = run_id
        if cls is t.SignalReceived:
            if not body or type(body[0]) is not bool:
                raise _Bad("run_id", "expected a flag")
            event_run = run_id if body.pop(0) else None
        event = _record_codec(cls)[1](body, "")
        object.__setattr__(event, "run_id", event_run)
        return event  # type: ignore[no-any-return]
    except _Bad as exc:
        raise CorruptDataError(key, f"{where} data", f"{type_name}: {exc}") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, f"{where} data", f"not msgpack: {exc}") from None


def encode_json(value: Any) -> bytes:
    """msgpack of a (checked) JSON value."""
    return msgpack.packb(value)  # type: ignore[no-any-return]


def decode_json(blob: bytes, *, key: str, field: str) -> Any:
    """The frozen JSON value stored in ``key``/``field``."""
    try:
        return _unpack_json(_unpackb(blob), "")
    except _Bad as exc:
        raise CorruptDataError(key, field, str(exc)) from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, field, f"not msgpack: {exc}") from None


_FINDINGS = _tuple(*_record_codec(t.Finding))


def encode_findings(findings: tuple[t.Finding, ...]) -> bytes:
    """Stored form of a list of findings (positional arrays, like events)."""
    return msgpack.packb(_FINDINGS[0](findings))  # type: ignore[no-any-return]


def decode_findings(blob: bytes, *, key: str, field: str) -> tuple[t.Finding, ...]:
    try:
        return _FINDINGS[1](_unpackb(blob), "")  # type: ignore[no-any-return]
    except _Bad as exc:
        raise CorruptDataError(key, field, str(exc)) from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(key, field, f"not msgpack: {exc}") from None
