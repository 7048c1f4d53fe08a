"""`nox -s releases`: which release to move to (docs/releases.md). Each release in range is a candidate stack
in a venv of its own, compared with the baseline in its own report folder as `nox -s compare` would, then its
venv removed; upgrade_gate.releases._upgrade_path reads the folders back into one report.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate import layout, pipeline
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.config.plan import Plan, load_plan, parse_posargs, parse_shard
from upgrade_gate.config.plan import parser as plan_parser
from upgrade_gate.config.settings import Settings
from upgrade_gate.config.specs import StackSpec, load_spec
from upgrade_gate.errors import ConfigError
from upgrade_gate.invocation import command
from upgrade_gate.judge.policy import MODEL_GATES
from upgrade_gate.releases._reproducers import ReproducerRun, compare_reproducers, run_reproducer
from upgrade_gate.releases._table import (
    ADAPTER_FAILS,
    JUDGED,
    NOT_COVERED,
    NOT_INSTALLED,
    RECORD,
    TABLE_FILE,
    Bisect,
    Release,
    ReleaseRecord,
    ReleaseTable,
    bisect,
    gate_state,
    load_table,
    read_record,
    release_folder,
)
from upgrade_gate.releases._upgrade_path import not_run_per_release, write_upgrade_path
from upgrade_gate.run import guard, runner, venvs
from upgrade_gate.schema.verdict import Verdict


def release_settings(settings: Settings) -> Settings:
    """What the explorer changes in the configuration's settings: latency at one thread (the ratio that does not depend
    on free cores); no other backends (the question is the XNNPACK path), no profile (the report does not show it),
    no culprit search (compare's reproducer answers whether a release fixes a finding, in one command), no project
    (its gates would only say *incomplete* and hold every verdict at INCOMPLETE)."""
    return dataclasses.replace(settings, threads=(1,), backends_budget_s=0.0, profile=False, diagnose_budget_s=0.0,
                               project=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    plan: Plan  # settings, baseline and models; its stacks are the configuration's, not the releases
    table: ReleaseTable
    releases: tuple[Release, ...]  # in range (this shard's part of it)
    bisect: Bisect | None = None
    keep_stacks: bool = False
    prune: bool = False
    merge: tuple[Path, ...] = ()
    not_run: str = ""  # what the configuration asks for that no release is judged on

    @property
    def out(self) -> Path:
        return self.plan.settings.out_dir

    def folder(self, release: Release) -> Path:
        return release_folder(self.out, release)


# Shared with `nox -s compare` (declared once in upgrade_gate.config.plan), then the explorer's own.
SHARED = ("--out", "--suite", "--models", "--fresh")


def parser() -> argparse.ArgumentParser:
    built = plan_parser(f"{command('releases')} --", only=SHARED)
    built.add_argument("--from", dest="first", metavar="VERSION",
                       help="the oldest release to build (default: the table's)")
    built.add_argument("--to", dest="last", metavar="VERSION",
                       help="the newest release to build (default: the table's)")
    built.add_argument("--bisect", metavar="GATE:MODEL",
                       help="build only the releases a bisection needs to find where GATE starts or stops failing "
                            "for MODEL (e.g. numerics:nanovlm)")
    built.add_argument("--shard", metavar="K/N",
                       help="build only the K-th of N parts of the releases (a CI matrix job)")
    built.add_argument("--keep-stacks", action="store_true",
                       help="keep each release's venv after its comparison (a re-run then builds nothing)")
    built.add_argument("--prune", action="store_true",
                       help="download each release's wheels into a cache of its own and remove it with the venv: "
                            "the disk holds one release stack at a time (a re-run downloads again)")
    built.add_argument("--table", metavar="FILE", help=f"the release table (default: {TABLE_FILE.name} of the tool)")
    built.add_argument("merge", nargs="*", type=Path, metavar="PART_DIR",
                       help="report folders of matrix jobs to merge into --out (builds nothing)")
    return built


def load_request(posargs: list[str], *, invoked_from: Path, config_path: Path | None = None) -> Request:
    """Everything `nox -s releases` needs, validated; ConfigError naming the option or file."""
    args = parse_posargs(posargs, parser())
    table = load_table((invoked_from / args.table).resolve() if args.table else TABLE_FILE)
    shared = [item for name in SHARED for item in _option(args, name)]
    plan = load_plan(shared, invoked_from=invoked_from, config_path=config_path)
    not_run = not_run_per_release() if plan.settings.project is not None else ""
    plan = dataclasses.replace(plan, settings=release_settings(plan.settings))
    chosen = table.between(args.first, args.last)
    bisect = None
    if args.bisect is not None:
        gate, _, model = args.bisect.partition(":")
        if not gate or not model:
            raise ConfigError(f"{args.bisect!r} is not GATE:MODEL (e.g. numerics:nanovlm)", key="--bisect")
        if model not in {m.name for m in plan.models}:
            running = ", ".join(m.name for m in plan.models)
            raise ConfigError(f"{model!r} is not among the models of this run ({running}); name it with --models too, "
                              "or pick one of those", key="--bisect")
        if gate not in MODEL_GATES:
            raise ConfigError(f"{args.bisect!r}: no gate {gate!r}; a model's gates: {', '.join(MODEL_GATES)}",
                              key="--bisect")
        bisect = Bisect(gate=gate, model=model)
        if len(chosen) < 2:
            raise ConfigError("a bisection needs at least two releases in range", key="--bisect")
    shard = parse_shard(args.shard) if args.shard else None
    if shard is not None and bisect is not None:
        raise ConfigError("a bisection decides which release to build next: it does not split over a matrix",
                          key="--shard")
    if shard is not None:
        chosen = [release for index, release in enumerate(chosen) if shard.takes(index)]
    merge = tuple((invoked_from / d).resolve() for d in args.merge)
    if args.prune and args.keep_stacks:
        raise ConfigError("--prune removes what --keep-stacks keeps; give one", key="--prune")
    return Request(plan=plan, table=table, releases=tuple(chosen), bisect=bisect, keep_stacks=args.keep_stacks,
                   prune=args.prune, merge=merge, not_run=not_run)


def _option(args: argparse.Namespace, name: str) -> list[str]:
    value = getattr(args, name.lstrip("-"))
    if value is None or value is False:
        return []
    return [name] if value is True else [name, value]


def request_or_exit(posargs: list[str], invoked_from: str | Path) -> Request:
    """The validated request, with the report folder this process's alone (exit 2 otherwise)."""
    try:
        request = load_request(list(posargs), invoked_from=Path(invoked_from))
    except ConfigError as error:
        guard.fail_usage(error)
    for folder in request.merge:
        if not layout.releases_dir(folder).is_dir():
            guard.fail_usage(f"{folder}: no releases/ folder; pass the --out folders of "
                             f"`{command('releases', '--shard K/N')}` jobs")
    pipeline.take_folders_or_exit(request.out, request.plan.settings.cache_dir)
    return request


def release_spec(request: Request, release: Release, adapter: str) -> StackSpec:
    """The release's stack spec, written into its folder (the evidence names it) and read as any spec."""
    folder = request.folder(release)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{release.name}.toml"
    # JSON's string is TOML's basic string: a requirement's marker may hold '"'.
    requirements = ",\n".join(f"    {json.dumps(r)}" for r in request.table.requirements_of(release))
    write_text_atomic(path, (
        f"# Made by `nox -s releases` from {request.table.path.name}: executorch {release.executorch} and the torch it "
        f"pairs with ({release.source}).\n"
        f'description = "PyTorch {release.torch} + ExecuTorch {release.executorch} · torch.export → XNNPACK"\n'
        f'python = "{request.table.python}"\n'
        f"requirements = [\n{requirements},\n]\n"
        f'adapter = "{adapter}"\n'
        'exporter = "torch.export.export → to_edge_transform_and_lower(XnnpackPartitioner) → to_executorch"\n'
        'runtime = "executorch.extension.pybindings.portable_lib._load_for_executorch"\n'))
    return load_spec(path, adapters_dir=layout.TOOL_ROOT / "compat", is_baseline=False)


def venv_dir(out: Path, stack: str) -> Path:
    """The release stacks' venvs live in the report folder, under its lock, until their release is done."""
    return out / ".venvs" / stack


# What uv says when the index has no distribution that fits: a fact about the release (or the
# table's pairing), unlike a download or a disk that failed.
RESOLUTION_REFUSALS = ("No solution found", "not found in the package registry", "has no wheels with a matching",
                       "only has wheels with the following", "requirements are unsatisfiable")


def refused_by_the_index(error: str) -> bool:
    return any(marker in error for marker in RESOLUTION_REFUSALS)


def release_plan(request: Request, release: Release, spec: StackSpec, models: tuple[str, ...]) -> Plan:
    """An ordinary comparison of the baseline and one release, in the release's own report folder."""
    plan = request.plan
    chosen = tuple(m for m in plan.models if m.name in models)
    settings = dataclasses.replace(plan.settings, out_dir=request.folder(release))
    return dataclasses.replace(plan, settings=settings, stacks=(plan.baseline, spec), models=chosen,
                               selection=tuple(m.name for m in chosen), shard=None, merge=())


def explore_release(request: Request, release: Release, uv: str, baseline_bin: Path,
                    log: Callable[[str], Any], models: tuple[str, ...] | None = None) -> ReleaseRecord:
    """Build one release's stack, compare it with the baseline, judge it, remove its venv."""
    started = time.monotonic()
    folder = request.folder(release)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD).unlink(missing_ok=True)  # a record is written only for a release that finished
    names = tuple(m.name for m in request.plan.models) if models is None else models

    def finish(status: str, reason: str = "", adapter: str | None = None, verdict: Verdict | None = None,
               reproduced: tuple[ReproducerRun, ...] = ()) -> ReleaseRecord:
        record = ReleaseRecord(release=release, status=status, reason=reason, adapter=adapter, verdict=verdict,
                               models=names, seconds=time.monotonic() - started, reproducers=reproduced)
        write_json_atomic(folder / RECORD, record.to_dict())
        log(f"releases: {release.name}: {status}" + (f" — {verdict}" if verdict else f" — {reason}" if reason else "")
            + f" ({record.seconds:.0f} s)")
        return record

    rule = request.table.adapter_for(release)
    if rule is None or rule.adapter is None:
        missing = rule.missing if rule else f"no rule of {request.table.path.name} [[adapters]] matches it"
        return finish(NOT_COVERED, f"no adapter covers executorch {release.executorch}'s export API: {missing}")
    spec = release_spec(request, release, rule.adapter)
    venv = venv_dir(request.out, release.name)
    # --prune: the release's wheels in a cache of their own, removed with its venv.
    wheels = venv.with_name(f"{release.name}.wheels") if request.prune else None
    log(f"releases: {release.name}: building the stack (torch {release.torch}, torchvision {release.torchvision}"
        + (f", torchao {release.torchao}" if release.torchao else "") + ")")
    refused = _release_stack(request, release, spec, uv, venv, wheels)
    if refused:
        return finish(NOT_INSTALLED, refused, rule.adapter)
    try:
        plan = release_plan(request, release, spec, names)
        outcome = pipeline.compare(plan, {plan.baseline.name: baseline_bin, spec.name: venv / "bin"}, log=log)
        if isinstance(outcome, pipeline.AdapterProblem):
            if outcome.spec.is_baseline and outcome.unfinished:  # the machine's, not the release's
                guard.fail_incomplete(f"the baseline {outcome.spec.name!r}: {outcome}; run the same command again")
            if outcome.spec.is_baseline:
                guard.fail_usage(f"{outcome.spec.path}: adapter: {outcome.spec.adapter!r} {outcome}")
            return finish(ADAPTER_FAILS, f"compat/{rule.adapter}.py does not load with executorch "
                                         f"{release.executorch}: {outcome}", rule.adapter)
        reproduced = []
        for model, method, script in compare_reproducers(request.out, names):
            log(f"releases: {release.name}: running compare's reproducer {script}")
            reproduced.append(run_reproducer(venv / "bin" / "python", request.out, model, method, script))
        return finish(JUDGED, adapter=rule.adapter, verdict=outcome.verdict.candidates.get(spec.name),
                      reproduced=tuple(reproduced))
    finally:
        if not request.keep_stacks:
            _remove(venv, wheels)


