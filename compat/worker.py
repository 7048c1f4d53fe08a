"""The worker: runs inside one stack's venv, started by the parent as

    python -P compat/worker.py COMMAND JOB

with a job file the parent wrote. It needs nothing but the standard library and
what the stack installs (torch, numpy, the stack's runtime), and answers with
JSON records and ``.npz`` tensors; nothing pickled crosses the process
boundary, because the two sides run different torch versions. The commands:

* ``probe``   — what is installed, and whether the adapter keeps the contract (probe.py)
* ``check``   — do a project's model factories give models the tool can run (probe.py)
* ``export``, ``runtime`` — one phase of one model (export_phase.py, runtime_phase.py; phases.py records it)
* ``diagnose`` — where an artifact departed from eager: the operators behind it, a reproducer, a remedy
  (diagnose_phase.py); for a quantized variant, the layers to keep in float (precision_phase.py); for a
  failed export, the export API's other options (export_remedy_phase.py); for an exact model whose time goes to
  portable batch norms, the lines that fold them before export (latency_phase.py)
* ``measure`` — the server for the parent's interleaved latency rounds (measure_server.py)
* ``bundle`` — a model's artifacts as a device runs them, checked here first (bundle_phase.py; ``nox -s bundle``)
* ``fork-server`` — imports torch and the stack's packages once, then forks a child per ``export``,
  ``runtime`` or ``diagnose`` job the parent sends it (fork_server.py)

Nothing of this repository is on sys.path (``-P``): a user's own package called
``models`` or ``compat`` (the project root is on sys.path for its factories)
imports as theirs. Ours are loaded from their folders under private names.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# The process this one dies with (run/supervisor.py sets it; a forked child's is the fork server).
PARENT_PID_ENV = "UPGRADE_GATE_PARENT_PID"
# compat/ is loaded under this name (a team's adapter file imports ours from it).
COMPAT_PACKAGE = "upgrade_gate_compat"


def _register_package(alias: str, folder: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        alias, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)


def load_adapter(name: str) -> ModuleType:
    """A module of compat/ by name, or a stack spec's own adapter file (a path
    ending in .py), which may build on ours: ``from upgrade_gate_compat import executorch_xnnpack``."""
    if not name.endswith(".py"):
        return importlib.import_module(f"{COMPAT_PACKAGE}.{name}")
    path = Path(name)
    spec = importlib.util.spec_from_file_location(f"{COMPAT_PACKAGE}_spec_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it goes away (Linux):
    a ``kill -9`` of the run must not leave an export writing into its folder."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, 9, 0, 0, 0)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        os._exit(1)


def _load_ours(job: dict[str, Any]) -> Any:
    """compat/ and models/ under their private names (once: a forked child has them); compat's common."""
    if COMPAT_PACKAGE not in sys.modules:
        _register_package(COMPAT_PACKAGE, REPO_ROOT / "compat")
    common = ours("common")
    if common.MODELS_PACKAGE not in sys.modules:
        _register_package(common.MODELS_PACKAGE, REPO_ROOT / "models")
    if job.get("assets_dir"):
        os.environ["UPGRADE_GATE_ASSETS"] = job["assets_dir"]
    return common


# What a fork server imports once (the job's "imports"), beyond the adapter module: for the runtime
# phase, an app that has only the artifacts, what a fresh worker would before loading one (the adapter
# contract's ``load``: nothing of the exporter); for the phases that export, their modules and the
# exporter's (the adapter's ``PRELOAD``).
PRELOADS = {
    "app": ("runtime_phase",),
    "exporter": ("export_phase", "diagnose.diagnose_phase", "diagnose.precision_phase",
                 "diagnose.quantized_lowering_phase", "diagnose.export_remedy_phase", "diagnose.latency_phase"),
}


def fork_server(job: dict[str, Any]) -> dict[str, Any] | None:
    """The stack's packages imported once, then a child forked per request (fork_server.py): the request
    in each child, None in the server when the parent is done. An import that fails here is left to
    the phase that needs it, which records it as a fresh worker would."""
    _load_ours(job)
    preloaded: dict[str, str] = {}
    try:
        adapter = load_adapter(job["adapter"])
    except Exception as error:  # noqa: BLE001 - each phase's own load records it
        adapter, preloaded[job["adapter"]] = None, f"{type(error).__name__}: {error}"
    names = [f"{COMPAT_PACKAGE}.{name}" for name in PRELOADS[job["imports"]]]
    if job["imports"] == "exporter":
        names += list(getattr(adapter, "PRELOAD", ()))
    for name in names:
        try:
            importlib.import_module(name)
            preloaded[name] = "ok"
        except Exception as error:  # noqa: BLE001 - as above
            preloaded[name] = f"{type(error).__name__}: {error}"
    server = ours("fork_server")
    # The threads the imports left: the server forks with no more than these (a warm-up that started a pool
    # would be copied as locks held by nobody).
    threads = server.os_threads()
    if job["imports"] == "exporter" and callable(warm_up := getattr(adapter, "warm_up", None)):
        preloaded["warm_up"] = _warmed(warm_up)
    print(f"imported and built once for every child: {json.dumps(preloaded)}", flush=True)  # the server's log
    # The pipes to the parent, named as measure_server.py's are (and not passed on to a child).
    requests_fd, events_fd = (int(fd) for fd in os.environ.pop("UPGRADE_GATE_CONTROL_FDS").split(","))
    return server.serve(requests_fd, events_fd, preloaded, os_threads=threads)


