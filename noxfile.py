"""upgrade-gate sessions.

    nox -s compare [-- --out DIR --suite S --models a,b --fresh]   everything: assets, stacks, runs, report
    nox -s assets                                 convert real weights, prompts and photos (cached)
    nox -s "run(candidate)" [-- --shard K/N …]    build one stack and run the models (or the K-th of N parts) in it
    nox -s measure [-- --out DIR]                 latency rounds, cold start, memory: every stack, interleaved
    nox -s report [-- --out DIR] [SHARD_DIR...]   compare the stacks' records (merging shards), write the report
    nox -s migrate [-- --out DIR --models a,b]    each judged model's export script and MIGRATION.md (migrate/)
    nox -s diff -- OLD NEW                        what changed between two reports
    nox -s prune-cache [-- --out DIR]             keep in the result cache only what that report folder used
    nox -s releases [-- --from V --to V --models a,b --bisect GATE:MODEL --shard K/N]
                                                  every ExecuTorch release in range against the baseline:
                                                  the upgrade-path report (docs/releases.md)
    nox -s compat [-- --out DIR]                  the team's own tests in every stack, and the API scan (docs/compat.md)
    nox -s "project(candidate)"                   install the team's project into one stack and run its tests
    nox -s scan                                   TorchFix and compat/migration_rules.toml over the team's source
    nox -s benchmark -- overhead|noise|sensitivity|coverage [--load quiet|one-core|all-cores|all]
                                                  benchmarks of the measurement (docs/benchmarks.md)
    nox -s benchmark -- gate                      a latency gate's own error rate, exact and simulated
    nox -s benchmark -- stages [--report DIR]     where a finished run's time went, and its floor
    nox -s benchmark -- stop-early [--report DIR] what stopping the rounds early saves, replayed on a run's rounds
    nox -s benchmark -- most-rounds [--report DIR]
                                                  the gates the rounds past `rounds` decided, replayed on a run's rounds
    nox -s benchmark -- zoo [--models a,b] [--report DIR]
                                                  real architectures (timm, torchvision, transformers, ultralytics)
                                                  through both stacks: the zoo's table in docs/benchmarks.md

Installed (`pip install upgrade-gate`), the same sessions run as `upgrade-gate compare`, … in a
team's repository (upgrade_gate.cli), or from the team's own noxfile after `import upgrade_gate.sessions`.

`compare` validates the configuration, then queues `assets`, one `run` session
per stack (the built-in specs in envs/ and the team's, baseline first), then — with [tool.upgrade-gate.project] —
`scan` and one `project` session per stack (a candidate's runs the tests again with the scan's rewrites
applied to a copy: migrate/project.diff), `measure` and `report` last. Each
`run` session's venv *is* the stack: nox builds it with uv from the spec's Python
and requirements. A `project` session builds the same stack in a venv of its own,
so the team's dependencies never change what the models are measured in.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import nox
import nox.virtualenv

# A checkout's own package, even when another checkout is the one pip installed. (Installed, this
# file is upgrade_gate/_tool/noxfile.py: no src/ beside it, and the package is the installed one.)
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from upgrade_gate import layout, pipeline
from upgrade_gate.config.plan import Plan, stacks_of
from upgrade_gate.config.settings import default_config_path, load_settings
from upgrade_gate.errors import EXIT_GO, ConfigError
from upgrade_gate.project.gather import read_scan
from upgrade_gate.project.patched_run import run_patched_tests
from upgrade_gate.project.session import SCAN_PYTHON, SCAN_REQUIREMENTS, record_install_failure, run_scan, run_tests
from upgrade_gate.run import asset_build, guard, runner, venvs

# A checkout's benchmarks (`nox -s benchmark`): a tool of this repository, which the wheel does not carry.
BENCHMARKS = layout.TOOL_ROOT / "tests" / "benchmarks"
# The uv nox builds the venvs with; the stacks' requirements go in with the same one.
UV = nox.virtualenv.find_uv()[1]

nox.needs_version = ">=2025.2.9"
if __name__ != layout.NOXFILE_IN_TEAM_NOXFILE:  # in a team's noxfile (upgrade_gate.sessions), its defaults stay
    nox.options.default_venv_backend = "uv"
    nox.options.sessions = ["compare"]
    nox.options.error_on_missing_interpreters = True

# A cancelled CI job or `kill` stops a session as Ctrl-C does: workers stopped, stages recorded.
guard.stop_on_sigterm()

# Sessions are declared when nox reads this file, so the stack list is read now.
# A broken spec must not stop nox from starting: it is reported, with exit
# status 2, by the session that needs it — so each spec file still names a
# session (python=False: no venv is made for a session that exits 2 at once).
try:
    STACKS: list[tuple[str, str | bool]] = [(s.name, s.python) for s in stacks_of(load_settings(default_config_path()))]
except ConfigError:
    STACKS = [(name, False) for name in dict.fromkeys(
        p.stem for folder in (layout.BUILT_IN_ENVS, default_config_path().parent / "envs")
        for p in sorted(folder.glob("*.toml")))]


@nox.session(python=False)
@guard.guarded
def compare(session: nox.Session) -> None:
    """Build every stack, run the models through each, and write the verdict."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from)
    if plan.fresh:
        runner.forget_fixtures(plan)
    _notify_assets(session, plan)
    for spec in plan.stacks:
        session.notify(f"run({spec.name})", session.posargs)
    if plan.settings.project is not None:
        _notify_project_sessions(session, plan)
    session.notify("measure", session.posargs)
    if plan.settings.targets:
        session.notify("targets", session.posargs)
    session.notify("report", session.posargs)


