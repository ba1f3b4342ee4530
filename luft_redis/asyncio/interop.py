"""Moving runs between Redis and luft's own stores: the Redis side of exports and imports
(:mod:`luft_redis.interop` says what they do; the file and SQLite formats are in
:mod:`luft_redis.interop_core`).

The run directory and SQLite files are read and written with blocking calls inside these
coroutines (the standard library has no asynchronous file or SQLite I/O); only the Redis
calls wait on the loop.

This is the hand-written asyncio source; :mod:`luft_redis._sync.interop` is generated from
it (``.ci/unasync.py``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from .. import types as t
from ..errors import (
    LuftRedisError,
    RunExistsError,
    RunNotFoundError,
    ValidationError,
)
from ..interop_core import (
    _AGENT_EXTRAS,
    BATCH,
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
    _check_export_targets,
    _columns,
    _connect_sqlite,
    _count_lines,
    _create_temp,
    _event_ts,
    _insert,
    _insert_events,
    _integrity,
    _iter_sqlite_events,
    _remove,
    _select,
    _translated,
    check_sqlite_schema,
    checkpoint_json,
    dumps_compact,
    dumps_pretty,
    read_checkpoint_file,
    read_event_file,
    read_sqlite_checkpoint,
    sqlite_run_ids,
)
from ..keys import (
    DEFAULT_PREFIX,
    RunKeys,
    check_prefix,
    run_keys,
)
from ..retention_core import LOG_TRIMMED_NOTE
from ..wire import (
    DEFAULT_MAX_PAYLOAD_SIZE,
    Encoder,
    check_type,
    check_uuid,
    decode_entry,
    entry_id,
)
from .backend import AsyncRedisCheckpointBackend
from .restore import import_checkpoint
from .retention import log_trimmed

__all__ = ["export_run_dir", "export_sqlite", "import_run", "import_run_dir", "import_sqlite"]

logger = logging.getLogger(__name__)


async def _check_trimmed(client: Any, prefix: str, run_id: uuid.UUID, allow: bool) -> bool:
    """Whether the run's log was trimmed; :class:`LogTrimmedError` when it was and not
    ``allow`` (a warning is logged when it is allowed)."""
    if not await log_trimmed(client, prefix, run_id):
        return False
    if not allow:
        raise LogTrimmedError(run_id)
    logger.warning("run %s: %s; exporting what is left (allow_trimmed)", run_id,
                   LOG_TRIMMED_NOTE)  # fmt: skip
    return True


async def _read_consistent(
    client: Any, prefix: str, run_id: uuid.UUID
) -> tuple[t.RunCheckpoint, str | None, RunKeys, str]:
    """The checkpoint, the id of the last event it reflects (None: empty log), the run's keys
    and its run_dir, read so that no change came between the checkpoint and that id."""
    keys = run_keys(prefix, run_id)
    async with AsyncRedisCheckpointBackend(client, prefix=prefix, watch=False) as backend:
        for _ in range(20):
            with _translated(run_id):
                before = await client.hmget(keys.run, ["version", "run_dir"])
                newest = await client.xrevrange(keys.events, count=1)
            cp = await backend.open_run(run_id)
            if cp is None:
                raise RunNotFoundError(run_id, prefix)
            if before[0] is not None and int(before[0]) == backend.version:
                last = entry_id(newest[0][0]) if newest else None
                run_dir = before[1].decode("utf-8") if before[1] is not None else ""
                return cp, last, keys, run_dir
    raise InteropError(f"run {run_id} kept changing while it was read; try again")


async def _iter_redis_events(client: Any, keys: RunKeys, run_id: uuid.UUID,
                             last: str | None) -> AsyncIterator[t.AgentEvent]:  # fmt: skip
    """The run's events up to entry ``last`` (inclusive), one XRANGE page at a time."""
    if last is None:
        return
    lower = "-"
    while True:
        with _translated(run_id):
            page = await client.xrange(keys.events, min=lower, max=last, count=BATCH)
        for raw_id, fields in page:
            yield decode_entry(run_id, keys.events, entry_id(raw_id), fields)
        if len(page) < BATCH:
            return
        lower = "(" + entry_id(page[-1][0])


