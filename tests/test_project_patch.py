"""migrate/project.diff (issue 64, item 3): the scan's rewrites of the calls the move changes (compat/scan_rewrites.py),
what they leave as found, and the patch made of them (upgrade_gate.project.patch). The rewritten deploy path run in
the candidate stack: tests/test_project_compat.py."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest
from test_scan import scan

from upgrade_gate.migrate._project import project_diff
from upgrade_gate.project.gather import allowing
from upgrade_gate.project.patch import patch_of
from upgrade_gate.schema.project import ProjectResults, ScanResults
from upgrade_gate.schema.reader import Reader

DEPLOY = """\
import torch
from torch.utils.mobile_optimizer import optimize_for_mobile
from torch.jit.mobile import _load_for_lite_interpreter


def ship(model, example, path):
    optimize_for_mobile(torch.jit.trace(model, (example,)))._save_for_lite_interpreter(path)
    return _load_for_lite_interpreter(path)
"""


def test_a_deploy_path_written_in_one_line_is_rewritten_inside_out() -> None:
    text = scan.rewrite_source(DEPLOY, "ship.py")
    body = ast.parse(text)
    assert ("pathlib.Path(path).write_bytes(to_edge_transform_and_lower(torch.export.export(model, (example,)), "
            "partitioner=[XnnpackPartitioner()]).to_executorch().buffer)") in text
    assert "return _ExecuTorchModule(path)" in text
    # The Lite Interpreter's imports are gone (nothing uses them); what the rewrites call is imported.
    imported = {(node.module, alias.name) for node in ast.walk(body) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == {("executorch.exir", "to_edge_transform_and_lower"), ("executorch.runtime", "Runtime"),
                        ("executorch.backends.xnnpack.partition.xnnpack_partitioner", "XnnpackPartitioner")}
    assert [n.name for n in body.body if isinstance(n, ast.ClassDef)] == ["_ExecuTorchModule"]
    findings = scan.scan_source(DEPLOY, "ship.py")
    assert sorted(f["code"] for f in findings if f.get("rewritten")) == ["UG101", "UG102", "UG103", "UG104"]


@pytest.mark.parametrize("call", [
    "torch.jit.trace(model, example, check_trace=False)",  # an option the export has no counterpart for
    "torch.jit.trace(model, make_inputs())",  # example inputs neither a tuple nor a name: evaluated twice
    "torch.jit.script(model)",  # no example inputs to export with
])
def test_a_call_whose_arguments_do_not_say_enough_is_left_as_found_with_its_hint(call: str) -> None:
    source = f"import torch\n\ndef capture(model, example):\n    return {call}\n"
    assert scan.rewrite_source(source) == source
    (finding,) = scan.scan_source(source)
    assert "rewritten" not in finding and finding["replacement"]


def test_an_import_something_else_still_uses_stays() -> None:
    source = DEPLOY + "\n\nOPTIMIZE = optimize_for_mobile\n"
    text = scan.rewrite_source(source)
    assert "from torch.utils.mobile_optimizer import optimize_for_mobile" in text
    assert "from torch.jit.mobile import _load_for_lite_interpreter" not in text


def test_a_call_a_version_guard_keeps_from_the_candidate_is_not_rewritten() -> None:
    source = ("import torch\n\nif torch.__version__ >= '2.5':\n    pass\nelse:\n"
              "    traced = torch.jit.trace(m, (x,))\n")
    assert scan.rewrite_source(source, torch_versions=["2.8.0"]) == source


def _scanned(root: Path, allow: dict[str, str] | None = None) -> ScanResults:
    record = scan.scan(root, ["ship.py", "other.py"])
    return allowing(ScanResults.from_reader(Reader(record, "scan.json")), allow or {})


def test_the_patch_applies_with_git_and_leaves_out_what_the_team_allows_or_changed(tmp_path: Path) -> None:
    root = tmp_path / "team"
    root.mkdir()
    (root / "ship.py").write_text(DEPLOY)
    (root / "other.py").write_text("import torch\nstate = torch.load(p)\n")
    found = _scanned(root)
    patch = patch_of(found, root)
    assert sorted(patch.files) == ["other.py", "ship.py"] and patch.left_out == {}
    diff_file = tmp_path / "project.diff"
    diff_file.write_text(patch.unified_diff(root))
    applied = tmp_path / "applied"
    shutil.copytree(root, applied)
    subprocess.run(["git", "apply", str(diff_file)], cwd=applied, check=True)
    assert (applied / "ship.py").read_text() == patch.files["ship.py"]
    assert (root / "ship.py").read_text() == DEPLOY  # the team's own files are never changed

    # A finding the team allows (not a migration item) keeps its file out; so does a file changed since the scan.
    allowed = patch_of(_scanned(root, {"TOR102 other.py": "our own loader"}), root)
    assert sorted(allowed.files) == ["ship.py"]
    assert allowed.left_out["other.py"].startswith("it holds TOR102 at line 2, which project.scan-allow allows")
    (root / "ship.py").write_text(DEPLOY + "# edited\n")
    assert patch_of(found, root).left_out == {"ship.py": "changed since the scan: run the scan again"}

    # migrate/README.md says why, and project.diff is only what applies.
    project = ProjectResults(root=str(root), install=(".",), test=("pytest",), allow={}, stacks={}, diffs={},
                             scan=found)
    text, said = project_diff(project, "candidate")
    assert text is not None and "other.py" in text and "ship.py" not in text.split("# review it")[-1]
    assert "ship.py: left out — changed since the scan" in "\n".join(said)
    assert "The project's tests did not run with it" in said[0]


def test_a_class_torch_load_refused_is_allowed_where_the_project_defines_it_and_nowhere_else(tmp_path: Path) -> None:
    """torch.load(..., weights_only=True), as the patch writes it, refuses a class it was not told of; the patched
    run's own words name it, and the patch allows it after its class statement — in its module of the project, one
    that imports torch. A class of another package, or of a module without torch, is left as found."""
    from upgrade_gate.project.patch import Patch, refused_globals, with_safe_globals

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "ckpt.py").write_text("import torch\n\n\nclass Config:\n    lr = 1.0\n\n\ndef load(p):\n"
                                              "    return torch.load(p, weights_only=True)\n")
    (tmp_path / "app" / "plain.py").write_text("class Other:\n    pass\n")
    said = ("UnpicklingError: Weights only load failed. WeightsUnpickler error: Unsupported global: GLOBAL "
            "app.ckpt.Config was not an allowed global by default.")
    refused = refused_globals([said, said, "Unsupported global: GLOBAL app.plain.Other was not allowed",
                               "Unsupported global: GLOBAL numpy.dtype was not allowed"])
    assert refused == ("app.ckpt.Config", "app.plain.Other", "numpy.dtype")
    patched = with_safe_globals(Patch(files={}, left_out={}), tmp_path, refused)
    assert list(patched.files) == ["app/ckpt.py"]
    assert patched.files["app/ckpt.py"] == (
        "import torch\n\n\nclass Config:\n    lr = 1.0\n\n\ntorch.serialization.add_safe_globals([Config])  # "
        "upgrade-gate: torch.load(..., weights_only=True) reads it\n\n\ndef load(p):\n"
        "    return torch.load(p, weights_only=True)\n")
    # On a file the patch already rewrites, its rewrite is what is amended, once however often it is asked.
    again = with_safe_globals(patched, tmp_path, refused)
    assert again.files == patched.files
