"""Named rate limiters for LLM work, without I/O (docs/pools.md, "Rate limits").

A limiter (one per model or provider) holds two budgets, requests per minute and tokens per
minute, as GCRA does (redis-cell): ``lua/limit_take-2.lua`` keeps each budget's theoretical
arrival time in the limiter's hash (``<prefix>:{limit:<name>}:limit``, its own slot). A task
names its limiter at submit (:class:`~luft_redis.tasks.AgentTask` ``limiter=``); a claim that
meets such a task takes one request and the task's expected tokens from the limiter first,
then claims; out of budget, it takes nothing, claims nothing and waits the milliseconds the
limiter said. The tokens an agent reports (its ``agent_done``, or
``lease.report_tokens(n)`` while it runs) settle what its claim reserved.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .errors import CorruptDataError, ValidationError

__all__ = [
    "DEFAULT_BURST",
    "LIMITED_TRIES",
    "LIMITER_FIELDS",
    "MAX_TOKENS",
    "MISSING_LIMITER_WAIT",
    "RateLimit",
    "limit_args",
    "rate_limit_of",
]

DEFAULT_BURST = 1.0
"""Seconds of its rates a limiter may run ahead of them (GCRA's tolerance): a limiter of 60
requests per minute admits 2 requests at once, then one a second."""

MAX_TOKENS = 10**12
"""The most tokens one task may expect, or one lease report, for a rate limiter."""

MISSING_LIMITER_WAIT = 10.0
"""Seconds a pooled run whose next task names a limiter that does not exist sleeps in its
pool (the error is logged): the pool's other runs go on. A bound claim raises instead."""

LIMITED_TRIES = 3
"""Takes one claim makes at most: a take is followed by a claim with it, which may meet a task
of another limiter first (the one taken for went to another worker); past this many, the
claim replies "try again now"."""

LIMITER_FIELDS = ("requests_per_minute", "tokens_per_minute", "burst_ms", "tat_requests",
                  "tat_tokens", "admitted", "waits", "tokens")  # fmt: skip
"""The fields of a limiter's hash (HMGET order of :func:`rate_limit_of`)."""

_MAX_RATE = 10**15 - 1


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """A named rate limiter as stored: its rates (None: that budget is not limited), its
    burst in seconds, and what it has done: requests admitted, waits (claims it refused) and
    tokens charged (all net of refunds). ``requests_available`` and ``tokens_available``: what
    it would admit at once at ``now`` (the reader's clock, unix seconds; None: not limited)."""

    name: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    burst: float
    admitted: int = 0
    waits: int = 0
    tokens: int = 0
    requests_available: float | None = None
    tokens_available: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``luft-redis limits --json``)."""
        return dataclasses.asdict(self)


def limit_args(requests_per_minute: int | None, tokens_per_minute: int | None,
               burst: float) -> list[str]:  # fmt: skip
    """ARGV of ``limit_set-1.lua`` (ValidationError naming the argument)."""
    if requests_per_minute is None and tokens_per_minute is None:
        raise ValidationError("requests_per_minute", "give requests_per_minute, "
                              "tokens_per_minute or both")  # fmt: skip
    out: list[str] = []
    for name, value in (("requests_per_minute", requests_per_minute),
                        ("tokens_per_minute", tokens_per_minute)):  # fmt: skip
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= _MAX_RATE):  # fmt: skip
            raise ValidationError(name, f"expected a whole number from 1 to {_MAX_RATE}")
        out.append("" if value is None else str(value))
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not (
        math.isfinite(burst) and 0 <= burst <= 86400
    ):
        raise ValidationError("burst", "expected seconds from 0 to 86400")
    out.append(str(round(burst * 1000)))
    return out


def rate_limit_of(name: str, values: Mapping[str, Any] | list[Any], key: str,
                  now: float) -> RateLimit | None:  # fmt: skip
    """The :class:`RateLimit` of a limiter hash's ``LIMITER_FIELDS`` (in order), read at
    ``now`` (unix seconds); None when the limiter does not exist. CorruptDataError names a
    field that is not a whole number."""
    raw = list(values.values()) if isinstance(values, Mapping) else list(values)
    nums: list[int | None] = []
    for field, value in zip(LIMITER_FIELDS, raw, strict=True):
        if value is None:
            nums.append(None)
            continue
        text = bytes(value).decode("utf-8", "replace") if not isinstance(value, str) else value
        try:
            nums.append(int(text))
        except ValueError:
            raise CorruptDataError(key, field, f"is {text[:40]!r}, not a whole number") from None
    rpm, tpm, burst_ms, tat_r, tat_t, admitted, waits, tokens = nums
    if rpm is None and tpm is None:
        return None
    burst_us, now_us = (burst_ms or 0) * 1000, now * 1e6

    def room(rate: int | None, tat: int | None) -> float | None:
        """Its budget's room now in its units (negative: it admits nothing now)."""
        if rate is None:
            return None
        return (burst_us - max(0.0, (tat or 0) - now_us)) * rate / 60e6

    # a limiter admits while its room is >= 0 (then spends): one request more than the room
    requests, tokens_room = room(rpm, tat_r), room(tpm, tat_t)
    return RateLimit(name, rpm, tpm, (burst_ms or 0) / 1000, admitted or 0, waits or 0,
                     tokens or 0, None if requests is None else
                     (float(int(requests) + 1) if requests >= 0 else 0.0),
                     None if tokens_room is None else max(0.0, tokens_room))  # fmt: skip
