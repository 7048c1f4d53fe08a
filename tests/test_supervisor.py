"""The supervisor with real processes (plain Python, no torch): deadlines per
stage, the memory limit, and a clean exit."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from upgrade_gate import supervisor

# A stand-in for the worker: records a running stage the way compat/worker.py does, then behaves.
WORKER = textwrap.dedent('''
    import json, os, sys, time
    phase_file, stage, behaviour = sys.argv[1], sys.argv[2], sys.argv[3]
    record = {"stages": [{"stage": stage, "status": "running", "duration_s": 0.0, "started_at": time.time()}]}
    with open(phase_file + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(phase_file + ".tmp", phase_file)
    held = []
    if behaviour == "hang":
        time.sleep(600)
    elif behaviour == "grow":
        for _ in range(40):  # up to 1 GiB, each block written
            held.append(bytearray(b"x" * (25 * 2**20)))
            time.sleep(0.02)
    elif behaviour == "quick":
        record["stages"][0]["status"] = "ok"
        with open(phase_file, "w") as f:
            json.dump(record, f)
''')


def supervise(tmp_path: Path, stage: str, behaviour: str, *, deadlines: dict[str, float],
              memory_limit: int = 2**40) -> supervisor.Outcome:
    script = tmp_path / "stand_in.py"
    script.write_text(WORKER)
    phase_file = tmp_path / "phase.json"
    return supervisor.run_supervised(
        [sys.executable, str(script), str(phase_file), stage, behaviour],
        env={}, cwd=tmp_path, log_file=tmp_path / "log", phase_file=phase_file,
        deadline_for=lambda name: deadlines.get(name, deadlines["default"]), memory_limit_bytes=memory_limit,
    )


def test_a_stage_past_its_deadline_is_killed_and_named(tmp_path):
    outcome = supervise(tmp_path, "eager", "hang", deadlines={"default": 600, "eager": 1.0})
    assert outcome.cause == "timeout" and outcome.stage == "eager" and outcome.deadline_s == 1.0
    assert 1.0 < outcome.stage_elapsed_s < 10 and outcome.returncode == -15  # SIGTERM took it
    assert not outcome.finished


def test_the_memory_limit_kills_the_worker_and_reports_its_peak(tmp_path):
    limit = 300 * 2**20
    outcome = supervise(tmp_path, "export", "grow", deadlines={"default": 600}, memory_limit=limit)
    assert outcome.cause == "out-of-memory" and outcome.stage == "export"
    assert limit < outcome.peak_rss_bytes < 2**30 and outcome.returncode == -9


def test_a_worker_that_finishes_is_left_alone(tmp_path):
    outcome = supervise(tmp_path, "load", "quick", deadlines={"default": 60})
    assert outcome.finished and outcome.cause is None and outcome.stage == "finish"
    assert json.loads((tmp_path / "phase.json").read_text())["stages"][0]["status"] == "ok"
    assert outcome.peak_rss_bytes >= 0


def test_the_start_up_has_a_deadline_of_its_own(tmp_path):
    # No phase file ever appears: the time counts against "start".
    outcome = supervisor.run_supervised(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={}, cwd=tmp_path, log_file=tmp_path / "log",
        phase_file=tmp_path / "never.json", deadline_for=lambda name: 1.0 if name == "start" else 600,
        memory_limit_bytes=2**40,
    )
    assert outcome.cause == "timeout" and outcome.stage == "start"
