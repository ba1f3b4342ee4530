"""The run index's reads and repairs (:mod:`luft_redis.index` says what the index is): a page
of runs, the counts by status, the removal of entries whose run is gone, the rebuild.

This is the hand-written asyncio source; :mod:`luft_redis._sync.index` is generated from it
(``.ci/unasync.py``), so the web view reads the index on its one asyncio client and the
``luft-redis`` command on its sync one, through the same code.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from ..errors import CorruptDataError
from ..index import (
    COUNTED,
    COUNTED_MAX,
    PAGE,
    ROW_FIELDS,
    STATUS_FIELDS,
    STATUSES,
    Counts,
    IndexRow,
    Page,
    decimal_field,
    results_tally,
    row_of,
    run_status_key,
    script_keys,
    status_args,
    status_counts_key,
    text,
)
from ..keys import run_id_from_key, run_index_key, run_keys, run_pattern
from ..scripts import library
from .fcall import call_function

__all__ = ["count_over_index", "read_counts", "read_page", "rebuild", "remove_entries"]

logger = logging.getLogger(__name__)


async def remove_entries(client: Any, prefix: str, members: Sequence[Any]) -> int:
    """Remove index entries with their statuses and counts (``lua/index_status-3.lua``): how
    many were in the index. A failure is logged, not raised (the index is derived data)."""
    removed = 0
    fn = library().ops.index_status
    for member in members:
        try:
            removed += int(await call_function(client, fn, script_keys(prefix),
                                               ["remove", text(member)]))  # fmt: skip
        except Exception as exc:
            logger.warning("run index: removing the entry %s without a run failed (%s)",
                           text(member), exc)  # fmt: skip
    return removed


async def _count_results(client: Any, prefix: str, todo: list[tuple[uuid.UUID, bytes]]) -> None:
    """Count ok/failed over the results of runs written before the counters (one pipelined
    round trip for the runs of a page not counted yet), into :data:`~luft_redis.index.COUNTED`."""
    missing = [item for item in todo if item not in COUNTED]
    if not missing:
        return
    pipe = client.pipeline(transaction=False)
    for run_id, _ in missing:
        pipe.hgetall(run_keys(prefix, run_id).results)
    if len(COUNTED) + len(missing) > COUNTED_MAX:
        COUNTED.clear()
    for item, fields in zip(missing, await pipe.execute(), strict=True):
        COUNTED[item] = results_tally(fields)


async def _rows(client: Any, prefix: str, members: Sequence[Any]) -> list[IndexRow | None]:
    """One pipelined round trip: HMGET of the run hash and HLEN of ``started`` per member;
    None for a member whose run is gone (or that is not a run id). A run written before
    ``agents_ok``/``agents_failed`` gets them counted from its results (one more round trip,
    once per version)."""
    ids: list[uuid.UUID | None] = []
    pipe = client.pipeline(transaction=False)
    for raw in members:
        try:
            parsed = uuid.UUID(text(raw))
        except ValueError:
            ids.append(None)
            continue
        ids.append(parsed)
        keys = run_keys(prefix, parsed)
        pipe.hmget(keys.run, [*ROW_FIELDS, "version"])
        pipe.hlen(keys.started)
    replies = await pipe.execute() if any(i is not None for i in ids) else []
    out: list[IndexRow | None] = []
    uncounted: list[tuple[int, uuid.UUID, bytes]] = []
    pairs = iter(replies)
    for run_id in ids:
        if run_id is None:
            out.append(None)
            continue
        row, version = row_of(prefix, run_id, next(pairs), next(pairs))
        if version is not None:  # no counters: counted from its results
            uncounted.append((len(out), run_id, version))
        out.append(row)
    if uncounted:
        await _count_results(client, prefix, [(rid, v) for _, rid, v in uncounted])
        for at, rid, v in uncounted:
            old = out[at]
            assert old is not None
            ok_n, failed_n = COUNTED[(rid, v)]
            out[at] = dataclasses.replace(old, agents_ok=ok_n, agents_failed=failed_n,
                                          counted=True)  # fmt: skip
    return out


async def read_page(client: Any, prefix: str, *, limit: int, since: float | None = None,
                    statuses: Sequence[str] = ()) -> Page:  # fmt: skip
    """The ``limit`` most recently updated runs (by the index), newest first.

    ``since`` (unix seconds) drops runs indexed before it; ``statuses`` keeps only those
    statuses. Entries whose run is gone (it expired with ``expire_finished_after``, or was
    deleted by another tool) are skipped and removed from the index. Without a status filter
    that is one ZREVRANGEBYSCORE and one pipelined page of reads; with one, pages that double
    in size (up to :data:`~luft_redis.index.PAGE`) until ``limit`` rows matched.
    """
    key = run_index_key(prefix)
    low: Any = "-inf" if since is None else since
    page = Page(rows=[], indexed=int(await client.zcard(key)))
    offset = 0
    want = set(statuses)
    size = limit
    while len(page.rows) < limit:
        # without a filter, exactly what is missing; with one, pages that double in size
        size = limit - len(page.rows) if not want else min(max(size, limit), PAGE)
        members = await client.zrevrangebyscore(key, "+inf", low, start=offset, num=size)
        if not members:
            break
        gone: list[Any] = []
        for member, row in zip(members, await _rows(client, prefix, members), strict=True):
            if row is None:
                gone.append(member)
            elif not want or row.status in want:
                page.rows.append(row)
        # entries whose run is gone (expired, deleted) leave the index; the next page then
        # starts that many entries earlier
        offset += len(members) - (await remove_entries(client, prefix, gone) if gone else 0)
        page.gone += len(gone)
        if len(members) < size:
            break
        size *= 2
    page.indexed -= page.gone
    page.rows = page.rows[:limit]
    # the index orders by the last lifecycle change; show the page by its real last update
    page.rows.sort(key=lambda r: (r.updated_at, str(r.run_id)), reverse=True)
    return page


async def read_counts(client: Any, prefix: str, *, count: bool = True) -> Counts:
    """Runs by status under ``prefix``: one pipelined read (ZCARD of the index, HLEN of the
    statuses, HGETALL of the counts) while every indexed run has its status entry; else
    counted over the index (:func:`count_over_index`; with ``count=False`` not: empty counts)
    and marked not exact. :class:`CorruptDataError` for a count that is not a decimal, or
    counts that do not add up to the statuses kept."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(run_index_key(prefix))
    pipe.hlen(run_status_key(prefix))
    pipe.hgetall(status_counts_key(prefix))
    indexed, kept, raw = await pipe.execute()
    key = status_counts_key(prefix)
    counts = dict.fromkeys(STATUSES, 0)
    for name, value in raw.items():
        counts[text(name)] = decimal_field(key, text(name), value)
    if sum(counts.values()) != int(kept) or any(v < 0 for v in counts.values()):
        raise CorruptDataError(key, "", f"the counts add up to {sum(counts.values())}, not to "
                                        f"the {int(kept)} statuses kept in "
                                        f"{run_status_key(prefix)}")  # fmt: skip
    if int(kept) == int(indexed):
        return Counts(counts, int(indexed), True)
    return Counts(await count_over_index(client, prefix) if count else {}, int(indexed), False,
                  unkept=max(0, int(indexed) - int(kept)))  # fmt: skip


