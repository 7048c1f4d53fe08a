"""SmolLM2-135M's quantized recipes against ExecuTorch's own Llama recipe, in eager torch (docs/models.md).

Is the 8da4w variant's low token agreement the recipe's, or a defect of upgrade-gate's? This
applies each recipe to the same eager model (models/llama.py, the real weights) and compares
its greedy answers and logits with the fp32 model's, with the metric the report uses
(upgrade_gate.judge.agreement.generation). No export is involved: what an exporter adds is the report's
own "export fidelity" comparison.

Recipes:
- ours: compat/executorch_xnnpack.py's quantize() for 8da4w (torchao, int4 weights in groups
  of 32) and int8-dynamic's eager equivalent (torchao int8 dynamic activations, int8 per-channel
  weights, on nn.Linear);
- ExecuTorch's: examples/models/llama/source_transformation/quantize.py's quantize(), the
  function export_llama applies for ``-qmode 8da4w``, with its default group size (128) and
  with 32 — from the candidate's executorch wheel.

Run in the candidate's venv, from the repository root:

    UPGRADE_GATE_ASSETS=<assets folder> PYTHONPATH=. .nox/run-candidate/bin/python tests/benchmarks/llm_recipes.py

Numbers on the command line pick recipes (1-based, in the order of ``recipes``; eager 8da4w runs
slowly: torchao dequantizes every weight on every call, ≈ 18 min a recipe on a busy 2-core
machine). With ``--pt2e`` it runs the int8-dynamic recipes instead (PT2E, XNNPACKQuantizer). It prints
one JSON object: per recipe, how many Linear layers it quantized, token agreement,
first divergence per prompt, logits SNR, and the seconds it took.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from models import llama  # noqa: E402
from upgrade_gate.judge import agreement  # noqa: E402


def load_adapter() -> Any:
    """compat/executorch_xnnpack.py under the worker's private package name."""
    spec = importlib.util.spec_from_file_location("upgrade_gate_compat", REPO / "compat" / "__init__.py",
                                                  submodule_search_locations=[str(REPO / "compat")])
    assert spec and spec.loader
    package = importlib.util.module_from_spec(spec)
    sys.modules["upgrade_gate_compat"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("upgrade_gate_compat.executorch_xnnpack")


def generate(case: Any) -> dict[str, Any]:
    methods = case.entry_points()

    def call(name: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return list(methods[name].module(*tensors))

    return case.task.drive(call)


def quantized_linears(model: torch.nn.Module) -> int:
    return sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear) and type(m.weight) is not torch.nn.Parameter
               ) or sum(1 for m in model.modules() if "Linear" in type(m).__name__ and type(m) is not torch.nn.Linear)


