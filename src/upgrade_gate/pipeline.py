"""The one pipeline: a comparison's steps as plain functions, in the order they run. It stands above the
stages it runs (run, measure, project, judge, report), which import none of each other's steps.

    plan_or_exit → per stack: venvs (run/venvs.py) → probe → run_models → measure → judge → write_reports

`nox -s compare` runs them across its sessions, so that a shard or a CI job can run one stack;
`nox -s releases` runs them for each release in one process (``compare``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from upgrade_gate import __version__, layout
from upgrade_gate._confined import PlantedLink, refuse_planted_links
from upgrade_gate.config.catalog import method_refused
from upgrade_gate.config.plan import Plan, load_plan
from upgrade_gate.config.project_settings import ProjectSettings
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.errors import ConfigError, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.judge.gather import gather, stack_info
from upgrade_gate.judge.policy import evaluate, headline
from upgrade_gate.measure import device
from upgrade_gate.measure.latency_reproducer import write_latency_reproducer
from upgrade_gate.measure.rounds import measure_all
from upgrade_gate.measure.targets import measure_targets
from upgrade_gate.migrate import write_migration, write_project_diff
from upgrade_gate.project.gather import gather_project
from upgrade_gate.report.write import write_compat_report, write_reports
from upgrade_gate.run import artifacts, asset_build, cache, cache_folder, runner, shards
from upgrade_gate.run._folder_lock import FolderBusy, lock_out_dir, make_folder
from upgrade_gate.run.guard import fail_incomplete, fail_usage
from upgrade_gate.run.shards import MANIFEST, read_manifest
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import VerdictRecord
from upgrade_gate.text import size


def plan_or_exit(posargs: list[str], invoked_from: str | Path, *, reporting: bool = False,
                 models_required: bool = True) -> Plan:
    """The validated plan, with the report folder this process's alone. The report session (``reporting``)
    reads a folder a run wrote: it must exist (unless it merges shards into it); it reports on the models it holds.
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
    """The report folder and the result cache writable and free of planted links, and the report
    folder this process's alone (a refusal leaves no folder it made behind: _folder_lock.MADE)."""
    check_writable(out, what="report folder", fix="choose another with --out DIR")
    check_writable(cache_dir, what="result cache",
                   fix="set UPGRADE_GATE_CACHE, or `cache =` in [tool.upgrade-gate], to a folder you can write")
    try:
        lock_out_dir(out)
        refuse_planted_links(out, "report folder")
        refuse_planted_links(cache_dir, "result cache")
    except (FolderBusy, PlantedLink) as error:
        fail_usage(error)
    cache_folder.use_cache(cache_dir)
    cache_folder.tag_cache(cache_dir)  # a cache inside the team's repository is not its source (project/source.py)


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


def probe(plan: Plan, spec: StackSpec, bin_dir: Path) -> AdapterProblem | None:
    """Record what the stack has installed (stack.json); None, or why its adapter cannot be used:
    it does not load, or it lacks part of the contract (compat/contract.py)."""
    record = runner.probe_stack(plan, spec, bin_dir)
    if record is None:
        return AdapterProblem(spec=spec, unfinished=True)
    adapter = record.get("adapter") or {}
    if adapter.get("error") or adapter.get("missing"):
        return AdapterProblem(spec=spec, error=adapter.get("error"), missing=tuple(adapter.get("missing") or ()))
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class AdapterProblem:
    """Why a stack's adapter cannot be used: the spec's error in `compare`, a release's outcome in `releases`."""

    spec: StackSpec
    error: str | None = None  # it does not import
    missing: tuple[str, ...] = ()  # members of the contract it lacks
    unfinished: bool = False  # the probe did not finish (its log says why)

    def __str__(self) -> str:
        if self.error:
            return f"does not load: {self.error}"
        if self.missing:
            return f"lacks {', '.join(self.missing)}"
        return f"the probe did not finish (stacks/{self.spec.name}/probe.log)"