async def count_over_index(client: Any, prefix: str) -> dict[str, int]:
    """Runs by status over the whole index (ZRANGE in pages, HGET pipelined): what
    :func:`read_counts` falls back to while the status counts are incomplete."""
    key = run_index_key(prefix)
    counts = dict.fromkeys(STATUSES, 0)
    start = 0
    while True:
        members = await client.zrange(key, start, start + 999)
        if not members:
            break
        pipe = client.pipeline(transaction=False)
        for raw in members:
            try:
                pipe.hget(run_keys(prefix, uuid.UUID(text(raw))).run, "status")
            except ValueError:
                continue
        for status in await pipe.execute():
            if status is not None:
                counts[text(status)] = counts.get(text(status), 0) + 1
        start += len(members)
        if len(members) < 1000:
            break
    return counts


async def rebuild(client: Any, prefix: str) -> tuple[int, int]:
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

    async def flush() -> None:
        if not batch:
            return
        pipe = client.pipeline(transaction=False)
        for run_id in batch:
            pipe.hmget(run_keys(prefix, run_id).run, list(STATUS_FIELDS))
        scores: dict[str, float] = {}
        for run_id, values in zip(batch, await pipe.execute(), strict=True):
            args = status_args(run_id, values)
            if args is None:
                continue
            decimal_field(run_keys(prefix, run_id).run, "updated_at", args[3])
            scores[str(run_id)] = float(args[3])
            statuses[str(run_id)] = f"{args[3]} {args[4]} {args[5]} {args[2]}"
        if scores:
            await client.zadd(key, scores)
            found.update(scores)
        batch.clear()

    async for raw in client.scan_iter(match=run_pattern(prefix), count=1000):
        run_id = run_id_from_key(prefix, text(raw))
        if run_id is not None:
            batch.append(run_id)
            if len(batch) >= 1000:
                await flush()
    await flush()
    removed = 0
    stale = [m for m in (text(m) for m in await client.zrange(key, 0, -1)) if m not in found]
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
        exists = iter(await pipe.execute() if any(r is not None for _, r in chunk) else [])
        gone = [m for m, r in chunk if r is None or not next(exists)]
        if gone:
            removed += int(await client.zrem(key, *gone))
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
    await pipe.execute()
    return len(found), removed
