"""What every ``luft-redis`` subcommand shares: exit codes, the connection options, the client.

:mod:`luft_redis.tools.cli` (the parser and ``main``) and the modules that add subcommands
(:mod:`~luft_redis.tools.cli_interop`, :mod:`~luft_redis.tools.cli_retention`) import from
here; this module imports none of them, so the arrows run one way: ``cli`` -> subcommand
modules -> ``cli_common``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._sync.backend import RedisCheckpointBackend
from ..errors import ConnectionError as LuftConnectionError
from ..keys import DEFAULT_PREFIX
from ..retry import NO_RETRY, exception_chain

__all__ = [
    "DEFAULT_URL",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "TIMEOUT",
    "URL_ENV",
    "CommandFailed",
    "add_connection",
    "client_kwargs",
    "connect",
    "open_backend",
    "parse_run_id",
    "positive_int",
    "redact_url",
    "server_failure",
]

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
"""The Redis URL used when neither ``--redis`` nor env ``LUFT_REDIS_URL`` is given."""

URL_ENV: Final = "LUFT_REDIS_URL"

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_UNREACHABLE: Final = 2
EXIT_REFUSED: Final = 3
"""Redis was reached but refused this client: password, ACL permission or TLS certificate."""

TIMEOUT: Final = 10.0
"""Seconds a command's client waits to connect and for each reply."""


class CommandFailed(Exception):
    """Stop a subcommand with a message and an exit code (``cli.main`` prints it)."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


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


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The client options of the connection options in ``args`` (timeouts, CA; no retries)."""
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": TIMEOUT,
        "socket_timeout": TIMEOUT,
    }
    if not args.cluster:
        # An operator wants a quick, clear answer, not minutes of backoff.
        kwargs["retry"] = Retry(NoBackoff(), 0)
    if args.tls_ca_cert:
        kwargs["ssl_ca_certs"] = args.tls_ca_cert
    return kwargs


_UNREACHABLE: Final = (
    LuftConnectionError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.RedisClusterException,
)


def server_failure(url: str, exc: BaseException) -> CommandFailed | None:
    """Exit 2 when the server at ``url`` answered but is not Redis (another service on the
    port: its reply is no Redis reply, wherever a client wrapped it in ``exc``'s chain; some
    redis-py versions only say "closed", then one raw PING tells), or could not be reached;
    None for any other failure, a refused password included (exit 3, the caller's). Every
    command and the demo report these two through here."""
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return None
    shown = redact_url(url)
    chain = exception_chain(exc)
    answer: object = next((c for c in chain if isinstance(c, redis.exceptions.InvalidResponse)),
                          None)  # fmt: skip
    closed = isinstance(exc, _UNREACHABLE) and not isinstance(exc, redis.exceptions.TimeoutError)
    if answer is None and closed:
        answer = _foreign_answer(url)
    if answer is not None:
        return CommandFailed(f"{shown} is not a Redis server (it answered: {answer})",
                             EXIT_UNREACHABLE)  # fmt: skip
    if isinstance(exc, _UNREACHABLE):
        return CommandFailed(f"cannot reach Redis at {shown}: {exc}", EXIT_UNREACHABLE)
    return None


def connect(args: argparse.Namespace) -> Any:
    """A client for ``--redis`` (a ``RedisCluster`` with ``--cluster``), checked with one PING:
    an unreachable server, one that is not Redis, or one that refuses this client fails here,
    before the command starts (the caller maps a refusal to :data:`EXIT_REFUSED`)."""
    url: str = args.redis
    client: Any
    try:
        if args.cluster:
            client = redis.cluster.RedisCluster.from_url(url, **client_kwargs(args))
        else:
            client = redis.Redis.from_url(url, **client_kwargs(args))
            warn_needless_password(url, args)
        client.ping()
        return client
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        failure = server_failure(url, exc)
        if failure is None:
            raise
        raise failure from exc
    except ValueError as exc:
        raise CommandFailed(f"bad Redis URL {redact_url(url)}: {exc}", EXIT_UNREACHABLE) from exc


