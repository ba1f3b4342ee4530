"""Keep Redis bounded: expiry of finished runs, trimming of event logs, garbage collection.

Three tools, from the cheapest to the most manual:

- ``expire_finished_after=timedelta(...)`` (an option of both backends and of ``from_url``):
  the script that finishes a run (status completed, failed or cancelled) sets that TTL on every
  key of the run; keys created later get the run's remaining TTL; resuming the run removes it.
  The rule lives in ``lua/includes/retention.lua``; this module only builds its option.
- ``max_events=N``: every append trims the run's event log to about ``N`` entries
  (``XTRIM MAXLEN ~``); the run field ``log_trimmed`` then says the log is no longer whole
  (``backend.log_trimmed``, :func:`log_trimmed`).
- :func:`collect_garbage` (``luft-redis gc``): deletes finished runs last updated longer ago
  than a given age, in bounded batches; :func:`iter_finished_runs` finds them through the
  run index (``--scan``: a SCAN of the keyspace, for a prefix without an index).

See ``docs/operations.md`` ("Retention: keep Redis bounded") and ``docs/redis-layout.md``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from ._sync.fcall import call_function, index_remove
from .errors import ConfigurationError, ValidationError
from .keys import (
    DEFAULT_PREFIX,
    TOMBSTONE_TTL,
    check_prefix,
    run_id_from_key,
    run_index_key,
    run_keys,
    run_pattern,
    tombstone_key,
)
from .retry import DEFAULT_RETRY, REDIS_ERRORS
from .scripts import library, translate_error

__all__ = [
    "FINAL_STATUSES",
    "LOG_TRIMMED_NOTE",
    "FinishedRun",
    "GarbageReport",
    "RetentionOptions",
    "collect_garbage",
    "iter_finished_runs",
    "iter_run_ids",
    "log_trimmed",
    "parse_duration",
    "server_time",
]

logger = logging.getLogger(__name__)

FINAL_STATUSES: Final = ("completed", "failed", "cancelled")
"""The statuses of a finished run (contract: every status but running)."""

DEFAULT_BATCH: Final = 100
"""Runs examined (and deleted) per round trip by :func:`collect_garbage`."""

LOG_TRIMMED_NOTE: Final = (
    "the event log was trimmed (max_events): its oldest events are gone, the checkpoint is exact"
)
"""What the CLI prints for a run whose log was trimmed."""



# ---------------------------------------------------------------------------- options


@dataclass(frozen=True)
class RetentionOptions:
    """A backend's retention options, checked, and their script argument."""

    expire_finished_after: dt.timedelta | None = None
    max_events: int | None = None

    @classmethod
    def make(cls, expire_finished_after: Any, max_events: Any) -> RetentionOptions:
        """Check the options (ConfigurationError naming the bad one)."""
        if expire_finished_after is not None:
            if not isinstance(expire_finished_after, dt.timedelta):
                raise ConfigurationError(
                    "expire_finished_after must be a datetime.timedelta or None, got "
                    f"{type(expire_finished_after).__name__}"
                )
            if expire_finished_after < dt.timedelta(milliseconds=1):
                raise ConfigurationError("expire_finished_after must be at least 1 ms")
            if expire_finished_after > dt.timedelta(days=365 * 100):
                raise ConfigurationError("expire_finished_after must be at most 100 years")
        if max_events is not None and (
            isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1
        ):
            raise ConfigurationError(
                f"max_events must be a positive int or None, got {max_events!r}"
            )
        if max_events is not None and max_events >= 10**15:
            raise ConfigurationError("max_events must be below 10^15")
        return cls(expire_finished_after, max_events)

    @property
    def ttl_ms(self) -> int:
        """``expire_finished_after`` in whole milliseconds (0: off)."""
        after = self.expire_finished_after
        if after is None:
            return 0
        return after // dt.timedelta(milliseconds=1)

    @property
    def script_arg(self) -> str:
        """The retention slot of the writing scripts (``lua/includes/retention.lua``):
        ``"<ttl_ms> <max_events>"``, or ``""`` when both options are off."""
        if self.expire_finished_after is None and self.max_events is None:
            return ""
        return f"{self.ttl_ms} {self.max_events or 0}"


# ---------------------------------------------------------------------------- durations


