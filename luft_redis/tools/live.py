"""What ``luft-redis events`` and ``luft-redis watch`` print: one line per event, and a live
view of one run drawn with ``rich``.

Both read through a :class:`~luft_redis.RedisCheckpointBackend` bound to the run: ``events``
with :meth:`~luft_redis.RedisCheckpointBackend.iter_events` (``XREAD BLOCK`` when it follows),
``watch`` from the backend's coherent cache, woken by the run's change notices
(:meth:`~luft_redis.RedisCheckpointBackend.wait_for_change`), never by polling the run.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .. import types as t
from ..backend import LogEntry, RedisCheckpointBackend
from ..tasks import TaskInfo, TaskState

__all__ = ["STATUS_STYLE", "event_line", "follow_events", "lease_left", "one_line", "render_run",
           "task_table", "utc_time", "watch_run"]  # fmt: skip

_FIRST: Final = ("status", "level", "msg", "label", "phase_id", "agent_id", "name", "role",
                 "model", "tokens", "ok", "failed", "elapsed_ms", "task")  # fmt: skip
_SKIP: Final = frozenset({"type", "run_id", "ts"})
_WIDTH: Final = 60
_FINDINGS_SHOWN: Final = 5
_TASKS_SHOWN: Final = 12
TICK: Final = 1.0
"""Seconds between redraws while nothing changes (the clock); changes redraw at once."""


def _event_time(entry_id: str, event: t.AgentEvent) -> str:
    """When ``event`` happened, UTC, to the millisecond: its own ``ts`` when it has one (an
    imported log keeps it), else the time its stream entry was appended (``<ms>-<seq>``)."""
    stamp = getattr(event, "ts", None)
    if not isinstance(stamp, dt.datetime):
        try:
            stamp = dt.datetime.fromtimestamp(int(entry_id.partition("-")[0]) / 1000, dt.UTC)
        except (ValueError, OverflowError, OSError):
            return entry_id
    return stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{stamp.microsecond // 1000:03d}"


def one_line(value: Any, limit: int = _WIDTH) -> str:
    """``value`` on one line of at most ``limit`` characters: a string with its whitespace
    runs made one space, anything else as compact JSON; cut short with an ellipsis."""
    if isinstance(value, str):
        text = " ".join(value.split())
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def event_line(entry_id: str, event: t.AgentEvent) -> str:
    """One readable line: time (the event's own, else its append's), entry id, type, then its
    main fields."""
    obj = event.to_json()
    if isinstance(event, t.AgentDone):
        obj["tokens"] = event.tokens.total()
        obj["findings"] = len(event.findings)
        obj.pop("output", None)
        obj.pop("prompt", None)
    names = [n for n in _FIRST if n in obj] + [n for n in obj if n not in _FIRST]
    fields = " ".join(
        f"{name}={one_line(obj[name])}" for name in names
        if name not in _SKIP and obj[name] is not None and obj[name] != [] and obj[name] != {}
    )  # fmt: skip
    return f"{_event_time(entry_id, event)}  {entry_id:<17} {event.TYPE:<16} {fields}".rstrip()


def follow_events(
    backend: RedisCheckpointBackend, since: str | None, follow: bool, types: Sequence[str]
) -> Iterator[LogEntry]:
    """The bound run's events after ``since``; with ``follow``, then new ones as they come,
    until a ``run_done`` that is the newest entry (or forever: Ctrl-C ends it)."""
    wanted = frozenset(types)
    last_id, last_event = since, None
    for entry in backend.iter_events(since, follow=False):
        last_id, last_event = entry.id, entry.event
        if not wanted or entry.event.TYPE in wanted:
            yield entry
    if not follow or isinstance(last_event, t.RunDone):
        return  # the history ends with run_done: the run is over
    for entry in backend.iter_events(last_id, follow=True):
        if not wanted or entry.event.TYPE in wanted:
            yield entry
        if isinstance(entry.event, t.RunDone):
            return


# ------------------------------------------------------------------------------ watch


def utc_time(seconds: int, form: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    """Unix seconds as UTC in ``form`` (default ISO 8601: ``2025-01-31T12:00:00Z``); the
    number itself when it is out of range."""
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime(form)
    except (OverflowError, OSError, ValueError):
        return str(seconds)


STATUS_STYLE: Final = {"running": "cyan", "completed": "green", "failed": "red",
                       "cancelled": "yellow"}  # fmt: skip
"""The colour of each run status (``runs``, ``show``, ``watch``)."""
_STATE_STYLE: Final = {"ready": "cyan", "leased": "bold", "done": "green", "dead": "red"}
_PAYLOAD_WIDTH: Final = 40


def lease_left(task: TaskInfo, now: float) -> str:
    """A task's lease expiry as time left (``12.3s left``), or how long ago it lapsed; ``-``
    for a task that is not leased. ``now`` is unix seconds (the server's clock, if known)."""
    if task.state is not TaskState.LEASED or task.expires_at is None:
        return "-"
    left = task.expires_at - now
    if task.lapsed or left <= 0:
        return f"lapsed {max(0.0, -left):.1f}s ago"
    return f"{left:.1f}s left"


def task_table(tasks: Sequence[TaskInfo], now: float, *, limit: int | None = None,
               compact: bool = False) -> Table:  # fmt: skip
    """The agent tasks as a table: agent, phase, state (``lapsed`` marked), holder, attempt,
    failures, token, lease (time left), payload (cut short). With ``limit``, the leased and
    dead tasks first, then the others, at most ``limit`` rows. ``compact`` (the live view):
    the agent id's first 8 digits, and no failures or payload column."""
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("agent id" if not compact else "agent", no_wrap=True,
                     min_width=8 if compact else 36)  # fmt: skip
    table.add_column("phase", justify="right", no_wrap=True, min_width=5)
    table.add_column("state", no_wrap=True, min_width=15)
    table.add_column("holder", no_wrap=True, overflow="ellipsis", ratio=1,
                     max_width=16 if compact else None)  # fmt: skip
    table.add_column("try" if compact else "attempt", justify="right", no_wrap=True)
    if not compact:
        table.add_column("failures", justify="right", no_wrap=True, min_width=8)
    table.add_column("token", justify="right", no_wrap=True, min_width=5)
    table.add_column("lease", no_wrap=True, min_width=16)
    if not compact:
        table.add_column("payload", no_wrap=True, overflow="ellipsis", ratio=1)
    shown = list(tasks)
    if limit is not None and len(shown) > limit:
        order = {TaskState.LEASED: 0, TaskState.DEAD: 1, TaskState.READY: 2, TaskState.DONE: 3}
        shown = sorted(shown, key=lambda task: order[task.state])[:limit]
    for task in shown:
        state = task.state.value + (" (lapsed)" if task.lapsed else "")
        style = "bold yellow" if task.lapsed else _STATE_STYLE.get(task.state.value, "")
        cells: list[Any] = [
            str(task.agent_id)[:8] if compact else str(task.agent_id), str(task.phase_id),
            Text(state, style=style), Text(task.holder or "-"), str(task.attempt),
        ]  # fmt: skip
        if not compact:
            cells.append(str(task.failures))
        cells += [str(task.token) if task.token else "-", Text(lease_left(task, now))]
        if not compact:
            payload = t.thaw_json(task.payload)
            cells.append(Text("" if payload is None else one_line(payload, _PAYLOAD_WIDTH)))
        table.add_row(*cells)
    return table


def _fleet_line(tasks: Sequence[TaskInfo]) -> str:
    """``tasks 12: 3 ready, 4 leased (1 lapsed), 5 done, 0 dead``."""
    counts = Counter(task.state for task in tasks)
    lapsed = sum(1 for task in tasks if task.lapsed)
    leased = f"{counts[TaskState.LEASED]} leased" + (f" ({lapsed} lapsed)" if lapsed else "")
    return (f"{len(tasks)}: {counts[TaskState.READY]} ready, {leased}, "
            f"{counts[TaskState.DONE]} done, {counts[TaskState.DEAD]} dead")  # fmt: skip


def render_run(cp: t.RunCheckpoint, *, note: str = "", tasks: Sequence[TaskInfo] = (),
               now: float | None = None) -> RenderableType:  # fmt: skip
    """The live view of a run: its status line, the current phase's progress, findings."""
    results = cp.agent_results.values()
    done = sum(1 for r in results if r.status == "ok")
    failed = len(cp.agent_results) - done
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column(overflow="fold")
    head.add_row("run", Text(str(cp.run_id)))
    head.add_row("task", Text(" ".join(cp.task.split())))
    head.add_row("status", Text(cp.status.value, style=f"bold {STATUS_STYLE[cp.status.value]}"))
    head.add_row("tokens", Text(f"{cp.total_tokens:,}"))
    head.add_row("agents", Text(f"{len(cp.started_agent_ids)} started, {done} done, "
                                f"{failed} failed"))  # fmt: skip
    if tasks:
        head.add_row("tasks", Text(_fleet_line(tasks)))
    head.add_row("updated", Text(utc_time(cp.updated_at, "%Y-%m-%d %H:%M:%S UTC")))

    phase = next((p for p in cp.completed_phases if p.phase_id == cp.current_phase), None)
    parts: list[RenderableType] = [head]
    if phase is not None:
        finished = sum(1 for r in results if r.phase_id == phase.phase_id)
        total = max(int(phase.planned), finished, 1)
        bar = Table.grid(padding=(0, 2))
        bar.add_column(style="bold", no_wrap=True)
        bar.add_column(ratio=1)
        bar.add_column(no_wrap=True)
        label = f"phase {phase.phase_id} {phase.label}"
        bar.add_row(
            Text(label), ProgressBar(total=total, completed=finished),
            Text(f"{finished}/{phase.planned} agents"),
        )  # fmt: skip
        parts.append(bar)
    if cp.findings:
        table = Table(title=f"latest findings ({len(cp.findings)} in all)", title_justify="left",
                      box=None, show_edge=False, pad_edge=False)  # fmt: skip
        table.add_column("severity", no_wrap=True)
        table.add_column("kind", no_wrap=True)
        table.add_column("title", overflow="ellipsis", no_wrap=True, ratio=1)
        for finding in cp.findings[-_FINDINGS_SHOWN:]:
            table.add_row(Text(str(finding.severity)), Text(finding.kind), Text(finding.title))
        parts.append(table)
    else:
        parts.append(Text("no findings yet", style="dim"))
    held = [task for task in tasks if task.state in (TaskState.LEASED, TaskState.DEAD)]
    if held:
        clock = time.time() if now is None else now
        table = task_table(held, clock, limit=_TASKS_SHOWN, compact=True)
        table.title = f"who holds what ({len(held)} leased or dead; lapsed leases marked)"
        table.title_justify = "left"
        parts.append(table)
    if note:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def _next_lapse(tasks: Sequence[TaskInfo]) -> float | None:
    """The earliest expiry (unix seconds) of a lease not yet lapsed, if any."""
    times = [task.expires_at for task in tasks
             if task.state is TaskState.LEASED and not task.lapsed and task.expires_at]  # fmt: skip
    return min(times) if times else None


def watch_run(backend: RedisCheckpointBackend, console: Console) -> t.RunCheckpoint | None:
    """Draw the bound run live until it reaches a final status; the final checkpoint (None
    when the run was deleted meanwhile). Ctrl-C raises KeyboardInterrupt.

    The run's agent tasks (who holds what, what lapsed) are read with one ``agent_tasks``
    call when the run's version moved (claims, releases and finishes are change notices) and
    once when a lease is due to lapse (a lapse writes nothing, so no notice tells of it);
    never on a tick where nothing changed."""
    shown = backend.version  # read before the snapshot: a change in between is drawn next
    cp = backend.get_checkpoint()
    if cp is None:
        return None
    tasks = backend.agent_tasks()
    lapse_at = _next_lapse(tasks)
    try:
        with Live(render_run(cp, tasks=tasks), console=console, auto_refresh=False,
                  transient=False) as live:  # fmt: skip
            while cp.status is t.CheckpointStatus.RUNNING:  # not yet final
                # woken by the run's change notices (the listener); the timeout only keeps the
                # display honest about a listener that lost its connection, and a lease lapsing
                wait = TICK if lapse_at is None else min(TICK, max(0.05, lapse_at - time.time()))
                changed = backend.wait_for_change(after_version=shown, timeout=wait)
                lapsing = lapse_at is not None and time.time() >= lapse_at
                if not changed and backend.cache_is_fresh and not lapsing:
                    continue
                shown = backend.version
                fresh = backend.sync()  # no I/O while the cache is fresh; None once deleted
                if fresh is None:
                    return None
                cp = fresh
                tasks = backend.agent_tasks()
                due = _next_lapse(tasks)
                if due is not None and lapsing and due <= (lapse_at or 0):
                    due = time.time() + TICK  # the server's clock is behind ours: look again
                lapse_at = due
                live.update(render_run(cp, tasks=tasks), refresh=True)
            live.update(render_run(cp, note=f"the run is {cp.status.value}", tasks=tasks),
                        refresh=True)  # fmt: skip
        return cp
    finally:
        if not console.is_terminal:  # Live ends a terminal's last line, not a pipe's
            console.line()
