"""The supervisor with real processes (plain Python, no torch): deadlines per
stage, the memory limit, and a clean exit."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.run import fork_server as fork_servers
from upgrade_gate.run import measure_server, process_group, supervisor, workers

COMPAT = TOOL_ROOT / "compat"

# A stand-in for the worker: records a running stage the way compat/worker.py does, then behaves.
WORKER = textwrap.dedent('''
    import json, os, sys, time
    phase_file, stage, behaviour = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(phase_file + ".pid", "w") as f:  # for a test that kills it from outside
        f.write(str(os.getpid()))
    record = {"stages": [{"stage": stage, "status": "running", "duration_s": 0.0, "started_at": time.time()}]}
    with open(phase_file + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(phase_file + ".tmp", phase_file)
    held = []
    # What an earlier child of the same fork server did to its copy of the server's state, if it shows here.
    server = sys.modules.get("fork_server")
    record["tainted"] = "TAINTED" in os.environ or getattr(server, "REAP_S", None) == 99
    if behaviour == "taint":
        os.environ["TAINTED"] = "1"
        server.REAP_S = 99
        behaviour = "quick"
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


# A stand-in for the fork server (compat/worker.py fork-server): the real serve() of compat/fork_server.py,
# whose children run the stand-in worker.
FORK_SERVER = textwrap.dedent('''
    import importlib.util, os, runpy, sys
    spec = importlib.util.spec_from_file_location("fork_server", sys.argv[1])
    fork_server = sys.modules["fork_server"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fork_server)
    threads = fork_server.os_threads()
    if sys.argv[3:] == ["threaded"]:  # a thread started at import, as a library might
        import threading
        threading.Thread(target=lambda: __import__("time").sleep(600), daemon=True).start()
    if sys.argv[3:] == ["native"]:  # a thread Python's threading does not see (a native pool), after the imports
        import _thread
        _thread.start_new_thread(__import__("time").sleep, (600,))
    requests_fd, events_fd = (int(fd) for fd in os.environ.pop("UPGRADE_GATE_CONTROL_FDS").split(","))
    request = fork_server.serve(requests_fd, events_fd, {}, os_threads=threads)
    if request is not None:
        sys.argv = [sys.argv[2], *request["argv"]]
        runpy.run_path(sys.argv[0], run_name="__main__")
''')


def stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "stand_in.py"
    script.write_text(WORKER)
    return script


@pytest.fixture(params=["fresh", "forked"])
def start(request, tmp_path):
    """How the worker starts: a fresh process, or a child of a fork server (None: fresh)."""
    if request.param == "fresh":
        yield None
        return
    server = fork_server(tmp_path)
    yield server
    server.close()


def fork_server(tmp_path: Path, *, threads: str = "") -> fork_servers.ForkServer:
    (tmp_path / "fork_server_stand_in.py").write_text(FORK_SERVER)
    script = stand_in(tmp_path)
    return fork_servers.ForkServer(
        [sys.executable, str(tmp_path / "fork_server_stand_in.py"), str(COMPAT / "fork_server.py"), str(script),
         *([threads] if threads else [])],
        serves=[sys.executable, str(script)], commands=[str(tmp_path / "phase.json")], env={}, cwd=tmp_path,
        log_file=tmp_path / "fork-server.log", ready_deadline_s=60,
    )


def supervise(tmp_path: Path, stage: str, behaviour: str, *, deadlines: dict[str, float],
              memory_limit: int = 2**40, start: fork_servers.ForkServer | None = None,
              env: dict[str, str] | None = None) -> supervisor.Outcome:
    phase_file = tmp_path / "phase.json"
    return supervisor.run_supervised(
        [sys.executable, str(stand_in(tmp_path)), str(phase_file), stage, behaviour],
        env=env or {}, cwd=tmp_path, log_file=tmp_path / "log", phase_file=phase_file,
        deadline_for=lambda name: deadlines.get(name, deadlines["default"]), memory_limit_bytes=memory_limit,
        fork_server=start,
    )


def test_a_stage_past_its_deadline_is_killed_and_named(tmp_path, start):
    outcome = supervise(tmp_path, "eager", "hang", deadlines={"default": 600, "eager": 1.0}, start=start)
    assert outcome.forked is (start is not None)
    assert outcome.cause == "timeout" and outcome.stage == "eager" and outcome.deadline_s == 1.0
    assert 1.0 < outcome.stage_elapsed_s < 10 and outcome.returncode == -15  # SIGTERM took it
    assert not outcome.finished


def test_the_memory_limit_kills_the_worker_and_reports_its_peak(tmp_path, start):
    limit = 300 * 2**20
    outcome = supervise(tmp_path, "export", "grow", deadlines={"default": 600}, memory_limit=limit, start=start)
    assert outcome.forked is (start is not None)
    assert outcome.cause == "out-of-memory" and outcome.stage == "export"
    assert limit < outcome.peak_rss_bytes < 2**30 and outcome.returncode == -9


def test_a_worker_that_finishes_is_left_alone(tmp_path, start):
    outcome = supervise(tmp_path, "load", "quick", deadlines={"default": 60}, start=start)
    assert outcome.forked is (start is not None)
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


def kill_9_when_running(tmp_path: Path, before_kill=lambda: None) -> threading.Thread:
    """``kill -9`` of the worker, from outside, once it runs its stage."""
    def kill() -> None:
        pid_file = tmp_path / "phase.json.pid"
        while not (pid_file.exists() and pid_file.read_text()):
            time.sleep(0.05)
        time.sleep(0.3)
        before_kill()
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    thread = threading.Thread(target=kill)
    thread.start()
    return thread


@pytest.fixture(autouse=True)
def run_not_stopped(monkeypatch):
    """A run that is not being stopped (another test may have stopped "the run"): every test here."""
    monkeypatch.setattr(process_group, "_INTERRUPTED", threading.Event())


def test_a_kill_9_from_outside_is_the_machines_not_the_models(tmp_path, run_not_stopped, start):
    killer = kill_9_when_running(tmp_path)
    outcome = supervise(tmp_path, "export", "hang", deadlines={"default": 600}, start=start)
    assert outcome.forked is (start is not None)
    killer.join()
    assert outcome.returncode == -9 and outcome.cause is None and outcome.stage == "export"
    assert outcome.oom_kills == 0  # this machine's counter can be read, and nothing was killed for memory
    status, message = workers.cause(outcome, plan=None)  # type: ignore[arg-type]  # a timeout's needs the plan
    assert status == "killed"
    assert message.startswith("worker killed by signal SIGKILL from outside (not by upgrade-gate, and the kernel "
                              "counted no out-of-memory kill; peak resident memory 0.0"), message


def test_a_kill_9_while_the_kernel_counts_an_out_of_memory_kill_is_out_of_memory(tmp_path, monkeypatch,
                                                                                 run_not_stopped):
    # The kernel's counter, as memory.events/memory.oom_control/vmstat give it; the kill moves it by one.
    counter = tmp_path / "memory.events"
    counter.write_text("oom 3\noom_kill 3\n")
    monkeypatch.setattr(process_group, "_oom_counter_files", lambda: [tmp_path / "absent", counter])
    killer = kill_9_when_running(tmp_path, lambda: counter.write_text("oom 4\noom_kill 4\n"))
    outcome = supervise(tmp_path, "export", "hang", deadlines={"default": 600})
    killer.join()
    assert outcome.returncode == -9 and outcome.oom_kills == 1
    status, message = workers.cause(outcome, plan=None)  # type: ignore[arg-type]
    assert status == "out-of-memory"
    assert message.startswith("stage export: worker killed by the kernel's out-of-memory killer (SIGKILL; it "
                              "counted 1 out-of-memory kill(s) while the worker ran; peak resident memory "), message


def test_a_fork_server_killed_from_outside_takes_its_child_and_says_so(tmp_path, run_not_stopped):
    server = fork_server(tmp_path)
    try:
        def kill_the_server() -> None:
            pid_file = tmp_path / "phase.json.pid"
            while not (pid_file.exists() and pid_file.read_text()):
                time.sleep(0.05)
            os.kill(server.ready["pid"], signal.SIGKILL)
        killer = threading.Thread(target=kill_the_server)
        killer.start()
        outcome = supervise(tmp_path, "export", "hang", deadlines={"default": 600}, start=server)
        killer.join()
        assert outcome.forked and outcome.returncode == -9 and outcome.stage == "export"
        assert workers.cause(outcome, plan=None)[0] == "killed"  # type: ignore[arg-type]
        child = int((tmp_path / "phase.json.pid").read_text())
        for _ in range(100):  # its PR_SET_PDEATHSIG, or the parent's SIGKILL: gone within moments
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the fork server's child {child} outlived it")
        # The next worker starts fresh, and the server says why it stopped forking.
        again = supervise(tmp_path, "load", "quick", deadlines={"default": 60}, start=server)
        assert again.finished and not again.forked and server.broken.startswith("it ended (exit status -9")
    finally:
        server.close()


def test_each_child_starts_from_the_servers_state_not_from_the_last_childs(tmp_path):
    server = fork_server(tmp_path)
    try:
        first = supervise(tmp_path, "export", "taint", deadlines={"default": 60}, start=server)
        assert first.finished and first.forked
        second = supervise(tmp_path, "export", "quick", deadlines={"default": 60}, start=server)
        assert second.finished and second.forked
        assert json.loads((tmp_path / "phase.json").read_text())["tainted"] is False
    finally:
        server.close()
    # The stand-in sees a taint where there is one: the check can fail.
    tainted = supervise(tmp_path, "export", "quick", deadlines={"default": 60}, env={"TAINTED": "1"})
    assert json.loads((tmp_path / "phase.json").read_text())["tainted"] is True and not tainted.forked


def test_a_fork_server_with_threads_refuses_and_the_worker_starts_fresh(tmp_path):
    server = fork_server(tmp_path, threads="threaded")
    try:
        outcome = supervise(tmp_path, "load", "quick", deadlines={"default": 60}, start=server)
        assert outcome.finished and not outcome.forked
        assert server.broken == "the fork server has 2 threads; forking is safe with one"
    finally:
        server.close()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts the kernel's threads (Linux /proc)")
def test_a_fork_server_that_started_a_thread_python_does_not_see_refuses(tmp_path):
    # What the server checks after an adapter's warm-up (compat/worker.py): a native pool it started.
    server = fork_server(tmp_path, threads="native")
    try:
        outcome = supervise(tmp_path, "load", "quick", deadlines={"default": 60}, start=server)
        assert outcome.finished and not outcome.forked
        assert server.broken is not None and server.broken.endswith(
            "after its imports: something it ran since started a thread, and forking is safe with none"), server.broken
    finally:
        server.close()


def test_a_worker_the_fork_server_was_not_started_for_starts_fresh(tmp_path):
    server = fork_server(tmp_path)
    try:
        # Another environment than the server's: the child would not be what a fresh process is.
        outcome = supervise(tmp_path, "load", "quick", deadlines={"default": 60}, start=server, env={"OTHER": "1"})
        assert outcome.finished and not outcome.forked and server.broken is None and server.ready is None
    finally:
        server.close()


def test_the_kernels_out_of_memory_kills_are_read_where_they_are_counted():
    found = process_group.oom_kill_count()
    assert found is not None, process_group._oom_counter_files()
    path, count = found
    assert path.name in ("memory.events", "memory.oom_control", "vmstat") and count >= 0


def test_a_log_is_kept_to_its_head_and_tail(tmp_path):
    # A real worker that prints 10 MB: its log keeps the first and last MiB, and says what it dropped.
    code = "import sys\nprint('first line')\nfor i in range(100_000): sys.stdout.write(f'{i:07d} ' + 'x' * 92 + '\\n')\nprint('last line')"
    outcome = supervisor.run_supervised([sys.executable, "-c", code], env={}, cwd=tmp_path,
                                        log_file=tmp_path / "log", phase_file=None, deadline_for=lambda _: 600,
                                        memory_limit_bytes=2**40)
    assert outcome.returncode == 0
    text = (tmp_path / "log").read_text()
    assert 2 * 2**20 - 200 < len(text) < 2 * 2**20 + 200
    head, note, tail = text.partition("[upgrade-gate: ")
    assert head.startswith("first line\n0000000 ") and head.endswith("\n") and len(head) <= 2**20
    assert tail.endswith("0099999 " + "x" * 92 + "\nlast line\n")
    # Whole lines are dropped: those between the last kept at the head and the first kept at the tail.
    last_kept, first_kept = int(head.splitlines()[-1].split()[0]), int(tail.split("\n", 2)[1].split()[0])
    assert int(tail.split(" ", 1)[0]) == (first_kept - last_kept - 1) * 101  # 101 bytes a line
    assert tail.split("\n", 1)[0].endswith("bytes of this log dropped (its first 1 MiB and last 1 MiB are kept)]")


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


def serve(tmp_path: Path, behaviour: str, deadlines: dict[str, float] | None = None) -> measure_server.Server:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    deadlines = {"default": 20.0, **(deadlines or {})}
    return measure_server.Server(
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
    with pytest.raises(measure_server.ServerFailed) as failure:
        server.request({"command": "round", "round": 1}, "round")
    server.stop()
    assert (failure.value.status, failure.value.stage, failure.value.message) == (status, "round", message)
    assert server.process.poll() is not None