async def export_run_dir(
    client: Any,
    run_id: uuid.UUID | str,
    directory: str | os.PathLike[str],
    *,
    prefix: str = DEFAULT_PREFIX,
    overwrite: bool = False,
    progress: Progress | None = None,
    allow_trimmed: bool = False,
) -> ExportResult:
    """Write run ``run_id`` as a luft run directory: ``checkpoint.json`` (pretty, as
    ``serde_json::to_string_pretty``, maps sorted by agent id, no trailing newline) and
    ``events.jsonl`` (one compact event per line). The directory is created if missing.

    Every target is checked before anything is read or written: a file already there is an
    :class:`InteropError` unless ``overwrite``, and so is (even with ``overwrite``) a target
    that is a directory, or a directory path that is not one. Both files are then written
    beside their targets under temporary names (``.<name>.<random>.tmp``, removed on any
    error) and renamed in, ``events.jsonl`` first, then ``checkpoint.json``. Each rename is
    atomic, the pair is not: a crash (or power loss) between the two renames leaves the new
    ``events.jsonl`` beside the old ``checkpoint.json`` (none if there was none) and the
    checkpoint's temporary file; the log is then ahead of the checkpoint, as after a luft
    crash between appending an event and saving its checkpoint. Export again (``overwrite``)
    to make the pair whole, and delete leftover ``.*.tmp`` files.

    A run whose log was trimmed (``max_events``) is refused with :class:`LogTrimmedError`
    before anything is written, unless ``allow_trimmed`` (then a warning is logged and
    ``ExportResult.log_trimmed`` is True)."""
    rid = check_uuid(run_id, "run_id")
    check_prefix(prefix)
    out = Path(directory)
    targets = [out / EVENTS_FILE, out / CHECKPOINT_FILE]  # in the order they are renamed in
    _check_export_targets(out, targets, overwrite)
    cp, last, keys, _ = await _read_consistent(client, prefix, rid)
    trimmed = await _check_trimmed(client, prefix, rid, allow_trimmed)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InteropError(f"cannot create {out}: {exc.strerror or exc}") from exc
    count = 0
    temps: list[Path] = []
    try:
        tmp_events = _create_temp(targets[0], temps)
        with tmp_events.open("w", encoding="utf-8", newline="\n") as handle:
            count = 0
            async for event in _iter_redis_events(client, keys, rid, last):
                count += 1
                handle.write(dumps_compact(event.to_json()) + "\n")
                if progress is not None and count % BATCH == 0:
                    progress(count, None)
        # trimmed while it was read? the file may lack the oldest events
        trimmed = trimmed or await _check_trimmed(client, prefix, rid, allow_trimmed)
        tmp_cp = _create_temp(targets[1], temps)
        tmp_cp.write_text(dumps_pretty(checkpoint_json(cp)), encoding="utf-8", newline="\n")
        _check_export_targets(out, targets, overwrite)  # again: the export took a while
    except BaseException as exc:
        _remove(temps)
        if isinstance(exc, OSError):
            raise InteropError(f"cannot write {out}: {exc.strerror or exc}; nothing was "
                               "replaced") from exc  # fmt: skip
        raise
    for tmp, target, state in (
        (tmp_events, targets[0], "nothing was replaced"),
        (tmp_cp, targets[1], f"{targets[0]} already holds the new log: export again once "
                             f"{targets[1].name} can be written"),
    ):  # fmt: skip
        try:
            os.replace(tmp, target)
        except OSError as exc:
            _remove(temps)
            raise InteropError(f"cannot replace {target}: {exc.strerror or exc}; {state}") from exc
    if progress is not None:
        progress(count, count)
    return ExportResult(rid, count, str(out), trimmed)


