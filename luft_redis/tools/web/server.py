"""Start the web view: check the safety rules, make the clients, run uvicorn, print the URL."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import logging
import socket
import sys
from typing import Any
from urllib.parse import quote

import uvicorn

from ...connect import make_async_client
from ..cli_common import EXIT_OK, EXIT_UNREACHABLE, CommandFailed, connect
from .app import SHUTDOWN_TIMEOUT, WebConfig, create_app

__all__ = ["is_loopback", "serve"]

logger = logging.getLogger(__name__)


def _allowed(config: WebConfig) -> str:
    """What the view may change: ``cancel and fork allowed``, or ``read-only``."""
    names = [name for name, on in (("cancel", config.allow_cancel), ("fork", config.allow_fork))
             if on]  # fmt: skip
    return " and ".join(names) + " allowed" if names else "read-only"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int, token: str | None) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")


def serve(args: argparse.Namespace, *, token: str | None) -> int:
    """Run the web view until Ctrl-C or SIGTERM; the exit code."""
    host: str = args.host
    if not is_loopback(host) and not token:
        print(f"luft-redis web: refusing to bind {host} without a token: anyone who can reach "
              "it could read every run. Pass --token (or set LUFT_REDIS_WEB_TOKEN), or bind "
              "127.0.0.1.", file=sys.stderr)  # fmt: skip
        return EXIT_UNREACHABLE
    config = WebConfig(prefix=args.prefix, host=host, port=args.port, token=token,
                       allow_cancel=args.allow_cancel, allow_fork=args.allow_fork,
                       allowed_hosts=tuple(args.allowed_host))  # fmt: skip
    return asyncio.run(_main(args, config))


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is one clear line (exit 2)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CommandFailed(f"cannot listen on {host}:{port}: {exc}", EXIT_UNREACHABLE) from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else str(exc)
        raise CommandFailed(f"cannot listen on {host}:{port}: {why} (choose another with --port)",
                            EXIT_UNREACHABLE) from exc  # fmt: skip
    return sock


async def _main(args: argparse.Namespace, config: WebConfig) -> int:
    sock = _listen(config.host, config.port)
    try:  # the same checks as every command (unreachable, not Redis, refused): exit 2 or 3
        connect(args).close()
    except BaseException:
        sock.close()
        raise
    kwargs: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_timeout": 15.0}
    if args.tls_ca_cert:
        kwargs["ssl_ca_certs"] = args.tls_ca_cert
    async_client = make_async_client(args.redis, cluster=args.cluster, **kwargs)
    app = create_app(config, async_client)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port,
                                           log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1))  # fmt: skip
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            port = config.port
            for listener in server.servers:
                for bound in listener.sockets:
                    port = bound.getsockname()[1]
            print(f"luft-redis web: serving prefix {config.prefix!r} "
                  f"({_allowed(config)}); open "
                  f"{_url(config.host, port, config.token)}", flush=True)  # fmt: skip
        await task
    finally:
        try:  # bounded as the app's own close is (app.SHUTDOWN_TIMEOUT)
            await asyncio.wait_for(async_client.aclose(), SHUTDOWN_TIMEOUT)
        except TimeoutError:
            logger.warning("the Redis client did not close in %.0f s; stopped without it",
                           SHUTDOWN_TIMEOUT)  # fmt: skip
    return EXIT_OK if server.started else EXIT_UNREACHABLE
