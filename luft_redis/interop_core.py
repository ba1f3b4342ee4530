"""The I/O-free part of moving runs between Redis and luft's own stores
(:mod:`luft_redis.interop` says what they do): the errors and results, luft's JSON forms as
serde_json writes them, and the run directory and SQLite files read and written. The Redis
side is :mod:`luft_redis.asyncio.interop` (hand-written) and :mod:`luft_redis._sync.interop`
(generated from it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

from . import types as t
from .errors import (
    LuftRedisError,
    RunNotFoundError,
    ValidationError,
)
from .scripts import translate_error

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
    "dumps_compact",
    "dumps_pretty",
    "read_checkpoint_file",
    "read_event_file",
    "sqlite_run_ids",
]

CHECKPOINT_FILE: Final = "checkpoint.json"
EVENTS_FILE: Final = "events.jsonl"

BATCH: Final = 500
"""Events per pipelined XADD batch on import, and per XRANGE page on export."""

STAGING_TTL: Final = 3600
"""Seconds the staging keys of an import live if the importing process dies half way."""

_R = TypeVar("_R")

Progress = Callable[[int, "int | None"], None]
"""``progress(done, total)``: events copied so far, and in all (None when unknown)."""


# ---------------------------------------------------------------------------------- errors


class InteropError(LuftRedisError):
    """A run could not be moved between Redis and a luft store; nothing was half-written,
    except where the message says so (:func:`export_run_dir` when the second of its two
    renames fails: the new ``events.jsonl`` is in place, ``checkpoint.json`` is not)."""


class LogTrimmedError(InteropError):
    """The run's event log was trimmed (``max_events``): its oldest events are gone, so an
    export would pretend a partial log is whole. ``allow_trimmed=True`` (``--allow-trimmed``)
    exports what is left."""

    def __init__(self, run_id: uuid.UUID) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id}: its event log was trimmed (max_events), its oldest events are "
            "gone; refusing to export a partial log as a whole one (pass allow_trimmed=True / "
            "--allow-trimmed to export what is left)"
        )


class RunFileError(InteropError, ValueError):
    """A run directory file is missing or malformed: ``path``, ``line`` (1-based, or None for
    the whole file) and, for a value that breaks the contract, ``field``."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, message: str,
                 field: str = "") -> None:  # fmt: skip
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path if line is None else f"{self.path} line {line}"
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")


class SqliteSchemaError(InteropError):
    """A luft SQLite database lacks a table or column luft-redis reads or writes."""

    def __init__(self, path: str, table: str, column: str | None, message: str) -> None:
        self.path = path
        self.table = table
        self.column = column
        where = f"table {table}" + (f" column {column}" if column else "")
        super().__init__(f"{path}: {where}: {message}")


class SqliteDataError(InteropError, ValueError):
    """A row of a luft SQLite database cannot be read as the contract's types: ``path``,
    ``table``, ``row`` (``"run <id>"``, ``"run <id>, agent <id>"``, ``"seq <n>"``, ...) and,
    when one column is at fault, ``column`` (a TEXT or JSON value that is not UTF-8, JSON that
    does not parse, a record that names a field twice)."""

    def __init__(self, path: str, table: str, row: str, message: str,
                 column: str | None = None) -> None:  # fmt: skip
        self.path = path
        self.table = table
        self.row = row
        self.column = column
        where = f"table {table}, {row}" + (f", column {column}" if column else "")
        super().__init__(f"{path}: {where}: {message}")


class ImportResult(NamedTuple):
    run_id: uuid.UUID
    events: int
    replaced: bool
    """True when an existing run was replaced (``replace=True``)."""


class ExportResult(NamedTuple):
    run_id: uuid.UUID
    events: int
    target: str
    log_trimmed: bool = False
    """The run's log was trimmed: the export holds only its newest events."""


@contextlib.contextmanager
def _translated(run_id: uuid.UUID) -> Iterator[None]:
    """A Redis error raised inside, as the luft-redis error :func:`translate_error` makes of
    it; a luft-redis error passes as it is."""
    try:
        yield
    except LuftRedisError:
        raise
    except Exception as exc:
        raise translate_error(exc, run_id=run_id) from exc