def _warmed(warm_up: Any) -> str:
    """The adapter's ``warm_up``: what its exporter builds in every process's first lowering and keeps, built
    once in the fork server for every child (compat/executorch_xnnpack.py). A failure is only said: each
    child then builds it itself, as a fresh worker does."""
    start = time.perf_counter()
    try:
        warm_up()
    except Exception as error:  # noqa: BLE001 - recorded in the server's ready event
        return f"{type(error).__name__}: {error}"
    return f"ok in {time.perf_counter() - start:.1f} s"


def ours(name: str) -> Any:
    """One of compat/'s modules, under its private package name."""
    return importlib.import_module(f"{COMPAT_PACKAGE}.{name}")


def phase_of(command: str, job: dict[str, Any]) -> Any:
    """The function that runs an ``export``, ``runtime`` or ``diagnose`` job. Only the phase that runs is imported;
    each by its literal name (tests/test_compat.py reads them). A diagnose job's search
    (upgrade_gate.run.diagnosis) picks its phase, whose module records it as SEARCH."""
    if command == "export":
        return ours("export_phase").run_export_phase
    if command == "runtime":
        return ours("runtime_phase").run_runtime_phase
    if job.get("search") == "keep-float":  # a quantized variant: which layers to leave in float
        return ours("diagnose.precision_phase").run_precision_phase
    if job.get("search") == "quantized-lowering":  # a quantized variant whose lowering departs: its operators
        return ours("diagnose.quantized_lowering_phase").run_quantized_lowering_phase
    if job.get("search") == "export":  # a failed export: the export API's other options
        return ours("diagnose.export_remedy_phase").run_export_remedy_phase
    if job.get("search") == "quantize":  # a recipe that raised: the capture's other options
        return ours("diagnose.quantize_remedy_phase").run_quantize_remedy_phase
    if job.get("search") == "load":  # a program that lowers and does not load: the node the runtime's words name
        return ours("diagnose.load_phase").run_load_phase
    if job.get("search") == "latency":  # exact, its time in portable batch norms: fold them before export
        return ours("diagnose.latency_phase").run_latency_phase
    return ours("diagnose.diagnose_phase").run_diagnose_phase  # an artifact that departs from eager: its operators


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P compat/worker.py")
    parser.add_argument("command", choices=("probe", "check", "export", "runtime", "diagnose", "measure",
                                            "bundle", "fork-server"))
    parser.add_argument("job", type=Path, help="job JSON written by the parent")
    args = parser.parse_args(argv)
    die_with_parent()
    if args.command == "fork-server":
        request = fork_server(json.loads(args.job.read_text(encoding="utf-8")))
        if request is None:  # the server, done
            return 0
        args = parser.parse_args(request["argv"])  # a child: it dies with the server, which dies with the parent
        os.environ[PARENT_PID_ENV] = str(request["server_pid"])
        die_with_parent()
    # Where it was: a crash (segfault, abort) or the supervisor's SIGTERM (a deadline, a stopped run)
    # writes every thread's Python stack into the log (stderr), whose tail the parent records.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    job = json.loads(args.job.read_text(encoding="utf-8"))
    common = _load_ours(job)

    if args.command == "probe":
        try:
            adapter: Any = load_adapter(job["adapter"])
        except Exception as error:  # noqa: BLE001 - the parent names the spec's adapter and the error
            adapter = error
        common.write_json_atomic(Path(job["out"]), ours("probe").probe(job["distributions"], adapter))
        return 0
    if args.command == "check":
        check = ours("probe").check_factory
        common.write_json_atomic(Path(job["out"]), {name: check(entry) for name, entry in job["models"].items()})
        return 0

    adapter = load_adapter(job["adapter"])
    if args.command == "measure":
        server = ours("measure_server")
        channel = server.Channel()
        try:
            server.serve(job, adapter, channel)
        except Exception as error:  # noqa: BLE001 - the parent records it on the stack's measurement
            channel.send("error", **common.error_record(error))
            return 1
        return 0
    if args.command == "bundle":  # its record says what it wrote or why it could not
        ours("bundle_phase").run_bundle_phase(job, adapter)
        return 0
    phases = ours("phases")
    log = phases.PhaseLog(Path(job["model_dir"]) / f"{args.command}.json", job, args.command)
    phase = phase_of(args.command, job)
    phase(job, adapter, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
