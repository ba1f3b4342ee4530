"""Garbage collection and the retention reads (:mod:`luft_redis.retention` says what they are
for): the finished runs found through the run index or a SCAN, each deleted by one script
that checks again, atomically, that it is still finished and still old.

This is the hand-written asyncio source; :mod:`luft_redis._sync.retention` is generated from
it (``.ci/unasync.py``).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ..errors import ValidationError
from ..keys import (
    DEFAULT_PREFIX,
    TOMBSTONE_TTL,
    check_prefix,
    run_id_from_key,
    run_index_key,
    run_keys,
    run_pattern,
    tombstone_key,
)
from ..retention_core import (
    DEFAULT_BATCH,
    FINAL_STATUSES,
    FinishedRun,
    GarbageReport,
    batch_size_arg,
    statuses_arg,
    text,
)
from ..retry import DEFAULT_RETRY, REDIS_ERRORS
from ..scripts import library, translate_error
from .fcall import call_function, index_remove
from .index import remove_entries

__all__ = ["collect_garbage", "iter_finished_runs", "iter_run_ids", "log_trimmed",
           "server_time"]  # fmt: skip

logger = logging.getLogger(__name__)


async def iter_run_ids(client: Any, prefix: str = DEFAULT_PREFIX, *,
                       scan_count: int = 1000) -> AsyncIterator[uuid.UUID]:  # fmt: skip
    """Every run id under ``prefix``, by a SCAN of the run hashes (on a cluster, of every
    primary); memory stays bounded, a run may be seen twice when keys move meanwhile."""
    check_prefix(prefix)
    try:
        async for raw in client.scan_iter(match=run_pattern(prefix), count=scan_count):
            run_id = run_id_from_key(prefix, text(raw))
            if run_id is not None:
                yield run_id
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc


async def _batches(items: AsyncIterator[uuid.UUID],
                   size: int) -> AsyncIterator[list[uuid.UUID]]:  # fmt: skip
    """Lists of up to ``size`` distinct items (memory stays bounded: SCAN may still return a
    run again in a later batch, after a rehash; it is then found again or skipped)."""
    batch: list[uuid.UUID] = []
    seen: set[uuid.UUID] = set()
    async for item in items:
        if item in seen:
            continue
        seen.add(item)
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch, seen = [], set()
    if batch:
        yield batch


async def server_time(client: Any) -> int:
    """The Redis server's clock, unix seconds (the clock of ``updated_at``)."""
    try:
        reply = await client.time()
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc
    if isinstance(reply, dict):  # RedisCluster: one answer per node
        reply = next(iter(reply.values()))
    return int(reply[0])


_Batch = list[tuple[str, uuid.UUID | None]]
"""(index member, its run id or None) of a batch of candidates."""


async def _index_candidates(client: Any, prefix: str, cutoff: int,
                            size: int) -> AsyncIterator[_Batch]:  # fmt: skip
    """Batches of (member, run id or None) from the run index with a score (the run's
    ``updated_at`` at its last lifecycle change) up to ``cutoff``, oldest first, ``size`` per
    ZRANGE … BYSCORE LIMIT. Paged by score, not by offset, so that the caller may delete
    entries between batches; ``seen`` holds only the members at the current lowest score."""
    key = run_index_key(prefix)
    low: float | str = "-inf"
    seen: set[str] = set()
    while True:
        want = size + len(seen)
        try:
            page = await client.zrange(key, low, cutoff, byscore=True, offset=0, num=want,
                                 withscores=True)  # fmt: skip
        except REDIS_ERRORS as exc:
            raise translate_error(exc) from exc
        fresh = [(m, float(s)) for m, s in ((text(m), s) for m, s in page) if m not in seen]
        if not fresh:
            return
        top = fresh[-1][1]
        if top == low:
            seen.update(m for m, _ in fresh)
        else:
            seen = {m for m, s in fresh if s == top}
        low = top
        batch: list[tuple[str, uuid.UUID | None]] = []
        for member, _ in fresh:
            try:
                batch.append((member, uuid.UUID(member)))
            except ValueError:
                batch.append((member, None))
        yield batch
        if len(page) < want:
            return


async def _scan_candidates(client: Any, prefix: str, size: int) -> AsyncIterator[_Batch]:
    async for batch in _batches(iter_run_ids(client, prefix), size):
        yield [(str(run_id), run_id) for run_id in batch]


