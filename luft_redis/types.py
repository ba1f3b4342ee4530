"""The luft checkpoint contract as Python types.

Every type of ``luft_core/state.rs`` and every ``AgentEvent`` variant is a frozen, slotted,
keyword-only dataclass with ``from_json(obj)`` (a classmethod taking the parsed JSON object)
and ``to_json()`` giving exactly luft's JSON form, defaults included (see
``docs/contract.md`` in the spec). Values are checked when they are built, from JSON or from
Python: a wrong type, an out-of-range number or an unknown enum string raises
:class:`~luft_redis.errors.ValidationError` naming the field.

Values are immutable all the way down, so the in-process cache can hand out the same objects
to every caller: lists are tuples, free JSON objects are :class:`FrozenDict` and arrays
:class:`FrozenList` (read-only ``dict``/``list`` subclasses that compare equal to plain ones),
and the checkpoint's maps are :class:`FrozenMap` (read-only, equal to a dict with the same
items, over a persistent ``immutables.Map``: updating one entry does not copy the others).
An event's ``ts`` is a :class:`Timestamp`, a ``datetime`` that keeps nanoseconds.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import operator
import re
import time
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import (
    Annotated,
    Any,
    ClassVar,
    NoReturn,
    Self,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
)

import immutables

from .errors import ValidationError

__all__ = [
    "EPOCH",
    "EVENT_TYPES",
    "U32_MAX",
    "U64_MAX",
    "AcpRaw",
    "AcpRequest",
    "AgentDone",
    "AgentEvent",
    "AgentProgress",
    "AgentResultCache",
    "AgentSessionCheckpoint",
    "AgentStarted",
    "AgentStatus",
    "BudgetSet",
    "CheckpointStatus",
    "ConvergeDone",
    "ConvergeStarted",
    "Finding",
    "FrozenDict",
    "FrozenList",
    "FrozenMap",
    "JsonValue",
    "Location",
    "Log",
    "LogLevel",
    "ParallelDone",
    "ParallelStarted",
    "PhaseDone",
    "PhaseStarted",
    "PhaseSummary",
    "PipelineDone",
    "PipelineItemDone",
    "PipelineStageStarted",
    "PipelineStarted",
    "PlanPhase",
    "PlanPreview",
    "ProgressDelta",
    "ProgressFileEdit",
    "ProgressMessage",
    "ProgressTokens",
    "ProgressToolCall",
    "Record",
    "ReportEmitted",
    "ResultStatus",
    "RunCheckpoint",
    "RunDone",
    "RunStarted",
    "RunStatus",
    "SchemaRetry",
    "Severity",
    "SignalReceived",
    "Timestamp",
    "TokenUsage",
    "WorkflowDone",
    "WorkflowStarted",
    "freeze_json",
    "thaw_json",
]

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN = -(2**63)

# Annotations that carry the contract's ranges; they read as plain ``int``/``Any`` to mypy.
U32 = Annotated[int, "u32"]
U64 = Annotated[int, "u64"]
JsonValue = Annotated[Any, "json"]
"""Free JSON: None, bool, int (i64/u64 range), finite float, str, FrozenList, FrozenDict."""


# --------------------------------------------------------------------------------------------
# Free JSON, frozen
# --------------------------------------------------------------------------------------------


def _readonly(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is read-only")


class _Immutable:
    """A value that never changes: its copies (shallow or deep) are the value itself."""

    __slots__ = ()

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: object) -> Self:
        return self


class FrozenDict(_Immutable, dict[str, Any]):
    """A read-only ``dict``: a JSON object handed out by the cache. Equal to a plain dict."""

    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        return (FrozenDict, (dict(self),))


class FrozenList(_Immutable, list[Any]):
    """A read-only ``list``: a JSON array handed out by the cache. Equal to a plain list."""

    __slots__ = ()
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = _readonly
    clear = reverse = sort = _readonly
    __iadd__ = __imul__ = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"FrozenList({list.__repr__(self)})"

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return (FrozenList, (list(self),))


_K = TypeVar("_K")
_V = TypeVar("_V")


class FrozenMap(_Immutable, Mapping[_K, _V]):
    """A read-only mapping over a persistent ``immutables.Map``: the checkpoint's
    ``agent_results`` and ``agent_sessions``.

    It compares equal to any mapping with the same items (``cp.agent_results == {id: r}``),
    is hashable when its values are, and :meth:`set`/:meth:`delete` return a changed copy in
    O(log n) without copying the other entries.
    """

    __slots__ = ("_map",)
    _map: immutables.Map[_K, _V]

    def __init__(self, items: Mapping[_K, _V] | Iterable[tuple[_K, _V]] = ()) -> None:
        inner = items._map if isinstance(items, FrozenMap) else items
        object.__setattr__(self, "_map", immutables.Map(inner))

    @classmethod
    def _wrap(cls, inner: immutables.Map[_K, _V]) -> FrozenMap[_K, _V]:
        """A FrozenMap over ``inner`` as it is: O(1), no copy."""
        self = object.__new__(cls)
        _set_map(self, inner)
        return self

    def __getitem__(self, key: _K) -> _V:
        return self._map[key]

    def __iter__(self) -> typing.Iterator[_K]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def get(self, key: _K, default: Any = None) -> Any:
        return self._map.get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._map == other._map
        if isinstance(other, immutables.Map):
            return self._map == other
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(other) != len(self._map):
            return False
        missing = object()
        get = self._map.get
        return all(get(k, missing) == v for k, v in other.items())

    def __hash__(self) -> int:
        return hash(self._map)

    def set(self, key: _K, value: _V) -> FrozenMap[_K, _V]:
        """A copy with ``key`` set to ``value`` (not checked: the caller builds a record)."""
        return FrozenMap._wrap(self._map.set(key, value))

    def delete(self, key: _K) -> FrozenMap[_K, _V]:
        """A copy without ``key`` (KeyError if it is missing)."""
        return FrozenMap._wrap(self._map.delete(key))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise TypeError("FrozenMap is read-only")

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self._map)!r})"

    def __reduce__(self) -> tuple[type[FrozenMap[Any, Any]], tuple[dict[_K, _V]]]:
        return (FrozenMap, (dict(self._map),))


_set_map = FrozenMap.__dict__["_map"].__set__
"""Sets a new FrozenMap's one slot (as :func:`slot_setters`; FrozenMap is not a record)."""


