"""The reproducers' scripts as text: ``repro.py`` of one operator (or a fused pair) lowered alone, and of a whole
method or a block of it, for ExecuTorch's XNNPACK lowering (executorch_diagnose.py) and for optimize_for_mobile
(torchscript_diagnose.py). No torch here: the text is built and checked without a stack (tests/test_quoting.py).

Each script's docstring is the tool's own words. What the tool did not write — the culprit's name, the model and
method it was found in, a module path and source line, a lowering's error, the versions — is in comment lines under
the docstring, or in string constants the code reads (compat/search/quoting.py). Each ``main()`` returns 1 while the
lowering differs and 0 when it does not; anything it raises is exit 3 (``MAIN_GUARD``), so a release or torch that
cannot load, lower or run it answers nothing rather than "reproduces" (releases/_reproducers.py reads the exits)."""

from __future__ import annotations

from .search.quoting import python_comment, python_string

MAIN_GUARD = '''
if __name__ == "__main__":
    try:
        code = main()
    except Exception as failure:  # no answer either way: not "reproduces"
        print(f"could not run: {type(failure).__name__}: {' '.join(str(failure).split())[:500]}")
        code = 3
    except KeyboardInterrupt:  # stopped: no answer either way, and no traceback
        print("stopped (Ctrl-C): no answer")
        code = 3
    sys.exit(code)
'''


def indented(remedy: str) -> str:
    """The remedy's lines, as a team would paste them, inside a reproducer's function (one blank line
    between blocks)."""
    given = remedy.splitlines()
    lines = [line for index, line in enumerate(given) if line or (index and given[index - 1])]
    return "".join(f"    {line}\n" if line else "\n" for line in lines)


def script(doc: str, said: str, code: str, **fields: object) -> str:
    """A reproducer: ``doc`` (the tool's words, two lines at least, so that no comment is one of the file's first
    two lines, where PEP 263 reads an encoding), ``said`` as comment lines, then ``code`` filled with ``fields``
    (each already a literal or code) and the guard."""
    return f'"""{doc}"""\n{python_comment(said)}\n' + code.format(**fields) + MAIN_GUARD


EXECUTORCH_OPERATOR_DOC = '''One operator lowered to ExecuTorch's XNNPACK delegate, against eager PyTorch.

The comments below name it, the release and where upgrade-gate found it; inputs.pt holds the real
tensors that reached that call. Run with the Python of a venv that has torch and executorch:

    python repro.py                  # exit 1: the lowered operator differs from eager (or fails as found); 0: not
    python repro.py --with-remedy    # the same, lowered with the remedy below: exit 0 when it fixes it

Exit 3: it could not run (the lowering or the runtime failed, the error printed): no answer either way.
'''

EXECUTORCH_OPERATOR_CODE = '''
import os
import sys
from pathlib import Path

KIND = {kind}  # the operator, as the line printed names it
THRESHOLD = {threshold}  # the relative L2 error against eager the lowering may have
# Where the program lowered and failed to load or run when found: the runtime's error, which reproduces when raised.
FAILS_WITH = {fails_with}


def remedy(program):
{remedy}    return program, partitioner


def main():
    import torch

    inputs = tuple(torch.load(Path(__file__).with_name("inputs.pt")))  # before executorch's imports, seconds long
    # ExecuTorch runs flatc from its own venv's bin/ while lowering.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    __import__("torch.ao.quantization.fx._decomposed")  # the quantize and dequantize operators a call may use

    class Operator(torch.nn.Module):
        def forward(self, {names}):
            return {call}

    eager = Operator()(*inputs)
    program = torch.export.export(Operator(), inputs)
    program, partitioner = remedy(program) if "--with-remedy" in sys.argv else (program, XnnpackPartitioner())
    how = "with the remedy" if "--with-remedy" in sys.argv else "to XNNPACK"
    buffer = to_edge_transform_and_lower(program, partitioner=[partitioner]).to_executorch().buffer
    try:
        lowered = _load_for_executorch_from_buffer(buffer).forward(inputs)[0]
    except Exception as failure:
        if not FAILS_WITH or FAILS_WITH not in str(failure):
            raise  # another failure than the one found: no answer either way (exit 3)
        print(f"torch {{torch.__version__}}: {{KIND}} lowered {{how}} fails when the runtime loads it: "
              f"{{type(failure).__name__}}: {{FAILS_WITH}} (the runtime's own words are on stderr)")
        return 1
    error = (torch.linalg.vector_norm((lowered - eager).double()) / torch.linalg.vector_norm(eager.double())).item()
    print(f"torch {{torch.__version__}}: {{KIND}} lowered {{how}}: "
          f"relative L2 error {{error:.3g}} against eager (threshold {{THRESHOLD:g}}), "
          f"largest difference {{(lowered - eager).abs().max().item():.3g}}")
    return 1 if error > THRESHOLD else 0

'''


