"""Counters of one backend: cheap enough to stay on in production (no I/O, no locks).

:meth:`RedisCheckpointBackend.stats` (and the asyncio backend's) returns a :class:`BackendStats`
snapshot. Every name carries its unit: ``_total`` for a count since the backend was made,
``_seconds`` for a duration. The counters are plain integer and float additions done by the
thread that did the work; a snapshot read while another thread writes may be one event behind,
never torn (each field is one Python object).

============================  ==============================================================
``writes_total``              writing operations acknowledged by Redis (one per script call;
                              a batch of events is one write)
``write_retries_total``       extra attempts of writes and reads after a transient failure
``replays_total``             writes whose reply came from the exactly-once record: an earlier
                              attempt had been applied and its reply was lost
``reloads_total``             full loads of the run (``open_run``, ``sync()``, catching up
                              after a gap, a re-created run or a lost subscription)
``notices_applied_total``     change notices of other writers applied to the cache
``redis_wait_seconds_total``  time spent waiting on Redis in this backend's function calls
                              (writes and loads), retries and back-off included
``health_check_age_seconds``  age of the subscriber connection's last answered health check
                              (PING); None when the backend does not watch or has no answer
============================  ==============================================================
"""

from __future__ import annotations

import dataclasses

__all__ = ["BackendStats", "Counters"]


@dataclasses.dataclass(frozen=True, slots=True)
class BackendStats:
    """A snapshot of a backend's counters (see the module docstring for each field)."""

    writes_total: int
    write_retries_total: int
    replays_total: int
    reloads_total: int
    notices_applied_total: int
    redis_wait_seconds_total: float
    health_check_age_seconds: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        """The fields as a plain dict (for a metrics exporter or a log line)."""
        return dataclasses.asdict(self)


class Counters:
    """The mutable counters a front end bumps (an I/O-free part of the core)."""

    __slots__ = ("notices", "reloads", "replays", "retries", "wait_seconds", "writes")

    def __init__(self) -> None:
        self.notices = 0
        self.writes = 0
        self.retries = 0
        self.replays = 0
        self.reloads = 0
        self.wait_seconds = 0.0

    def snapshot(self, health_age: float | None) -> BackendStats:
        return BackendStats(
            writes_total=self.writes,
            write_retries_total=self.retries,
            replays_total=self.replays,
            reloads_total=self.reloads,
            notices_applied_total=self.notices,
            redis_wait_seconds_total=self.wait_seconds,
            health_check_age_seconds=health_age,
        )