async def import_run(
    client: Any,
    checkpoint: t.RunCheckpoint,
    events: Iterable[t.AgentEvent],
    *,
    prefix: str = DEFAULT_PREFIX,
    run_dir: str = "",
    replace: bool = False,
    max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
    progress: Progress | None = None,
    total: int | None = None,
) -> ImportResult:
    """Restore a run from ``checkpoint`` and its event log ``events`` (any iterable, consumed
    once, in order), atomically. The run must not exist unless ``replace``
    (:class:`RunExistsError`). Timestamps are kept as given."""
    cp = check_type(checkpoint, t.RunCheckpoint, "checkpoint")
    return await import_checkpoint(client, cp, ((str(i), e) for i, e in enumerate(events)),
                                   prefix=prefix, run_dir=run_dir, replace=replace,
                                   max_payload_size=max_payload_size, progress=progress,
                                   total=total)  # fmt: skip


async def import_run_dir(
    client: Any,
    directory: str | os.PathLike[str],
    *,
    prefix: str = DEFAULT_PREFIX,
    replace: bool = False,
    run_dir: str | None = None,
    max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
    progress: Progress | None = None,
) -> ImportResult:
    """Load a luft run directory (``checkpoint.json`` + ``events.jsonl``) into Redis,
    atomically: every event and the whole state, or nothing. An existing run is a
    :class:`RunExistsError` unless ``replace``. ``run_dir`` (stored as the run's ``run_dir``)
    defaults to the directory's absolute path. A malformed file raises :class:`RunFileError`
    naming the file and line."""
    base = Path(directory)
    if not base.is_dir():
        raise RunFileError(base, None, "not a directory")
    cp_path = base / CHECKPOINT_FILE
    cp = read_checkpoint_file(cp_path)
    try:  # what only the encoder checks (unique phase ids, payload sizes) names the file too
        Encoder(max_payload_size).save(cp, cp.run_id)
    except ValidationError as exc:
        raise RunFileError(cp_path, None, exc.message, exc.field) from None
    events_path = base / EVENTS_FILE
    if not events_path.is_file():
        raise RunFileError(events_path, None, "no such file")

    def where(position: str, exc: LuftRedisError) -> LuftRedisError:
        return RunFileError(events_path, int(position), getattr(exc, "message", str(exc)),
                            getattr(exc, "field", ""))  # fmt: skip

    events = ((str(n), e) for n, e in read_event_file(events_path))
    return await import_checkpoint(client, cp, events, prefix=prefix,
                         run_dir=str(base.resolve()) if run_dir is None else run_dir,
                         replace=replace, max_payload_size=max_payload_size, progress=progress,
                         total=_count_lines(events_path), where=where)  # fmt: skip


async def import_sqlite(
    client: Any,
    path: str | os.PathLike[str],
    *,
    run_id: uuid.UUID | str | None = None,
    prefix: str = DEFAULT_PREFIX,
    replace: bool = False,
    max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
    progress: Progress | None = None,
) -> list[ImportResult]:
    """Import run ``run_id`` (default: every run with a checkpoint) from a luft SQLite
    database, each run atomically (as :func:`import_run_dir`). Existing runs are a
    :class:`RunExistsError` unless ``replace``; runs imported before the error stay."""
    where_path = str(path)
    ids = [check_uuid(run_id, "run_id")] if run_id is not None else sqlite_run_ids(path)
    conn = _connect_sqlite(path)
    out: list[ImportResult] = []
    try:
        check_sqlite_schema(conn, where_path)
        for rid in ids:
            cp, run_dir = read_sqlite_checkpoint(conn, rid, where_path)
            (total,) = _select(conn, "events", ("count(*)",), rid).fetchone()

            def where(position: str, exc: LuftRedisError) -> LuftRedisError:
                return SqliteDataError(where_path, "events", f"seq {position}", str(exc))

            events = _iter_sqlite_events(conn, rid, where_path)
            out.append(await import_checkpoint(client, cp, events,
                                     prefix=prefix, run_dir=run_dir, replace=replace,
                                     max_payload_size=max_payload_size, progress=progress,
                                     total=int(total), where=where))  # fmt: skip
    finally:
        conn.close()
    return out


