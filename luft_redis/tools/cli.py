"""``luft-redis``: the command line tool for operators.

Subcommands::

    luft-redis doctor                       is this Redis safe for checkpoints?
    luft-redis runs [--status S] [--since 7d] [--limit N] [--rebuild-index]
                                            runs from the run index, newest update first
    luft-redis show   RUN_ID [--events N]   a run's checkpoint and its last events
    luft-redis events RUN_ID [--follow] [--since ID] [--type T ...] [--json]
                                            a run's event log; --follow tails it
    luft-redis watch  RUN_ID                a live view of one run until it ends
    luft-redis agents RUN_ID [--json]       a run's agent tasks: state, holder, lease
    luft-redis cancel RUN_ID                cancel a running run
    luft-redis delete RUN_ID [--yes]        delete a run and its event log (asks on a terminal)
    luft-redis gc --older-than 7d [--dry-run]  delete old finished runs (cli_retention)
    luft-redis export RUN_ID -o DIR / import DIR / import-sqlite / export-sqlite
                                            move runs in and out of luft (cli_interop)
    luft-redis demo   ...                   the demo (luft_redis.tools.demo)

Connection options go before or after the subcommand: ``--redis`` (default: env
``LUFT_REDIS_URL``, else ``redis://127.0.0.1:6379/0``), ``--prefix``, ``--cluster`` (a Redis
Cluster), ``--tls-ca-cert`` (a CA for ``rediss://``).

Exit codes: 0 success (``doctor``: the server is safe); 1 failure (``doctor``: something is
unsafe; a run that does not exist; corrupt data; ``cancel`` of a completed or failed run;
``delete`` not confirmed); 2 Redis unreachable, not Redis, or a usage error (a ``web`` port in
use); 3 Redis refused the client (password, ACL permission, TLS certificate); 130 interrupted.
A reader that stops reading (``| head``) ends any command quietly, exit 0 (:func:`main`).
``python -m luft_redis`` runs the same tool.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import io
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import redis
import redis.exceptions
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import types as t
from .._sync import index as index_io
from .._sync import pools as pools_io
from .._sync.backend import RedisCheckpointBackend
from ..errors import AccessError, LuftRedisError, RunNotFoundError
from ..keys import run_keys
from ..retention import LOG_TRIMMED_NOTE
from ..retry import exception_chain, is_access_error
from ..scripts import translate_error
from ..tasks import TaskState
from . import cli_history, cli_interop, cli_retention, live
from .cli_common import (
    DEFAULT_URL,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    URL_ENV,
    CommandFailed,
    add_connection,
    connect,
    open_backend,
    parse_run_id,
    redact_url,
    server_failure,
)
from .doctor import check_server
from .render import (
    STATUS_STYLE,
    decode_page,
    dumps,
    event_json,
    event_line,
    limits_table,
    one_line,
    pool_table,
    print_report,
    run_row_json,
    show_json,
    task_table,
    utc_time,
)

__all__ = ["DEFAULT_URL", "EXIT_FAILURE", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNREACHABLE", "main"]

logger = logging.getLogger(__name__)

_DEFAULT_EVENTS: Final = 10
_DEFAULT_LIMIT: Final = 50
_PIPE_WIDTH: Final = 240


# ---------------------------------------------------------------------------- plumbing


def _open_run(backend: RedisCheckpointBackend, args: argparse.Namespace) -> t.RunCheckpoint:
    """Bind ``backend`` to the run ``args.run_id``; :class:`CommandFailed` when there is none."""
    cp = backend.open_run(args.run_id)
    if cp is None:
        raise CommandFailed(str(RunNotFoundError(args.run_id, args.prefix)))
    return cp


def _whole(least: int = 0, most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=``: a whole number, 0 or more, at least ``least``, at most ``most``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError("must be 0 or more")
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}")
        return value

    return parse


# ---------------------------------------------------------------------------- doctor


def _cmd_doctor(args: argparse.Namespace) -> int:
    client = connect(args)
    try:
        print(f"checking {redact_url(args.redis)}", file=sys.stdout)
        report = check_server(client, prefix=args.prefix)
    finally:
        client.close()
    print_report(report, sys.stdout)
    return EXIT_OK if report.ok else EXIT_FAILURE


# ---------------------------------------------------------------------------- runs


def _console() -> Console:
    """A rich console on the current stdout (no syntax highlighting: data, not code)."""
    return Console(file=sys.stdout, highlight=False)


def _print(renderable: Any) -> None:
    """Print a rich table: styled on a terminal; to a pipe as whole lines (never cut to an
    assumed 80 columns) without trailing padding."""
    console = _console()
    if console.is_terminal:
        console.print(renderable)
        return
    wide = Console(file=io.StringIO(), highlight=False, width=_PIPE_WIDTH, color_system=None)
    with wide.capture() as capture:
        wide.print(renderable)
    for line in capture.get().splitlines():
        print(line.rstrip())


_DURATION: Final = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float | None = None) -> float:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w`` ago, or an RFC 3339 time, as unix seconds."""
    match = _DURATION.match(text.strip())
    if match:
        base = time.time() if now is None else now
        return base - int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration (7d, 12h, 30m, 45s, 2w) or an RFC 3339 time: {text!r}"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone: add Z or an offset such as +02:00"
        )
    return when.timestamp()


