"""A device bundle's runner (``nox -s bundle``: upgrade_gate.measure.device): one stack's artifact of one model on
the machine it runs on, with the stack's Python runtime — ExecuTorch's bundled-program loader for a ``.bpte``, the
Lite Interpreter for a ``.ptl`` — loaded once and timed a round at a time as ``run-on-device.sh`` asks, one JSON
line per round on stdout for the script to append to its results.

It is copied into the bundle alone: standard library at the top, the runtime imported by the command that needs
it, nothing of upgrade-gate. compat/common.py takes the machine's description from here, so that the bundle and
the tool describe a CPU the same way.

    python3 device_runner.py target NAME             the machine, as a results line
    python3 device_runner.py serve --runtime … …     load, verify (.bpte), warm up; then a round per `round N`
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# The ISA extensions that change which kernels a CPU backend picks (XNNPACK dispatches on them): x86 and Arm names
# as /proc/cpuinfo gives them.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "fphp", "asimdhp", "i8mm", "bf16",
             "sve", "sve2", "sme")
# The results file's format; upgrade_gate.schema.device reads it.
RESULTS_FORMAT = 1
# What a bundle's runtimes are, by the artifact's suffix as the bundle holds it.
RUNTIMES = {".bpte": "executorch-bundled", ".ptl": "lite-interpreter"}
# The Lite Interpreter's quantized kernels, set before a quantized .ptl loads (compat/torchscript_mobile.py).
QUANTIZED_ENGINE = "qnnpack"


def cpu_and_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """This machine's CPU by model name, and the ISA extensions of ``ISA_FLAGS`` it has (/proc/cpuinfo, or a
    phone's as adb read it; on a machine without it, the platform's name for the processor and none)."""
    model, flags = platform.processor() or platform.machine() or "unknown", set()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware") and value.strip():
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags |= set(value.split())
    return model, [flag for flag in ISA_FLAGS if flag in flags]


def target(args: argparse.Namespace) -> dict[str, Any]:
    """The machine the rounds run on: this one, or (``--cpuinfo`` …) a phone as adb read it."""
    cpu, isa = cpu_and_isa(Path(args.cpuinfo))
    return {"record": "target", "name": args.name, "cpu": cpu, "architecture": args.machine or platform.machine(),
            "cores": args.cores or os.cpu_count(), "isa": isa, "runner": args.runner}


def executorch_binding() -> Any:
    """ExecuTorch's compiled module, imported directly: the public wrapper imports executorch.exir first, which
    costs ~20 s per process and which a phone app does not have (compat/executorch_runtime.py uses this too)."""
    import torch  # noqa: F401 - first: the extension links against torch's libraries

    # `import a.b as c`, not `from a import b`: only the first raises ModuleNotFoundError for a missing module.
    try:
        import executorch.extension.pybindings._portable_lib as binding
    except ModuleNotFoundError:  # executorch 1.5 renamed the compiled module _C
        import executorch.extension.pybindings._C as binding
    return binding


def _inputs(path: Path, method: str) -> tuple[Any, ...]:
    import numpy as np
    import torch

    with np.load(path) as arrays:
        count = sum(1 for key in arrays.files if key.startswith(f"{method}.input_"))
        return tuple(torch.from_numpy(arrays[f"{method}.input_{i}"].copy()) for i in range(count))


def _time(call: Any, warmup: int, calls: int) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return samples


def executorch_calls(args: argparse.Namespace, methods: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the bundled program and check every method against the outputs bundled with it (ExecuTorch's own
    verification, in the order the bundle recorded them: a method may read what an earlier one wrote); each
    method's call on the fixture's inputs, and what the load said."""
    binding = executorch_binding()
    binding._unsafe_reset_threadpool(args.threads)  # before any load (compat/executorch_xnnpack.py set_threads)
    start = time.perf_counter_ns()
    bundle = binding._load_bundled_program_from_buffer(Path(args.artifact).read_bytes())
    module = binding._load_for_executorch_from_bundled_program(bundle)
    load_ms = (time.perf_counter_ns() - start) / 1e6
    for method in methods:
        module.load_bundled_input(bundle, method, 0)
        module.plan_execute(method)
        module.verify_result_with_bundled_expected_output(bundle, method, 0, args.rtol, args.atol)
    inputs = {method: _inputs(Path(args.inputs), method) for method in methods}
    calls = {method: functools.partial(module.run_method, method, inputs[method]) for method in methods}
    return calls, {"load_ms": load_ms, "verified": True}


