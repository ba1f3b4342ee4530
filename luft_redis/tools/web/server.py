"""Start the web view: check the safety rules, make the clients, run uvicorn, print the URL."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys
from typing import Any

import uvicorn

from ...connect import make_async_client
from ..cli_common import EXIT_OK, EXIT_UNREACHABLE, connect
from .app import WebConfig, create_app

__all__ = ["is_loopback", "serve"]

logger = logging.getLogger(__name__)


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
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def serve(args: argparse.Namespace, *, token: str | None) -> int:
    """Run the web view until Ctrl-C or SIGTERM; the exit code."""
    host: str = args.host
    if not is_loopback(host) and not token:
        print(f"luft-redis web: refusing to bind {host} without a token: anyone who can reach "
              "it could read every run. Pass --token (or set LUFT_REDIS_WEB_TOKEN), or bind "
              "127.0.0.1.", file=sys.stderr)  # fmt: skip
        return EXIT_UNREACHABLE
    config = WebConfig(prefix=args.prefix, host=host, port=args.port, token=token,
                       allow_cancel=args.allow_cancel,
                       allowed_hosts=tuple(args.allowed_host))  # fmt: skip
    return asyncio.run(_main(args, config))


async def _main(args: argparse.Namespace, config: WebConfig) -> int:
    sync_client = connect(args)
    kwargs: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_timeout": 15.0}
    if args.tls_ca_cert:
        kwargs["ssl_ca_certs"] = args.tls_ca_cert
    async_client = make_async_client(args.redis, cluster=args.cluster, **kwargs)
    app = create_app(config, async_client, sync_client)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port,
                                           log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1))  # fmt: skip
    task = asyncio.create_task(server.serve())
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            port = config.port
            for listener in server.servers:
                for sock in listener.sockets:
                    port = sock.getsockname()[1]
            print(f"luft-redis web: serving prefix {config.prefix!r} "
                  f"({'cancel allowed' if config.allow_cancel else 'read-only'}); open "
                  f"{_url(config.host, port, config.token)}", flush=True)  # fmt: skip
        await task
    finally:
        await async_client.aclose()
        sync_client.close()
    return EXIT_OK if server.started else EXIT_UNREACHABLE
