"""``luft-redis gc``: delete finished runs older than a given age (see luft_redis.retention).

Registered by :func:`luft_redis.tools.cli.build_parser` through :func:`add_commands`::

    luft-redis gc --older-than 7d [--status completed,failed,cancelled] [--dry-run]
                  [--batch N] [--scan] [--redis URL] [--prefix P]

It finds its candidates through the run index (the sorted set ``luft-redis runs`` reads);
``--scan`` SCANs the keyspace instead, for a prefix whose index was never built
(``luft-redis runs --rebuild-index`` builds it).

Prints one line per run (``deleted``, or ``would delete`` with ``--dry-run``), then a summary.
Exit 0 on success (also when nothing matched), 1 on a failure, 2 when Redis is unreachable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from ..errors import ValidationError
from ..retention import DEFAULT_BATCH, FINAL_STATUSES, collect_garbage, parse_duration
from .cli_common import EXIT_OK, add_connection, connect, positive_int

__all__ = ["add_commands"]


def _duration(text: str) -> dt.timedelta:
    try:
        return parse_duration(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _statuses(text: str) -> tuple[str, ...]:
    wanted = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in wanted if s not in FINAL_STATUSES]
    if bad or not wanted:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad) or 'no status'}: choose among {','.join(FINAL_STATUSES)}"
        )
    return wanted


def _when(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cmd_gc(args: argparse.Namespace) -> int:
    client: Any = connect(args)
    try:
        report = collect_garbage(
            client,
            args.prefix,
            older_than=args.older_than,
            statuses=args.status,
            dry_run=args.dry_run,
            batch_size=args.batch,
            use_index=not args.scan,
        )
    finally:
        client.close()
    deleted = set(report.deleted)
    verb = "would delete" if args.dry_run else "deleted"
    for run in report.found:
        if args.dry_run or run.run_id in deleted:
            print(f"{verb:<13}{run.run_id}  {run.status:<10} updated {_when(run.updated_at)}")
    if args.dry_run:
        print(f"dry run: {len(report.found)} run(s) would be deleted; nothing was deleted")
    else:
        line = f"{len(report.deleted)} run(s) deleted"
        if report.skipped:
            line += f", {len(report.skipped)} skipped (changed since they were found)"
        print(line)
    sys.stdout.flush()
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Add ``gc`` to the ``luft-redis`` subcommands ``sub`` (argparse subparsers)."""
    gc = sub.add_parser(
        "gc",
        help="delete finished runs older than a given age",
        description="Delete finished runs (completed, failed, cancelled) last updated longer "
        "ago than --older-than, in batches. A run resumed meanwhile is never deleted. The "
        "candidates come from the run index (the one `luft-redis runs` reads); --scan SCANs "
        "the keyspace instead, for a prefix whose index was never built (`luft-redis runs "
        "--rebuild-index` builds it).",
    )
    gc.add_argument(
        "--older-than",
        metavar="AGE",
        type=_duration,
        required=True,
        help="minimum time since the run's last update: 90s, 15m, 12h, 7d, 2w",
    )
    gc.add_argument(
        "--status",
        metavar="S[,S...]",
        type=_statuses,
        default=FINAL_STATUSES,
        help=f"statuses to delete (default: {','.join(FINAL_STATUSES)})",
    )
    gc.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    gc.add_argument(
        "--batch",
        metavar="N",
        type=positive_int,
        default=DEFAULT_BATCH,
        help=f"runs read and deleted per batch (default {DEFAULT_BATCH})",
    )
    gc.add_argument(
        "--scan",
        action="store_true",
        help="find the runs by a SCAN of the keyspace, not through the run index (for a "
        "prefix whose index was never built; `luft-redis runs --rebuild-index` builds it)",
    )
    add_connection(gc, prefix=True)
    gc.set_defaults(handler=_cmd_gc)
