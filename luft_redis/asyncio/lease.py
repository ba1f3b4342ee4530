"""``AsyncAgentLease``: one claimed agent task, with its fencing token and heartbeat.

A worker gets a lease from ``claim_agent`` (see docs/leases.md), runs the agent, and writes its
events and results with ``lease=lease``: those writes are fenced (applied only while the lease
is the task's current one). ``async with lease:`` renews it in the background every third of
its duration and, when the block ends without the agent finished, hands the task back
(an exception counts as a failed attempt). :attr:`lost` tells a long-running agent to stop.

This is the hand-written asyncio source; :mod:`luft_redis._sync.lease` is generated from it
(see :mod:`luft_redis.runtime` for what differs).
"""

from __future__ import annotations

import logging
import time
import uuid
from types import TracebackType
from typing import Any, Protocol

from ..errors import LeaseLostError, LuftRedisError, ValidationError
from ..forks import fork_generation
from ..limits import MAX_TOKENS
from ..pools import Membership
from ..runtime import AsyncSignal, AsyncWorker
from ..tasks import AgentTask, Claim


class _Holder(Protocol):
    """What a lease needs of the backend that claimed it (the backend itself; named by a
    protocol so this module does not import the backend's)."""

    def _need_run(self, operation: str) -> Any: ...

    async def _renew_lease(self, lease: AsyncAgentLease) -> tuple[str, int]: ...

    async def _release_lease(self, lease: AsyncAgentLease, failed: bool) -> None: ...

    async def _report_tokens(self, lease: AsyncAgentLease, used: int, final: bool) -> None: ...

__all__ = ["AsyncAgentLease"]

logger = logging.getLogger(__name__)

HEARTBEAT_FRACTION = 3
"""A heartbeat renews the lease every ``lease_for / HEARTBEAT_FRACTION`` seconds."""


