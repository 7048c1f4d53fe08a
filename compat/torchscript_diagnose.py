"""The legacy stack's culprit search (the Diagnoses capability of compat/contract.py, for
torchscript_mobile.py): its lowering is ``optimize_for_mobile``'s passes over the traced module, so the
parts kept out are passes (its ``optimization_blocklist``), not operators; the remedy is that blocklist,
and the reproducer the traced method itself (TorchScript: it loads without the model's code)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.jit.mobile import _load_for_lite_interpreter
from torch.utils.mobile_optimizer import MobileOptimizerType, optimize_for_mobile

from . import reproducers
from .search import culprit

# What the remedy's code defines, passed as ``optimize_for_mobile(m, optimization_blocklist=...)``.
REMEDY_NAME = "optimization_blocklist"
BACKEND = "optimize_for_mobile pass"
PASSES = dict(MobileOptimizerType.__members__)  # a pybind11 enum: by name, in declaration order


def lowering_parts(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                   start: Any = None) -> tuple[Any, list[dict[str, Any]]]:
    """The traced method, as ``lower`` traces it, and one part per pass of ``optimize_for_mobile``: a pass
    rewrites the whole graph, so it is not run alone and has no line of its own. (No ``start``: this stack does
    not search blocks, so nobody made one.)"""
    traced = torch.jit.trace(module, inputs, strict=False)
    parts = [{"key": name, "kind": name, "backend": BACKEND,
              "module": "", "source": "", "runs_alone": False} for name in PASSES]
    return traced, parts


def lower_keeping_out(traced: Any, keep_out: frozenset[str]) -> Any:
    """``optimize_for_mobile`` with the passes in ``keep_out`` blocklisted (it works on a copy)."""
    return optimize_for_mobile(traced, optimization_blocklist={PASSES[name] for name in keep_out})


def lower_with_remedy(remedy: dict[str, Any]) -> Any:
    """The traced method (``program``) optimized with the remedy's ``optimization_blocklist``."""
    return optimize_for_mobile(remedy["program"], optimization_blocklist=set(remedy[REMEDY_NAME]))


def run_lowered(lowered: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
    """The optimized module saved for the Lite Interpreter and run there, as the artifact would be."""
    program = _load_for_lite_interpreter(io.BytesIO(lowered._save_to_buffer_for_lite_interpreter()))
    with torch.no_grad():
        return program(*inputs)


def remedy_options(traced: Any, culprits: list[tuple[str, str]], *,
                   fused: Sequence[str] = ()) -> list[tuple[str, str, bool]]:
    """One remedy: the blocklist that keeps the culprit passes out of ``optimize_for_mobile`` (a pass is no fused
    pair of operators: ``fused`` is never given here)."""
    return [("passes kept out", _blocklist_code(culprits), False)]


def _blocklist_code(culprits: list[tuple[str, str]]) -> str:
    members = ", ".join(f"MobileOptimizerType.{key}" for _, key in culprits)
    return ("from torch.utils.mobile_optimizer import MobileOptimizerType\n\n"
            f"# optimize_for_mobile(traced, optimization_blocklist=optimization_blocklist)\n"
            f"optimization_blocklist = {{{members}}}\n" if members else
            "# optimize_for_mobile(traced): no pass kept out changes the result\noptimization_blocklist = set()\n")


def reproducer_source(*, kind: str, call: str, arguments: int, threshold: float, remedy: str, found_in: str) -> str:
    raise NotImplementedError("a pass is not run alone: method_reproducer writes this stack's reproducer")


def method_reproducer(traced: Any, inputs: tuple[torch.Tensor, ...], folder: Path, *, kind: str,
                      threshold: float | list[float], remedy: str, found_in: str, fails_with: str = "",
                      program: str = "the whole method") -> None:
    """The traced method, its inputs and a standalone script (torch only) in ``folder`` (``fails_with``: the
    Lite Interpreter's passes do not fail to lower, so it is not read; ``program``: the Lite Interpreter's search
    runs on the whole method, compat/contract.py SearchesBlocks)."""
    torch.jit.save(traced, str(folder / "model.pt"))
    culprit.write_reproducer(folder, inputs, reproducers.torchscript_method(
        kind=kind, torch_version=torch.__version__, found_in=found_in, threshold=threshold, remedy=remedy))
