"""compat/search/export_errors.py: the user's line an exporter's error points at, through FX-generated code
(standard library only: run with this Python, on messages and stack traces as torch 2.2 and 2.8 write them)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from upgrade_gate.layout import TOOL_ROOT


@pytest.fixture(scope="module")
def export_errors():
    spec = importlib.util.spec_from_file_location("export_errors_under_test",
                                                  TOOL_ROOT / "compat" / "search" / "export_errors.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TORCH = "/venv/lib/python3.11/site-packages/torch"
GENERATED = "<eval_with_key>.1 from /work/models/smoke.py:100 in forward"
# torch 2.8's non-strict export, a data-dependent guard in the user's own code
USER_LINE = ('Could not guard on data-dependent expression u0 < 32\n\nThe following call raised this error:\n'
             '  File "/work/models/smoke.py", line 50, in forward\n    if y.mean() > 0:\n\nTo fix the error, …')
# … and in code FX generated (a GraphModule's forward)
GENERATED_LINE = ('Could not guard on data-dependent expression u0 < 32 (unhinted: u0 < 32)\n\n'
                  'Caused by: (_decomp/decompositions.py:757 in slice_forward)\n'
                  f'The following call raised this error:\n  File "{GENERATED}", line 15, in forward\n'
                  '    getitem_1 = repeat_interleave[(slice(None, None, None), slice(None, getitem, None))];  '
                  'repeat_interleave = getitem = None\n\nTo fix the error, …')
# A node's stack trace as torch 2.8's FX tracer records it: the user's frame first, then FX's own
TRACE_2_8 = ('File "/work/models/smoke.py", line 104, in forward\n    y = repeated[:, : y.shape[-1]]\n'
             f'  File "{TORCH}/fx/proxy.py", line 739, in impl\n'
             '    return tracer.create_proxy("call_function", target, args, kwargs)\n'
             f'  File "{TORCH}/fx/proxy.py", line 251, in create_proxy\n'
             '    user_frame_summary = CapturedTraceback.extract().summary()')
# … as torch 2.2's records it: the whole stack, innermost last
TRACE_2_2 = ('  File "/work/models/smoke.py", line 112, in fx_traced\n'
             '    return torch.fx.GraphModule(module, tracer.trace(module))\n'
             f'  File "{TORCH}/fx/_symbolic_trace.py", line 821, in trace\n    (self.create_arg(fn(*args)),),\n'
             '  File "/work/models/smoke.py", line 104, in forward\n    y = repeated[:, : y.shape[-1]]\n')
# … and where torch 2.8 could not find the line (a forward FX patched: keyword-only arguments)
TRACE_NO_LINE = ('File "/work/models/smoke.py", line 18446744073709551615, in forward\n'
                 f'  File "{TORCH}/fx/proxy.py", line 690, in __call__\n    return self.tracer.create_proxy(\n')
# torch 2.8 exporting a GraphModule itself: FX's interpreter quotes the node's stack trace
INTERPRETED = ('Could not guard on data-dependent expression Eq(2*u0, 0)\n'
               'The following call raised this error:\n  File "<string>", line 1, in <lambda>\n'
               'While executing %view : [num_users=1] = call_method[target=view](args = (%nonzero, 2, -1))\n'
               f'Original traceback:\n{TRACE_2_8}\nThe error above occurred when calling torch.export.export.')
AT_USER_LINE = "smoke.py:104 in forward: y = repeated[:, : y.shape[-1]]"
AT_GENERATED_LINE = ("<eval_with_key>.1:15 in forward (FX code traced from smoke.py:100 in forward): getitem_1 = "
                     "repeat_interleave[(slice(None, None, None), slice(None, getitem, None))];  "
                     "repeat_interleave = getitem = None")


@pytest.mark.parametrize(("message", "stack_traces", "source"), [
    (USER_LINE, {}, "smoke.py:50 in forward: if y.mean() > 0:"),
    (GENERATED_LINE, {GENERATED: {15: TRACE_2_8}}, AT_USER_LINE),
    (GENERATED_LINE, {GENERATED: {15: TRACE_2_2}}, AT_USER_LINE),
    # No user line known: the generated one stays, naming the function FX traced.
    (GENERATED_LINE, {GENERATED: {15: ""}}, AT_GENERATED_LINE),
    (GENERATED_LINE, {GENERATED: {15: TRACE_NO_LINE}}, AT_GENERATED_LINE),
    (GENERATED_LINE, {GENERATED: {14: TRACE_2_8}}, AT_GENERATED_LINE),
    (GENERATED_LINE, {}, AT_GENERATED_LINE),  # a graph that is not the model's
    (GENERATED_LINE.replace(GENERATED, "<eval_with_key>.4"), {}, AT_GENERATED_LINE.replace(
        ".1:15 in forward (FX code traced from smoke.py:100 in forward)", ".4:15 in forward")),
    (INTERPRETED, {}, AT_USER_LINE),
    # torch's own frames are nobody's line to fix
    (f'File "{TORCH}/_meta_registrations.py", line 230, in _compute_stride\n    if zero_numel:\n', {}, None),
    ("Could not guard on data-dependent expression u0 < 32", {}, None),
])
def test_the_source_line_is_the_users(export_errors, message, stack_traces, source):
    assert export_errors.describe_error("GuardOnDataDependentSymNode", message, stack_traces).get("source") == source


def test_an_error_names_its_type_operator_and_the_start_of_its_message(export_errors):
    message = "Could not run 'aten::_local_scalar_dense' with arguments from the 'Meta' backend. " + "x" * 1000
    assert export_errors.describe_error("builtins.NotImplementedError", message) == {
        "type": "builtins.NotImplementedError", "message": message[:export_errors.MESSAGE_CHARS],
        "operator": "aten::_local_scalar_dense"}


def test_an_error_record_names_the_models_line_it_was_raised_under(tmp_path):
    """Issue 63: FX could not trace a YOLO head, and the baseline's finding did not say where. A stage's error record
    carries the innermost frame that is neither an installed package's (torch raising inside the proxy's __bool__)
    nor the tool's own (the adapter calling prepare_fx)."""
    from helpers.compat_package import compat_module

    common = compat_module("error_record_under_test", "common")
    head = tmp_path / "team_head.py"
    head.write_text("def forward(x):\n    if as_bool(x):\n        return x\n    return -x\n")
    scope: dict = {}
    exec(compile("def as_bool(x):\n    raise TypeError('symbolically traced variables cannot be used as inputs to "
                 "control flow')\n", f"{TORCH}/fx/proxy.py", "exec"), scope)
    exec(compile(head.read_text(), str(head), "exec"), scope)
    exec(compile("def quantize(forward):\n    return forward(2)\n", str(TOOL_ROOT / "compat" / "torchscript_mobile.py"),
                 "exec"), scope)
    with pytest.raises(TypeError) as raised:
        scope["quantize"](scope["forward"])
    try:
        raise raised.value
    except TypeError as error:  # error_record reads the exception being handled, as the worker's stages do
        record = common.error_record(error)
    assert record["source"] == "team_head.py:2 in forward: if as_bool(x):"


