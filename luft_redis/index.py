"""The run index: one sorted set per prefix, so that ``luft-redis runs`` stays fast.

``<prefix>:{<prefix>}:runs`` (:func:`luft_redis.keys.run_index_key`) holds every run id under
the prefix, scored by the run's ``updated_at`` (unix seconds) at its last lifecycle change. It
lives in its own Cluster slot, so a run's scripts (which touch only the run's slot) cannot keep
it; the front ends do (``index_add`` and ``index_remove`` of :mod:`luft_redis._sync.fcall`), right
after the scripts that

- create a run (``init_run``, ``init_run_with_meta``): ZADD;
- finish one (``append_event(s)`` with a ``run_done``, ``cancel``, ``save_checkpoint`` of a
  final status): ZADD;
- resume one (``reset_status_to_running``): ZADD;
- delete one (``delete_run``): ZREM.

Each is idempotent and retried with the backend's retry policy like any write. When it still
fails the operation has happened anyway (it is the script that counts), so the failure is
logged, not raised: the index is derived data, and ``luft-redis runs --rebuild-index``
(:func:`rebuild`) rebuilds it from a SCAN of the runs. An expiry (``expire_finished_after``)
cannot touch the index either: readers (:func:`read_page`, ``luft-redis gc``) skip entries
whose run is gone and remove them (ZREM).

Next to the index (same slot) the front ends keep the **status counts** the runs page shows in
one read: ``<prefix>:{<prefix>}:runs:status`` (hash: run id -> ``"<updated_at> <version>
<incarnation> <status>"``, the status each indexed run was indexed with) and
``<prefix>:{<prefix>}:runs:counts`` (hash: status -> runs). ``lua/index_status-3.lua`` (a
function of the library) changes an index entry, its status and the counts together, atomically,
and only forwards (a read older than the stored one changes nothing); every index write above
and every removal of an entry whose run is gone goes through it. :func:`read_counts` reads them;
when some indexed runs have no status entry (indexed by an older version, or an index write that
failed) it counts over the index once instead and says so, and ``--rebuild-index`` rewrites the
statuses and counts with the index.

The score is a lower bound of the run's last update: events that do not finish a run leave the
index alone (one more round trip per event would cost every writer), so a running run keeps the
time it was created or resumed until it finishes. :func:`read_page` returns the real
``updated_at`` of the rows it reads.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import types as t
from .errors import CorruptDataError
from .keys import run_index_key, run_keys

__all__ = [
    "STATUSES",
    "STATUS_FIELDS",
    "Counts",
    "IndexRow",
    "Page",
    "finishes",
    "row_of",
    "run_status_key",
    "score_of",
    "script_keys",
    "status_args",
    "status_counts_key",
    "warn_index_failure",
]

logger = logging.getLogger(__name__)

ROW_FIELDS = ("status", "total_tokens", "updated_at", "created_at", "task", "current_phase",
              "agents", "agents_ok", "agents_failed", "parent")
"""The run-hash fields :func:`read_page` reads for each row (one HMGET)."""

STATUS_FIELDS = ("status", "updated_at", "version", "incarnation")
"""The run-hash fields an index write reads (:func:`status_args`)."""


def run_status_key(prefix: str) -> str:
    """The hash of the status each indexed run was indexed with (next to the index)."""
    return f"{run_index_key(prefix)}:status"


def status_counts_key(prefix: str) -> str:
    """The hash of runs per status (next to the index)."""
    return f"{run_index_key(prefix)}:counts"


def script_keys(prefix: str) -> list[str]:
    """KEYS of ``lua/index_status-3.lua``."""
    return [run_index_key(prefix), run_status_key(prefix), status_counts_key(prefix)]


def status_args(run_id: uuid.UUID, values: Sequence[Any]) -> list[str] | None:
    """ARGV of an ``add`` from the run hash's :data:`STATUS_FIELDS` (None: the run is gone)."""
    status, updated, version, inc = values
    if status is None:
        return None
    return ["add", str(run_id), text(status), text(updated or b"0"), text(version or b"0"),
            text(inc) if inc is not None else "-"]  # fmt: skip


PAGE = 1000
"""The most index entries read per round trip while a filter skips rows."""


def finishes(events: Iterable[t.AgentEvent]) -> bool:
    """True when ``events`` contain a ``run_done`` (the run reaches a final status)."""
    return any(isinstance(event, t.RunDone) for event in events)


def score_of(checkpoint: t.RunCheckpoint | None) -> float:
    """The index score for a run: its ``updated_at`` (now, when the cache has no snapshot)."""
    if checkpoint is None:
        return float(int(time.time()))
    return float(checkpoint.updated_at)


def warn_index_failure(action: str, prefix: str, run_id: uuid.UUID, exc: BaseException) -> None:
    """Log a failed index write (see the module docstring: the index is derived data)."""
    logger.warning(
        "run index %s for run %s under prefix %r failed (%s); the run itself is written; "
        "`luft-redis runs --rebuild-index` repairs the index",
        action, run_id, prefix, exc,
    )  # fmt: skip


