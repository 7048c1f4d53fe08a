"""An exported program as source: its graph's ATen calls (torch.export's own code for them) in ``program.py`` and
the tensors it reads in ``weights.pt``, so that a whole-method reproducer runs in a torch that cannot load the
``program.pt2`` it was found with (torch.export.save's format is not kept across releases: a torch 2.8 program
does not load in 2.11). The method is rebuilt from the source and exported again by the torch that runs it.

Only a graph of plain calls is written (an in-place call is one): one that calls submodules (control flow), writes a
buffer or an input back (a functionalized mutation) or needs a name the header below does not define has no
source, and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .quoting import python_comment

SOURCE = "program.py"
WEIGHTS = "weights.pt"
# What torch.fx's code for a graph may name besides torch (its python_code globals), defined in the header.
HEADER = '''import torch
from math import inf, nan
from torch import device
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

NoneType = type(None)
'''
DEFINED = {"torch", "inf", "nan", "device", "fx_pytree", "pytree", "NoneType"}
# The most weights.pt may hold: it repeats program.pt2's tensors, and a reproducer stays in the report folder a team
# hands on (an LLM's quantized program is 545-655 MB: its reproducer would double). Above it, no program.py.
WEIGHTS_MAX_BYTES = 256 * 2**20

# The docstring is the tool's words; the method's name and the torch that wrote the code are the comment under it.
PROGRAM = '''"""A method as source: torch.export's code for its graph and {weights}, the tensors it reads.
repro.py rebuilds the method from here where program.pt2 does not load, and exports it again."""
{said}

{header}
from pathlib import Path

# The graph's lifted inputs in order, each (placeholder, kind): a parameter, a buffer or a constant tensor.
LIFTED = {lifted}


class Method(torch.nn.Module):
    def __init__(self):
        super().__init__()
        saved = torch.load(Path(__file__).with_name("{weights}"))
        for name, kind in LIFTED:
            if kind == "PARAMETER":
                self.register_parameter(name, torch.nn.Parameter(saved[name], requires_grad=False))
            elif kind == "BUFFER":
                self.register_buffer(name, saved[name])
            else:  # a plain tensor attribute: torch.export lifts it as a constant, as it was
                setattr(self, name, saved[name])

    def forward(self, *inputs):
        return graph(*(getattr(self, name) for name, _ in LIFTED), *inputs)


{code}
'''


def unwritable(exported: Any, code: Any) -> str:
    """Why ``exported`` has no source ("" when it has one); ``code``: torch.fx's code for its graph."""
    from torch.export.graph_signature import InputKind, OutputKind

    signature = exported.graph_signature
    kept = {InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.USER_INPUT}
    if any(spec.kind not in kept for spec in signature.input_specs):
        return "it has inputs other than tensors and weights (a custom object or a token)"
    if any(spec.kind != OutputKind.USER_OUTPUT for spec in signature.output_specs):
        return "it writes a buffer or an input back (a functionalized mutation)"
    if any(node.op in ("get_attr", "call_module") for node in exported.graph_module.graph.nodes):
        return "it calls submodules (control flow)"
    named = set(code.globals) - DEFINED
    return f"its code names {', '.join(sorted(named))}" if named else ""


def write(exported: Any, folder: Path, what: str) -> str:
    """``program.py`` and ``weights.pt`` for ``exported`` in ``folder``; "" when written, else why not. The
    reproducer stands without them (program.pt2 is the method as found): a failure here is a reason, not an error."""
    try:
        code = exported.graph_module.graph.python_code(root_module="self")
        reason = unwritable(exported, code) or _write(exported, code.src, folder, what)
    except Exception as failure:  # noqa: BLE001 - said in the reproducer's docstring, and no program.py is left
        reason = f"writing it failed: {type(failure).__name__}: {' '.join(str(failure).split())[:200]}"
    if reason:
        remove(folder)
    return reason


def remove(folder: Path) -> None:
    """No source in ``folder``: program.py and its weights, whichever are there."""
    for name in (SOURCE, WEIGHTS):
        (folder / name).unlink(missing_ok=True)


def _write(exported: Any, code: str, folder: Path, what: str) -> str:
    import torch  # here: the phase modules that import this one are read without torch too (tests/test_culprit.py)
    from torch.export.graph_signature import InputKind

    tensors = {**exported.state_dict, **exported.constants}
    lifted = [(spec.arg.name, spec.kind.name, spec.target) for spec in exported.graph_signature.input_specs
              if spec.kind != InputKind.USER_INPUT]
    size = sum(tensors[target].numel() * tensors[target].element_size() for _, _, target in lifted)
    if size > WEIGHTS_MAX_BYTES:
        return (f"its weights are {size / 2**20:.0f} MiB, more than the {WEIGHTS_MAX_BYTES // 2**20} MiB a reproducer "
                "may repeat beside program.pt2")
    weights = {name: tensors[target].detach().clone() for name, _, target in lifted}
    # The graph's function takes the lifted tensors and the inputs, in the signature's order.
    code = code.strip().replace("def forward(self, ", "def graph(", 1).replace("def forward(self)", "def graph()", 1)
    torch.save(weights, folder / WEIGHTS)
    (folder / SOURCE).write_text(source_text(what=what, saved_by=torch.__version__,
                                             lifted=[(n, k) for n, k, _ in lifted], code=code), encoding="utf-8")
    return ""


def source_text(*, what: str, saved_by: str, lifted: list[tuple[str, str]], code: str) -> str:
    """program.py's text: ``code``, torch.fx's for the graph as ``graph``; ``lifted``: its lifted inputs in order,
    each (placeholder, kind); ``what``: the method, named under the docstring as a comment."""
    said = python_comment(f"{what}, as exported: torch {saved_by}'s code for its graph.")
    return PROGRAM.format(said=said, weights=WEIGHTS, header=HEADER.strip(),
                          lifted=repr(lifted), code=code)  # a list of string pairs: their repr, literals


def checked(folder: Path, as_found: dict[str, Any]) -> list[dict[str, Any]]:
    """``repro.py --from-source`` run here beside ``as_found`` (its run from program.pt2), when there is a
    program.py: kept only where the rebuilt method answers as program.pt2 does, else removed (a source that
    answers otherwise would mislead a release that cannot load program.pt2) and its run says so."""
    from .issue_text import run_reproducer

    if not (folder / SOURCE).exists():
        return []
    run = run_reproducer(folder, "--from-source")
    if run["exit"] != as_found["exit"]:
        remove(folder)
        run["said"] = f"{run['said']} — not as program.pt2 (exit {as_found['exit']}): program.py removed"[:500]
    return [run]
