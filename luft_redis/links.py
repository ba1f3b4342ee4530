"""The subscriber connections of a change listener, without I/O: their health and their
routes.

* :class:`LinkHealth` is the bookkeeping of one subscriber connection: which channels the
  server confirmed on it, which health-check PINGs are out and when the newest answered one
  was sent. A channel is healthy while it is confirmed on the current connection and a PING
  sent less than ``max_staleness`` ago was answered: every notice published before that PING
  reached the server has then been received (a connection delivers in order).
* :class:`Router` knows which link (one per node) carries which channel, and each channel's
  watches (:class:`~luft_redis.watch.Watch`); :func:`node_name_for` and
  :func:`check_primary` find the node that owns a channel's slot (Redis Cluster), and
  :func:`handle_message` applies one message of a connection (notices to the watches, PONGs
  to the health, confirmations and lost subscriptions).

The sync listener (:mod:`luft_redis._sync.listener`) and the asyncio one
(:mod:`luft_redis.asyncio.listener`) do the I/O around these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from redis.crc import key_slot

from .watch import Watch

__all__ = ["DEFAULT_MAX_STALENESS", "LinkHealth", "Router", "StaleRoute", "check_primary",
           "handle_message", "monotonic", "node_name_for"]  # fmt: skip

DEFAULT_MAX_STALENESS = 1.0
"""Seconds: ``cache_is_fresh`` is False when the subscriber connection has not proved, within
this long, that it delivers (a PING on it answered)."""


PINGS_PER_STALENESS = 4
"""Health-check PINGs sent per ``max_staleness`` period."""


STALL_FACTOR = 3.0
"""A subscriber connection whose oldest unanswered PING is older than this many
``max_staleness`` (and at least 1 s) is taken for dead and replaced."""


class LinkHealth:
    """Health bookkeeping of one subscriber connection (see the module docstring)."""

    def __init__(self, max_staleness: float = DEFAULT_MAX_STALENESS) -> None:
        self.max_staleness = max_staleness
        self.confirmed: set[bytes] = set()
        self._pings: dict[bytes, float] = {}
        self._next_token = 0
        self._last_ok: float | None = None
        self._next_ping = 0.0
        self.connected = False
        self.news = 0
        """Counts the notices that were news to a watch (not already applied in this
        process): the listener pauses longer between reads while only its own come."""

    @property
    def ping_interval(self) -> float:
        return max(0.02, self.max_staleness / PINGS_PER_STALENESS)

    @property
    def dead_after(self) -> float:
        return max(1.0, STALL_FACTOR * self.max_staleness)

    def connect(self, now: float) -> None:
        """A new connection: nothing confirmed, nothing proved yet."""
        self.confirmed = set()
        self._pings = {}
        self._last_ok = None
        self._next_ping = now
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False
        self.confirmed = set()
        self._pings = {}
        self._last_ok = None

    def ping_due(self, now: float) -> bytes | None:
        """The token of a PING to send now, or None when none is due."""
        if not self.connected or now < self._next_ping:
            return None
        self._next_token += 1
        token = b"luft-%d" % self._next_token
        self._pings[token] = now
        self._next_ping = now + self.ping_interval
        return token

    def until_next_ping(self, now: float) -> float:
        return max(0.0, self._next_ping - now)

    def pong(self, token: Any) -> None:
        sent = self._pings.pop(token, None) if isinstance(token, bytes) else None
        if sent is None:
            return
        for older in [tok for tok, at in self._pings.items() if at <= sent]:
            del self._pings[older]  # answered in order: older ones are lost, not late
        if self._last_ok is None or sent > self._last_ok:
            self._last_ok = sent

    def age(self, now: float) -> float | None:
        """Seconds since the last answered PING was sent (None: no answer on this connection)."""
        last = self._last_ok
        return None if last is None or not self.connected else max(0.0, now - last)

    def stalled(self, now: float) -> bool:
        """True when a PING has gone unanswered for longer than ``dead_after``."""
        return bool(self._pings) and now - min(self._pings.values()) > self.dead_after

    def healthy(self, channel: bytes, now: float, max_staleness: float | None = None) -> bool:
        limit = self.max_staleness if max_staleness is None else max_staleness
        last = self._last_ok
        return (
            self.connected
            and channel in self.confirmed
            and last is not None
            and now - last <= limit
        )


class Link(Protocol):
    """What a :class:`Router` needs of a subscriber connection."""

    name: str
    health: LinkHealth

    def request(self, item: tuple[str, bytes]) -> None: ...


L = TypeVar("L", bound=Link)


class Router(Generic[L]):
    """Which link (one per node) carries which channel, and each channel's watches.

    No I/O and no lock: the sync listener holds its lock around every call, the asyncio one
    calls it from the loop only. ``node_name(channel)`` names the node that owns a channel's
    slot by the client's slot map ("" for a plain server, "?" when there is no map yet);
    ``make_link(name)`` makes the link of a node.
    """

    def __init__(self, make_link: Callable[[str], L], node_name: Callable[[bytes], str]) -> None:
        self._make_link = make_link
        self._node_name = node_name
        self.watches: dict[bytes, list[Watch]] = {}
        self.route: dict[bytes, str] = {}
        self.links: dict[str, L] = {}
        self.max_staleness = DEFAULT_MAX_STALENESS

    def add(self, watch: Watch, max_staleness: float) -> tuple[L, bool]:
        """Route ``watch``'s channel; the link that carries it, and whether the channel is
        already confirmed there (then no confirmation will come for this watch)."""
        if max_staleness < self.max_staleness:
            self.max_staleness = max_staleness
            for link in self.links.values():
                link.health.max_staleness = max_staleness
        channel = watch.channel
        watches = self.watches.setdefault(channel, [])
        watches.append(watch)
        link = self.link_for(channel)
        if len(watches) == 1:
            link.request(("sub", channel))
        return link, channel in link.health.confirmed

    def remove(self, watch: Watch) -> None:
        channel = watch.channel
        watches = self.watches.get(channel)
        if not watches or watch not in watches:
            return
        watches.remove(watch)
        if not watches:
            del self.watches[channel]
            name = self.route.pop(channel, None)
            link = self.links.get(name) if name is not None else None
            if link is not None:
                link.request(("unsub", channel))

    def link_for(self, channel: bytes) -> L:
        """The link that should carry ``channel`` now (made when new)."""
        name = self._node_name(channel)
        self.route[channel] = name
        link = self.links.get(name)
        if link is None:
            link = self.links[name] = self._make_link(name)
            link.health.max_staleness = self.max_staleness
        return link

    def link_of(self, channel: bytes) -> L | None:
        name = self.route.get(channel)
        return self.links.get(name) if name is not None else None

    def healthy(self, channel: bytes, now: float, max_staleness: float | None) -> bool:
        link = self.link_of(channel)
        return link is not None and link.health.healthy(channel, now, max_staleness)

    def health_age(self, channel: bytes, now: float) -> float | None:
        link = self.link_of(channel)
        return None if link is None else link.health.age(now)

    def confirmed(self, channel: bytes) -> bool:
        link = self.link_of(channel)
        return link is not None and channel in link.health.confirmed

    def channels_of(self, link: L) -> list[bytes]:
        return [c for c, name in self.route.items() if name == link.name]

    def targets(self, channel: bytes) -> list[Watch]:
        return list(self.watches.get(channel, ()))

    def retire(self, link: L) -> bool:
        """Forget ``link`` if it carries nothing; True when it was forgotten."""
        if any(name == link.name for name in self.route.values()):
            return False
        if self.links.get(link.name) is link:
            del self.links[link.name]
        return True

    def reroute(self) -> list[L]:
        """After a topology change: move channels to their current nodes' links; the links
        that were given channels (their thread or task must run)."""
        started: list[L] = []
        for channel in list(self.route):
            old = self.route[channel]
            new_link = self.link_for(channel)
            if new_link.name != old:
                old_link = self.links.get(old)
                if old_link is not None:
                    old_link.request(("unsub", channel))
                new_link.request(("sub", channel))
                started.append(new_link)
        return started

    @property
    def connected(self) -> bool:
        links = list(self.links.values())
        return bool(links) and all(link.health.connected for link in links)

    def drop_all(self) -> None:
        for link in self.links.values():
            link.request(("drop", b""))


def node_name_for(client: Any, cluster: bool, channel: bytes) -> str:
    """The name of the node that owns ``channel``'s slot by the client's slot map (no I/O):
    "" for a plain server, "?" while a cluster client has no slot map yet."""
    if not cluster:
        return ""
    try:
        node = client.nodes_manager.get_node_from_slot(key_slot(channel))
    except Exception:  # no slot map (yet): the link refreshes it when it connects
        return "?"
    return str(node.name)


class StaleRoute(Exception):
    """A subscriber connection went to a node that does not own the channel's slot."""


