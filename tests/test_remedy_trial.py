"""compat/diagnose/remedy_trial.py: a remedy lowered, saved, loaded and run, each step named for its error, and
the remedy stage's record — with a stand-in adapter, in the test's Python (no torch)."""

from __future__ import annotations

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
                                   file="remedy/forward-1.x", bytes=len("lowered program"))
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
        remedy_trial.Remedies(tmp_path / "diagnose").record("no culprit found")


def test_the_record_keeps_the_outputs_of_the_remedies_that_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(remedy_trial, "named_outputs", lambda outputs: [("output_0", outputs)])  # torch's walk
    remedies = remedy_trial.Remedies(tmp_path / "diagnose")
    remedies.rows = {"forward": {"passes": True}, "decode": {"passes": False, "error": "saving: OSError: disk full"}}
    remedies.keep("forward", np.arange(3.0))
    result, details = remedies.record("no culprit found")
    assert result == remedies.rows and details == {"methods": remedies.rows, "outputs": "remedy.npz"}
    with np.load(tmp_path / "diagnose" / "remedy.npz") as saved:
        assert saved.files == ["forward.output_0"] and saved["forward.output_0"].tolist() == [0.0, 1.0, 2.0]
    failed = remedy_trial.Remedies(tmp_path / "other")
    failed.rows = {"decode": {"passes": False}}
    assert failed.record("none")[1] == {"methods": {"decode": {"passes": False}}, "outputs": None}
    assert not (tmp_path / "other" / "remedy.npz").exists()


@pytest.mark.parametrize(("artifacts", "reason"), [
    ({}, "nothing shipped to time it against: the method did not lower"),
    ({"forward": "forward.x"}, "the shipped artifact is not in the report folder"),
])
def test_a_remedy_with_nothing_shipped_to_time_it_against_says_why(tmp_path, artifacts, reason):
    job = {"model_dir": str(tmp_path / "diagnose"), "artifacts": artifacts}
    assert remedy_trial.timed_against_shipped(Adapter(), job, "forward", (), "program") == {
        "status": "not timed", "reason": reason}
