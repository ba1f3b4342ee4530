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
from .keys import run_id_from_key, run_index_key, run_keys, run_pattern

__all__ = [
    "STATUSES",
    "STATUS_FIELDS",
    "Counts",
    "IndexRow",
    "count_over_index",
    "finishes",
    "read_counts",
    "read_page",
    "rebuild",
    "remove_entries",
    "run_status_key",
    "score_of",
    "script_keys",
    "status_args",
    "status_counts_key",
    "warn_index_failure",
]

logger = logging.getLogger(__name__)

ROW_FIELDS = ("status", "total_tokens", "updated_at", "created_at", "task", "current_phase",
              "agents", "agents_ok", "agents_failed")
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
    return ["add", str(run_id), _text(status), _text(updated or b"0"), _text(version or b"0"),
            _text(inc) if inc is not None else "-"]  # fmt: skip


def _eval(client: Any, prefix: str, args: Sequence[str]) -> Any:
    """Run ``lua/index_status-3.lua`` on a sync client (a function of the library; loaded on
    a miss on the node that owns the prefix's slot). The front ends' index writes go through
    :func:`luft_redis._sync.fcall.call_function`; this is the readers' path (entries of runs that
    are gone), kept here so that this module does not import the front ends."""
    import redis.exceptions

    from .connect import is_cluster
    from .retry import is_function_missing
    from .scripts import cluster_route, library

    lib = library()
    keys = script_keys(prefix)
    command = lib.ops.index_status.command(keys, args)
    route = cluster_route(client, keys) if is_cluster(client) else {}
    try:
        return client.execute_command(*command, **route)
    except redis.exceptions.ResponseError as exc:
        if not is_function_missing(exc):
            raise
    client.execute_command(*lib.load_command, **route)
    return client.execute_command(*command, **route)


def remove_entries(client: Any, prefix: str, members: Sequence[Any]) -> int:
    """Remove index entries with their statuses and counts: how many were in the index. A
    failure is logged, not raised (the index is derived data)."""
    removed = 0
    for member in members:
        try:
            removed += int(_eval(client, prefix, ["remove", _text(member)]))
        except Exception as exc:
            logger.warning("run index: removing the entry %s without a run failed (%s)",
                           _text(member), exc)  # fmt: skip
    return removed


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

    @property
    def agents_running(self) -> int | None:
        """Agents that started and have no result yet: ``agents - ok - failed``."""
        if self.agents_ok is None or self.agents_failed is None:
            return None
        return max(0, self.agents - self.agents_ok - self.agents_failed)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _int(key: str, name: str, raw: Any) -> int:
    try:
        return int(_text(raw))
    except ValueError:
        raise CorruptDataError(key, name, f"is not a decimal number: {_text(raw)[:40]!r}") from None


_COUNTED: dict[tuple[uuid.UUID, bytes], tuple[int, int]] = {}
"""(ok, failed) counted from the results of runs without counters, by (run id, version)."""
_COUNTED_MAX = 10_000


def _count_results(client: Any, prefix: str, todo: list[tuple[uuid.UUID, bytes]]) -> None:
    """Count ok/failed over the results of runs written before the counters (one pipelined
    round trip for the runs of a page not counted yet), into :data:`_COUNTED`."""
    missing = [item for item in todo if item not in _COUNTED]
    if not missing:
        return
    pipe = client.pipeline(transaction=False)
    for run_id, _ in missing:
        pipe.hgetall(run_keys(prefix, run_id).results)
    if len(_COUNTED) + len(missing) > _COUNTED_MAX:
        _COUNTED.clear()
    for item, fields in zip(missing, pipe.execute(), strict=True):
        ok = failed = 0
        for name, value in fields.items():
            if name.endswith(b":status"):
                if value == b"ok":
                    ok += 1
                else:
                    failed += 1
        _COUNTED[item] = (ok, failed)


