"""Agent tasks and leases, without I/O: the types, the script arguments and the replies.

A fleet of workers shares one run: the process that plans a phase submits the agents to run
(:class:`AgentTask`), workers claim them one at a time with a lease (see
:mod:`luft_redis._sync.lease`), and the run's scripts keep every rule
(``lua/claim_agent-12.lua`` and its siblings; docs/leases.md). This module builds their
arguments and reads their replies.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from . import codec
from . import types as t
from .errors import CorruptDataError, ValidationError
from .keys import check_limiter_name
from .limits import MAX_TOKENS

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "RELEASE_FLOOR",
    "RENEW_FLOOR",
    "AgentTask",
    "Claim",
    "TaskInfo",
    "TaskState",
    "fence_arg",
    "lease_ms",
    "parse_claim",
    "parse_tasks",
    "submit_args",
]

DEFAULT_MAX_ATTEMPTS = 3
"""Failed attempts (lapses, non-ok ``agent_done``, exceptions leaving ``with lease``) after
which a task is dead until the run is resumed."""

RENEW_FLOOR = 0.25
"""Seconds a renew may take at least (its retries and its wait for an answer are bounded by
the lease's time left, or this long when less is left): on a loaded machine one round trip
can take longer than a lease's last milliseconds. ``lease.lost`` does not wait for it."""

RELEASE_FLOOR = 1.0
"""Seconds a release may take at least: a release waits for the lease's time left, or this
long when less is left, then gives up (``ConnectionError``): a holder cut off from Redis never
hangs in it. The task then lapses at its deadline, as it would have without the release."""


class TaskState(str, enum.Enum):  # noqa: UP042 (StrEnum changes format())
    """Where a task stands (as stored; a ``leased`` task whose lease expired is *lapsed*)."""

    READY = "ready"
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"


@dataclasses.dataclass(frozen=True, slots=True)
class AgentTask:
    """An agent the run wants executed: ``payload`` is any JSON the worker needs (prompt,
    model, role, ...). ``limiter`` names the rate limiter its claims take from (one per model
    or provider, set with ``set_rate_limit``; docs/pools.md) and ``expected_tokens`` what a
    claim reserves of that limiter's token budget before the agent runs (what it reports
    later settles the difference)."""

    agent_id: uuid.UUID
    phase_id: int
    payload: Any = None
    limiter: str | None = None
    expected_tokens: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TaskInfo:
    """One task as :meth:`agent_tasks` lists it. ``expires_at`` (unix seconds, server clock)
    and ``holder`` belong to the last claim; ``lapsed`` is true for a leased task whose lease
    expired (a claim takes it over). ``state`` is ``done`` for every agent with an ok result,
    however it was written."""

    agent_id: uuid.UUID
    phase_id: int
    state: TaskState
    attempt: int
    failures: int
    token: int
    holder: str | None
    expires_at: float | None
    lapsed: bool
    payload: Any
    limiter: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``luft-redis agents --json``)."""
        return {
            "agent_id": str(self.agent_id), "phase_id": self.phase_id, "state": self.state.value,
            "attempt": self.attempt, "failures": self.failures, "token": self.token,
            "holder": self.holder, "expires_at": self.expires_at, "lapsed": self.lapsed,
            "payload": t.thaw_json(self.payload), "limiter": self.limiter,
        }  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """What a claim brought back: a lease (``agent_id`` set) or, with nothing claimable, how
    long until a lease lapses (``wait_ms``, None: none is leased) or that the run is not
    running (``not_running``, its status)."""

    agent_id: uuid.UUID | None
    token: int = 0
    attempt: int = 0
    expires_ms: int = 0
    phase_id: int = 0
    payload: Any = None
    incarnation: str = ""
    wait_ms: int | None = None
    not_running: str | None = None
    limiter: str | None = None
    """With a lease: the task's rate limiter; without: the limiter to take from first."""
    expected_tokens: int = 0


