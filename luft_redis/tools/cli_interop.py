"""``luft-redis`` subcommands that move runs between Redis and luft's own stores.

::

    luft-redis export RUN_ID -o DIR [--force] [--allow-trimmed]   a run directory from a run
    luft-redis import DIR [--replace] [--run-dir P]    a luft run directory into Redis
    luft-redis import-sqlite PATH [--run RUN_ID] [--replace]
    luft-redis export-sqlite PATH RUN_ID [--replace] [--allow-trimmed]

A run whose event log was trimmed (``max_events``) is not exported unless ``--allow-trimmed``.

Registered by :func:`add_commands` from ``luft_redis.tools.cli.build_parser``. Errors are
:mod:`luft_redis.errors` (exit 1) or Redis connection errors (exit 2), reported by
``cli.main``. The work is done by :mod:`luft_redis.interop`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO, TypeVar

from .. import interop
from ..connect import make_client
from ..retention import LOG_TRIMMED_NOTE
from .cli_common import add_connection, client_kwargs, parse_run_id

__all__ = ["add_commands", "progress_reporter"]

_T = TypeVar("_T")


def _add_connection(parser: argparse.ArgumentParser,
                    handler: Callable[[argparse.Namespace], int]) -> None:  # fmt: skip
    """The CLI's connection options (given before or after the command), ``--quiet`` and the
    command's ``handler``."""
    add_connection(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.set_defaults(handler=handler)


# ------------------------------------------------------------------------------- progress


@contextlib.contextmanager
def progress_reporter(
    label: str, *, enabled: bool = True, stream: TextIO | None = None
) -> Iterator[interop.Progress | None]:
    """A ``progress(done, total)`` callback showing ``label`` on stderr while it runs: a rich
    progress bar when ``rich`` is installed and stderr is a terminal, else a plain line
    rewritten in place (a terminal) or nothing (a pipe: the command's summary line says it
    all). The one place where the display is chosen."""
    out = sys.stderr if stream is None else stream
    if not enabled or not out.isatty():
        yield None
        return
    try:
        rich_progress: Any = importlib.import_module("rich.progress")
    except ImportError:
        rich_progress = None
    if rich_progress is not None:
        console = importlib.import_module("rich.console").Console(file=out)
        with rich_progress.Progress(console=console, transient=True) as bar:
            task = bar.add_task(label, total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    last = 0.0

    def update_plain(done: int, total: int | None) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < 0.1 and done != total:
            return
        last = now
        if total:
            width = 30
            filled = min(width, done * width // total)
            text = f"{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} events"
        else:
            text = f"{label}: {done} events"
        out.write("\r" + text[: _columns() - 1] + "\x1b[K")
        out.flush()

    try:
        yield update_plain
    finally:
        out.write("\r\x1b[K")
        out.flush()


def _columns() -> int:
    try:
        return max(20, os.get_terminal_size(sys.stderr.fileno()).columns)
    except (OSError, ValueError):
        return 80


# ------------------------------------------------------------------------------- commands


_ALLOW_TRIMMED_HELP = (
    "export a run whose event log was trimmed (max_events) with the events that are left; "
    "without it such a run is refused"
)


def _transfer(args: argparse.Namespace, label: str,
              work: Callable[[Any, interop.Progress | None], _T]) -> _T:  # fmt: skip
    """``work(client, progress)`` on a client of ``args`` (closed after), with the progress
    display."""
    client = make_client(args.redis, cluster=args.cluster, **client_kwargs(args))
    with contextlib.closing(client), progress_reporter(label, enabled=not args.quiet) as bar:
        return work(client, bar)


def _exported(result: interop.ExportResult) -> int:
    if result.log_trimmed:
        print(f"warning: run {result.run_id}: {LOG_TRIMMED_NOTE}; the export holds only the "
              "events that are left (--allow-trimmed)", file=sys.stderr)  # fmt: skip
    print(f"run {result.run_id}: exported to {result.target} ({result.events} events)")
    return 0


def _imported(results: list[interop.ImportResult], source: str) -> int:
    for result in results:
        how = "replaced" if result.replaced else "imported"
        print(f"run {result.run_id}: {how} from {source} ({result.events} events)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    return _exported(_transfer(args, "export", lambda client, bar: interop.export_run_dir(
        client, args.run_id, args.output, prefix=args.prefix, overwrite=args.force,
        progress=bar, allow_trimmed=args.allow_trimmed,
    )))  # fmt: skip


def _cmd_import(args: argparse.Namespace) -> int:
    result = _transfer(args, "import", lambda client, bar: interop.import_run_dir(
        client, args.directory, prefix=args.prefix, replace=args.replace,
        run_dir=args.run_dir, progress=bar,
    ))  # fmt: skip
    return _imported([result], args.directory)


def _cmd_import_sqlite(args: argparse.Namespace) -> int:
    results = _transfer(args, "import", lambda client, bar: interop.import_sqlite(
        client, args.path, run_id=args.run, prefix=args.prefix, replace=args.replace,
        progress=bar,
    ))  # fmt: skip
    if not results:
        print(f"no runs in {args.path}")
    return _imported(results, args.path)


def _cmd_export_sqlite(args: argparse.Namespace) -> int:
    return _exported(_transfer(args, "export", lambda client, bar: interop.export_sqlite(
        client, args.path, args.run_id, prefix=args.prefix, replace=args.replace,
        progress=bar, allow_trimmed=args.allow_trimmed,
    )))  # fmt: skip


def add_commands(sub: Any) -> None:
    """Add ``export``, ``import``, ``import-sqlite`` and ``export-sqlite`` to ``sub`` (the
    subparsers action of ``luft-redis``)."""
    export = sub.add_parser(
        "export",
        help="write a run as a luft run directory",
        description="Write checkpoint.json and events.jsonl as luft does.",
    )
    export.add_argument("run_id", metavar="RUN_ID", type=parse_run_id)
    export.add_argument("-o", "--output", metavar="DIR", required=True, help="the run directory")
    export.add_argument("--force", action="store_true", help="replace files already in DIR")
    export.add_argument("--allow-trimmed", action="store_true", help=_ALLOW_TRIMMED_HELP)
    _add_connection(export, _cmd_export)

    imp = sub.add_parser(
        "import",
        help="load a luft run directory into Redis, atomically",
        description="Load checkpoint.json and events.jsonl as one run; its "
        "stored timestamps are kept.",
    )
    imp.add_argument("directory", metavar="DIR")
    imp.add_argument("--replace", action="store_true", help="replace the run if it exists")
    imp.add_argument("--run-dir", help="run_dir to store (default: DIR's absolute path)")
    _add_connection(imp, _cmd_import)

    isql = sub.add_parser(
        "import-sqlite",
        help="load runs from a luft SQLite database",
        description="Each run is loaded atomically.",
    )
    isql.add_argument("path", metavar="PATH")
    isql.add_argument(
        "--run",
        metavar="RUN_ID",
        type=parse_run_id,
        help="only this run (default: every run with a checkpoint)",
    )
    isql.add_argument("--replace", action="store_true", help="replace runs that exist")
    _add_connection(isql, _cmd_import_sqlite)

    esql = sub.add_parser(
        "export-sqlite",
        help="write a run into an existing luft SQLite database",
        description="The database must have luft's schema.",
    )
    esql.add_argument("path", metavar="PATH")
    esql.add_argument("run_id", metavar="RUN_ID", type=parse_run_id)
    esql.add_argument("--replace", action="store_true", help="replace the run if it is there")
    esql.add_argument("--allow-trimmed", action="store_true", help=_ALLOW_TRIMMED_HELP)
    _add_connection(esql, _cmd_export_sqlite)