def test_a_model_an_installed_package_defines_has_its_line_named_not_torchs(export_errors):
    """Issue 63: LeViT's culprit calls had an empty source — every frame of timm's model is under site-packages.
    The team's own files come first; where there are none, the defining package's frame, never torch's. Under a
    team's wrapper, the package's line that makes the operator follows the team's (yolov8n's concatenation is made
    in ultralytics' C2f, which a team's line only calls)."""
    torch_only = f'  File "{TORCH}/nn/modules/module.py", line 1775, in _call_impl\n    return forward_call(*args)\n'
    trace = ('  File "/venv/lib/python3.11/site-packages/timm/models/levit.py", line 212, in forward\n'
             '    x = self.bn(x.flatten(0, 1)).reshape_as(x)\n' + torch_only)
    assert export_errors.source_line(trace, {}) == "levit.py:212 in forward: x = self.bn(x.flatten(0, 1)).reshape_as(x)"
    team = '  File "/work/team/net.py", line 9, in forward\n    return self.levit(x)\n'
    assert export_errors.source_line(team + trace, {}) == (
        "net.py:9 in forward: return self.levit(x) → levit.py:212 in forward: x = self.bn(x.flatten(0, 1)).reshape_as(x)")
    assert export_errors.source_line(team + torch_only, {}) == "net.py:9 in forward: return self.levit(x)"
    assert export_errors.source_line(torch_only, {}) is None