def lease_ms(seconds: Any, field: str = "lease_for") -> int:
    """A lease duration in whole milliseconds (ValidationError unless positive and finite)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValidationError(field, f"expected seconds as a number, got {seconds!r:.40}")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_LEASE_SECONDS:
        raise ValidationError(field, "must be a positive number of seconds, at most 1e9")
    return max(1, math.ceil(seconds * 1000))


MAX_ATTEMPTS_LIMIT = 2**32 - 1
"""The largest ``max_attempts``."""

MAX_LEASE_SECONDS = 1e9
"""The longest lease (about 31 years): its expiry in ms stays exact in Lua's doubles."""


def attempts_arg(value: Any, field: str = "max_attempts") -> int:
    """``value`` as a ``max_attempts`` (ValidationError unless an integer in 1..2^32-1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= MAX_ATTEMPTS_LIMIT):  # fmt: skip
        raise ValidationError(field, f"expected an integer from 1 to 2^32-1, got {value!r:.40}")
    return value


def submit_args(tasks: Iterable[AgentTask], max_payload_size: int, max_attempts: int,
                limiter: str | None = None, expected_tokens: int = 0) -> list[Any]:  # fmt: skip
    """Arguments of ``submit_agents-12.lua`` (ValidationError naming the task); ``limiter``
    and ``expected_tokens`` for the tasks that name none."""
    if isinstance(tasks, AgentTask) or not isinstance(tasks, Iterable):
        raise ValidationError("tasks", f"expected a sequence of AgentTask, got {tasks!r:.80}")
    batch = list(tasks)
    args: list[Any] = [str(attempts_arg(max_attempts)), str(len(batch))]
    for i, task in enumerate(batch):
        field = f"tasks[{i}]"
        if not isinstance(task, AgentTask):
            raise ValidationError(field, f"expected an AgentTask, got {type(task).__name__}")
        if not isinstance(task.agent_id, uuid.UUID):
            raise ValidationError(f"{field}.agent_id", "expected a uuid.UUID")
        if isinstance(task.phase_id, bool) or not isinstance(task.phase_id, int) or not (
            0 <= task.phase_id <= t.U32_MAX
        ):
            raise ValidationError(f"{field}.phase_id", "expected an integer from 0 to 2^32-1")
        blob = codec.encode_json(t.freeze_json(task.payload, f"{field}.payload"))
        if len(blob) > max_payload_size:
            raise ValidationError(
                f"{field}.payload", f"{len(blob)} bytes stored, more than {max_payload_size}")
        named = task.limiter if task.limiter is not None else limiter
        # the batch's expected tokens go with the batch's limiter
        expect = task.expected_tokens if task.limiter is not None else (
            task.expected_tokens or expected_tokens)
        if named is not None:
            check_limiter_name(named, f"{field}.limiter")
        if isinstance(expect, bool) or not isinstance(expect, int) or not 0 <= expect <= MAX_TOKENS:
            raise ValidationError(f"{field}.expected_tokens", f"expected 0 to {MAX_TOKENS}")
        if expect and named is None:
            raise ValidationError(f"{field}.expected_tokens", "reserves tokens of no limiter")
        args += [str(task.agent_id), str(task.phase_id), blob, named or "",
                 str(expect) if expect else ""]  # fmt: skip
    return args


def fence_arg(agent_id: uuid.UUID, token: int, incarnation: str) -> str:
    """The fence slot of a fenced write (``lua/includes/options.lua``)."""
    return f"{agent_id} {token} {incarnation}"


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _uint(key: str, field: str, raw: Any) -> int:
    text = _text(raw)
    if not text.isdigit():
        raise CorruptDataError(key, field, f"is {text[:40]!r}, not an unsigned integer")
    return int(text)


def parse_claim(reply: Sequence[Any], key: str) -> tuple[bytes, Claim]:
    """(the delta, the claim) of ``claim_agent-12.lua``'s reply."""
    delta = bytes(reply[0])
    aid = _text(reply[1])
    if not aid:
        marker = _text(reply[2]) if len(reply) > 2 else ""
        if marker.startswith("!"):
            return delta, Claim(None, not_running=marker[1:])
        if marker.startswith("@"):  # take from this limiter first
            name, _, expect = marker[1:].partition(" ")
            return delta, Claim(None, limiter=name,
                                expected_tokens=_uint(key, f"{name}:expect", expect))
        return delta, Claim(None, wait_ms=_uint(key, "wait", marker) if marker else None)
    try:
        agent = uuid.UUID(aid)
    except ValueError:
        raise CorruptDataError(key, aid, "is not an agent id") from None
    token, attempt, expires, phase = reply[2], reply[3], reply[4], reply[5]
    # the common case: four decimals (a lease's hot path); named one by one only when not
    if not (isinstance(token, bytes) and token.isdigit() and attempt.isdigit()
            and expires.isdigit() and phase.isdigit()):  # fmt: skip
        token, attempt = _uint(key, f"{aid}:token", token), _uint(key, f"{aid}:attempt", attempt)
        expires, phase = _uint(key, f"{aid}:expires", expires), _uint(key, f"{aid}:phase", phase)
    payload = codec.decode_json(bytes(reply[6]), key=key, field=f"{aid}:payload") if reply[
        6] else None  # fmt: skip
    limiter = _text(reply[8]) if len(reply) > 9 and reply[8] else None
    reserved = _uint(key, f"{aid}:expect", reply[9]) if limiter is not None and reply[9] else 0
    return delta, Claim(
        agent, token=int(token), attempt=int(attempt), expires_ms=int(expires),
        phase_id=int(phase), payload=payload, incarnation=_text(reply[7]), limiter=limiter,
        expected_tokens=reserved,
    )  # fmt: skip