def executorch_operator(*, kind: str, executorch: str, found_in: str, call: str, arguments: int, threshold: float,
                        remedy: str, fails_with: str = "") -> str:
    """The script that lowers one operator (``call``, code op_call_code wrote) on ``inputs.pt`` beside it;
    ``fails_with``: the runtime's error where the program failed to load or run when found."""
    differs = "fails when its program loads" if fails_with else "differs from eager"
    said = (f"{kind}: ExecuTorch {executorch}'s XNNPACK delegate {differs}.\n"
            f"Found by upgrade-gate in {found_in}")
    return script(EXECUTORCH_OPERATOR_DOC, said, EXECUTORCH_OPERATOR_CODE, kind=python_string(kind),
                  threshold=repr(threshold), remedy=indented(remedy), call=call, fails_with=python_string(fails_with),
                  names=", ".join(f"x{i}" for i in range(arguments)))


EXECUTORCH_METHOD_DOC = '''A method (or a block of it) lowered to ExecuTorch's XNNPACK delegate, against eager PyTorch.

The comments below name the culprit, the release, where upgrade-gate found it and which program this
is (the operator alone on its real inputs does not show it). program.pt2 is its exported program
(torch.export.save), inputs.pt its real inputs. Run with the Python of a venv that has torch and
executorch:

    python repro.py                  # exit 1: the lowered method differs from eager (or fails as found); 0: not
    python repro.py --with-remedy    # the same, lowered with the remedy below: exit 0 when it fixes it
    python repro.py --from-source    # the method rebuilt from program.py and exported again (with either)

program.pt2 loads in the torch that saved it (SAVED_BY) and the releases that keep its format; where
it does not load, the method is rebuilt from program.py, when there is one (the comments say).
Exit 3: it could not run (a lowering or runtime failure, the error printed): no answer either way.
'''

