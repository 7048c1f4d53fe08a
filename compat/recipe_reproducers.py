"""The reproducers' scripts of the export script's recipe failing, as text (compat/reproducers.py holds the
lowerings'): a module whose export raises and a recipe that raises (the export phase's localize stage), and one whose
rounding takes a variant below its gate (the keep-float search, compat/diagnose/precision_phase.py). Each holds the
recipe as the team's export script writes it (compat/executorch_migrate.py) inside a function, so that a Python
without torch answers exit 3, not 1. No torch here: tests/test_quoting.py checks the text without a stack."""

from __future__ import annotations

from .reproducers import indented, script
from .search.quoting import python_string

TORCH_EXPORT_DOC = '''A module exported with torch.export as the team's export script exports it: it raises.

The comments below name the module, the release and where upgrade-gate found it. module.pt is the module as the
model built it (torch.save of the whole module: its classes by reference, the ones no installed package has copied
beside it under their import names), call.pt the arguments of its real call. Run with the Python of a venv that has
torch and the packages the model imports:

    python repro.py                       # exit 1: the export raises as found; 0: it exports the module
    python repro.py --option draft_export # the same with another of the export API's options (OPTIONS below)

Exit 3: it could not run (the module does not load, or another error): no answer either way. Exit 2: usage.
'''

TORCH_EXPORT_CODE = '''
import os
import sys
import tempfile
from pathlib import Path

# The export's error when found, which reproduces when the export raises it.
FAILS_WITH = {fails_with}
FAILS = {fails_as_found}  # what it prints then (upgrade-gate's release explorer reads it as an answer)
# The export API's options as a team's export script writes each, binding program from model and example_inputs;
# the first is the script's own.
OPTIONS = {options}


def main():
    given = sys.argv[1:]
    option = given[1] if given[:1] == ["--option"] and len(given) == 2 else next(iter(OPTIONS))
    if option not in OPTIONS or given not in ([], ["--option", option]):
        print(f"usage: python repro.py [--option NAME], NAME one of: {{', '.join(OPTIONS)}}")
        return 2
    import torch
    import torch.utils._pytree as pytree

    here = Path(__file__).parent
    sys.path.insert(0, str(here))  # the model's own code, copied beside; the installed packages' from the venv
    sys.dont_write_bytecode = True  # the folder stays as it was handed on
    module = torch.load(here / "module.pt", weights_only=False)  # a whole module: upgrade-gate pickled it
    args, kwargs = torch.load(here / "call.pt", weights_only=False)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    slots = [index for index, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    class Call(torch.nn.Module):
        \"\"\"The module called as the model called it: its tensors are the inputs, the rest (None, flags) fixed.\"\"\"

        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *tensors):
            filled = list(leaves)
            for slot, tensor in zip(slots, tensors):
                filled[slot] = tensor
            call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
            return self.inner(*call_args, **call_kwargs)

    scope = {{"torch": torch, "model": Call(), "example_inputs": tuple(leaves[index] for index in slots)}}
    # draft_export writes torch's structured trace to $TORCH_DTRACE, or else leaves it in the system's temporary
    # folder (/tmp/export_<user>): unless the caller names one, to a folder removed when the script ends.
    trace = tempfile.TemporaryDirectory()
    os.environ.setdefault("TORCH_DTRACE", trace.name)
    try:
        with torch.no_grad():
            exec(OPTIONS[option], scope)
    except Exception as failure:
        if FAILS_WITH not in " ".join(str(failure).split()):
            raise  # another failure than the one found: no answer either way (exit 3)
        said = f"{{FAILS}}: {{type(failure).__name__}}: {{FAILS_WITH}}"
        print(f"torch {{torch.__version__}}: torch.export ({{option}}) {{said}}")
        return 1
    print(f"torch {{torch.__version__}}: torch.export ({{option}}) exports the module")
    return 0

'''


