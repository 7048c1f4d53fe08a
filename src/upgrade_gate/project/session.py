"""The team's own project in every stack: its tests run in each (`nox -s "project(<stack>)"` → project/<stack>/)
and the API scan of its source (`nox -s scan`: compat/scan.py → project/scan.json). The outcomes travel as the
JUnit XML the test command wrote; the warnings and progress JUnit has no room for come from upgrade-gate's pytest
plugin (compat/pytest_plugin/), which a pytest command loads with ``-p``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from upgrade_gate import __version__, layout
from upgrade_gate._atomic import sha256_file, write_json_atomic
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.project_settings import ProjectSettings, runs_pytest
from upgrade_gate.layout import JUNIT_FILE, LOG_FILE, PROGRESS_FILE, RUN_FILE, TOOL_ROOT, WARNINGS_FILE
from upgrade_gate.project import source
from upgrade_gate.run import cache, packages, supervisor
from upgrade_gate.run.progress import Progress
from upgrade_gate.run.workers import venv_env
from upgrade_gate.schema.records import RECORDS_VERSION

# The scan runs in a venv of its own: TorchFix's libcst pin is nobody else's business.
SCAN_PYTHON = "3.11"
SCAN_REQUIREMENTS = ("torchfix==0.7.0",)
# The pytest plugin: its folder alone on PYTHONPATH (nothing else of ours can shadow a team's module), and `-p
# upgrade_gate_pytest` for a pytest command; not PYTEST_PLUGINS, which would reach pytest under tox or make too and
# fail the team's run on an import. The variables are the plugin's (a test keeps them equal).
PLUGIN_DIR = TOOL_ROOT / "compat" / "pytest_plugin"
PLUGIN = "upgrade_gate_pytest"
PROGRESS_ENV = "UPGRADE_GATE_PYTEST_PROGRESS"
WARNINGS_ENV = "UPGRADE_GATE_PYTEST_WARNINGS"
RESTORE_ENV = "UPGRADE_GATE_PYTEST_RESTORE"
# A long run prints a progress line at most this often in CI (the live view shows every test).
PROGRESS_LINES_EVERY_S = 15.0
SCAN_SCRIPT = TOOL_ROOT / "compat" / "scan.py"
SCANNER_FILES = (*sorted((TOOL_ROOT / "compat").glob("scan*.py")), TOOL_ROOT / "compat" / "migration_rules.toml")
# The result cache's entries for the project, (stack, model, phase) as a model phase's (issue 37: `compat` right
# after `compare` ran both test suites and the scan again, 6 minutes, on unchanged code).
CACHE_MODEL, TESTS_PHASE, SCAN_PHASE = "project", "tests", "scan"
# The tests again on a copy with migrate/project.diff applied (upgrade_gate.project.patched_run).
PATCHED_PHASE = "tests-patched"
SCAN_ENTRY = ("scan", CACHE_MODEL, SCAN_PHASE)
# A test run's files that the cache keeps: those of a run that gave outcomes ("ran"). A hang, a kill or a
# crash may be the machine's, and is run again, as a model phase's would be.
KEPT_FILES = (RUN_FILE, JUNIT_FILE, WARNINGS_FILE, LOG_FILE, PROGRESS_FILE)
SCAN_LOG, SCAN_PROGRESS = "scan.log", "scan-progress.json"


# -- running the tests (inside `nox -s "project(<stack>)"`) -------------------------


def project_env(bin_dir: Path, folder: Path, source_paths: Sequence[Path] = ()) -> dict[str, str]:
    """The environment of the project's tests: the user's, with the stack's venv first on PATH, and
    where upgrade-gate's pytest plugin finds it and writes into ``folder``; ``source_paths`` (a patched copy's
    folders) lead the tests' import path, before the installed project's."""
    env = venv_env(bin_dir)
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    # executorch imports torch._inductor, which starts a compile pool on CUDA wheels (see workers.worker_env).
    env.setdefault("TORCH_WARM_POOL", "0")
    paths = [str(path) for path in source_paths]
    # The plugin puts PYTHONPATH back as it was before the tests run: the tests see the team's environment.
    env[RESTORE_ENV] = json.dumps({"PYTHONPATH": os.pathsep.join(paths) if paths else env.get("PYTHONPATH")})
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR), *paths])  # venv_env removed the caller's: ours alone
    env[PROGRESS_ENV], env[WARNINGS_ENV] = str(folder / PROGRESS_FILE), str(folder / WARNINGS_FILE)
    return env


def watched_command(project: ProjectSettings, junit: Path) -> list[str]:
    """The test command as it runs: with its JUnit XML at ``junit``, and a pytest command loading the plugin."""
    command = project.test_command(junit)
    return [*command, "-p", PLUGIN] if runs_pytest(project.test) else command


def record_install_failure(plan: Plan, stack: str, error: str, bin_dir: Path) -> dict[str, Any]:
    """The project does not install into this stack: a result, not a usage error (the candidate's pins may
    refuse it)."""
    return write_run(layout.project_dir(plan.settings.out_dir, stack), stack, bin_dir, {
        "status": "install-failed", "install_error": error, "command": [], "exit_code": None, "duration_s": 0.0})


def run_tests(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path,
              log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run the project's test command in one stack, showing how far it is; write and return its run record. Its exit
    status says little (pytest exits 1 when a test fails): the outcomes are the JUnit XML's."""
    return run_tests_in(plan, project, stack, bin_dir, layout.project_dir(plan.settings.out_dir, stack), TESTS_PHASE,
                        "project: tests", log)


