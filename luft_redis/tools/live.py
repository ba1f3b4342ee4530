"""The live loops of ``luft-redis events --follow`` and ``luft-redis watch``: what they draw
is :mod:`~luft_redis.tools.render`'s.

Both read through a :class:`~luft_redis.RedisCheckpointBackend` bound to the run: ``events``
with :meth:`~luft_redis.RedisCheckpointBackend.iter_events` (``XREAD BLOCK`` when it follows),
``watch`` from the backend's coherent cache, woken by the run's change notices
(:meth:`~luft_redis.RedisCheckpointBackend.wait_for_change`), never by polling the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Final

from rich.console import Console
from rich.live import Live

from .. import types as t
from .._sync.backend import LogEntry, RedisCheckpointBackend
from ..tasks import TaskInfo, TaskState
from .render import render_run

__all__ = ["follow_events", "watch_run"]

TICK: Final = 1.0
"""Seconds between redraws while nothing changes (the clock); changes redraw at once."""


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
