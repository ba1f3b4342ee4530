"""How the tools show a run: one line per event, the tables and the live view drawn with
``rich``, and the JSON forms, in one place that the command (:mod:`~luft_redis.tools.cli`),
its live views (:mod:`~luft_redis.tools.live`) and the web view (:mod:`luft_redis.tools.web`)
import. No I/O: each function renders what it is given.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final, TextIO

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .. import index
from .. import types as t
from ..history import Version
from ..limits import RateLimit
from ..pools import PoolRun
from ..tasks import TaskInfo, TaskState
from ..wire import decode_entry, entry_id
from .doctor import ServerReport

__all__ = ["LIMIT_COLUMNS", "STATUS_STYLE", "decode_page", "dumps", "event_json", "event_line",
           "lease_left", "limit_cells", "limits_table", "one_line", "pool_table", "print_report",
           "render_run", "run_row_json", "show_json", "task_table", "utc_time", "version_json",
           "version_line"]  # fmt: skip


_FIRST: Final = ("status", "level", "msg", "label", "phase_id", "agent_id", "name", "role",
                 "model", "tokens", "ok", "failed", "elapsed_ms", "task")  # fmt: skip


_SKIP: Final = frozenset({"type", "run_id", "ts"})


_WIDTH: Final = 60


_FINDINGS_SHOWN: Final = 5


_TASKS_SHOWN: Final = 12


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


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        return list(value)
    if isinstance(value, (uuid.UUID, dt.datetime)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot serialize {type(value).__name__}")


def dumps(value: Any) -> str:
    """JSON text as the CLI prints it (UUIDs, datetimes and frozen containers included)."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, sort_keys=False)


def print_report(report: ServerReport, out: TextIO) -> None:
    """Print one line per check, then a verdict."""
    width = max((len(c.name) for c in report.checks), default=0)
    for check in report.checks:
        where = f"[{check.node}] " if check.node else ""
        print(f"{check.level.upper():<8} {where}{check.name:<{width}}  {check.message}", file=out)
    counts: Counter[str] = Counter(check.level for check in report.checks)
    if not report.ok:
        print(f"\nUNSAFE: {counts['unsafe']} problem(s) can lose checkpoints; fix them first.",
              file=out)  # fmt: skip
    else:
        notes = [f"{counts[level]} {what}" for level, what in
                 (("warn", "warning(s)"), ("unknown", "unknown")) if counts[level]]  # fmt: skip
        print("\nsafe" + (f" ({', '.join(notes)})" if notes else ""), file=out)