def lite_calls(args: argparse.Namespace, methods: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load each method's ``.ptl`` in the Lite Interpreter; its call on the fixture's inputs."""
    import torch
    from torch.jit.mobile import _load_for_lite_interpreter

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    torch.backends.quantized.engine = QUANTIZED_ENGINE
    folder, load_ms, calls = Path(args.artifact), 0.0, {}
    for method in methods:
        start = time.perf_counter_ns()
        program = _load_for_lite_interpreter(str(folder / f"{method}.ptl"))
        load_ms += (time.perf_counter_ns() - start) / 1e6
        calls[method] = functools.partial(program, *_inputs(Path(args.inputs), method))
    return calls, {"load_ms": load_ms, "verified": None}


def _failed(line: dict[str, Any], error: Exception) -> dict[str, Any]:
    tail = traceback.format_exception(error)[-3:]
    return {**line, "record": "failed", "error": f"{type(error).__name__}: {error}"[:2000],
            "traceback_tail": [text.rstrip() for text in tail]}


def serve(args: argparse.Namespace, requests: Any, answer: Any) -> int:
    """Load once, warm up, then one round per request (``round N`` on stdin; anything else ends it), as the
    measure session's servers do: each round calls every method once untimed (the other stack ran since), then
    times ``--calls`` calls of it. One JSON line per round on stdout; a load or a round that fails is a
    ``failed`` line, and the server ends."""
    methods = args.methods.split(",")
    line = {"record": "round", "model": args.model, "stack": args.stack, "threads": args.threads, "calls": args.calls}

    def say(data: dict[str, Any]) -> None:
        answer.write(json.dumps(data) + "\n")
        answer.flush()

    try:
        calls, loaded = (executorch_calls if args.runtime == RUNTIMES[".bpte"] else lite_calls)(args, methods)
        for call in calls.values():
            _time(call, args.warmup, 0)
    except Exception as error:  # noqa: BLE001 - a stack that cannot run says how, every round it was asked for
        failure = _failed({**line, "round": 0}, error)
        for request in requests:
            if not request.startswith("round "):
                return 1
            say({**failure, "round": int(request.split()[1])})
        return 1
    for request in requests:
        if not request.startswith("round "):
            break
        number = int(request.split()[1])
        try:
            samples = {}
            for method, call in calls.items():
                call()
                samples[method] = _time(call, 0, args.calls)
        except Exception as error:  # noqa: BLE001 - as above
            say(_failed({**line, "round": number}, error))
            return 1
        say({**line, "round": number, **loaded, "samples_ms": samples})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 device_runner.py")
    commands = parser.add_subparsers(dest="command", required=True)
    machine = commands.add_parser("target")
    machine.add_argument("name")
    machine.add_argument("--cpuinfo", default="/proc/cpuinfo")
    machine.add_argument("--machine", default="")
    machine.add_argument("--cores", type=int, default=0)
    machine.add_argument("--runner", default="python", choices=("python", "adb"))
    rounds = commands.add_parser("serve")
    rounds.add_argument("--runtime", choices=sorted(RUNTIMES.values()), required=True)
    rounds.add_argument("--artifact", required=True, help="the .bpte, or the folder of a stack's .ptl files")
    rounds.add_argument("--inputs", required=True, help="the model's inputs.npz")
    rounds.add_argument("--methods", required=True)
    rounds.add_argument("--model", required=True)
    rounds.add_argument("--stack", required=True)
    rounds.add_argument("--threads", type=int, required=True)
    rounds.add_argument("--warmup", type=int, required=True)
    rounds.add_argument("--calls", type=int, required=True)
    rounds.add_argument("--rtol", type=float, required=True)
    rounds.add_argument("--atol", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args, sys.stdin, sys.stdout)
    sys.stdout.write(json.dumps(target(args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
