"""The progress display: one plain line per event for CI, a live view in a terminal."""

from __future__ import annotations

import io
import re

from rich.console import Console

from upgrade_gate.run.progress import Progress


def test_without_a_terminal_every_event_is_one_line():
    lines: list[str] = []
    with Progress("candidate: export and runtime phases", 2, log=lines.append,
                  console=Console(file=io.StringIO(), force_terminal=False)) as progress:
        progress.start("candidate: vit-smoke: export")
        progress.stage("candidate: vit-smoke: export", "export")
        progress.stage("candidate: vit-smoke: export", "export")  # the poll saw it again: no new line
        progress.log("a log line")
        progress.finish("candidate: vit-smoke: export", "done in 3.0 s")
        progress.finish("candidate: vit-smoke: runtime", "reused from the cache (entry abc)")
    pattern = re.compile(r"^\[(\d)/2 0:0\d\] (.*)$")
    events = [pattern.match(line).groups() if pattern.match(line) else line for line in lines]
    assert events == [
        ("0", "candidate: vit-smoke: export …"),
        ("0", "candidate: vit-smoke: export: export"),
        "a log line",
        ("1", "candidate: vit-smoke: export done in 3.0 s"),
        ("2", "candidate: vit-smoke: runtime reused from the cache (entry abc)"),
        lines[-1],
    ]
    assert re.fullmatch(r"candidate: export and runtime phases: 2/2 finished, 0:0\d", lines[-1])


def test_in_a_terminal_a_live_view_shows_what_runs():
    screen = io.StringIO()
    plain: list[str] = []
    console = Console(file=screen, force_terminal=True, width=120)
    progress = Progress("measure", 4, log=plain.append, console=console)
    progress.start("measure: vit-smoke: 1 thread(s)")
    progress.stage("measure: vit-smoke: 1 thread(s)", "round 3/7")
    progress._live.refresh()  # what the 4-per-second refresh would draw
    progress.log("measure: vit-smoke at 1 thread(s): 7 rounds of legacy, candidate")
    progress.finish("measure: vit-smoke: 1 thread(s)", "finished")
    progress.close()
    drawn = screen.getvalue()
    assert "measure: 0/4 done" in drawn and "round 3/7" in drawn and "vit-smoke" in drawn
    assert "7 rounds of legacy, candidate" in drawn and "finished" in drawn
    # Only the closing line goes to the plain log: the terminal had the rest.
    assert len(plain) == 1 and plain[0].startswith("measure: 1/4 finished")


def test_a_task_whose_stage_changes_often_gets_a_line_at_most_so_often(monkeypatch):
    from upgrade_gate.run import progress as module

    now = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    lines: list[str] = []
    progress = Progress("legacy: the project's tests", 1, log=lines.append,
                        console=Console(file=io.StringIO(), force_terminal=False))
    progress.start("legacy: project: tests")
    for second, test in ((0, "0/3 · t1"), (1, "1/3 · t2"), (16, "2/3 · t3"), (17, "3/3")):
        now[0] = 100.0 + second
        progress.stage("legacy: project: tests", test, lines_every_s=15)
    assert [line.split("] ", 1)[1] for line in lines[1:]] == [
        "legacy: project: tests: 0/3 · t1", "legacy: project: tests: 2/3 · t3"]
    assert progress.running["legacy: project: tests"] == ("3/3", 117.0)  # the live view has every change