_MAX_JSON_DEPTH = 256


def check_text(value: str, path: str) -> str:
    """``value`` if it can be stored as UTF-8, else :class:`ValidationError` naming ``path``.

    A ``str`` may hold lone surrogates (``json.loads('"\\ud800"')`` returns one), which UTF-8
    cannot encode: refused here, when the value is checked, instead of failing later.
    """
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = value[exc.start]
            raise ValidationError(
                path, f"contains a lone surrogate (U+{ord(char):04X} at index {exc.start})"
            ) from None
    return value


def freeze_json(value: Any, path: str = "", _depth: int = 0) -> Any:
    """Check that ``value`` is JSON luft can store and return it deeply frozen.

    Raises :class:`ValidationError` for non-JSON values, integers outside the i64/u64 range,
    NaN or infinite floats, non-string object keys, strings with lone surrogates and nesting
    deeper than 256.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return check_text(value, path)
    if isinstance(value, int):
        if not I64_MIN <= value <= U64_MAX:
            raise ValidationError(path, f"integer {value} is outside the i64/u64 range")
        return int(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError(path, f"{value} is not a JSON number")
        return value
    if _depth >= _MAX_JSON_DEPTH:
        raise ValidationError(path, f"JSON nested deeper than {_MAX_JSON_DEPTH}")
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(path, f"JSON object key {key!r} is not a string")
            sub = f"{path}.{key}" if path else key
            out[check_text(key, sub)] = freeze_json(item, sub, _depth + 1)
        return FrozenDict(out)
    if isinstance(value, (list, tuple)):
        return FrozenList(
            freeze_json(item, f"{path}[{i}]", _depth + 1) for i, item in enumerate(value)
        )
    raise ValidationError(path, f"{type(value).__name__} is not a JSON value")


def thaw_json(value: Any) -> Any:
    """A plain, mutable copy of a frozen JSON value (dicts and lists)."""
    if isinstance(value, dict):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw_json(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Enumerations
# --------------------------------------------------------------------------------------------


def _ordering(test: Callable[[int, int], bool]) -> Callable[[Any, Any], bool]:
    """A rich comparison by ``self._cmp(other)``: an int whose sign orders the two, or None
    when ``other`` does not compare (then ``NotImplemented``)."""

    def compare(self: Any, other: Any) -> Any:
        order = self._cmp(other)
        return NotImplemented if order is None else test(order, 0)

    return compare


class _StrEnum(str, enum.Enum):  # noqa: UP042 (StrEnum changes format())
    def __str__(self) -> str:
        return str(self.value)


class Severity(_StrEnum):
    """Finding severity, ordered ``info < low < medium < high < critical``."""

    INFO = "info"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]

    def _cmp(self, other: object) -> int | None:
        if not isinstance(other, Severity):
            return None
        return _SEVERITY_RANK[self] - _SEVERITY_RANK[other]

    __lt__ = _ordering(operator.lt)
    __le__ = _ordering(operator.le)
    __gt__ = _ordering(operator.gt)
    __ge__ = _ordering(operator.ge)


_SEVERITY_RANK = {s: i for i, s in enumerate(Severity)}


class CheckpointStatus(_StrEnum):
    """Status of a run's checkpoint."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AgentStatus(_StrEnum):
    """An agent's outcome, written with its variant name in events (``"TimedOut"``).

    ``AgentResultCache.status`` holds the same outcome in snake_case (``"timed_out"``):
    :meth:`as_str` gives that form, and :class:`ResultStatus` names it. Compare a result's
    status with ``ResultStatus.OK`` (or ``AgentStatus.OK.as_str()``), never with
    ``AgentStatus.OK``.
    """

    OK = "Ok"
    ERROR = "Error"
    CANCELLED = "Cancelled"
    TIMED_OUT = "TimedOut"

    def as_str(self) -> str:
        """The snake_case form used in ``AgentResultCache.status`` (``"timed_out"``), as luft's
        ``AgentStatus::as_str``."""
        return _AGENT_STATUS_CACHE[self]

    @property
    def cache_str(self) -> str:
        """The same as :meth:`as_str` (the name of 0.1.0)."""
        return _AGENT_STATUS_CACHE[self]


class ResultStatus(_StrEnum):
    """The values of ``AgentResultCache.status``: plain strings, so ``result.status ==
    ResultStatus.OK`` holds for a result whose status is ``"ok"``."""

    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


# the members of AgentStatus and ResultStatus name the same outcomes, in the same order
_AGENT_STATUS_CACHE = {a: r.value for a, r in zip(AgentStatus, ResultStatus, strict=True)}
AGENT_RESULT_STATUSES = frozenset(s.value for s in ResultStatus)


