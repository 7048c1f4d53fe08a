"""``export.py``: the team's own export script around the recipe the candidate's adapter wrote (compat/contract.py,
WritesExportScript). It needs the candidate stack's packages and the team's code only."""

from __future__ import annotations

from pathlib import Path

from upgrade_gate import layout
from upgrade_gate.config.catalog import FP32, ModelEntry
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.schema.verdict import JudgedArtifact

# The package name the worker gives models/ (compat/common.py MODELS_PACKAGE): a built-in factory's module is in it.
MODELS_PACKAGE = "upgrade_gate_models"

HEAD = '''\
"""{model}: the {stack} artifact upgrade-gate judged, rebuilt by an export script of the team's own.

Run it with the {stack} stack's Python ({description}), from any folder:

    {python} {here}/export.py [--out DIR]

It builds the model with the factory upgrade-gate was configured with ({factory}), loads the weights and inputs every
stack was judged with (beside this file), {steps}, and writes {file} (into the current folder, or --out). Then it
checks the file's SHA-256 against the one {report}/verdict.json records for it and exits 1 where they differ.
The stack's packages: {requirements}.
"""

import argparse
import collections
import hashlib
import importlib
import importlib.util
import os
import sys
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
METHOD = {method!r}
QUANTIZED = {quantized!r}  # the variant's recipe runs (quantize above); fp32 exports the model as it is
FILE, JUDGED_SHA256 = {file!r}, {sha256!r}


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
    """The model as every stack built it (the factory, then the weights they shared) and its judged inputs."""
    torch.manual_seed(0)
    made = factory()()
    whole = made[0] if isinstance(made, tuple) else made.module  # (module, inputs), or upgrade-gate's ModelCase
    if {weights!r}:
        weights = collections.OrderedDict(tensors("weights.npz"))
        weights._metadata = getattr(whole.state_dict(), "_metadata", {{}})  # the parts' versions, which .npz drops
        whole.load_state_dict(weights, strict=True)
    whole.eval()
    method = whole if isinstance(made, tuple) else made.entry_points()[METHOD].module
    method.eval()
    inputs = tensors("inputs.npz")
    return method, tuple(inputs[f"{{METHOD}}.input_{{i}}"] for i in range(len(inputs)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path.cwd(), help="where the artifact goes (default: here)")
    out = parser.parse_args().out
    module, inputs = model_and_inputs()
    with torch.no_grad():
        module(*inputs)  # the eager run every stack makes first
    if QUANTIZED:
        module = quantize(module, inputs)
        with torch.no_grad():
            module(*inputs)  # the quantized model run eagerly, as upgrade-gate compared it
    data = artifact_bytes(module, inputs)
    out.mkdir(parents=True, exist_ok=True)
    (out / FILE).write_bytes(data)
    made = hashlib.sha256(data).hexdigest()
    if made != JUDGED_SHA256:
        print(f"{{out / FILE}}: SHA-256 {{made}}, not the judged artifact's {{JUDGED_SHA256}}: this is not the "
              "artifact upgrade-gate judged (another stack, or the model's code changed since)", file=sys.stderr)
        return 1
    print(f"{{out / FILE}}: {{len(data)}} bytes, SHA-256 {{made}}: the artifact upgrade-gate judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def export_script(*, entry: ModelEntry, spec: StackSpec, method: str, recipe: str, artifact: JudgedArtifact,
                  python: str | None, weights: bool, report: Path) -> str:
    quantized = entry.variant != FP32
    steps = (f"quantizes it with the {entry.variant} recipe (calibrated on those inputs), " if quantized else "") + (
        "exports it with torch.export, lowers it with XNNPACK")
    factory = entry.factory
    head = HEAD.format(
        model=entry.name, stack=spec.name, description=spec.description, python=python or "python",
        here=layout.entry(report, "migrate") / entry.name, factory=factory, steps=steps, file=artifact.file,
        report=report, requirements=", ".join(str(r) for r in spec.requirements))
    body = BODY.format(
        factory=factory, project=str(entry.project_root) if entry.project_root else None,
        models=None if entry.project_root else str(layout.TOOL_ROOT / "models"),
        assets=_assets_dir(entry), method=method, quantized=quantized, file=artifact.file, sha256=artifact.sha256,
        package=MODELS_PACKAGE, weights=weights)
    return head + "\n" + recipe + body


def _assets_dir(entry: ModelEntry) -> str | None:
    if entry.project_root:
        return None
    from upgrade_gate.run.asset_build import assets_dir

    return str(assets_dir())