def torch_export(*, torch_version: str, found_in: str, module: str, options: list[tuple[str, str]], fails_with: str,
                 fails_as_found: str) -> str:
    """The script that exports the module beside it with the export script's option (``options``: the export API's,
    name and line, the first the script's own; ``--option NAME`` another): exit 1 while it raises ``fails_with``."""
    said = f"torch {torch_version}: torch.export raises on {module}.\nFound by upgrade-gate in {found_in}"
    return script(TORCH_EXPORT_DOC, said, TORCH_EXPORT_CODE, fails_with=python_string(fails_with),
                  fails_as_found=python_string(fails_as_found),
                  options="{" + "".join(f"\n    {python_string(n)}: {python_string(c)}," for n, c in options) + "\n}")


EXECUTORCH_QUANTIZE_DOC = '''A module quantized with the variant's recipe (PT2E, XNNPACKQuantizer): it raises, or
quantizes nothing.

The comments below name the module, the release and where upgrade-gate found it. program.pt2 is the module's
float program as the recipe captures it (torch.export.save), inputs.pt its real inputs; quantize_captured() is the
recipe's quantization of it, as the team's export script writes it. Run with the Python of a venv that has torch
and executorch:

    python repro.py      # exit 1: the recipe raises (or quantizes nothing) as found; 0: it quantizes the module

Exit 3: it could not run (the program does not load, or another error): no answer either way.
'''

EXECUTORCH_QUANTIZE_CODE = '''
import os
import sys
from pathlib import Path

# The recipe's error when found, which the quantization reproduces when it raises it.
FAILS_WITH = {fails_with}
FAILS = {fails_as_found}  # what it prints then (upgrade-gate's release explorer reads it as an answer)
# Found quantizing nothing of the module, without an error: reproduced while no quantize node comes of it.
NOTHING = {nothing}


def recipe():
    """The quantization as the team's export script writes it: its quantize_captured(captured, inputs)."""
{recipe}    return quantize_captured


def main():
    import torch

    # ExecuTorch runs flatc from its own venv's bin/.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    here = Path(__file__).parent
    inputs = tuple(torch.load(here / "inputs.pt"))
    captured = torch.export.load(here / "program.pt2").module()
    quantize_captured = recipe()
    try:
        quantized = quantize_captured(captured, inputs)
    except Exception as failure:
        if NOTHING or FAILS_WITH not in " ".join(str(failure).split()):
            raise  # another failure than the one found: no answer either way (exit 3)
        print(f"torch {{torch.__version__}}: the recipe {{FAILS}}: {{type(failure).__name__}}: {{FAILS_WITH}}")
        return 1
    if NOTHING and not any("quantize_per" in str(node.target) for node in quantized.graph.nodes):
        print(f"torch {{torch.__version__}}: the recipe {{FAILS}}: it quantized nothing of the module")
        return 1
    print(f"torch {{torch.__version__}}: the recipe quantizes the module")
    return 0

'''


def executorch_quantize(*, executorch: str, found_in: str, module: str, recipe: str, fails_with: str,
                        fails_as_found: str, nothing: bool = False) -> str:
    """The script that quantizes the captured program beside it with the variant's recipe (``recipe``: the export
    script's lines, defining ``quantize_captured(captured, inputs)``); ``nothing``: found quantizing none of it."""
    said = (f"ExecuTorch {executorch}: the quantization recipe "
            f"{'quantizes nothing of' if nothing else 'raises on'} {module}.\nFound by upgrade-gate in {found_in}")
    return script(EXECUTORCH_QUANTIZE_DOC, said, EXECUTORCH_QUANTIZE_CODE, fails_with=python_string(fails_with),
                  fails_as_found=python_string(fails_as_found), recipe=indented(recipe), nothing=repr(bool(nothing)))


