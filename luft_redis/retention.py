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

This module is the public face: the sync functions (generated, :mod:`luft_redis._sync.retention`)
and the core they share with the asyncio ones (:mod:`luft_redis.asyncio.retention`,
:mod:`luft_redis.retention_core`).
"""

from __future__ import annotations

from ._sync.retention import (
    collect_garbage,
    iter_finished_runs,
    iter_run_ids,
    log_trimmed,
    server_time,
)
from .retention_core import (
    DEFAULT_BATCH,
    FINAL_STATUSES,
    LOG_TRIMMED_NOTE,
    FinishedRun,
    GarbageReport,
    RetentionOptions,
    parse_duration,
)

__all__ = [
    "DEFAULT_BATCH",
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
