"""How much of the machine the rest of it took while a stack was timed.

Around each stack's part of a latency round the parent reads:

- how long the timed process's threads waited for a CPU while runnable (the
  kernel's run-queue wait, ``/proc/<pid>/task/*/schedstat``, in nanoseconds):
  the direct measure of whether the measurement itself was held back;
- the kernel's CPU accounting (``/proc/stat``) less the CPU time of the tool's
  own processes (the measurement servers and this one): the cores *other*
  processes kept busy — the figure the report shows, and what says whether a
  thread count found as many free cores as it has threads;
- the share of time the hypervisor stole, and the run queue (runnable tasks) at
  both ends.

A part is *disturbed* when both held: other processes kept busy more than
``DISTURBED_OTHERS_MARGIN`` (0.15 of a core) beyond the cores the measurement left
free (``cores - threads``), and the timed threads spent more than ``DISTURBED_WAIT``
of their time waiting for a CPU; or the hypervisor stole more than
``DISTURBED_STEAL``. Neither figure alone will do. The wait counts every wake-up of a
thread pool's workers, which is the measurement's own: on a quiet 2-core machine a
2-thread measurement of a small model waits up to 22% of its time, a 1-thread one
under 1%. The others' share comes from ``/proc/stat`` in clock ticks (10 ms), so a
short part reads a stray tick as a large share of a core (0.44 of one over a part of
0.0225 s): a part lasts at least ``SHORTEST_PART_S``, the length over which
``STRAY_TICKS`` ticks read as the margin and fewer stay under it (the servers check
each part's length as it runs, compat/device_runner.py ``timed_part``), and the wait
is a second witness. Together they say what slows a timed call: one busy job beside
a 1-thread measurement on 2 cores leaves it its core (others 1.0 of 1 free, no wait),
beside a 2-thread one it does not. The figures that chose the thresholds are in
docs/benchmarks.md. A round with a disturbed part is repeated
(upgrade_gate.measure.rounds), and its ratio is not used.

Every reading is of a ``/proc`` folder (``proc``, the machine's by default), so that
tests/data/proc's recorded readings drive the same code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DISTURBED_WAIT = 0.05
DISTURBED_OTHERS_MARGIN = 0.15  # cores beyond the free ones: stray clock ticks
DISTURBED_STEAL = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")  # USER_HZ: 100 on every Linux, so a target's ticks are the host's
# The ticks a part can misread with nothing else running: the machine's count and ours are each read whole at
# both ends, so each difference may be a tick or two off; 3 is the most 800 quiet parts read here
# (tests/data/proc/stray.py; docs/benchmarks.md, "A part's floor from the clock tick").
STRAY_TICKS = 3
# A stack's part of a round, however small the time budget: the length over which the stray ticks read as the
# margin, so fewer never make a quiet part crowded (3 ticks of 10 ms / 0.15 of a core = 0.2 s).
SHORTEST_PART_S = STRAY_TICKS / _TICKS / DISTURBED_OTHERS_MARGIN
PROC = Path("/proc")


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    wall_s: float
    busy_ticks: int  # every CPU's user, nice, system, irq and softirq time
    steal_ticks: int
    total_ticks: int
    ours_ticks: int  # our processes' user and system time
    runnable: int  # procs_running
    waited_ns: int  # the timed process's threads: time runnable but waiting for a CPU


@dataclass(frozen=True, kw_only=True, slots=True)
class Load:
    """What the rest of the machine did during one stack's part of a round."""

    seconds: float  # the part's wall time
    waited_share: float  # of the timed threads' time (wall × threads), spent waiting for a CPU
    others_cores: float  # cores kept busy by other processes, on average
    steal_share: float  # of all CPU time, stolen by the hypervisor
    run_queue: int  # the most runnable tasks seen at either end, ours included
    free_cores: float  # the machine's cores less the timed threads: what others may use undisturbing

    @property
    def disturbed(self) -> bool:
        crowded = self.others_cores > self.free_cores + DISTURBED_OTHERS_MARGIN
        return (crowded and self.waited_share > DISTURBED_WAIT) or self.steal_share > DISTURBED_STEAL

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 4), "waited_share": round(self.waited_share, 4),
                "others_cores": round(self.others_cores, 4), "steal_share": round(self.steal_share, 4),
                "run_queue": self.run_queue}


def snapshot(ours: list[int], timed: int, proc: Path = PROC,
             clock: Callable[[], float] = time.monotonic) -> Snapshot | None:
    """The machine's CPU accounting now, our processes' (``ours``: their pids; this one's, ``proc/self``,
    is added) and the run-queue wait of ``timed``'s threads, as ``proc`` says them at ``clock()``."""
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return None  # not Linux: no figures, nothing judged disturbed
    fields = [int(v) for v in lines[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    runnable = next((int(line.split()[1]) for line in lines if line.startswith("procs_running")), 0)
    this = (proc / "self").resolve().name  # this process's pid in the machine's /proc; a recording's "self"
    ours_ticks = _process_ticks(proc / "self") + sum(_process_ticks(proc / str(pid)) for pid in set(ours)
                                                     if str(pid) != this)
    return Snapshot(wall_s=clock(), busy_ticks=user + nice + system + irq + softirq, steal_ticks=steal,
                    total_ticks=sum(fields[:8]), ours_ticks=ours_ticks, runnable=runnable,
                    waited_ns=_waited_ns(proc / str(timed)))


def load_between(before: Snapshot | None, after: Snapshot | None, threads: int, cores: int) -> Load | None:
    """The load during a part timed at ``threads`` threads on a machine of ``cores`` cores, from
    the snapshots at its ends."""
    if before is None or after is None or after.wall_s <= before.wall_s:
        return None
    seconds = after.wall_s - before.wall_s
    others = max(0, (after.busy_ticks - before.busy_ticks) - (after.ours_ticks - before.ours_ticks))
    total = max(1, after.total_ticks - before.total_ticks)
    return Load(seconds=seconds, waited_share=max(0, after.waited_ns - before.waited_ns) / 1e9 / seconds / threads,
                others_cores=others / _TICKS / seconds, steal_share=(after.steal_ticks - before.steal_ticks) / total,
                run_queue=max(before.runnable, after.runnable), free_cores=max(0, cores - threads))


def watch(ours: list[int], timed: int, threads: int, cores: int) -> Callable[[], Load | None]:
    """Start watching the machine around one stack's part of a round (``timed``: its server's pid; ``ours``:
    every server's); the function returned ends the watch and gives the part's load."""
    before = snapshot(ours, timed)
    return lambda: load_between(before, snapshot(ours, timed), threads, cores)


def _process_ticks(process: Path) -> int:
    """A process's user and system time (its ``/proc/<pid>`` folder), every thread of it, in clock ticks (0 if it
    is gone)."""
    try:
        stat = (process / "stat").read_text()
    except OSError:
        return 0
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def _waited_ns(process: Path) -> int:
    """How long a process's threads (its ``/proc/<pid>`` folder) have waited on a run queue, in all (the second
    field of each thread's schedstat); 0 where the kernel does not say."""
    waited = 0
    try:
        tasks = list((process / "task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            waited += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return waited
