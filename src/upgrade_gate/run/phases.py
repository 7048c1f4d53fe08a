"""One model's phase in one stack: copied from the cache entry its key names (run/cache.py), else run by a
fresh worker process under the supervisor. A worker that dies or is killed cannot record anything, so its phase
file is amended (run/workers.py): the stage that was running gets the cause.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate._confined import remove_file, remove_tree
from upgrade_gate.config import catalog
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.errors import RunIncomplete
from upgrade_gate.run import cache, workers
from upgrade_gate.run.asset_build import assets_dir
from upgrade_gate.run.fork_server import ForkServer
from upgrade_gate.run.progress import Progress
from upgrade_gate.schema.records import read_key_record

# Calls of each method under the runtime phase's per-operator profiler (after one untimed call).
PROFILE_RUNS = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class StackRun:
    """One stack's part of a run: where its venv is and what determines its results."""

    plan: Plan
    spec: StackSpec
    bin_dir: Path
    progress: Progress
    # Spec, installed distributions, worker and adapter code: the part of every key this stack shares.
    digest: str
    store: cache.ResultCache
    # What forks each phase's worker with the stack's packages imported (workers.fork_servers); none: fresh.
    fork_servers: dict[str, ForkServer] = dataclasses.field(default_factory=dict)
    # Held by the runtime phase that runs: one at a time, beside the exports (_export_then_runtime).
    runtime_turn: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @classmethod
    def start(cls, plan: Plan, spec: StackSpec, bin_dir: Path, progress: Progress,
              fork_servers: dict[str, ForkServer] | None = None) -> StackRun:
        digest = cache.digest_of({
            "python": spec.python,
            "requirements": [str(r) for r in spec.requirements],
            "adapter": spec.adapter,
            "installed": cache.installed_distributions(bin_dir.parent),
            "worker": cache.worker_code_digest(spec.adapter),
        })
        return cls(plan=plan, spec=spec, bin_dir=bin_dir, progress=progress, digest=digest,
                   store=cache.ResultCache(plan.settings.cache_dir), fork_servers=fork_servers or {})


@dataclass(frozen=True, kw_only=True)  # no slots: ``code`` is computed once, in the instance's __dict__
class PhaseRun:
    """Where a phase's files go, and what its job and key are made of. ``extra``: what its job holds beyond
    every phase's (the diagnose phase's methods and threshold), part of its key."""

    stack: StackRun
    model: ModelEntry
    phase: str
    extra: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.stack.spec.name}: {self.model.name}: {self.phase}"

    @property
    def out(self) -> Path:
        return self.stack.plan.settings.out_dir

    @property
    def model_dir(self) -> Path:
        return layout.model_dir(self.out, self.stack.spec.name, self.model.name)

    @property
    def dir(self) -> Path:
        """The model's folder, or the diagnose phase's own inside it."""
        return self.model_dir / layout.DIAGNOSE if self.phase == layout.DIAGNOSE else self.model_dir

    @functools.cached_property
    def code(self) -> str:
        return cache.model_code_digest(self.model)

    @property
    def fixtures_dir(self) -> Path:
        return layout.fixtures_dir(self.stack.plan.settings.cache_dir, self.model.base, self.code)

    @property
    def file(self) -> Path:
        return self.dir / f"{self.phase}.json"

    def key(self) -> str | None:
        """Its key now (the fixtures a first stack writes are part of it): ``_phase_key``."""
        return _phase_key(self)

    def fresh_folder(self) -> None:
        """Its files of an earlier run, and what depends on them, removed; its folder made."""
        _clear_phase(self.model_dir, self.phase, self.out)
        self.dir.mkdir(parents=True, exist_ok=True)


def run_phase(stack: StackRun, model: ModelEntry, phase: str, *, extra: dict[str, Any] | None = None) -> None:
    """One model's phase in one stack: from the cache if it holds it, else by a worker."""
    run = PhaseRun(stack=stack, model=model, phase=phase, extra=extra or {})
    ran, earlier = _CODE_IN_RUN.get((str(run.out), model.name), (run.code, ""))
    if ran != run.code:
        raise code_changed(model, f"after {earlier} ran")
    run.dir.mkdir(parents=True, exist_ok=True)
    key = run.key()
    if key is not None and not stack.plan.fresh and _reused(run, key):
        return
    start = time.monotonic()
    stack.progress.start(run.label)
    run.fresh_folder()
    cacheable, seconds = _run_worker(run)
    if (method := refused_method(run.file)) is not None:  # the model's configuration: exit 2, nothing stored
        raise catalog.method_refused(model, method)
    _store(run, cacheable, seconds)
    problem = _first_problem(run.file)
    stack.progress.finish(run.label, f"done in {time.monotonic() - start:.1f} s" + (f" ({problem})" if problem else ""))


