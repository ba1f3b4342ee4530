"""CPU placement of the benchmarks: the server on one core, the clients on another.

Unpinned on a 2-core machine, a PING costs 37 µs or 92 µs depending on where the client lands,
so every benchmark pins: the redis-server (every thread) to the first usable cpu, this process
(and the processes it starts, which inherit it) to the second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Placement", "pin_server", "plan_placement"]


@dataclass
class Placement:
    server_cpu: int | None
    client_cpu: int | None
    server_threads: int = 0

    def describe(self, server_pid: int | None) -> str:
        if self.server_cpu is None or self.client_cpu is None:
            return "no pinning (fewer than 2 cpus available)"
        return (f"redis-server pid {server_pid} ({self.server_threads} threads) pinned to cpu "
                f"{self.server_cpu}; client processes pinned to cpu {self.client_cpu}")  # fmt: skip


def plan_placement() -> Placement:
    """Server on the first usable cpu, clients on the second; pins this process now."""
    if not hasattr(os, "sched_getaffinity"):
        return Placement(None, None)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return Placement(None, None)
    placement = Placement(cpus[0], cpus[1])
    os.sched_setaffinity(0, {cpus[1]})
    return placement


def pin_server(placement: Placement, pid: int | None) -> None:
    """Pin every thread of process ``pid`` to the server cpu (threads made later inherit it)."""
    if placement.server_cpu is None or pid is None:
        return
    tids = [int(x) for x in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        os.sched_setaffinity(tid, {placement.server_cpu})
        if os.sched_getaffinity(tid) != {placement.server_cpu}:
            raise RuntimeError(f"could not pin thread {tid} of redis-server to cpu "
                               f"{placement.server_cpu}")  # fmt: skip
    placement.server_threads = len(tids)
