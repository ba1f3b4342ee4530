"""Compatibility re-export: the code lives in :mod:`luft_redis.tools.doctor`."""

from __future__ import annotations

from .tools.doctor import LEVELS, MIN_REDIS_VERSION, Check, Level, ServerReport, check_server

__all__ = ["LEVELS", "MIN_REDIS_VERSION", "Check", "Level", "ServerReport", "check_server"]