def _cmd_runs(args: argparse.Namespace) -> int:
    client = connect(args)
    try:
        if args.rebuild_index:
            indexed, removed = index_io.rebuild(client, args.prefix)
            print(f"run index of prefix {args.prefix!r} rebuilt: {indexed} run(s) indexed, "
                  f"{removed} stale entr{'y' if removed == 1 else 'ies'} removed")  # fmt: skip
            return EXIT_OK
        page = index_io.read_page(client, args.prefix, limit=args.limit, since=args.since,
                               statuses=args.status or ())  # fmt: skip
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise translate_error(exc) from exc
    finally:
        client.close()
    if args.json:
        for row in page.rows:
            print(dumps(run_row_json(row)))
    else:
        table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("run id", no_wrap=True, min_width=36)
        table.add_column("status", no_wrap=True)
        table.add_column("tokens", justify="right", no_wrap=True)
        table.add_column("agents", justify="right", no_wrap=True)
        table.add_column("updated (UTC)", no_wrap=True)
        table.add_column("task", overflow="ellipsis", no_wrap=True, ratio=1)
        for row in page.rows:
            table.add_row(
                str(row.run_id), Text(row.status, style=STATUS_STYLE.get(row.status, "")),
                str(row.total_tokens), str(row.agents), utc_time(row.updated_at),
                Text(f"({row.forked_from}) " * bool(row.parent) + one_line(row.task)),
            )  # fmt: skip
        _print(table)
        cut = len(page.rows) == args.limit and page.indexed > len(page.rows)
        more = " (--limit shows more)" if cut else ""
        print(f"{len(page.rows)} run(s) shown of {page.indexed} indexed under prefix "
              f"{args.prefix!r}{more}", file=sys.stderr)  # fmt: skip
    if page.gone:
        print(f"{page.gone} index entr{'y' if page.gone == 1 else 'ies'} without a run (expired "
              "or deleted) skipped and removed from the index", file=sys.stderr)  # fmt: skip
    if page.indexed == 0:
        print("the run index is empty; runs stored before it existed (by a luft-redis older "
              "than the run index) are listed after `luft-redis runs --rebuild-index`",
              file=sys.stderr)  # fmt: skip
    return EXIT_OK


# ---------------------------------------------------------------------------- show


def _last_events(
    backend: RedisCheckpointBackend, run_id: uuid.UUID, count: int
) -> list[tuple[str, t.AgentEvent]]:
    """The last ``count`` events of the run as (entry id, event), oldest first."""
    if count == 0:
        return []
    key = run_keys(backend.prefix, run_id).events
    try:
        page = backend.client.xrevrange(key, max="+", min="-", count=count)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise translate_error(exc, run_id=run_id) from exc
    return decode_page(run_id, key, page)


