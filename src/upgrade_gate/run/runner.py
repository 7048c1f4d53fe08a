"""Runs the models in one stack's venv: each model's phases (run/phases.py), ``export-jobs`` models at once,
costliest first. A model whose worker failed or died leaves its record; the run goes on with the next model."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate._confined import remove_file, remove_tree
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.judge.fail_fast import first_hard_failure
from upgrade_gate.run import cache, diagnosis, packages, shards, supervisor, workers
from upgrade_gate.run.phases import StackRun, model_job, run_phase
from upgrade_gate.run.process_group import interrupted
from upgrade_gate.run.progress import Progress
from upgrade_gate.schema.records import RecordError, load_diagnosis, load_stack_model
from upgrade_gate.stages import RUNTIME_STAGES


def probe_stack(plan: Plan, spec: StackSpec, bin_dir: Path) -> dict[str, Any] | None:
    """What is installed in the stack and what its adapter offers (compat/probe.py), kept in stack.json;
    None when the probe did not finish (its log says why)."""
    stack_dir = layout.stack_dir(plan.settings.out_dir, spec.name)
    stack_dir.mkdir(parents=True, exist_ok=True)
    probe_file = stack_dir / layout.PROBE_FILE
    probe_file.unlink(missing_ok=True)
    workers.start_worker(
        bin_dir, "probe", {"out": str(probe_file), "distributions": spec.distributions, "adapter": spec.adapter},
        job_file=stack_dir / "probe-job.json", log_file=stack_dir / "probe.log", plan=plan, first_stage="start",
    )
    probe = json.loads(probe_file.read_text()) if probe_file.is_file() else None
    extras = packages.requirement_names(plan.extra_requirements(spec.name), plan.settings.config_path.parent)
    write_json_atomic(stack_dir / layout.STACK_FILE, {
        "spec": spec.to_dict(), "installed": probe,
        # Beside the spec's own requirements: what the project's extras and every dependency put there.
        "extra_requirements": [{"requirement": requirement, "distribution": name} for requirement, name in extras],
        "packages": packages.installed_versions(bin_dir.parent),
    })
    return probe


def run_stack(plan: Plan, spec: StackSpec, bin_dir: Path, log: Any = print) -> None:
    """Export and run every model of the plan in the stack (probed first: probe_stack)."""
    with (Progress(f"{spec.name}: model phases", 2 * len(plan.models), log=log) as progress,
          workers.fork_servers(plan, bin_dir, spec.adapter, layout.stack_dir(plan.settings.out_dir, spec.name),
                               progress.log) as forks):
        stack = StackRun.start(plan, spec, bin_dir, progress, forks)
        # Exports are single-threaded Python: `export-jobs` of them share the machine. Latency is measured
        # later, by the measure session, when no stack has anything else to do.
        remove_file(layout.stopped_file(plan.settings.out_dir, spec.name), within=plan.settings.out_dir)
        if plan.fail_fast and spec.name != plan.baseline.name:
            # Each model's checks right after its export, and no model started after a hard gate failed.
            stop, started = threading.Event(), set[str]()
            _in_parallel(plan, phase_order(plan, spec.name, plan.models, layout.EXPORT),
                         functools.partial(_export_and_check, stack, stop, started), stop=stop)
            if stop.is_set():
                for model in plan.models:  # an earlier run's records of a model not reached are not this run's
                    if model.name not in started:
                        remove_tree(layout.model_dir(plan.settings.out_dir, spec.name, model.name),
                                    within=plan.settings.out_dir)
                shards.describe(plan, spec.name)
                return
            # The operators behind the departures after every runtime phase: the checks that decide come first.
            jobs = {model.name: job for model in plan.models
                    if (job := diagnosis.diagnose_job(plan, spec.name, model)) is not None}
            for _ in jobs:
                progress.add()
            _in_parallel(plan, phase_order(plan, spec.name, [m for m in plan.models if m.name in jobs],
                                           layout.DIAGNOSE),
                         lambda model: run_phase(stack, model, layout.DIAGNOSE, extra=jobs[model.name]))
        else:
            _in_parallel(plan, phase_order(plan, spec.name, plan.models, layout.EXPORT),
                         functools.partial(_model_phases, stack))
    shards.describe(plan, spec.name)


def phase_order(plan: Plan, stack: str, models: Sequence[ModelEntry], phase: str) -> list[ModelEntry]:
    """``models``, costliest ``phase`` first, so that the ``export-jobs`` workers finish together: a long phase
    started last runs alone while the other cores idle.

    The cost is the seconds the phase took when this stack last ran it, where every model has a record (an
    export's with its diagnose phase: issue 40, SmolLM2's outlasts its export many times over); otherwise
    parameters × methods from another stack's build records (the baseline runs first); the rest in suite order.
    """
    out = plan.settings.out_dir

    def seconds(model: ModelEntry) -> float | None:
        try:
            if phase == layout.DIAGNOSE:
                found = load_diagnosis(out, stack, model.name)
                stages = list(found[0]) if found else []
            else:
                record = load_stack_model(out, stack, model.name)
                ran = layout.EXPORT in record.facts  # its file is there (a missing phase reads as a stage "not-run")
                stages = [s for s in record.stages if s.stage not in RUNTIME_STAGES] if ran else []
                diagnosed = load_diagnosis(out, stack, model.name) if stages else None
                stages += list(diagnosed[0]) if diagnosed else []
        except RecordError:
            return None  # a damaged record orders nothing; the report names it
        return sum(s.duration_s for s in stages) if stages else None

    def size(model: ModelEntry) -> int | None:
        for other in plan.stacks:
            if other.name == stack:
                continue
            try:
                build = load_stack_model(out, other.name, model.name).stage("build")
            except RecordError:
                continue
            if build is not None and build.ok and isinstance(build.details.get("parameters"), int):
                return int(build.details["parameters"]) * max(1, len(build.details.get("methods") or ()))
        return None

    timed = {model.name: seconds(model) for model in models}
    costs: dict[str, float | int | None] = (dict(timed) if None not in timed.values()
                                            else {model.name: size(model) for model in models})
    known = sorted((m for m in models if costs[m.name] is not None), key=lambda m: -(costs[m.name] or 0))
    return known + [m for m in models if costs[m.name] is None]


def _model_phases(stack: StackRun, model: ModelEntry) -> None:
    """A model's phases in one of the ``export-jobs``: the runtime phase as soon as its export is done, one at a
    time in the stack (two ``profile`` stages never share the machine); then its diagnose phase where it
    departs (issue 40: waiting for the last export left a core idle). A remedy's timing alternates remedied and
    shipped calls in one process, so a neighbour on the other core weighs on both sides alike."""
    run_phase(stack, model, "export")
    if interrupted():  # Ctrl-C: no new worker
        return
    with stack.runtime_turn:
        run_phase(stack, model, "runtime")
    if interrupted():
        return
    job = diagnosis.diagnose_job(stack.plan, stack.spec.name, model)
    if job is not None:
        stack.progress.add()
        run_phase(stack, model, layout.DIAGNOSE, extra=job)


def _export_and_check(stack: StackRun, stop: threading.Event, started: set[str], model: ModelEntry) -> None:
    """``--fail-fast``: one model's export and runtime phases, then its hard gates against the baseline's
    records; the first that fails is written down (``stopped.json``) and stops the run."""
    started.add(model.name)
    for phase in ("export", "runtime"):
        if stop.is_set() or interrupted():  # another model failed, or Ctrl-C: no new worker
            return
        with stack.runtime_turn if phase == "runtime" else contextlib.nullcontext():
            run_phase(stack, model, phase)
    failed = None if interrupted() else first_hard_failure(stack.plan, stack.spec, model)
    with _STOPPING:
        if failed is None or stop.is_set():
            return
        stop.set()
    write_json_atomic(layout.stopped_file(stack.plan.settings.out_dir, stack.spec.name), failed)
    stack.progress.log(f"{stack.spec.name}: {model.name}: hard gate {failed['gate']} failed ({failed['note']}); "
                       "--fail-fast: the phases still running are stopped, no other model is started")
    supervisor.stop_all()  # their stages say "interrupted": not reached, never cached


# One model's failure stops a --fail-fast run: the first to find one.
_STOPPING = threading.Lock()


def _in_parallel(plan: Plan, order: list[ModelEntry], run_one: Callable[[ModelEntry], None],
                 stop: threading.Event | None = None) -> None:
    """A phase of every model in ``order``, up to ``export-jobs`` at once; none started once ``stop`` is set.
    A model marked ``exclusive`` (its export needs most of the memory) waits for the others and runs alone."""
    jobs = plan.settings.export_jobs
    pending = list(order)
    running: dict[Future[None], ModelEntry] = {}
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="phase")
    try:
        while pending or running:
            if stop is not None and stop.is_set():
                pending.clear()
            while pending and len(running) < jobs:
                alone = pending[0].exclusive or any(m.exclusive for m in running.values())
                if alone and running:
                    break
                model = pending.pop(0)
                running[pool.submit(run_one, model)] = model
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                del running[future]
                future.result()
    except BaseException:  # Ctrl-C or a bug: no worker may outlive the run
        supervisor.stop_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def forget_fixtures(plan: Plan) -> None:
    """``--fresh``: the shared inputs and weights are made again too (a project's weights file may have changed)."""
    for model in plan.models:
        remove_tree(layout.fixtures_dir(plan.settings.cache_dir, model.base, cache.model_code_digest(model)),
                    within=plan.settings.cache_dir)


def check_factories(plan: Plan, spec: StackSpec, bin_dir: Path) -> dict[str, dict[str, Any]]:
    """Import and call each project model's factory in the stack; what went wrong, by model."""
    models = [m for m in plan.models if m.project_root]
    if not models:
        return {}
    stack_dir = layout.stack_dir(plan.settings.out_dir, spec.name)
    stack_dir.mkdir(parents=True, exist_ok=True)
    result_file = stack_dir / "factories.json"
    result_file.unlink(missing_ok=True)
    outcome = workers.start_worker(
        bin_dir, "check", {"out": str(result_file), "models": {m.name: model_job(m) for m in models}},
        job_file=stack_dir / "factories-job.json", log_file=stack_dir / "factories.log", plan=plan,
        first_stage="build",
    )
    if not result_file.is_file():
        tail = "\n".join(workers.log_tail(stack_dir / "factories.log"))
        why = outcome.cause or f"exit status {outcome.returncode}"
        return {m.name: {"ok": False, "error": f"the check died ({why}): {tail}"} for m in models}
    return json.loads(result_file.read_text(encoding="utf-8"))
