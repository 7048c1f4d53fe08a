"""compat/diagnose/remedy_trial.py: a remedy lowered, saved, loaded and run, each step named for its error, and
the remedy stage's record — with a stand-in adapter, in the test's Python (no torch)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.compat_package import compat_module

remedy_trial = compat_module("trial_compat", "diagnose.remedy_trial")
phases = compat_module("trial_compat", "phases")


class Adapter:
    """Saves a program's text, loads it back and runs it as the text's upper case; fails where told to."""

    SUFFIX = ".x"

    def __init__(self, fails: str = "") -> None:
        self.fails = fails

    def save(self, lowered: str, path: Path) -> None:
        if self.fails == "save":
            raise OSError("disk full")
        path.write_text(lowered)

    def load(self, path: Path) -> str:
        if self.fails == "load":
            raise RuntimeError("bad magic")
        return path.read_text()

    def run(self, program: str, inputs: tuple[Any, ...]) -> str:
        if self.fails == "run":
            raise RuntimeError("missing operator")
        return f"{program.upper()}{inputs}"


def steps(fails: str = "") -> list[tuple[str, Any]]:
    def its_code(_: None) -> str:
        if fails == "its code":
            raise SyntaxError("invalid syntax")
        return "program"

    def lowering(program: str) -> str:
        if fails == "lowering":
            raise ValueError("no kernel for aten.gelu")
        return f"lowered {program}"

    return [("its code", its_code), ("lowering", lowering)]


def test_a_remedy_that_runs_is_its_loaded_program_its_outputs_and_its_file(tmp_path):
    ran = remedy_trial.run_trial(Adapter(), steps(), tmp_path, "forward-1", (1,))
    assert ran == remedy_trial.Ran(program="lowered program", outputs="LOWERED PROGRAM(1,)",
                                   file="remedy/forward-1.x", bytes=len("lowered program"),
                                   sha256=hashlib.sha256(b"lowered program").hexdigest())
    assert (tmp_path / "remedy" / "forward-1.x").read_text() == "lowered program"


def test_a_program_made_already_is_saved_loaded_and_run(tmp_path):
    ran = remedy_trial.run_trial(Adapter(), (), tmp_path, "forward", (), made="exported")
    assert (ran.program, ran.file) == ("exported", "remedy/forward.x")


@pytest.mark.parametrize(("fails", "error"), [
    ("its code", "its code: SyntaxError: invalid syntax"),
    ("lowering", "lowering: ValueError: no kernel for aten.gelu"),
    ("save", "saving: OSError: disk full"),
    ("load", "loading and running: RuntimeError: bad magic"),
    ("run", "loading and running: RuntimeError: missing operator"),
])
def test_a_remedy_that_fails_is_the_step_it_failed_at_and_its_error(tmp_path, fails, error):
    assert remedy_trial.run_trial(Adapter(fails), steps(fails), tmp_path, "forward", ()) == error


def test_the_record_of_no_row_is_a_skipped_stage_saying_why(tmp_path):
    with pytest.raises(phases.StageSkipped, match="^no culprit found$"):
        remedy_trial.Remedies(tmp_path / "diagnose", "lowering").record("no culprit found")


def test_the_record_keeps_the_outputs_of_the_remedies_that_ran_apart_from_their_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(remedy_trial, "named_outputs", lambda outputs: [("output_0", outputs)])  # torch's walk
    remedies = remedy_trial.Remedies(tmp_path / "diagnose", "export")
    ran = {"code": "fold()", "passes": True, "outputs": np.arange(3.0)}
    remedies.add("forward", ran, tried=[ran])
    remedies.add("decode", {"code": "keep()", "passes": False, "error": "saving: OSError: disk full"})
    rows = {"forward": {"code": "fold()", "passes": True, "tried": [{"code": "fold()", "passes": True}]},
            "decode": {"code": "keep()", "passes": False, "error": "saving: OSError: disk full"}}
    assert remedies.record("no culprit found") == (rows, {"methods": rows, "outputs": "remedy.npz",
                                                           "replaces": "export"})
    with np.load(tmp_path / "diagnose" / "remedy.npz") as saved:
        assert saved.files == ["forward.output_0"] and saved["forward.output_0"].tolist() == [0.0, 1.0, 2.0]
    failed = remedy_trial.Remedies(tmp_path / "other", "quantization")
    failed.add("decode", {"passes": False})
    assert failed.record("none")[1] == {"methods": {"decode": {"passes": False}}, "outputs": None,
                                        "replaces": "quantization"}
    assert not (tmp_path / "other" / "remedy.npz").exists()


@pytest.mark.parametrize(("artifacts", "reason"), [
    ({}, "nothing shipped to time it against: the method did not lower"),
    ({"forward": "forward.x"}, "the shipped artifact is not in the report folder"),
])
def test_a_remedy_with_nothing_shipped_to_time_it_against_says_why(tmp_path, artifacts, reason):
    job = {"model_dir": str(tmp_path / "diagnose"), "artifacts": artifacts}
    assert remedy_trial.timed_against_shipped(Adapter(), job, "forward", (), "program") == {
        "status": "not timed", "reason": reason}


class Returns(Adapter):
    """Runs every program to one number: its error against an eager output of 0."""

    def __init__(self, output: float) -> None:
        super().__init__()
        self.output = output

    def run(self, program: str, inputs: tuple[Any, ...]) -> float:
        return self.output


NOT_SHIPPED = {"status": "not timed", "reason": "nothing shipped to time it against: the method did not lower"}


@pytest.mark.parametrize(("output", "times_failing", "untimed", "latency"), [
    (0.3, False, "", NOT_SHIPPED),  # it passes: timed (here, against nothing shipped)
    (0.9, False, "", {"status": "not timed", "reason": "it does not pass against eager"}),
    (0.9, True, "", NOT_SHIPPED),  # the precision and latency phases time every remedy
    (0.3, False, "the export failed", {"status": "not timed", "reason": "the export failed"}),
])
def test_a_phase_judges_a_remedy_against_eager_and_times_it_as_the_phase_says(tmp_path, monkeypatch, output,
                                                                               times_failing, untimed, latency):
    diagnose_phase = compat_module("trial_compat", "diagnose.diagnose_phase")
    monkeypatch.setattr(diagnose_phase, "flat", lambda outputs: [outputs])  # torch's walk
    monkeypatch.setattr(diagnose_phase.culprit, "rel_l2", lambda actual, expected: abs(actual - expected))
    monkeypatch.setattr(diagnose_phase.DiagnosePhase, "TIMES_FAILING", times_failing)

    class Log:
        results = {"build": (None, {"forward": ()}), "eager": {"forward": [0.0]}}

    job = {"model_dir": str(tmp_path / "diagnose"), "methods": ["forward"], "threshold": 0.5}
    phase = diagnose_phase.DiagnosePhase(job, Returns(output), Log())
    row = phase.tried("forward", [("lowering", lambda _: "program")], untimed=untimed, remedy="fold", code="fold()")
    assert row == {"remedy": "fold", "code": "fold()", "rel_l2": output, "passes": output <= 0.5, "outputs": output,
                   "file": "remedy/forward.x", "bytes": len("program"), "sha256": hashlib.sha256(b"program").hexdigest(),
                   "latency": latency}
    failed = diagnose_phase.DiagnosePhase(job, Returns(output), Log()).tried(
        "forward", [("lowering", lambda _: 1 / 0)], name="forward-1", code="fold()")
    assert failed == {"code": "fold()", "passes": False, "error": "lowering: ZeroDivisionError: division by zero"}
