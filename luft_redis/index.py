"""The run index: one sorted set per prefix, so that ``luft-redis runs`` stays fast.

``<prefix>:{<prefix>}:runs`` (:func:`luft_redis.keys.run_index_key`) holds every run id under
the prefix, scored by the run's ``updated_at`` (unix seconds) at its last lifecycle change. It
lives in its own Cluster slot, so a run's scripts (which touch only the run's slot) cannot keep
it; the front ends do (``index_add`` and ``index_remove`` of :mod:`luft_redis.fcall`), right
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

The score is a lower bound of the run's last update: events that do not finish a run leave the
index alone (one more round trip per event would cost every writer), so a running run keeps the
time it was created or resumed until it finishes. :func:`read_page` returns the real
``updated_at`` of the rows it reads.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import types as t
from .errors import CorruptDataError
from .keys import run_id_from_key, run_index_key, run_keys, run_pattern

__all__ = [
    "IndexRow",
    "finishes",
    "read_page",
    "rebuild",
    "score_of",
    "warn_index_failure",
]

logger = logging.getLogger(__name__)

ROW_FIELDS = ("status", "total_tokens", "updated_at", "created_at", "task", "current_phase",
              "agents")
"""The run-hash fields :func:`read_page` reads for each row (one HMGET)."""

_PAGE = 1000
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


# ------------------------------------------------------------------------ reading (sync)


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


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _int(key: str, name: str, raw: Any) -> int:
    try:
        return int(_text(raw))
    except ValueError:
        raise CorruptDataError(key, name, f"is not a decimal number: {_text(raw)[:40]!r}") from None


def _rows(client: Any, prefix: str, members: Sequence[Any]) -> list[IndexRow | None]:
    """One pipelined round trip: HMGET of the run hash and HLEN of ``started`` per member (the
    agents of a run that lacks the field ``agents``); None for a member whose run is gone (or
    that is not a run id)."""
    ids: list[uuid.UUID | None] = []
    pipe = client.pipeline(transaction=False)
    for raw in members:
        try:
            parsed = uuid.UUID(_text(raw))
        except ValueError:
            ids.append(None)
            continue
        ids.append(parsed)
        keys = run_keys(prefix, parsed)
        pipe.hmget(keys.run, list(ROW_FIELDS))
        pipe.hlen(keys.started)
    replies = pipe.execute() if any(i is not None for i in ids) else []
    out: list[IndexRow | None] = []
    pos = 0
    for run_id in ids:
        if run_id is None:
            out.append(None)
            continue
        values, started = replies[pos], replies[pos + 1]
        pos += 2
        status, tokens, updated, created, task, phase, agents = values
        if status is None:  # the run is gone (deleted, expired) since it was indexed
            out.append(None)
            continue
        key = run_keys(prefix, run_id).run
        out.append(IndexRow(
            run_id=run_id, status=_text(status),
            total_tokens=_int(key, "total_tokens", tokens or b"0"),
            updated_at=_int(key, "updated_at", updated or b"0"),
            created_at=_int(key, "created_at", created or b"0"),
            task=_text(task or b""), current_phase=_int(key, "current_phase", phase or b"0"),
            agents=int(started) if agents is None else _int(key, "agents", agents),
        ))  # fmt: skip
    return out


@dataclass
class Page:
    """What :func:`read_page` found."""

    rows: list[IndexRow]
    gone: int = 0
    """Index entries found without a run (expired, deleted): skipped and removed."""
    indexed: int = 0
    """Entries in the index (ZCARD, less the ``gone`` ones removed)."""


def _drop(client: Any, key: str, members: Sequence[Any]) -> int:
    """ZREM ``members`` (entries without a run) from the index; how many went. A failure is
    logged, not raised: the rows are read, the index is derived data."""
    if not members:
        return 0
    try:
        return int(client.zrem(key, *members))
    except Exception as exc:
        logger.warning("run index: removing %d entr(ies) without a run failed (%s)",
                       len(members), exc)  # fmt: skip
        return 0


def read_page(client: Any, prefix: str, *, limit: int, since: float | None = None,
              statuses: Sequence[str] = ()) -> Page:  # fmt: skip
    """The ``limit`` most recently updated runs (by the index), newest first.

    ``since`` (unix seconds) drops runs indexed before it; ``statuses`` keeps only those
    statuses. Entries whose run is gone (it expired with ``expire_finished_after``, or was
    deleted by another tool) are skipped and removed from the index (ZREM). Without a status
    filter that is one ZREVRANGEBYSCORE and one pipelined page of
    reads; with one, pages that double in size (up to :data:`_PAGE`) until ``limit``
    rows matched.
    """
    key = run_index_key(prefix)
    low: Any = "-inf" if since is None else since
    page = Page(rows=[], indexed=int(client.zcard(key)))
    offset = 0
    want = set(statuses)
    size = limit
    while len(page.rows) < limit:
        # without a filter, exactly what is missing; with one, pages that double in size
        size = limit - len(page.rows) if not want else min(max(size, limit), _PAGE)
        members = client.zrevrangebyscore(key, "+inf", low, start=offset, num=size)
        if not members:
            break
        gone: list[Any] = []
        for member, row in zip(members, _rows(client, prefix, members), strict=True):
            if row is None:
                gone.append(member)
            elif not want or row.status in want:
                page.rows.append(row)
        # entries whose run is gone (expired, deleted) leave the index; the next page then
        # starts that many entries earlier
        offset += len(members) - _drop(client, key, gone)
        page.gone += len(gone)
        if len(members) < size:
            break
        size *= 2
    page.indexed -= page.gone
    page.rows = page.rows[:limit]
    # the index orders by the last lifecycle change; show the page by its real last update
    page.rows.sort(key=lambda r: (r.updated_at, str(r.run_id)), reverse=True)
    return page


def rebuild(client: Any, prefix: str) -> tuple[int, int]:
    """Rebuild the index from a SCAN of the runs: (runs indexed, stale entries removed).

    Adds every run found (scored by its ``updated_at``) to the live index, then removes
    entries whose run no longer exists. Safe while writers run: it never removes a run that
    exists.
    """
    key = run_index_key(prefix)
    found: set[str] = set()
    batch: list[uuid.UUID] = []

    def flush() -> None:
        if not batch:
            return
        pipe = client.pipeline(transaction=False)
        for run_id in batch:
            pipe.hget(run_keys(prefix, run_id).run, "updated_at")
        scores = {
            str(run_id): float(_int(run_keys(prefix, run_id).run, "updated_at", raw))
            for run_id, raw in zip(batch, pipe.execute(), strict=True)
            if raw is not None
        }
        if scores:
            client.zadd(key, scores)
            found.update(scores)
        batch.clear()

    for raw in client.scan_iter(match=run_pattern(prefix), count=1000):
        run_id = run_id_from_key(prefix, _text(raw))
        if run_id is not None:
            batch.append(run_id)
            if len(batch) >= 1000:
                flush()
    flush()
    removed = 0
    stale = [m for m in (_text(m) for m in client.zrange(key, 0, -1)) if m not in found]
    for start in range(0, len(stale), 1000):
        chunk: list[tuple[str, uuid.UUID | None]] = []
        for member in stale[start : start + 1000]:
            try:
                chunk.append((member, uuid.UUID(member)))
            except ValueError:
                chunk.append((member, None))  # not a run id: it goes
        pipe = client.pipeline(transaction=False)
        for _, run_id in chunk:
            if run_id is not None:
                pipe.exists(run_keys(prefix, run_id).run)
        exists = iter(pipe.execute() if any(r is not None for _, r in chunk) else [])
        gone = [m for m, r in chunk if r is None or not next(exists)]
        if gone:
            removed += int(client.zrem(key, *gone))
    return len(found), removed
