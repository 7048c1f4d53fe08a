"""``MIGRATION.md``: what changes for one model — the export, the app's code in each runtime (filled with the
artifact's own method metadata), the verdict's conditions, and the device check to run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from upgrade_gate.config.specs import StackSpec
from upgrade_gate.invocation import command
from upgrade_gate.migrate._script import RemedyLines, Written
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import GateStatus

# A tensor's dtype as each app language holds its data: (Java array, Java Tensor factory, Swift scalar, C++ scalar).
LANGUAGES = {"float32": ("float", "fromBlob", "Float", "float"), "int64": ("long", "fromBlob", "Int64", "int64_t"),
             "int32": ("int", "fromBlob", "Int32", "int32_t"), "int8": ("byte", "fromBlob", "Int8", "int8_t"),
             "uint8": ("byte", "fromBlobUnsigned", "UInt8", "uint8_t")}


def guide(*, results: Results, model: ModelResults, spec: StackSpec, written: Written, remedy: RemedyLines | None,
          signatures: dict[str, dict[str, Any]], python: str | None, report: Path) -> str:
    recipe = _recipe(model.stacks.get(results.baseline.name)), _recipe(model.stacks.get(spec.name))
    lines = [f"# {model.name}: from {results.baseline.name} to {spec.name}", "",
             f"The verdict (`{report}/verdict.json`, {results.verdict.generated_at}): {_judged(results, model, spec)}",
             "", "## The export", "",
             f"- today: {results.baseline.description}" + (
                 f"; {recipe[0]}" if recipe[0] else ""),
             f"- after: {spec.description}" + (f"; {recipe[1]}" if recipe[1] else "")]
    if remedy is not None:
        lines += [f"- with the remedy the verdict judged passing ({remedy.what}): its lines replace the "
                  f"{remedy.replaces} step of {', '.join(remedy.code)}, in `export.py` as the report printed them"]
    lines += _legacy_lines(model.stacks.get(results.baseline.name), results.baseline.name)
    lines += ["", "`export.py` beside this file is that export as the team's own script: it builds the model with its "
              "factory, loads the weights and inputs every stack was judged with, runs the recipe and writes "
              f"{', '.join(f'`{file}`' for file in written.files)}, and checks it is what was judged:", "",
              "```sh", f"{python or 'python'} export.py --out build/", "```", ""]
    for file, (methods, sha256) in written.files.items():
        if sha256 is not None:
            lines.append(f"- `{file}`: it must print SHA-256 `{sha256}`.")
        else:
            lines.append(f"- `{file}`: its methods {', '.join(methods)} in one program, whose bytes were never "
                         "judged as one: the remedied methods were, one by one. It checks each remedied method "
                         "lowered alone (" + ", ".join(f"{m} `{written.remedied_sha256[m][:16]}…`" for m in methods
                                                       if m in written.remedied_sha256)
                         + ") and the program's outputs on the judged inputs against `outputs.npz`.")
    lines += ["", "## The app", ""]
    for file, (methods, _) in written.files.items():
        lines += _app(methods, file, signatures)
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


def _legacy_lines(stack: Any, name: str) -> list[str]:
    """The baseline's export as its adapter writes the lines (compat/contract.py WritesExportLines), each method's:
    what the team's script holds today, which ``export.py`` replaces."""
    written = (stack.details_of("build") if stack is not None else {}).get("export_lines") or {}
    lines = []
    for method, code in written.items():
        lines += ["", f"Today ({name}), `{method}` — `model` the method's module, `example_inputs` its inputs:", "",
                  "```python", code.rstrip("\n"), "```"]
    return lines


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


