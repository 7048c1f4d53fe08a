"""Per-operator latency profile of a .pte in the candidate's runtime (executorch_xnnpack's profile()).

profile_pte(path, inputs, runs) -> dict

Two sources, tried in this order:

1. "etdump": ExecuTorch's own event tracer. The program is loaded with
   _load_for_executorch(path, enable_etdump=True), run, the trace written with
   ExecuTorchModule.write_etdump_result_to_file(path) and read with
   executorch.devtools.Inspector. Every kernel call is timed ("native_call_<op>"),
   every delegate call ("DELEGATE_CALL"), and the whole run ("Method::execute").
   The executorch 0.7.0 Linux wheel is built WITHOUT EXECUTORCH_ENABLE_EVENT_TRACER:
   the hooks are preprocessed away, the trace stays empty, the runtime logs
   "No etdump data found ..." and writes no file. This path is then skipped.
2. "perf": Linux perf samples the process (cpu-clock, DWARF call stacks) while it
   runs; each sample is attributed to the first recognizable frame from the leaf:
   a kernel (torch::executor::native::<op>_out -> "aten::<op>.<overload>"), the
   XNNPACK delegate (XnnpackBackend / xnn_* / pthreadpool), the ExecuTorch
   interpreter, or the host (Python, pybind, torch). Times are sample shares of
   the measured wall time of unprofiled runs; call counts come from the
   program's own instruction list (decoded with flatc, no exir import).
   XNNPACK-internal operators are not visible: its microkernels are hidden
   symbols in the wheel and its own profiler is compiled out.

Imports only torch and the compiled runtime at module level (not exir: importing
executorch.devtools costs 12-30 s).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

from .executorch_runtime import binding

_RUNTIME_SO = Path(binding.__file__)
_PKG = _RUNTIME_SO.parents[2]  # .../site-packages/executorch
_HOST = "host (python/pybind/torch)"
_INTERP = "executorch interpreter (dispatch, copies)"


# --------------------------------------------------------------------------- plan
def _flatc() -> str:
    found = shutil.which("flatc") or str(Path(sys.executable).parent / "flatc")
    if not os.access(found, os.X_OK):
        raise FileNotFoundError("flatc (the candidate venv's bin/flatc) is needed to decode the .pte")
    return found


_NON_FINITE = re.compile(r"(?<=: )(-?inf|nan)(?=\s*[,}\]\n])")
_JSON_NON_FINITE = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}


def read_plan(path: Path, method: str = "forward") -> dict[str, Any]:
    """The method's instructions, decoded from the .pte flatbuffer with flatc.

    Returns {"instructions": [name, ...], "per_run": Counter(name -> count)} where a
    name is "aten::<op>.<overload>" for a kernel call or "DELEGATE_CALL:<backend>".
    """
    data = Path(path).read_bytes()
    size = len(data)
    if data[8:12] == b"eh00":  # extended header: flatbuffer size, then segments
        size = int.from_bytes(data[16:24], "little")
    with tempfile.TemporaryDirectory() as tmp:
        for schema in ("program.fbs", "scalar_type.fbs"):
            shutil.copy(_PKG / "exir" / "_serialize" / schema, tmp)
        Path(tmp, "p.bin").write_bytes(data[:size])
        subprocess.run([_flatc(), "--json", "--strict-json", "--raw-binary", "-o", tmp,
                        str(Path(tmp, "program.fbs")), "--", str(Path(tmp, "p.bin"))],
                       check=True, capture_output=True)
        # flatc writes non-finite doubles (an attention mask's -inf) bare, which JSON lacks.
        text = _NON_FINITE.sub(lambda m: _JSON_NON_FINITE[m.group(1)], Path(tmp, "p.json").read_text())
        program = json.loads(text)
    plan = next(p for p in program["execution_plan"] if p["name"] == method)
    ops = [o["name"] + ("." + o["overload"] if o.get("overload") else "") for o in plan.get("operators", [])]
    names = []
    for chain in plan["chains"]:
        for ins in chain.get("instructions", []):
            kind, args = ins["instr_args_type"], ins["instr_args"]
            if kind == "KernelCall":
                names.append(ops[args.get("op_index", 0)])
            elif kind == "DelegateCall":
                names.append("DELEGATE_CALL:" + plan["delegates"][args.get("delegate_index", 0)]["id"])
            else:
                names.append(kind)
    return {"instructions": names, "per_run": Counter(names)}


# ------------------------------------------------------------------------ helpers
def _table(counts: dict[str, dict[str, float]], total_ms: float) -> list[dict[str, Any]]:
    rows = []
    for name, c in counts.items():
        calls = int(c.get("calls", 0)) or None
        rows.append({"name": name, "calls": calls, "total_ms": round(c["ms"], 4),
                     "mean_ms": round(c["ms"] / calls, 4) if calls else None,
                     "share": round(c["ms"] / total_ms, 4) if total_ms else 0.0})
    return sorted(rows, key=lambda r: -r["total_ms"])


def _run(module: Any, inputs: tuple[torch.Tensor, ...], count: int, method: str) -> list[float]:
    wall = []
    for _ in range(count):
        start = time.perf_counter()
        module.run_method(method, tuple(inputs))
        wall.append((time.perf_counter() - start) * 1e3)
    return wall


# ------------------------------------------------------------------------- etdump
def _try_etdump(path: Path, inputs, runs: int, warmup: int, method: str) -> tuple[bytes | None, list[float], float]:
    start = time.perf_counter()
    module = binding._load_for_executorch(str(path), enable_etdump=True, debug_buffer_size=0)
    load_ms = (time.perf_counter() - start) * 1e3
    _run(module, inputs, warmup, method)
    wall = _run(module, inputs, runs, method)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "trace.etdp")
        module.write_etdump_result_to_file(str(out))  # logs and writes nothing if the tracer is compiled out
        data = out.read_bytes() if out.exists() and out.stat().st_size > 0 else None
    return data, wall, load_ms


def aggregate_etdump(etdump: bytes, etrecord: str | None, skip_runs: int) -> dict[str, Any]:
    """Aggregate an ETDump with executorch.devtools.Inspector (imports exir).

    Top-level rows: one per kernel ("native_call_<op>" -> "aten::<op>"), DELEGATE_CALL
    per backend, and the interpreter's share (Method::execute minus both). Events
    logged inside a delegate (XNNPACK built with ENABLE_XNNPACK_PROFILING) are nested
    in DELEGATE_CALL: they go to "delegate_ops", not into the total.
    """
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from executorch.devtools import Inspector
        inspector = Inspector(etdump_data=etdump, etrecord=etrecord)
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"ms": 0.0, "calls": 0})
    inner: dict[str, dict[str, float]] = defaultdict(lambda: {"ms": 0.0, "calls": 0})
    run_ms, load_ms = [], 0.0
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is None:
                continue
            raw = event.perf_data.raw
            if event.name == "Program::load_method":
                load_ms += sum(raw)
                continue
            raw = raw[skip_runs:]
            if event.name == "Method::execute":
                run_ms.extend(raw)
            elif event.is_delegated_op:
                key = event.name + (f" [{'/'.join(event.op_types)}]" if event.op_types else "")
                inner[key]["ms"] += sum(raw)
                inner[key]["calls"] += len(raw)
            elif event.name == "DELEGATE_CALL":
                key = "DELEGATE_CALL:" + (event.delegate_backend_name or "delegate")
                rows[key]["ms"] += sum(raw)
                rows[key]["calls"] += len(raw)
            elif event.name.startswith("native_call_"):
                key = "aten::" + event.name.removeprefix("native_call_")
                rows[key]["ms"] += sum(raw)
                rows[key]["calls"] += len(raw)
            # OPERATOR_CALL wraps native_call_* (kernel + dispatch): left in the interpreter row
    total = sum(run_ms)
    rows[_INTERP] = {"ms": max(total - sum(r["ms"] for r in rows.values()), 0.0), "calls": 0}
    return {"total_ms": total, "runs": len(run_ms), "ops": _table(rows, total),
            "delegate_ops": _table(inner, total), "load_ms_traced": load_ms}


# --------------------------------------------------------------------------- perf
class _Symbols:
    """Dynamic symbols of the runtime .so, to place frames perf cannot name."""

    def __init__(self) -> None:
        out = subprocess.run(["nm", "-D", "--defined-only", str(_RUNTIME_SO)],
                             capture_output=True, text=True).stdout
        rows = (line.split(None, 2) for line in out.splitlines() if line.count(" ") >= 2)
        entries = sorted((int(address, 16), name) for address, _, name in rows)
        self.addrs = [a for a, _ in entries]
        self.names = [n for _, n in entries]

    def is_xnnpack(self, addr: int) -> bool:
        """An unnamed address between two XNNPACK symbols is XNNPACK code (its kernels are hidden)."""
        i = bisect.bisect_right(self.addrs, addr)
        if i == 0 or i >= len(self.names):
            return False
        return all(n.startswith(("xnn_", "pthreadpool", "cpuinfo")) for n in (self.names[i - 1], self.names[i]))


_KERNEL = re.compile(r"torch::executor::native::(?:opt_)?(\w+?)_out\b")


def _kernel_names(plan: dict[str, Any] | None) -> dict[str, str]:
    """Map C++ kernel function stems to the plan's operator names: native_layer_norm -> aten::native_layer_norm.out."""
    names: dict[str, str] = {}
    for op in (plan or {}).get("per_run", {}):
        if op.startswith("DELEGATE_CALL"):
            continue
        base, _, overload = op.split("::")[-1].partition(".")
        suffix = overload.removesuffix("_out").removesuffix("out")
        stem = base if overload in ("", "out") else f"{base}_{suffix}".rstrip("_")
        names.setdefault(stem, op)
        names.setdefault(base, op)
    return names