def probe_or_exit(plan: Plan, spec: StackSpec, bin_dir: Path) -> None:
    """``probe``; an adapter that does not load or lacks part of the contract is the spec's error: exit 2
    naming it. (A probe that did not finish is not: the stages that need it record why.)"""
    problem = probe(plan, spec, bin_dir)
    where = f"{spec.path}: adapter: {spec.adapter!r}"
    if problem is not None and problem.error:
        fail_usage(f"{where} does not load in stack {spec.name!r}: {problem.error}; the spec's requirements must "
                   "install what it imports")
    if problem is not None and problem.missing:
        fail_usage(f"{where} lacks {', '.join(problem.missing)}; an adapter provides SUFFIX, set_threads, lower, "
                   "save, load and run (compat/contract.py)")


def assets_or_exit(plan: Plan) -> None:
    """The converted weights, prompts and photos the plan's models read are built (`compare` queues the
    `assets` session first): a run without them would charge every model with the missing file."""
    missing = asset_build.missing(list(plan.assets))
    if missing:
        fail_usage(f"{asset_build.assets_dir()}: the assets {', '.join(missing)} that these models read are not "
                   f"built; run `{command('assets', '--only ' + ','.join(missing))}` first (`"
                   f"{command('compare')}` builds them itself)")


def run_models(plan: Plan, spec: StackSpec, bin_dir: Path, log: Callable[[str], Any] = print) -> None:
    """Every model of the plan through one stack: the export phase, then the runtime phase (run/runner.py)."""
    runner.run_stack(plan, spec, bin_dir, log=log)


