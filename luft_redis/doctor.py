"""Compatibility re-export: the code lives in :mod:`luft_redis.tools.doctor`."""

from __future__ import annotations

from .tools.doctor import (
    DEFAULT_RUN_SAMPLE,
    LEVELS,
    MIN_REDIS_VERSION,
    Check,
    Level,
    ServerReport,
    check_runs,
    check_server,
)

__all__ = [
    "DEFAULT_RUN_SAMPLE",
    "LEVELS",
    "MIN_REDIS_VERSION",
    "Check",
    "Level",
    "ServerReport",
    "check_runs",
    "check_server",
]
