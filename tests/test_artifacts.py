"""Artifacts kept once: in the result cache, named by digest from the report folder (run/artifacts.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers.stack_records import REFERENCE, write_stack_model

from upgrade_gate import layout
from upgrade_gate.config.plan import load_plan
from upgrade_gate.judge._comparisons import damaged_artifacts
from upgrade_gate.measure.rounds import runnable_stacks
from upgrade_gate.run import artifacts, cache
from upgrade_gate.schema.records import load_stack_model


def exported(project: Path, *, stored: bool = True):
    """A report folder whose vit-smoke export (forward.pte) is also a cache entry, as the runner leaves them. The
    cache is the project's own: a run of another test beside it (the second pass's) stores vit-smoke's exports in
    the shared one, which keeps the newest two per phase and had evicted this test's entry."""
    config = project / "pyproject.toml"
    if 'cache = "cache"' not in config.read_text():
        config.write_text(config.read_text() + 'cache = "cache"\n')
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    model_dir = layout.model_dir(out, "candidate", "vit-smoke")
    hit = cache.ResultCache(plan.settings.cache_dir).store(
        "candidate", "vit-smoke", "export", "k" * 64, [model_dir / "forward.pte", model_dir / "export.json"], {})
    layout.key_record_file(model_dir, "export").write_text(json.dumps(
        {"key": "k" * 64, "stored": stored, "reused_from": None, "files": hit.files}))
    return plan, model_dir, hit


def test_an_artifact_the_cache_holds_leaves_the_folder_and_comes_back_verified(project):
    plan, model_dir, hit = exported(project)
    shipped = (model_dir / "forward.pte").read_bytes()
    freed = artifacts.release(plan)
    assert freed == len(shipped) and not (model_dir / "forward.pte").exists()
    record = json.loads(layout.key_record_file(model_dir, "export").read_text())
    assert record["released"] == ["forward.pte"] and record["files"]["forward.pte"]["sha256"] == hit.files[
        "forward.pte"]["sha256"]
    # Absent by design is not damage; the report judges from the records alone.
    assert damaged_artifacts(load_stack_model(plan.settings.out_dir, "candidate", "vit-smoke")) == []
    # The legacy artifact has no cache entry here: the only copy stays in the folder.
    assert (layout.model_dir(plan.settings.out_dir, "legacy", "vit-smoke") / "forward.pte").is_file()
    assert artifacts.release(plan) == 0  # nothing more to release

    assert artifacts.restore(plan, "candidate", "vit-smoke") is None
    assert (model_dir / "forward.pte").read_bytes() == shipped
    assert "released" not in json.loads(layout.key_record_file(model_dir, "export").read_text())


def test_a_released_artifact_the_cache_lost_is_named_with_the_way_back(project):
    plan, model_dir, hit = exported(project)
    artifacts.release(plan)
    shutil.rmtree(hit.path)  # pruned, or another machine's cache
    problem = artifacts.restore(plan, "candidate", "vit-smoke")
    assert problem is not None and problem.startswith(
        "stacks/candidate/models/vit-smoke/forward.pte was left in the result cache by digest")
    assert "no longer holds it" in problem and "--keep-artifacts" in problem and "compare -- --out" in problem
    # The measure session says so instead of timing nothing.
    for stack in ("legacy", "candidate"):
        info = layout.stack_file(plan.settings.out_dir, stack)
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(json.dumps({"installed": {"executable": shutil.which("python3")}}))
    runnable, skipped = runnable_stacks(plan, plan.models[0])
    assert [spec.name for spec, _ in runnable] == ["legacy"] and skipped == {"candidate": problem}


def test_an_artifact_no_entry_vouches_for_stays(project):
    """Nothing is lost: a phase the cache did not store (a timeout, a crash) keeps its only copy in the folder,
    and so does an artifact whose entry lists other bytes under the same name."""
    plan, model_dir, _ = exported(project, stored=False)
    assert artifacts.release(plan) == 0 and (model_dir / "forward.pte").is_file()

    plan, model_dir, hit = exported(project)
    manifest = json.loads((hit.path / cache.MANIFEST).read_text())
    manifest["files"]["forward.pte"]["sha256"] = "0" * 64
    (hit.path / cache.MANIFEST).write_text(json.dumps(manifest))
    assert artifacts.release(plan) == 0 and (model_dir / "forward.pte").is_file()
