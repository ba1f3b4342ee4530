"""What every ``luft-redis`` subcommand shares: exit codes, the connection options, the client.

:mod:`luft_redis.tools.cli` (the parser and ``main``) and the modules that add subcommands
(:mod:`~luft_redis.tools.cli_interop`, :mod:`~luft_redis.tools.cli_retention`) import from
here; this module imports none of them, so the arrows run one way: ``cli`` -> subcommand
modules -> ``cli_common``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..keys import DEFAULT_PREFIX

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
    "not_redis",
    "parse_run_id",
    "redact_url",
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


def not_redis(url: str, exc: object) -> CommandFailed:
    """The failure of a command whose server at ``url`` does not speak Redis."""
    return CommandFailed(f"{redact_url(url)} is not a Redis server (it answered: {exc})",
                         EXIT_UNREACHABLE)  # fmt: skip


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
    except redis.exceptions.InvalidResponse as exc:
        raise not_redis(url, exc) from exc
    except redis.exceptions.AuthenticationError:
        raise  # refused, not unreachable: the command's caller says so (exit 3)
    except redis.exceptions.ConnectionError as exc:  # (some redis-py versions say "closed")
        answer = _foreign_answer(url)
        if answer is not None:
            raise not_redis(url, answer) from exc
        raise CommandFailed(f"cannot reach Redis at {redact_url(url)}: {exc}",
                            EXIT_UNREACHABLE) from exc  # fmt: skip
    except (
        redis.exceptions.TimeoutError,
        redis.exceptions.RedisClusterException,
    ) as exc:
        raise CommandFailed(
            f"cannot reach Redis at {redact_url(url)}: {exc}", EXIT_UNREACHABLE
        ) from exc
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
