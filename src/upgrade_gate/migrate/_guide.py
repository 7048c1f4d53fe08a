"""``MIGRATION.md``: what changes for one model — the export, the app's code in each runtime (filled with the
artifact's own method metadata), the verdict's conditions, and the device check to run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from upgrade_gate.config.specs import StackSpec
from upgrade_gate.invocation import command
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import GateStatus, JudgedArtifact

# A tensor's dtype as each app language holds its data: (Java array, Java Tensor factory, Swift scalar, C++ scalar).
LANGUAGES = {"float32": ("float", "fromBlob", "Float", "float"), "int64": ("long", "fromBlob", "Int64", "int64_t"),
             "int32": ("int", "fromBlob", "Int32", "int32_t"), "int8": ("byte", "fromBlob", "Int8", "int8_t"),
             "uint8": ("byte", "fromBlobUnsigned", "UInt8", "uint8_t")}


def guide(*, results: Results, model: ModelResults, spec: StackSpec, method: str, artifact: JudgedArtifact,
          signature: dict[str, Any] | None, python: str | None, report: Path) -> str:
    recipe = _recipe(model.stacks.get(results.baseline.name)), _recipe(model.stacks.get(spec.name))
    lines = [f"# {model.name}: from {results.baseline.name} to {spec.name}", "",
             f"The verdict (`{report}/verdict.json`, {results.verdict.generated_at}): {_judged(results, model, spec)}",
             "", "## The export", "",
             f"- today: {results.baseline.description}" + (
                 f"; {recipe[0]}" if recipe[0] else ""),
             f"- after: {spec.description}" + (f"; {recipe[1]}" if recipe[1] else ""), "",
             "`export.py` beside this file is that export as the team's own script: it builds the model with its "
             "factory, loads the weights and inputs every stack was judged with, runs the recipe and writes "
             f"`{artifact.file}`, and checks it is the judged artifact:", "",
             "```sh", f"{python or 'python'} export.py --out build/", "```", "",
             f"It must print SHA-256 `{artifact.sha256}` ({artifact.bytes} bytes).", "",
             "## The app", ""]
    lines += _app(method, artifact.file, signature)
    lines += ["", "## Conditions", ""]
    lines += _conditions(results, model, spec) or ["- [x] none: every gate of this model passed as configured"]
    lines += ["", "## The device check", "",
              "The artifact was timed on the machine that ran the comparison. Before it ships, time it on the "
              "phones it ships to (docs/device.md):", "",
              "```sh", command("bundle", f"--out {report} --models {model.name}"),
              "# on a machine with the phone attached (adb), or on the device itself with --host:",
              f"{report}/bundle/run-on-device.sh", command("device-results", f"FILE --out {report}"), "```", "",
              "It must show:"]
    lines += _budgets(results, model, spec)
    return "\n".join(lines) + "\n"


def _recipe(stack: Any) -> str:
    if stack is None:
        return ""
    quantized = stack.stage("quantize")
    return f"quantized: {quantized.details['recipe']}" if quantized is not None and quantized.ok and \
        quantized.details.get("recipe") else ""


def _judged(results: Results, model: ModelResults, spec: StackSpec) -> str:
    gates = [g for g in results.verdict.gates if (g.stack, g.model) == (spec.name, model.name)]
    passed = [g.gate for g in gates if g.status is GateStatus.PASSED]
    other = [f"{g.gate} {g.status.value}" for g in gates if g.status is not GateStatus.PASSED]
    return f"{spec.name} passed {', '.join(passed) or 'no gate'}" + (f"; not passed: {', '.join(other)}" if other
                                                                      else "") + "."


def _conditions(results: Results, model: ModelResults, spec: StackSpec) -> list[str]:
    """Each gate of this model that did not pass, and each condition the verdict states of it, as a checklist."""
    found = [f"- [ ] {g.gate} {g.status.value}: {g.measured_text}" for g in results.verdict.gates
             if (g.stack, g.model) == (spec.name, model.name) and g.status is not GateStatus.PASSED]
    remedied = results.verdict.with_remedies.get(spec.name)
    stated = remedied.conditions if remedied else ()
    found += [f"- [ ] {condition}" for condition in stated if model.name in condition]
    return found


def _budgets(results: Results, model: ModelResults, spec: StackSpec) -> list[str]:
    gates = [g for g in results.verdict.gates if (g.stack, g.model) == (spec.name, model.name)
             and g.gate in ("latency", "memory", "artifact-size") and g.threshold is not None]
    return [f"- {g.gate}: {g.threshold_text} (measured here: {g.measured_text})" for g in gates] or [
        "- the same outputs as here (run-on-device.sh checks them first); this model has no latency or memory gate"]


def _app(method: str, file: str, signature: dict[str, Any] | None) -> list[str]:
    if not signature:
        return [f"(The artifact's method metadata was not read: the run stage did not load `{file}`.)"]
    inputs, outputs = signature["inputs"], signature["outputs"]
    lines = [f"`{file}`, method `{method}` (the artifact's own metadata):", ""]
    lines += [f"- input {i}: {t['dtype']} {t['sizes']}" for i, t in enumerate(inputs)]
    lines += [f"- output {i}: {t['dtype']} {t['sizes']}" for i, t in enumerate(outputs)]
    names = [f"input{i}" for i in range(len(inputs))]
    lines += ["", "### Python (ExecuTorch's runtime; was `torch.jit.mobile._load_for_lite_interpreter`)", "",
              "Run beside `inputs.npz` and the artifact, it gives the outputs upgrade-gate judged:", "",
              "```python", "import numpy as np", "import torch", "from executorch.runtime import Runtime", "",
              f'program = Runtime.get().load_program("{file}")', f'method = program.load_method("{method}")',
              'with np.load("inputs.npz") as data:',
              f'    inputs = [torch.from_numpy(data[f"{method}.input_{{i}}"]) for i in range({len(inputs)})]',
              "outputs = method.execute(inputs)", "```", "",
              "### C++ (`executorch::extension::Module`; was `torch::jit::_load_for_mobile`)", "", "```cpp",
              "#include <executorch/extension/module/module.h>", "#include <executorch/extension/tensor/tensor.h>", "",
              "using namespace ::executorch::extension;", "", f'Module module("{file}");']
    for name, tensor in zip(names, inputs):
        scalar = LANGUAGES.get(tensor["dtype"], ("", "", "", tensor["dtype"]))[3]
        sizes = ", ".join(str(s) for s in tensor["sizes"])
        lines.append(f"auto {name} = make_tensor_ptr({{{sizes}}}, std::vector<{scalar}>({_count(tensor)}));"
                     "  // your data")
    lines += [f'const auto outputs = module.execute("{method}", {{{", ".join(names)}}});',
              "if (outputs.ok()) {", "  const auto output0 = outputs->at(0).toTensor();", "}", "```", "",
              "### Android (Java, `org.pytorch.executorch`; was `LiteModuleLoader.load` and `IValue`)", "", "```java",
              "import org.pytorch.executorch.EValue;", "import org.pytorch.executorch.Module;",
              "import org.pytorch.executorch.Tensor;", "", f'Module module = Module.load(filesDir + "/{file}");']
    for name, tensor in zip(names, inputs):
        array, factory, _, _ = LANGUAGES.get(tensor["dtype"], ("float", "fromBlob", "", ""))
        sizes = ", ".join(str(s) for s in tensor["sizes"])
        lines.append(f"Tensor {name} = Tensor.{factory}(new {array}[{_count(tensor)}], new long[] {{{sizes}}});"
                     "  // your data")
    lines += [f'EValue[] outputs = module.execute("{method}", '
              + ", ".join(f"EValue.from({name})" for name in names) + ");",
              "Tensor output0 = outputs[0].toTensor();", "```", "",
              "### iOS (Swift, the `ExecuTorch` package)", "", "```swift", "import ExecuTorch", "",
              f'let module = Module(filePath: Bundle.main.path(forResource: "{file.rsplit(".", 1)[0]}", '
              f'ofType: "{file.rsplit(".", 1)[-1]}")!)']
    for name, tensor in zip(names, inputs):
        scalar = LANGUAGES.get(tensor["dtype"], ("", "", "Float", ""))[2]
        lines.append(f"let {name} = Tensor<{scalar}>([{scalar}](repeating: 0, count: {_count(tensor)}), "
                     f"shape: {tensor['sizes']})  // your data")
    lines += [f'let outputs = try module.execute("{method}", [{", ".join(names)}])', "```"]
    return lines


def _count(tensor: dict[str, Any]) -> int:
    return math.prod(int(s) for s in tensor["sizes"])
