"""One shared view per run: a bound backend, one subscription, one event follower.

Every viewer of a run (its page's event stream, ``/api/runs/{id}``) reads from the run's
:class:`RunHub`; the hubs of one process share one asyncio Redis client (so one change
listener). A hub:

- binds an :class:`~luft_redis.asyncio.AsyncRedisCheckpointBackend` (``watch=True``) to the
  run and subscribes to its changes once (``backend.subscribe``): the run's change notices,
  never a polling loop, wake it;
- follows the run's event stream once (``iter_events``, ``XREAD BLOCK``), keeps the newest
  :data:`EVENT_RING` events as ready-made ``event`` messages and folds every event into
  bounded aggregates (token breakdown, model and elapsed time per agent, chart points);
- builds the ``state`` message (``show --json``'s object, plus a ``view`` object with what
  the page draws) at most once per :data:`MIN_INTERVAL` however many changes arrive
  (coalesced), and once per agents page however many viewers look at it; each build wakes
  every viewer once, which then sends the events it has not seen and the new state.

The hub lives while someone looks at the run, and :data:`LINGER` seconds more.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ... import types as t
from ...asyncio import AsyncRedisCheckpointBackend
from ...errors import AccessError, LuftRedisError
from ...keys import run_keys
from ...retry import NO_RETRY, is_access_error
from ...tasks import TaskInfo, TaskState
from ...wire import entry_id
from ..render import dumps, event_json, show_json

__all__ = ["AGENTS_PAGE", "EVENT_BYTES", "EVENT_RING", "PAGE_BYTES", "Hubs", "RunHub", "Viewer",
           "event_text", "redis_problem"]

logger = logging.getLogger(__name__)

EVENT_RING: Final = 500
"""The newest events a hub keeps as messages (a new viewer gets them, then live ones)."""

INITIAL_EVENTS: Final = 200
"""How many of the newest events a new viewer is sent before the live ones."""

INLINE_EVENTS: Final = 5000
"""A log up to this long is read before the hub's first state; a longer one after."""

MIN_INTERVAL: Final = 0.05
"""Seconds between two state builds of one run: changes in between are coalesced."""

TICK: Final = 0.5
"""Seconds between two looks at ``cache_is_fresh`` (local, no I/O)."""

STALE_RELOAD: Final = 2.0
"""Seconds the cache may not vouch for itself before the hub reloads it (``sync``)."""

LINGER: Final = 30.0
"""Seconds a hub stays after its last viewer left (a reload of the page reuses it)."""

AGENTS_PAGE: Final = 50
"""Agents per page of the run page (paged on the server)."""

FINDINGS_PER_SEVERITY: Final = 50
"""The newest findings shown per severity (the counts are of all of them)."""

CHART_POINTS: Final = 120
"""At most this many points per chart line (downsampled from the aggregates)."""

EVENT_BYTES: Final = 64 * 1024
"""The largest event the view sends (bytes of its UTF-8 JSON): a bigger event is sent cut
(its large fields shortened, ``"cut": true``); ``luft-redis events --json`` has it whole."""

FIELD_BYTES: Final = 2048
"""What is kept of each large field of a cut event, and of a finding's detail in the state."""

TEXT_BYTES: Final = 512
"""What the state keeps of an agent-written text other than a finding's detail (a finding's
title, kind and location; an agent's name, model, role and holder; a phase's label)."""

TASK_BYTES: Final = 16 * 1024
"""What the state (and the run page) keeps of the run's task."""

PAGE_BYTES: Final = 1024 * 1024
"""The most event bytes one log page or one event-stream chunk carries (a chunk also carries
the state, at most about as much again, its texts cut as above): older events wait for the
next page (``more``); a viewer's newer ones come in the next chunks."""

KEEPALIVE: Final = 15.0
"""Seconds of silence after which an event stream sends a comment line."""

_SEVERITIES: Final = ("critical", "high", "medium", "low", "info")


@dataclass
class _Agent:
    """What the events tell about one agent (the checkpoint has no model, elapsed time or
    token breakdown)."""

    phase_id: int | None = None
    model: str | None = None
    role: str | None = None
    name: str | None = None
    started: float | None = None
    starts: int = 0
    retries: int = 0
    elapsed_ms: int | None = None
    tokens: dict[str, int] | None = None