def run_tests_in(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path, folder: Path, phase: str,
                 what: str, log: Callable[[str], Any], keyed_root: Path | None = None,
                 source_paths: Sequence[Path] = ()) -> dict[str, Any]:
    """The test command run in ``project.root`` into ``folder``, its outcomes kept in the result cache as
    ``phase`` (keyed by ``keyed_root`` where the root is a copy's, whose ``source_paths`` lead the import path)."""
    folder.mkdir(parents=True, exist_ok=True)
    junit, log_file = folder / JUNIT_FILE, folder / LOG_FILE
    for stale in (junit, folder / WARNINGS_FILE, folder / PROGRESS_FILE, layout.key_record_file(folder, phase)):
        stale.unlink(missing_ok=True)  # an old run's outcomes must not pass for this one's
    # Keyed before the tests run: a run may leave files in the project.
    key = tests_key(plan, project, stack, bin_dir, keyed_root)
    entry = (stack, CACHE_MODEL, phase)
    reused = _reuse(plan, entry, key, folder, RUN_FILE, log)
    if reused is not None:
        return reused
    # `python` and `pytest` are the stack's: its bin/ leads PATH, and a bare name is resolved there first.
    command = watched_command(project, junit)
    argv = [str(bin_dir / command[0]) if (bin_dir / command[0]).exists() else command[0], *command[1:]]
    task = f"{stack}: {what}"
    with Progress(f"{stack}: the project's tests", 1, log=log) as progress:
        progress.start(task)
        watch = TestProgress(folder / PROGRESS_FILE)

        def show() -> None:
            if (text := watch.poll()) is not None:
                progress.stage(task, text, lines_every_s=PROGRESS_LINES_EVERY_S)
        try:
            outcome = supervisor.run_supervised(
                argv, env=project_env(bin_dir, folder, source_paths), cwd=project.root, log_file=log_file,
                phase_file=None,
                deadline_for=lambda _stage: project.timeout_s, memory_limit_bytes=plan.settings.memory_limit_bytes,
                on_poll=show)
        except OSError as error:  # the command does not exist in the stack
            progress.finish(task, "did not start")
            return write_run(folder, stack, bin_dir, {
                "status": "not-started", "command": command, "exit_code": None, "duration_s": 0.0,
                "problem": f"cannot start {command[0]!r}: {error.strerror}"})
        show()
        progress.finish(task, f"exit status {outcome.returncode}" + (f", {watch.last}" if watch.last else ""))
    record = _tests_record(project, command, outcome, junit, watch, log_file.relative_to(plan.settings.out_dir))
    written = write_run(folder, stack, bin_dir, record)
    kept = [folder / name for name in KEPT_FILES if (folder / name).is_file()] if written["status"] == "ran" else []
    _keep(plan, entry, key, folder, kept, {"seconds": written["duration_s"]})
    return written


