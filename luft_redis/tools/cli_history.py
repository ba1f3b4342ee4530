"""``luft-redis history`` and ``luft-redis fork``: a run's versions, and a new run from one.

Registered by :func:`luft_redis.tools.cli.build_parser` through :func:`add_commands`::

    luft-redis history RUN_ID [--limit N] [--before ID | --after ID] [--oldest] [--json]
    luft-redis fork RUN_ID --at POINT [--new-run-id ID] [--task TEXT]

``show RUN_ID --at POINT`` (in :mod:`luft_redis.tools.cli`) prints a past state. A POINT is a
version (``57``), an event id (``1796183810669-0``) or a time (``2026-12-05T21:00:00Z``): see
:func:`luft_redis.history.parse_at`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ValidationError
from ..history import Point, parse_at
from .cli_common import EXIT_OK, add_connection, open_backend, parse_run_id, positive_int
from .render import version_json, version_line

__all__ = ["add_commands", "parse_point"]

_DEFAULT_LIMIT = 50


def parse_point(text: str) -> Point:
    """An argparse ``type=`` for ``--at``: a version, an event id or a time."""
    try:
        return parse_at(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_history(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        versions = backend.history(args.run_id, start="(" + args.after if args.after else "-",
                                   end="(" + args.before if args.before else "+",
                                   count=args.limit, reverse=not args.oldest)  # fmt: skip
    for version in versions:
        if args.json:
            print(json.dumps(version_json(version), ensure_ascii=False, separators=(",", ":")))
        else:
            print(version_line(version))
    if not versions and not args.json:
        print(f"run {args.run_id}: no history in this range", file=sys.stderr)
    sys.stdout.flush()
    return EXIT_OK


def _cmd_fork(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        child = backend.fork_run(args.run_id, at=args.at, new_run_id=args.new_run_id,
                                 task=args.task)  # fmt: skip
    print(f"run {child}: forked from run {args.run_id} at {args.at}")
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Add ``history`` and ``fork`` to the ``luft-redis`` subcommands ``sub``."""
    history = sub.add_parser(
        "history", help="a run's versions: when, which operation, what changed",
        description="List a run's versions from its history (newest first): version, time "
        "(server clock), operation and what changed. Page with --before/--after and the "
        "history ids of --json. A run written before luft-redis kept a history has one from "
        "its first write since.",
    )  # fmt: skip
    history.add_argument("run_id", metavar="RUN_ID", type=parse_run_id, help="the run's id")
    history.add_argument("--limit", type=positive_int, default=_DEFAULT_LIMIT, metavar="N",
                         help=f"show at most N versions (default {_DEFAULT_LIMIT})")  # fmt: skip
    history.add_argument("--before", metavar="ID", help="only versions before this history id")
    history.add_argument("--after", metavar="ID", help="only versions after this history id")
    history.add_argument("--oldest", action="store_true", help="oldest first")
    history.add_argument("--json", action="store_true",
                         help="JSON lines: version, id, time, op, event_id, base, changes")
    add_connection(history)
    history.set_defaults(handler=_cmd_history)

    fork = sub.add_parser(
        "fork", help="a new run from a run's state at a past point",
        description="Create a new run whose state is the run's at --at (a version, an event "
        "id or a time) and whose log is the run's events up to it. The run's agent tasks "
        "without an ok result at that point are ready again in the new run, in the run's "
        "pool if it is in one. The run itself is only read. Prints the new run's id.",
    )  # fmt: skip
    fork.add_argument("run_id", metavar="RUN_ID", type=parse_run_id, help="the run's id")
    fork.add_argument("--at", type=parse_point, required=True, metavar="POINT",
                      help="a version (57), an event id (1796183810669-0) or a time "
                           "(2026-12-05T21:00:00Z)")  # fmt: skip
    fork.add_argument("--new-run-id", type=parse_run_id, default=None, metavar="ID",
                      help="the new run's id (default: a new UUID)")  # fmt: skip
    fork.add_argument("--task", default=None, help="the new run's task (default: the run's)")
    add_connection(fork)
    fork.set_defaults(handler=_cmd_fork)
