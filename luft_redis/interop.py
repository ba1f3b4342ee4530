"""Moving runs between Redis and luft's own stores (sync).

luft keeps a run either in a *run directory* (``checkpoint.json`` and ``events.jsonl``, its
earlier file store) or in its SQLite checkpoint database (``crates/luft-storage``). Both are
summarised in ``docs/interop.md``. The functions here copy one run at a time:

- :func:`export_run_dir` writes a run directory exactly as luft writes one;
- :func:`import_run_dir` loads one back, atomically (all or nothing);
- :func:`import_sqlite` reads runs from a luft SQLite database;
- :func:`export_sqlite` writes a run into an existing luft SQLite database.

An import is a restore, not an operation: the run's stored timestamps are kept. It streams the
events into staging keys under the run's own hash tag (``<prefix>:{<run>}:import:<token>:*``,
so Redis Cluster is fine), writes the state through ``save_checkpoint-11.lua`` on those keys,
and swaps them in with ``restore_run-22.lua`` (RENAME within the slot), which also publishes a
change notice of a new incarnation: a cache bound to the run reloads. Memory stays bounded by
the checkpoint plus one batch of events, whatever the length of the log. On any error the
staging keys are deleted and the run is as it was.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

from . import types as t
from ._sync.backend import RedisCheckpointBackend
from ._sync.fcall import call_function, index_add
from ._sync.retention import log_trimmed
from .delta import UnknownFormat, parse_delta
from .errors import (
    BackendError,
    LuftRedisError,
    RunExistsError,
    RunNotFoundError,
    ValidationError,
)
from .keys import (
    DEFAULT_PREFIX,
    SCHEMA_VERSION,
    RunKeys,
    check_prefix,
    run_keys,
    staging_keys,
)
from .retention_core import LOG_TRIMMED_NOTE
from .retry import DEFAULT_RETRY
from .scripts import library, translate_error
from .wire import (
    DEFAULT_MAX_PAYLOAD_SIZE,
    Encoder,
    check_type,
    check_uuid,
    decode_entry,
    entry_id,
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
    "dumps_compact",
    "dumps_pretty",
    "export_run_dir",
    "export_sqlite",
    "import_run_dir",
    "import_sqlite",
    "read_checkpoint_file",
    "read_event_file",
    "sqlite_run_ids",
]

logger = logging.getLogger(__name__)

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


def _check_trimmed(client: Any, prefix: str, run_id: uuid.UUID, allow: bool) -> bool:
    """Whether the run's log was trimmed; :class:`LogTrimmedError` when it was and not
    ``allow`` (a warning is logged when it is allowed)."""
    if not log_trimmed(client, prefix, run_id):
        return False
    if not allow:
        raise LogTrimmedError(run_id)
    logger.warning("run %s: %s; exporting what is left (allow_trimmed)", run_id,
                   LOG_TRIMMED_NOTE)  # fmt: skip
    return True


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


def _read_consistent(
    client: Any, prefix: str, run_id: uuid.UUID
) -> tuple[t.RunCheckpoint, str | None, RunKeys, str]:
    """The checkpoint, the id of the last event it reflects (None: empty log), the run's keys
    and its run_dir, read so that no change came between the checkpoint and that id."""
    keys = run_keys(prefix, run_id)
    with RedisCheckpointBackend(client, prefix=prefix, watch=False) as backend:
        for _ in range(20):
            with _translated(run_id):
                before = client.hmget(keys.run, ["version", "run_dir"])
                newest = client.xrevrange(keys.events, count=1)
            cp = backend.open_run(run_id)
            if cp is None:
                raise RunNotFoundError(run_id, prefix)
            if before[0] is not None and int(before[0]) == backend.version:
                last = entry_id(newest[0][0]) if newest else None
                run_dir = before[1].decode("utf-8") if before[1] is not None else ""
                return cp, last, keys, run_dir
    raise InteropError(f"run {run_id} kept changing while it was read; try again")


def _iter_redis_events(client: Any, keys: RunKeys, run_id: uuid.UUID,
                       last: str | None) -> Iterator[t.AgentEvent]:  # fmt: skip
    """The run's events up to entry ``last`` (inclusive), one XRANGE page at a time."""
    if last is None:
        return
    lower = "-"
    while True:
        with _translated(run_id):
            page = client.xrange(keys.events, min=lower, max=last, count=BATCH)
        for raw_id, fields in page:
            yield decode_entry(run_id, keys.events, entry_id(raw_id), fields)
        if len(page) < BATCH:
            return
        lower = "(" + entry_id(page[-1][0])