EXECUTORCH_PRECISION_DOC = '''The variant's recipe (PT2E, XNNPACKQuantizer) on a module, against the float model.

The comments below name the model, the release and where upgrade-gate found it. program.pt2 is the module's
float program as the recipe captures it (torch.export.save), inputs.pt its real inputs, expected.pt the float
model's outputs on them; recipe() is the quantization as the team's export script writes it, remedy() the lines
that leave some layers in float. The quantized program runs eagerly: what is measured is the recipe's rounding,
not a lowering. Run with the Python of a venv that has torch and executorch:

    python repro.py                  # exit 1: quantized, it departs from the float model beyond the gate; 0: not
    python repro.py --with-remedy    # the same, the remedy's layers left in float: exit 0 when that meets the gate

Exit 3: it could not run (the program does not load, or another error): no answer either way.
'''

EXECUTORCH_PRECISION_CODE = '''
import math
import os
import sys
from pathlib import Path

MIN_SNR_DB = {min_snr_db}  # the quantized-numerics gate: the worst output's SNR against the float model ...
MIN_COSINE = {min_cosine}  # ... and its cosine similarity
# Output index → (axis, count): the part of an output a later call reads, where it reads only part.
EXTENTS = {extents}


def recipe():
    """The quantization as the team's export script writes it: its quantize_captured(captured, inputs, quantizer)."""
{recipe}    return quantize_captured


def remedy():
{remedy}    return quantizer


def main():
    import torch

    # ExecuTorch runs flatc from its own venv's bin/.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    here = Path(__file__).parent
    inputs = tuple(torch.load(here / "inputs.pt"))
    expected = list(torch.load(here / "expected.pt"))
    captured = torch.export.load(here / "program.pt2").module()
    quantized = recipe()(captured, inputs, remedy() if "--with-remedy" in sys.argv else None)
    with torch.no_grad():
        outputs = torch.utils._pytree.tree_leaves(quantized(*inputs))
    snr, cosine = math.inf, 1.0  # the worst output's
    for index, (actual, reference) in enumerate(zip(outputs, expected)):
        if index in EXTENTS:
            axis, count = EXTENTS[index]
            actual, reference = actual.narrow(axis, 0, count), reference.narrow(axis, 0, count)
        a, e = actual.double().flatten(), reference.double().flatten()
        error, norm = torch.linalg.vector_norm(a - e).item(), torch.linalg.vector_norm(e).item()
        snr = min(snr, -20 * math.log10(error / norm) if error and norm else (math.inf if not error else -math.inf))
        both = torch.linalg.vector_norm(a).item() * norm
        cosine = min(cosine, torch.dot(a, e).item() / both if both else 1.0)
    how = "with the remedy's layers in float" if "--with-remedy" in sys.argv else "by the recipe"
    print(f"torch {{torch.__version__}}: quantized {{how}}, SNR {{snr:.1f}} dB and cosine {{cosine:.5f}} against the "
          f"float model (the gate: SNR >= {{MIN_SNR_DB:g}} dB, cosine >= {{MIN_COSINE:g}})")
    return 0 if snr >= MIN_SNR_DB and cosine >= MIN_COSINE else 1

'''


def executorch_precision(*, executorch: str, found_in: str, recipe: str, remedy: str, min_snr_db: float,
                         min_cosine: float, extents: dict[int, tuple[int, int]]) -> str:
    """The script that quantizes the captured program beside it with the variant's recipe (``recipe``: the export
    script's lines, defining ``quantize_captured(captured, inputs, quantizer=None)``) and measures it against the
    float model's outputs; ``remedy``: the lines that bind ``quantizer``, some layers left in float."""
    said = (f"ExecuTorch {executorch}: the quantization recipe departs from the float model beyond the gate.\n"
            f"Found by upgrade-gate in {found_in}")
    return script(EXECUTORCH_PRECISION_DOC, said, EXECUTORCH_PRECISION_CODE, recipe=indented(recipe),
                  remedy=indented(remedy), min_snr_db=repr(float(min_snr_db)), min_cosine=repr(float(min_cosine)),
                  extents=repr({int(k): (int(a), int(c)) for k, (a, c) in extents.items()}))
