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
from collections.abc import Iterator, Sequence
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .. import types as t
from ..backend import LogEntry, RedisCheckpointBackend

__all__ = ["event_line", "follow_events", "render_run", "watch_run"]

_FINAL: Final = frozenset(
    {t.CheckpointStatus.COMPLETED, t.CheckpointStatus.FAILED, t.CheckpointStatus.CANCELLED}
)
_FIRST: Final = ("status", "level", "msg", "label", "phase_id", "agent_id", "name", "role",
                 "model", "tokens", "ok", "failed", "elapsed_ms", "task")  # fmt: skip
_SKIP: Final = frozenset({"type", "run_id", "ts"})
_WIDTH: Final = 60
_FINDINGS_SHOWN: Final = 5
TICK: Final = 1.0
"""Seconds between redraws while nothing changes (the clock); changes redraw at once."""


def _entry_time(entry_id: str) -> str:
    """The wall-clock time of a stream entry id (``<ms>-<seq>``), UTC, to the millisecond."""
    try:
        ms = int(entry_id.partition("-")[0])
        stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    except (ValueError, OverflowError, OSError):
        return entry_id
    return stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{stamp.microsecond // 1000:03d}"


def _short(value: Any) -> str:
    if isinstance(value, str):
        text = " ".join(value.split())
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= _WIDTH else text[: _WIDTH - 1] + "\u2026"


def event_line(entry_id: str, event: t.AgentEvent) -> str:
    """One readable line: time (from the entry id), entry id, type, then its main fields."""
    obj = event.to_json()
    if isinstance(event, t.AgentDone):
        obj["tokens"] = event.tokens.total()
        obj["findings"] = len(event.findings)
        obj.pop("output", None)
        obj.pop("prompt", None)
    names = [n for n in _FIRST if n in obj] + [n for n in obj if n not in _FIRST]
    fields = " ".join(
        f"{name}={_short(obj[name])}" for name in names
        if name not in _SKIP and obj[name] is not None and obj[name] != [] and obj[name] != {}
    )  # fmt: skip
    return f"{_entry_time(entry_id)}  {entry_id:<17} {event.TYPE:<16} {fields}".rstrip()


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


def _when(seconds: int) -> str:
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(seconds)


def render_run(cp: t.RunCheckpoint, *, note: str = "") -> RenderableType:
    """The live view of a run: its status line, the current phase's progress, findings."""
    results = cp.agent_results.values()
    done = sum(1 for r in results if r.status == "ok")
    failed = len(cp.agent_results) - done
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column(overflow="fold")
    colour = {"running": "cyan", "completed": "green", "failed": "red"}.get(
        cp.status.value, "yellow"
    )
    head.add_row("run", Text(str(cp.run_id)))
    head.add_row("task", Text(" ".join(cp.task.split())))
    head.add_row("status", Text(cp.status.value, style=f"bold {colour}"))
    head.add_row("tokens", Text(f"{cp.total_tokens:,}"))
    head.add_row("agents", Text(f"{len(cp.started_agent_ids)} started, {done} done, "
                                f"{failed} failed"))  # fmt: skip
    head.add_row("updated", Text(_when(cp.updated_at)))

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
    if note:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def watch_run(backend: RedisCheckpointBackend, console: Console) -> t.RunCheckpoint | None:
    """Draw the bound run live until it reaches a final status; the final checkpoint (None
    when the run was deleted meanwhile). Ctrl-C raises KeyboardInterrupt."""
    shown = backend.version  # read before the snapshot: a change in between is drawn next
    cp = backend.get_checkpoint()
    if cp is None:
        return None
    try:
        with Live(render_run(cp), console=console, auto_refresh=False,
                  transient=False) as live:  # fmt: skip
            while cp.status not in _FINAL:
                # woken by the run's change notices (the listener); the timeout only keeps the
                # display honest about a listener that lost its connection
                changed = backend.wait_for_change(after_version=shown, timeout=TICK)
                if not changed and backend.cache_is_fresh:
                    continue
                shown = backend.version
                fresh = backend.sync()  # no I/O while the cache is fresh; None once deleted
                if fresh is None:
                    return None
                cp = fresh
                live.update(render_run(cp), refresh=True)
            live.update(render_run(cp, note=f"the run is {cp.status.value}"), refresh=True)
        return cp
    finally:
        if not console.is_terminal:  # Live ends a terminal's last line, not a pipe's
            console.line()