def check_primary(role: Any, name: str) -> None:
    """Raise :class:`StaleRoute` unless a ``ROLE`` reply says node ``name`` is a primary.

    Right after a failover a refreshed slot map can still name the demoted primary, which
    would take a sharded subscription as a replica and miss the shard's notices.
    """
    kind = role[0] if isinstance(role, (list, tuple)) and role else role
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind != "master":
        raise StaleRoute(f"node {name} is a {kind}, not the slot's primary (stale slot map)")


def monotonic() -> float:
    return time.monotonic()


def handle_message(message: dict[str, Any], health: LinkHealth, asked_unsub: dict[bytes, int],
                   targets: Callable[[bytes], list[Watch]]) -> bytes | None:  # fmt: skip
    """Apply one message of a subscriber connection (no I/O, never blocks).

    Notices go to the channel's watches (``health.news`` counts those that were news to
    one), PONGs to ``health``, confirmations mark the watches stale. ``asked_unsub`` counts
    the unsubscribes this link sent and the server has not
    confirmed yet. Returns the channel whose subscription was just confirmed (the caller wakes
    whoever waits for it), else None; raises :class:`StaleRoute` when the server dropped a
    channel it was not asked to (its slot moved: failover, migration).
    """
    kind = message.get("type")
    if isinstance(kind, bytes):
        kind = kind.decode()
    raw = message.get("channel")
    channel = raw.encode() if isinstance(raw, str) else raw if isinstance(raw, bytes) else b""
    if kind == "smessage":
        for watch in targets(channel):
            if watch.notice(message["data"]):
                health.news += 1
    elif kind == "pong":
        health.pong(message.get("data"))
    elif kind == "ssubscribe":
        health.confirmed.add(channel)
        for watch in targets(channel):
            watch.subscribed()
        return channel
    elif kind == "sunsubscribe":
        pending = asked_unsub.get(channel, 0)
        if pending:  # the confirmation of our own unsubscribe (maybe resubscribed since)
            if pending == 1:
                del asked_unsub[channel]
            else:
                asked_unsub[channel] = pending - 1
            return None
        health.confirmed.discard(channel)
        raise StaleRoute(f"server unsubscribed {channel!r} (slot moved)")
    return None
