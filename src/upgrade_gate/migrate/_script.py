"""``export.py``: the team's own export script around the recipe the candidate's adapter wrote (compat/contract.py,
WritesExportScript), with a judged remedy's lines at the step they replace. It needs the candidate stack's packages
and the team's code only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from upgrade_gate import layout
from upgrade_gate.config.catalog import FP32, ModelEntry
from upgrade_gate.config.specs import StackSpec

# The package name the worker gives models/ (compat/common.py MODELS_PACKAGE): a built-in factory's module is in it.
MODELS_PACKAGE = "upgrade_gate_models"


@dataclass(frozen=True, kw_only=True, slots=True)
class Written:
    """What the script writes and how each file is checked: file → (its methods in the artifact's order, the SHA-256
    the verdict judged it by, or None where only its remedied methods were judged, one by one: ``remedied_sha256``,
    method → the file its remedy's gates judged, the method lowered alone)."""

    files: dict[str, tuple[tuple[str, ...], str | None]]
    remedied_sha256: dict[str, str] = field(default_factory=dict)
    # Why a file is checked by its outputs, not its bytes (said in the script).
    by_outputs: str = "its bytes as one program were never judged"

    @property
    def checked_by_outputs(self) -> bool:
        return any(sha256 is None for _, sha256 in self.files.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class RemedyLines:
    """A judged remedy as the script applies it: what it does, the step its lines replace (compat/diagnose/
    remedy_trial.py REPLACED_STEPS) and each method's lines, as the report printed them."""

    what: str
    replaces: str
    code: dict[str, str]  # method → its lines


# What a remedy's lines start from and what they leave, by the step they replace: the function's parameters and
# the names it returns.
REMEDY_SIGNATURES = {"lowering": ("program", "program, partitioner"),
                     "export": ("model, example_inputs", "program"),
                     "quantization": ("", None),  # binds the recipe's own name: quantize() takes it
                     "capture": ("module, inputs", "captured")}  # the program quantize_captured() takes

HEAD = '''\
"""{model}: the {stack} artifact upgrade-gate judged, rebuilt by an export script of the team's own.

Run it with the {stack} stack's Python ({description}), from any folder:

    {python} {here}/export.py [--out DIR]

It builds the model with the factory upgrade-gate was configured with ({factory}), loads the weights and inputs every
stack was judged with (beside this file), {steps}, and writes {files} (into the current folder, or --out). Then it
checks {check}, and exits 1 where they differ.
The stack's packages: {requirements}.
"""

import argparse
import collections
import copy
import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
'''

BODY = '''

HERE = Path(__file__).resolve().parent
FACTORY = {factory!r}  # module:function
# Where the factory's module is imported from: the team's project, or upgrade-gate's built-in models (a package).
PROJECT = {project!r}
BUILT_IN_MODELS = {models!r}
ASSETS = {assets!r}  # the converted weights and photos upgrade-gate's built-in models read
QUANTIZED = {quantized!r}  # the variant's recipe runs (quantize above); fp32 exports the model as it is
# Each file the script writes, its methods in the artifact's order, and the SHA-256 the verdict judged it by (None:
# a program whose remedied methods were judged one by one; its outputs are checked against the judged ones instead).
FILES = {files}
# Each remedied method lowered alone: the file the remedy's gates judged (verdict.json's remedies).
REMEDIED_SHA256 = {remedied}
# An output within this relative L2 of the judged one is the judged output (a program checked by its outputs), and
# why such a program is not checked by its bytes.
OUTPUTS_REL_L2 = 1e-6
BY_OUTPUTS = {by_outputs!r}


def tensors(name):
    with np.load(HERE / name, allow_pickle=False) as data:
        return {{key: torch.from_numpy(data[key].copy()) for key in data.files}}


def factory():
    module_name, _, function = FACTORY.partition(":")
    if BUILT_IN_MODELS:
        spec = importlib.util.spec_from_file_location({package!r}, Path(BUILT_IN_MODELS) / "__init__.py",
                                                      submodule_search_locations=[BUILT_IN_MODELS])
        package = importlib.util.module_from_spec(spec)
        sys.modules[{package!r}] = package
        spec.loader.exec_module(package)
        module_name = f"{package}.{{module_name}}"
        os.environ.setdefault("UPGRADE_GATE_ASSETS", ASSETS)
    else:
        sys.path.insert(0, PROJECT)
    return getattr(importlib.import_module(module_name), function)


def model_and_inputs():
    """Each method's module as every stack built it (the factory, then the weights they shared) and its judged
    inputs."""
    torch.manual_seed(0)
    made = factory()()
    whole = made[0] if isinstance(made, tuple) else made.module  # (module, inputs), or upgrade-gate's ModelCase
    if {weights!r}:
        weights = collections.OrderedDict(tensors("weights.npz"))
        weights._metadata = getattr(whole.state_dict(), "_metadata", {{}})  # the parts' versions, which .npz drops
        whole.load_state_dict(weights, strict=True)
    whole.eval()
    entry_points = {{"forward": whole}} if isinstance(made, tuple) else {{
        name: method.module for name, method in made.entry_points().items()}}
    given = tensors("inputs.npz")
    modules, inputs = {{}}, {{}}
    for methods, _ in FILES.values():
        for name in methods:
            modules[name] = entry_points[name].eval()
            count = sum(1 for key in given if key.startswith(f"{{name}}.input_"))
            inputs[name] = tuple(given[f"{{name}}.input_{{i}}"] for i in range(count))
    return modules, inputs


def lowered_method(name, module, inputs):
    """One method as the judged artifact holds it: run eagerly as every stack ran it first, quantized (and run),
    exported, lowered; a remedied method with its lines at the step they replace."""
    replaces, remedy = REMEDIES.get(name, ("", None))
    with torch.no_grad():
        module(*inputs)
    if QUANTIZED:
        if replaces == "capture":
            module = quantize_captured(remedy(module, inputs).module(), inputs)
        else:
            module = quantize(module, inputs, *([remedy()] if replaces == "quantization" else []))
        with torch.no_grad():
            module(*inputs)  # the quantized model run eagerly, as upgrade-gate compared it
    if replaces == "export":
        return lowered(remedy(module, inputs))
    program, partitioner = exported(module, inputs), None
    if replaces == "lowering":
        program, partitioner = remedy(program)
    return lowered(program, partitioner)


def outputs_differ(data, methods, inputs):
    """Each method of the program ``data`` run on its judged ``inputs`` by ExecuTorch's runtime, against the outputs
    the verdict judged: what differs, or nothing."""
    from executorch.runtime import Runtime

    judged = tensors("outputs.npz")
    program = Runtime.get().load_program(data)
    differ = []
    for name in methods:
        got = program.load_method(name).execute(list(inputs[name]))
        expected = [judged[key] for key in judged if key.startswith(f"{{name}}.")]
        for index, (a, e) in enumerate(zip(got, expected)):
            error = (torch.linalg.vector_norm((a - e).double()) / torch.linalg.vector_norm(e.double()).clamp_min(
                1e-30)).item()
            if error > OUTPUTS_REL_L2:
                differ.append(f"{{name}} output {{index}}: relative L2 {{error:.2e}} from the judged output")
        if len(got) != len(expected):
            differ.append(f"{{name}}: {{len(got)}} outputs, {{len(expected)}} judged")
    return differ


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path.cwd(), help="where the artifact goes (default: here)")
    out = parser.parse_args().out
    # An export remedy's draft_export writes torch's structured trace to $TORCH_DTRACE, or else leaves it in the
    # system's temporary folder (/tmp/export_<user>): unless the caller names one, to a folder removed at the end.
    trace = tempfile.TemporaryDirectory()
    os.environ.setdefault("TORCH_DTRACE", trace.name)
    modules, inputs = model_and_inputs()
    out.mkdir(parents=True, exist_ok=True)
    failures = 0
    for file, (methods, judged_sha256) in FILES.items():
        made = {{name: lowered_method(name, modules[name], inputs[name]) for name in methods}}
        for name in methods:
            if name in REMEDIED_SHA256 and len(methods) > 1:  # the remedied method as its gates judged it: alone
                alone = hashlib.sha256(program_bytes({{name: copy.deepcopy(made[name])}})).hexdigest()
                if alone != REMEDIED_SHA256[name]:
                    print(f"{{name}} lowered alone with its remedy: SHA-256 {{alone}}, not the judged "
                          f"{{REMEDIED_SHA256[name]}}", file=sys.stderr)
                    failures += 1
        data = program_bytes(made)
        (out / file).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        if judged_sha256 is None:
            differ = outputs_differ(data, methods, inputs)
            for line in differ:
                print(f"{{out / file}}: {{line}}", file=sys.stderr)
            if differ:  # why the bytes were not what is checked may be why the outputs differ
                print(f"{{out / file}}: checked by its outputs, not its bytes: {{BY_OUTPUTS}}", file=sys.stderr)
            failures += bool(differ)
            if not differ:
                alone = [name for name in methods if name in REMEDIED_SHA256 and len(methods) > 1]
                print(f"{{out / file}}: {{len(data)}} bytes, SHA-256 {{digest}}: its outputs are the judged ones "
                      f"(every method within relative L2 {{OUTPUTS_REL_L2:g}}; not its bytes: {{BY_OUTPUTS}})"
                      + (f"; {{', '.join(alone)}} lowered alone: the judged files" if alone else ""))
        elif digest != judged_sha256:
            print(f"{{out / file}}: SHA-256 {{digest}}, not the judged artifact's {{judged_sha256}}: this is not the "
                  "artifact upgrade-gate judged (another stack, or the model's code changed since)", file=sys.stderr)
            failures += 1
        else:
            print(f"{{out / file}}: {{len(data)}} bytes, SHA-256 {{digest}}: the artifact upgrade-gate judged")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def export_script(*, entry: ModelEntry, spec: StackSpec, recipe: str, written: Written, remedy: RemedyLines | None,
                  python: str | None, weights: bool, report: Path) -> str:
    quantized = entry.variant != FP32
    steps = (f"quantizes it with the {entry.variant} recipe (calibrated on those inputs), " if quantized else "") + (
        "exports it with torch.export, lowers it with XNNPACK")
    if remedy is not None:
        steps += f" with the remedy the verdict judged ({remedy.what}, its lines below)"
    check = ("each file's SHA-256 against the one " if not written.checked_by_outputs else
             "what the verdict judged (verdict.json in ") + f"{report}" + (
        "/verdict.json records for it" if not written.checked_by_outputs else
        "): the remedied methods of a program lowered alone by their SHA-256, the file by its outputs on the judged "
        f"inputs (outputs.npz beside this file), since {written.by_outputs}")
    head = HEAD.format(
        model=entry.name, stack=spec.name, description=spec.description, python=python or "python",
        here=layout.entry(report, "migrate") / entry.name, factory=entry.factory, steps=steps,
        files=", ".join(written.files), check=check, requirements=", ".join(str(r) for r in spec.requirements))
    body = BODY.format(
        factory=entry.factory, project=str(entry.project_root) if entry.project_root else None,
        models=None if entry.project_root else str(layout.TOOL_ROOT / "models"),
        assets=_assets_dir(entry), quantized=quantized, files=repr(written.files),
        remedied=repr(written.remedied_sha256), by_outputs=written.by_outputs, package=MODELS_PACKAGE,
        weights=weights)
    return head + "\n" + recipe + _remedy_functions(remedy) + body


def _remedy_functions(remedy: RemedyLines | None) -> str:
    """Each distinct set of the remedy's lines as a function taking what the step it replaces starts from, and
    REMEDIES: method → (the step, the function)."""
    if remedy is None:
        return "\n\n# No remedy: the artifact as configured.\nREMEDIES = {}\n"
    functions: dict[str, str] = {}  # code → its function's name
    for code in remedy.code.values():
        functions.setdefault(code, f"remedy_{len(functions) + 1}" if len(set(remedy.code.values())) > 1 else "remedy")
    parameters, returned = REMEDY_SIGNATURES[remedy.replaces]
    parts = []
    for code, name in functions.items():
        methods = [m for m, c in remedy.code.items() if c == code]
        body = "".join(f"    {line}\n" if line else "\n" for line in code.rstrip("\n").splitlines())
        # A quantization remedy binds what the recipe's quantize() takes in place of its own: PT2E's quantizer, or
        # torchao's module filter (compat/executorch_precision.py keep_float_code).
        bound = returned or ("quantizer" if "quantizer = " in code else "quantized_here")
        parts.append(f"\n\ndef {name}({parameters}):\n"
                     f'    """The remedy the verdict judged for {", ".join(methods)}: {remedy.what}.\n\n'
                     f'    Its lines as the report printed them, in place of the {remedy.replaces} step."""\n'
                     f'{body}    return {bound}\n')
    table = ", ".join(f"{method!r}: ({remedy.replaces!r}, {functions[code]})" for method, code in remedy.code.items())
    return "".join(parts) + f"\n\nREMEDIES = {{{table}}}\n"


def _assets_dir(entry: ModelEntry) -> str | None:
    if entry.project_root:
        return None
    from upgrade_gate.run.asset_build import assets_dir

    return str(assets_dir())