def with_quantized_llama(quantize: Any) -> tuple[Any, int]:
    """The smollm2 case whose decoder ``quantize`` rewrote in place (prefill and decode share it)."""
    case = llama.smollm2_135m()
    decoder = case.module
    quantized = quantize(decoder) or decoder
    if quantized is not decoder:  # a quantizer that returns a new module: put it where the methods look
        for method in case.entry_points().values():
            method.module.llama = quantized
    return case, quantized_linears(quantized)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    adapter = load_adapter()
    # quantize.py imports the export builder for a dtype enum; the builder imports ExecuTorch's
    # tokenizer package, which the wheel does not carry and no quantizer uses: an empty stand-in.
    sys.modules.setdefault("pytorch_tokenizers", types.SimpleNamespace(get_tokenizer=None))  # type: ignore[arg-type]
    from executorch.examples.models.llama.source_transformation.quantize import quantize as executorch_quantize

    reference = generate(llama.smollm2_135m())
    linears = sum(1 for m in llama.smollm2_135m().module.modules() if isinstance(m, torch.nn.Linear))

    def ours_8da4w(decoder: torch.nn.Module) -> torch.nn.Module:
        quantized, _ = adapter.quantize(decoder, (), "8da4w")
        return quantized

    def torchao_int8_dynamic(decoder: torch.nn.Module) -> None:
        import torchao.quantization as q

        q.quantize_(decoder, q.int8_dynamic_activation_int8_weight())

    def pt2e_dynamic(on_every_linear: bool) -> Any:
        """XNNPACKQuantizer's dynamic per-channel config through PT2E, on each method's own capture:
        on nn.Linear modules (upgrade-gate's int8-dynamic) or set globally (export_llama's
        --pt2e_quantize xnnpack_dynamic, which also takes the functional linears). The converted
        graph runs in eager torch: the lowering is what the report's export fidelity judges."""
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        def quantize(method: Any) -> torch.nn.Module:
            config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
            quantizer = (XNNPACKQuantizer().set_global(config) if on_every_linear
                         else XNNPACKQuantizer().set_module_type(torch.nn.Linear, config))
            captured = torch.export.export_for_training(method.module, method.inputs).module()
            prepared = prepare_pt2e(captured, quantizer)
            prepared(*method.inputs)
            return convert_pt2e(prepared)

        return quantize

    if "--pt2e" in sys.argv:
        per_method = {
            "upgrade-gate int8-dynamic (PT2E, XNNPACKQuantizer dynamic on nn.Linear)": pt2e_dynamic(False),
            "ExecuTorch export_llama --pt2e_quantize xnnpack_dynamic (set globally)": pt2e_dynamic(True),
        }
        results = {"reference_text": reference["text"], "recipes": {}}
        for name, quantize in per_method.items():
            start = time.perf_counter()
            case = llama.smollm2_135m()
            converted = {method: quantize(entry) for method, entry in case.entry_points().items()}
            dq = sum(1 for m in converted.values() for n in m.graph.nodes if "choose_qparams" in str(n.target))

            def call(method: str, *tensors: torch.Tensor, converted: dict[str, Any] = converted) -> list[Any]:
                with torch.no_grad():
                    return list(converted[method](*tensors))

            answer = case.task.drive(call)
            found = agreement.generation(answer["tokens"], reference["tokens"], answer["step_logits"].numpy(),
                                         reference["step_logits"].numpy())
            results["recipes"][name] = {"dynamic_quantize_points": dq, **found.values, "text": answer["text"],
                                        "seconds": round(time.perf_counter() - start, 1)}
            print(json.dumps({name: results["recipes"][name]}), file=sys.stderr, flush=True)
        print(json.dumps(results, indent=1))
        return

    recipes = {
        "upgrade-gate 8da4w (groups of 32)": ours_8da4w,
        "ExecuTorch export_llama -qmode 8da4w (default group size 128)":
            lambda d: executorch_quantize(copy.deepcopy(d), "8da4w"),
        "ExecuTorch export_llama -qmode 8da4w -G 32":
            lambda d: executorch_quantize(copy.deepcopy(d), "8da4w", group_size=32),
        "torchao int8 dynamic activations, int8 per-channel weights (int8-dynamic's eager kind)": torchao_int8_dynamic,
    }
    # Recipes by number (1-based, in the order above) on the command line; all by default.
    picked = [int(a) for a in sys.argv[1:] if a.isdigit()] or range(1, len(recipes) + 1)
    results: dict[str, Any] = {"linear_layers": linears, "reference_text": reference["text"], "recipes": {}}
    for name, recipe in (list(recipes.items())[i - 1] for i in picked):
        start = time.perf_counter()
        case, count = with_quantized_llama(recipe)
        answer = generate(case)
        found = agreement.generation(answer["tokens"], reference["tokens"], answer["step_logits"].numpy(),
                                     reference["step_logits"].numpy())
        results["recipes"][name] = {"quantized_linears": count, **found.values, "text": answer["text"],
                                    "seconds": round(time.perf_counter() - start, 1)}
        print(json.dumps({name: results["recipes"][name]}), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
