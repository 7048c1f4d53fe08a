"""The steps `nox -s compare` runs, as plain functions the noxfile calls in order:

    load_plan → (per stack) install_stack → run_stack → gather → evaluate → write_reports

User errors end the run with exit status 2 and one message naming the file and
key; nothing finished is deleted.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from upgrade_gate import __version__, layout, project, runner, shards
from upgrade_gate.compare import gather, stack_info
from upgrade_gate.errors import EXIT_USAGE, ConfigError, RecordError
from upgrade_gate.plan import Plan, load_plan
from upgrade_gate.policy import evaluate
from upgrade_gate.report import write_compat_report, write_reports
from upgrade_gate.results import Results, VerdictRecord
from upgrade_gate.settings import ProjectSettings
from upgrade_gate.specs import StackSpec


def fail_usage(error: Exception | str) -> NoReturn:
    """Print one message and exit 2.

    Raised as SystemExit on purpose: nox turns any exception inside a session
    into "session failed" and exit status 1, but lets SystemExit through, so
    this is how a bad configuration reaches the shell as 2.
    """
    print(f"upgrade-gate: error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


def plan_or_exit(posargs: list[str], invoked_from: str | Path, *, merging: bool = False,
                 models_required: bool = True) -> Plan:
    """The validated plan, with the report folder writable and this process's alone.

    Shard folders (positional arguments) are only for the report session, which merges them.
    """
    try:
        plan = load_plan(list(posargs), invoked_from=Path(invoked_from), models_required=models_required)
    except ConfigError as error:
        fail_usage(error)
    if plan.merge and not merging:
        fail_usage(f"{plan.merge[0]}: folders to merge are for `nox -s report -- DIR...`; other sessions take "
                   "options only (--out, --suite, --models, --shard, --fresh, --remeasure)")
    check_writable(plan.settings.out_dir)
    try:
        lock_out_dir(plan.settings.out_dir)
    except FolderBusy as error:
        fail_usage(error)
    return plan


def probe_stack_or_exit(plan: Plan, spec: StackSpec, bin_dir: Path) -> None:
    """What the stack has installed, recorded; an adapter that does not load or lacks
    part of the contract (compat/contract.py) is the spec's error: exit 2 naming it."""
    probe = runner.probe_stack(plan, spec, bin_dir)
    adapter = (probe or {}).get("adapter") or {}
    where = f"{spec.path}: adapter: {spec.adapter!r}"
    if adapter.get("error"):
        fail_usage(f"{where} does not load in stack {spec.name!r}: {adapter['error']}; the spec's requirements must "
                   "install what it imports")
    if adapter.get("missing"):
        fail_usage(f"{where} lacks {', '.join(adapter['missing'])}; an adapter provides SUFFIX, set_threads, lower, "
                   "save, load and run (compat/contract.py)")


def check_project_models_or_exit(plan: Plan, spec: StackSpec, bin_dir: Path) -> None:
    """A project model whose factory does not import, raises, or returns the
    wrong thing is a configuration error: exit 2 naming the entry, before any export."""
    for name, result in runner.check_factories(plan, spec, bin_dir).items():
        if not result.get("ok"):
            entry = next(m for m in plan.models if m.name == name)
            fail_usage(
                f"{entry.defined_in}: tool.upgrade-gate.models.{name}: factory {entry.factory!r} failed in stack "
                f"{spec.name!r}: {result.get('error')}; the factory must be importable from {entry.project_root} "
                "and return (torch.nn.Module, tuple of tensors)"
            )


def project_or_exit(plan: Plan) -> ProjectSettings:
    """``[tool.upgrade-gate.project]``, which `nox -s compat` and its sessions need."""
    if plan.settings.project is None:
        fail_usage(f"{plan.settings.config_path}: tool.upgrade-gate.project: missing; say what to install and how to "
                   'test, e.g. [tool.upgrade-gate.project] install = ["-e", ".[test]"] test = "python -m pytest tests" '
                   "(docs/compat.md)")
    return plan.settings.project


def install_stack_or_exit(uv: str, spec: StackSpec, bin_dir: Path) -> None:
    """Install a stack spec's requirements into a venv; exit 2 quoting uv when it cannot."""
    error = install(uv, bin_dir, [str(r) for r in spec.requirements], cwd=spec.path.parent)
    if error:
        fail_usage(f"{spec.path}: requirements: uv could not install them: {error}; fix the versions in the spec")