async def iter_finished_runs(
    client: Any,
    prefix: str = DEFAULT_PREFIX,
    *,
    older_than: dt.timedelta = dt.timedelta(0),
    statuses: Iterable[str] = FINAL_STATUSES,
    now: int | None = None,
    batch_size: int = DEFAULT_BATCH,
    use_index: bool = True,
) -> AsyncIterator[FinishedRun]:
    """The finished runs (status in ``statuses``) not updated for ``older_than``.

    Bounded in memory. By default it goes through the run index (``luft_redis.index``, the
    sorted set ``<prefix>:{<prefix>}:runs`` scored by ``updated_at`` at each run's last
    create, finish or resume): ZRANGE … BYSCORE up to the cutoff, ``batch_size`` entries per
    round trip, then one pipelined HMGET (status, updated_at) and PTTL per batch. A finished
    run's score is its last update, so no old finished run is missed. Index entries whose run
    is gone (expired or deleted) are removed from the index (ZREM) on the way.

    ``use_index=False`` (``luft-redis gc --scan``) SCANs the keyspace instead: for a prefix
    whose index was never built (runs written by luft-redis 0.1; ``luft-redis runs
    --rebuild-index`` builds it). ``now`` is unix seconds (default: the server's clock).
    """
    wanted = statuses_arg(statuses)
    size = batch_size_arg(batch_size)
    if not isinstance(older_than, dt.timedelta) or older_than < dt.timedelta(0):
        raise ValidationError("older_than", f"must be a non-negative timedelta, got {older_than!r}")
    cutoff = (await server_time(client) if now is None else now) - int(older_than.total_seconds())
    batches = (
        _index_candidates(client, prefix, cutoff, size)
        if use_index
        else _scan_candidates(client, prefix, size)
    )
    async for batch in batches:
        runs = [(m, r) for m, r in batch if r is not None]
        gone = [m for m, r in batch if r is None]  # not a run id: it has no place in the index
        try:
            pipe = client.pipeline(transaction=False)
            for _, run_id in runs:
                key = run_keys(prefix, run_id).run
                pipe.hmget(key, ["status", "updated_at"])
                pipe.pttl(key)
            replies = await pipe.execute() if runs else []
        except REDIS_ERRORS as exc:
            raise translate_error(exc) from exc
        for i, (member, run_id) in enumerate(runs):
            (status_raw, updated_raw), ttl = replies[2 * i], replies[2 * i + 1]
            if status_raw is None:
                gone.append(member)  # deleted or expired since it was indexed (or SCANned)
                continue
            status, updated = text(status_raw), text(updated_raw or b"")
            if status not in wanted:
                continue
            if not updated.isdigit():
                logger.error("run %s: updated_at %r is not a number; gc skips it",
                             run_id, updated)  # fmt: skip
                continue
            if int(updated) <= cutoff:
                yield FinishedRun(run_id, status, int(updated), int(ttl))
        if gone and use_index:
            await remove_entries(client, prefix, gone)


async def collect_garbage(
    client: Any,
    prefix: str = DEFAULT_PREFIX,
    *,
    older_than: dt.timedelta,
    statuses: Iterable[str] = FINAL_STATUSES,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH,
    use_index: bool = True,
) -> GarbageReport:
    """Delete the finished runs (status in ``statuses``) last updated more than
    ``older_than`` ago, ``batch_size`` runs per batch.

    Each delete is one script (``lua/gc_run-13.lua``) that checks again, atomically, that the
    run is still finished and still that old, then deletes every key of the run and tells the
    processes watching it (as ``delete_run`` does): a run resumed meanwhile is skipped, never
    deleted. ``dry_run=True`` deletes nothing and reports what would go.

    The candidates come from the run index (see :func:`iter_finished_runs`);
    ``use_index=False`` SCANs the keyspace instead, for a prefix whose index was never built.
    """
    wanted = statuses_arg(statuses)
    size = batch_size_arg(batch_size)
    now = await server_time(client)
    report = GarbageReport(dry_run=dry_run)
    # one writer id per call, one operation per run: a retry after a lost reply gets the
    # first attempt's answer (the run's tombstone), never "gone" for a run it deleted itself
    writer = uuid.uuid4().hex
    args = [",".join(sorted(wanted)), str(int(older_than.total_seconds())), str(TOMBSTONE_TTL)]
    gc_run = library().ops.gc_run
    async for run in iter_finished_runs(client, prefix, older_than=older_than, statuses=wanted,
                                  now=now, batch_size=size, use_index=use_index):  # fmt: skip
        report.found.append(run)
        if dry_run:
            continue
        keys = [*run_keys(prefix, run.run_id), tombstone_key(prefix, run.run_id)]
        call = (writer, str(len(report.found)), *args)
        try:
            done = await DEFAULT_RETRY.acall(
                functools.partial(call_function, client, gc_run, keys, call))
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run.run_id) from exc
        if int(done) == 1:
            report.deleted.append(run.run_id)
            await index_remove(client, DEFAULT_RETRY, prefix, run.run_id)  # `luft-redis runs`
        else:
            report.skipped.append(run.run_id)
        if len(report.found) % size == 0:
            logger.info("gc: deleted %d run(s) so far", len(report.deleted))
    if not dry_run and len(report.found) % size:
        logger.info("gc: deleted %d run(s) so far", len(report.deleted))
    return report


async def log_trimmed(client: Any, prefix: str, run_id: uuid.UUID) -> bool:
    """True when run ``run_id``'s event log was trimmed (its run field ``log_trimmed``), for
    tools that read a run without binding a backend (``backend.log_trimmed`` otherwise)."""
    try:
        raw = await client.hget(run_keys(prefix, run_id).run, "log_trimmed")
    except REDIS_ERRORS as exc:
        raise translate_error(exc, run_id=run_id) from exc
    return raw is not None and text(raw) == "1"