class RunStatus(_StrEnum):
    """The outcome a ``run_done`` event reports."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARTIAL = "partial"


class LogLevel(_StrEnum):
    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


# --------------------------------------------------------------------------------------------
# Timestamps
# --------------------------------------------------------------------------------------------

_US = _dt.timedelta(microseconds=1)
_PLAIN_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


class Timestamp(_Immutable, _dt.datetime):
    """An event's ``ts``: an aware datetime with nanoseconds, as luft's ``DateTime<Utc>``.

    A ``datetime`` holds microseconds; :attr:`nanosecond` (0..999) carries the three digits
    below them, so ``2026-01-02T03:04:05.123456789Z`` comes back out exactly. Every ``ts`` of
    an event is a ``Timestamp`` in UTC, whether it was given as a string, a ``datetime`` or a
    ``Timestamp``. It is a ``datetime`` everywhere one is expected; comparisons, ``==`` and
    ``hash`` take the nanoseconds into account, :meth:`isoformat` and ``str()`` show them, and
    :meth:`rfc3339` writes it as luft does. Arithmetic (``ts + timedelta``) gives microsecond
    precision, like any ``datetime``.
    """

    __slots__ = ("_nanosecond",)
    _nanosecond: int

    def __new__(
        cls,
        year: int,
        month: int,
        day: int,
        hour: int = 0,
        minute: int = 0,
        second: int = 0,
        microsecond: int = 0,
        tzinfo: _dt.tzinfo | None = None,
        *,
        fold: int = 0,
        nanosecond: int = 0,
    ) -> Timestamp:
        if type(nanosecond) is not int or not 0 <= nanosecond <= 999:
            raise ValueError(f"nanosecond must be in 0..999, not {nanosecond!r}")
        self = super().__new__(
            cls, year, month, day, hour, minute, second, microsecond, tzinfo, fold=fold
        )
        object.__setattr__(self, "_nanosecond", nanosecond)
        return self

    @classmethod
    def from_datetime(cls, value: _dt.datetime, nanosecond: int = 0) -> Timestamp:
        """``value`` (aware) in UTC, with ``nanosecond`` (0..999) below its microseconds."""
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("datetime must be timezone-aware")
        if value.tzinfo is not _dt.UTC:
            value = value.astimezone(_dt.UTC)
        return cls(*_fields(value), _dt.UTC, nanosecond=nanosecond)

    @classmethod
    def from_unix_nanos(cls, nanos: int) -> Timestamp:
        """The UTC time ``nanos`` nanoseconds after the Unix epoch (negative: before it)."""
        micros, nanosecond = divmod(nanos, 1000)
        d = _PLAIN_EPOCH + _dt.timedelta(microseconds=micros)
        # datetime.__new__ directly: the arguments are known good (a hot path of decoding)
        self = _dt.datetime.__new__(
            cls, d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond, _dt.UTC
        )
        object.__setattr__(self, "_nanosecond", nanosecond)
        return self

    @classmethod
    def utcnow_ns(cls) -> Timestamp:
        """The current time in UTC, to the nanosecond the clock gives (as chrono's
        ``Utc::now()``)."""
        return cls.from_unix_nanos(time.time_ns())

    @property
    def nanosecond(self) -> int:
        """Nanoseconds below :attr:`microsecond`, 0..999."""
        return self._nanosecond

    def unix_nanos(self) -> int:
        """Nanoseconds since the Unix epoch (negative before it)."""
        since: _dt.timedelta = _dt.datetime.__sub__(self, typing.cast(Any, _PLAIN_EPOCH))
        return (since // _US) * 1000 + self._nanosecond

    def rfc3339(self) -> str:
        """As luft writes it: UTC, ``Z``, and 0, 3, 6 or 9 fraction digits (chrono's
        ``to_rfc3339_opts(SecondsFormat::AutoSi, true)``)."""
        return format_timestamp(self)

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        """As ``datetime.isoformat``, with nine fraction digits when :attr:`nanosecond` is set
        (``timespec="auto"``) or asked for (``timespec="nanoseconds"``)."""
        if timespec == "nanoseconds" or (timespec == "auto" and self._nanosecond):
            text = super().isoformat(sep, "microseconds")
            return f"{text[:26]}{self._nanosecond:03d}{text[26:]}"
        return super().isoformat(sep, timespec)

    def __str__(self) -> str:
        return self.isoformat(" ")

    def __repr__(self) -> str:
        base = super().__repr__()
        if not self._nanosecond:
            return base
        return f"{base[:-1]}, nanosecond={self._nanosecond})"

    def replace(self, *args: Any, nanosecond: int | None = None, **kwargs: Any) -> Self:
        """As ``datetime.replace``; keeps :attr:`nanosecond` unless given."""
        base = _dt.datetime.replace(self, *args, **kwargs)
        return self._with(base, self._nanosecond if nanosecond is None else nanosecond)

    def astimezone(self, tz: _dt.tzinfo | None = None) -> Self:
        """As ``datetime.astimezone``, keeping :attr:`nanosecond`."""
        return self._with(_dt.datetime.astimezone(self, tz), self._nanosecond)

    def _with(self, base: _dt.datetime, nanosecond: int) -> Self:
        return type(self)(*_fields(base), base.tzinfo, fold=base.fold, nanosecond=nanosecond)

    # comparisons: equal microseconds are ordered by the nanoseconds below them

    def _cmp(self, other: object) -> int | None:
        if not isinstance(other, _dt.datetime):
            return None
        if _dt.datetime.__eq__(self, other) is True:
            nanos = other._nanosecond if isinstance(other, Timestamp) else 0
            return (self._nanosecond > nanos) - (self._nanosecond < nanos)
        return -1 if _dt.datetime.__lt__(self, other) else 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _dt.datetime):
            return NotImplemented
        if _dt.datetime.__eq__(self, other) is not True:
            return False
        return self._nanosecond == (other._nanosecond if isinstance(other, Timestamp) else 0)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __lt__: Callable[[Timestamp, _dt.date], bool] = _ordering(operator.lt)
    __le__: Callable[[Timestamp, _dt.date], bool] = _ordering(operator.le)
    __gt__: Callable[[Timestamp, _dt.date], bool] = _ordering(operator.gt)
    __ge__: Callable[[Timestamp, _dt.date], bool] = _ordering(operator.ge)

    def __hash__(self) -> int:
        base = _dt.datetime.__hash__(self)
        return base if not self._nanosecond else hash((base, self._nanosecond))

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (_make_timestamp, (*_fields(self), self.tzinfo, self.fold, self._nanosecond))



def _fields(d: _dt.datetime) -> tuple[int, int, int, int, int, int, int]:
    """Year, month, day, hour, minute, second and microsecond of ``d``."""
    return (d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond)


def _make_timestamp(
    year: int, month: int, day: int, hour: int, minute: int, second: int, microsecond: int,
    tzinfo: _dt.tzinfo | None, fold: int, nanosecond: int,
) -> Timestamp:  # fmt: skip
    """Unpickle a :class:`Timestamp`."""
    return Timestamp(year, month, day, hour, minute, second, microsecond, tzinfo, fold=fold,
                     nanosecond=nanosecond)  # fmt: skip


EPOCH = Timestamp(1970, 1, 1, tzinfo=_dt.UTC)
"""``1970-01-01T00:00:00Z``: the ``ts`` of an event read from JSON without one (serde's
default)."""


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


def parse_timestamp(text: str, path: str) -> Timestamp:
    """Parse an RFC 3339 timestamp (up to 9 fraction digits, any offset) into a UTC
    :class:`Timestamp`, to the nanosecond."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValidationError(path, f"{text!r} is not an RFC 3339 timestamp")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    micros, nanos = divmod(int((frac or "").ljust(9, "0")), 1000)
    if zone in ("Z", "z"):
        tz = _dt.UTC
    else:
        sign = 1 if zone[0] == "+" else -1
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            raise ValidationError(path, f"{text!r} has an invalid UTC offset")
        tz = _dt.timezone(sign * _dt.timedelta(hours=hours, minutes=minutes))
    if int(second) > 60:
        raise ValidationError(path, f"{text!r} has an invalid second")
    try:
        value = _dt.datetime(
            int(year), int(month), int(day), int(hour), int(minute),
            min(int(second), 59), micros, tzinfo=tz,
        )  # fmt: skip
        return Timestamp.from_datetime(value, nanos)
    except (ValueError, OverflowError) as exc:
        raise ValidationError(path, f"{text!r} is not a valid timestamp: {exc}") from None


