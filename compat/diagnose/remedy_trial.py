"""A remedy tried as a team would try it, written once for every diagnose phase: its program made by the phase's
own steps (its lines run, the method quantized or exported again, lowered), then saved, loaded from its file and
run as the artifact is — each step named for its error, so that a remedy that fails is a finding of its own,
its row naming the step and the error (``failed_at``); one that runs timed against the shipped artifact, in
turns. And the remedy stage's record: each method's row, and the outputs of those that ran, kept for the
parent to judge against the reference as the gate does."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import load_methods, load_npz_tensors, named_like_reference, named_outputs, runtime_said
from ..phases import StageSkipped, failed_at, method_outputs, save_arrays

REMEDY_DIR = "remedy"  # the remedied artifact, <method><SUFFIX>
REMEDY_OUTPUTS = "remedy.npz"  # its outputs, named as the runtime phase names the artifact's
MIN_CALLS, MAX_CALLS = 3, 200  # per side and round of the remedied-against-shipped timing (the budget decides)

# One step of making a remedy's program: what its error is said to have failed at, and what it makes of the
# value the step before it made (the last makes the lowered program).
Step = tuple[str, Callable[[Any], Any]]


@dataclass(frozen=True)
class Ran:
    """A remedy's artifact as loaded from its file, its outputs on the method's inputs, and where its file is
    (relative to the phase's folder) with its size and SHA-256 (what a migration's export script rebuilds)."""

    program: Any
    outputs: Any
    file: str
    bytes: int
    sha256: str


def run_trial(adapter: Any, steps: Sequence[Step], folder: Path, name: str, inputs: tuple[Any, ...],
              made: Any = None) -> Ran | str:
    """``steps`` from ``made`` to a lowered program (none: ``made`` is one), saved as ``folder``/remedy/``name``
    <SUFFIX>, loaded from that file and run on ``inputs``: what ran, or the step it failed at and the error."""
    path = folder / REMEDY_DIR / f"{name}{adapter.SUFFIX}"
    step, value = "", made
    try:
        for named, make in steps:
            step = named  # before the step runs: its error is said at it
            value = make(value)
        step = "saving"
        path.parent.mkdir(parents=True, exist_ok=True)
        adapter.save(value, path)
        step = "loading and running"
        program = runtime_said(adapter.load, path)
        outputs = runtime_said(adapter.run, program, inputs)
    except Exception as failure:  # noqa: BLE001 - recorded with its step; the other remedies go on
        return failed_at(step, failure)
    return Ran(program, outputs, path.relative_to(folder).as_posix(), path.stat().st_size,
               hashlib.sha256(path.read_bytes()).hexdigest())


# The step of an export script a phase's remedy lines take the place of (each phase's REMEDY_REPLACES; a team's
# script, upgrade_gate.migrate, puts them there): "lowering" — they bind the partitioner, and may rewrite the exported
# ``program`` first; "export" — they make ``program`` from ``model`` and ``example_inputs``; "quantization" — they
# bind the recipe's quantizer (or its module filter) in place of the recipe's own; "capture" — they make
# ``captured``, the program a PT2E recipe quantizes, from ``module`` and ``inputs``.
REPLACED_STEPS = ("lowering", "export", "quantization", "capture")


class Remedies:
    """The remedy stage's record: each method's row, and the outputs of the remedies kept, named as the runtime
    phase names the artifact's (its ``eager.npz`` beside the phase's folder), in ``remedy.npz``; and the step of an
    export script the remedies' lines replace (``REPLACED_STEPS``)."""

    def __init__(self, folder: Path, replaces: str) -> None:
        assert replaces in REPLACED_STEPS, replaces
        self.folder, self.replaces = folder, replaces
        reference = folder.parent / "eager.npz"  # the runtime's names for the outputs
        self.names = load_npz_tensors(reference) if reference.is_file() else {}
        self.rows: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, list[tuple[str, Any]]] = {}

    def add(self, method: str, row: dict[str, Any], **more: Any) -> None:
        """The method's row (``more`` beside it), its outputs kept where it ran (``row["outputs"]``, taken out)."""
        if (outputs := row.pop("outputs", None)) is not None:
            self.outputs[method] = named_like_reference(method, named_outputs(outputs), self.names)
        self.rows[method] = {**row, **more}

    def record(self, none: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """The stage's result and details; skipped, saying ``none``, where no method has a row."""
        if not self.rows:
            raise StageSkipped(none)
        if self.outputs:
            save_arrays(self.folder / REMEDY_OUTPUTS, method_outputs(self.outputs))
        return self.rows, {"methods": self.rows, "outputs": REMEDY_OUTPUTS if self.outputs else None,
                           "replaces": self.replaces}


def timed_against_shipped(adapter: Any, job: dict[str, Any], method: str, inputs: tuple[Any, ...],
                          remedied: Any) -> dict[str, Any]:
    """Calls of the remedied and the shipped artifact in turn, round by round (the order alternating),
    in this one process: a ratio whose rounds share the machine's state, as the measure session's do."""
    name = (job.get("artifacts") or {}).get(method)  # beside this phase's folder, in the model's
    beside = Path(job["model_dir"]).parent  # the model's folder
    if not name:
        return {"status": "not timed", "reason": "nothing shipped to time it against: the method did not lower"}
    if not (beside / name).is_file():
        return {"status": "not timed", "reason": "the shipped artifact is not in the report folder"}
    # The shipped method as the app calls it: from its own file, or from the multi-method program.
    calls = {"shipped": load_methods(adapter, beside, {method: name})[method], "remedied": (adapter.run, remedied)}
    for run, program in calls.values():
        run(program, inputs)  # the first call pays for the allocations
    rounds, per_side_s = int(job["rounds"]), float(job["time_budget_s"]) / int(job["rounds"])
    samples = []
    for number in range(rounds):
        order = list(calls) if number % 2 == 0 else list(reversed(calls))
        entry: dict[str, list[float]] = {}
        for side in order:
            run, program = calls[side]
            times: list[float] = []
            started = time.perf_counter()
            while len(times) < MIN_CALLS or (time.perf_counter() - started < per_side_s and len(times) < MAX_CALLS):
                call = time.perf_counter()
                run(program, inputs)
                times.append((time.perf_counter() - call) * 1000)
            entry[side] = times
        samples.append(entry)
    return {"status": "ok", "threads": job["threads"], "rounds": samples, "load_average": os.getloadavg()}
