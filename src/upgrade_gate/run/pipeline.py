"""The steps `nox -s compare` runs, as plain functions the noxfile calls in order:

    load_plan → (per stack) install_stack → probe_stack → run_stack → gather → evaluate → write_reports

Every way a session can end is one exit status and one message (docs/report.md):
0 GO or GO-WITH-CONDITIONS, 1 NO-GO, 2 a bad configuration or command line
(naming the file and key), 3 INCOMPLETE — the tool or the machine could not
gather the evidence (an interrupted run, a damaged report folder, a full disk,
a fault of the tool, whose traceback goes to a log file the message names).
Nothing finished is deleted; running the same command again resumes.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import nox.command

from upgrade_gate import __version__, layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate.config.plan import Plan, load_plan
from upgrade_gate.config.project_settings import ProjectSettings
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.errors import EXIT_INCOMPLETE, EXIT_USAGE, ConfigError, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.judge.gather import gather, stack_info
from upgrade_gate.judge.policy import evaluate
from upgrade_gate.project.gather import gather_project
from upgrade_gate.report.write import write_compat_report, write_reports
from upgrade_gate.run import cache, packages, runner, shards, supervisor
from upgrade_gate.run.shards import MANIFEST, read_manifest
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import VerdictRecord
from upgrade_gate.text import size


def fail_usage(error: Exception | str) -> NoReturn:
    """Print one message and exit 2.

    Raised as SystemExit on purpose: nox turns any exception inside a session
    into "session failed" and exit status 1, but lets SystemExit through, so
    this is how a bad configuration reaches the shell as 2.
    """
    print(f"upgrade-gate: error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


def fail_incomplete(message: str) -> NoReturn:
    """Print one message and exit 3: the evidence could not be gathered, and that is not the candidate's doing."""
    print(f"upgrade-gate: incomplete: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INCOMPLETE)


def plan_or_exit(posargs: list[str], invoked_from: str | Path, *, reporting: bool = False,
                 models_required: bool = True) -> Plan:
    """The validated plan, with the report folder writable and this process's alone, and the
    result cache writable.

    The report session (``reporting``) reads a folder a run wrote: it must exist (unless it
    merges shard folders into it), and it reports on the models that folder holds.
    """
    try:
        plan = load_plan(list(posargs), invoked_from=Path(invoked_from), models_required=models_required)
    except ConfigError as error:
        fail_usage(error)
    out = plan.settings.out_dir
    if plan.merge and not reporting:
        fail_usage(f"{plan.merge[0]}: folders to merge are for `{command('report', 'DIR...')}`; other sessions take "
                   "options only (--out, --suite, --models, --shard, --fresh, --remeasure)")
    if reporting and not plan.merge:
        if not out.is_dir():
            fail_usage(f"{out}: no such report folder; run `{command('compare', f'--out {out}')}` first, or give the "
                       "folder a run wrote with --out DIR")
        plan = _folder_selection(plan, list(posargs), Path(invoked_from))
    take_folders_or_exit(out, plan.settings.cache_dir)
    return plan


def take_folders_or_exit(out: Path, cache_dir: Path) -> None:
    """The report folder and the result cache writable, and the report folder this process's alone."""
    check_writable(out, what="report folder", fix="choose another with --out DIR")
    check_writable(cache_dir, what="result cache",
                   fix="set UPGRADE_GATE_CACHE, or `cache =` in [tool.upgrade-gate], to a folder you can write")
    try:
        lock_out_dir(out)
    except FolderBusy as error:
        fail_usage(error)


def _folder_selection(plan: Plan, posargs: list[str], invoked_from: Path) -> Plan:
    """The models a report folder holds (its shard.json), so that a report without `--models`
    judges what ran, not the suite's other models; a `--models` that differs is refused."""
    path = plan.settings.out_dir / MANIFEST
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return plan  # a folder from before shard.json, or one no stack has run in: judged as configured
    except (OSError, ValueError, RecordError) as error:
        fail_incomplete(f"{path} is damaged ({error}); run `{command('compare', f'--out {plan.settings.out_dir}')}` "
                        "again: it resumes")
    held = tuple(manifest.models)
    if tuple(m.name for m in plan.models) == held:
        return plan
    if "--models" in posargs or any(arg.startswith("--models=") for arg in posargs):
        fail_usage(f"--models: {', '.join(m.name for m in plan.models)} is not what {path} says the folder holds "
                   f"({', '.join(held)}); leave --models out to report on what ran")
    # fp32 units by their @fp32 name: a bare name would add the variants the settings ask for.
    names = ",".join(name if "@" in name else f"{name}@fp32" for name in held)
    try:
        return load_plan([*posargs, "--models", names], invoked_from=invoked_from)
    except ConfigError as error:
        fail_usage(f"{path}: the folder holds models this configuration does not know ({error})")


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


# What a reused venv was last made from, beside its bin/.
VENV_RECIPE = "upgrade-gate-recipe.json"


def empty_venv_unless_made_from(uv: str, bin_dir: Path, recipe: dict[str, Any]) -> None:
    """Make a reused venv hold its recipe and nothing else (``recipe_installed`` records it).

    ``uv pip install`` only adds: a requirement dropped from a spec or the configuration would
    stay installed, and the stack would no longer be what its spec says. When the recipe is not
    the one the venv was last made from, every distribution in it is removed first (uv links
    from its cache: reinstalling costs seconds)."""
    marker = bin_dir.parent / VENV_RECIPE
    try:
        made_from = json.loads(marker.read_text())
    except (OSError, ValueError):
        made_from = None
    if made_from == recipe:
        return
    marker.unlink(missing_ok=True)
    installed = list(packages.installed_versions(bin_dir.parent))
    if installed:
        subprocess.run([uv, "pip", "uninstall", "--python", str(bin_dir / "python"), *installed],
                       capture_output=True, check=False)


def recipe_installed(bin_dir: Path, recipe: dict[str, Any]) -> None:
    write_json_atomic(bin_dir.parent / VENV_RECIPE, recipe)


def venv_recipe(spec: StackSpec, installs: list[str], cwd: Path) -> dict[str, Any]:
    """A stack's venv: the spec's Python and requirements, then ``installs`` (uv pip install
    arguments, from ``cwd``), and the metadata of the local projects among them (``-e .``), whose
    own dependencies change with it."""
    local = {}
    for argument in installs:
        folder = cwd / argument.split("[", 1)[0]
        if argument.startswith("-") or not folder.is_dir():
            continue
        for name in ("pyproject.toml", "setup.py", "setup.cfg"):
            if (folder / name).is_file():
                local[str((folder / name).resolve())] = cache.sha256_file(folder / name)
    if "--group" in installs and (cwd / "pyproject.toml").is_file():  # uv reads [dependency-groups] from it
        local[str((cwd / "pyproject.toml").resolve())] = cache.sha256_file(cwd / "pyproject.toml")
    return {"python": spec.python, "requirements": [str(r) for r in spec.requirements], "installs": installs,
            "from": str(cwd), "local": local}


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
    # uv draws its error as a tree (× … ╰─▶ …): keep the words, not which venv it was (the caller names it).
    lines = [line.strip(" \t×╰─▶│") for line in result.stderr.splitlines()
             if not line.startswith("Using Python ")]
    return " ".join(line for line in lines if line) or f"exit status {result.returncode}"


def check_writable(folder: Path, *, what: str = "report folder", fix: str = "choose another with --out DIR") -> None:
    """Fail before any work if a folder the run writes cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        fail_usage(f"{folder}: {what} is not writable ({error.strerror}); {fix}")


# -- every session's outcome: a verdict, a usage error, or INCOMPLETE -----------------------


def guarded(session: Callable[..., Any]) -> Callable[..., Any]:
    """A nox session whose every end is an exit status and one message, never a traceback.

    A usage error (SystemExit 2) and nox's own control flow (session.error, skip) pass
    through. Ctrl-C or SIGTERM stops the workers, records their stages as interrupted,
    and exits 3 saying the same command resumes; a full disk exits 3 naming it; any
    other fault of the tool exits 3 naming the log file its traceback went to.
    """
    @functools.wraps(session)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return session(*args, **kwargs)
        except KeyboardInterrupt:
            stop_writers()
            fail_incomplete("the run was stopped (Ctrl-C or SIGTERM); what finished is kept: run the same command "
                            "again and it resumes")
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                stop_writers()
                fail_incomplete(disk_full(error))
            fail_incomplete(_fault())
        except nox.command.CommandFailed:
            fail_incomplete("a command the session ran failed (its output is above); this is the tool's or the "
                            "machine's failure, not the candidate's")
        except Exception as error:  # noqa: BLE001 - any other fault: one message, the traceback in a file
            if type(error).__module__.startswith("nox"):
                raise  # session.error() and session.skip(): nox's own way out
            fail_incomplete(_fault())
    return run


def stop_writers() -> None:
    """Stop every worker, and remove what they left half-written in the report folders this run
    holds: the hidden ``.<name>.partial…`` files (compat/phases.py's partial_file,
    upgrade_gate.run.cache.copy_file) that only a finished write renames to its name."""
    supervisor.stop_all()
    for folder in _HELD:
        for leftover in folder.rglob(".*.partial*"):
            leftover.unlink(missing_ok=True)


def stop_on_sigterm() -> None:
    """SIGTERM (a CI job cancelled, `kill`) ends a session as Ctrl-C does: workers stopped, stages recorded."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def _fault() -> str:
    """The traceback of the exception being handled, into a log file; the message that names it."""
    folder = next(iter(_HELD), None)
    log = folder / "upgrade-gate-error.log" if folder else Path(tempfile.gettempdir()) / "upgrade-gate-error.log"
    try:
        with open(log, "a", encoding="utf-8") as stream:
            stream.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n{traceback.format_exc()}\n")
    except OSError:
        return f"upgrade-gate failed ({traceback.format_exc(limit=0).strip()}); the traceback could not be written"
    return (f"upgrade-gate failed ({traceback.format_exc(limit=0).strip().splitlines()[-1]}); the traceback is in "
            f"{log} — please report it. What finished is kept: running the same command again resumes")


def disk_full(error: OSError) -> str:
    """No room left: which disk, how much it has, and what to do."""
    if isinstance(error.filename2, (str, Path)):  # a copy (shutil's): the target filled, not the source
        path = Path(error.filename2)
    elif isinstance(error.filename, (str, Path)):
        path = Path(error.filename)
    else:
        # A write that ran out (write, sendfile) names no file: of the places this run
        # writes to, the one on the fullest disk.
        path = min([*_HELD, layout.cache_root(), Path.cwd()], key=lambda p: shutil.disk_usage(_existing(p)).free)
    existing = _existing(path)
    mount = next((p for p in (existing, *existing.parents) if os.path.ismount(p)), Path("/"))
    usage = shutil.disk_usage(existing)
    free = size(usage.free) if usage.free else "0 B"
    return (f"no space left on the disk that holds {path} (mounted at {mount}: {free} free of "
            f"{size(usage.total)}); a default-suite run writes about {DEFAULT_RUN_WRITES_GB} GB into the report "
            f"folder and as much into the result cache: free that much, or give --out or UPGRADE_GATE_CACHE on "
            "another disk, then run the same command again: it resumes")


def _existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if p.exists()), Path("/"))