def show_json(cp: t.RunCheckpoint, events: int | None, log_trimmed: bool, *,
              parent: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A run as ``show --json`` prints it (also the web view's ``state`` message):
    ``events`` is the length of its log (None when unknown); ``parent``: the run field of a
    fork, ``"<run id> <version>"`` (shown only when there is one)."""
    statuses = dict(Counter(result.status for result in cp.agent_results.values()))
    return {
        "run_id": str(cp.run_id),
        "status": cp.status.value,
        "task": cp.task,
        "current_phase": cp.current_phase,
        "total_tokens": cp.total_tokens,
        "created_at": utc_time(cp.created_at),
        "updated_at": utc_time(cp.updated_at),
        "completed_phases": len(cp.completed_phases),
        "agents_started": len(cp.started_agent_ids),
        "agent_results": statuses,
        "agent_sessions": len(cp.agent_sessions),
        "findings": len(cp.findings),
        "can_resume": cp.can_resume(),
        "events": events,
        "log_trimmed": log_trimmed,  # retention: the log lost its oldest events
        **({"parent": parent} if parent else {}),
    }


def version_json(version: Version) -> dict[str, Any]:
    """One version of a run as ``history --json`` prints it (and the web view's history)."""
    return {
        "version": version.version, "id": version.id,
        "time": version.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "op": version.op, "event_id": version.event_id, "base": version.base,
        "changes": list(version.changes),
    }  # fmt: skip


def version_line(version: Version) -> str:
    """One version of a run as ``history`` prints it: version, time, operation, changes."""
    row = version_json(version)
    changes = ", ".join(version.changes) or "-"
    return f"v{row['version']:<6} {row['time']}  {version.op:<8} {changes}"


def run_row_json(row: index.IndexRow) -> dict[str, Any]:
    """One run as ``runs --json`` prints it (also the rows of the web view's ``/api/runs``)."""
    return {
        "run_id": str(row.run_id), "status": row.status, "task": row.task,
        "current_phase": row.current_phase, "total_tokens": row.total_tokens,
        "agents": row.agents, "agents_ok": row.agents_ok, "agents_failed": row.agents_failed,
        "agents_running": row.agents_running, "created_at": utc_time(row.created_at),
        "updated_at": utc_time(row.updated_at),
        **({"counts_counted": True} if row.counted else {}),
        **({"problem": row.problem} if row.problem else {}),
        **({"parent": row.parent} if row.parent else {}),
    }  # fmt: skip


def event_json(entry_id: str, event: t.AgentEvent) -> dict[str, Any]:
    """One event as ``show`` prints it: its stream entry id, then luft's JSON form (the web
    view's ``event`` message)."""
    return {"id": entry_id, **event.to_json()}


def decode_page(
    run_id: uuid.UUID, key: str, page: Sequence[Any]
) -> list[tuple[str, t.AgentEvent]]:
    """An ``XREVRANGE`` page of the run's event log as (entry id, event), oldest first
    (:class:`~luft_redis.errors.LuftRedisError` for an entry that does not decode)."""
    out: list[tuple[str, t.AgentEvent]] = []
    for raw_id, fields in reversed(page):
        eid = entry_id(raw_id)
        out.append((eid, decode_entry(run_id, key, eid, fields)))
    return out


def pool_table(runs: Sequence[PoolRun]) -> Table:
    """A pool's runs: run id, status, state in the pool's index, weight, priority, tasks
    ready and leased, tokens against the budget, max leases."""
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("run id", no_wrap=True, min_width=36)
    table.add_column("status", no_wrap=True)
    table.add_column("in pool", no_wrap=True)
    for name in ("weight", "priority", "ready", "leased"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("tokens / budget", justify="right", no_wrap=True)
    table.add_column("max leases", justify="right", no_wrap=True)
    for run in runs:
        budget = "-" if run.max_tokens is None else str(run.max_tokens)
        tokens = Text(f"{run.total_tokens} / {budget}",
                      style="bold red" if run.over_budget else "")  # fmt: skip
        table.add_row(str(run.run_id), Text(run.status, style=STATUS_STYLE.get(run.status, "")),
                      run.state + (" (over budget)" if run.over_budget else ""),
                      str(run.weight), str(run.priority), str(run.ready), str(run.leased),
                      tokens, "-" if run.max_leases is None else str(run.max_leases))  # fmt: skip
    return table


LIMIT_COLUMNS: Final = ("limiter", "requests/min", "tokens/min", "burst s", "requests now",
                        "tokens now", "admitted", "waits", "tokens")  # fmt: skip
"""The columns of a rate limiter's row (``luft-redis limits``, the web view's pools page)."""


def limit_cells(limit: RateLimit) -> list[str]:
    """A rate limiter's row as text, in LIMIT_COLUMNS' order ("-": not limited)."""

    def opt(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    return [limit.name, opt(limit.requests_per_minute), opt(limit.tokens_per_minute),
            f"{limit.burst:g}", opt(limit.requests_available), opt(limit.tokens_available),
            str(limit.admitted), str(limit.waits), str(limit.tokens)]  # fmt: skip


def limits_table(limits: Sequence[RateLimit]) -> Table:
    """The rate limiters: rates, burst, what each would admit now, and its counters."""
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    for i, name in enumerate(LIMIT_COLUMNS):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    waits = LIMIT_COLUMNS.index("waits")
    for limit in limits:
        text = limit_cells(limit)
        cells: list[str | Text] = list(text)
        cells[waits] = Text(text[waits], style="yellow" if limit.waits else "")
        table.add_row(*cells)
    return table