def _app(methods: tuple[str, ...], file: str, signatures: dict[str, dict[str, Any]]) -> list[str]:
    if not all(signatures.get(m) for m in methods):
        return [f"(The artifact's method metadata was not read: the run stage did not load `{file}`.)", ""]
    lines = [f"`{file}`, the artifact's own metadata:", ""]
    for method in methods:
        lines += [f"- {_named(method, methods)}input {i}: {t['dtype']} {t['sizes']}"
                  for i, t in enumerate(signatures[method]["inputs"])]
        lines += [f"- {_named(method, methods)}output {i}: {t['dtype']} {t['sizes']}"
                  for i, t in enumerate(signatures[method]["outputs"])]
    counts = {m: len(signatures[m]["inputs"]) for m in methods}
    lines += ["", "### Python (ExecuTorch's runtime; was `torch.jit.mobile._load_for_lite_interpreter`)", "",
              "Run beside `inputs.npz` and the artifact, it gives the outputs upgrade-gate judged:", "",
              "```python", "import numpy as np", "import torch", "from executorch.runtime import Runtime", "",
              f'program = Runtime.get().load_program("{file}")']
    if len(methods) == 1:
        ((method, count),) = counts.items()
        lines += [f'method = program.load_method("{method}")', 'with np.load("inputs.npz") as data:',
                  f'    inputs = [torch.from_numpy(data[f"{method}.input_{{i}}"]) for i in range({count})]',
                  "outputs = method.execute(inputs)", "```", ""]
    else:
        lines += ["outputs = {}", 'with np.load("inputs.npz") as data:',
                  f"    for name, count in {counts!r}.items():",
                  '        inputs = [torch.from_numpy(data[f"{name}.input_{i}"]) for i in range(count)]',
                  "        outputs[name] = program.load_method(name).execute(inputs)", "```", ""]
    lines += ["### C++ (`executorch::extension::Module`; was `torch::jit::_load_for_mobile`)", "", "```cpp",
              "#include <executorch/extension/module/module.h>", "#include <executorch/extension/tensor/tensor.h>", "",
              "using namespace ::executorch::extension;", "", f'Module module("{file}");']
    for method in methods:
        names = _inputs(method, methods, signatures)
        for name, tensor in names:
            scalar = LANGUAGES.get(tensor["dtype"], ("", "", "", tensor["dtype"]))[3]
            lines.append(f"auto {name} = make_tensor_ptr({{{_sizes(tensor)}}}, "
                         f"std::vector<{scalar}>({_count(tensor)}));  // your data")
        lines.append(f'const auto {_var(method, methods, "outputs")} = module.execute("{method}", '
                     f'{{{", ".join(n for n, _ in names)}}});')
    lines += ["```", "", "### Android (Java, `org.pytorch.executorch`; was `LiteModuleLoader.load` and `IValue`)", "",
              "```java", "import org.pytorch.executorch.EValue;", "import org.pytorch.executorch.Module;",
              "import org.pytorch.executorch.Tensor;", "", f'Module module = Module.load(filesDir + "/{file}");']
    for method in methods:
        names = _inputs(method, methods, signatures)
        for name, tensor in names:
            array, factory, _, _ = LANGUAGES.get(tensor["dtype"], ("float", "fromBlob", "", ""))
            lines.append(f"Tensor {name} = Tensor.{factory}(new {array}[{_count(tensor)}], "
                         f"new long[] {{{_sizes(tensor)}}});  // your data")
        lines.append(f'EValue[] {_var(method, methods, "outputs")} = module.execute("{method}", '
                     + ", ".join(f"EValue.from({name})" for name, _ in names) + ");")
    lines += ["```", "", "### iOS (Swift, the `ExecuTorch` package)", "", "```swift", "import ExecuTorch", "",
              f'let module = Module(filePath: Bundle.main.path(forResource: "{file.rsplit(".", 1)[0]}", '
              f'ofType: "{file.rsplit(".", 1)[-1]}")!)']
    for method in methods:
        names = _inputs(method, methods, signatures)
        for name, tensor in names:
            scalar = LANGUAGES.get(tensor["dtype"], ("", "", "Float", ""))[2]
            lines.append(f"let {name} = Tensor<{scalar}>([{scalar}](repeating: 0, count: {_count(tensor)}), "
                         f"shape: {tensor['sizes']})  // your data")
        lines.append(f'let {_var(method, methods, "outputs")} = try module.execute("{method}", '
                     f'[{", ".join(n for n, _ in names)}])')
    return [*lines, "```", ""]


def _named(method: str, methods: tuple[str, ...]) -> str:
    return f"`{method}` " if len(methods) > 1 else ""


def _var(method: str, methods: tuple[str, ...], name: str) -> str:
    """A variable of the app's code: ``input0``, or ``decode_input0`` where the program has several methods."""
    return f"{method}_{name}" if len(methods) > 1 else name


def _inputs(method: str, methods: tuple[str, ...], signatures: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(_var(method, methods, f"input{i}"), t) for i, t in enumerate(signatures[method]["inputs"])]


def _sizes(tensor: dict[str, Any]) -> str:
    return ", ".join(str(s) for s in tensor["sizes"])


def _count(tensor: dict[str, Any]) -> int:
    return math.prod(int(s) for s in tensor["sizes"])