@dataclass
class _Aggregates:
    """Bounded-size facts folded from the event log, in append order."""

    tokens: dict[str, int] = field(
        default_factory=lambda: {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
    )
    agents: dict[uuid.UUID, _Agent] = field(default_factory=dict)
    token_points: list[tuple[float, int]] = field(default_factory=list)
    done_points: list[tuple[float, int]] = field(default_factory=list)
    """(time, agents finished): each agent counted once, at its first agent_done."""
    finished: set[uuid.UUID] = field(default_factory=set)
    events: int = 0

    def add(self, event: t.AgentEvent) -> None:
        self.events += 1
        if isinstance(event, t.AgentStarted):
            agent = self.agents.setdefault(event.agent_id, _Agent())
            agent.phase_id = event.phase_id
            agent.model = event.model or agent.model
            agent.role = event.role or agent.role
            agent.name = event.name or agent.name
            agent.started = event.ts.timestamp()
            agent.starts += 1
            agent.retries = max(agent.retries, agent.starts - 1)
        elif isinstance(event, t.AgentDone):
            agent = self.agents.setdefault(event.agent_id, _Agent())
            usage = event.tokens
            agent.tokens = {key: getattr(usage, key) for key in self.tokens}
            agent.elapsed_ms = event.elapsed_ms
            agent.retries = max(agent.retries, event.retry_count)
            agent.name = event.name or agent.name
            for key, value in agent.tokens.items():
                self.tokens[key] += value
            when = event.ts.timestamp()
            total = self.token_points[-1][1] if self.token_points else 0
            self.token_points.append((when, total + usage.input + usage.output))
            if event.agent_id not in self.finished:  # an agent, not an attempt
                self.finished.add(event.agent_id)
                self.done_points.append((when, len(self.finished)))


def _downsample(points: list[tuple[float, int]], most: int = CHART_POINTS) -> list[list[float]]:
    """At most ``most`` points of a cumulative series, evenly spaced, the last one kept."""
    if len(points) <= most:
        return [[p[0], p[1]] for p in points]
    step = (len(points) - 1) / (most - 1)
    return [[points[round(i * step)][0], points[round(i * step)][1]] for i in range(most)]


def _phase(phase_id: int, label: str = "", planned: int = 0) -> dict[str, Any]:
    """A phase of the state's ``view``, before its agents are counted."""
    return {"phase_id": phase_id, "label": label, "planned": planned, "ok": 0, "failed": 0,
            "running": 0}  # fmt: skip


def _stream_id(raw: Any) -> tuple[int, int]:
    ms, _, seq = entry_id(raw).partition("-")
    return int(ms), int(seq or 0)


def cut(value: Any, most: int, whole_in: str) -> Any:
    """``value`` (a string, else left alone: None, a number) in at most ``most`` bytes of
    UTF-8, or its start and a note that says it was cut and where it is whole."""
    if not isinstance(value, str) or len(value) * 4 <= most:  # (4: the most bytes a char takes)
        return value
    data = value.encode()
    if len(data) <= most:
        return value
    head = data[:most].decode("utf-8", "ignore")  # (never half a character)
    return f"{head}… (cut: {len(data):,} bytes; {whole_in} has it whole)"


def event_text(entry_id: str, event: Any) -> str:
    """The web view's JSON of one event: ``show``'s form, or when its UTF-8 is over
    :data:`EVENT_BYTES`, the same with each large field cut to :data:`FIELD_BYTES` and
    ``"cut": true`` (agent output is untrusted and unbounded: a page stays small)."""
    obj = event_json(entry_id, event)
    text = dumps(obj)
    if len(text) * 4 <= EVENT_BYTES or len(text.encode()) <= EVENT_BYTES:
        return text
    for name, value in obj.items():
        whole = value if isinstance(value, str) else dumps(value)
        short = cut(whole, FIELD_BYTES, "luft-redis events --json")
        if short is not whole:  # (a small field stays as it was, a number a number)
            obj[name] = short
    obj["cut"] = True
    return dumps(obj)


def redis_problem(exc: BaseException) -> str:
    """What the view says when Redis failed it (its pages, its API, the run page's banner):
    refused this client (password, ACL, TLS), or unreachable; one sentence, without the
    doubled period of an error text that ends in one."""
    text = str(exc).rstrip(". ") or type(exc).__name__
    if isinstance(exc, AccessError) or is_access_error(exc):
        return f"Redis refused the web view's client: {text}"
    return f"Redis is unreachable: {text}"


def _short(value: Any) -> Any:
    """An agent-written text of the state, cut to :data:`TEXT_BYTES`."""
    return cut(value, TEXT_BYTES, "luft-redis export")


def _message(item: list[Any]) -> bytes:
    """The encoded ``event`` message of a ring item (made once; then the event is let go)."""
    if item[2] is None:
        entry = item[1]
        item[2] = f"event: event\ndata: {event_text(entry.id, entry.event)}\n\n".encode()
        item[1] = None
    data: bytes = item[2]
    return data


@dataclass
class Viewer:
    """Where one event stream stands: the last event and state it was sent."""

    page: int
    sent_seq: int
    sent_state: int = -1


class RunHub:
    """The shared view of one run (see the module docstring)."""

    def __init__(self, hubs: Hubs, run_id: uuid.UUID) -> None:
        self.hubs = hubs
        self.run_id = run_id
        self.backend = AsyncRedisCheckpointBackend(hubs.client, prefix=hubs.prefix,
                                                   retry=NO_RETRY)  # fmt: skip
        self.viewers = 0
        self.cond = asyncio.Condition()
        self.ring: deque[list[Any]] = deque(maxlen=EVENT_RING)
        """[seq, LogEntry, its message text (made on first use) or None]"""
        self.seq = 0
        self.state_seq = 0
        self.agg = _Aggregates()
        self.redis_ok = True
        self.redis_error = ""
        self.gone = False
        self.caught_up = False
        self.as_of = time.time()
        self._base: dict[str, Any] = {}
        self._rows: list[dict[str, Any]] = []
        self._texts: dict[int, str] = {}
        self._chunks: dict[tuple[int, int, int, int, bool], bytes] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._last_id: str | None = None
        self._closing: asyncio.TimerHandle | None = None
        self._fresh = False
        self._extra: tuple[int, int | None, list[TaskInfo]] = (-1, None, [])
        """TTL of the run (-1: none), length of its log, its agent tasks (last read)."""

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> bool:
        """Bind the run and build the first state; False when the run does not exist."""
        if await self.backend.open_run(self.run_id) is None:
            await self.backend.aclose()
            return False
        self._unsubscribe = self.backend.subscribe(lambda _cp: self._dirty.set())
        # a short log is read before the first state (models, elapsed times, charts in it);
        # a long one by the follower, after
        entries = self.backend.iter_events(None, follow=False, count=500)
        try:
            async for entry in entries:
                self._fold(entry)
                if self.agg.events >= INLINE_EVENTS:
                    break
        finally:
            close = getattr(entries, "aclose", None)  # an async generator: end it now
            if close is not None:
                await close()
        await self._build()
        self._tasks = [asyncio.create_task(self._follow(), name=f"web-follow-{self.run_id}"),
                       asyncio.create_task(self._publish(), name=f"web-state-{self.run_id}")]
        return True

    async def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        async with self.cond:
            self.gone = True
            self.cond.notify_all()
        await self.backend.aclose()

    # -- the event follower ----------------------------------------------------------------

    async def _follow(self) -> None:
        """Fold every event into the aggregates and keep the newest as messages. The log
        written before the hub started (up to 100,000 events on a large run) is read in
        pages of 500 without waking a viewer; live events wake them at once."""
        while True:
            try:
                if not self.caught_up:
                    key = run_keys(self.hubs.prefix, self.run_id).events
                    newest = await self.hubs.client.xrevrange(key, count=1)
                    target = _stream_id(newest[0][0]) if newest else (0, 0)
                    done = (0, 0) if self._last_id is None else _stream_id(self._last_id)
                    self.caught_up = done >= target
                    if self.caught_up:
                        self._dirty.set()
                async for entry in self.backend.iter_events(self._last_id, follow=True,
                                                            count=500):  # fmt: skip
                    self._fold(entry)
                    if not self.caught_up:
                        if _stream_id(entry.id) < target:
                            if self.seq % 100 == 0:
                                await asyncio.sleep(0)  # other runs' viewers meanwhile
                            continue
                        self.caught_up = True
                    # the state builder wakes the viewers, with the state and these events
                    # together: one wake-up per viewer per MIN_INTERVAL however fast events come
                    self._dirty.set()
            except Exception as exc:  # Redis went away: say so, retry (cancelling passes through)
                self._down(exc)
                await asyncio.sleep(1.0)

    def _fold(self, entry: Any) -> None:
        """One event into the aggregates and the ring."""
        self._last_id = entry.id
        self.agg.add(entry.event)
        self.seq += 1
        self.ring.append([self.seq, entry, None])

    def _down(self, exc: BaseException) -> None:
        problem = redis_problem(exc)
        if self.redis_ok:
            logger.warning("run %s: %s", self.run_id, problem)
        self.redis_ok = False
        self.redis_error = problem  # the page's banner says it as it is
        self._dirty.set()

    # -- the state builder -----------------------------------------------------------------

    async def _publish(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), TICK)
            fresh = self.backend.cache_is_fresh
            now = time.time()
            if fresh and self.redis_ok:  # the view's age: how old the newest vouched data is
                self.as_of = now
            elif now - self.as_of > STALE_RELOAD or not self.redis_ok:
                try:
                    if await self.backend.sync() is not None:
                        self.as_of = time.time()
                    if not self.redis_ok:
                        self.redis_ok, self.redis_error = True, ""
                        self._dirty.set()
                except Exception as exc:
                    self._down(exc)
            if not self._dirty.is_set() and fresh == self._fresh:
                continue
            self._fresh = fresh
            self._dirty.clear()
            try:
                await self._build()
            except Exception as exc:
                self._down(exc)
                self._rebuild_local()
            async with self.cond:
                self.state_seq += 1
                self._texts = {}
                self._chunks = {}
                self.cond.notify_all()
            await asyncio.sleep(MIN_INTERVAL)

    async def _build(self) -> None:
        """Read what the checkpoint cache lacks (TTL, log length, leases: one pipeline and
        one FCALL) and build the state's shared part."""
        keys = run_keys(self.hubs.prefix, self.run_id)
        pipe = self.hubs.client.pipeline(transaction=False)
        pipe.ttl(keys.run)
        pipe.xlen(keys.events)
        pipe.hget(keys.run, "parent")
        ttl, length, parent = await pipe.execute()
        self._parent = parent.decode("utf-8", "replace") if parent else None
        tasks: list[TaskInfo] = []
        with contextlib.suppress(LuftRedisError):
            tasks = await self.backend.agent_tasks()
        self._extra = (int(ttl), int(length), tasks)
        self.redis_ok, self.redis_error = True, ""
        self._rebuild_local()

    def _rebuild_local(self) -> None:
        """The state from the cache and the aggregates (no I/O)."""
        ttl, length, tasks = self._extra
        cp = self.backend.get_checkpoint()
        now = time.time()
        self._fresh = self.backend.cache_is_fresh
        if self._fresh and self.redis_ok:
            self.as_of = now
        live = {"fresh": self._fresh, "as_of": self.as_of, "redis_ok": self.redis_ok,
                "redis_error": self.redis_error, "server_time": now}  # fmt: skip
        if cp is None:
            self._base = {"run_id": str(self.run_id), "gone": True, "view": live}
            self._rows = []
            return
        base = show_json(cp, length, self.backend.log_trimmed,
                         parent=getattr(self, "_parent", None))  # fmt: skip
        base["task"] = cut(cp.task, TASK_BYTES, "luft-redis show --json")
        final = cp.status is not t.CheckpointStatus.RUNNING
        by_task = {info.agent_id: info for info in tasks}
        order = list(cp.started_agent_ids)
        seen = set(order)
        order.extend(a for a in cp.agent_results if a not in seen)
        seen.update(cp.agent_results)
        order.extend(a for a in by_task if a not in seen)  # submitted, never started yet
        rows: list[dict[str, Any]] = []
        phases: dict[int, dict[str, Any]] = {}
        for summary in cp.completed_phases:
            phases[summary.phase_id] = _phase(summary.phase_id, _short(summary.label),
                                              summary.planned)  # fmt: skip
        for agent_id in order:
            result = cp.agent_results.get(agent_id)
            info = self.agg.agents.get(agent_id) or _Agent()
            task = by_task.get(agent_id)
            phase_id = result.phase_id if result else (
                info.phase_id if info.phase_id is not None
                else (task.phase_id if task else None))  # fmt: skip
            # a task says where the agent stands now: leased (running), ready (never claimed,
            # or again after a failed or released attempt), dead; done: its (ok) result
            if task is not None and task.state is not TaskState.DONE:
                status = "running" if task.state is TaskState.LEASED else task.state.value
            elif result is not None:
                status = result.status
            else:
                status = "running" if task is None else task.state.value
            if phase_id is not None and status != "ready":  # (waiting: not counted)
                phase = phases.setdefault(phase_id, _phase(phase_id))
                phase["ok" if status in ("ok", "done") else (
                    "running" if status == "running" else "failed")] += 1  # fmt: skip
            elapsed: float | None = None
            if info.elapsed_ms is not None:
                elapsed = info.elapsed_ms / 1000
            elif result is None and info.started is not None:
                elapsed = max(0.0, now - info.started)
            rows.append({
                "agent_id": str(agent_id), "name": _short(info.name), "phase_id": phase_id,
                "status": status, "model": _short(info.model),
                "role": _short(result.role if result and result.role else info.role),
                "tokens": result.tokens if result else None, "token_breakdown": info.tokens,
                "elapsed_s": elapsed, "retries": info.retries,
                "holder": _short(task.holder) if task else None,
                "attempt": task.attempt if task else None,
                "lease_expires_at": task.expires_at if task else None,
                "lease_state": (("lapsed" if task.lapsed else task.state.value)
                                if task else None),
            })  # fmt: skip
        groups: list[dict[str, Any]] = []
        for severity in _SEVERITIES:
            items = [f for f in cp.findings if str(f.severity) == severity]
            if items:
                groups.append({"severity": severity, "count": len(items), "items": [
                    {"kind": _short(f.kind), "title": _short(f.title),
                     "detail": cut(f.detail, FIELD_BYTES, "luft-redis export"),
                     "location": _short(f"{f.location.file}:{f.location.line}"
                                        if f.location and f.location.line is not None
                                        else (f.location.file if f.location else None))}
                    for f in items[-FINDINGS_PER_SEVERITY:]]})  # fmt: skip
        end = cp.updated_at if final else now
        base["view"] = {
            **live, "version": self.backend.version, "ttl_s": ttl if ttl >= 0 else None,
            "elapsed_s": max(0, end - cp.created_at), "tokens": dict(self.agg.tokens),
            "phases": [phases[k] for k in sorted(phases)],
            "findings": groups,
            "chart": {"tokens": _downsample(self.agg.token_points),
                      "agents": _downsample(self.agg.done_points)},
            "agents_total": len(rows), "agents_page_size": AGENTS_PAGE,
            "tasks": {state.value: sum(1 for info in tasks if info.state is state)
                      for state in TaskState} | {"lapsed": sum(info.lapsed for info in tasks)},
            "log_complete": self.caught_up, "events_seen": self.agg.events,
        }  # fmt: skip
        self._base = base
        self._rows = rows

    def state(self, page: int = 0) -> dict[str, Any]:
        """The state message's object for agents page ``page``."""
        pages = max(1, -(-len(self._rows) // AGENTS_PAGE))
        page = min(max(page, 0), pages - 1)
        out = dict(self._base)
        if "view" in out:
            out["view"] = {**out["view"], "agents_page": page, "agents_pages": pages,
                           "agents": self._rows[page * AGENTS_PAGE:(page + 1) * AGENTS_PAGE]}
        return out

    def state_text(self, page: int) -> str:
        """The state message as JSON text, built once per state and page."""
        text = self._texts.get(page)
        if text is None:
            text = self._texts[page] = dumps(self.state(page))
        return text

    # -- viewers ---------------------------------------------------------------------------

    def new_viewer(self, page: int) -> Viewer:
        """A viewer that is sent the newest :data:`INITIAL_EVENTS` events first (the newest
        of the log once the hub has read it)."""
        return Viewer(page=page, sent_seq=-1)

    async def messages(self, viewer: Viewer) -> AsyncIterator[bytes]:
        """The SSE messages for one viewer: events it has not seen, then the state when it
        changed (coalesced: a slow viewer gets the newest state once). Viewers at the same
        place share one encoded chunk."""
        while True:
            async with self.cond:
                def ready() -> bool:
                    return ((self.caught_up and self.seq > viewer.sent_seq)
                            or self.state_seq > viewer.sent_state or self.gone)  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cond.wait_for(ready), KEEPALIVE)
                first, last, skipped = viewer.sent_seq, viewer.sent_seq, False
                if self.caught_up:
                    if first < 0:  # a new viewer: the newest events, no gap notice
                        first, last = self._span(max(0, self.seq - INITIAL_EVENTS), True)
                    else:  # the oldest it has not seen; the rest in the next chunks
                        skipped = bool(self.ring) and self.ring[0][0] > first + 1
                        first, last = self._span(first, False)
                state = self.state_seq if self.state_seq > viewer.sent_state else -1
                key = (first, last, state, viewer.page if state >= 0 else -1, skipped)
                chunk = self._chunks.get(key)
                if chunk is None:
                    chunk = self._chunk(first, last, state >= 0, viewer.page, skipped)
                    if len(self._chunks) > 256:
                        self._chunks.clear()
                    self._chunks[key] = chunk
                viewer.sent_seq = last
                if state >= 0:
                    viewer.sent_state = state
                gone = self.gone
            yield chunk
            if gone:
                return

    def _span(self, after: int, newest: bool) -> tuple[int, int]:
        """``(first, last)``: the events ``first`` < seq <= ``last`` one chunk carries of those
        after seq ``after`` still in the ring: at most :data:`PAGE_BYTES` of them (at least
        one), the newest (a new viewer: "older events" has the others) or the oldest."""
        if not self.ring or after >= self.seq:
            return self.seq, self.seq
        base = self.ring[0][0]  # (the ring's seqs are consecutive)
        after = max(after, base - 1)
        items = itertools.islice(self.ring, after + 1 - base, None)
        taken, size, end = 0, 0, after
        for item in reversed(list(items)) if newest else items:
            size += len(_message(item))
            if taken and size > PAGE_BYTES:
                break
            taken, end = taken + 1, item[0]
        return (end - 1, self.seq) if newest else (after, end)

    def _chunk(self, first: int, last: int, with_state: bool, page: int,
               skipped: bool) -> bytes:  # fmt: skip
        """The encoded messages: a gap notice, events ``first`` < seq <= ``last``, then the
        state."""
        parts: list[bytes] = []
        if skipped:
            parts.append(b"event: skipped\ndata: {}\n\n")
        if last > first and self.ring:
            base = self.ring[0][0]
            parts.extend(_message(item) for item in itertools.islice(
                self.ring, first + 1 - base, last + 1 - base))  # fmt: skip
        if with_state:
            parts.append(f"event: state\ndata: {self.state_text(page)}\n\n".encode())
        return b"".join(parts) if parts else b": keepalive\n\n"

    def acquired(self) -> None:
        self.viewers += 1
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None

    def released(self) -> None:
        self.viewers -= 1
        if self.viewers <= 0:
            if self._closing is not None:  # LINGER counts from the last viewer's leaving
                self._closing.cancel()
            loop = asyncio.get_running_loop()
            self._closing = loop.call_later(LINGER, self.hubs.retire, self)


class Hubs:
    """The hubs of one web server: one per run someone looks at, on one shared client."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._hubs: dict[uuid.UUID, RunHub] = {}
        self._starting: dict[uuid.UUID, asyncio.Future[RunHub | None]] = {}
        self._closers: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._hubs)

    async def acquire(self, run_id: uuid.UUID) -> RunHub | None:
        """The run's hub (started when new), counted as one more viewer; None when the run
        does not exist. Pair with :meth:`RunHub.released`."""
        hub = self._hubs.get(run_id)
        if hub is None:
            pending = self._starting.get(run_id)
            if pending is None:
                future: asyncio.Future[RunHub | None] = asyncio.get_running_loop().create_future()
                self._starting[run_id] = future
                try:
                    candidate = RunHub(self, run_id)
                    started = await candidate.start()
                    hub = candidate if started else None
                    if hub is not None:
                        self._hubs[run_id] = hub
                    future.set_result(hub)
                except BaseException as exc:
                    future.set_exception(exc)
                    future.exception()  # retrieved: no "never retrieved" warning
                    raise
                finally:
                    del self._starting[run_id]
            else:
                hub = await asyncio.shield(pending)
            if hub is None:
                return None
        hub.acquired()
        return hub

    def retire(self, hub: RunHub) -> None:
        if hub.viewers > 0 or self._hubs.get(hub.run_id) is not hub:
            return
        del self._hubs[hub.run_id]
        task = asyncio.get_running_loop().create_task(hub.close())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def close(self) -> None:
        hubs, self._hubs = list(self._hubs.values()), {}
        for hub in hubs:
            await hub.close()
        for task in list(self._closers):
            with contextlib.suppress(Exception):
                await task