def parse_tasks(reply: Any, key: str) -> list[TaskInfo]:
    """The tasks of ``agent_tasks-12.lua``'s reply, in submit order (CorruptDataError naming
    the field that cannot be read)."""
    if not reply:
        return []
    now_ms = _uint(key, "now", reply[0])
    flat, ok = reply[1], {_text(a) for a in reply[2]}
    found: dict[str, dict[str, bytes]] = {}
    for i in range(0, len(flat), 2):
        aid, _, attr = _text(flat[i]).rpartition(":")
        found.setdefault(aid, {})[attr] = flat[i + 1]
    out: list[tuple[int, TaskInfo]] = []
    for aid, attrs in found.items():
        def need(attr: str, aid: str = aid, attrs: dict[str, bytes] = attrs) -> bytes:
            if attr not in attrs:
                raise CorruptDataError(key, f"{aid}:{attr}", "is missing")
            return attrs[attr]

        try:
            agent = uuid.UUID(aid)
            state = TaskState(_text(need("state")))
        except ValueError:
            raise CorruptDataError(key, f"{aid}:state", "is not a task state") from None
        expires = _uint(key, f"{aid}:expires", need("expires"))
        if aid in ok:
            state = TaskState.DONE
        holder = _text(attrs["holder"]) if "holder" in attrs else None
        payload = codec.decode_json(need("payload"), key=key, field=f"{aid}:payload")
        info = TaskInfo(
            agent, _uint(key, f"{aid}:phase", need("phase")), state,
            _uint(key, f"{aid}:attempt", need("attempt")),
            _uint(key, f"{aid}:failures", need("failures")),
            _uint(key, f"{aid}:token", need("token")), holder,
            expires / 1000 if expires else None,
            state is TaskState.LEASED and expires <= now_ms, payload,
            _text(attrs["limiter"]) if "limiter" in attrs else None,
        )  # fmt: skip
        out.append((_uint(key, f"{aid}:seq", need("seq")), info))
    out.sort(key=lambda pair: pair[0])
    return [info for _, info in out]