# What a cold run of the default suite writes into its report folder, and again into the cache
# (docs/benchmarks.md): the space a full disk needs back.
DEFAULT_RUN_WRITES_GB = 10


def report(plan: Plan) -> int:
    """Compare what the stacks wrote, apply the gates, write the report; return the exit status."""
    if plan.merge:
        try:
            shards.merge(plan)
        except ConfigError as error:
            fail_usage(error)
    if not any(layout.stack_dir(plan.settings.out_dir, s.name).is_dir() for s in plan.stacks):
        fail_usage(f"{plan.settings.out_dir}: no stack results to report on; run `{command('compare')}` first")
    try:
        models = gather(plan)
    except RecordError as error:  # a record that does not read: the folder is damaged, the run is not judged
        again = command("compare", f"--out {plan.settings.out_dir}")
        fail_incomplete(f"{plan.settings.out_dir}: {error}; run `{again}` again: it rewrites "
                        "the records (the result cache copies back what finished)")
    results = judge(plan, models)
    paths = write_reports(results, plan.settings.out_dir)
    return _announce("Verdict", results.verdict, paths)


def judge(plan: Plan, models: list[ModelResults] | None = None) -> Results:
    """The stacks' records in the report folder, compared and gated: the results every report renders.
    A record that does not read raises RecordError."""
    models = gather(plan) if models is None else models
    project_results = gather_project(plan)
    verdict = evaluate(plan, models, project_results)
    out = plan.settings.out_dir
    return Results(
        tool_version=__version__, generated_at=verdict.generated_at, config_path=str(plan.settings.config_path),
        settings=plan.settings, stacks={spec.name: stack_info(out, spec) for spec in plan.stacks},
        models=tuple(models), verdict=verdict, project=project_results)


def compat_report(plan: Plan) -> int:
    """`nox -s compat`'s report: the project's gates alone, in compat.md and compat.json; the exit status."""
    project_results = gather_project(plan)
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