def _tests_record(project: ProjectSettings, command: list[str], outcome: supervisor.Outcome, junit: Path,
                  watch: TestProgress, log_name: Path) -> dict[str, Any]:
    """How the test command ended, as its run record says it: its status, and the problem where it has no results."""
    record: dict[str, Any] = {"command": command, "exit_code": outcome.returncode,
                              "duration_s": round(outcome.elapsed_s, 2), "peak_rss_bytes": outcome.peak_rss_bytes}
    # The test the plugin last saw running: the one that hung, or that ended the process (os._exit).
    during = f" during {watch.running}" if watch.running else ""
    if outcome.cause == "timeout":
        record.update(status="timed-out", problem=f"killed after {project.timeout_s:g} s (project.timeout){during}")
    elif outcome.cause == "out-of-memory":
        record.update(status="out-of-memory", problem=f"killed at {outcome.peak_rss_bytes / 2**30:.1f} GiB resident "
                                                       f"(memory-limit){during}")
    elif not junit.is_file():
        hint = "" if runs_pytest(project.test) else " (is {junit} where the command takes its JUnit XML path?)"
        ended = f"; the run ended{during} (a test that calls os._exit or kills its process?)" if during else ""
        record.update(status="no-results", problem=f"exit status {outcome.returncode} and no JUnit XML{hint}{ended}; "
                                                   f"see {log_name.as_posix()}")
    else:
        record.update(status="ran")
    return record


def tests_key(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path, root: Path | None = None) -> str:
    """What determines a stack's test outcomes: the team's files, the venv's Python and distributions, the command and
    the plugin; not the environment variables, nor files outside the root. ``root``: the team's, where the files
    are a patched copy's (whose place is the report folder's)."""
    files = source.project_files(project.root)
    return cache.digest_of({
        "tool": __version__, "python": plan.stack(stack).python,
        "installed": cache.installed_distributions(bin_dir.parent),
        "command": list(project.test), "root": str(root or project.root),
        "files": source.files_digest(project.root, files),
        "plugin": sha256_file(PLUGIN_DIR / f"{PLUGIN}.py"),
    })


def _reuse(plan: Plan, entry: tuple[str, str, str], key: str, folder: Path, record_file: str,
           log: Callable[[str], Any]) -> dict[str, Any] | None:
    """The cache's entry for ``key``, copied into ``folder`` with ``record_file`` saying where it came from,
    and that record; None when there is none, or with --fresh."""
    if plan.fresh:
        return None
    stack, model, phase = entry
    hit, problem = cache.ResultCache(plan.settings.cache_dir).lookup(stack, model, phase, key)
    if problem:
        log(f"{stack}: project: {phase}: {problem}")
    if hit is None:
        return None
    for name in hit.files:
        cache.copy_file(hit.path / name, folder / name)
    record = json.loads((folder / record_file).read_text(encoding="utf-8"))
    record["reused_from"] = str(hit.path)
    write_json_atomic(folder / record_file, record)
    _write_key_record(folder, entry, key, hit.files, stored=True, reused_from=hit.path)
    stored_at = hit.manifest.get("stored_at")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(stored_at)) if isinstance(stored_at, int | float) else "?"
    what = {TESTS_PHASE: f"{stack}: project: tests", PATCHED_PHASE: f"{stack}: project: tests with project.diff"
            }.get(phase, "scan")
    log(f"{what} reused from the result cache (entry {key[:12]}, stored {when}: the same project files, "
        f"packages and command; --fresh runs it again) → {hit.path}")
    return record


def _keep(plan: Plan, entry: tuple[str, str, str], key: str, folder: Path, files: list[Path],
          meta: dict[str, Any]) -> None:
    """Store ``files`` under ``key`` (none: not kept), and say so beside them."""
    manifest = {f.name: {"bytes": f.stat().st_size} for f in files}
    if files:
        manifest = cache.ResultCache(plan.settings.cache_dir).store(*entry, key, files, meta).files
    _write_key_record(folder, entry, key, manifest, stored=bool(files))


def _write_key_record(folder: Path, entry: tuple[str, str, str], key: str, files: dict[str, Any], *,
                      stored: bool, reused_from: Path | None = None) -> None:
    """``<phase>.cache.json`` beside the files, as a model phase's: its key, its cache entry (which
    ``prune-cache`` keeps) and whether the files came from there."""
    write_json_atomic(layout.key_record_file(folder, entry[2]), {
        "key": key, "entry": list(entry), "stored": stored, "reused_from": str(reused_from) if reused_from else None,
        "files": files})


