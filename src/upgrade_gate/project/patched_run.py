"""A candidate's run of the project's tests with the scan's rewrites (migrate/project.diff) applied to a copy of the
project, in `nox -s "project(<candidate>)"` after the scan: the team's files are never touched; the copy, in the report
folder's project/patched/<stack>/tree/, is gone after the run; the outcomes are kept as the unpatched run's are."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate._confined import remove_tree
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.project_settings import ProjectSettings
from upgrade_gate.errors import RecordError
from upgrade_gate.layout import JUNIT_FILE, RUN_FILE
from upgrade_gate.project._junit import read_junit
from upgrade_gate.project.gather import allowing, read_scan
from upgrade_gate.project.patch import Patch, patch_of, patched_copy, refused_globals, with_safe_globals
from upgrade_gate.project.session import PATCHED_PHASE, run_tests_in, write_run
from upgrade_gate.run.workers import venv_env

TREE = "tree"  # the patched copy, in project/patched/<stack>/ while the tests run


def run_patched_tests(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path,
                      log: Callable[[str], Any] = print) -> dict[str, Any] | None:
    """Run the project's tests in a candidate on a copy of the project with the scan's rewrites applied (what
    migrate/project.diff holds; the team's files are not touched), into project/patched/<stack>/; its run record,
    or None where the scan (which runs first) rewrote nothing, or ``test-patched = false``."""
    out = plan.settings.out_dir
    folder = layout.patched_project_dir(out, stack)
    if folder.exists():
        remove_tree(folder, within=out)  # an older run's outcomes must not pass for this one's
    if not project.test_patched:
        return None
    try:
        scan = allowing(read_scan(layout.scan_file(out)), dict(project.scan_allow))
    except (OSError, ValueError, RecordError):
        return None  # no scan for this report: the report says so, from the scan's own record
    patch = patch_of(scan, project.root)
    if not patch.files:
        return None
    record = _run_on_copy(plan, project, stack, bin_dir, folder, patch, log)
    # A class torch.load (weights_only=True, as the patch writes it) refused: allowed where the project defines it,
    # and the tests run again with that patch — the one migrate/project.diff then holds (its run record says which).
    refused = refused_globals(case.message for case in read_junit(folder / JUNIT_FILE).values()
                              ) if record["status"] == "ran" and (folder / JUNIT_FILE).is_file() else ()
    amended = with_safe_globals(patch, project.root, refused)
    if amended.files == patch.files:
        return record
    record = _run_on_copy(plan, project, stack, bin_dir, folder, amended, log)
    record["safe_globals"] = list(refused)
    write_json_atomic(folder / RUN_FILE, record)
    return record


def _run_on_copy(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path, folder: Path, patch: Patch,
                 log: Callable[[str], Any]) -> dict[str, Any]:
    """The tests run on a copy of the project with ``patch`` applied (its run record); the copy removed after."""
    out = plan.settings.out_dir
    tree = folder / TREE
    tree.mkdir(parents=True)
    try:
        patched_copy(project.root, patch, tree)
        copy = replace(project, root=tree)
        # The copy's own folders lead the import path (a src layout's src/ too).
        paths = [tree, *([tree / "src"] if (tree / "src").is_dir() else [])]
        isolated = _imports_from(tree, paths, bin_dir, patch)
        if isolated is not None:
            return write_run(folder, stack, bin_dir, {"status": "not-started", "command": [], "exit_code": None,
                                                       "duration_s": 0.0, "problem": isolated})
        return run_tests_in(plan, copy, stack, bin_dir, folder, PATCHED_PHASE, "project: tests with project.diff", log,
                          keyed_root=project.root, source_paths=paths)
    finally:
        remove_tree(tree, within=out)


def _imports_from(tree: Path, paths: list[Path], bin_dir: Path, patch: Patch) -> str | None:
    """None where the copy's own modules are what the tests import (its folders lead the import path); else why
    not: an install that imports the team's folder whatever the path (a setuptools editable finder) would have the
    tests run the unpatched files."""
    modules = sorted({parts[1] if parts[0] == "src" and len(parts) > 1 else parts[0].removesuffix(".py")
                      for parts in (Path(name).parts for name in patch.files if name.endswith(".py"))})
    probe = ("import importlib.util, json, sys\n"
             "specs = {m: importlib.util.find_spec(m) for m in sys.argv[1:]}\n"
             "print(json.dumps({m: s and (s.origin or next(iter(s.submodule_search_locations or []), None))"
             " for m, s in specs.items()}))")
    env = venv_env(bin_dir) | {"PYTHONPATH": os.pathsep.join(str(path) for path in paths)}
    found = subprocess.run([str(bin_dir / "python"), "-c", probe, *modules], cwd=tree, env=env,
                           capture_output=True, text=True, check=False)
    try:
        origins = json.loads(found.stdout)
    except ValueError:
        return f"could not tell where the tests import {', '.join(modules)} from: {found.stderr.strip()[-500:]}"
    elsewhere = {m: o for m, o in origins.items() if o is not None and not Path(o).resolve().is_relative_to(tree)}
    if elsewhere:
        module, origin = next(iter(elsewhere.items()))
        return (f"run from the patched copy, the tests would import {module} from {origin}, not from the copy "
                f"(an install that pins the team's folder): not run")
    return None
