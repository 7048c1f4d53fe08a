"""The clock ticks a part misreads with nothing else running (the figure behind _contention.STRAY_TICKS): a timed
process spinning beside this one (``nice -n 19``, one thread, counted as ours, as a measurement server is), and
``--parts`` back-to-back parts of ``--part`` seconds each read by the detector's own snapshot; for each part, the
machine's busy ticks less ours: what it would call other processes' ticks. Prints how many parts read each count of
ticks, and the cores the largest reads as. Run it on an idle machine (docs/benchmarks-log.md has its figures).

    python3 tests/data/proc/stray.py --parts 200 --part 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
from upgrade_gate.measure import _contention  # noqa: E402 - this checkout's


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", type=int, default=200)
    parser.add_argument("--part", type=float, default=_contention.SHORTEST_PART_S)
    args = parser.parse_args()
    timed = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
    ticks: Counter[int] = Counter()
    try:
        time.sleep(0.5)
        before = _contention.snapshot([timed.pid], timed.pid)
        for _ in range(args.parts):
            time.sleep(args.part)
            after = _contention.snapshot([timed.pid], timed.pid)
            assert before is not None and after is not None
            ticks[(after.busy_ticks - before.busy_ticks) - (after.ours_ticks - before.ours_ticks)] += 1
            before = after
    finally:
        timed.kill()
        timed.wait()
    largest = max(ticks)
    print(json.dumps({"part_s": args.part, "parts": args.parts, "cores": os.cpu_count(),
                      "parts_by_others_ticks": dict(sorted(ticks.items())),
                      "largest_as_cores": round(largest / _contention._TICKS / args.part, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