def _cmd_show(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with open_backend(args) as backend:
        cp = _open_run(backend, args)
        keys = run_keys(args.prefix, run_id)
        try:
            count: int | None = backend.client.xlen(keys.events)
            raw_parent = backend.client.hget(keys.run, "parent")
        except redis.exceptions.RedisError:
            count, raw_parent = None, None
        parent = raw_parent.decode("utf-8", "replace") if raw_parent else None
        if args.at is not None:  # a past state: its summary, no events
            cp = backend.checkpoint_at(run_id, at=args.at)
            count = None
        summary = show_json(cp, count, backend.log_trimmed, parent=parent)
        if args.at is not None:
            summary["at"] = str(args.at)
        events = _last_events(backend, run_id, 0 if args.at is not None else args.events)
    if args.json:
        print(dumps(summary))
    else:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in summary.items():
            multiline = isinstance(value, str) and not value.isprintable()
            shown = dumps(value) if isinstance(value, dict) or multiline else str(value)
            style = STATUS_STYLE.get(shown, "") if name == "status" else ""
            grid.add_row(name + ":", Text(shown, style=style))
        _print(grid)
        if events:
            print(f"--- last {len(events)} event(s), oldest first")
    for eid, event in events:
        print(dumps(event_json(eid, event)))
    return EXIT_OK


# ---------------------------------------------------------------------------- events, watch


_ENTRY_ID: Final = re.compile(r"^\d+(-\d+)?$")


def _entry_id(text: str) -> str:
    if not _ENTRY_ID.match(text):
        raise argparse.ArgumentTypeError(f"not a stream entry id (<ms>-<seq>): {text!r}")
    return text


def _event_type(text: str) -> str:
    if text not in t.EVENT_TYPES:
        known = ", ".join(sorted(t.EVENT_TYPES))
        raise argparse.ArgumentTypeError(f"unknown event type {text!r}; one of: {known}")
    return text


def _cmd_events(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with open_backend(args) as backend:
        _open_run(backend, args)
        if backend.log_trimmed:  # nothing may pretend the log is whole (stderr: not data)
            print(f"note: run {run_id}: {LOG_TRIMMED_NOTE}", file=sys.stderr, flush=True)
        try:
            for entry in live.follow_events(backend, args.since, args.follow, args.type or ()):
                if args.json:
                    line = json.dumps(entry.event.to_json(), ensure_ascii=False,
                                      separators=(",", ":"))  # fmt: skip
                else:
                    line = event_line(entry.id, entry.event)
                print(line, flush=args.follow)
        except KeyboardInterrupt:  # the way out of --follow: not an error
            pass
    return EXIT_OK


def _cmd_watch(args: argparse.Namespace) -> int:
    with open_backend(args, watch=True) as backend:
        _open_run(backend, args)
        try:
            final = live.watch_run(backend, _console())
        except KeyboardInterrupt:
            return EXIT_OK
        if final is None:
            raise CommandFailed(f"run {args.run_id} was deleted")
    return EXIT_OK


# ---------------------------------------------------------------------------- agents


def _server_time(backend: RedisCheckpointBackend) -> float:
    """The Redis server's clock (leases run on it), else ours."""
    try:
        seconds, micros = backend.client.time()
        return float(seconds) + float(micros) / 1e6
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, TypeError,
            ValueError):  # fmt: skip
        return time.time()


def _cmd_agents(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with open_backend(args) as backend:
        _open_run(backend, args)
        tasks = backend.agent_tasks()
        now = _server_time(backend)
    if args.json:  # JSON lines, as every --json: one task per line
        for task in tasks:
            print(dumps(task.to_json()))
        return EXIT_OK
    if tasks:
        _print(task_table(tasks, now))
    counts = {state: sum(1 for task in tasks if task.state is state) for state in TaskState}
    lapsed = sum(1 for task in tasks if task.lapsed)
    print(f"{len(tasks)} agent task(s) of run {run_id}: "
          + ", ".join(f"{counts[state]} {state.value}" for state in TaskState)
          + (f" ({lapsed} leased lapsed: the next claim takes them over)" if lapsed else ""),
          file=sys.stderr)  # fmt: skip
    return EXIT_OK


# ---------------------------------------------------------------------------- pools


def _redis_call(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise translate_error(exc) from exc


def _cmd_pools(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        client, prefix = backend.client, args.prefix

        def views_of() -> list[Any]:
            return [pools_io.read_pool(client, prefix, name)
                    for name in pools_io.list_pools(client, prefix)]  # fmt: skip

        views = _redis_call(views_of)
        limits = [] if args.json else _redis_call(
            lambda: pools_io.list_rate_limits(client, prefix))
    if args.json:
        for view in views:
            print(dumps(view.to_json()))
        return EXIT_OK
    if views:
        table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
        for name in ("pool", "runs", "ready runs", "sleeping runs", "ready tasks",
                     "leased tasks", "workers", "leases / max"):  # fmt: skip
            table.add_column(name, justify="left" if name == "pool" else "right", no_wrap=True)
        for view in views:
            row = view.to_json()
            cap = "-" if view.max_leases is None else f"{view.leases} / {view.max_leases}"
            table.add_row(view.name, *(str(row[k]) for k in ("runs", "ready_runs",
                          "sleeping_runs", "ready_tasks", "leased_tasks", "workers")),
                          cap)  # fmt: skip
        _print(table)
    if limits:  # (a limiter is shared by every pool: luft-redis limits)
        _print(limits_table(limits))
    print(f"{len(views)} pool(s) under prefix {args.prefix!r}", file=sys.stderr)
    return EXIT_OK


def _cmd_pool(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        view = _redis_call(lambda: pools_io.read_pool(backend.client, args.prefix, args.name,
                                                      limit=args.limit))  # fmt: skip
    if args.json:
        for run in view.runs:
            print(dumps(run.to_json()))
        return EXIT_OK
    if view.runs:
        _print(pool_table(view.runs))
    over = sum(run.over_budget for run in view.runs)
    print(f"pool {view.name!r}: {len(view.runs)} run(s), {view.ready_runs} ready, "
          f"{view.sleeping_runs} sleeping until a lease lapses, "
          f"{sum(r.ready for r in view.runs)} task(s) ready, "
          f"{sum(r.leased for r in view.runs)} leased by {view.workers} worker(s)"
          + ("" if view.max_leases is None else
             f", {view.leases} of its max_leases {view.max_leases} in use")
          + (f", {over} over their token budget" if over else ""), file=sys.stderr)  # fmt: skip
    return EXIT_OK


def _cmd_limits(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        limits = _redis_call(lambda: pools_io.list_rate_limits(backend.client, args.prefix))
    if args.json:
        for limit in limits:
            print(dumps(limit.to_json()))
        return EXIT_OK
    if limits:
        _print(limits_table(limits))
    waits = sum(limit.waits for limit in limits)
    print(f"{len(limits)} rate limiter(s) under prefix {args.prefix!r}, {waits} claim(s) "
          "made to wait so far", file=sys.stderr)  # fmt: skip
    return EXIT_OK


# ---------------------------------------------------------------------------- cancel


def _cmd_cancel(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with open_backend(args) as backend:
        cp = _open_run(backend, args)
        backend.cancel()
        after = backend.get_checkpoint()
        assert after is not None
        status = after.status.value
        if after.status is not t.CheckpointStatus.CANCELLED:
            raise CommandFailed(
                f"run {run_id} is {status}: only a running run can be cancelled; nothing changed"
            )
        already = " (it already was)" if cp.status is after.status else ""
        print(f"run {run_id}: {status}{already}")
    return EXIT_OK


# ---------------------------------------------------------------------------- delete


def _confirm(question: str) -> bool:
    """Ask on the terminal; True for y/yes."""
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _cmd_delete(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with open_backend(args) as backend:
        if not args.yes and sys.stdin is not None and sys.stdin.isatty():
            keys = run_keys(args.prefix, run_id)
            try:
                status, task = backend.client.hmget(keys.run, ["status", "task"])
                count = backend.client.xlen(keys.events)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
                raise translate_error(exc, run_id=run_id) from exc
            if status is None:
                raise CommandFailed(str(RunNotFoundError(run_id, args.prefix)))
            what = (f"{status.decode('utf-8', 'replace')}, {count} event(s), task "
                    f"{one_line(task.decode('utf-8', 'replace') if task else '', 40)!r}")
            if not _confirm(f"Delete run {run_id} ({what}) and its event log? [y/N] "):
                raise CommandFailed(f"run {run_id}: not deleted")
        if not backend.delete_run(run_id):
            raise CommandFailed(str(RunNotFoundError(run_id, args.prefix)))
        print(f"run {run_id}: deleted, with its event log")
    return EXIT_OK


# ---------------------------------------------------------------------------- web


_WEB_TOKEN_ENV: Final = "LUFT_REDIS_WEB_TOKEN"


def _cmd_web(args: argparse.Namespace) -> int:
    """``luft-redis web``: imports the web view only now (it needs the ``web`` extra)."""
    try:
        web = importlib.import_module("luft_redis.tools.web.server")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("starlette", "uvicorn", "sse_starlette"):
            raise CommandFailed(
                f"the web view needs the 'web' extra (missing module {exc.name}): from a "
                "checkout of luft-redis (it is not on PyPI yet), pip install '.[web]'",
                EXIT_UNREACHABLE,
            ) from exc  # fmt: skip
        raise
    token = args.token if args.token is not None else os.environ.get(_WEB_TOKEN_ENV) or None
    serve: Callable[..., int] = web.serve
    return serve(args, token=token)


# ---------------------------------------------------------------------------- demo


def _run_demo(argv: list[str]) -> int:
    """Forward ``argv`` to ``luft_redis.tools.demo.main`` (imported only now)."""
    try:
        demo = importlib.import_module("luft_redis.tools.demo")
    except ModuleNotFoundError as exc:
        detail = "" if exc.name == "luft_redis.tools.demo" else f": missing module {exc.name}"
        print(f"demo not available{detail}", file=sys.stderr)
        return EXIT_UNREACHABLE
    demo_main: Callable[[list[str] | None], int | None] = demo.main
    result = demo_main(argv)
    return EXIT_OK if result is None else int(result)


# ---------------------------------------------------------------------------- parser


_GLOBAL_VALUE_OPTIONS: Final = ("--redis", "--prefix", "--tls-ca-cert")
_GLOBAL_FLAGS: Final = ("-v", "--verbose", "--cluster")


def _add_command(
    sub: Any, name: str, summary: str, description: str, handler: Callable[..., int],
    *, run_id: bool = False,
) -> argparse.ArgumentParser:  # fmt: skip
    """A subcommand with its one-line help, its --help description and the connection
    options."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    if run_id:
        parser.add_argument("run_id", metavar="RUN_ID", type=parse_run_id,
                            help="the run's id (UUID)")  # fmt: skip
    add_connection(parser)
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``luft-redis`` (``demo`` arguments are not parsed here)."""
    parser = argparse.ArgumentParser(
        prog="luft-redis",
        description="Inspect and operate luft-redis checkpoints stored in Redis. Connection "
        "options (--redis, --prefix, --cluster, --tls-ca-cert) go before or after the command.",
        epilog=f"Environment: {URL_ENV} is the Redis URL when --redis is not given. Exit codes: "
        "0 success; 1 failure (a run that does not exist, corrupt data, an unsafe server for "
        "doctor); 2 Redis unreachable, not Redis, or a usage error (web: the port in use); 3 "
        "Redis refused the client (password, ACL, TLS certificate); 130 interrupted. A reader "
        "that stops reading (| head) ends any command quietly, exit 0.",
    )
    add_connection(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _add_command(
        sub, "doctor", "check that the server keeps checkpoints safe",
        "Check eviction policy, persistence, version and cluster mode of the server.\n"
        "Exit 0 when safe, 1 when something is unsafe, 2 when unreachable.", _cmd_doctor,
    )  # fmt: skip

    runs = _add_command(
        sub, "runs", "list the runs, most recently updated first",
        "List the runs under the prefix from the run index (a sorted set per prefix), most\n"
        "recently updated first: status, tokens, agents (started or with a result), last\n"
        "update and task.\n"
        "--since and the order use the run's last create, finish or resume (the index\n"
        "score; events in between do not move it); the updated column is the real last\n"
        "update. Entries whose run is gone (expired, deleted) are skipped and removed.\n"
        "--rebuild-index rebuilds the index from a SCAN of the keyspace (after an upgrade\n"
        "from luft-redis 0.1).", _cmd_runs,
    )  # fmt: skip
    runs.add_argument("--status", action="append", metavar="STATUS",
                      choices=[s.value for s in t.CheckpointStatus],
                      help="only runs with this status (running, completed, failed, "
                           "cancelled); repeat for several")  # fmt: skip
    runs.add_argument("--since", type=parse_since, metavar="WHEN", default=None,
                      help="only runs created, finished or resumed since: a duration ago "
                           "(7d, 12h, 30m) or an RFC 3339 time (2026-01-31T12:00:00Z)")  # fmt: skip
    runs.add_argument("--limit", type=_whole(1), default=_DEFAULT_LIMIT, metavar="N",
                      help=f"show at most N runs (default {_DEFAULT_LIMIT})")  # fmt: skip
    runs.add_argument("--json", action="store_true", help="JSON lines: one run per line")
    runs.add_argument("--rebuild-index", action="store_true",
                      help="rebuild the run index from a SCAN, then exit")  # fmt: skip

    show = _add_command(
        sub, "show", "a run's checkpoint summary and its last events",
        "Print a run's checkpoint summary (status, phase, tokens, agents, findings) and its\n"
        "last events as luft JSON lines.", _cmd_show, run_id=True,
    )  # fmt: skip
    show.add_argument(
        "--events",
        metavar="N",
        type=_whole(),
        default=_DEFAULT_EVENTS,
        help=f"how many of the last events to print as JSON lines (default {_DEFAULT_EVENTS})",
    )
    show.add_argument("--json", action="store_true",
                      help="JSON lines: the summary, then the last events")  # fmt: skip
    show.add_argument("--at", type=cli_history.parse_point, default=None, metavar="POINT",
                      help="the run's state at a past point (no events): a version (57), an "
                           "event id (1796183810669-0) or a time (2026-12-05T21:00:00Z); see "
                           "`luft-redis history`")  # fmt: skip

    events = _add_command(
        sub, "events", "a run's event log, one line per event; --follow tails it",
        "Print a run's event log, one readable line per event (time, entry id, type, main\n"
        "fields), or luft's JSON lines with --json. --follow waits for new events (XREAD\n"
        "BLOCK) until the run's run_done or Ctrl-C.", _cmd_events, run_id=True,
    )  # fmt: skip
    events.add_argument("--follow", "-f", action="store_true",
                        help="keep printing new events until run_done or Ctrl-C")  # fmt: skip
    events.add_argument("--since", type=_entry_id, metavar="ID", default=None,
                        help="only events after this stream entry id (<ms>-<seq>)")  # fmt: skip
    events.add_argument("--type", action="append", type=_event_type, metavar="T",
                        help="only events of this type (agent_done, log, ...); repeat for "
                             "several")  # fmt: skip
    events.add_argument("--json", action="store_true",
                        help="luft's JSON lines (the format of luft's events.jsonl)")  # fmt: skip

    _add_command(
        sub, "watch", "a live view of one run until it ends",
        "Show one run live: status, phase, tokens, agents done and failed, the latest\n"
        "findings, a progress bar for the current phase, and the agent tasks: who holds\n"
        "what (holder, token, time left) and which leases lapsed. It is redrawn from the\n"
        "run's change notices (no polling; the tasks are read again only when the run\n"
        "changed or a lease is due to lapse) and ends when the run reaches a final status,\n"
        "or on Ctrl-C.", _cmd_watch, run_id=True,
    )  # fmt: skip

    agents = _add_command(
        sub, "agents", "a run's agent tasks: state, holder, attempt, lease",
        "List a run's agent tasks (submitted with submit_agents, claimed by workers with\n"
        "claim_agent) in submit order: state (ready, leased, done, dead; a leased task whose\n"
        "lease expired is marked lapsed: the next claim takes it over), holder, attempt,\n"
        "failures, fencing token, the lease's time left (server clock), phase and the payload\n"
        "cut short. --json prints JSON lines, one task per line.",
        _cmd_agents, run_id=True,
    )  # fmt: skip
    agents.add_argument("--json", action="store_true",
                        help="JSON lines, one task per line (state, holder, token, expires_at "
                             "in unix seconds, payload in full)")  # fmt: skip

    pools = _add_command(
        sub, "pools", "the pools of agent runs and what they hold",
        "List the pools under the prefix (docs/pools.md): runs in each pool's index, runs\n"
        "ready (may have claimable work) and sleeping (only leases, until the first lapses),\n"
        "tasks ready and leased now, leases counted against the pool's max_leases. --json\n"
        "prints JSON lines, one pool per line.",
        _cmd_pools,
    )  # fmt: skip
    pools.add_argument("--json", action="store_true", help="JSON lines, one pool per line")
    pool = _add_command(
        sub, "pool", "one pool's runs: state, weight, priority, tasks, budget",
        "List the runs of pool NAME: status, state in the pool's index (ready, sleeping,\n"
        "idle, gone: left at the next claim), weight, priority, tasks ready and leased now,\n"
        "tokens against max_tokens (over budget: no agent handed out) and max_leases.\n"
        "--json prints JSON lines, one run per line.",
        _cmd_pool,
    )  # fmt: skip
    pool.add_argument("name", metavar="NAME", help="the pool's name")
    pool.add_argument("--limit", type=int, default=1000, help="at most this many runs (1000)")
    pool.add_argument("--json", action="store_true", help="JSON lines, one run per line")
    limits = _add_command(
        sub, "limits", "the rate limiters: rates, budget left now, waits",
        "List the rate limiters under the prefix (docs/pools.md, \"Rate limits\"): requests\n"
        "and tokens per minute, burst, what each would admit now, and its counters (requests\n"
        "admitted, claims made to wait, tokens charged). --json prints JSON lines.",
        _cmd_limits,
    )  # fmt: skip
    limits.add_argument("--json", action="store_true", help="JSON lines, one limiter per line")

    _add_command(
        sub, "cancel", "cancel a running run",
        "Cancel a running run (status cancelled). A run that is already cancelled is left as\n"
        "it is (exit 0); a completed or failed run cannot be cancelled (exit 1).",
        _cmd_cancel, run_id=True,
    )  # fmt: skip

    delete = _add_command(
        sub, "delete", "delete a run and its event log",
        "Delete every key of a run, its event log included, in one atomic step. On a terminal\n"
        "it asks first; --yes skips the question. From a script (stdin not a terminal) it\n"
        "does not ask.", _cmd_delete, run_id=True,
    )  # fmt: skip
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    web = _add_command(
        sub, "web", "a live web view of the runs (needs the 'web' extra)",
        "Serve a live web view of the runs under the prefix: the runs page (from the run\n"
        "index) and one page per run, updated by server-sent events driven by the run's\n"
        "change notices. Binds 127.0.0.1 by default; any other address needs --token (or env\n"
        f"{_WEB_TOKEN_ENV}). Read-only unless --allow-cancel or --allow-fork. Needs the 'web'\n"
        "extra: from a checkout of luft-redis (it is not on PyPI yet), pip install '.[web]'.",
        _cmd_web,
    )  # fmt: skip
    web.add_argument("--host", default="127.0.0.1",
                     help="address to bind (default 127.0.0.1; others need --token)")
    web.add_argument("--port", type=_whole(most=65535), default=8470,
                     help="port to bind (default 8470)")  # fmt: skip
    web.add_argument("--token", default=None,
                     help=f"the access token (default: env {_WEB_TOKEN_ENV}); required to bind "
                          "an address other than loopback")  # fmt: skip
    web.add_argument("--allow-cancel", action="store_true",
                     help="show a Cancel button on running runs (POST, CSRF token)")
    web.add_argument("--allow-fork", action="store_true",
                     help="show a 'fork from here' button on each version of a run's history "
                          "(POST, CSRF token)")  # fmt: skip
    web.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                     help="another name the browser may use for this server (Host header "
                          "check); repeat for several")  # fmt: skip

    # -- more subcommands register here: add_commands(sub) from their own modules
    cli_retention.add_commands(sub)  # gc
    cli_history.add_commands(sub)  # history, fork
    cli_interop.add_commands(sub)  # export, import, import-sqlite, export-sqlite

    sub.add_parser(
        "demo", help="run the demo (luft-redis demo --help for its options)", add_help=False,
        description="A simulated luft workflow run by worker processes on one Redis run.",
    )  # fmt: skip
    return parser


def _split_demo(argv: Sequence[str]) -> list[str] | None:
    """The demo's arguments when the command is ``demo`` (after global options), else None.

    A global ``--redis URL`` before ``demo`` is passed on to it."""
    forwarded: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg in _GLOBAL_FLAGS:
            index += 1
            continue
        name, eq, value = arg.partition("=")
        if name in _GLOBAL_VALUE_OPTIONS:
            if not eq:
                index += 1
                value = argv[index] if index < len(argv) else ""
            if name == "--redis":
                forwarded = ["--redis", value]
            index += 1
            continue
        return forwarded + list(argv[index + 1 :]) if arg == "demo" else None
    return None


def _auth_failure(exc: BaseException) -> BaseException | None:
    """The authentication or permission error in ``exc``'s chain, if any."""
    for current in exception_chain(exc):
        if isinstance(current, redis.exceptions.AuthenticationError) or (
            isinstance(current, redis.exceptions.ResponseError)
            and str(current).startswith(("NOAUTH", "WRONGPASS", "NOPERM"))
        ) or type(current).__name__ in ("AuthenticationError", "PermissionDeniedError"):
            return current
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``luft-redis`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    The one place for a closed stdout (``luft-redis runs | head -1``), for every command and
    the demo: the reader has what it wanted, so the rest of the output is dropped quietly and
    the command ends with exit 0 (or the code it had already returned)."""
    code = EXIT_OK
    try:
        code = _run(argv)
        sys.stdout.flush()  # (a closed pipe shows here, not at the interpreter's exit)
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # nor at the interpreter's exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _run(argv: list[str] | None) -> int:
    """:func:`main` but for a closed stdout: parse, run the command, report its failure."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    demo_args = _split_demo(args_list)
    if demo_args is not None:
        return _run_demo(demo_args)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_UNREACHABLE
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        try:
            return handler(args)
        except BrokenPipeError:  # `| head`: main's
            raise
        except Exception as exc:  # a refused password, ACL or certificate first
            refused = _refusal(exc, args)
            if refused is None:
                raise
        message, code = f"Redis refused this client: {refused}", EXIT_REFUSED
    except CommandFailed as exc:
        message, code = str(exc), exc.code
    except KeyboardInterrupt:
        message, code = "interrupted", 130
    except Exception as exc:
        message, code = _failure(args, exc)
    print(f"luft-redis {args.command}: {message}", file=sys.stderr)
    return code


def _failure(args: argparse.Namespace, exc: Exception) -> tuple[str, int]:
    """The message and exit code of a failure of a subcommand (re-raises what is not ours)."""
    auth = _auth_failure(exc)
    if auth is not None:
        return (f"Redis at {redact_url(args.redis)} refused the credentials or the permission "
                f"(check the user and password in the URL, and the ACL): {auth}",
                EXIT_FAILURE)  # fmt: skip
    failure = server_failure(args.redis, exc)
    if failure is not None:
        return str(failure), failure.code
    if isinstance(exc, LuftRedisError):
        return str(exc), EXIT_FAILURE
    if isinstance(exc, redis.exceptions.RedisError):
        return f"Redis error: {exc}", EXIT_FAILURE
    raise exc


def _refusal(exc: BaseException, args: argparse.Namespace) -> AccessError | None:
    """The access error (password, ACL, TLS) behind ``exc``, if that is what it is."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, AccessError) and not is_access_error(cause):
        cause = cause.__cause__
    if cause is None or isinstance(cause, AccessError):
        return cause
    found = translate_error(cause, prefix=getattr(args, "prefix", None))
    return found if isinstance(found, AccessError) else None


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