# (report folder, model) → the digest of the model's code this process's phases ran with, and the last of them:
# every stack's phases of a model in one run use one version of its code (nox runs `compare`'s in one process).
_CODE_IN_RUN: dict[tuple[str, str], tuple[str, str]] = {}


def code_changed(model: ModelEntry, when: str) -> RunIncomplete:
    """A model's code edited while the run used it: the phases after would run other code than those before
    (the candidate's export other inputs than the baseline's), so the run stops rather than charge that to it."""
    return RunIncomplete(f"{model.name}: its code ({model.factory} and the files it imports) changed {when}; the "
                         "phases of one run must use one version of it. What finished is kept: run the same command "
                         "again and it redoes this model with the code as it is now")


def _ran_with_its_code(run: PhaseRun) -> None:
    """The phase, reused or run, used the model's code as it was when it started: the phases after it must too."""
    _CODE_IN_RUN[(str(run.out), run.model.name)] = (run.code, f"{run.stack.spec.name}'s {run.phase} phase")


def _reused(run: PhaseRun, key: str) -> bool:
    """The phase's files copied from the cache entry its key names, if there is a verified one."""
    hit, problem = run.stack.store.lookup(run.stack.spec.name, run.model.name, run.phase, key)
    if problem:
        run.stack.progress.log(f"{run.label}: {problem}")
    if hit is None:
        return False
    run.fresh_folder()
    for file in hit.files:
        (run.dir / file).parent.mkdir(parents=True, exist_ok=True)
        cache.copy_file(hit.path / file, run.dir / file)
    _write_key_record(run.dir, run.phase, key, hit.files, stored=True, reused_from=hit.path, code=run.code)
    _ran_with_its_code(run)
    stored_at = _ago(hit.manifest.get("stored_at"))
    run.stack.progress.finish(run.label, f"reused from the cache (entry {key[:12]}, {stored_at})")
    return True


def _phase_job(run: PhaseRun) -> dict[str, Any]:
    """What the worker is told: the model, the stack's adapter, where to write, the budgets."""
    settings = run.stack.plan.settings
    return {
        **model_job(run.model),
        "stack": run.stack.spec.name,
        "model": run.model.name,
        "variant": run.model.variant,
        "adapter": run.stack.spec.adapter,
        "model_dir": str(run.dir),
        "fixtures_dir": str(run.fixtures_dir),
        # Exports and the checks of the runtime phase run at the first thread count.
        "threads": settings.threads[0],
        "localize_budget_s": settings.localize_budget_s,
        # What a lowering reproducer of the localization compares with eager, where it lowers (a fixed release).
        "max_rel_l2": settings.gates.for_model(run.model.base, "max-rel-l2"),
        "backends_budget_s": settings.backends_budget_s,
        "profile_runs": PROFILE_RUNS if settings.profile else 0,
        **run.extra,
    }


def _run_worker(run: PhaseRun) -> tuple[bool, float]:
    """Whether the worker's result may be cached, and its seconds. Ctrl-C: the running stage is recorded
    interrupted, and the run stops."""
    job = _phase_job(run)
    try:
        outcome = workers.start_worker(
            run.stack.bin_dir, run.phase, job, job_file=run.dir / f"{run.phase}-job.json",
            log_file=run.dir / f"{run.phase}.log", plan=run.stack.plan, phase_file=run.file,
            on_stage=lambda stage: run.stack.progress.stage(run.label, stage),
            fork_server=run.stack.fork_servers.get(run.phase),
        )
    except KeyboardInterrupt:
        workers.mark_interrupted(run.file, job, run.phase)
        raise
    cacheable = workers.record_outcome(run.file, job, run.phase, outcome, run.dir / f"{run.phase}.log", run.stack.plan)
    return cacheable, outcome.elapsed_s


def _store(run: PhaseRun, cacheable: bool, seconds: float) -> None:
    """The phase's files kept in the cache under the key they were made with, and the key record written."""
    files = _phase_files(run.dir, run.phase)
    key = run.key()  # the fixtures exist now if they did not before: the key that names this result includes them
    manifest = {f.relative_to(run.dir).as_posix(): {"bytes": f.stat().st_size} for f in files}
    # Edited while the worker ran: its result may be of either version, so no key names it.
    changed = cache.model_code_digest(run.model) != run.code
    stored = cacheable and key is not None and not changed
    if stored and key is not None:
        manifest = run.stack.store.store(run.stack.spec.name, run.model.name, run.phase, key, files,
                                         {"seconds": round(seconds, 3)}, base=run.dir).files
    _write_key_record(run.dir, run.phase, key, manifest, stored=stored, code=run.code)
    if changed:
        raise code_changed(run.model, f"while {run.stack.spec.name}'s {run.phase} phase ran")
    _ran_with_its_code(run)