def export_run_dir(
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
    cp, last, keys, _ = _read_consistent(client, prefix, rid)
    trimmed = _check_trimmed(client, prefix, rid, allow_trimmed)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InteropError(f"cannot create {out}: {exc.strerror or exc}") from exc
    count = 0
    temps: list[Path] = []
    try:
        tmp_events = _create_temp(targets[0], temps)
        with tmp_events.open("w", encoding="utf-8", newline="\n") as handle:
            for count, event in enumerate(_iter_redis_events(client, keys, rid, last), 1):
                handle.write(dumps_compact(event.to_json()) + "\n")
                if progress is not None and count % BATCH == 0:
                    progress(count, None)
        # trimmed while it was read? the file may lack the oldest events
        trimmed = trimmed or _check_trimmed(client, prefix, rid, allow_trimmed)
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


def _import(
    client: Any,
    cp: t.RunCheckpoint,
    events: Iterable[tuple[str, t.AgentEvent]],
    *,
    prefix: str,
    run_dir: str,
    replace: bool,
    max_payload_size: int,
    progress: Progress | None,
    total: int | None,
    where: Callable[[str, LuftRedisError], LuftRedisError] | None = None,
) -> ImportResult:
    """Stage ``cp`` and ``events`` (``(position, event)``; ``where`` turns an error about one
    event into one that names its position; without it the error is raised as it is) under
    the run's hash tag, then swap them in."""
    check_prefix(prefix)
    rid = cp.run_id
    target = run_keys(prefix, rid)
    with _translated(rid):
        existed = bool(client.exists(target.run))
    if existed and not replace:
        raise RunExistsError(rid, f"under prefix {prefix!r}",
                             "pass replace=True / --replace to replace it")  # fmt: skip
    encoder = Encoder(max_payload_size)
    s = staging_keys(prefix, rid, uuid.uuid4().hex)
    incarnation, writer = uuid.uuid4().hex, uuid.uuid4().hex
    save_args = encoder.save(cp, rid)  # checked before anything is written
    try:
        with _translated(rid):
            client.hset(s.run, mapping={
                "schema": SCHEMA_VERSION, "run_id": str(rid), "task": cp.task,
                "run_dir": run_dir, "status": cp.status.value, "current_phase": "0",
                "total_tokens": "0", "phases": "0", "created_at": str(cp.created_at),
                "updated_at": str(cp.updated_at), "version": "0",
                "incarnation": incarnation,
            })  # fmt: skip
            client.expire(s.run, STAGING_TTL)
        count, started_phase = _stage_events(client, rid, s.events, encoder, events, progress,
                                             total, where)  # fmt: skip
        started = [(a, p) for a in dict.fromkeys(cp.started_agent_ids)
                   if (p := started_phase.get(a)) is not None]  # fmt: skip
        with _translated(rid):
            for i in range(0, len(started), BATCH):
                client.hset(s.started, mapping={str(a): f"0 {p}" for a, p in
                                                started[i : i + BATCH]})  # fmt: skip
            save = library().ops.save_checkpoint
            save_call = [writer, "1", *save_args, "", ""]  # (no fence, no retention)
            DEFAULT_RETRY.call(lambda: call_function(client, save, list(s), save_call))
            pipe = client.pipeline(transaction=False)
            for key in s:
                pipe.expire(key, STAGING_TTL)
            pipe.execute()
            restore = library().ops.restore_run
            args = [writer, "2", "1" if replace else "0", str(cp.updated_at), incarnation]
            reply = DEFAULT_RETRY.call(lambda: call_function(client, restore, [*target, *s], args))
    except BaseException:
        try:
            client.delete(*s)
        except Exception:
            logger.error("run %s: could not delete the staging keys %s*; they expire in %d s",
                         rid, s.run[: -len("run")], STAGING_TTL, exc_info=True)  # fmt: skip
        raise
    try:
        delta = parse_delta(bytes(reply))
    except (UnknownFormat, ValueError, TypeError) as exc:
        raise BackendError(f"unexpected reply from restore_run: {exc}") from exc
    index_add(client, DEFAULT_RETRY, prefix, rid, float(cp.updated_at))  # `luft-redis runs`
    logger.info("run %s: imported (%d events, incarnation %s)", rid, count, delta.inc_after)
    if progress is not None:
        progress(count, count)
    return ImportResult(rid, count, replaced=existed)


def _stage_events(
    client: Any,
    rid: uuid.UUID,
    key: str,
    encoder: Encoder,
    events: Iterable[tuple[str, t.AgentEvent]],
    progress: Progress | None,
    total: int | None,
    where: Callable[[str, LuftRedisError], LuftRedisError] | None,
) -> tuple[int, dict[uuid.UUID, int]]:
    """XADD the events to the staging stream in pipelined batches; returns their number and
    the phase of each agent's latest agent_started (kept as the normal write path keeps it)."""
    started_phase: dict[uuid.UUID, int] = {}
    count = 0
    pipe = client.pipeline(transaction=False)  # execute() empties it for the next batch

    def flush() -> None:
        pipe.expire(key, STAGING_TTL)
        with _translated(rid):
            pipe.execute()

    for count, (position, event) in enumerate(events, 1):
        try:
            args = encoder.event(event, "event", rid)
        except LuftRedisError as exc:
            raise (exc if where is None else where(position, exc)) from None
        entry = args[1 : 1 + int(args[0])]  # the stream entry's field-value pairs
        pipe.xadd(key, dict(zip(entry[::2], entry[1::2], strict=True)))
        if isinstance(event, t.AgentStarted):
            started_phase[event.agent_id] = event.phase_id
        if count % BATCH == 0:
            flush()
            if progress is not None:
                progress(count, total)
    if count % BATCH:
        flush()
    return count, started_phase


def import_run(
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
    return _import(client, cp, ((str(i), e) for i, e in enumerate(events)), prefix=prefix,
                   run_dir=run_dir, replace=replace, max_payload_size=max_payload_size,
                   progress=progress, total=total)  # fmt: skip


def import_run_dir(
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
    return _import(client, cp, events, prefix=prefix,
                   run_dir=str(base.resolve()) if run_dir is None else run_dir,
                   replace=replace, max_payload_size=max_payload_size, progress=progress,
                   total=_count_lines(events_path), where=where)  # fmt: skip


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


def import_sqlite(
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

            out.append(_import(client, cp, _iter_sqlite_events(conn, rid, where_path),
                             prefix=prefix, run_dir=run_dir, replace=replace,
                             max_payload_size=max_payload_size, progress=progress,
                               total=int(total), where=where))  # fmt: skip
    finally:
        conn.close()
    return out


def _event_ts(event: t.AgentEvent) -> str | None:
    ts = getattr(event, "ts", None)
    return t.format_timestamp(ts) if ts is not None else None


def export_sqlite(
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
        cp, last, keys, run_dir = _read_consistent(client, prefix, rid)
        trimmed = _check_trimmed(client, prefix, rid, allow_trimmed)
        conn.execute("BEGIN IMMEDIATE")
        try:
            count = _write_sqlite(conn, client, cp, last, keys, run_dir, replace, where_path,
                                  progress)  # fmt: skip
            # trimmed while it was read? the rows may lack the oldest events
            trimmed = trimmed or _check_trimmed(client, prefix, rid, allow_trimmed)
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


def _integrity(path: str, exc: sqlite3.IntegrityError) -> InteropError:
    text = str(exc)
    marker = "NOT NULL constraint failed: "
    if text.startswith(marker):
        table, _, column = text[len(marker) :].partition(".")
        return SqliteSchemaError(path, table, column,
                                 "required by the database, unknown to luft-redis")  # fmt: skip
    return InteropError(f"{path}: {text}")


def _write_sqlite(conn: sqlite3.Connection, client: Any, cp: t.RunCheckpoint, last: str | None,
                  keys: RunKeys, run_dir: str, replace: bool, path: str,
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
    for count, event in enumerate(_iter_redis_events(client, keys, cp.run_id, last), 1):
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


def _insert_events(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.executemany("INSERT INTO events (run_id, ts, type, payload) VALUES (?, ?, ?, ?)", rows)


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any],
            verb: str = "INSERT") -> None:  # fmt: skip
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    conn.execute(f"{verb} INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))
