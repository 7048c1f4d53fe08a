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

from . import culprit

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


METHOD_REPRODUCER = '''"""{kind}: torch {torch_version}'s optimize_for_mobile changes what a method computes.

Found by upgrade-gate in {found_in}
model.pt is the traced method (TorchScript: it loads without the model's code), inputs.pt its real
inputs. Run with the Python of a venv that has torch:

    python repro.py                  # exit 1: the optimized method, run by the Lite Interpreter, differs
    python repro.py --with-remedy    # the same with the remedy's blocklist: exit 0 when it fixes it

Exit 3: it could not run (the error printed): no answer either way.
"""

import io
import sys
from pathlib import Path

# The relative L2 error against the traced method it may have: the numerics gate's, or each output's own.
THRESHOLD = {threshold!r}


def remedy():
{remedy}    return optimization_blocklist


def main():
    import torch
    from torch.jit.mobile import _load_for_lite_interpreter
    from torch.utils.mobile_optimizer import optimize_for_mobile

    here = Path(__file__).parent
    traced = torch.jit.load(str(here / "model.pt"))
    inputs = tuple(torch.load(here / "inputs.pt"))
    blocklist = remedy() if "--with-remedy" in sys.argv else set()
    with torch.no_grad():
        eager = torch.utils._pytree.tree_leaves(traced(*inputs))
        optimized = optimize_for_mobile(traced, optimization_blocklist=blocklist)
        lite = _load_for_lite_interpreter(io.BytesIO(optimized._save_to_buffer_for_lite_interpreter()))
        outputs = torch.utils._pytree.tree_leaves(lite(*inputs))
    errors = [(torch.linalg.vector_norm((a - e).double()) / torch.linalg.vector_norm(e.double())).item()
              for a, e in zip(outputs, eager)]
    limits = THRESHOLD if isinstance(THRESHOLD, list) else [THRESHOLD] * len(errors)
    # The output furthest past what it may depart by (NaN furthest of all); it fails if any is past its own.
    worst = max(range(len(errors)), key=lambda i: errors[i] / limits[i] if errors[i] == errors[i] else float("inf"))
    how = "with the remedy's blocklist" if "--with-remedy" in sys.argv else "by optimize_for_mobile"
    print(f"torch {{torch.__version__}}: the method optimized {{how}}: "
          f"relative L2 error {{errors[worst]:.3g}} against the traced method (threshold {{limits[worst]:g}})")
    return 0 if all(e <= t for e, t in zip(errors, limits)) else 1

''' + culprit.MAIN_GUARD


def method_reproducer(traced: Any, inputs: tuple[torch.Tensor, ...], folder: Path, *, kind: str,
                      threshold: float | list[float], remedy: str, found_in: str, fails_with: str = "",
                      program: str = "the whole method") -> None:
    """The traced method, its inputs and a standalone script (torch only) in ``folder`` (``fails_with``: the
    Lite Interpreter's passes do not fail to lower, so it is not read; ``program``: the Lite Interpreter's search
    runs on the whole method, compat/contract.py SearchesBlocks)."""
    torch.jit.save(traced, str(folder / "model.pt"))
    culprit.write_reproducer(folder, inputs, METHOD_REPRODUCER, kind=kind, torch_version=torch.__version__,
                             found_in=found_in, threshold=threshold, remedy=remedy)