def format_timestamp(value: _dt.datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, fraction digits as chrono writes them: 0, 3, 6 or 9
    (``SecondsFormat::AutoSi``, what serde writes for a ``DateTime<Utc>``)."""
    if value.tzinfo is not _dt.UTC and value.utcoffset():
        value = value.astimezone(_dt.UTC)
    base = f"{value.year:04d}-{value.month:02d}-{value.day:02d}T" + value.strftime("%H:%M:%S")
    nanos = value.microsecond * 1000 + (value.nanosecond if isinstance(value, Timestamp) else 0)
    if nanos == 0:
        return base + "Z"
    if nanos % 1_000_000 == 0:
        return f"{base}.{nanos // 1_000_000:03d}Z"
    if nanos % 1000 == 0:
        return f"{base}.{nanos // 1000:06d}Z"
    return f"{base}.{nanos:09d}Z"


def _check_timestamp(value: Any, path: str) -> Timestamp:
    if isinstance(value, str):
        return parse_timestamp(value, path)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValidationError(path, "datetime must be timezone-aware")
        if type(value) is Timestamp and value.tzinfo is _dt.UTC:
            return value
        nanos = value.nanosecond if isinstance(value, Timestamp) else 0
        try:
            return Timestamp.from_datetime(value, nanos)
        except OverflowError as exc:
            raise ValidationError(path, f"timestamp out of range: {exc}") from None
    raise ValidationError(path, f"expected an RFC 3339 string or datetime, got {_tname(value)}")


# --------------------------------------------------------------------------------------------
# Field kinds: how one annotated field is checked (Python or JSON input) and dumped to JSON
# --------------------------------------------------------------------------------------------


def _tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class _Kind:
    """Checks and converts one field. ``check`` takes Python or JSON input."""

    __slots__ = ()
    nullable = False

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value


@dataclasses.dataclass(slots=True, eq=False)
class _IntKind(_Kind):
    name: str
    hi: int

    def check(self, value: Any, path: str) -> int:
        if type(value) is not int:
            if isinstance(value, bool) or not isinstance(value, int):
                got = _tname(value)
                raise ValidationError(path, f"expected an integer ({self.name}), got {got}")
            value = int(value)
        assert isinstance(value, int)
        if not 0 <= value <= self.hi:
            raise ValidationError(path, f"{value} is outside the {self.name} range 0..{self.hi}")
        return value


class _StrKind(_Kind):
    __slots__ = ()

    def check(self, value: Any, path: str) -> str:
        if type(value) is not str:
            if not isinstance(value, str):
                raise ValidationError(path, f"expected a string, got {_tname(value)}")
            value = str(value)
        return check_text(value, path)


class _BoolKind(_Kind):
    __slots__ = ()

    def check(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise ValidationError(path, f"expected a boolean, got {_tname(value)}")
        return value


class _UuidKind(_Kind):
    __slots__ = ()

    def check(self, value: Any, path: str) -> uuid.UUID:
        if isinstance(value, uuid.UUID):
            return value
        if isinstance(value, str):
            try:
                return uuid.UUID(value)
            except ValueError:
                raise ValidationError(path, f"{value!r} is not a UUID") from None
        raise ValidationError(path, f"expected a UUID string, got {_tname(value)}")

    def dump(self, value: Any) -> str:
        return str(value)


class _TsKind(_Kind):
    __slots__ = ()

    def check(self, value: Any, path: str) -> Timestamp:
        return _check_timestamp(value, path)

    def dump(self, value: Any) -> str:
        return format_timestamp(value)


class _JsonKind(_Kind):
    __slots__ = ()
    nullable = True

    def check(self, value: Any, path: str) -> Any:
        return freeze_json(value, path)

    def dump(self, value: Any) -> Any:
        return thaw_json(value)


@dataclasses.dataclass(slots=True, eq=False)
class _EnumKind(_Kind):
    enum: type[_StrEnum]

    def check(self, value: Any, path: str) -> _StrEnum:
        if isinstance(value, self.enum):
            return value
        if isinstance(value, str):
            try:
                return self.enum(value)
            except ValueError:
                pass
        choices = ", ".join(m.value for m in self.enum)
        raise ValidationError(path, f"{value!r} is not one of: {choices}")

    def dump(self, value: Any) -> str:
        return str(value.value)


@dataclasses.dataclass(slots=True, eq=False)
class _OptionalKind(_Kind):
    nullable = True
    inner: _Kind

    def check(self, value: Any, path: str) -> Any:
        return None if value is None else self.inner.check(value, path)

    def dump(self, value: Any) -> Any:
        return None if value is None else self.inner.dump(value)


@dataclasses.dataclass(slots=True, eq=False)
class _RecordKind(_Kind):
    cls: type[Record]

    def check(self, value: Any, path: str) -> Record:
        if isinstance(value, self.cls):
            return value
        if isinstance(value, Mapping):
            return self.cls._from_json(value, path)
        raise ValidationError(path, f"expected a {self.cls.__name__} object, got {_tname(value)}")

    def dump(self, value: Any) -> Any:
        return value.to_json()


@dataclasses.dataclass(slots=True, eq=False)
class _TupleKind(_Kind):
    item: _Kind

    def check(self, value: Any, path: str) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise ValidationError(path, f"expected an array, got {_tname(value)}")
        record_cls = getattr(self.item, "cls", None)
        if type(value) is tuple and all(type(v) is record_cls for v in value):
            return value
        check = self.item.check
        return tuple(check(v, f"{path}[{i}]") for i, v in enumerate(value))

    def dump(self, value: Any) -> list[Any]:
        dump = self.item.dump
        return [dump(v) for v in value]


@dataclasses.dataclass(slots=True, eq=False)
class _MapKind(_Kind):
    """``Mapping[UUID, Record]`` keyed by the record's ``agent_id``."""

    item: _RecordKind

    def check(self, value: Any, path: str) -> FrozenMap[uuid.UUID, Any]:
        if not isinstance(value, Mapping):
            raise ValidationError(path, f"expected an object, got {_tname(value)}")
        inner = value._map if isinstance(value, FrozenMap) else value
        if isinstance(inner, immutables.Map) and all(
            isinstance(v, self.item.cls) and getattr(v, "agent_id", None) == k
            for k, v in inner.items()
        ):
            return value if isinstance(value, FrozenMap) else FrozenMap._wrap(inner)
        out: dict[uuid.UUID, Any] = {}
        for key, item in value.items():
            sub = f"{path}.{key}"
            key_id = _UUID.check(key, sub)
            record = self.item.check(item, sub)
            if getattr(record, "agent_id", key_id) != key_id:
                raise ValidationError(f"{sub}.agent_id", "does not match its key")
            out[key_id] = record
        return FrozenMap._wrap(immutables.Map(out))

    def dump(self, value: Any) -> dict[str, Any]:
        return {str(k): v.to_json() for k, v in value.items()}


class _DeltaKind(_Kind):
    __slots__ = ()

    def check(self, value: Any, path: str) -> ProgressDelta:
        if isinstance(value, ProgressDelta):
            return value
        return ProgressDelta.from_json(value, path)

    def dump(self, value: Any) -> Any:
        return value.to_json()


_UUID = _UuidKind()
_KIND_BY_META: dict[str, _Kind] = {
    "u32": _IntKind("u32", U32_MAX), "u64": _IntKind("u64", U64_MAX), "json": _JsonKind()
}
_PLAIN_KINDS: dict[Any, _Kind] = {
    str: _StrKind(), bool: _BoolKind(), uuid.UUID: _UUID, _dt.datetime: _TsKind()
}


def _kind_for(tp: Any) -> _Kind:
    origin = get_origin(tp)
    if origin is Annotated:
        return _KIND_BY_META[get_args(tp)[1]]
    if origin in (Union, typing.get_origin(int | None)):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return _OptionalKind(_kind_for(args[0]))
    if origin is tuple:
        return _TupleKind(_kind_for(get_args(tp)[0]))
    if origin is Mapping:
        item = _kind_for(get_args(tp)[1])
        assert isinstance(item, _RecordKind)
        return _MapKind(item)
    if tp in _PLAIN_KINDS:
        return _PLAIN_KINDS[tp]
    if isinstance(tp, type) and issubclass(tp, _StrEnum):
        return _EnumKind(tp)
    if isinstance(tp, type) and issubclass(tp, ProgressDelta):
        return _DeltaKind()
    if isinstance(tp, type) and issubclass(tp, Record):
        return _RecordKind(tp)
    raise TypeError(f"unsupported field type {tp!r}")


@dataclasses.dataclass(slots=True, eq=False)
class _Spec:
    name: str
    kind: _Kind
    has_default: bool
    default: Any


_MISSING = object()
R = TypeVar("R", bound="Record")
_JSON_DEFAULT = "luft_redis.json_default"


def _now() -> Any:
    """The default of an event's ``ts``: now (to the nanosecond) for an event built in Python,
    as luft does when it creates one; the epoch for JSON without ``ts`` (serde's default)."""
    return dataclasses.field(
        default_factory=Timestamp.utcnow_ns, metadata={_JSON_DEFAULT: EPOCH}
    )


class Record:
    """Base of every contract type: declarative fields, validation, JSON round trip.

    Subclasses are ``@dataclass(frozen=True, slots=True, kw_only=True)``; their annotations
    declare the JSON form. A field with a default may be missing in JSON input; a nullable
    field without one may be missing too (read as ``null``, as serde does).
    """

    __slots__ = ()

    @classmethod
    def _field_specs(cls) -> tuple[_Spec, ...]:
        specs = cls.__dict__.get("_specs_cache")
        if specs is None:
            hints = typing.get_type_hints(cls, globalns=globals(), include_extras=True)
            out = []
            for f in dataclasses.fields(cls):  # type: ignore[arg-type]
                # the JSON default (serde's) may differ from the Python one: see _now()
                default = f.metadata.get(_JSON_DEFAULT, f.default)
                has_default = default is not dataclasses.MISSING
                out.append(_Spec(f.name, _kind_for(hints[f.name]), has_default, default))
            specs = tuple(out)
            type.__setattr__(cls, "_specs_cache", specs)
        return specs

    def __post_init__(self) -> None:
        cls_name = type(self).__name__
        for spec in self._field_specs():
            value = object.__getattribute__(self, spec.name)
            checked = spec.kind.check(value, f"{cls_name}.{spec.name}")
            if checked is not value:
                object.__setattr__(self, spec.name, checked)

    @classmethod
    def _trusted(cls: type[R], **values: Any) -> R:
        """Build from values already checked (the cache's own updates): no validation.

        Every field must be given. Each record class replaces this with a generated function
        that does the same faster (:func:`_trusted_constructor`)."""
        self = object.__new__(cls)
        for spec in cls._field_specs():
            object.__setattr__(self, spec.name, values[spec.name])
        return self

    def _replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` applied, trusted like :meth:`_trusted`."""
        values = {s.name: changes.get(s.name, getattr(self, s.name)) for s in self._field_specs()}
        return type(self)._trusted(**values)

    @classmethod
    def from_json(cls: type[R], obj: Any) -> R:
        """Build from a parsed JSON object, applying luft's defaults for missing fields."""
        return cls._from_json(obj, "")

    @classmethod
    def _from_json(cls: type[R], obj: Any, path: str) -> R:
        if not isinstance(obj, Mapping):
            raise ValidationError(path, f"expected a {cls.__name__} object, got {_tname(obj)}")
        self = object.__new__(cls)
        for spec in cls._field_specs():
            sub = f"{path}.{spec.name}" if path else spec.name
            raw = obj.get(spec.name, _MISSING)
            if raw is _MISSING:
                if spec.has_default:
                    value = spec.default
                elif spec.kind.nullable:
                    value = None
                else:
                    raise ValidationError(sub, "missing required field")
            else:
                value = spec.kind.check(raw, sub)
            object.__setattr__(self, spec.name, value)
        return self

    def to_json(self) -> dict[str, Any]:
        """luft's JSON object for this value, every field present (``null`` for None)."""
        return {s.name: s.kind.dump(getattr(self, s.name)) for s in self._field_specs()}


_C = TypeVar("_C", bound=type)


@typing.dataclass_transform(kw_only_default=True, frozen_default=True)
def _record(cls: _C) -> _C:
    """Declare a contract record: a frozen, slotted, keyword-only dataclass, with a fast
    :meth:`Record._trusted` of its own."""
    made: Any = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)(cls)
    type.__setattr__(made, "_trusted", staticmethod(_trusted_constructor(made)))
    return cast(_C, made)


def slot_setters(cls: type, names: Iterable[str]) -> list[Any]:
    """The ``__set__`` of each named slot of ``cls`` (for building trusted values: a slot
    descriptor's setter skips the frozen dataclass' ``__setattr__`` and the name lookup)."""
    out = []
    for name in names:
        owner = next(k for k in cls.__mro__ if name in k.__dict__)
        out.append(owner.__dict__[name].__set__)
    return out


def _trusted_constructor(cls: type) -> Any:
    """A keyword-only function that builds a ``cls`` from every field's value, unchecked.

    Generated (as :mod:`dataclasses` generates ``__init__``) because the cache builds one
    record per change it applies: setting each slot directly costs a third of
    ``object.__setattr__`` in a loop over ``**values``. Every field is a required argument,
    so a caller that forgets one fails at once instead of leaving a slot unset."""
    names = [f.name for f in dataclasses.fields(cls)]
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def _trusted(*, {', '.join(names)}):", "    self = _new(_cls)"]
    for name, setter in zip(names, slot_setters(cls, names), strict=True):
        env[f"_set_{name}"] = setter
        lines.append(f"    _set_{name}(self, {name})")
    lines.append("    return self")
    exec("\n".join(lines), env)  # the names are the class' own identifiers
    return env["_trusted"]


# --------------------------------------------------------------------------------------------
# Value types (§2)
# --------------------------------------------------------------------------------------------


@_record
class TokenUsage(Record):
    input: U64 = 0
    output: U64 = 0
    cache_read: U64 = 0
    cache_write: U64 = 0

    def total(self) -> int:
        """``input + output`` (cache counters excluded)."""
        return self.input + self.output


@_record
class Location(Record):
    file: str
    line: U32 | None = None


@_record
class Finding(Record):
    kind: str
    severity: Severity
    title: str
    detail: str
    location: Location | None = None
    evidence: tuple[str, ...] = ()
    data: JsonValue = None


@_record
class PhaseSummary(Record):
    phase_id: U32
    label: str
    planned: U64
    ok: U64
    failed: U64
    description: str | None = None
    role: str | None = None


@_record
class AgentResultCache(Record):
    agent_id: uuid.UUID
    phase_id: U32
    status: str
    output: JsonValue
    findings: tuple[Finding, ...]
    tokens: U64
    completed_at: U64
    cache_key_hash: str | None = None
    description: str | None = None
    role: str | None = None

    def __post_init__(self) -> None:
        Record.__post_init__(self)
        _check_result_status(self.status, "AgentResultCache.status")

    @classmethod
    def _from_json(cls, obj: Any, path: str) -> AgentResultCache:
        # explicit super(): a slotted dataclass is a new class, the zero-argument form breaks
        self = super(AgentResultCache, cls)._from_json(obj, path)  # noqa: UP008
        _check_result_status(self.status, f"{path}.status" if path else "status")
        return self


def _check_result_status(status: str, path: str) -> None:
    if status not in AGENT_RESULT_STATUSES:
        choices = ", ".join(sorted(AGENT_RESULT_STATUSES))
        raise ValidationError(path, f"{status!r} is not one of: {choices}")


@_record
class AgentSessionCheckpoint(Record):
    agent_id: uuid.UUID
    backend_id: str | None = None
    protocol_session_id: str | None = None
    session_id: str
    status: str
    updated_at: U64
    resumable: bool = False


@_record
class RunCheckpoint(Record):
    """The whole state of a run. ``agent_results``/``agent_sessions`` are :class:`FrozenMap`
    (read-only, equal to a dict with the same items)."""

    run_id: uuid.UUID
    task: str
    status: CheckpointStatus
    current_phase: U32
    completed_phases: tuple[PhaseSummary, ...]
    agent_results: Mapping[uuid.UUID, AgentResultCache]
    agent_sessions: Mapping[uuid.UUID, AgentSessionCheckpoint] = FrozenMap()
    findings: tuple[Finding, ...]
    total_tokens: U64
    created_at: U64
    updated_at: U64
    workflow_meta: JsonValue = None
    started_agent_ids: tuple[uuid.UUID, ...] = ()

    def can_resume(self) -> bool:
        """Status is running, failed or cancelled."""
        return self.status is not CheckpointStatus.COMPLETED


# --------------------------------------------------------------------------------------------
# ProgressDelta and PlanPhase
# --------------------------------------------------------------------------------------------


def _snake_case(name: str) -> str:
    """``"PipelineStageStarted"`` as ``"pipeline_stage_started"``: the tag luft's serde
    (``rename_all = "snake_case"``) gives a variant; a delta's ``"kind"`` and an event's
    ``"type"`` are their class names in this form."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class ProgressDelta(Record):
    """``agent_progress`` payload, tagged by ``"kind"``."""

    __slots__ = ()
    KIND: ClassVar[str]

    @classmethod
    def from_json(cls, obj: Any, path: str = "") -> ProgressDelta:
        if not isinstance(obj, Mapping):
            raise ValidationError(path, f"expected a progress delta object, got {_tname(obj)}")
        kind = obj.get("kind")
        sub = _DELTA_KINDS.get(kind) if isinstance(kind, str) else None
        if sub is None or (cls is not ProgressDelta and sub is not cls):
            choices = ", ".join(_DELTA_KINDS)
            field = f"{path}.kind" if path else "kind"
            raise ValidationError(field, f"{kind!r} is not one of: {choices}")
        return sub._from_json(obj, path)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, **super().to_json()}


@_record
class ProgressMessage(ProgressDelta):
    text: str


@_record
class ProgressToolCall(ProgressDelta):
    name: str
    summary: str


@_record
class ProgressFileEdit(ProgressDelta):
    path: str


@_record
class ProgressTokens(ProgressDelta):
    usage: TokenUsage


_DELTA_KINDS: dict[str, type[ProgressDelta]] = {
    _snake_case(c.__name__.removeprefix("Progress")): c
    for c in (ProgressMessage, ProgressToolCall, ProgressFileEdit, ProgressTokens)
}
# a delta's "kind" is its class name without "Progress", in snake_case
for _kind, _delta in _DELTA_KINDS.items():
    _delta.KIND = _kind


@_record
class PlanPhase(Record):
    label: str
    dynamic: bool = False
    description: str | None = None


# --------------------------------------------------------------------------------------------
# AgentEvent (§3)
# --------------------------------------------------------------------------------------------


class AgentEvent(Record):
    """A luft event, tagged by ``"type"``. ``AgentEvent.from_json`` dispatches on it."""

    __slots__ = ()
    TYPE: ClassVar[str]
    run_id: uuid.UUID | None

    @classmethod
    def from_json(cls, obj: Any, path: str = "") -> AgentEvent:
        if not isinstance(obj, Mapping):
            raise ValidationError(path, f"expected an event object, got {_tname(obj)}")
        tag = obj.get("type")
        sub = EVENT_TYPES.get(tag) if isinstance(tag, str) else None
        field = f"{path}.type" if path else "type"
        if sub is None:
            raise ValidationError(field, f"unknown event type {tag!r}")
        if cls is not AgentEvent and sub is not cls:
            raise ValidationError(field, f"expected {cls.TYPE!r}, got {tag!r}")
        return sub._from_json(obj, path)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, **super().to_json()}


@_record
class RunStarted(AgentEvent):
    run_id: uuid.UUID
    task: str
    ts: _dt.datetime = _now()


@_record
class PhaseStarted(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    label: str
    planned: U64
    description: str | None = None
    role: str | None = None
    ts: _dt.datetime = _now()


@_record
class AgentStarted(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    agent_id: uuid.UUID
    prompt_preview: str
    model: str | None = None
    description: str | None = None
    role: str | None = None
    name: str | None = None
    agent_seq: U32 = 0
    ts: _dt.datetime = _now()


@_record
class AgentProgress(AgentEvent):
    run_id: uuid.UUID
    agent_id: uuid.UUID
    delta: ProgressDelta


@_record
class AcpRaw(AgentEvent):
    run_id: uuid.UUID
    agent_id: uuid.UUID
    kind: str
    raw: JsonValue = None


@_record
class AcpRequest(AgentEvent):
    run_id: uuid.UUID
    agent_id: uuid.UUID
    method: str
    raw: JsonValue = None


@_record
class AgentDone(AgentEvent):
    run_id: uuid.UUID
    agent_id: uuid.UUID
    status: AgentStatus
    tokens: TokenUsage
    elapsed_ms: U64
    name: str | None = None
    agent_seq: U32 = 0
    ts: _dt.datetime = _now()
    output: JsonValue = None
    findings: tuple[Finding, ...] = ()
    prompt: str = ""
    retry_count: U32 = 0


@_record
class PhaseDone(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    ok: U64
    failed: U64
    ts: _dt.datetime = _now()


@_record
class RunDone(AgentEvent):
    run_id: uuid.UUID
    status: RunStatus
    total_tokens: TokenUsage
    report: JsonValue = None
    ts: _dt.datetime = _now()


@_record
class Log(AgentEvent):
    run_id: uuid.UUID
    agent_id: uuid.UUID | None = None
    level: LogLevel
    msg: str


@_record
class BudgetSet(AgentEvent):
    run_id: uuid.UUID
    time_limit_ms: U64 | None = None
    max_rounds: U32 | None = None


@_record
class ReportEmitted(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    report: JsonValue = None


@_record
class ParallelStarted(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    span_id: U64
    count: U64


@_record
class ParallelDone(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    span_id: U64
    ok: U64
    failed: U64
    results: JsonValue = None
    elapsed_ms: U64


@_record
class WorkflowStarted(AgentEvent):
    run_id: uuid.UUID
    span_id: U64
    path: str
    args: JsonValue = None


@_record
class WorkflowDone(AgentEvent):
    run_id: uuid.UUID
    span_id: U64
    path: str
    report: JsonValue = None
    elapsed_ms: U64
    error: str | None = None


@_record
class ConvergeStarted(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    span_id: U64
    items: U64
    max_rounds: U32


@_record
class ConvergeDone(AgentEvent):
    run_id: uuid.UUID
    phase_id: U32
    span_id: U64
    rounds: U32
    converged: bool
    surviving: U64
    result: JsonValue = None
    elapsed_ms: U64
    error: str | None = None


@_record
class PipelineStarted(AgentEvent):
    run_id: uuid.UUID
    total_stages: U64
    items: U64


@_record
class PipelineStageStarted(AgentEvent):
    run_id: uuid.UUID
    stage_index: U64
    label: str
    agents_in_stage: U64


@_record
class PipelineItemDone(AgentEvent):
    run_id: uuid.UUID
    stage_index: U64
    item_index: U64
    status: AgentStatus
    tokens: TokenUsage
    elapsed_ms: U64


@_record
class PipelineDone(AgentEvent):
    run_id: uuid.UUID
    stages_completed: U64
    total_ok: U64
    total_failed: U64


@_record
class SchemaRetry(AgentEvent):
    run_id: uuid.UUID
    agent_id: uuid.UUID
    attempt: U32
    max: U32


@_record
class PlanPreview(AgentEvent):
    run_id: uuid.UUID
    reasoning: str
    phases: tuple[PlanPhase, ...]


@_record
class SignalReceived(AgentEvent):
    run_id: uuid.UUID | None = None
    signal: str
    ts: _dt.datetime = _now()


EVENT_TYPES: dict[str, type[AgentEvent]] = {
    _snake_case(c.__name__): c
    for c in (
        RunStarted, PhaseStarted, AgentStarted, AgentProgress, AcpRaw, AcpRequest, AgentDone,
        PhaseDone, RunDone, Log, BudgetSet, ReportEmitted, ParallelStarted, ParallelDone,
        WorkflowStarted, WorkflowDone, ConvergeStarted, ConvergeDone, PipelineStarted,
        PipelineStageStarted, PipelineItemDone, PipelineDone, SchemaRetry, PlanPreview,
        SignalReceived,
    )
}  # fmt: skip
"""Every event class by its ``"type"`` tag (its name in snake_case), in the contract's order."""
for _tag, _event in EVENT_TYPES.items():
    _event.TYPE = _tag

# Resolve every field spec now, so a bad annotation fails at import, not at first use.
_ALL_RECORDS: tuple[type[Record], ...] = (
    TokenUsage, Location, Finding, PhaseSummary, AgentResultCache, AgentSessionCheckpoint,
    RunCheckpoint, PlanPhase, *_DELTA_KINDS.values(), *EVENT_TYPES.values(),
)  # fmt: skip
for _cls in _ALL_RECORDS:
    _cls._field_specs()
del _cls, _kind, _delta, _tag, _event


def _text_fields(cls: type[Record], after: str) -> tuple[str, ...]:
    """The optional text fields (``str | None``) of ``cls`` declared after field ``after``."""
    names = [s.name for s in cls._field_specs()]
    return tuple(
        s.name for s in cls._field_specs()[names.index(after) + 1:]
        if isinstance(s.kind, _OptionalKind) and isinstance(s.kind.inner, _StrKind)
    )  # fmt: skip


RESULT_TEXT_FIELDS = _text_fields(AgentResultCache, "completed_at")
"""A result's optional text fields (``cache_key_hash``, ``description``, ``role``): each stored
as the plain-text attribute of its name when not null, in this order after ``output`` and
``findings`` in a script's arguments (``lua/includes/entities.lua``). A field declared on
:class:`AgentResultCache` after ``completed_at`` as ``str | None`` is one of them: stored,
read and shown with no other change in Python."""