def install_project(uv: str, settings: ProjectSettings, spec: StackSpec, bin_dir: Path) -> str | None:
    """Install the stack, then the project into it with the stack's requirements as
    constraints: the project may add packages, never move the stack's own."""
    install_stack_or_exit(uv, spec, bin_dir)
    constraints = bin_dir.parent / "stack-constraints.txt"
    constraints.write_text("".join(f"{r}\n" for r in spec.requirements))
    return install(uv, bin_dir, ["--constraint", str(constraints), *settings.install], cwd=settings.root)


class FolderBusy(Exception):
    """Another run holds the report folder."""


# Report folders this process holds, by path: nox runs every session of
# `compare` in one process, and each one asks again. Held until the process
# exits; the kernel releases the lock even after a kill -9.
_HELD: dict[Path, int] = {}
LOCK_FILE = ".upgrade-gate.lock"


def lock_out_dir(out: Path) -> None:
    """Take the report folder for this process, or raise FolderBusy naming who has it.

    Two runs writing into one folder would interleave their records; the second
    one refuses at once instead of waiting for a run that can take an hour.
    """
    if out in _HELD:
        return
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FolderBusy(
            f"{out}: another upgrade-gate run is writing this report folder ({holder}); "
            "wait for it to finish, or choose another folder with --out DIR"
        ) from None
    os.ftruncate(fd, 0)
    holder = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)}"
    os.write(fd, holder[:500].encode())
    _HELD[out] = fd


def install(uv: str, bin_dir: Path, requirements: list[str], *, cwd: Path) -> str | None:
    """``uv pip install`` into a stack's venv; None, or uv's error on one line to quote."""
    result = subprocess.run([uv, "pip", "install", "--python", str(bin_dir / "python"), *requirements],
                            cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return None
    # uv draws its error as a tree (× … ╰─▶ …): keep the words.
    lines = [line.strip(" \t×╰─▶│") for line in result.stderr.splitlines()]
    return " ".join(line for line in lines if line) or f"exit status {result.returncode}"


def check_writable(out: Path) -> None:
    """Fail before any work if the report folder cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        fail_usage(f"{out}: report folder is not writable ({error.strerror}); choose another with --out DIR")


def report(plan: Plan) -> int:
    """Compare what the stacks wrote, apply the gates, write the report; return the exit status."""
    if plan.merge:
        try:
            shards.merge(plan)
        except ConfigError as error:
            fail_usage(error)
    if not any(layout.stack_dir(plan.settings.out_dir, s.name).is_dir() for s in plan.stacks):
        fail_usage(f"{plan.settings.out_dir}: no stack results to report on; run `nox -s compare` first")
    try:
        models = gather(plan)
    except RecordError as error:
        fail_usage(f"{plan.settings.out_dir}: {error}; re-run `nox -s compare` to rewrite the records")
    project_results = project.gather_project(plan)
    verdict = evaluate(plan, models, project_results)
    out = plan.settings.out_dir
    results = Results(
        tool_version=__version__, generated_at=verdict.generated_at, config_path=str(plan.settings.config_path),
        settings=plan.settings, stacks={spec.name: stack_info(out, spec) for spec in plan.stacks},
        models=tuple(models), verdict=verdict, project=project_results)
    paths = write_reports(results, out)
    return _announce("Verdict", verdict, paths)


def compat_report(plan: Plan) -> int:
    """`nox -s compat`'s report: the project's gates alone, in compat.md and compat.json; the exit status."""
    project_results = project.gather_project(plan)
    assert project_results is not None  # project_or_exit ran first
    verdict = evaluate(plan, [], project_results)  # no models: the project's gates alone
    paths = write_compat_report(verdict, project_results, [s.name for s in plan.stacks], plan.settings.out_dir)
    return _announce("Project compatibility", verdict, paths)


def _announce(title: str, verdict: VerdictRecord, paths: list[Path]) -> int:
    """Every gate's line, the verdict and where the report is, on the console; the exit status."""
    for gate in verdict.gates:
        print(gate)
    print(f"{title}: {verdict.verdict}" + "".join(f"  [{n}: {v}]" for n, v in verdict.candidates.items()))
    print("Report: " + ", ".join(str(p) for p in paths))
    return verdict.verdict.exit_code
