"""The report folder's lock, with a real second process holding it."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.stack_records import REFERENCE, write_stack_model

from upgrade_gate import pipeline
from upgrade_gate._atomic import sha256_file, write_json_atomic
from upgrade_gate.config.plan import load_plan
from upgrade_gate.run import _folder_lock, cache, cache_folder, guard, runner, shards, venvs

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def test_a_folder_another_run_holds_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(SRC)!r}); from upgrade_gate.run import _folder_lock; "
         f"from pathlib import Path; _folder_lock.lock_out_dir(Path({str(tmp_path)!r})); print('held', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(_folder_lock.FolderBusy) as busy:
            _folder_lock.lock_out_dir(tmp_path)
        message = str(busy.value)
        assert message.startswith(f"{tmp_path}: another upgrade-gate run is writing this report folder "
                                  f"(pid {holder.pid} since ")
        assert message.endswith("; wait for it to finish, or choose another folder with --out DIR")
    finally:
        holder.kill()
        holder.wait()
    # A holder that died (even by SIGKILL) leaves the folder free.
    deadline = time.monotonic() + 5
    while True:
        try:
            _folder_lock.lock_out_dir(tmp_path)
            break
        except _folder_lock.FolderBusy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    _folder_lock.lock_out_dir(tmp_path)  # again from the same process: already ours


def test_a_run_that_takes_the_folder_removes_what_a_killed_writer_left_and_nothing_else(tmp_path, monkeypatch):
    out = tmp_path / "report"
    model = out / "stacks" / "candidate" / "models" / "m"
    model.mkdir(parents=True)
    left = [model / ".export.json.k3j2_x.tmp", model / ".fixture.tmp.npz", out / ".results.json.abc.tmp"]
    kept = [model / "export.json", model / "notes.tmp", out / "results.json"]  # real names; one tmp not hidden
    for path in left + kept:
        path.write_text("{}")
    outside = tmp_path / "outside.tmp"
    outside.write_text("mine")
    (model / ".linked.tmp").symlink_to(outside)
    monkeypatch.setattr(_folder_lock, "HELD", {})
    _folder_lock.lock_out_dir(out)
    try:
        assert [p for p in left if p.exists()] == [] and [p.read_text() for p in kept] == ["{}"] * 3
        assert (model / ".linked.tmp").is_symlink() and outside.read_text() == "mine"
    finally:
        os.close(_folder_lock.HELD[out])


# -- every end of a session is an exit status and one message ---------------------------



def report_folder(project: Path, *models: str) -> Path:
    """A finished run's folder (records written by hand) holding ``models``, with its shard.json."""
    plan = load_plan(["--out", "out", "--models", ",".join(models)], invoked_from=project,
                     config_path=project / "pyproject.toml")
    for model in plan.models:
        for stack in ("legacy", "candidate"):
            write_stack_model(plan.settings.out_dir, stack, model.name, eager=[REFERENCE], artifact=[REFERENCE])
    shards.describe(plan, "legacy")
    shards.describe(plan, "candidate")
    return plan.settings.out_dir


def exits(capsys, call) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stopped:
        call()
    return stopped.value.code, capsys.readouterr().err


def test_a_report_on_a_folder_that_does_not_exist_creates_nothing(project, capsys, monkeypatch):
    monkeypatch.setenv("UPGRADE_GATE_CONFIG", str(project / "pyproject.toml"))
    code, err = exits(capsys, lambda: pipeline.plan_or_exit(["--out", "nowhere"], project, reporting=True))
    assert code == 2
    assert err == (f"upgrade-gate: error: {project / 'nowhere'}: no such report folder; run `nox -s compare -- --out "
                   f"{project / 'nowhere'}` first, or give the folder a run wrote with --out DIR\n")
    assert not (project / "nowhere").exists()


def test_a_report_judges_the_models_its_folder_holds(project, capsys, monkeypatch):
    monkeypatch.setenv("UPGRADE_GATE_CONFIG", str(project / "pyproject.toml"))
    out = report_folder(project, "vit-smoke@fp32", "minilm-smoke@fp32")
    # Without --models, the smoke suite would be every smoke model: "not run" for all but two.
    plan = pipeline.plan_or_exit(["--out", str(out)], project, reporting=True)
    assert [m.name for m in plan.models] == ["vit-smoke", "minilm-smoke"]
    assert pipeline.report(plan) == 0
    assert {m["model"] for m in json.loads((out / "results.json").read_text())["models"]} == {
        "vit-smoke", "minilm-smoke"}
    code, err = exits(capsys, lambda: pipeline.plan_or_exit(["--out", str(out), "--models", "vit-smoke@fp32"],
                                                             project, reporting=True))
    assert code == 2 and err == (f"upgrade-gate: error: --models: vit-smoke is not what {out / 'shard.json'} says the "
                                 "folder holds (vit-smoke, minilm-smoke); leave --models out to report on what ran\n")


