"""Pools: many runs served by one fleet of workers (docs/pools.md). The I/O-free part: a run's
membership and its limits, the arguments and replies of the pool scripts, and the watch that
wakes a blocked claim from a pool.

A run joins a pool (``join_pool``; ``init_run(..., pool=)``, ``submit_agents(..., pool=)``);
a worker claims from the pool (``claim_agent(worker, pool=...)``): ``lua/pool_pick-6.lua``
picks a run in the pool's slot (weighted fair shares, priority first), then
``lua/claim_agent-12.lua`` claims in the run's slot as a bound claim does. A run found with
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
from .keys import DEFAULT_POOL, PoolKeys, check_pool_name
from .tasks import Claim
from .watch import Watch

__all__ = [
    "DEFAULT_POOL",
    "LEASE_SCORE",
    "LEAVE_ARGS",
    "MAX_PRIORITY",
    "MAX_WEIGHT",
    "MEMBERSHIP_FIELDS",
    "PICK_BATCH",
    "PICK_KEEP",
    "RUN_VIEW_FIELDS",
    "SWEEP_INTERVAL",
    "SWEEP_SIZE",
    "Membership",
    "Pick",
    "Picked",
    "PoolRun",
    "PoolView",
    "PoolWatch",
    "add_args",
    "check_max_leases",
    "correction",
    "lease_member",
    "leave_args",
    "membership_of",
    "membership_of_join",
    "membership_of_run",
    "parse_pick",
    "pick_args",
    "pool_run_of",
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

    def join_args(self, keep: bool = False) -> tuple[str, ...]:
        """ARGS of ``join_pool-12.lua`` (``keep``: a run in this pool already keeps its
        fields as they are)."""
        return (self.pool, str(self.weight), str(self.priority), _opt(self.max_leases),
                _opt(self.max_tokens), "keep" if keep else "")  # fmt: skip


LEAVE_ARGS = ("", "1", "0", "n", "n", "")
"""ARGS of ``join_pool-12.lua`` that take the run out of its pool."""


def _whole(value: object, name: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(name, f"must be a whole number from {low} to {high}")


def _opt(value: int | None) -> str:
    return "n" if value is None else f"s{value}"


def add_args(wake: str, run_id: uuid.UUID, member: Membership, tag: str) -> list[str]:
    """ARGV of ``pool_add-4.lua`` for a join or a wake of ``run_id``."""
    return [wake, "add", str(run_id), str(member.weight), str(member.priority), tag]


def lease_member(run_id: uuid.UUID, agent_id: uuid.UUID, token: int) -> str:
    """A lease in a pool's leases set (``pool_lease-2.lua``)."""
    return f"{run_id} {agent_id} {token}"


def check_max_leases(value: int | None) -> str:
    """The max_leases argument of ``pool_lease-2.lua`` (``""``: no limit)."""
    if value is None:
        return ""
    _whole(value, "max_leases", 1, 2**31 - 1)
    return str(value)


def leave_args(wake: str, run_id: uuid.UUID) -> list[str]:
    """ARGV of ``pool_add-4.lua`` for ``run_id`` leaving the pool."""
    return [wake, "leave", str(run_id)]


MEMBERSHIP_FIELDS = ("pool", "pool_weight", "pool_priority", "max_leases", "max_tokens")
"""The run hash fields of a run's pool membership (:class:`Membership`), in this order."""

_MEMBERSHIP_KEYS = tuple(name.encode() for name in MEMBERSHIP_FIELDS)


def membership_of(values: Sequence[Any], key: str) -> Membership | None:
    """The membership in the values of MEMBERSHIP_FIELDS, in order (an HMGET; None or empty
    for an absent field), or None when the run is in no pool; CorruptDataError naming the
    field that cannot be read."""
    raw = [bytes(v) if v else None for v in values]
    if raw[0] is None:
        return None

    def number(i: int, default: int | None) -> int | None:
        value = raw[i]
        if value is None:
            return default
        if not value.isdigit():
            raise CorruptDataError(key, MEMBERSHIP_FIELDS[i], "is not a whole number")
        return int(value)

    try:
        return Membership(raw[0].decode("utf-8"), number(1, 1) or 1, number(2, 0) or 0,
                          number(3, None), number(4, None))  # fmt: skip
    except (ValidationError, UnicodeDecodeError) as exc:
        raise CorruptDataError(key, "pool", f"is not a valid pool membership ({exc})") from None