# ------------------------------------------------------------------------ reading (no I/O)


@dataclass(frozen=True)
class IndexRow:
    """One run as ``luft-redis runs`` shows it."""

    run_id: uuid.UUID
    status: str
    total_tokens: int
    updated_at: int
    created_at: int
    task: str
    current_phase: int
    agents: int
    """Distinct agents that started or have a result: the run field ``agents`` the scripts
    keep; for a run written before it (luft-redis 0.1.0 and until this field), the agents
    started (``started_agent_ids``) until the run's next write that adds an agent."""
    agents_ok: int | None = None
    """Agents whose result's status is ``ok`` (run field ``agents_ok``); None when
    :attr:`problem` says why."""
    agents_failed: int | None = None
    """Agents with a result of another status (run field ``agents_failed``)."""
    counted: bool = False
    """True for a run written before the counters existed: ok/failed were counted from its
    results by this read (once per run version, then remembered in this process)."""
    problem: str | None = None
    """Why the counts are not shown (a corrupt counter: reported, never defaulted)."""
    parent: str | None = None
    """A fork's origin, ``"<run id> <version>"`` (the run field ``parent``)."""

    @property
    def forked_from(self) -> str:
        """``fork of 0193a1b2 v57`` for a fork, else ``""``."""
        if not self.parent:
            return ""
        run, _, version = self.parent.partition(" ")
        return f"fork of {run[:8]} v{version}"

    @property
    def agents_running(self) -> int | None:
        """Agents that started and have no result yet: ``agents - ok - failed``."""
        if self.agents_ok is None or self.agents_failed is None:
            return None
        return max(0, self.agents - self.agents_ok - self.agents_failed)


def text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def decimal_field(key: str, name: str, raw: Any) -> int:
    """A stored decimal field, :class:`CorruptDataError` naming it when it is not one."""
    try:
        return int(text(raw))
    except ValueError:
        raise CorruptDataError(key, name, f"is not a decimal number: {text(raw)[:40]!r}") from None


def results_tally(fields: dict[bytes, bytes]) -> tuple[int, int]:
    """(ok, failed) over a run's results hash (its ``<agent>:status`` fields)."""
    ok = failed = 0
    for name, value in fields.items():
        if name.endswith(b":status"):
            if value == b"ok":
                ok += 1
            else:
                failed += 1
    return ok, failed


def row_of(prefix: str, run_id: uuid.UUID, values: Sequence[Any],
           started: Any) -> tuple[IndexRow | None, bytes | None]:  # fmt: skip
    """The row of a run from its hash's :data:`ROW_FIELDS` and ``version`` and its started
    count, and its version when it lacks the ok/failed counters (to count from its results);
    ``(None, None)`` when the run is gone (deleted, expired) since it was indexed."""
    status, tokens, updated, created, task, phase, agents, ok, failed, parent, version = values
    if status is None:
        return None, None
    key = run_keys(prefix, run_id).run
    row = IndexRow(
        run_id=run_id, status=text(status),
        total_tokens=decimal_field(key, "total_tokens", tokens or b"0"),
        updated_at=decimal_field(key, "updated_at", updated or b"0"),
        created_at=decimal_field(key, "created_at", created or b"0"),
        task=text(task or b""), current_phase=decimal_field(key, "current_phase", phase or b"0"),
        agents=int(started) if agents is None else decimal_field(key, "agents", agents),
        parent=text(parent) if parent else None,
    )  # fmt: skip
    if ok is None and failed is None:
        return row, version or b""
    if ok is None or failed is None:
        return dataclasses.replace(row, problem=str(CorruptDataError(
            key, "agents_ok" if ok is None else "agents_failed",
            "is missing while its twin is stored"))), None  # fmt: skip
    try:
        return dataclasses.replace(row, agents_ok=decimal_field(key, "agents_ok", ok),
                                   agents_failed=decimal_field(key, "agents_failed",
                                                               failed)), None  # fmt: skip
    except CorruptDataError as exc:
        return dataclasses.replace(row, problem=str(exc)), None


COUNTED: dict[tuple[uuid.UUID, bytes], tuple[int, int]] = {}
"""(ok, failed) counted from the results of runs without counters, by (run id, version)."""
COUNTED_MAX = 10_000


@dataclass
class Page:
    """What :func:`read_page` found."""

    rows: list[IndexRow]
    gone: int = 0
    """Index entries found without a run (expired, deleted): skipped and removed."""
    indexed: int = 0
    """Entries in the index (ZCARD, less the ``gone`` ones removed)."""


STATUSES = tuple(s.value for s in t.CheckpointStatus)


@dataclass(frozen=True)
class Counts:
    """Runs by status, as :func:`read_counts` found them."""

    counts: dict[str, int]
    indexed: int
    """Entries in the index (ZCARD)."""
    exact: bool
    """True: read from the status counts the index writes keep. False: some indexed runs have
    no status entry (indexed by an older version, or an index write failed), so the counts were
    counted over the index by this read (``--rebuild-index`` makes them kept again)."""
    unkept: int = 0
    """Indexed runs without a status entry (when not :attr:`exact`)."""


