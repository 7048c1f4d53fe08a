"""The diagnose phase of a float model that is exact but whose profile's time goes to portable kernels, in a
stack's worker: the batch norms the delegate left out because nothing before them was folded into, found in the
exported graph (each after a linear or a convolution, through views only), and the lines that fold each into
the layer before it before export — the model exported, lowered, saved, loaded and run as the artifact is,
compared with eager and timed against the shipped artifact; the measure session then times it beside the
stacks and the latency gate judges it (judge/_remedies.py). One method per stage: build → eager → search →
remedy → task. (issue 39, item 6: levit_128s ran ×2.07 slower, 64% of it in the portable batch norm.)
"""

from __future__ import annotations

import copy
from typing import Any

from ..contract import Adapter, ReExports
from ..phases import PhaseLog
from ..search import culprit
from ..search.export_errors import source_line
from ..search.quoting import python_string
from . import remedy_trial
from .diagnose_phase import WHOLE_MODEL_STAGES, DiagnosePhase

SEARCH = "latency"  # the job's and the build stage's "search"
# What a batch norm's input may pass through after the layer it folds into: views that keep its channels.
VIEWS = ("view", "reshape", "flatten", "_unsafe_view", "clone", "alias")
EXPORT = "program = torch.export.export(model, example_inputs)"
# The lines a team adds to its export script: each batch norm folded into the layer before it, in eval mode.
FOLD = '''import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval


def fold_batch_norm(model, into, norm):
    """The batch norm at ``norm`` folded into the linear or convolution at ``into`` before it: one operator,
    which XNNPACK runs, where the batch norm alone is left to ExecuTorch's portable kernel."""
    layer = model.get_submodule(into)
    fuse = fuse_linear_bn_eval if isinstance(layer, torch.nn.Linear) else fuse_conv_bn_eval
    for path, module in ((into, fuse(layer, model.get_submodule(norm))), (norm, torch.nn.Identity())):
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, module)


for into, norm in [
{pairs}
]:
    fold_batch_norm(model, into, norm)
''' + EXPORT


class LatencyPhase(DiagnosePhase):
    """build → eager → search → remedy → task: the batch norms to fold, and the model exported with them folded."""

    CAPABILITY = ReExports
    NOT_OFFERED = "this stack's adapter exports no module again (compat/contract.py ReExports)"
    STAGES = WHOLE_MODEL_STAGES
    TIMES_FAILING = True
    REMEDY_REPLACES = "export"  # FOLD's lines make the program from the model

    def build(self):
        built, details = super().build()
        return built, {**details, "search": SEARCH}

    def search(self):
        """Each method's batch norms after a linear or a convolution (through views), by module, from its
        exported graph: what the portable kernel runs that folding would hand the delegate."""
        import torch

        methods, inputs = self.log.results["build"]
        shares = self.job.get("portable_share") or {}
        found: dict[str, dict[str, Any]] = {}
        for method in self.methods:
            module = methods[method].module
            exported, _ = self.adapter.export_with(module, inputs[method], EXPORT)
            pairs, calls = [], []
            for node in exported.graph.nodes:
                if node.op != "call_function" or "batch_norm" not in str(node.target):
                    continue
                source = node.args[0]
                while getattr(source, "op", None) == "call_function" and any(v in str(source.target) for v in VIEWS):
                    source = source.args[0]
                if getattr(source, "op", None) != "call_function" or not any(
                        kind in str(source.target) for kind in ("linear", "convolution")):
                    continue
                into, norm = module_path(source), module_path(node)
                layer, batch_norm = submodule(module, into), submodule(module, norm)
                if not (isinstance(layer, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d))
                        and isinstance(batch_norm, torch.nn.modules.batchnorm._BatchNorm)):
                    continue  # a functional call, or a layer the fuser does not take: nothing to fold by module
                pairs.append((into, norm))
                calls.append({"key": culprit.source_key(node), "module": norm,
                              "source": source_line(node.meta.get("stack_trace") or "", {}) or ""})
            if not pairs:
                found[method] = {"status": "not pinned", "tried": [],
                                 "reason": "no batch norm after a linear or a convolution to fold into it"}
                continue
            found[method] = {"status": "found", "tried": [{}], "pairs": pairs, "culprits": [{
                "operator": str(next(n.target for n in exported.graph.nodes if "batch_norm" in str(n.target))),
                "backend": "ExecuTorch's portable kernel", "share": float(shares.get(method, 0.0)),
                "rel_l2_without": 0.0, "calls": calls}]}
        return found, {"methods": found}

    def remedy(self):
        """Each method with its batch norms folded, exported, lowered, saved, loaded from its file and run as
        the artifact is, against eager; timed against the shipped artifact (the measure session times it too)."""
        remedies = remedy_trial.Remedies(self.model_dir, self.REMEDY_REPLACES)
        for method, finding in self.log.results["search"].items():
            if finding.get("status") == "found":
                tried = self.folded(method, finding["pairs"])
                remedies.add(method, tried, tried=[tried])
        return remedies.record("no batch norm to fold")

    def folded(self, method: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        """The method with each batch norm of ``pairs`` folded into the layer before it, as FOLD's lines do, exported,
        then lowered, saved, loaded and run (``tried``)."""
        methods, inputs = self.log.results["build"]
        code = FOLD.format(pairs="\n".join(f"    ({python_string(a)}, {python_string(b)})," for a, b in pairs))

        def its_code(_: None) -> Any:
            # Nothing but the model and its inputs: the lines printed import what they use (issue 63: they did not).
            scope = {"model": copy.deepcopy(methods[method].module), "example_inputs": inputs[method]}
            exec(compile(code, f"<remedy for {method}>", "exec"), scope)  # noqa: S102 - FOLD, our own lines
            return scope["program"]

        what = f"each of the {len(pairs)} batch norm(s) folded into the layer before it, before export"
        return self.tried(method, [("its code", its_code), ("lowering", lambda program: self.adapter.lower_keeping_out(
            program, frozenset()))], remedy=what, code=code)


def module_path(node: Any) -> str:
    """The module a graph node's call was made in (``blocks.0.norm``), from the exporter's module stack."""
    stack = list(node.meta.get("nn_module_stack", {}).values())
    return str(stack[-1][0]) if stack else ""


def submodule(module: Any, path: str) -> Any:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def run_latency_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """The batch norms to fold where the portable kernel takes the time (the worker's ``diagnose``,
    ``search = "latency"``)."""
    LatencyPhase(job, adapter, log).run_stages()
