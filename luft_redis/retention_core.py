"""The core (no I/O) of retention: the backend's options (expiry of finished runs, trimming of
event logs) and what garbage collection takes and reports. The I/O, written once, is
:mod:`luft_redis.asyncio.retention` (sync: generated); :mod:`luft_redis.retention` is the
public face of both."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import ConfigurationError, ValidationError

__all__ = [
    "DEFAULT_BATCH",
    "FINAL_STATUSES",
    "LOG_TRIMMED_NOTE",
    "FinishedRun",
    "GarbageReport",
    "RetentionOptions",
    "batch_size_arg",
    "parse_duration",
    "statuses_arg",
    "text",
]

FINAL_STATUSES: Final = ("completed", "failed", "cancelled")
"""The statuses of a finished run (contract: every status but running)."""


DEFAULT_BATCH: Final = 100
"""Runs examined (and deleted) per round trip by :func:`collect_garbage`."""


LOG_TRIMMED_NOTE: Final = (
    "the event log was trimmed (max_events): its oldest events are gone, the checkpoint is exact"
)
"""What the CLI prints for a run whose log was trimmed."""


@dataclass(frozen=True)
class RetentionOptions:
    """A backend's retention options, checked, and their script argument."""

    expire_finished_after: dt.timedelta | None = None
    max_events: int | None = None

    @classmethod
    def make(cls, expire_finished_after: Any, max_events: Any) -> RetentionOptions:
        """Check the options (ConfigurationError naming the bad one)."""
        if expire_finished_after is not None:
            if not isinstance(expire_finished_after, dt.timedelta):
                raise ConfigurationError(
                    "expire_finished_after must be a datetime.timedelta or None, got "
                    f"{type(expire_finished_after).__name__}"
                )
            if expire_finished_after < dt.timedelta(milliseconds=1):
                raise ConfigurationError("expire_finished_after must be at least 1 ms")
            if expire_finished_after > dt.timedelta(days=365 * 100):
                raise ConfigurationError("expire_finished_after must be at most 100 years")
        if max_events is not None and (
            isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1
        ):
            raise ConfigurationError(
                f"max_events must be a positive int or None, got {max_events!r}"
            )
        if max_events is not None and max_events >= 10**15:
            raise ConfigurationError("max_events must be below 10^15")
        return cls(expire_finished_after, max_events)

    @property
    def ttl_ms(self) -> int:
        """``expire_finished_after`` in whole milliseconds (0: off)."""
        after = self.expire_finished_after
        if after is None:
            return 0
        return after // dt.timedelta(milliseconds=1)

    @property
    def script_arg(self) -> str:
        """The retention slot of the writing scripts (``lua/includes/options.lua``):
        ``"<ttl_ms> <max_events>"``, or ``""`` when both options are off."""
        if self.expire_finished_after is None and self.max_events is None:
            return ""
        return f"{self.ttl_ms} {self.max_events or 0}"


_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> dt.timedelta:
    """``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` (or plain seconds) as a timedelta
    (ValidationError naming the text)."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    if not number.isdigit() or not number.isascii():
        raise ValidationError(
            "duration", f"{text!r} is not a duration such as 90s, 15m, 12h, 7d or 2w"
        )
    seconds = int(number) * _UNITS[unit]
    if seconds > 100 * 365 * 86400:
        raise ValidationError("duration", f"{text!r} is longer than 100 years")
    return dt.timedelta(seconds=seconds)


def text(raw: Any) -> str:
    """A Redis reply's bytes as text."""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


@dataclass(frozen=True)
class FinishedRun:
    """A finished run found by :func:`iter_finished_runs`."""

    run_id: uuid.UUID
    status: str
    updated_at: int
    """Unix seconds of its last change (server clock)."""
    ttl_ms: int
    """Milliseconds before Redis expires it; -1 without a TTL."""


def statuses_arg(statuses: Iterable[str]) -> frozenset[str]:
    wanted = frozenset(statuses)
    bad = sorted(wanted - set(FINAL_STATUSES))
    if bad or not wanted:
        raise ValidationError(
            "statuses", f"{', '.join(bad) or 'none'}: choose among {', '.join(FINAL_STATUSES)}"
        )
    return wanted


def batch_size_arg(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValidationError("batch_size", f"must be a positive int, got {batch_size!r}")
    return batch_size


@dataclass
class GarbageReport:
    """What :func:`collect_garbage` found and did."""

    dry_run: bool
    found: list[FinishedRun] = field(default_factory=list)
    """Every run that matched (with ``dry_run``: what would be deleted)."""
    deleted: list[uuid.UUID] = field(default_factory=list)
    """The runs deleted (empty with ``dry_run``)."""
    skipped: list[uuid.UUID] = field(default_factory=list)
    """Runs that matched but changed before their delete (resumed, updated, or gone)."""