def measure(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """A stack that never ran in the report folder has nothing to time: exit 2 saying what to run first
    (a measurement of the baseline alone would be a latency gate of no candidate)."""
    out = plan.settings.out_dir
    never_ran = [spec.name for spec in plan.stacks if not layout.stack_file(out, spec.name).is_file()]
    if never_ran:
        fail_usage(f"{out}: stack {', '.join(never_ran)} has not run in this report folder, so there is nothing of "
                   f"it to time; run `{command('compare', f'--out {out}')}`, or "
                   f"`{command(f'run({never_ran[0]})', f'--out {out}')}` before `{command('measure', f'--out {out}')}`")
    measure_all(plan, log=log)
    for model in plan.models:  # once every model is timed: its run times the stacks again
        write_latency_reproducer(plan, model, log)


def prune_cache(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """Keep in the result cache only what the report folder reached, so that a CI cache carries one run's
    worth, not every version of every model (docs/ci.md). A folder with no phase recorded would keep nothing."""
    out, root = plan.settings.out_dir, plan.settings.cache_dir
    reached = cache_folder.reached_entries(out)
    if not reached:
        fail_usage(f"{out}: no finished phase recorded there, so pruning would empty the result cache "
                         f"{root}; run `{command('compare')}` with this --out first")
    fixtures = {layout.fixtures_dir(root, model.base, cache.model_code_digest(model)).name for model in plan.models}
    if not cache_folder.alone_in_cache(root):
        fail_usage(f"{root}: another upgrade-gate run is using this result cache; pruning now would remove what it "
                   f"is reading: run `{command('prune-cache', f'--out {out}')}` again when it has finished")
    try:
        pruned = cache_folder.prune(root, reached, fixtures)
    finally:
        cache_folder.share_cache(root)
    log(f"result cache {root}: kept {len(reached)} entries reached by {out} ({size(pruned.kept_bytes)}); "
        f"removed {pruned.removed_entries} other entries and unused fixtures ({size(pruned.removed_bytes)})")


def check_project_models_or_exit(plan: Plan, spec: StackSpec, bin_dir: Path) -> None:
    """A project model whose factory fails, or names a method that cannot name its files, is a configuration
    error: exit 2 naming the entry, before any export."""
    for name, result in runner.check_factories(plan, spec, bin_dir).items():
        entry = next(m for m in plan.models if m.name == name)
        if result.get("refused_method") is not None:
            fail_usage(method_refused(entry, str(result["refused_method"])))
        if not result.get("ok"):
            # A package the factory imports that the stack lacks: the team's to list (issue 63), not a stack's failure.
            missing = re.search(r"No module named '([^'.]+)", str(result.get("error")))
            fix = (f"install the package that provides {missing[1]!r} into every stack: [tool.upgrade-gate."
                   f'extra-requirements] "*" = ["<its distribution>"] in {plan.settings.config_path}'
                   if missing and missing[1] != entry.factory.partition(":")[0].partition(".")[0] else
                   f"the factory must be importable from {entry.project_root} and return (torch.nn.Module, tuple of "
                   "tensors)")
            fail_usage(f"{entry.defined_in}: tool.upgrade-gate.models.{name}: factory {entry.factory!r} failed in "
                       f"stack {spec.name!r}: {result.get('error')}; {fix}")


def project_or_exit(plan: Plan) -> ProjectSettings:
    """``[tool.upgrade-gate.project]``, which `nox -s compat` and its sessions need."""
    if plan.settings.project is None:
        fail_usage(f"{plan.settings.config_path}: tool.upgrade-gate.project: missing; say what to install and how to "
                   'test, e.g. [tool.upgrade-gate.project] install = ["-e", ".[test]"] test = "python -m pytest tests" '
                   "(docs/compat.md)")
    return plan.settings.project


def check_writable(folder: Path, *, what: str = "report folder", fix: str = "choose another with --out DIR") -> None:
    """Fail before any work if a folder the run writes cannot be written."""
    try:
        make_folder(folder)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        fail_usage(f"{folder}: {what} is not writable ({error.strerror}); {fix}")


def report(plan: Plan) -> int:
    """`nox -s report`: merge shard folders if asked, judge what the stacks wrote, write the report; the exit status."""
    if plan.merge:
        try:
            shards.merge(plan)
        except ConfigError as error:
            fail_usage(error)
    if not any(layout.stack_dir(plan.settings.out_dir, s.name).is_dir() for s in plan.stacks):
        fail_usage(f"{plan.settings.out_dir}: no stack results to report on; run `{command('compare')}` first")
    if not plan.keep_artifacts:  # they stay in the result cache, by digest: a folder sized for CI
        artifacts.release(plan)
    results = judge_or_exit(plan)
    paths = write_reports(results, plan.settings.out_dir)
    write_migration(plan, results)
    return _announce("Verdict", results.verdict, paths)


def migrate(plan: Plan) -> None:
    """`nox -s migrate`: the report folder's migration written again from its results (upgrade_gate.migrate)."""
    written = plan.settings.out_dir / "results.json"
    if not written.is_file():
        fail_usage(f"{plan.settings.out_dir}: no results.json to migrate from; run `{command('compare')}` first")
    try:
        results = Results.load(written)
    except RecordError as error:
        fail_usage(f"{written}: {error}; run `{command('report', f'--out {plan.settings.out_dir}')}` to write it again")
    write_migration(plan, results)


def bundle_plan_or_exit(posargs: list[str], invoked_from: str | Path) -> Plan:
    """The report folder's plan (plan_or_exit); ``--models`` picks which of the models it holds to bundle (a phone's
    minutes are dear), where the report session would refuse a selection that is not what the folder holds."""
    args, wanted = list(posargs), None
    for index, word in enumerate(args):
        if word == "--models" and index + 1 < len(args):
            wanted, args = args[index + 1], args[:index] + args[index + 2:]
            break
        if word.startswith("--models="):
            wanted, args = word.partition("=")[2], args[:index] + args[index + 1:]
            break
    plan = plan_or_exit(args, invoked_from, reporting=True)
    if wanted is None:
        return plan
    held = {model.name: model for model in plan.models}
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    unknown = [name for name in names if name not in held]
    if unknown or not names:
        fail_usage(f"--models: {', '.join(unknown) or 'no model named'}: {plan.settings.out_dir} holds "
                   f"{', '.join(held)}; name models it holds")
    return replace(plan, models=tuple(held[name] for name in names))


def bundle(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """`nox -s bundle`: the report folder's artifacts as a device runs them (measure/device.py, docs/device.md)."""
    folder = device.write_bundle(plan, log)
    if folder is None:
        fail_usage(f"{plan.settings.out_dir}: no model both stacks ran to bundle (the reasons above); run "
                   f"`{command('compare', f'--out {plan.settings.out_dir}')}` first")
    log(f"bundle: {folder}: run {folder / 'run-on-device.sh'} with a phone attached over adb, or with --host on the "
        f"machine to measure; then `{command('device-results', f'FILE --out {plan.settings.out_dir}')}`")


def results_file_or_exit(posargs: list[str], invoked_from: str | Path) -> tuple[Path, list[str]]:
    """`device-results FILE [OPTION ...]`: the results file (from where the command was typed) and the options."""
    if not posargs or posargs[0].startswith("-"):
        fail_usage(f"device-results takes the file run-on-device.sh wrote first: "
                   f"`{command('device-results', 'FILE --out REPORT')}`")
    return Path(invoked_from) / posargs[0], list(posargs[1:])


def targets(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """`nox -s targets`: latency on each machine of [tool.upgrade-gate.targets], over ssh (measure/targets.py)."""
    if not plan.settings.targets:
        fail_usage(f"{plan.settings.config_path}: no [tool.upgrade-gate.targets]; add one, e.g. "
                   'pi5 = "ssh://ci@pi5.lab:22" (docs/device.md)')
    measure_targets(plan, log)


def device_results(plan: Plan, results: Path) -> int:
    """`upgrade-gate device-results FILE`: a device's rounds read into the report, judged again; the exit status."""
    device.read_in(plan, results)
    return report(plan)


def compare(plan: Plan, venvs: dict[str, Path], log: Callable[[str], Any] = print) -> Results | AdapterProblem:
    """Every step in one process, for stacks whose venvs are made (their bin/ folders by stack name):
    the results written to the plan's report folder, or the first adapter that cannot be used."""
    for spec in plan.stacks:
        problem = probe(plan, spec, venvs[spec.name])
        if problem is not None:
            return problem
    for spec in plan.stacks:
        run_models(plan, spec, venvs[spec.name], log=log)
    measure(plan, log=log)
    results = judge_or_exit(plan)
    write_reports(results, plan.settings.out_dir, step_summary=False)
    return results


def judge_or_exit(plan: Plan) -> Results:
    """``judge``; a record that does not read means a damaged folder: the run is not judged, exit 3."""
    try:
        return judge(plan)
    except RecordError as error:
        again = command("compare", f"--out {plan.settings.out_dir}")
        fail_incomplete(f"{plan.settings.out_dir}: {error}; run `{again}` again: it rewrites "
                        "the records (the result cache copies back what finished)")


def judge(plan: Plan) -> Results:
    """The results every report renders; a record that does not read raises RecordError."""
    models = gather(plan)
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
    if plan.candidates and (diff := write_project_diff(plan.settings.out_dir, project_results,
                                                       plan.candidates[0].name)) is not None:
        paths.append(diff)
    return _announce("Project compatibility", verdict, paths)


def _announce(title: str, verdict: VerdictRecord, paths: list[Path]) -> int:
    """Every gate's line, the verdict and where the report is, on the console; the exit status."""
    for gate in verdict.gates:
        print(gate)
    print(f"{title}: {verdict.verdict}" + "".join(f"  [{n}: {headline(verdict, n)}]" for n in verdict.candidates))
    print("Report: " + ", ".join(str(p) for p in paths))
    return verdict.verdict.exit_code
