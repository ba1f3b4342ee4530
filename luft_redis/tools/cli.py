"""``luft-redis``: the command line tool for operators.

Subcommands::

    luft-redis doctor [--redis URL]                  is this Redis safe for checkpoints?
    luft-redis runs   [--redis URL] [--prefix P]     every stored run, one line each
    luft-redis show   RUN_ID [--events N] ...        a run's checkpoint and its last events
    luft-redis cancel RUN_ID ...                     cancel a running run
    luft-redis delete RUN_ID ...                     delete a run and its event log
    luft-redis gc --older-than 7d [--dry-run] ...    delete old finished runs (cli_retention)
    luft-redis demo   ...                            the demo (luft_redis.tools.demo), if installed

``--redis`` defaults to env ``LUFT_REDIS_URL``, else ``redis://127.0.0.1:6379/0``;
``--cluster`` talks to a Redis Cluster, ``--tls-ca-cert`` trusts a CA for ``rediss://``.

Exit codes: 0 success (``doctor``: the server is safe), 1 failure (``doctor``: something is
unsafe; a run that does not exist; corrupt data), 2 Redis unreachable or a usage error.
``python -m luft_redis`` runs the same tool.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TextIO
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import codec
from .. import types as t
from ..backend import RedisCheckpointBackend
from ..errors import AccessError, ConnectionError, CorruptDataError, LuftRedisError
from ..keys import DEFAULT_PREFIX, run_keys
from ..retry import NO_RETRY, is_access_error
from ..scripts import translate_error
from .doctor import ServerReport, check_server

__all__ = ["DEFAULT_URL", "EXIT_FAILURE", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNREACHABLE", "main"]

logger = logging.getLogger(__name__)

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
"""The Redis URL used when neither ``--redis`` nor env ``LUFT_REDIS_URL`` is given."""

URL_ENV: Final = "LUFT_REDIS_URL"

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_UNREACHABLE: Final = 2
EXIT_REFUSED: Final = 3
"""Redis was reached but refused this client: password, ACL permission or TLS certificate."""

_DEFAULT_EVENTS: Final = 10
_TIMEOUT: Final = 10.0


class _Fail(Exception):
    """Stop a subcommand with a message and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- plumbing


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparsable URL>"


def _client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": _TIMEOUT,
        "socket_timeout": _TIMEOUT,
    }
    if not args.cluster:
        # An operator wants a quick, clear answer, not minutes of backoff.
        kwargs["retry"] = Retry(NoBackoff(), 0)
    if args.tls_ca_cert:
        kwargs["ssl_ca_certs"] = args.tls_ca_cert
    return kwargs


def _connect(args: argparse.Namespace) -> Any:
    """A client for ``--redis`` (a ``RedisCluster`` with ``--cluster``)."""
    url: str = args.redis
    try:
        if args.cluster:
            return redis.cluster.RedisCluster.from_url(url, **_client_kwargs(args))
        return redis.Redis.from_url(url, **_client_kwargs(args))
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.RedisClusterException,
    ) as exc:
        raise _Fail(f"cannot reach Redis at {redact_url(url)}: {exc}", EXIT_UNREACHABLE) from exc
    except ValueError as exc:
        raise _Fail(f"bad Redis URL {redact_url(url)}: {exc}", EXIT_UNREACHABLE) from exc


@contextlib.contextmanager
def _backend(args: argparse.Namespace) -> Iterator[RedisCheckpointBackend]:
    """A backend on its own client, closed on exit.

    No change listener (``watch=False``) and no retries: an operator wants one quick, clear
    answer, and can simply run the command again.
    """
    client = _connect(args)
    try:
        with RedisCheckpointBackend(
            client, prefix=args.prefix, watch=False, retry=NO_RETRY
        ) as backend:
            yield backend
    finally:
        client.close()


def _timestamp(seconds: int) -> str:
    """Unix seconds as ISO 8601 UTC (``2025-01-31T12:00:00Z``)."""
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(seconds)


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        return list(value)
    if isinstance(value, (uuid.UUID, dt.datetime)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, sort_keys=False)


def _run_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id (UUID): {text!r}") from None