# --------------------------------------------------------------- JSON as serde_json writes it


def _serde_float(value: float) -> str:
    """A finite float as serde_json writes an f64 (ryu's shortest digits, its layout)."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    kk = len(digits) + (int(exp_text) if exp_text else 0) - len(frac)  # the decimal point
    digits = digits.rstrip("0")  # sits after kk digits, k zeros after the significant ones
    k = kk - len(digits)
    if k >= 0 and kk <= 16:
        out = digits + "0" * k + ".0"
    elif 0 < kk <= 16:
        out = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        out = "0." + "0" * -kk + digits
    elif len(digits) == 1:
        out = f"{digits}e{kk - 1}"
    else:
        out = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + out


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, int):  # null, true, false or the digits (a bool too)
        return json.dumps(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError("", f"{value!r} has no JSON form")
        return _serde_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _write(value: Any, out: list[str], indent: str | None, level: int) -> None:
    """Append ``value``'s JSON to ``out``: compact (``indent`` None) or one item a line."""
    if isinstance(value, Mapping):
        items: Iterable[tuple[str | None, Any]] = ((str(k), v) for k, v in value.items())
        brackets = "{}"
    elif isinstance(value, (list, tuple)):
        items = ((None, v) for v in value)
        brackets = "[]"
    else:
        out.append(_scalar(value))
        return
    if not value:
        out.append(brackets)
        return
    inner = "" if indent is None else "\n" + indent * (level + 1)
    colon = ":" if indent is None else ": "
    out.append(brackets[0])
    for i, (key, item) in enumerate(items):
        out.append(("," if i else "") + inner + ("" if key is None else _scalar(key) + colon))
        _write(item, out, indent, level + 1)
    out.append(("" if indent is None else "\n" + indent * level) + brackets[1])


def dumps_compact(value: Any) -> str:
    """``value`` as ``serde_json::to_string`` writes it: no spaces, UTF-8, keys in order."""
    out: list[str] = []
    _write(value, out, None, 0)
    return "".join(out)


def dumps_pretty(value: Any) -> str:
    """``value`` as ``serde_json::to_string_pretty`` writes it: two-space indent, ``": "``,
    UTF-8, no trailing newline."""
    out: list[str] = []
    _write(value, out, "  ", 0)
    return "".join(out)


def checkpoint_json(cp: t.RunCheckpoint) -> dict[str, Any]:
    """luft's JSON object of ``cp`` with the maps sorted by agent id (a stable byte form)."""
    obj = cp.to_json()
    for name in ("agent_results", "agent_sessions"):
        obj[name] = dict(sorted(obj[name].items()))
    return obj


# ------------------------------------------------------------------------ the run directory


# Where luft reads a struct (a derived serde Deserialize) rather than a free JSON value. serde
# refuses a struct that names a field twice ("duplicate field"); a free value
# (serde_json::Value: `output`, `report`, `raw`, `args`, `results`, `result`, `data`,
# `workflow_meta`) and a map (HashMap: `agent_results`, `agent_sessions`) keep the last value.
# The contract's field names are unambiguous, so the shape of a field follows from its name.
_STRUCT: Final = "struct"
_MAP_OF_STRUCTS: Final = "map"
_STRUCT_FIELDS: Final[dict[str, str]] = {
    "completed_phases": _STRUCT,  # [PhaseSummary]
    "agent_results": _MAP_OF_STRUCTS,  # {agent id: AgentResultCache}
    "agent_sessions": _MAP_OF_STRUCTS,  # {agent id: AgentSessionCheckpoint}
    "findings": _STRUCT,  # [Finding]
    "location": _STRUCT,  # Location
    "tokens": _STRUCT,  # TokenUsage (agent_done, pipeline_item_done; an int in a result)
    "total_tokens": _STRUCT,  # TokenUsage (run_done; an int in the checkpoint)
    "delta": _STRUCT,  # ProgressDelta
    "usage": _STRUCT,  # TokenUsage of a `tokens` ProgressDelta
    "phases": _STRUCT,  # plan_preview's phases
}


