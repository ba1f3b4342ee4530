"""Compatibility re-export: the code lives in :mod:`luft_redis.tools.cli`."""

from __future__ import annotations

from .tools.cli import DEFAULT_URL, EXIT_FAILURE, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, main

__all__ = ["DEFAULT_URL", "EXIT_FAILURE", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNREACHABLE", "main"]