class AsyncAgentLease:
    """The right to run one agent task until :attr:`expires_at` (the Redis server's clock).

    ``agent_id``, ``task`` (the submitted :class:`~luft_redis.tasks.AgentTask`), ``token``
    (the fencing token: strictly increasing per run), ``attempt`` (hand-outs of this task so
    far, this one included) and ``expires_at`` (unix seconds) describe it. :attr:`lost` turns
    True when the lease is known to be gone (taken over, the run cancelled or re-created, or a
    heartbeat too late to keep it), :attr:`cancelled` when the run stopped running.
    """

    def __init__(self, backend: _Holder, claim: Claim, worker: str,
                 lease_ms: int, sent_at: float) -> None:  # fmt: skip
        assert claim.agent_id is not None
        self._backend = backend
        self.run_id: uuid.UUID = backend._need_run("lease").run_id
        self.agent_id: uuid.UUID = claim.agent_id
        self.task = AgentTask(claim.agent_id, claim.phase_id, claim.payload, claim.limiter,
                              claim.expected_tokens)  # fmt: skip
        self.limiter = claim.limiter
        """The rate limiter the task was claimed under (None: none)."""
        self.charged = claim.expected_tokens
        """Tokens charged to :attr:`limiter` for this lease so far (the claim reserved the
        task's expected tokens)."""
        self.reported = 0
        """Tokens the agent reported with :meth:`report_tokens` so far."""
        self.token = claim.token
        self.attempt = claim.attempt
        self.worker = worker
        self.incarnation = claim.incarnation
        self.expires_at = claim.expires_ms / 1000
        self.lease_ms = lease_ms
        self.pool: Membership | None = None
        """The pool this lease was claimed from (its release wakes the run there)."""
        self.pool_capped = False
        """Claimed under the pool's ``max_leases``: its renews and its end are reported to
        the pool."""
        self._lost = False
        self.cancelled = False
        self.finished = False
        """An ``agent_done`` was written with this lease: the task is done, or ready again."""
        self.released = False
        self._deadline = sent_at + lease_ms / 1000  # local clock, measured before the claim
        self._fork = fork_generation()
        self._stopping = False
        self._wake: AsyncSignal | None = None  # the heartbeat's (made with it)
        self._heartbeat: AsyncWorker | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else "finished" if self.finished else "held"
        return (f"<AgentLease agent={self.agent_id} token={self.token} attempt={self.attempt} "
                f"{state}>")  # fmt: skip

    @property
    def forked(self) -> bool:
        """This process is a fork of the one that claimed the lease: it never holds it."""
        return self._fork != fork_generation()

    @property
    def lost(self) -> bool:
        """The lease is known to be gone: taken over, the run cancelled or re-created, or its
        heartbeat did not renew it before its deadline. The deadline is checked here, on
        the local monotonic clock, so a holder learns it even while a renew hangs on a
        network that drops packets (the renew itself is bounded by the time left, too)."""
        if (not self._lost and self._heartbeat is not None and not self._stopping
                and not self.finished and time.monotonic() > self._deadline):  # fmt: skip
            self._lose("the heartbeat did not renew it before its deadline")
        return self._lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self._lost = value

    def time_left(self) -> float:
        """Seconds until the lease lapses unless renewed (local monotonic clock, from the
        moment its claim or its last renew was sent: never later than the server's)."""
        return self._deadline - time.monotonic()

    def _lose(self, why: str) -> None:
        if not self._lost:
            self._lost = True
            logger.warning("lease of agent %s (token %d) lost: %s", self.agent_id, self.token, why)

    async def renew(self) -> None:
        """Extend the lease by its duration (from now, server clock).

        :class:`~luft_redis.errors.LeaseLostError` once another worker took the task over (a
        lapsed lease that nobody took over renews fine). On a run that is no longer running
        :attr:`cancelled` and :attr:`lost` turn True (the agent should stop)."""
        if self.forked:
            raise LeaseLostError(str(self.agent_id), str(self.token), None)
        sent = time.monotonic()
        try:
            outcome, expires_ms = await self._backend._renew_lease(self)
        except LeaseLostError:
            self._lose("another worker took the task over")
            raise
        if outcome == "cancelled":
            self.cancelled = True
            self._lose("the run is no longer running")
        elif outcome == "ended":
            self.finished = True
        elif outcome == "released":  # a resume after a stop handed the task back
            self._lose("the run was resumed after a stop and its task handed back")
        else:
            self.expires_at = expires_ms / 1000
            self._deadline = sent + self.lease_ms / 1000

    async def release(self, *, failed: bool = False) -> None:
        """Hand the task back: ready again for another worker. ``failed=True`` counts this
        attempt as failed (after ``max_attempts`` failures the task is dead). Nothing happens
        when the agent finished with this lease already."""
        self._stopping = True
        if self._wake is not None:
            self._wake.notify()
        if self.forked or self.released:
            return
        await self._backend._release_lease(self, failed)
        self.released = True

    async def report_tokens(self, tokens: int) -> None:
        """The agent used ``tokens`` more tokens (say, after each model call): the task's
        rate limiter is charged what its use so far exceeds the claim's reservation, so
        other claims wait for the budget now, not after the agent ends. Its ``agent_done``
        settles the rest. Nothing happens for a task without a limiter."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not (
            0 <= tokens <= MAX_TOKENS
        ):
            raise ValidationError("tokens", f"expected a whole number from 0 to {MAX_TOKENS}")
        self.reported = min(self.reported + tokens, MAX_TOKENS)
        await self._backend._report_tokens(self, self.reported, False)

    async def _beat(self, wake: AsyncSignal) -> None:
        """The heartbeat: renew every third of the lease, retrying within the time left;
        ``wake`` ends its pauses when the lease is released or its block left."""
        interval = self.lease_ms / 1000 / HEARTBEAT_FRACTION
        next_beat = time.monotonic() + interval
        while not self._stopping and not self._lost and not self.finished:
            pause = max(0.0, next_beat - time.monotonic())
            await wake.wait_for(lambda: self._stopping, pause)
            if self._stopping:
                return
            now = time.monotonic()
            if now > self._deadline:
                self._lose(f"the heartbeat ran {now - next_beat:.3f} s late (the event loop or "
                           "the process was blocked) and the lease lapsed meanwhile")  # fmt: skip
                return
            try:
                await self.renew()
            except LeaseLostError:
                return
            except LuftRedisError as exc:
                if time.monotonic() > self._deadline:
                    self._lose(f"renewing failed until the lease lapsed ({exc})")
                    return
                logger.info("renewing the lease of agent %s failed (%s); trying again",
                            self.agent_id, exc)  # fmt: skip
                next_beat = time.monotonic() + min(interval, 0.1)
                continue
            next_beat = time.monotonic() + interval

    async def __aenter__(self) -> AsyncAgentLease:
        if self._heartbeat is None and not self.forked:
            name = f"luft-redis-heartbeat-{self.agent_id}"
            wake = self._wake = AsyncSignal()
            self._heartbeat = AsyncWorker(lambda: self._beat(wake), name)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        self._stopping = True
        if self._wake is not None:
            self._wake.notify()
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            await heartbeat.join(self.lease_ms / 1000)
        if self.finished or self.lost or self.released or self.forked:
            return
        try:
            await self.release(failed=kind is not None)
        except LeaseLostError:
            self.lost = True
        except LuftRedisError as error:
            if kind is None:
                raise
            logger.warning("releasing the lease of agent %s failed (%s)", self.agent_id, error)
