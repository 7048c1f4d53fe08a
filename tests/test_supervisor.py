"""The supervisor with real processes (plain Python, no torch): deadlines per
stage, the memory limit, and a clean exit."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

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


# A stand-in for the measurement server: speaks the worker's protocol over the control fds.
SERVER = textwrap.dedent('''
    import json, os, sys, time
    requests_fd, events_fd = (int(fd) for fd in os.environ["CONTROL"].split(","))
    requests, events = os.fdopen(requests_fd), os.fdopen(events_fd, "w")
    behaviour = sys.argv[1]

    def send(event, **data):
        events.write(json.dumps({"event": event, **data}) + "\\n")
        events.flush()

    print("a model that prints to stdout: not part of the protocol", flush=True)
    send("stage", stage="load")
    send("ready", cold={"load_ms": 1.0})
    for line in requests:
        request = json.loads(line)
        if request["command"] == "exit":
            send("exit", memory={"peak_rss_bytes": 1})
            break
        send("stage", stage="round")
        if behaviour == "hang":
            time.sleep(600)
        if behaviour == "crash":
            os.abort()
        if behaviour == "raise":
            send("error", type="RuntimeError", message="forward() failed", traceback_tail=["line"])
            sys.exit(1)
        send("round", round=request["round"], samples_ms={"forward": [1.0, 2.0]})
''')


def serve(tmp_path: Path, behaviour: str, deadlines: dict[str, float] | None = None) -> supervisor.Server:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    deadlines = {"default": 20.0, **(deadlines or {})}
    return supervisor.Server(
        [sys.executable, str(script), behaviour], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        log_file=tmp_path / "server.log", deadline_for=lambda stage: deadlines.get(stage, deadlines["default"]),
        memory_limit_bytes=2**40, control_env="CONTROL",
    )


def test_server_answers_rounds_and_says_goodbye(tmp_path):
    server = serve(tmp_path, "answer")
    assert server.request(None, "ready")["cold"] == {"load_ms": 1.0}
    for number in (1, 2):
        assert server.request({"command": "round", "round": number}, "round") == {
            "event": "round", "round": number, "samples_ms": {"forward": [1.0, 2.0]}}
    assert server.close() == {"event": "exit", "memory": {"peak_rss_bytes": 1}}
    assert server.process.returncode == 0
    assert "prints to stdout" in (tmp_path / "server.log").read_text()


@pytest.mark.parametrize(("behaviour", "status", "message"), [
    ("hang", "timeout", "step round ran 1 s, past its deadline of 1 s (timeouts.round); worker killed"),
    ("crash", "crashed", "worker killed by signal SIGABRT"),
    ("raise", "failed", "RuntimeError: forward() failed"),
])
def test_server_that_does_not_answer(tmp_path, behaviour, status, message):
    server = serve(tmp_path, behaviour, {"round": 1.0})
    server.request(None, "ready")
    with pytest.raises(supervisor.ServerFailed) as failure:
        server.request({"command": "round", "round": 1}, "round")
    server.stop()
    assert (failure.value.status, failure.value.stage, failure.value.message) == (status, "round", message)
    assert server.process.poll() is not None