def _classify(stack: list[tuple[int, str, str]], syms: _Symbols, kernels: dict[str, str]) -> str:
    so = _RUNTIME_SO.name
    for addr, sym, dso in stack:  # leaf first
        if (m := _KERNEL.search(sym)):
            stem = m.group(1)
            return kernels.get(stem) or kernels.get(stem.split("_")[0]) or f"aten::{stem} (kernel)"
        if sym.startswith(("xnn_", "pthreadpool")) or "XnnpackBackend" in sym or "xnnpack::delegate" in sym:
            return "DELEGATE_CALL:XnnpackBackend"
        if sym == "[unknown]" and dso.endswith(so) and syms.is_xnnpack(addr):
            return "DELEGATE_CALL:XnnpackBackend"
        if "executorch::runtime::Method::execute" in sym:
            return _INTERP
    if stack and stack[0][1] == "[unknown]" and stack[0][2].endswith(so):
        return "unattributed (runtime .so, unnamed code)"
    return _HOST


def _perf_samples(module, inputs, runs: int, method: str, frequency: int,
                  min_seconds: float) -> tuple[list[list[tuple[int, str, str]]], int]:
    perf = shutil.which("perf")
    if perf is None:
        raise FileNotFoundError("perf (Debian linux-perf) is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "perf.data")
        proc = subprocess.Popen([perf, "record", "-q", "-e", "cpu-clock", "-F", str(frequency),
                                 "--call-graph", "dwarf,8192", "--no-buildid-cache", "-p", str(os.getpid()),
                                 "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not data.exists() or data.stat().st_size == 0:  # perf has attached once it wrote its header
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                why = proc.stderr.read().decode(errors="replace")[-400:] if proc.stderr else ""
                raise RuntimeError(f"perf record failed: {why}")
            time.sleep(0.05)
        time.sleep(0.2)
        sampled_runs, start = 0, time.perf_counter()
        while sampled_runs < runs or time.perf_counter() - start < min_seconds:  # enough samples for a fast model
            _run(module, inputs, 1, method)
            sampled_runs += 1
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        # perf demangling every symbol of the DSOs it touches is half its time: the few hundred sampled are
        # demangled afterwards, in one call of c++filt (binutils, beside nm), where it is installed.
        demangler = shutil.which("c++filt")
        script = subprocess.run([perf, "script", "--no-inline", *(["--no-demangle"] if demangler else []),
                                 "-i", str(data), "-F", "tid,ip,sym,dso"],
                                capture_output=True, text=True, check=True).stdout
    samples = _stacks(script)
    if demangler:
        mangled = sorted({sym for stack in samples for _, sym, _ in stack if sym.startswith("_Z")})
        said = subprocess.run([demangler, "--no-params"], input="\n".join(mangled), capture_output=True, text=True,
                              check=True).stdout.splitlines()
        names = dict(zip(mangled, said, strict=True)) if len(said) == len(mangled) else {}
        samples = [[(addr, names.get(sym, sym), dso) for addr, sym, dso in stack] for stack in samples]
    return samples, sampled_runs


def _stacks(script: str) -> list[list[tuple[int, str, str]]]:
    """`perf script -F tid,ip,sym,dso`'s samples, each its frames leaf first: (address, symbol, DSO)."""
    samples: list[list[tuple[int, str, str]]] = []
    stack: list[tuple[int, str, str]] | None = None
    for line in script.splitlines():
        if not line.strip():
            if stack:
                samples.append(stack)
            stack = None
        elif not line.startswith((" ", "\t")) or stack is None:
            stack = []
        else:
            parts = line.strip().split(None, 1)
            rest = parts[1] if len(parts) > 1 else ""
            sym, _, dso = rest.rpartition(" (")
            stack.append((int(parts[0], 16), sym.strip(), dso.rstrip(")")))
    if stack:
        samples.append(stack)
    return samples


# -------------------------------------------------------------------------- entry
def profile_pte(path: Path, inputs: tuple[torch.Tensor, ...], runs: int, *, method: str = "forward",
                warmup: int = 2, etrecord: str | None = None, frequency: int = 999, min_seconds: float = 1.0,
                sources: tuple[str, ...] = ("etdump", "perf")) -> dict[str, Any]:
    """Profile `runs` executions of `method`; rows sorted by total time.

    Returns {"source", "runs", "total_ms", "wall_ms_per_run", "ops": [{name, calls,
    total_ms, mean_ms, share}], "plan_per_run", "notes", ...}. Uses the thread count
    the caller set (set it, with _unsafe_reset_threadpool, before calling).
    """
    t0 = time.perf_counter()
    path = Path(path)
    notes: list[str] = []
    try:
        plan = read_plan(path, method)
    except (OSError, subprocess.CalledProcessError, ValueError) as err:  # counts are a bonus: profile without them
        plan = None
        notes.append(f"instruction list unavailable: {err}")
    result: dict[str, Any] | None = None
    if "etdump" in sources:
        data, wall, load_ms = _try_etdump(path, inputs, runs, warmup, method)
        if data is not None:
            result = aggregate_etdump(data, etrecord, skip_runs=warmup)
            result.update(source="etdump", wall_ms_per_run=sum(wall) / len(wall), load_ms=load_ms)
        else:
            notes.append("ETDump empty: this runtime was built without EXECUTORCH_ENABLE_EVENT_TRACER")
    if result is None and "perf" in sources:
        start = time.perf_counter()
        module = binding._load_for_executorch(str(path))
        load_ms = (time.perf_counter() - start) * 1e3
        _run(module, inputs, warmup, method)
        wall = _run(module, inputs, runs, method)  # unprofiled: the times the shares are applied to
        samples, sampled_runs = _perf_samples(module, inputs, runs, method, frequency, min_seconds)
        syms, kernels = _Symbols(), _kernel_names(plan)
        hits = Counter(_classify(s, syms, kernels) for s in samples)
        total = sum(wall)
        per_run = plan["per_run"] if plan else Counter()
        rows = {name: {"ms": total * n / max(len(samples), 1), "calls": per_run.get(name, 0) * runs}
                for name, n in hits.items()}
        for name, n in per_run.items():  # instructions never sampled still ran
            rows.setdefault(name, {"ms": 0.0, "calls": n * runs})
        unwound = sum(1 for s in samples if any(sym != "[unknown]" for _, sym, _ in s[1:]))
        result = {"source": "perf", "total_ms": total, "runs": runs, "wall_ms_per_run": total / runs,
                  "ops": _table(rows, total), "samples": len(samples), "sampled_runs": sampled_runs, "load_ms": load_ms,
                  "unwound_share": round(unwound / max(len(samples), 1), 3)}
        notes.append("perf: times = CPU-sample share x unprofiled wall time; XNNPACK-internal ops not visible")
    if result is None:
        raise RuntimeError("no profile source worked: " + "; ".join(notes))
    result.update(artifact=str(path), method=method, notes=notes,
                  plan_per_run=dict(plan["per_run"]) if plan else None,
                  profile_seconds=round(time.perf_counter() - t0, 2))
    return result