def _release_stack(request: Request, release: Release, spec: StackSpec, uv: str, venv: Path,
                   wheels: Path | None) -> str | None:
    """The release's stack, built as `nox -s run` builds the candidate's, for whose place it stands: its requirements,
    then the project's extra requirements for the candidate (issue 63: without them every release failed on `import
    timm`). None, or why the index refused it; the network or the disk failing is the machine's: exit 3."""
    extra = request.plan.extra_requirements(request.plan.candidates[0].name)
    failed = venvs.build_venv(uv, spec, venv, wheels, extra=extra,
                              team_folder=request.plan.settings.config_path.parent)
    if not failed:
        return None
    _remove(venv, wheels)
    on, error = failed
    if not refused_by_the_index(error):
        guard.fail_incomplete(f"{release.name}: uv could not build its stack ({error}); run the same command "
                              "again: it resumes")
    what = (', '.join(map(str, spec.requirements)) if on == venvs.SPEC_REQUIREMENTS
            else f"the project's extra requirements {shlex.join(extra)} beside them")
    return f"uv could not install {what} for Python {spec.python}: {error}"


def _remove(*folders: Path | None) -> None:
    for folder in folders:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def build_baseline(request: Request, uv: str, log: Callable[[str], Any]) -> Path:
    """The baseline's venv (uv links it from its cache) with the project's extra requirements, as `nox -s run` makes
    it; exit 2 when it does not install, or when a project model's factory fails in it (a package the team did
    not list is the configuration's, never a release's: issue 63)."""
    plan, spec = request.plan, request.plan.baseline
    log(f"releases: the baseline {spec.name}: building its venv")
    folder, config = venv_dir(request.out, spec.name), plan.settings.config_path
    extra = plan.extra_requirements(spec.name)
    failed = venvs.build_venv(uv, spec, folder, extra=extra, team_folder=config.parent)
    if failed and failed[0] == venvs.SPEC_REQUIREMENTS:
        guard.fail_usage(f"{spec.path}: requirements: uv could not install them: {failed[1]}; fix the versions in "
                         "the spec")
    if failed:  # as `nox -s run` says it
        guard.fail_usage(f"{config}: {venvs.EXTRA_REQUIREMENTS}: uv could not install {shlex.join(extra)} into stack "
                         f"{spec.name!r}: {failed[1]}")
    pipeline.check_project_models_or_exit(plan, spec, folder / "bin")
    return folder / "bin"