def _rows(client: Any, prefix: str, members: Sequence[Any]) -> list[IndexRow | None]:
    """One pipelined round trip: HMGET of the run hash and HLEN of ``started`` per member (the
    agents of a run that lacks the field ``agents``); None for a member whose run is gone (or
    that is not a run id). A run written before ``agents_ok``/``agents_failed`` gets them
    counted from its results (:func:`_count_results`: one more round trip, once per version)."""
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
        pipe.hmget(keys.run, [*ROW_FIELDS, "version"])
        pipe.hlen(keys.started)
    replies = pipe.execute() if any(i is not None for i in ids) else []
    out: list[IndexRow | None] = []
    pos = 0
    uncounted: list[tuple[int, uuid.UUID, bytes]] = []
    for run_id in ids:
        if run_id is None:
            out.append(None)
            continue
        values, started = replies[pos], replies[pos + 1]
        pos += 2
        status, tokens, updated, created, task, phase, agents, ok, failed, version = values
        if status is None:  # the run is gone (deleted, expired) since it was indexed
            out.append(None)
            continue
        key = run_keys(prefix, run_id).run
        row = IndexRow(
            run_id=run_id, status=_text(status),
            total_tokens=_int(key, "total_tokens", tokens or b"0"),
            updated_at=_int(key, "updated_at", updated or b"0"),
            created_at=_int(key, "created_at", created or b"0"),
            task=_text(task or b""), current_phase=_int(key, "current_phase", phase or b"0"),
            agents=int(started) if agents is None else _int(key, "agents", agents),
        )  # fmt: skip
        if ok is not None and failed is not None:
            try:
                row = dataclasses.replace(row, agents_ok=_int(key, "agents_ok", ok),
                                          agents_failed=_int(key, "agents_failed", failed))
            except CorruptDataError as exc:
                row = dataclasses.replace(row, problem=str(exc))
        elif ok is not None or failed is not None:
            row = dataclasses.replace(row, problem=str(CorruptDataError(
                key, "agents_ok" if ok is None else "agents_failed",
                "is missing while its twin is stored")))  # fmt: skip
        else:
            uncounted.append((len(out), run_id, version or b""))
        out.append(row)
    if uncounted:
        _count_results(client, prefix, [(rid, v) for _, rid, v in uncounted])
        for at, rid, v in uncounted:
            old = out[at]
            assert old is not None
            ok_n, failed_n = _COUNTED[(rid, v)]
            out[at] = dataclasses.replace(old, agents_ok=ok_n, agents_failed=failed_n,
                                          counted=True)  # fmt: skip
    return out


@dataclass
class Page:
    """What :func:`read_page` found."""

    rows: list[IndexRow]
    gone: int = 0
    """Index entries found without a run (expired, deleted): skipped and removed."""
    indexed: int = 0
    """Entries in the index (ZCARD, less the ``gone`` ones removed)."""


def _drop(client: Any, prefix: str, members: Sequence[Any]) -> int:
    """Remove ``members`` (entries without a run) from the index, their statuses and counts;
    how many went. A failure is logged, not raised: the rows are read, the index is derived
    data."""
    if not members:
        return 0
    return remove_entries(client, prefix, members)


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
        offset += len(members) - _drop(client, prefix, gone)
        page.gone += len(gone)
        if len(members) < size:
            break
        size *= 2
    page.indexed -= page.gone
    page.rows = page.rows[:limit]
    # the index orders by the last lifecycle change; show the page by its real last update
    page.rows.sort(key=lambda r: (r.updated_at, str(r.run_id)), reverse=True)
    return page


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


