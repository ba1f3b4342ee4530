"""Moving runs between Redis and luft's own stores (sync; the same functions as coroutines
are in :mod:`luft_redis.asyncio.interop`).

luft keeps a run either in a *run directory* (``checkpoint.json`` and ``events.jsonl``, its
earlier file store) or in its SQLite checkpoint database (``crates/luft-storage``). Both are
summarised in ``docs/interop.md``. The functions here copy one run at a time:

- :func:`export_run_dir` writes a run directory exactly as luft writes one;
- :func:`import_run_dir` loads one back, atomically (all or nothing);
- :func:`import_run` restores a run from a checkpoint and its events, atomically;
- :func:`import_sqlite` reads runs from a luft SQLite database;
- :func:`export_sqlite` writes a run into an existing luft SQLite database.

An import is a restore, not an operation: the run's stored timestamps are kept. It streams the
events into staging keys under the run's own hash tag (``<prefix>:{<run>}:import:<token>:*``,
so Redis Cluster is fine), writes the state through ``save_checkpoint-12.lua`` on those keys,
and swaps them in with ``restore_run-24.lua`` (RENAME within the slot), which also publishes a
change notice of a new incarnation: a cache bound to the run reloads. Memory stays bounded by
the checkpoint plus one batch of events, whatever the length of the log. On any error the
staging keys are deleted and the run is as it was.
"""

from __future__ import annotations

from ._sync.interop import (
    export_run_dir,
    export_sqlite,
    import_run,
    import_run_dir,
    import_sqlite,
)
from .interop_core import (
    CHECKPOINT_FILE,
    EVENTS_FILE,
    SQLITE_COLUMNS,
    ExportResult,
    ImportResult,
    InteropError,
    LogTrimmedError,
    Progress,
    RunFileError,
    SqliteDataError,
    SqliteSchemaError,
    check_sqlite_schema,
    checkpoint_json,
    dumps_compact,
    dumps_pretty,
    read_checkpoint_file,
    read_event_file,
    sqlite_run_ids,
)

__all__ = [
    "CHECKPOINT_FILE",
    "EVENTS_FILE",
    "SQLITE_COLUMNS",
    "ExportResult",
    "ImportResult",
    "InteropError",
    "LogTrimmedError",
    "Progress",
    "RunFileError",
    "SqliteDataError",
    "SqliteSchemaError",
    "check_sqlite_schema",
    "checkpoint_json",
    "dumps_compact",
    "dumps_pretty",
    "export_run_dir",
    "export_sqlite",
    "import_run",
    "import_run_dir",
    "import_sqlite",
    "read_checkpoint_file",
    "read_event_file",
    "sqlite_run_ids",
]