@nox.session(python=False)
@guard.guarded
def compat(session: nox.Session) -> None:
    """Run the team's own tests in every stack, diff them per test, and scan its source for calls to migrate."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from, models_required=False)
    pipeline.project_or_exit(plan)
    _notify_project_sessions(session, plan)
    session.notify("compat-report", session.posargs)


def _notify_assets(session: nox.Session, plan: Plan) -> None:
    """The assets the run's models read, and no others (a team's own models read none of them)."""
    if plan.assets:
        session.notify("assets", ["--only", ",".join(plan.assets)])


def _notify_project_sessions(session: nox.Session, plan: Plan) -> None:
    # The scan first: a candidate's project session runs the tests again with its rewrites (migrate/project.diff).
    session.notify("scan", session.posargs)
    for spec in plan.stacks:
        session.notify(f"project({spec.name})", session.posargs)


@nox.session(python=asset_build.PYTHON, venv_backend="uv", reuse_venv=True)
@guard.guarded
def assets(session: nox.Session) -> None:
    """Convert the real weights (GGUF, safetensors), prompts and photos once, for every stack (`-- --only a,b`)."""
    try:
        names = asset_build.requested(list(session.posargs))
    except ConfigError as error:
        guard.fail_usage(error)
    target = asset_build.assets_dir()
    todo = asset_build.missing(names)
    if not todo:
        session.log(f"assets: {', '.join(names)}: {target} (cached)")
        return
    session.install(*asset_build.REQUIREMENTS, silent=True)
    session.install("--no-deps", *asset_build.DATA_WHEELS, silent=True)
    session.run("python", "-c", asset_build.BUILD_ONLY, str(layout.ASSET_BUILDERS), str(target), *todo)


@nox.session(venv_backend="uv", reuse_venv=True)
@nox.parametrize("python,stack", [nox.param(python, name, id=name) for name, python in STACKS])
@guard.guarded
def run(session: nox.Session, stack: str) -> None:
    """Install one stack spec into this session's venv and run the models in it."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from)
    pipeline.assets_or_exit(plan)
    spec = plan.stack(stack)
    bin_dir = Path(session.bin)
    extra = plan.extra_requirements(stack)
    # Relative paths (`-e .`) mean the user's project.
    team_folder = plan.settings.config_path.parent
    recipe = venvs.venv_recipe(spec, extra, team_folder)
    venvs.empty_venv_unless_made_from(UV, bin_dir, recipe)
    # uv checks an already satisfied venv in well under a second.
    venvs.install_stack_or_exit(UV, spec, bin_dir)
    error = venvs.install(UV, bin_dir, extra, cwd=team_folder) if extra else None
    if error:
        guard.fail_usage(f"{plan.settings.config_path}: tool.upgrade-gate.extra-requirements: uv could not "
                         f"install {shlex.join(extra)} into stack {stack!r}: {error}")
    venvs.recipe_installed(bin_dir, recipe)
    pipeline.probe_or_exit(plan, spec, bin_dir)
    pipeline.check_project_models_or_exit(plan, spec, bin_dir)
    pipeline.run_models(plan, spec, bin_dir, log=session.log)


