"""One bound cache as a change listener sees it, without I/O: :class:`Watch` hands each
notice to its :class:`~luft_redis.cache.RunCache` (a header check and a queue append: no
decoding) and asks its front end for work (a reload, change callbacks) through ``on_work``;
it never blocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .cache import Offer, RunCache
from .delta import UnknownFormat, parse_delta
from .stats import Counters

__all__ = ["Watch"]

class Watch:
    """One bound cache, as its listener sees it (never blocks, never does I/O)."""

    __slots__ = ("__weakref__", "cache", "channel", "counters", "on_work", "wants_changes")

    def __init__(self, cache: RunCache, channel: bytes, on_work: Callable[[Watch], None],
                 counters: Counters | None = None) -> None:  # fmt: skip
        self.cache = cache
        self.channel = channel
        self.on_work = on_work
        self.counters = counters if counters is not None else Counters()
        """The front end's counters: ``notices`` counts the notices this watch applied."""
        self.wants_changes = False
        """Set when somebody waits for changes or subscribed callbacks: every applied notice
        then asks the front end to run them."""

    def notice(self, payload: Any) -> bool:
        """A notice of the watched channel; False when the cache had applied it already."""
        cache = self.cache
        if payload == cache.last_payload or payload in cache.recent:
            return False  # this process's own write, applied from its reply: no parsing
        try:
            delta = parse_delta(payload)
        except (UnknownFormat, ValueError):
            cache.mark_stale()
            self.on_work(self)
            return True
        outcome = cache.offer(delta)
        if outcome is Offer.APPLIED:
            self.counters.notices += 1
            if self.wants_changes:
                self.on_work(self)
        elif outcome is Offer.OLD:
            return False
        else:
            cache.mark_stale()
            self.on_work(self)
        return True

    def subscribed(self) -> None:
        """The channel was (re)subscribed: notices before it may be lost, so reload."""
        self.cache.mark_stale()
        self.on_work(self)