async def export_sqlite(
    client: Any,
    path: str | os.PathLike[str],
    run_id: uuid.UUID | str,
    *,
    prefix: str = DEFAULT_PREFIX,
    replace: bool = False,
    progress: Progress | None = None,
    allow_trimmed: bool = False,
) -> ExportResult:
    """Write run ``run_id`` into an existing luft SQLite database (made by luft, with its
    schema), in one transaction. A database whose tables lack a column of
    :data:`SQLITE_COLUMNS` is refused (:class:`SqliteSchemaError`); a run already there is a
    :class:`RunExistsError` unless ``replace`` (its rows are then deleted first).

    Rows: ``runs`` and ``checkpoints`` from the checkpoint (``started_ts`` from the
    ``run_started`` event, else ``created_at``); ``phases`` with ``started_ts``/``done_ts``
    from the phase events; ``agents`` for each result (tokens split as the agent's last
    ``agent_done`` event reported them when it adds up, else all as input tokens);
    ``agent_sessions``; one ``findings`` row per finding of a result; ``events`` in order
    (``ts``: the event's own, else the one before it).

    A run whose log was trimmed is refused (:class:`LogTrimmedError`) unless
    ``allow_trimmed``, as by :func:`export_run_dir`."""
    rid = check_uuid(run_id, "run_id")
    where_path = str(path)
    conn = _connect_sqlite(path)
    try:
        check_sqlite_schema(conn, where_path)
        cp, last, keys, run_dir = await _read_consistent(client, prefix, rid)
        trimmed = await _check_trimmed(client, prefix, rid, allow_trimmed)
        conn.execute("BEGIN IMMEDIATE")
        try:
            count = await _write_sqlite(conn, client, cp, last, keys, run_dir, replace, where_path,
                                        progress)  # fmt: skip
            # trimmed while it was read? the rows may lack the oldest events
            trimmed = trimmed or await _check_trimmed(client, prefix, rid, allow_trimmed)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.IntegrityError as exc:
        raise _integrity(where_path, exc) from exc
    except sqlite3.DatabaseError as exc:
        raise InteropError(f"{where_path}: {exc}") from exc
    finally:
        conn.close()
    if progress is not None:
        progress(count, count)
    return ExportResult(rid, count, where_path, trimmed)


