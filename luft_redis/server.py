"""Compatibility re-export: the code lives in :mod:`luft_redis.tools.server`."""

from __future__ import annotations

from .tools.server import (
    LOOPBACK,
    LocalRedisCluster,
    LocalRedisServer,
    find_free_port,
    find_redis_cli,
    find_redis_server,
)

__all__ = [
    "LOOPBACK",
    "LocalRedisCluster",
    "LocalRedisServer",
    "find_free_port",
    "find_redis_cli",
    "find_redis_server",
]