@nox.session(venv_backend="uv", reuse_venv=True, default=False)
@nox.parametrize("python,stack", [nox.param(python, name, id=name) for name, python in STACKS])
@guard.guarded
def project(session: nox.Session, stack: str) -> None:
    """Install the team's project into one stack (a venv of its own) and run its tests there."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from, models_required=False)
    settings = plan.settings.project
    if settings is None:  # a CI job that runs for every configuration
        session.skip(f"no [tool.upgrade-gate.project] in {plan.settings.config_path}")
    spec = plan.stack(stack)
    bin_dir = Path(session.bin)
    recipe = venvs.venv_recipe(spec, list(settings.uv_install), settings.root)
    venvs.empty_venv_unless_made_from(UV, bin_dir, recipe)
    error = venvs.install_project(UV, settings, spec, bin_dir)
    if error and spec.is_baseline:
        # The project installs into what it ships on today, or the configuration is wrong.
        guard.fail_usage(f"{settings.defined_in}: tool.upgrade-gate.project.install: uv could not install "
                         f"{shlex.join(settings.install)} into the baseline {stack!r}: {error}")
    if error:
        # The candidate's pins may refuse the project: that is a finding, not a usage error.
        record_install_failure(plan, stack, error, bin_dir)
        session.warn(f"project: does not install into {stack}: {error}")
        return
    venvs.recipe_installed(bin_dir, recipe)
    run = run_tests(plan, settings, stack, bin_dir, log=session.log)
    folder = layout.project_dir(plan.settings.out_dir, stack).relative_to(plan.settings.out_dir)
    session.log(f"project: {stack}: {shlex.join(run['command'])}: {run['status']} in {run['duration_s']:g} s "
                f"→ {folder}")
    if spec.is_baseline:
        return
    patched = run_patched_tests(plan, settings, stack, bin_dir, log=session.log)
    if patched is not None:
        folder = layout.patched_project_dir(plan.settings.out_dir, stack).relative_to(plan.settings.out_dir)
        session.log(f"project: {stack} with project.diff: {patched['status']} in {patched['duration_s']:g} s "
                    f"→ {folder}")


@nox.session(python=SCAN_PYTHON, venv_backend="uv", reuse_venv=True, default=False)
@guard.guarded
def scan(session: nox.Session) -> None:
    """Scan the team's source for calls the candidate changes or removes (TorchFix and compat/migration_rules.toml)."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from, models_required=False)
    settings = plan.settings.project
    if settings is None:
        session.skip(f"no [tool.upgrade-gate.project] in {plan.settings.config_path}")
    session.install(*SCAN_REQUIREMENTS, silent=True)
    target = layout.scan_file(plan.settings.out_dir)
    error = run_scan(plan, Path(session.bin), log=session.log)
    if error:
        guard.fail_usage(f"{settings.defined_in}: tool.upgrade-gate.project.scan: {error}")
    found = read_scan(target)
    session.log(f"scan: {len(found.findings)} findings in {found.files_scanned} files → "
                f"{target.relative_to(plan.settings.out_dir)}")


@nox.session(python=False, name="compat-report", default=False)
@guard.guarded
def compat_report(session: nox.Session) -> None:
    """The project's test diff and scan findings, judged: compat.md and compat.json."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from, models_required=False)
    pipeline.project_or_exit(plan)
    _exit_with(pipeline.compat_report(plan))


@nox.session(python=False)
@guard.guarded
def measure(session: nox.Session) -> None:
    """Time every model in every stack that ran it, the stacks taking turns; cold start and memory."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from)
    pipeline.measure(plan, log=session.log)