def _phase_key(run: PhaseRun) -> str | None:
    """What determines this phase's result; None when it cannot be known (the phase before it was not stored)."""
    stack, model, phase = run.stack, run.model, run.phase
    parts: dict[str, Any] = {
        "phase": phase,
        "stack": stack.digest,
        "model": model.name,
        "variant": model.variant,
        "code": run.code,
        "project_root": str(model.project_root) if model.project_root else None,
        "assets": assets_dir().name,
        "fixtures": cache.fixtures_digest(run.fixtures_dir),
    }
    # Each later phase reads the files of the one before it (whose key includes the one before that).
    before = {"runtime": "export", layout.DIAGNOSE: "runtime"}.get(phase)
    if before is not None:
        record = read_key_record(run.model_dir, before)
        if record is None or not record.get("stored"):
            return None
        parts.update({f"{before}_key": record["key"], f"{before}_files": record["files"]})
    parts["threads"] = stack.plan.settings.threads[0]
    parts["budgets"] = [stack.plan.settings.localize_budget_s, stack.plan.settings.backends_budget_s]
    if not stack.plan.settings.profile:  # only then: the keys of every profiled result stay as they were
        parts["profile"] = False
    parts.update(run.extra)
    return cache.digest_of(parts)


def _write_key_record(model_dir: Path, phase: str, key: str | None, files: dict[str, Any], *, stored: bool,
                      reused_from: Path | None = None, code: str | None = None) -> None:
    """Which key a phase's files belong to, whether they came from the cache, and the model code's digest
    (schema.records.phase_code)."""
    write_json_atomic(layout.key_record_file(model_dir, phase), {
        "key": key, "stored": stored, "reused_from": str(reused_from) if reused_from else None, "files": files,
        **({"code": code} if code is not None else {}),
    })


def _phase_files(phase_dir: Path, phase: str) -> list[Path]:
    """The files a phase left: the export owns everything it finds in the model's folder and its localize folder
    (a reproducer's); the runtime what the export did not write; the diagnose phase everything in its own folder, a
    reproducer's folders too."""
    own_records = {layout.key_record_file(phase_dir, p).name for p in (*layout.PHASES, layout.DIAGNOSE)} | {
        f"{p}-job.json" for p in (*layout.PHASES, layout.DIAGNOSE)}
    export_files = set((read_key_record(phase_dir, "export") or {}).get("files", {})) if phase == "runtime" else set()
    found: Iterable[Path] = phase_dir.rglob("*") if phase == layout.DIAGNOSE else phase_dir.iterdir()
    if phase == layout.EXPORT:
        found = [*found, *(phase_dir / layout.LOCALIZE).rglob("*")]
    return sorted(p for p in found if p.is_file() and not p.name.startswith(".")
                  and p.relative_to(phase_dir).as_posix() not in own_records | export_files)


def _clear_phase(model_dir: Path, phase: str, out: Path) -> None:
    """A new export invalidates everything after it; a new runtime its own files and the diagnosis."""
    remove_tree(model_dir / layout.DIAGNOSE, within=out)
    if phase == layout.DIAGNOSE:
        return
    if phase == "export":
        remove_tree(model_dir / layout.LOCALIZE, within=out)
        doomed = [p for p in model_dir.iterdir() if p.is_file() or p.is_symlink()]
    else:
        doomed = [*_phase_files(model_dir, phase), layout.key_record_file(model_dir, phase)]
    for path in doomed:
        remove_file(path, within=out)


def model_job(model: ModelEntry) -> dict[str, Any]:
    """What the worker needs to build a model: its factory, where to import it from, and the rule its methods'
    names keep (layout.METHOD_SHAPE; compat/common.py refuse_bad_method_names: the worker cannot import layout)."""
    return {
        "factory": model.factory,
        "project_root": str(model.project_root) if model.project_root else None,
        "assets_dir": str(assets_dir()),
        "method_names": {"shape": layout.METHOD_SHAPE.pattern, "reserved": list(layout.RESERVED_METHODS)},
    }


def refused_method(phase_file: Path) -> str | None:
    """The method whose name the worker refused to build (compat/common.py MethodNameRefused), or None."""
    try:
        stages = json.loads(phase_file.read_text(encoding="utf-8")).get("stages") or []
    except (OSError, ValueError, AttributeError):
        return None  # a record that does not read is the report's to name
    refused = [(s.get("error") or {}).get("refused_method") for s in stages if isinstance(s, dict)]
    return next((str(name) for name in refused if name is not None), None)


def _first_problem(phase_file: Path) -> str | None:
    """The first stage that failed, for the progress line; the report says more."""
    try:
        stages = json.loads(phase_file.read_text()).get("stages") or []
    except (OSError, ValueError):
        return "no stage records"
    failed = next((s for s in stages if s.get("status") not in ("ok", "skipped")), None)
    return f"{failed['stage']} {failed['status']}" if failed else None


def _ago(stored_at: Any) -> str:
    if not isinstance(stored_at, (int, float)):
        return "stored earlier"
    return "stored " + time.strftime("%Y-%m-%d %H:%M", time.localtime(stored_at))