_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> dt.timedelta:
    """``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` (or plain seconds) as a timedelta
    (ValidationError naming the text)."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    if not number.isdigit() or not number.isascii():
        raise ValidationError(
            "duration", f"{text!r} is not a duration such as 90s, 15m, 12h, 7d or 2w"
        )
    seconds = int(number) * _UNITS[unit]
    if seconds > 100 * 365 * 86400:
        raise ValidationError("duration", f"{text!r} is longer than 100 years")
    return dt.timedelta(seconds=seconds)


# ---------------------------------------------------------------------------- finding runs


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def iter_run_ids(client: Any, prefix: str = DEFAULT_PREFIX, *,
                 scan_count: int = 1000) -> Iterator[uuid.UUID]:  # fmt: skip
    """Every run id under ``prefix``, by a SCAN of the run hashes (on a cluster, of every
    primary); memory stays bounded, a run may be seen twice when keys move meanwhile."""
    check_prefix(prefix)
    try:
        for raw in client.scan_iter(match=run_pattern(prefix), count=scan_count):
            run_id = run_id_from_key(prefix, _text(raw))
            if run_id is not None:
                yield run_id
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc


@dataclass(frozen=True)
class FinishedRun:
    """A finished run found by :func:`iter_finished_runs`."""

    run_id: uuid.UUID
    status: str
    updated_at: int
    """Unix seconds of its last change (server clock)."""
    ttl_ms: int
    """Milliseconds before Redis expires it; -1 without a TTL."""


def _batches(items: Iterable[uuid.UUID], size: int) -> Iterator[list[uuid.UUID]]:
    """Lists of up to ``size`` distinct items (memory stays bounded: SCAN may still return a
    run again in a later batch, after a rehash; it is then found again or skipped)."""
    batch: list[uuid.UUID] = []
    seen: set[uuid.UUID] = set()
    for item in items:
        if item in seen:
            continue
        seen.add(item)
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch, seen = [], set()
    if batch:
        yield batch


def server_time(client: Any) -> int:
    """The Redis server's clock, unix seconds (the clock of ``updated_at``)."""
    try:
        reply = client.time()
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc
    if isinstance(reply, dict):  # RedisCluster: one answer per node
        reply = next(iter(reply.values()))
    return int(reply[0])


def _check_statuses(statuses: Iterable[str]) -> frozenset[str]:
    wanted = frozenset(statuses)
    bad = sorted(wanted - set(FINAL_STATUSES))
    if bad or not wanted:
        raise ValidationError(
            "statuses", f"{', '.join(bad) or 'none'}: choose among {', '.join(FINAL_STATUSES)}"
        )
    return wanted


def _batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValidationError("batch_size", f"must be a positive int, got {batch_size!r}")
    return batch_size


def _index_candidates(client: Any, prefix: str, cutoff: int,
                      size: int) -> Iterator[list[tuple[str, uuid.UUID | None]]]:  # fmt: skip
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
            page = client.zrange(key, low, cutoff, byscore=True, offset=0, num=want,
                                 withscores=True)  # fmt: skip
        except REDIS_ERRORS as exc:
            raise translate_error(exc) from exc
        fresh = [(m, float(s)) for m, s in ((_text(m), s) for m, s in page) if m not in seen]
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


def _scan_candidates(client: Any, prefix: str,
                     size: int) -> Iterator[list[tuple[str, uuid.UUID | None]]]:  # fmt: skip
    for batch in _batches(iter_run_ids(client, prefix), size):
        yield [(str(run_id), run_id) for run_id in batch]


def iter_finished_runs(
    client: Any,
    prefix: str = DEFAULT_PREFIX,
    *,
    older_than: dt.timedelta = dt.timedelta(0),
    statuses: Iterable[str] = FINAL_STATUSES,
    now: int | None = None,
    batch_size: int = DEFAULT_BATCH,
    use_index: bool = True,
) -> Iterator[FinishedRun]:
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
    wanted = _check_statuses(statuses)
    size = _batch_size(batch_size)
    if not isinstance(older_than, dt.timedelta) or older_than < dt.timedelta(0):
        raise ValidationError("older_than", f"must be a non-negative timedelta, got {older_than!r}")
    cutoff = (server_time(client) if now is None else now) - int(older_than.total_seconds())
    batches = (
        _index_candidates(client, prefix, cutoff, size)
        if use_index
        else _scan_candidates(client, prefix, size)
    )
    for batch in batches:
        runs = [(m, r) for m, r in batch if r is not None]
        gone = [m for m, r in batch if r is None]  # not a run id: it has no place in the index
        try:
            pipe = client.pipeline(transaction=False)
            for _, run_id in runs:
                key = run_keys(prefix, run_id).run
                pipe.hmget(key, ["status", "updated_at"])
                pipe.pttl(key)
            replies = pipe.execute() if runs else []
        except REDIS_ERRORS as exc:
            raise translate_error(exc) from exc
        found: list[FinishedRun] = []
        for i, (member, run_id) in enumerate(runs):
            (status_raw, updated_raw), ttl = replies[2 * i], replies[2 * i + 1]
            if status_raw is None:
                gone.append(member)  # deleted or expired since it was indexed (or SCANned)
                continue
            status, updated = _text(status_raw), _text(updated_raw or b"")
            if status not in wanted:
                continue
            if not updated.isdigit():
                logger.error("run %s: updated_at %r is not a number; gc skips it",
                             run_id, updated)  # fmt: skip
                continue
            if int(updated) <= cutoff:
                found.append(FinishedRun(run_id, status, int(updated), int(ttl)))
        if gone and use_index:
            _drop_gone(client, prefix, gone)
        yield from found