async def _write_sqlite(conn: sqlite3.Connection, client: Any, cp: t.RunCheckpoint,
                        last: str | None, keys: RunKeys, run_dir: str, replace: bool, path: str,
                        progress: Progress | None) -> int:  # fmt: skip
    rid = cp.run_id.bytes
    if any(_select(conn, table, ("1",), cp.run_id).fetchone() for table in ("runs", "checkpoints")):
        if not replace:
            raise RunExistsError(cp.run_id, "in this SQLite database",
                                 "pass replace=True / --replace to replace it")  # fmt: skip
        for table in reversed(SQLITE_COLUMNS):  # the rows that reference a run first, runs last
            conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (rid,))
    started_ts = t.format_timestamp(t.Timestamp.from_unix_nanos(cp.created_at * 1_000_000_000))
    created_type = _columns(conn, "runs").get("created_at")  # a column of some luft schemas
    first_ts: str | None = None
    run_row: dict[str, Any] = {"run_id": rid, "task": cp.task, "status": cp.status.value,
                               "started_ts": started_ts, "run_dir": run_dir}  # fmt: skip
    if created_type is not None:
        run_row["created_at"] = cp.created_at if "INT" in created_type else started_ts
    _insert(conn, "runs", run_row)
    _insert(conn, "checkpoints", {
        "run_id": rid, "status": cp.status.value, "current_phase": cp.current_phase,
        "total_tokens": cp.total_tokens, "created_at": cp.created_at,
        "updated_at": cp.updated_at,
        "workflow_meta": None if cp.workflow_meta is None else dumps_compact(cp.workflow_meta),
        "started_agent_ids": dumps_compact([str(a) for a in cp.started_agent_ids]),
    })  # fmt: skip
    # the events (streamed), remembering what other tables take from them
    phase_ts: dict[tuple[str, int], str] = {}  # (phase_started or phase_done, phase id) -> ts
    agent_info: dict[uuid.UUID, dict[str, Any]] = {}
    count = 0
    pending: list[tuple[Any, ...]] = []
    ts = started_ts  # an event without its own ts takes the one before it
    async for event in _iter_redis_events(client, keys, cp.run_id, last):
        count += 1
        own_ts = _event_ts(event)
        if isinstance(event, t.RunStarted) and first_ts is None:
            first_ts = own_ts
        ts = own_ts if own_ts is not None else ts
        if isinstance(event, (t.PhaseStarted, t.PhaseDone)):
            phase_ts[event.TYPE, event.phase_id] = ts
        elif isinstance(event, t.AgentStarted):
            agent_info.setdefault(event.agent_id, {}).update(
                model=event.model, prompt_preview=event.prompt_preview, started_ts=ts)  # fmt: skip
        elif isinstance(event, t.AgentDone):
            agent_info.setdefault(event.agent_id, {}).update(
                tokens=event.tokens, retry_count=event.retry_count, done_ts=ts,
                elapsed_ms=event.elapsed_ms)  # fmt: skip
        pending.append((rid, ts, event.TYPE, dumps_compact(event.to_json())))
        if len(pending) >= BATCH:
            _insert_events(conn, pending)
            pending = []
            if progress is not None:
                progress(count, None)
    _insert_events(conn, pending)
    if first_ts is not None and first_ts != started_ts:
        conn.execute("UPDATE runs SET started_ts = ? WHERE run_id = ?", (first_ts, rid))
        if created_type is not None and "INT" not in created_type:
            conn.execute("UPDATE runs SET created_at = ? WHERE run_id = ?", (first_ts, rid))

    for p in cp.completed_phases:
        # a PhaseSummary's (an AgentSessionCheckpoint's) fields are its table's columns
        _insert(conn, "phases", {"run_id": rid, **p.to_json(),
                                 "started_ts": phase_ts.get(("phase_started", p.phase_id)),
                                 "done_ts": phase_ts.get(("phase_done", p.phase_id))})  # fmt: skip
    agent_cols = _columns(conn, "agents")
    for aid in sorted(cp.agent_results):
        r = cp.agent_results[aid]
        info = agent_info.get(aid, {})
        usage = info.get("tokens")
        if isinstance(usage, t.TokenUsage) and usage.total() == r.tokens:
            tokens_in, tokens_out = usage.input, usage.output
        else:
            tokens_in, tokens_out = r.tokens, 0
        row: dict[str, Any] = {
            "run_id": rid, "agent_id": aid.bytes, "phase_id": r.phase_id, "status": r.status,
            "output": None if r.output is None else dumps_compact(r.output),
            "findings_json": dumps_compact([f.to_json() for f in r.findings]),
            "input_tokens": tokens_in, "output_tokens": tokens_out,
            "cache_key_hash": r.cache_key_hash, "description": r.description, "role": r.role,
            "completed_at": r.completed_at, "retry_count": info.get("retry_count", 0),
        }  # fmt: skip
        row.update({k: info[k] for k in _AGENT_EXTRAS if k in agent_cols and k in info})
        _insert(conn, "agents", row)
        for f in r.findings:
            line = f.location.line if f.location is not None else None
            _insert(conn, "findings", {
                "run_id": rid, "agent_id": aid.bytes, "kind": f.kind,
                "severity": f.severity.value, "title": f.title, "detail": f.detail,
                "file_path": f.location.file if f.location is not None else None,
                "line_start": line, "line_end": line,
                "evidence": dumps_compact(list(f.evidence)),
                "data": None if f.data is None else dumps_compact(f.data),
            }, verb="INSERT OR REPLACE")  # fmt: skip
    for aid in sorted(cp.agent_sessions):
        s = cp.agent_sessions[aid]
        _insert(conn, "agent_sessions", {"run_id": rid, **s.to_json(), "agent_id": aid.bytes,
                                         "resumable": int(s.resumable)})  # fmt: skip
    return count