def write_run(folder: Path, stack: str, bin_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    full = {"schema_version": str(RECORDS_VERSION), "stack": stack, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record,
            # What the tests ran with: a test that changed may owe it to a package the spec pins beside torch.
            "installed": packages.installed_versions(bin_dir.parent)}
    write_json_atomic(folder / RUN_FILE, full)
    return full


class TestProgress:
    """How far the tests are, from the plugin's progress file: one line of text when it changed."""

    __test__ = False  # not a pytest test class

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: str | None = None
        self.running: str | None = None  # the first test running at the last change, if any
        self._mtime_ns = -1

    def poll(self) -> str | None:
        """"12/40 tests done · tests/test_io.py::test_load", when the file says something new; else None."""
        try:
            mtime_ns = self.path.stat().st_mtime_ns
            if mtime_ns == self._mtime_ns:
                return None
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._mtime_ns = mtime_ns
            collected, done, running = data.get("collected"), int(data.get("done", 0)), list(data.get("running", []))
        except (OSError, ValueError, TypeError, AttributeError):
            return None  # not written yet (pytest not started, or not pytest), or being replaced: next poll
        self.running = str(running[0]) if running else None
        if collected is None:
            text = "collecting"
        else:
            text = f"{done}/{collected} tests done"
            if running:
                text += f" · {running[0]}" + (f" (+{len(running) - 1} more)" if len(running) > 1 else "")
        if text == self.last:
            return None
        self.last = text
        return text


# -- the API scan (inside `nox -s scan`) ---------------------------------------------


def run_scan(plan: Plan, bin_dir: Path, log: Callable[[str], Any] = print) -> str | None:
    """Scan the project's source into project/scan.json, showing how far it is, or reuse the cache's scan of the same
    files; None, or a usage error to name ``tool.upgrade-gate.project.scan`` with."""
    settings = plan.settings.project
    assert settings is not None  # the session skips without a project
    target = layout.scan_file(plan.settings.out_dir)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    try:
        files = source.project_files(settings.root, settings.scan, suffix=".py")
    except source.SourcePathError as error:
        return str(error)
    # The candidates' torch releases, as their specs pin them: the scan sets aside what their version guards skip.
    torch = sorted({pin for spec in plan.candidates for pin in spec.pinned("torch")})
    key = cache.digest_of({
        "tool": __version__, "scanner": {path.name: sha256_file(path) for path in SCANNER_FILES},
        "installed": cache.installed_distributions(bin_dir.parent),
        "files": source.files_digest(settings.root, files), "root": str(settings.root), "torch": torch,
    })
    if _reuse(plan, SCAN_ENTRY, key, folder, target.name, log) is not None:
        return None
    for stale in (target, layout.key_record_file(folder, SCAN_PHASE)):
        stale.unlink(missing_ok=True)
    watch = ScanProgress(folder / SCAN_PROGRESS)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, prefix=".scan-files.", suffix=".txt",
                                     delete=False) as listing:
        listing.write("".join(f"{path.as_posix()}\n" for path in files))
    argv = [str(bin_dir / "python"), "-P", str(SCAN_SCRIPT), "--root", str(settings.root), "--out", str(target),
            "--files-from", listing.name, "--progress", str(watch.path), *(f"--torch={v}" for v in torch)]
    task = "scan"
    try:
        with Progress("the API scan", 1, log=log) as progress:
            progress.start(task)

            def show() -> None:
                if (text := watch.poll()) is not None:
                    progress.stage(task, text, lines_every_s=PROGRESS_LINES_EVERY_S)
            outcome = supervisor.run_supervised(
                argv, env=dict(os.environ), cwd=settings.root, log_file=folder / SCAN_LOG, phase_file=None,
                deadline_for=lambda _stage: math.inf, memory_limit_bytes=plan.settings.memory_limit_bytes,
                on_poll=show)
            progress.finish(task, f"{len(files)} files in {outcome.elapsed_s:.0f} s")
    finally:
        os.unlink(listing.name)
        watch.path.unlink(missing_ok=True)
    said = (folder / SCAN_LOG).read_text(encoding="utf-8", errors="replace").strip()
    if outcome.returncode == 2 and outcome.cause is None:
        return said.splitlines()[-1].removeprefix("scan: error: ") if said else "the scanner refused its arguments"
    if outcome.returncode != 0 or outcome.cause is not None or not target.is_file():
        raise RuntimeError(f"compat/scan.py failed (exit status {outcome.returncode}"
                           f"{f', {outcome.cause}' if outcome.cause else ''}): {said[-2000:]}")
    _keep(plan, SCAN_ENTRY, key, folder, [target], {"seconds": round(outcome.elapsed_s, 2)})
    return None


class ScanProgress:
    """How far the scan is, from its progress file: one line of text when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: str | None = None

    def poll(self) -> str | None:
        """"120/412 files · timm/layers/patch_embed.py" when the file says something new; else None."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            text = f"{int(data['done'])}/{int(data['total'])} files · {data['file']}"
        except (OSError, ValueError, TypeError, KeyError):
            return None  # not written yet, or being replaced: next poll
        if text == self.last:
            return None
        self.last = text
        return text