_RESP_TYPES: Final = frozenset(b"+-:$*_,#!=(%~>|")
"""The first byte of every RESP2/RESP3 reply."""


def _foreign_answer(url: str) -> str | None:
    """What the server at a ``redis://`` URL answers a bare ``PING`` with, when that is not
    RESP (the port runs something else: an HTTP server, a database); None when it is RESP,
    says nothing, or cannot be reached (a TLS, Unix or Sentinel URL is not probed)."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or not parts.hostname:
        return None
    try:
        with socket.create_connection((parts.hostname, parts.port or 6379), timeout=2.0) as sock:
            sock.sendall(b"PING\r\n")
            first = sock.recv(64)
    except (OSError, ValueError):
        return None
    if not first or first[0] in _RESP_TYPES:
        return None
    return repr(first.split(b"\r\n", 1)[0].decode("latin-1")[:40])


_WARNED: set[str] = set()


def warn_needless_password(url: str, args: argparse.Namespace | None = None) -> bool:
    """Warn once on stderr when ``url`` carries a password that the server does not need (it
    answers without one, and then ignores the one given, as ``redis-cli -a`` warns). One PING
    on a connection without credentials, only when a password is given. True when it warned."""
    parts = urlsplit(url)
    if parts.password is None or url in _WARNED:
        return False
    _WARNED.add(url)
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    kwargs = client_kwargs(args) if args is not None else {}
    kwargs.update(socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        with redis.Redis.from_url(bare, **kwargs) as probe:
            probe.ping()
    except (redis.exceptions.RedisError, OSError, ValueError):
        return False  # a password is needed (NOAUTH), or the server cannot be asked: no warning
    print(f"warning: the server at {redact_url(url)} accepts connections without a password; "
          "the password given is not needed", file=sys.stderr)  # fmt: skip
    return True


def positive_int(text: str) -> int:
    """An argparse ``type=``: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def parse_run_id(text: str) -> uuid.UUID:
    """A ``RUN_ID`` argument (argparse ``type=``)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id (UUID): {text!r}") from None


def add_connection(
    parser: argparse.ArgumentParser, *, prefix: bool = True, top: bool = False
) -> None:
    """The connection options. On the top-level parser (``top``) they carry the defaults; on
    a subcommand they default to SUPPRESS, so that options given before the subcommand are
    kept and options given after it win."""
    default_url = os.environ.get(URL_ENV) or DEFAULT_URL

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--redis",
        metavar="URL",
        default=default(default_url),
        help=f"Redis URL (default: env {URL_ENV}, else {DEFAULT_URL}); "
        "redis://, rediss:// (TLS), unix:// or redis+sentinel://",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        default=default(False),
        help="the URL names a Redis Cluster node",
    )
    parser.add_argument(
        "--tls-ca-cert",
        metavar="FILE",
        default=default(None),
        help="CA certificate file to verify the server with (rediss:// URLs)",
    )
    if prefix:
        parser.add_argument(
            "--prefix",
            default=default(DEFAULT_PREFIX),
            help=f"key prefix of the runs (default: {DEFAULT_PREFIX})",
        )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default(False), help="log debug messages"
    )


@contextlib.contextmanager
def open_backend(
    args: argparse.Namespace, *, watch: bool = False
) -> Iterator[RedisCheckpointBackend]:
    """A backend on its own client, closed on exit.

    No retries: an operator wants one quick, clear answer, and can simply run the command
    again. No change listener unless ``watch`` (``luft-redis watch``: the listener keeps the
    cache current from the run's notices).
    """
    client = connect(args)
    try:
        with RedisCheckpointBackend(
            client, prefix=args.prefix, watch=watch, retry=NO_RETRY
        ) as backend:
            yield backend
    finally:
        client.close()