EXECUTORCH_METHOD_CODE = '''
import importlib.util
import os
import sys
from pathlib import Path

# The relative L2 error against eager the lowering may have: one for every output, or each output's own.
THRESHOLD = {threshold}
# Where the method did not lower at all when found: its error, which the lowering reproduces when it raises it.
FAILS_WITH = {fails_with}
FAILS = {fails_as_found}  # what it prints then (upgrade-gate's release explorer reads it as an answer)
SAVED_BY = {saved_by}  # the torch that saved program.pt2


def load_program(torch, here, inputs):
    """program.pt2, where this torch loads it, else the method rebuilt from program.py and exported again;
    and what the printed line says of it."""
    if "--from-source" not in sys.argv:
        try:
            return torch.export.load(here / "program.pt2"), ""
        except Exception as failure:
            if not (here / "program.py").exists():
                raise
            why = f"program.pt2, saved by torch {{SAVED_BY}}, does not load here: {{type(failure).__name__}}"
    else:
        why = "as asked"
    spec = importlib.util.spec_from_file_location("program_source", here / "program.py")
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    return torch.export.export(source.Method(), inputs), f" (rebuilt from program.py: {{why}})"


def remedy(program):
{remedy}    return program, partitioner


def main():
    import torch

    # ExecuTorch runs flatc from its own venv's bin/ while lowering.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    for operators in ("torch.ao.quantization.fx._decomposed", "executorch.kernels.quantized"):
        try:  # a quantized program's operators, to load it, and their portable kernels, where one is kept out
            __import__(operators)
        except ImportError:
            pass
    here = Path(__file__).parent
    inputs = tuple(torch.load(here / "inputs.pt"))
    program, rebuilt = load_program(torch, here, inputs)
    eager = torch.utils._pytree.tree_leaves(program.module()(*inputs))
    program, partitioner = remedy(program) if "--with-remedy" in sys.argv else (program, XnnpackPartitioner())
    how = "with the remedy" if "--with-remedy" in sys.argv else "to XNNPACK"
    try:  # a method that lowered and failed to load when found fails here too
        buffer = to_edge_transform_and_lower(program, partitioner=[partitioner]).to_executorch().buffer
        outputs = _load_for_executorch_from_buffer(buffer).forward(inputs)
    except Exception as failure:
        if not FAILS_WITH or FAILS_WITH not in str(failure):
            raise  # another failure than the one found: no answer either way (exit 3)
        print(f"torch {{torch.__version__}}: the method lowered {{how}}{{rebuilt}} {{FAILS}}: "
              f"{{type(failure).__name__}}: {{FAILS_WITH}}")
        return 1
    errors = [(torch.linalg.vector_norm((a - e).double()) / torch.linalg.vector_norm(e.double())).item()
              for a, e in zip(outputs, eager)]
    limits = THRESHOLD if isinstance(THRESHOLD, list) else [THRESHOLD] * len(errors)
    # The output furthest past what it may depart by (NaN furthest of all); it fails if any is past its own.
    worst = max(range(len(errors)), key=lambda i: errors[i] / limits[i] if errors[i] == errors[i] else float("inf"))
    print(f"torch {{torch.__version__}}: the method lowered {{how}}{{rebuilt}}: "
          f"relative L2 error {{errors[worst]:.3g}} against eager (threshold {{limits[worst]:g}})")
    return 0 if all(e <= t for e, t in zip(errors, limits)) else 1

'''


def executorch_method(*, kind: str, executorch: str, found_in: str, program: str, saved_by: str, source_note: str,
                      threshold: float | list[float], remedy: str, fails_with: str, fails_as_found: str) -> str:
    """The script that lowers the exported program beside it (``program``: which, the whole method or a block)."""
    said = (f"{kind}: ExecuTorch {executorch}'s XNNPACK lowering of a method differs from eager.\n"
            f"Found by upgrade-gate in {found_in}\n"
            f"The operator alone on its real inputs does not show it, so this is {program}.\n"
            f"program.pt2 was saved by torch {saved_by}; {source_note}.")
    return script(EXECUTORCH_METHOD_DOC, said, EXECUTORCH_METHOD_CODE, threshold=repr(threshold),
                  fails_with=python_string(fails_with), fails_as_found=python_string(fails_as_found),
                  saved_by=python_string(saved_by), remedy=indented(remedy))


TORCHSCRIPT_METHOD_DOC = '''A traced method optimized by optimize_for_mobile and run by the Lite Interpreter,
against the traced method.

The comments below name what changes, the torch and where upgrade-gate found it. model.pt is the
traced method (TorchScript: it loads without the model's code), inputs.pt its real inputs. Run with
the Python of a venv that has torch:

    python repro.py                  # exit 1: the optimized method, run by the Lite Interpreter, differs
    python repro.py --with-remedy    # the same with the remedy's blocklist: exit 0 when it fixes it

Exit 3: it could not run (the error printed): no answer either way.
'''

TORCHSCRIPT_METHOD_CODE = '''
import io
import sys
from pathlib import Path

# The relative L2 error against the traced method it may have: the numerics gate's, or each output's own.
THRESHOLD = {threshold}


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

'''


def torchscript_method(*, kind: str, torch_version: str, found_in: str, threshold: float | list[float],
                       remedy: str) -> str:
    """The script that optimizes the traced method beside it as the legacy stack's export does."""
    said = (f"{kind}: torch {torch_version}'s optimize_for_mobile changes what a method computes.\n"
            f"Found by upgrade-gate in {found_in}")
    return script(TORCHSCRIPT_METHOD_DOC, said, TORCHSCRIPT_METHOD_CODE, threshold=repr(threshold),
                  remedy=indented(remedy))