def read_counts(client: Any, prefix: str, *, count: bool = True) -> Counts:
    """Runs by status under ``prefix``: one pipelined read (ZCARD of the index, HLEN of the
    statuses, HGETALL of the counts) while every indexed run has its status entry; else
    counted over the index (:func:`count_over_index`; with ``count=False`` not: empty counts)
    and marked not :attr:`Counts.exact`.
    :class:`CorruptDataError` for a count that is not a decimal, or counts that do not add up
    to the statuses kept."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(run_index_key(prefix))
    pipe.hlen(run_status_key(prefix))
    pipe.hgetall(status_counts_key(prefix))
    indexed, kept, raw = pipe.execute()
    key = status_counts_key(prefix)
    counts = dict.fromkeys(STATUSES, 0)
    for name, value in raw.items():
        counts[_text(name)] = _int(key, _text(name), value)
    if sum(counts.values()) != int(kept) or any(v < 0 for v in counts.values()):
        raise CorruptDataError(key, "", f"the counts add up to {sum(counts.values())}, not to "
                                        f"the {int(kept)} statuses kept in "
                                        f"{run_status_key(prefix)}")  # fmt: skip
    if int(kept) == int(indexed):
        return Counts(counts, int(indexed), True)
    return Counts(count_over_index(client, prefix) if count else {}, int(indexed), False,
                  unkept=max(0, int(indexed) - int(kept)))  # fmt: skip


def count_over_index(client: Any, prefix: str) -> dict[str, int]:
    """Runs by status over the whole index (ZRANGE in pages, HGET pipelined): what
    :func:`read_counts` falls back to while the status counts are incomplete."""
    key = run_index_key(prefix)
    counts = dict.fromkeys(STATUSES, 0)
    start = 0
    while True:
        members = client.zrange(key, start, start + 999)
        if not members:
            break
        pipe = client.pipeline(transaction=False)
        for raw in members:
            try:
                pipe.hget(run_keys(prefix, uuid.UUID(_text(raw))).run, "status")
            except ValueError:
                continue
        for status in pipe.execute():
            if status is not None:
                counts[_text(status)] = counts.get(_text(status), 0) + 1
        start += len(members)
        if len(members) < 1000:
            break
    return counts


def rebuild(client: Any, prefix: str) -> tuple[int, int]:
    """Rebuild the index from a SCAN of the runs: (runs indexed, stale entries removed).

    Adds every run found (scored by its ``updated_at``) to the live index, then removes
    entries whose run no longer exists, then rewrites the status entries and counts from the
    runs found. Safe while writers run: it never removes a run that exists (a status that
    changes during the rebuild is counted right from the run's next index write).
    """
    key = run_index_key(prefix)
    found: set[str] = set()
    batch: list[uuid.UUID] = []

    statuses: dict[str, str] = {}  # run id -> its status entry (see index_status-3.lua)

    def flush() -> None:
        if not batch:
            return
        pipe = client.pipeline(transaction=False)
        for run_id in batch:
            pipe.hmget(run_keys(prefix, run_id).run, list(STATUS_FIELDS))
        scores: dict[str, float] = {}
        for run_id, values in zip(batch, pipe.execute(), strict=True):
            args = status_args(run_id, values)
            if args is None:
                continue
            _int(run_keys(prefix, run_id).run, "updated_at", args[3])
            scores[str(run_id)] = float(args[3])
            statuses[str(run_id)] = f"{args[3]} {args[4]} {args[5]} {args[2]}"
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
    # the statuses and counts, rewritten from what the SCAN found (a run indexed meanwhile
    # is taken in by its next index write)
    counts: dict[str, int] = {}
    for entry in statuses.values():
        name = entry.rsplit(" ", 1)[1]
        counts[name] = counts.get(name, 0) + 1
    pipe = client.pipeline(transaction=False)
    pipe.delete(run_status_key(prefix))
    pipe.delete(status_counts_key(prefix))
    items = list(statuses.items())
    for start in range(0, len(items), 1000):
        pipe.hset(run_status_key(prefix), mapping=dict(items[start:start + 1000]))
    if counts:
        pipe.hset(status_counts_key(prefix), mapping=counts)
    pipe.execute()
    return len(found), removed