def explore(request: Request, uv: str, log: Callable[[str], Any] = print) -> int:
    """Every release in range (or a bisection's), then the upgrade-path report; the exit status."""
    if request.plan.fresh:
        runner.forget_fixtures(request.plan)
    baseline_bin = build_baseline(request, uv, log)
    bisection = None
    try:
        target = request.bisect
        if target is not None:
            def judge(release: Release) -> str:
                log(f"releases: bisect: {release.name}")
                record = explore_release(request, release, uv, baseline_bin, log, models=(target.model,))
                return gate_state(record, request.folder(release), target)

            def seen_before(release: Release) -> str | None:
                record = read_record(request.folder(release), request.table)
                return None if record is None else gate_state(record, request.folder(release), target)

            bisection = bisect(list(request.releases), target, judge, seen_before)
        else:
            for index, release in enumerate(request.releases, start=1):
                log(f"releases: {index}/{len(request.releases)}: {release.name}")
                explore_release(request, release, uv, baseline_bin, log)
    finally:
        if not request.keep_stacks:
            shutil.rmtree(venv_dir(request.out, request.plan.baseline.name), ignore_errors=True)
            with contextlib.suppress(OSError):  # empty: no other run's venvs in it
                (request.out / ".venvs").rmdir()
    return write_upgrade_path(request.out, request.releases, request.table, request.plan.baseline.name, bisection,
                              log, request.not_run)


def merge(request: Request, log: Callable[[str], Any] = print) -> int:
    """Copy the matrix jobs' release folders into --out, then write the upgrade-path report."""
    for part in request.merge:
        for folder in sorted(layout.releases_dir(part).iterdir()):
            if not folder.is_dir() or read_record(folder, request.table) is None:
                continue  # a release that did not finish in that job: not evidence
            target = layout.release_dir(request.out, folder.name)
            if target.resolve() == folder.resolve():
                continue
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(folder, target, ignore=shutil.ignore_patterns(".venvs", ".*.partial*"))
            log(f"releases: merged {folder.name} from {part}")
    return write_upgrade_path(request.out, request.releases, request.table, request.plan.baseline.name, None, log,
                              request.not_run)