def membership_of_run(flat: Sequence[Any], key: str) -> Membership | None:
    """The membership in a run hash's HGETALL (a flat list, as ``load`` replies)."""
    found = {bytes(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}
    return membership_of([found.get(name) for name in _MEMBERSHIP_KEYS], key)


def membership_of_join(reply: Any, key: str) -> Membership | None:
    """The membership stored after ``join_pool-12.lua`` (its reply's last five items)."""
    return membership_of(reply[2:7], key)


PICK_BATCH = 16
"""Runs one call of ``pool_pick-6.lua`` picks for a backend at most (the picks of that many
claims in a row): the next claims of that backend try them without a pick of their own. A
backend starts at one and doubles while it uses up its picks within PICK_KEEP, halving when
picks grow older than that unused."""

PICK_KEEP = 0.1
"""Seconds a backend keeps picks it has not tried yet: older ones are dropped (their passes
are given back: the next pick moves their passes back), so a run that joins or wakes with a
higher priority waits no longer than this for a busy worker. A worker
whose agents take longer than this picks one run per claim."""


@dataclasses.dataclass(frozen=True)
class Pick:
    """What ``pool_pick-6.lua`` replied: runs to try, in order (``runs``: run id, weight,
    priority), or none ready and ``wait_ms`` until a sleeping run is due (None: none), or
    until the earliest lease ends when the pool is at its ``max_leases`` (``capped``: the
    pool has a limit, and a lease claimed through this pick is reported to it)."""

    runs: tuple[tuple[uuid.UUID, int, int], ...]
    wait_ms: int | None = None
    capped: bool = False


def parse_pick(reply: Any, key: str) -> Pick:
    """The :class:`Pick` of a ``pool_pick-6.lua`` reply (CorruptDataError when unreadable)."""
    try:
        parts = [bytes(part) for part in reply]
        capped = bool(parts) and parts[-1] == b"cap"
        if capped:
            parts.pop()
        if not parts or not parts[0]:
            wait = parts[1] if len(parts) > 1 else b""
            return Pick((), wait_ms=int(wait) if wait else None, capped=capped)
        runs = tuple((uuid.UUID(parts[i].decode()), int(parts[i + 1]), int(parts[i + 2]))
                     for i in range(0, len(parts) - 2, 3))  # fmt: skip
        return Pick(runs, capped=capped)
    except (ValueError, TypeError) as exc:
        raise CorruptDataError(key, "ready", f"holds a member that is not a run ({exc})") from None


def pick_args(wake: str, seq: int, fixes: Sequence[tuple[str, str, str, str]],
              size: int = 1) -> list[str]:  # fmt: skip
    """ARGV of ``pool_pick-6.lua``: ``size`` picks after the corrections ``fixes``."""
    return [wake, str(seq), str(size), str(len(fixes)), *(x for fix in fixes for x in fix)]


class Picked:
    """A backend's picks of one pool (``keys``, named ``pool``) not tried yet, how many its
    next pick asks for, and the corrections that pick carries (what its tries found)."""

    __slots__ = ("_members", "at", "capped", "fixes", "keys", "pool", "runs", "size")

    def __init__(self, keys: PoolKeys, pool: str) -> None:
        self.keys = keys
        self.pool = pool
        self._members: dict[tuple[int, int], Membership] = {}
        self.runs: list[tuple[uuid.UUID, int, int]] = []
        self.at = 0.0
        self.size = 1
        self.fixes: list[tuple[str, str, str, str]] = []
        self.capped = False
        """The last pick was under the pool's max_leases (its lease is reported to it)."""

    def next(self, now: float) -> tuple[uuid.UUID, int, int] | None:
        """The next run to try, or None (none left, or the picks are older than PICK_KEEP)."""
        fresh = now - self.at <= PICK_KEEP
        if self.runs and fresh:
            return self.runs.pop(0)
        if self.runs:  # unused and too old: given back (their passes), ask for fewer
            self.size = max(1, self.size // 2)
            self.fixes.extend((str(run[0]), "unused", "", "") for run in self.runs)
            self.runs.clear()
        elif fresh and self.at:  # used up in time: ask for more
            self.size = min(PICK_BATCH, self.size * 2)
        self.at = 0.0
        return None

    def member(self, weight: int, priority: int) -> Membership:
        """The membership of a run picked with ``weight`` and ``priority`` (made once)."""
        found = self._members.get((weight, priority))
        if found is None:
            found = self._members[weight, priority] = Membership(self.pool, weight, priority)
        return found

    def got(self, pick: Pick, now: float) -> None:
        """The runs of a pick, to try in order from ``now``."""
        self.runs, self.at, self.capped = list(pick.runs), now, pick.capped

    def found(self, fix: tuple[str, str, str, str]) -> None:
        """A try claimed nothing: the next pick corrects the index; later picks of the same
        run are dropped (they would find the same)."""
        self.fixes.append(fix)
        self.runs = [run for run in self.runs if str(run[0]) != fix[0]]


def correction(run_id: uuid.UUID, claim: Claim | None, tag: str) -> tuple[str, str, str, str]:
    """The correction the next ``pool_pick-6.lua`` carries after a try of ``run_id`` that
    claimed nothing: ``claim`` None when the run does not exist."""
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



# ------------------------------------------------------------------- what a pool holds (reads)

RUN_VIEW_FIELDS = ("status", *MEMBERSHIP_FIELDS, "total_tokens")
"""Run hash fields a pool view reads (HMGET) per run."""

LEASE_SCORE = 10**12
"""A queue score from which a task is leased (its lease's expiry in unix ms): tasks.lua's."""


@dataclasses.dataclass(frozen=True)
class PoolRun:
    """One run of a pool, as ``luft-redis pool NAME`` shows it: ``state`` in the pool's index
    (``ready``: may have claimable work; ``sleeping``: only leases, until the first lapses;
    ``idle``: found with nothing to claim; ``gone``: not running, or in another pool now, left
    at the next pick), its tasks ready and leased now, and its limits."""

    run_id: uuid.UUID
    status: str
    state: str
    weight: int
    priority: int
    ready: int
    leased: int
    total_tokens: int
    max_leases: int | None
    max_tokens: int | None

    @property
    def over_budget(self) -> bool:
        return self.max_tokens is not None and self.total_tokens >= self.max_tokens

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["run_id"] = str(self.run_id)
        out["over_budget"] = self.over_budget
        return out


@dataclasses.dataclass(frozen=True)
class PoolView:
    """A pool: its runs (members of its index, each read from its run hash and queue), its
    ``max_leases`` (None: no limit), the leases it counts against it now (``leases``: live
    leases and picks' holds; 0 without a limit) and ``workers``: the distinct holders of its
    runs' live leases."""

    name: str
    runs: tuple[PoolRun, ...]
    ready_runs: int
    sleeping_runs: int
    max_leases: int | None = None
    leases: int = 0
    workers: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.name, "runs": len(self.runs), "ready_runs": self.ready_runs,
                "sleeping_runs": self.sleeping_runs,
                "ready_tasks": sum(r.ready for r in self.runs),
                "leased_tasks": sum(r.leased for r in self.runs),
                "max_leases": self.max_leases, "leases": self.leases,
                "workers": self.workers}  # fmt: skip


def pool_run_of(run_id: uuid.UUID, pool: str, fields: Sequence[Any], state: str, ready: int,
                leased: int, key: str) -> PoolRun | None:  # fmt: skip
    """A :class:`PoolRun` from a run hash's RUN_VIEW_FIELDS (None: the run is gone);
    CorruptDataError (naming ``key`` and the field) for a field that cannot be read."""
    status, total = fields[0], fields[-1]
    if status is None:
        return None
    member = membership_of(fields[1:-1], key)
    text = bytes(status).decode("utf-8", "replace")
    if text != "running" or member is None or member.pool != pool:
        state = "gone"
    if total is not None and not bytes(total).isdigit():
        raise CorruptDataError(key, "total_tokens", "is not a whole number")
    return PoolRun(run_id, text, state, member.weight if member else 1,
                   member.priority if member else 0, ready, leased,
                   int(total) if total is not None else 0,
                   member.max_leases if member else None,
                   member.max_tokens if member else None)  # fmt: skip
