"""Forks: a backend made before ``os.fork()`` notices in the child that it must take a new
writer identity and new connections (:func:`fork_generation`), and the hooks that run first
thing in a forked child (:func:`on_fork`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["fork_generation", "fork_lock", "on_fork"]

_fork_lock = threading.Lock()


_fork_generation = 0


_fork_hooks: list[Callable[[], None]] = []


def fork_lock() -> threading.Lock:
    """A process-wide lock for adopting a fork (made anew in every child, so it is never held
    by a thread that did not survive the fork)."""
    return _fork_lock


def fork_generation() -> int:
    """How many times this process was forked from the one that imported luft_redis (a
    value captured before a fork differs from the value read in the child)."""
    return _fork_generation


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook()`` in every forked child, first thing (it must not take locks)."""
    with _fork_lock:
        _fork_hooks.append(hook)


def _after_fork_in_child() -> None:
    global _fork_generation, _fork_lock
    _fork_generation += 1
    _fork_lock = threading.Lock()
    for hook in list(_fork_hooks):
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
