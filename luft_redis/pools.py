"""Pools: many runs served by one fleet of workers (docs/pools.md). The I/O-free part: a run's
membership and its limits, the arguments and replies of the pool scripts, and the watch that
wakes a blocked claim from a pool.

A run joins a pool (``join_pool``; ``init_run(..., pool=)``, ``submit_agents(..., pool=)``);
a worker claims from the pool (``claim_agent(worker, pool=...)``): ``lua/pool_pick-5.lua``
picks a run in the pool's slot (weighted fair shares, priority first), then
``lua/claim_agent-11.lua`` claims in the run's slot as a bound claim does. A run found with
nothing to claim is corrected in the pool's index by the next pick; a write that may give a
run claimable work (a submit, a release, a failed or finished lease, a resume) wakes it in the
index afterwards (``lua/pool_add-4.lua``), which publishes on the pool's wake channel.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .errors import CorruptDataError, ValidationError
from .keys import DEFAULT_POOL, check_pool_name
from .tasks import Claim
from .watch import Watch

__all__ = [
    "DEFAULT_POOL",
    "LEAVE_ARGS",
    "MAX_PRIORITY",
    "MAX_WEIGHT",
    "NO_CORRECTION",
    "SWEEP_INTERVAL",
    "SWEEP_SIZE",
    "Membership",
    "Pick",
    "PoolWatch",
    "add_args",
    "correction",
    "leave_args",
    "membership_of_run",
    "parse_pick",
]

MAX_WEIGHT = 1000
"""The largest ``weight`` of a run in a pool (the smallest is 1)."""

MAX_PRIORITY = 9
"""The highest ``priority`` (0, the default, is the lowest): a pool hands out the agents of
its highest-priority runs first."""

SWEEP_INTERVAL = 5.0
"""Seconds a claim from a pool waits with nothing to claim before it looks at the pool's idle
members itself: the wake-up of a writer that died between its write and the wake (two calls
in two slots) is found within this time."""

SWEEP_SIZE = 16
"""Idle members one sweep looks at, at most."""


@dataclasses.dataclass(frozen=True)
class Membership:
    """A run's place in a pool: its run hash fields ``pool``, ``pool_weight``,
    ``pool_priority``, ``max_leases`` and ``max_tokens`` (None: no limit)."""

    pool: str
    weight: int = 1
    priority: int = 0
    max_leases: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        check_pool_name(self.pool)
        _whole(self.weight, "weight", 1, MAX_WEIGHT)
        _whole(self.priority, "priority", 0, MAX_PRIORITY)
        if self.max_leases is not None:
            _whole(self.max_leases, "max_leases", 1, 2**32 - 1)
        if self.max_tokens is not None:
            _whole(self.max_tokens, "max_tokens", 0, 2**64 - 1)

    def over_budget(self, total_tokens: int) -> bool:
        """The run's ``total_tokens`` reached ``max_tokens``: no agent of it is handed out."""
        return self.max_tokens is not None and total_tokens >= self.max_tokens

    def join_args(self) -> tuple[str, ...]:
        """ARGS of ``join_pool-11.lua``."""
        return (self.pool, str(self.weight), str(self.priority), _opt(self.max_leases),
                _opt(self.max_tokens))  # fmt: skip


LEAVE_ARGS = ("", "1", "0", "n", "n")
"""ARGS of ``join_pool-11.lua`` that take the run out of its pool."""


def _whole(value: object, name: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(name, f"must be a whole number from {low} to {high}")


def _opt(value: int | None) -> str:
    return "n" if value is None else f"s{value}"


def add_args(wake: str, run_id: uuid.UUID, member: Membership, tag: str) -> list[str]:
    """ARGV of ``pool_add-4.lua`` for a join or a wake of ``run_id``."""
    return [wake, "add", str(run_id), str(member.weight), str(member.priority), tag]


def leave_args(wake: str, run_id: uuid.UUID) -> list[str]:
    """ARGV of ``pool_add-4.lua`` for ``run_id`` leaving the pool."""
    return [wake, "leave", str(run_id)]


_RUN_FIELDS = {b"pool", b"pool_weight", b"pool_priority", b"max_leases", b"max_tokens"}


def membership_of_run(flat: Sequence[Any], key: str) -> Membership | None:
    """The membership in a run hash's HGETALL (a flat list, as ``load`` replies), or None
    when the run is in no pool; CorruptDataError naming the field that cannot be read."""
    found: dict[bytes, bytes] = {}
    for i in range(0, len(flat) - 1, 2):
        name = bytes(flat[i])
        if name in _RUN_FIELDS:
            found[name] = bytes(flat[i + 1])
    if not found.get(b"pool"):
        return None

    def number(name: bytes, default: int | None) -> int | None:
        raw = found.get(name)
        if raw is None:
            return default
        if not raw.isdigit():
            raise CorruptDataError(key, name.decode(), "is not a whole number")
        return int(raw)

    try:
        return Membership(found[b"pool"].decode("utf-8"), number(b"pool_weight", 1) or 1,
                          number(b"pool_priority", 0) or 0, number(b"max_leases", None),
                          number(b"max_tokens", None))  # fmt: skip
    except (ValidationError, UnicodeDecodeError) as exc:
        raise CorruptDataError(key, "pool", f"is not a valid pool membership ({exc})") from None


@dataclasses.dataclass(frozen=True)
class Pick:
    """What ``pool_pick-5.lua`` replied: a run to try (``run_id``, with its weight and
    priority), or none ready and ``wait_ms`` until a sleeping run is due (None: none)."""

    run_id: uuid.UUID | None
    weight: int = 1
    priority: int = 0
    wait_ms: int | None = None


def parse_pick(reply: Any, key: str) -> Pick:
    """The :class:`Pick` of a ``pool_pick-5.lua`` reply (CorruptDataError when unreadable)."""
    try:
        run, a, b = (bytes(part) for part in [*list(reply), b""][:3])
        if not run:
            return Pick(None, wait_ms=int(a) if a else None)
        return Pick(uuid.UUID(run.decode()), int(a), int(b))
    except (ValueError, TypeError) as exc:
        raise CorruptDataError(key, "ready", f"holds a member that is not a run ({exc})") from None


NO_CORRECTION = ("", "", "", "")


def correction(run_id: uuid.UUID, claim: Claim | None, tag: str) -> tuple[str, str, str, str]:
    """ARGV[2..5] of the next ``pool_pick-5.lua`` after a try of ``run_id`` that claimed
    nothing: ``claim`` None when the run does not exist."""
    if claim is None or (claim.not_running is not None and claim.not_running != "budget"):
        return (str(run_id), "gone", "", tag)
    if claim.wait_ms is not None and claim.not_running is None:
        return (str(run_id), "wait", str(claim.wait_ms), tag)
    return (str(run_id), "empty", "", tag)


class PoolWatch(Watch):
    """A pool's wake channel, as its listener sees it: every notice (and every subscription,
    after which notices may have been missed) counts a wake and calls ``on_wake`` (never
    blocks, never does I/O). It watches no run: ``cache`` is not used."""

    __slots__ = ("_on_wake", "wakes")

    def __init__(self, channel: bytes, on_wake: Callable[[], None]) -> None:
        self.channel = channel
        self._on_wake = on_wake
        self.wakes = 0

    def notice(self, payload: Any) -> bool:
        self.wakes += 1
        self._on_wake()
        return True

    def subscribed(self) -> None:
        self.wakes += 1
        self._on_wake()