def test_a_result_cache_that_cannot_be_written_is_refused_before_any_work(project, capsys, monkeypatch):
    (project / "a-file").write_text("")
    monkeypatch.setenv("UPGRADE_GATE_CACHE", str(project / "a-file" / "cache"))
    code, err = exits(capsys, lambda: pipeline.plan_or_exit(["--out", "out"], project))
    assert code == 2
    assert err == (f"upgrade-gate: error: {project / 'a-file' / 'cache' / 'results'}: result cache is not writable "
                   "(Not a directory); set UPGRADE_GATE_CACHE, or `cache =` in [tool.upgrade-gate], to a folder you "
                   "can write\n")


def test_a_damaged_output_file_is_incomplete_naming_it(project, capsys):
    out = report_folder(project, "vit-smoke@fp32")
    npz = out / "stacks" / "candidate" / "models" / "vit-smoke" / "artifact.npz"
    npz.write_bytes(npz.read_bytes()[:40])  # truncated
    plan = load_plan(["--out", str(out), "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    assert pipeline.report(plan) == 3
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "INCOMPLETE"
    numerics = next(g for g in verdict["gates"] if g["gate"] == "numerics")
    assert numerics["status"] == "incomplete" and numerics["note"].startswith(
        "stacks/candidate/models/vit-smoke/artifact.npz is damaged (BadZipFile: ")
    assert numerics["note"].endswith(f"run `nox -s compare -- --out {out}` again (the result cache copies the "
                                     "phase back, or the phase runs again)")
    assert verdict["incomplete"][-1].startswith("run `nox -s compare` again with the same options")
    assert "Verdict: INCOMPLETE" in capsys.readouterr().out


def test_a_damaged_artifact_is_incomplete_not_the_candidates_failure(project):
    out = report_folder(project, "vit-smoke@fp32")
    artifact = out / "stacks" / "candidate" / "models" / "vit-smoke" / "forward.pte"
    data = bytearray(artifact.read_bytes())
    data[10] ^= 0xFF
    artifact.write_bytes(bytes(data))
    plan = load_plan(["--out", str(out), "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    assert pipeline.report(plan) == 3
    export = next(g for g in json.loads((out / "verdict.json").read_text())["gates"] if g["gate"] == "export")
    assert export["status"] == "incomplete"
    assert export["note"].startswith("stacks/candidate/models/vit-smoke/forward.pte is damaged (its SHA-256 is not "
                                     "the one the export recorded)")


def guarded_call(error: BaseException):
    @guard.guarded
    def session() -> None:
        raise error
    return session


def test_a_fault_of_the_tool_is_one_message_and_a_log_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_folder_lock, "HELD", {tmp_path: -1})
    code, err = exits(capsys, guarded_call(ZeroDivisionError("division by zero")))
    assert code == 3 and "Traceback" not in err
    log = tmp_path / "upgrade-gate-error.log"
    assert err == (f"upgrade-gate: incomplete: upgrade-gate failed (ZeroDivisionError: division by zero); the "
                   f"traceback is in {log} — please report it. What finished is kept: running the same command "
                   "again resumes\n")
    assert "Traceback (most recent call last)" in log.read_text() and "ZeroDivisionError" in log.read_text()


def test_a_fault_with_no_report_folder_held_logs_into_the_result_cache(tmp_path, capsys, monkeypatch):
    """Issue 61, N21: a fault before any report folder was held (a bad `--out` of `nox -s benchmark`) wrote its
    traceback into the system's temporary folder, outside the report folder and the cache."""
    monkeypatch.setattr(_folder_lock, "HELD", {})
    monkeypatch.setattr(cache_folder, "USING", {})
    monkeypatch.setenv("UPGRADE_GATE_CACHE", str(tmp_path / "default-cache"))
    code, err = exits(capsys, guarded_call(ZeroDivisionError("division by zero")))
    log = tmp_path / "default-cache" / "upgrade-gate-error.log"
    assert code == 3 and f"the traceback is in {log} — please report it" in err
    assert "ZeroDivisionError" in log.read_text()
    monkeypatch.setattr(cache_folder, "USING", {tmp_path / "own-cache": -1})  # the cache a run uses (`cache =` says which)
    (tmp_path / "own-cache").mkdir()
    code, err = exits(capsys, guarded_call(ZeroDivisionError("division by zero")))
    assert code == 3 and f"{tmp_path / 'own-cache' / 'upgrade-gate-error.log'} — please report it" in err


def test_an_interrupted_session_says_it_resumes(capsys):
    code, err = exits(capsys, guarded_call(KeyboardInterrupt()))
    assert code == 3 and err == ("upgrade-gate: incomplete: the run was stopped (Ctrl-C or SIGTERM); what finished is "
                                 "kept: run the same command again and it resumes\n")


def test_a_full_disk_is_named_with_its_free_space(tmp_path, capsys):
    code, err = exits(capsys, guarded_call(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.npz"))))
    assert code == 3
    assert err.startswith(f"upgrade-gate: incomplete: no space left on the disk that holds {tmp_path / 'x.npz'} "
                          "(mounted at /")
    assert "then run the same command again: it resumes" in err


def test_nox_control_flow_and_usage_errors_pass_through(capsys):
    with pytest.raises(SystemExit) as stopped:
        guarded_call(SystemExit(2))()
    assert stopped.value.code == 2


def test_a_full_disk_that_names_no_file_is_found_among_the_places_the_run_writes(small_disk, monkeypatch):
    """write() and sendfile() run out of room without naming a file: the message names the report
    folder on the full disk, not wherever the session happens to run."""
    out = small_disk / "report"
    out.mkdir()
    with (small_disk / "filler").open("wb", buffering=0) as stream, pytest.raises(OSError) as raised:
        while True:
            stream.write(b"\0" * 4096)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename is None
    monkeypatch.setitem(_folder_lock.HELD, out, -1)
    message = guard.disk_full(raised.value)
    assert message.startswith(f"no space left on the disk that holds {out} (mounted at {small_disk}: 0 B free of 2.0 MiB)"), message


def test_a_lock_file_that_cannot_be_written_on_a_full_disk_is_named(small_disk):
    """The lock's first write (os.write names no file) ran out before the folder was held: the message
    named the result cache's disk, which had room."""
    out = small_disk / "report"
    out.mkdir()
    with (small_disk / "filler").open("wb", buffering=0) as stream, pytest.raises(OSError):
        while True:
            stream.write(b"\0" * 4096)
    with pytest.raises(OSError) as raised:
        _folder_lock.lock_out_dir(out)
    assert raised.value.errno == errno.ENOSPC and out not in _folder_lock.HELD
    message = guard.disk_full(raised.value)
    assert message.startswith(f"no space left on the disk that holds {out / _folder_lock.LOCK_FILE} (mounted at "
                              f"{small_disk}: 0 B free of 2.0 MiB)"), message


def _three_mib(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(0).bytes(3 * 2**20))
    return path


def test_a_full_report_folder_is_named_when_the_cache_has_room(tmp_path, small_disk):
    # A cache hit copied into a report folder on the full disk: shutil names the copy's source
    # (in the cache, on a disk with room) as the error's filename.
    store = cache.ResultCache(tmp_path / "cache")
    hit = store.store("candidate", "m", "export", "k" * 64, [_three_mib(tmp_path / "staged" / "forward.pte")], {})
    target = small_disk / "report" / "stacks" / "candidate" / "forward.pte"
    target.parent.mkdir(parents=True)
    with pytest.raises(OSError) as raised:
        cache.copy_file(hit.path / "forward.pte", target)
    assert raised.value.errno == errno.ENOSPC
    message = guard.disk_full(raised.value)
    assert message.startswith(f"no space left on the disk that holds {target} (mounted at {small_disk}: "), message
    assert not [p for p in target.parent.iterdir()]  # and no half copy


def test_a_full_cache_is_named_when_the_report_folder_has_room(tmp_path, small_disk):
    store = cache.ResultCache(small_disk / "cache")
    report_file = _three_mib(tmp_path / "report" / "forward.pte")
    with pytest.raises(OSError) as raised:
        store.store("candidate", "m", "export", "k" * 64, [report_file], {})
    assert raised.value.errno == errno.ENOSPC
    message = guard.disk_full(raised.value)
    entry = small_disk / "cache" / "candidate" / "m" / "export"
    assert message.startswith(f"no space left on the disk that holds {entry}/.{'k' * 64}."), message
    assert f"(mounted at {small_disk}: " in message
    assert list(entry.iterdir()) == []  # no half entry left in the cache


def test_a_record_that_does_not_fit_names_its_own_path(tmp_path, small_disk):
    record = small_disk / "report" / "results.json"
    with pytest.raises(OSError) as raised:
        write_json_atomic(record, {"outputs": ["x" * 1000] * 3000})
    assert raised.value.errno == errno.ENOSPC
    assert guard.disk_full(raised.value).startswith(f"no space left on the disk that holds {record} (mounted at "
                                                       f"{small_disk}: ")
    assert list(record.parent.iterdir()) == []


@pytest.mark.shares_machine
@pytest.mark.integration
def test_a_reused_venv_holds_its_recipe_and_nothing_left_over(tmp_path):
    # Real uv, a real venv, real distributions from the index (small ones: uv links them from its cache).
    import nox.virtualenv

    uv = nox.virtualenv.find_uv()[1]
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "-p", "3.11", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"

    def make(installs: list[str]) -> list[str]:
        recipe = {"installs": installs}
        venvs.empty_venv_unless_made_from(uv, bin_dir, recipe)
        assert venvs.install(uv, bin_dir, installs, cwd=tmp_path) is None
        venvs.recipe_installed(bin_dir, recipe)
        return sorted(d.partition("==")[0] for d in cache.installed_distributions(venv))

    assert make(["six", "idna"]) == ["idna", "six"]
    assert make(["six"]) == ["six"]  # idna was dropped from the recipe: gone, not left behind
    # The same recipe again: nothing removed (something installed by hand beside it stays).
    subprocess.run([uv, "pip", "install", "-q", "--python", str(bin_dir / "python"), "idna"], check=True, timeout=120)
    assert make(["six"]) == ["idna", "six"]


def test_a_local_projects_metadata_is_part_of_its_venvs_recipe(tmp_path):
    from upgrade_gate.config.specs import load_spec

    spec = load_spec(REPO / "envs" / "legacy.toml", adapters_dir=REPO / "compat", is_baseline=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'team'\ndependencies = ['timm']\n")
    before = venvs.venv_recipe(spec, ["-e", ".[test]"], tmp_path)
    assert before["local"] == {str(tmp_path / "pyproject.toml"): sha256_file(tmp_path / "pyproject.toml")}
    assert before["requirements"] == [str(r) for r in spec.requirements] and before["installs"] == ["-e", ".[test]"]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'team'\ndependencies = []\n")
    assert venvs.venv_recipe(spec, ["-e", ".[test]"], tmp_path) != before  # timm dropped: the venv is made again
    assert venvs.venv_recipe(spec, ["timm==1.0.9"], tmp_path)["local"] == {}


def test_a_venv_without_installs_is_the_same_recipe_from_any_folder(tmp_path):
    """Two teams' folders (or two tests') run the spec alone: one venv serves both, as it is, where each run
    from another folder had emptied and reinstalled it (and two at once refused each other). A relative
    install is read from the folder, so there the folder is part of the recipe."""
    from upgrade_gate.config.specs import load_spec

    spec = load_spec(REPO / "envs" / "candidate.toml", adapters_dir=REPO / "compat", is_baseline=False)
    one, other = tmp_path / "one", tmp_path / "other"
    assert venvs.venv_recipe(spec, [], one) == venvs.venv_recipe(spec, [], other)
    assert venvs.venv_recipe(spec, ["-e", "."], one) != venvs.venv_recipe(spec, ["-e", "."], other)


def test_a_venv_another_run_uses_is_not_emptied_under_it(tmp_path, capsys):
    """Two runs sharing a venvs folder: while one uses a stack's venv (a shared lock, held by its process), a
    second whose recipe differs is refused with exit 2 instead of emptying the venv under the first's workers;
    the same recipe may share it; once the first is gone, the venv is made again."""
    venv = tmp_path / "venv"
    bin_dir = venv / "bin"
    bin_dir.mkdir(parents=True)
    venvs.recipe_installed(bin_dir, {"installs": ["six"]})
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); time.sleep(120)", str(venv / venvs.VENV_LOCK)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        venvs.empty_venv_unless_made_from("uv", bin_dir, {"installs": ["six"]})  # the same recipe: shared
        with pytest.raises(SystemExit) as refused:
            venvs.empty_venv_unless_made_from("uv", bin_dir, {"installs": ["idna"]})
        assert refused.value.code == 2
        assert f"{venv}: another upgrade-gate run is using this stack's venv" in capsys.readouterr().err
        assert (venv / venvs.VENV_RECIPE).is_file()  # not emptied
    finally:
        holder.kill()
        holder.wait()
    venvs.empty_venv_unless_made_from("uv", bin_dir, {"installs": ["idna"]})
    assert not (venv / venvs.VENV_RECIPE).exists()  # emptied, to be made of its new recipe
    venvs.recipe_installed(bin_dir, {"installs": ["idna"]})


def test_a_project_factory_whose_method_has_no_allowed_name_is_the_models_usage_error(tmp_path, capsys, monkeypatch):
    """Issue 61, N11/N12: a method named ``../…/escaped`` wrote its artifacts outside, one with a '/' failed the
    candidate's export (NO-GO). The factories' check refuses it before any export (the worker's side, and the
    export's own refusal: tests/test_confined.py)."""
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\nmine = "models.nets:tiny"\n')
    plan = load_plan(["--out", "out"], invoked_from=tmp_path, config_path=config)
    refused = {"ok": False, "refused_method": "x/y", "error": "method 'x/y': not a name upgrade-gate can use"}
    monkeypatch.setattr(runner, "check_factories", lambda plan, spec, bin_dir: {"mine": refused})
    code, err = exits(capsys, lambda: pipeline.check_project_models_or_exit(plan, plan.stack("legacy"), Path("/")))
    assert code == 2
    assert err == (f"upgrade-gate: error: {config}: tool.upgrade-gate.models.mine: factory 'models.nets:tiny' returns "
                   "a ModelCase whose method 'x/y' is not a name upgrade-gate can use for a method's files and records: "
                   "1 to 64 letters, digits, '-' or '_', starting with a letter or digit, and not 'program'; e.g. 'x-y'; "
                   "rename the method (a key of its ModelCase's methods)\n")


@pytest.mark.parametrize("error", [
    "AttributeError: module 'models.nets' has no attribute 'missing'",
    "ModuleNotFoundError: No module named 'models.network'",
    "RuntimeError: weights file checkpoints/tiny.pt not found",
])
def test_a_bad_project_factory_is_one_usage_error_naming_the_entry(tmp_path, capsys, monkeypatch, error):
    """The parent's side of a factory the worker could not use (the worker's side: tests/test_project_models.py)."""
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\nmine = "models.nets:tiny"\n')
    plan = load_plan(["--out", "out"], invoked_from=tmp_path, config_path=config)
    spec = plan.stack("legacy")
    monkeypatch.setattr(runner, "check_factories", lambda plan, spec, bin_dir: {"mine": {"ok": False, "error": error}})
    with pytest.raises(SystemExit) as ended:
        pipeline.check_project_models_or_exit(plan, spec, Path("/nowhere/bin"))
    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        f"upgrade-gate: error: {config}: tool.upgrade-gate.models.mine: factory 'models.nets:tiny' failed in stack "
        f"'legacy': {error}; the factory must be importable from {tmp_path} and return (torch.nn.Module, tuple of "
        "tensors)\n")


@pytest.mark.parametrize("missing", ["timm", "cv2.dnn"])
def test_a_package_the_factory_imports_and_no_stack_has_is_the_configurations_to_list(tmp_path, capsys, monkeypatch,
                                                                                       missing):
    """Issue 63: a YOLO team's factories failed on `import timm` in every release, blamed on the releases. The
    package is the team's to list in the extra requirements: exit 2 naming the key (the error's top package)."""
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\nmine = "team.nets:tiny"\n')
    plan = load_plan(["--out", "out"], invoked_from=tmp_path, config_path=config)
    error = f"ModuleNotFoundError: No module named '{missing}'"
    monkeypatch.setattr(runner, "check_factories", lambda plan, spec, bin_dir: {"mine": {"ok": False, "error": error}})
    with pytest.raises(SystemExit) as ended:
        pipeline.check_project_models_or_exit(plan, plan.stack("legacy"), Path("/nowhere/bin"))
    assert ended.value.code == 2
    top = missing.split(".")[0]
    assert capsys.readouterr().err == (
        f"upgrade-gate: error: {config}: tool.upgrade-gate.models.mine: factory 'team.nets:tiny' failed in stack "
        f"'legacy': {error}; install the package that provides '{top}' into every stack: "
        f'[tool.upgrade-gate.extra-requirements] "*" = ["<its distribution>"] in {config}\n')