@nox.session(python=False, name="prune-cache", default=False)
@guard.guarded
def prune_cache(session: nox.Session) -> None:
    """Keep in the result cache only what the report folder reached (what a CI cache carries to the next run)."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from)
    pipeline.prune_cache(plan, log=session.log)


@nox.session(python=False)
@guard.guarded
def report(session: nox.Session) -> None:
    """Compare the stacks' records in the report folder (or merge shard folders: `-- DIR...`) and write the report."""
    plan = pipeline.plan_or_exit(session.posargs, session.invoked_from, reporting=True)
    _exit_with(pipeline.report(plan))


@nox.session(python=False, default=False)
@guard.guarded
def migrate(session: nox.Session) -> None:
    """The migration a GO hands over, written again from a finished report folder: each judged model's export script
    and MIGRATION.md (migrate/ in the report folder; compare writes it after the report)."""
    pipeline.migrate(pipeline.bundle_plan_or_exit(session.posargs, session.invoked_from))


@nox.session(python=False, default=False)
@guard.guarded
def bundle(session: nox.Session) -> None:
    """A device bundle of a report folder's artifacts, to time both stacks on a phone or board (docs/device.md)."""
    plan = pipeline.bundle_plan_or_exit(session.posargs, session.invoked_from)
    pipeline.bundle(plan, log=session.log)


@nox.session(python=False, default=False)
@guard.guarded
def targets(session: nox.Session) -> None:
    """Latency on each machine of [tool.upgrade-gate.targets], over ssh, from the report's device bundle."""
    plan = pipeline.bundle_plan_or_exit(session.posargs, session.invoked_from)
    pipeline.targets(plan, log=session.log)


@nox.session(python=False, name="device-results", default=False)
@guard.guarded
def device_results(session: nox.Session) -> None:
    """A device's rounds (the bundle's run-on-device.sh) read into the report and judged: `-- FILE --out DIR`."""
    results, options = pipeline.results_file_or_exit(session.posargs, session.invoked_from)
    plan = pipeline.plan_or_exit(options, session.invoked_from, reporting=True)
    _exit_with(pipeline.device_results(plan, results))


@nox.session(python=False, default=False)
@guard.guarded
def releases(session: nox.Session) -> None:
    """Which release to move to: every ExecuTorch release in range against the baseline (docs/releases.md)."""
    from upgrade_gate.releases import explore

    request = explore.request_or_exit(session.posargs, session.invoked_from)
    if request.merge:
        _exit_with(explore.merge(request, log=session.log))
        return
    _notify_assets(session, request.plan)
    session.notify("upgrade-path", session.posargs)


@nox.session(python=False, name="upgrade-path", default=False)
@guard.guarded
def upgrade_path(session: nox.Session) -> None:
    """`releases` after the assets: build, compare and judge each release, then the upgrade-path report."""
    from upgrade_gate.releases import explore

    request = explore.request_or_exit(session.posargs, session.invoked_from)
    _exit_with(explore.explore(request, UV, log=session.log))


def _exit_with(status: int) -> None:
    """A verdict's exit status, with the verdict's own line last on the console: SystemExit passes
    through nox, which would otherwise add "Session … aborted" (session.error) after it, or call any
    other way out "failed". A verdict ends the run, as the report session is the last one queued."""
    if status != EXIT_GO:
        raise SystemExit(status)


@nox.session(python=False, default=False)
@guard.guarded
def diff(session: nox.Session) -> None:
    """What changed between two reports: verdict, gates, metrics beyond noise (`-- OLD NEW`)."""
    from upgrade_gate.report import diff as report_diff

    try:
        print(report_diff.main(list(session.posargs), Path(session.invoked_from)))
    except ConfigError as error:
        guard.fail_usage(error)


@nox.session(python=False, default=False)
@guard.guarded
def benchmark(session: nox.Session) -> None:
    """Benchmarks of the measurement and of a finished run's stages (docs/benchmarks.md)."""
    if not BENCHMARKS.is_dir():
        guard.fail_usage(f"the benchmarks run from a checkout of upgrade-gate: they and their stacks are in its "
                         f"tests/benchmarks/, which an installed package does not carry ({BENCHMARKS})")
    sys.path.insert(0, str(BENCHMARKS.parent))  # a checkout's tests/: the benchmarks are no part of the package
    from benchmarks import benchmark as benchmarks

    if benchmarks.main(session.posargs, log=session.log, invoked_from=Path(session.invoked_from)):
        session.error("the benchmark missed its target")
