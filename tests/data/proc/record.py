"""Record one reading of the busy detector's /proc files (upgrade_gate/measure/_contention.py) under a condition made
here: a timed process of ``--threads`` threads (the measurement server's stand-in, its work half user and half system
time) and ``--neighbours`` busy loops beside it, every one of them at ``nice -n 19`` so that nothing else on a shared
machine is slowed. Writes ``before/`` and ``after/`` (``stat``, ``self/stat``, ``<pid>/stat``,
``<pid>/task/<tid>/{stat,schedstat}``) and ``reading.json`` (the pids, the monotonic time of each reading, the
machine) into the folder given. See README.md beside this file for the conditions recorded and how.

    python3 tests/data/proc/record.py tests/data/proc/two-busy --threads 1 --neighbours 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The timed process: each thread reads 1 MiB of /dev/zero (the kernel clears it: system time) and hashes 32 KiB of
# it (user time; about as long), both with the GIL released, so that two threads keep two cores busy. With "reap",
# it first forks a child that keeps a core busy for 0.45 s, before the reading begins, and reaps it 1 s in, during
# the reading: the child's time lands in the process's own record of its children then.
TIMED = """
import hashlib, os, sys, threading, time
started, child = time.monotonic(), None
if sys.argv[2] == "reap":
    child = os.fork()
    if child == 0:
        while time.monotonic() < started + 0.45:
            pass
        os._exit(0)
def work():
    global child
    zero = os.open("/dev/zero", os.O_RDONLY)
    while True:
        hashlib.sha256(memoryview(os.read(zero, 1 << 20))[:1 << 15]).digest()
        if child and time.monotonic() > started + 1.0 and threading.current_thread() is threading.main_thread():
            os.waitpid(child, 0)
            child = None
threads = [threading.Thread(target=work, daemon=True) for _ in range(int(sys.argv[1]) - 1)]
for thread in threads:
    thread.start()
work()
"""
SPIN = "while True: pass"


def copy_reading(target: Path, pids: list[int]) -> float:
    """The files snapshot() reads, copied as they are now; the monotonic time, taken right after /proc/stat."""
    target.mkdir(parents=True)
    (target / "stat").write_text(Path("/proc/stat").read_text())
    now = time.monotonic()
    (target / "self").mkdir()
    (target / "self" / "stat").write_text(Path("/proc/self/stat").read_text())
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            folder = target / str(pid) / "task" / task.name
            folder.mkdir(parents=True)
            for name in ("stat", "schedstat"):
                (folder / name).write_text((task / name).read_text())
        (target / str(pid) / "stat").write_text(Path(f"/proc/{pid}/stat").read_text())
    return now


def with_steal(source: Path, out: Path, share: float) -> None:
    """A steal-heavy VM's reading, made from a recorded one: the hypervisor's steal ticks added to the ``after``
    reading's CPU lines (each CPU its part), so that they are ``share`` of every CPU tick over the reading; the rest
    as recorded."""
    shutil.copytree(source, out)
    stat = out / "after" / "stat"
    lines = stat.read_text().splitlines()
    before = [int(v) for v in (source / "before" / "stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(int(v) for v in lines[0].split()[1:9]) - sum(before[:8])
    stolen = round(total * share / (1 - share))
    cpus = [n for n, line in enumerate(lines) if line.startswith("cpu") and line[3:4].isdigit()]
    added = {0: stolen, **dict.fromkeys(cpus, stolen // len(cpus))}
    added[cpus[0]] += stolen % len(cpus)  # the CPUs' lines sum to the machine's, as the kernel's do
    for n, ticks in added.items():
        fields = lines[n].split()
        fields[8] = str(int(fields[8]) + ticks)  # steal: the 8th value after the CPU's name
        lines[n] = " ".join(fields)
    stat.write_text("\n".join(lines) + "\n")
    reading = json.loads((out / "reading.json").read_text())
    reading["steal_added"] = {"ticks": stolen, "share": share, "from": source.name}
    (out / "reading.json").write_text(json.dumps(reading, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--neighbours", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--reap", action="store_true", help="the timed process reaps a child during the reading")
    parser.add_argument("--steal-from", type=Path, help="no recording: a reading of this folder, with steal added")
    parser.add_argument("--steal", type=float, default=0.1, help="the share of CPU ticks stolen, with --steal-from")
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    if args.steal_from:
        with_steal(args.steal_from, args.out, args.steal)
        return 0
    niced = ["nice", "-n", "19", sys.executable, "-c"]
    timed = subprocess.Popen([*niced, TIMED, str(args.threads), "reap" if args.reap else "-"])
    neighbours = [subprocess.Popen([*niced, SPIN]) for _ in range(args.neighbours)]
    try:
        time.sleep(0.5)  # every one of them started and busy
        before = copy_reading(args.out / "before", [timed.pid])
        time.sleep(args.seconds)
        after = copy_reading(args.out / "after", [timed.pid])
    finally:
        for process in (timed, *neighbours):
            process.kill()
            process.wait()
    reading = {"timed": timed.pid, "ours": [timed.pid], "threads": args.threads, "neighbours": args.neighbours,
               "reaped_a_child": args.reap,
               "cores": os.cpu_count(), "wall_s": {"before": before, "after": after},
               "kernel": platform.release(), "recorded": time.strftime("%Y-%m-%d %H:%M:%S")}
    (args.out / "reading.json").write_text(json.dumps(reading, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