def _positive_or_zero(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


# ---------------------------------------------------------------------------- doctor


_LABELS: Final = {"ok": "OK", "warn": "WARN", "unsafe": "UNSAFE", "unknown": "UNKNOWN"}


def print_report(report: ServerReport, out: TextIO) -> None:
    """Print one line per check, then a verdict."""
    width = max((len(c.name) for c in report.checks), default=0)
    for check in report.checks:
        where = f"[{check.node}] " if check.node else ""
        label = _LABELS.get(check.level, check.level.upper())
        print(f"{label:<8} {where}{check.name:<{width}}  {check.message}", file=out)
    unsafe = len(report.by_level("unsafe"))
    warn = len(report.by_level("warn"))
    unknown = len(report.by_level("unknown"))
    if not report.ok:
        print(f"\nUNSAFE: {unsafe} problem(s) can lose checkpoints; fix them first.", file=out)
    else:
        notes = [f"{n} {what}" for n, what in ((warn, "warning(s)"), (unknown, "unknown")) if n]
        print("\nsafe" + (f" ({', '.join(notes)})" if notes else ""), file=out)


def _cmd_doctor(args: argparse.Namespace) -> int:
    client = _connect(args)
    try:
        print(f"checking {redact_url(args.redis)}", file=sys.stdout)
        report = check_server(client, prefix=args.prefix)
    except ConnectionError as exc:
        raise _Fail(
            f"cannot reach Redis at {redact_url(args.redis)}: {exc}", EXIT_UNREACHABLE
        ) from exc
    finally:
        client.close()
    print_report(report, sys.stdout)
    return EXIT_OK if report.ok else EXIT_FAILURE


# ---------------------------------------------------------------------------- runs


def _summary(cp: t.RunCheckpoint) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for result in cp.agent_results.values():
        statuses[result.status] = statuses.get(result.status, 0) + 1
    return {
        "run_id": str(cp.run_id),
        "status": cp.status.value,
        "task": cp.task,
        "current_phase": cp.current_phase,
        "total_tokens": cp.total_tokens,
        "created_at": _timestamp(cp.created_at),
        "updated_at": _timestamp(cp.updated_at),
        "completed_phases": len(cp.completed_phases),
        "agents_started": len(cp.started_agent_ids),
        "agent_results": statuses,
        "agent_sessions": len(cp.agent_sessions),
        "findings": len(cp.findings),
        "can_resume": cp.can_resume(),
    }


def _one_line(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


def _cmd_runs(args: argparse.Namespace) -> int:
    code = EXIT_OK
    with _backend(args) as backend:
        run_ids = backend.list_runs()
        if not args.json:
            print(f"{'run id':<36}  {'status':<9}  {'tokens':>12}  {'updated (UTC)':<20}  task")
        for run_id in run_ids:
            try:
                cp = backend.open_run(run_id)
            except CorruptDataError as exc:
                print(f"{run_id}: {exc}", file=sys.stderr)
                code = EXIT_FAILURE
                continue
            if cp is None:  # deleted since the SCAN
                continue
            if args.json:
                print(_dumps(_summary(cp)))
            else:
                print(
                    f"{cp.run_id!s:<36}  {cp.status.value:<9}  {cp.total_tokens:>12}  "
                    f"{_timestamp(cp.updated_at):<20}  {_one_line(cp.task)}"
                )
        if not args.json:
            print(f"{len(run_ids)} run(s) under prefix {args.prefix!r}", file=sys.stderr)
    return code


# ---------------------------------------------------------------------------- show


def _last_events(backend: RedisCheckpointBackend, run_id: uuid.UUID, count: int) -> list[Any]:
    """The last ``count`` events of the run as (entry id, event), oldest first."""
    if count == 0:
        return []
    key = run_keys(backend.prefix, run_id).events
    try:
        page = backend.client.xrevrange(key, max="+", min="-", count=count)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise translate_error(exc, run_id=run_id) from exc
    out: list[Any] = []
    for entry_id, fields in reversed(page):
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        type_raw, blob = fields.get(b"type"), fields.get(b"data")
        if not isinstance(type_raw, bytes) or not isinstance(blob, bytes):
            raise CorruptDataError(key, f"entry {eid}", "lacks its type or data field")
        event = codec.decode_event(
            type_raw.decode("utf-8", "replace"), blob, run_id, key=key, entry_id=eid
        )
        out.append((eid, event))
    return out


def _cmd_show(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with _backend(args) as backend:
        cp = backend.open_run(run_id)
        if cp is None:
            raise _Fail(f"run {run_id} not found under prefix {args.prefix!r}")
        summary = _summary(cp)
        try:
            summary["events"] = backend.client.xlen(run_keys(args.prefix, run_id).events)
        except redis.exceptions.RedisError:
            summary["events"] = None
        summary["log_trimmed"] = backend.log_trimmed  # retention: the log lost its oldest events
        if args.json:
            print(_dumps(summary))
        else:
            for name, value in summary.items():
                multiline = isinstance(value, str) and not value.isprintable()
                shown = _dumps(value) if isinstance(value, dict) or multiline else value
                print(f"{name + ':':<18}{shown}")
        events = _last_events(backend, run_id, args.events)
        if events and not args.json:
            print(f"--- last {len(events)} event(s), oldest first")
        for eid, event in events:
            print(_dumps({"id": eid, **event.to_json()}))
    return EXIT_OK


# ---------------------------------------------------------------------------- cancel


def _cmd_cancel(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with _backend(args) as backend:
        cp = backend.open_run(run_id)
        if cp is None:
            raise _Fail(f"run {run_id} not found under prefix {args.prefix!r}")
        before = cp.status
        backend.cancel()
        after = backend.get_checkpoint()
        assert after is not None
        status = after.status.value
        if after.status is t.CheckpointStatus.CANCELLED and before is not after.status:
            print(f"run {run_id}: {status}")
        elif after.status is t.CheckpointStatus.CANCELLED:
            print(f"run {run_id}: {status} (it already was)")
        else:
            print(f"run {run_id}: {status} (only a running run can be cancelled)")
    return EXIT_OK


# ---------------------------------------------------------------------------- delete


def _cmd_delete(args: argparse.Namespace) -> int:
    run_id: uuid.UUID = args.run_id
    with _backend(args) as backend:
        if not backend.delete_run(run_id):
            raise _Fail(f"run {run_id} not found under prefix {args.prefix!r}")
        print(f"run {run_id}: deleted, with its event log")
    return EXIT_OK


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


def _add_connection(parser: argparse.ArgumentParser, *, prefix: bool) -> None:
    default_url = os.environ.get(URL_ENV) or DEFAULT_URL
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=default_url,
        help=f"Redis URL (default: env {URL_ENV}, else {DEFAULT_URL}); "
        "redis://, rediss:// (TLS) or unix://",
    )
    parser.add_argument("--cluster", action="store_true", help="the URL names a Redis Cluster node")
    parser.add_argument(
        "--tls-ca-cert",
        metavar="FILE",
        default=None,
        help="CA certificate file to verify the server with (rediss:// URLs)",
    )
    if prefix:
        parser.add_argument(
            "--prefix",
            default=DEFAULT_PREFIX,
            help=f"key prefix of the runs (default: {DEFAULT_PREFIX})",
        )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``luft-redis`` (``demo`` arguments are not parsed here)."""
    parser = argparse.ArgumentParser(
        prog="luft-redis",
        description="Inspect and operate luft-redis checkpoints stored in Redis.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = sub.add_parser(
        "doctor",
        help="check that the server keeps checkpoints safe",
        description="Check eviction policy, persistence, version and cluster mode. "
        "Exit 0 when safe, 1 when something is unsafe, 2 when unreachable.",
    )
    _add_connection(doctor, prefix=True)
    doctor.set_defaults(handler=_cmd_doctor)

    runs = sub.add_parser("runs", help="list the stored runs")
    _add_connection(runs, prefix=True)
    runs.add_argument("--json", action="store_true", help="one JSON object per run")
    runs.set_defaults(handler=_cmd_runs)

    show = sub.add_parser("show", help="a run's checkpoint summary and its last events")
    show.add_argument("run_id", metavar="RUN_ID", type=_run_id)
    _add_connection(show, prefix=True)
    show.add_argument(
        "--events",
        metavar="N",
        type=_positive_or_zero,
        default=_DEFAULT_EVENTS,
        help=f"how many of the last events to print as JSON lines (default {_DEFAULT_EVENTS})",
    )
    show.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    show.set_defaults(handler=_cmd_show)

    cancel = sub.add_parser("cancel", help="cancel a running run")
    cancel.add_argument("run_id", metavar="RUN_ID", type=_run_id)
    _add_connection(cancel, prefix=True)
    cancel.set_defaults(handler=_cmd_cancel)

    delete = sub.add_parser("delete", help="delete a run and its event log")
    delete.add_argument("run_id", metavar="RUN_ID", type=_run_id)
    _add_connection(delete, prefix=True)
    delete.set_defaults(handler=_cmd_delete)

    from .cli_retention import add_commands as add_retention_commands  # gc

    add_retention_commands(sub)

    sub.add_parser(
        "demo", help="run the demo (arguments go to luft_redis.tools.demo)", add_help=False
    )
    from . import cli_interop  # export, import, import-sqlite, export-sqlite

    cli_interop.add_commands(sub)
    return parser


def _split_demo(argv: Sequence[str]) -> list[str] | None:
    """The demo's arguments when the command is ``demo`` (after global options), else None."""
    for index, arg in enumerate(argv):
        if arg in ("-v", "--verbose"):
            continue
        return list(argv[index + 1 :]) if arg == "demo" else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``luft-redis`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-v", "--verbose") for a in args_list[:1]):
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    demo_args = _split_demo(args_list)
    if demo_args is not None:
        return _run_demo(demo_args)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_UNREACHABLE
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        try:
            return handler(args)
        except Exception as exc:  # a refused password, ACL or certificate first
            refused = _refusal(exc, args)
            if refused is None:
                raise
        print(f"luft-redis {args.command}: Redis refused this client: {refused}",
              file=sys.stderr)  # fmt: skip
        return EXIT_REFUSED
    except _Fail as exc:
        print(f"luft-redis {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except ConnectionError as exc:
        print(
            f"luft-redis {args.command}: cannot reach Redis at {redact_url(args.redis)}: {exc}",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.RedisClusterException,
    ) as exc:
        print(
            f"luft-redis {args.command}: cannot reach Redis at {redact_url(args.redis)}: {exc}",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    except LuftRedisError as exc:
        print(f"luft-redis {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except redis.exceptions.RedisError as exc:
        print(f"luft-redis {args.command}: Redis error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"luft-redis {args.command}: interrupted", file=sys.stderr)
        return 130


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
