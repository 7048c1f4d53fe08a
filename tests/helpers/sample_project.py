"""tests/sample_project: a team's repository with planted calls the API scan must find, and its tests."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE_PROJECT = REPO / "tests" / "sample_project"
# The team's test that passes on the baseline and fails on the candidate (torch.load's weights_only default).
BREAKS = "tests/test_checkpoint.py::test_checkpoint_round_trip"


def copy_sample_project(folder: Path) -> Path:
    root = folder / "edge-app"
    shutil.copytree(SAMPLE_PROJECT, root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", "report"))
    return root


# Every planted call of the sample project: (file, the call as written, code).
PLANTED = [
    ("edge_app/export.py", "torch.jit.trace(model, example)", "UG101"),
    ("edge_app/export.py", "optimize_for_mobile(traced)", "UG102"),
    ("edge_app/export.py", "optimized._save_for_lite_interpreter(str(path))", "UG103"),
    ("edge_app/runtime.py", "_load_for_lite_interpreter(str(path))", "UG104"),
    ("edge_app/quantize.py", "prepare_fx(copy.deepcopy(model)", "UG105"),
    ("edge_app/quantize.py", "get_default_qconfig_mapping(ENGINE)", "UG105"),
    ("edge_app/quantize.py", "convert_fx(prepared)", "UG105"),
    ("edge_app/checkpoint.py", "torch.load(path)", "TOR102"),
    ("edge_app/model.py", "torch.cpu.amp.autocast()", "UG108"),
]


def where_planted(file: str, call: str) -> tuple[int, int]:
    lines = (SAMPLE_PROJECT / file).read_text().splitlines()
    found = [(number, line.index(call) + 1) for number, line in enumerate(lines, start=1) if call in line]
    assert len(found) == 1, f"{call!r} should be on exactly one line of {file}"
    return found[0]