def test_what_the_native_runtime_said_while_it_failed_is_added_to_the_error_and_still_logged(capfd):
    """Issue 63: an int8 .pte that lowered failed to load with "error 0x1"; why was only in the log, written by
    the runtime's C++ to the process's stderr. runtime_said adds those lines to the exception, and writes every
    line on to stderr, where the phase's log has it."""
    import os

    from helpers.compat_package import compat_module

    common = compat_module("runtime_said_under_test", "common")

    def load(path: str) -> None:
        os.write(2, b"[program.cpp:134] InternalConsistency verification requested but not available\n"
                    b"[XNNCompiler.cpp:1311] Failed to create cat3 node 52 with code: xnn_status_invalid_parameter\n"
                    b"[method.cpp:109] Init failed for backend XnnpackBackend: 0x1\n")
        raise RuntimeError(f"loading method forward of {path} failed with error 0x1")

    with pytest.raises(RuntimeError) as raised:
        common.runtime_said(load, "m.pte")
    assert raised.value.__notes__ == [
        "the runtime said: [XNNCompiler.cpp:1311] Failed to create cat3 node 52 with code: xnn_status_invalid_parameter"
        " · [method.cpp:109] Init failed for backend XnnpackBackend: 0x1"]
    assert "InternalConsistency verification requested" in capfd.readouterr().err  # every line still logged
    try:
        raise raised.value
    except RuntimeError as error:
        assert common.error_record(error)["message"] == (
            "loading method forward of m.pte failed with error 0x1 — " + raised.value.__notes__[0])
    assert common.runtime_said(lambda: 7) == 7 and capfd.readouterr().err == ""  # nothing said, nothing added


def test_an_error_whose_traceback_cannot_be_told_is_recorded_all_the_same(export_errors, monkeypatch):
    """The zoo (issue 63, item 6): FX failing to trace a team's ``forward(self, *inputs)`` left an exception whose
    traceback Python 3.11 cannot format ("generator raised StopIteration"); the worker died with code 1 and the
    legacy stack's int8 was "quantize crashed", the FX error lost. Telling it now falls back to the exception alone."""
    def cannot_tell() -> str:
        raise RuntimeError("generator raised StopIteration")

    try:
        raise TypeError("Proxy object cannot be iterated")
    except TypeError as error:
        assert "Traceback (most recent call last)" in export_errors.told_traceback(error)  # as format_exc tells it
        monkeypatch.setattr(export_errors.traceback, "format_exc", cannot_tell)
        told = export_errors.told_traceback(error)
    assert told == ("TypeError: Proxy object cannot be iterated\n(its traceback could not be told: RuntimeError: "
                    "generator raised StopIteration)\n")
    assert export_errors.source_line(told, {}) is None  # no frame to name, and nothing raised


def test_an_error_raised_from_another_says_what_its_cause_said(export_errors):
    """A pass manager's error says only which pass broke ("An error occurred when running the 'DuplicateDQPass'
    pass"); what broke is its cause's (the zoo's Llama: a node naming a submodule convert had dropped). The causes
    follow, each once, first line only (a graph's error goes on to print the graph); one the message already holds,
    and an implicit context (an error raised while handling another), add nothing."""
    def pass_manager():
        try:
            raise RuntimeError("Node submod_3 target submod_1 references nonexistent attribute submod_1 of\n"
                               "GraphModule(\n  (submod_1): …")
        except RuntimeError as inner:
            raise Exception("An error occurred when running the 'DuplicateDQPass' pass after the following "
                            "passes: []") from inner

    with pytest.raises(Exception) as raised:
        pass_manager()
    assert export_errors.with_causes(raised.value) == (
        "An error occurred when running the 'DuplicateDQPass' pass after the following passes: [] — caused by "
        "RuntimeError: Node submod_3 target submod_1 references nonexistent attribute submod_1 of")
    # What a reproducer matches against the error it raises: the error's own words.
    assert export_errors.own_words(export_errors.with_causes(raised.value)) == str(raised.value)
    repeated = ValueError("bad shape (3, 4)")
    repeated.__cause__ = TypeError("bad shape (3, 4)")
    assert export_errors.with_causes(repeated) == "bad shape (3, 4)"
    handled = ValueError("while handling another")
    handled.__context__ = KeyError("the other")
    assert export_errors.with_causes(handled) == "while handling another"
    looped = ValueError("outer")
    looped.__cause__ = inner = TypeError("inner")
    inner.__cause__ = looped
    assert export_errors.with_causes(looped) == "outer — caused by TypeError: inner"