class _Repeated(NamedTuple):
    """The JSON objects of one document that named a key more than once (by ``id``; each
    entry keeps its object alive so the id is not reused)."""

    objects: dict[int, tuple[dict[str, Any], str]]

    def hook(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        """``object_pairs_hook``: the object as ``json.loads`` makes it (the last value of a
        repeated key wins), remembering the first key it repeated."""
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    self.objects[id(obj)] = (obj, key)
                    break
                seen.add(key)
        return obj

    def check(self, value: Any, path: str = "") -> None:
        """:class:`ValidationError` naming the first field a struct of ``value`` (a struct
        itself: a checkpoint or an event, or a list of them) repeats, as serde refuses it."""
        if not self.objects:
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                self.check(item, f"{path}[{i}]")
            return
        if not isinstance(value, dict):
            return
        entry = self.objects.get(id(value))
        if entry is not None and entry[0] is value:
            key = entry[1]
            raise ValidationError(
                f"{path}.{key}" if path else key,
                "field named twice (luft's serde refuses a duplicate field)",
            )
        for key, item in value.items():
            shape = _STRUCT_FIELDS.get(key)
            sub = f"{path}.{key}" if path else key
            if shape == _STRUCT:
                self.check(item, sub)
            elif shape == _MAP_OF_STRUCTS and isinstance(item, dict):
                for name, entry_value in item.items():
                    self.check(entry_value, f"{sub}.{name}")


def _loads_struct(text: str | bytes) -> Any:
    """``text`` parsed as ``json.loads`` does, refusing (:class:`ValidationError` naming the
    field) a repeated field in an object luft reads as a struct: the checkpoint, an event, a
    finding and the other records of the contract (an object, or a list of them). A repeated
    key inside a free JSON value (``output``, ``workflow_meta``, ...) or of the result and
    session maps keeps its last value, as serde_json does. ``json.JSONDecodeError`` and
    ``RecursionError`` pass through."""
    repeated = _Repeated({})
    value = json.loads(text, object_pairs_hook=repeated.hook)
    repeated.check(value)
    return value


def _load(text: str, path: Path, line: int | None, record: Callable[[Any], _R]) -> _R:
    """``record(json)`` of a checkpoint file or an event line; :class:`RunFileError` naming
    ``path`` and ``line`` when it is not JSON or breaks the contract."""
    try:
        return record(_loads_struct(text))
    except json.JSONDecodeError as exc:
        raise RunFileError(path, line if line is not None else exc.lineno,
                           f"not JSON: {exc.msg} (column {exc.colno})") from None  # fmt: skip
    except RecursionError:
        raise RunFileError(path, line, "JSON nested too deeply") from None
    except ValidationError as exc:
        raise RunFileError(path, line, exc.message, exc.field) from None


def _unreadable(path: Path, exc: OSError) -> RunFileError:
    """The :class:`RunFileError` of a run file that cannot be opened or read."""
    if isinstance(exc, FileNotFoundError):
        return RunFileError(path, None, "no such file")
    return RunFileError(path, None, f"cannot read: {exc.strerror or exc}")


def read_checkpoint_file(path: str | os.PathLike[str]) -> t.RunCheckpoint:
    """The RunCheckpoint of a ``checkpoint.json`` (pretty or compact, any key order)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise _unreadable(p, exc) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RunFileError(p, line, "not UTF-8") from None
    return _load(text, p, None, t.RunCheckpoint.from_json)


def read_event_file(path: str | os.PathLike[str]) -> Iterator[tuple[int, t.AgentEvent]]:
    """``(line number, event)`` for each line of an ``events.jsonl``, read as it goes."""
    p = Path(path)
    try:
        handle = p.open("rb")
    except OSError as exc:
        raise _unreadable(p, exc) from None
    with handle:
        for number, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise RunFileError(p, number, "not UTF-8") from None
            if not text.strip():
                raise RunFileError(p, number, "empty line (one event per line expected)")
            yield number, _load(text, p, number, t.AgentEvent.from_json)


def _count_lines(path: Path) -> int | None:
    try:
        with path.open("rb") as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return None


# ----------------------------------------------------------------------- reading from Redis




def _check_export_targets(out: Path, targets: list[Path], overwrite: bool) -> None:
    """:class:`InteropError` unless every file of an export can be renamed into place: ``out``
    is a directory (or missing), and each target is missing, or (with ``overwrite``) not a
    directory (``os.replace`` cannot replace one; a symlink is replaced, not followed)."""
    if out.exists() and not out.is_dir():
        raise InteropError(f"{out} is not a directory")
    present = []
    for target in targets:
        try:
            mode = target.lstat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise InteropError(f"cannot check {target}: {exc.strerror or exc}") from exc
        if stat.S_ISDIR(mode):
            raise InteropError(f"{target} is a directory; nothing was written (remove it, or "
                               "export to another directory)")  # fmt: skip
        present.append(target)
    if present and not overwrite:
        raise InteropError(f"{present[0]} exists (pass overwrite=True / --force to replace)")


def _create_temp(target: Path, temps: list[Path]) -> Path:
    """A new empty file beside ``target`` (``.<name>.<random>.tmp``, created exclusively, with
    the mode ``open`` would give), appended to ``temps``."""
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    temps.append(tmp)
    return tmp


def _remove(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


# ------------------------------------------------------------------------- writing to Redis





# ---------------------------------------------------------------------------------- SQLite

SQLITE_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "runs": ("run_id", "task", "status", "started_ts", "run_dir"),
    "checkpoints": ("run_id", "status", "current_phase", "total_tokens", "created_at",
                    "updated_at", "workflow_meta", "started_agent_ids"),
    "phases": ("run_id", "phase_id", "label", "planned", "ok", "failed", "description", "role",
               "started_ts", "done_ts"),
    "agents": ("run_id", "agent_id", "phase_id", "status", "output", "findings_json",
               "input_tokens", "output_tokens", "cache_key_hash", "description", "role",
               "completed_at", "retry_count"),
    "agent_sessions": ("run_id", "agent_id", "backend_id", "protocol_session_id", "session_id",
                       "status", "updated_at", "resumable"),
    "findings": ("run_id", "agent_id", "kind", "severity", "title", "detail", "file_path",
                 "line_start", "line_end", "evidence", "data"),
    "events": ("seq", "run_id", "ts", "type", "payload"),
}  # fmt: skip
"""The tables and columns of luft's SQLite schema that luft-redis reads and writes."""

_AGENT_EXTRAS: Final = ("model", "prompt_preview", "started_ts", "done_ts", "elapsed_ms")


class _BadText(bytes):
    """A TEXT value that is not UTF-8, as :func:`_text_factory` returns it (sqlite3's own
    decoding raises ``OperationalError`` naming neither the table nor the row)."""


def _text_factory(raw: bytes) -> str | bytes:
    """The connection's ``text_factory``: TEXT as ``str``, or a :class:`_BadText` that
    :func:`_check_text` and :func:`_json_col` refuse naming the table, column and row."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return _BadText(raw)


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


def _check_text(values: Iterable[Any], columns: Iterable[str], path: str, table: str,
                row: str) -> None:  # fmt: skip
    """:class:`SqliteDataError` naming the first of ``columns`` whose TEXT is not UTF-8."""
    for value, column in zip(values, columns, strict=True):
        if isinstance(value, _BadText):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SqliteDataError(path, table, row, _not_utf8(exc), column) from None


def _connect_sqlite(path: str | os.PathLike[str]) -> sqlite3.Connection:
    p = Path(path)
    if not p.is_file():
        raise InteropError(f"{p}: no such SQLite database")
    try:
        conn = sqlite3.connect(f"file:{p.resolve()}?mode=rw", uri=True, isolation_level=None)
        conn.text_factory = _text_factory
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise InteropError(f"{p}: not a usable SQLite database: {exc}") from exc
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> dict[str, str]:
    """``column -> declared type`` (upper case) of ``table``."""
    return {r[1]: str(r[2] or "").upper() for r in conn.execute(f'PRAGMA table_info("{table}")')}


def _select(conn: sqlite3.Connection, table: str, columns: Iterable[str], run_id: uuid.UUID,
            rest: str = "") -> sqlite3.Cursor:  # fmt: skip
    """``columns`` of the rows of ``table`` of run ``run_id`` (``rest``: more of the query)."""
    return conn.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE run_id = ?{rest}",
                        (run_id.bytes,))  # fmt: skip


def check_sqlite_schema(conn: sqlite3.Connection, path: str = "<database>") -> None:
    """:class:`SqliteSchemaError` naming the first table or column of :data:`SQLITE_COLUMNS`
    the database lacks."""
    for table, wanted in SQLITE_COLUMNS.items():
        have = _columns(conn, table)
        if not have:
            raise SqliteSchemaError(path, table, None, "missing (not a luft checkpoint database?)")
        for column in wanted:
            if column not in have:
                raise SqliteSchemaError(path, table, column, "missing (an older luft schema?)")


def sqlite_run_ids(path: str | os.PathLike[str]) -> list[uuid.UUID]:
    """The ids of the runs in a luft SQLite database that have a checkpoint, sorted."""
    conn = _connect_sqlite(path)
    try:
        check_sqlite_schema(conn, str(path))
        rows = enumerate(conn.execute("SELECT run_id FROM checkpoints"), 1)
        return sorted(_blob_uuid(raw, str(path), "checkpoints", "run_id", f"row {n}")
                      for n, (raw,) in rows)  # fmt: skip
    finally:
        conn.close()


def _blob_uuid(raw: Any, path: str, table: str, column: str, row: str) -> uuid.UUID:
    if isinstance(raw, bytes) and not isinstance(raw, _BadText) and len(raw) == 16:
        return uuid.UUID(bytes=raw)
    shown = bytes(raw) if isinstance(raw, bytes) else raw
    raise SqliteDataError(path, table, row, f"{shown!r:.60} is not a 16-byte UUID", column)


def _json_col(raw: Any, path: str, table: str, column: str, row: str, default: Any = None, *,
              struct: bool = False) -> Any:  # fmt: skip
    """The JSON value of a TEXT or BLOB column (``default`` for NULL). ``struct``: the value is
    a record of the contract (or a list of them) that luft reads with serde, so a field named
    twice is refused; elsewhere the last value of a repeated key wins, as in serde_json."""
    if raw is None:
        return default
    if isinstance(raw, bytes):  # a BLOB, or TEXT that is not UTF-8 (_BadText)
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SqliteDataError(path, table, row, _not_utf8(exc), column) from None
    try:
        return _loads_struct(raw) if struct else json.loads(raw)
    except (json.JSONDecodeError, TypeError) as exc:
        raise SqliteDataError(path, table, row, f"not JSON: {exc}", column) from None
    except RecursionError:
        raise SqliteDataError(path, table, row, "JSON nested too deeply", column) from None
    except ValidationError as exc:
        raise SqliteDataError(path, table, row, f"{exc.field}: {exc.message}", column) from None


def read_sqlite_checkpoint(conn: sqlite3.Connection, run_id: uuid.UUID,
                           path: str = "<database>") -> tuple[t.RunCheckpoint, str]:  # fmt: skip
    """Rebuild run ``run_id``'s checkpoint as luft's ``rebuild_checkpoint`` does, and its
    ``run_dir``. The run's finding list is its agents' findings, in the agents' row order."""
    of_run = f"run {run_id}"
    run = _select(conn, "runs", ("task", "run_dir"), run_id).fetchone()
    if run is None:
        raise RunNotFoundError(run_id)
    _check_text(run, ("task", "run_dir"), path, "runs", of_run)
    ck_columns = SQLITE_COLUMNS["checkpoints"][1:]  # all but run_id
    ck = _select(conn, "checkpoints", ck_columns, run_id).fetchone()
    if ck is None:
        raise SqliteDataError(path, "checkpoints", of_run, "no checkpoint row")
    _check_text(ck[:5], ck_columns[:5], path, "checkpoints", of_run)
    phase_columns = ("phase_id", "label", "planned", "ok", "failed", "description", "role")
    phases = []
    for r in _select(conn, "phases", phase_columns, run_id, " ORDER BY phase_id"):
        _check_text(r, phase_columns, path, "phases", f"{of_run}, phase {r[0]!r:.40}")
        phases.append(dict(zip(phase_columns, r, strict=True)))
    agent_columns = ("agent_id", "phase_id", "status", "output", "findings_json",
                     "input_tokens", "output_tokens", "cache_key_hash", "description", "role",
                     "completed_at")  # fmt: skip
    results: dict[str, Any] = {}
    findings: list[Any] = []
    for n, r in enumerate(_select(conn, "agents", agent_columns, run_id,
                                  " AND status != 'running' ORDER BY rowid"), 1):  # fmt: skip
        aid = str(_blob_uuid(r[0], path, "agents", "agent_id", f"{of_run}, row {n}"))
        row = f"{of_run}, agent {aid}"
        _check_text(r, agent_columns, path, "agents", row)
        agent_findings = _json_col(r[4], path, "agents", "findings_json", row, [], struct=True)
        if not isinstance(r[5], int) or not isinstance(r[6], int):
            raise SqliteDataError(path, "agents", row, "input_tokens/output_tokens not integers")
        results[aid] = {
            "agent_id": aid, "phase_id": r[1], "status": r[2],
            "output": _json_col(r[3], path, "agents", "output", row),
            "findings": agent_findings, "tokens": r[5] + r[6], "completed_at": r[10],
            "cache_key_hash": r[7], "description": r[8], "role": r[9],
        }  # fmt: skip
        if isinstance(agent_findings, list):
            findings += agent_findings
    session_columns = SQLITE_COLUMNS["agent_sessions"][1:]  # all but run_id
    sessions: dict[str, Any] = {}
    for n, r in enumerate(_select(conn, "agent_sessions", session_columns, run_id,
                                  " ORDER BY rowid"), 1):  # fmt: skip
        aid = str(_blob_uuid(r[0], path, "agent_sessions", "agent_id", f"{of_run}, row {n}"))
        _check_text(r, session_columns, path, "agent_sessions", f"{of_run}, agent {aid}")
        sessions[aid] = {**dict(zip(session_columns, r, strict=True)), "agent_id": aid,
                         "resumable": bool(r[6]) if isinstance(r[6], int) else r[6]}  # fmt: skip
    obj = {
        "run_id": str(run_id), "task": run[0], "status": ck[0], "current_phase": ck[1],
        "completed_phases": phases, "agent_results": results, "agent_sessions": sessions,
        "findings": findings, "total_tokens": ck[2], "created_at": ck[3], "updated_at": ck[4],
        "workflow_meta": _json_col(ck[5], path, "checkpoints", "workflow_meta", of_run),
        "started_agent_ids": _json_col(ck[6], path, "checkpoints", "started_agent_ids",
                                       of_run, []),
    }  # fmt: skip
    try:
        cp = t.RunCheckpoint.from_json(obj)
    except ValidationError as exc:
        raise SqliteDataError(path, "checkpoint of", f"run {run_id}",
                              f"{exc.field}: {exc.message}") from None  # fmt: skip
    return cp, run[1] if isinstance(run[1], str) else ""


def _iter_sqlite_events(conn: sqlite3.Connection, run_id: uuid.UUID,
                        path: str) -> Iterator[tuple[str, t.AgentEvent]]:  # fmt: skip
    for seq, payload in _select(conn, "events", ("seq", "payload"), run_id, " ORDER BY seq"):
        obj = _json_col(payload, path, "events", "payload", f"seq {seq}", struct=True)
        try:
            yield str(seq), t.AgentEvent.from_json(obj)
        except ValidationError as exc:
            raise SqliteDataError(path, "events", f"seq {seq}",
                                  f"{exc.field}: {exc.message}") from None  # fmt: skip


def _event_ts(event: t.AgentEvent) -> str | None:
    ts = getattr(event, "ts", None)
    return t.format_timestamp(ts) if ts is not None else None


def _integrity(path: str, exc: sqlite3.IntegrityError) -> InteropError:
    text = str(exc)
    marker = "NOT NULL constraint failed: "
    if text.startswith(marker):
        table, _, column = text[len(marker) :].partition(".")
        return SqliteSchemaError(path, table, column,
                                 "required by the database, unknown to luft-redis")  # fmt: skip
    return InteropError(f"{path}: {text}")


def _insert_events(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.executemany("INSERT INTO events (run_id, ts, type, payload) VALUES (?, ?, ?, ?)", rows)


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any],
            verb: str = "INSERT") -> None:  # fmt: skip
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    conn.execute(f"{verb} INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))