def _drop_gone(client: Any, prefix: str, members: list[str]) -> None:
    """Remove index entries whose run is gone, with their statuses and counts
    (:func:`luft_redis._sync.index.remove_entries`; a failure is logged: the index is
    derived)."""
    from ._sync.index import remove_entries

    remove_entries(client, prefix, members)


# ---------------------------------------------------------------------------- garbage collection


@dataclass
class GarbageReport:
    """What :func:`collect_garbage` found and did."""

    dry_run: bool
    found: list[FinishedRun] = field(default_factory=list)
    """Every run that matched (with ``dry_run``: what would be deleted)."""
    deleted: list[uuid.UUID] = field(default_factory=list)
    """The runs deleted (empty with ``dry_run``)."""
    skipped: list[uuid.UUID] = field(default_factory=list)
    """Runs that matched but changed before their delete (resumed, updated, or gone)."""


def collect_garbage(
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

    Each delete is one script (``lua/gc_run-11.lua``) that checks again, atomically, that the
    run is still finished and still that old, then deletes every key of the run and tells the
    processes watching it (as ``delete_run`` does): a run resumed meanwhile is skipped, never
    deleted. ``dry_run=True`` deletes nothing and reports what would go.

    The candidates come from the run index (see :func:`iter_finished_runs`);
    ``use_index=False`` SCANs the keyspace instead, for a prefix whose index was never built.
    """
    wanted = _check_statuses(statuses)
    size = _batch_size(batch_size)
    now = server_time(client)
    report = GarbageReport(dry_run=dry_run)
    # one writer id per call, one operation per run: a retry after a lost reply gets the
    # first attempt's answer (the run's tombstone), never "gone" for a run it deleted itself
    writer = uuid.uuid4().hex
    args = [",".join(sorted(wanted)), str(int(older_than.total_seconds())), str(TOMBSTONE_TTL)]
    gc_run = library().ops.gc_run
    for run in iter_finished_runs(client, prefix, older_than=older_than, statuses=wanted,
                                  now=now, batch_size=size, use_index=use_index):  # fmt: skip
        report.found.append(run)
        if dry_run:
            continue
        keys = [*run_keys(prefix, run.run_id), tombstone_key(prefix, run.run_id)]
        call = (writer, str(len(report.found)), *args)
        try:
            done = DEFAULT_RETRY.call(functools.partial(call_function, client, gc_run, keys, call))
        except REDIS_ERRORS as exc:
            raise translate_error(exc, run_id=run.run_id) from exc
        if int(done) == 1:
            report.deleted.append(run.run_id)
            index_remove(client, DEFAULT_RETRY, prefix, run.run_id)  # `luft-redis runs`
        else:
            report.skipped.append(run.run_id)
        if len(report.found) % size == 0:
            logger.info("gc: deleted %d run(s) so far", len(report.deleted))
    if not dry_run and len(report.found) % size:
        logger.info("gc: deleted %d run(s) so far", len(report.deleted))
    return report


# ---------------------------------------------------------------------------- reading


def log_trimmed(client: Any, prefix: str, run_id: uuid.UUID) -> bool:
    """True when run ``run_id``'s event log was trimmed (its run field ``log_trimmed``), for
    tools that read a run without binding a backend (``backend.log_trimmed`` otherwise)."""
    try:
        raw = client.hget(run_keys(prefix, run_id).run, "log_trimmed")
    except REDIS_ERRORS as exc:
        raise translate_error(exc, run_id=run_id) from exc
    return raw is not None and _text(raw) == "1"
