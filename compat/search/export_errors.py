"""What an export error says: its type, message, operator, and the user's source line it points at.

An exporter names the line it failed on as a traceback frame in its message. When
that line is in code FX generated (a GraphModule's forward: ``<eval_with_key>.N``),
the line of the user's own code that made the failing node is named instead, from
the node's recorded stack trace (``node.meta["stack_trace"]``); the generated line
stays only when the graph recorded none.

Standard library only: the parent's tests read it without torch.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

# One frame: `File "...", line N, in forward` and its source line (not the next frame's header:
# a frame whose line linecache could not read, as in an FX stack trace, has none).
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\w+)\n'
                    r'(?![ \t]*File ")[ \t]*(?P<code>[^\n]*)')
_OPERATOR = re.compile(r"\b(?:aten|quantized|prepacked|prim|torchvision)(?:\.|::)[A-Za-z_][\w.]*")
# FX compiles a GraphModule's forward under this name (torch/fx/graph_module.py), followed
# by " from FILE:LINE in NAME" (the traced function) where FX knows it.
GENERATED = "<eval_with_key>"
MESSAGE_CHARS = 600
CAUSE_CHARS = 300  # of each error an error was raised from (with_causes)
CAUSED_BY = "caused by "
# Installed packages that run a model rather than define it: their frames are never the model's line.
FRAMEWORK = re.compile(r"site-packages/(torch|torchvision|torchao|executorch|functorch|numpy)/")

# The stack traces of a model's FX-generated code: file name → line in it → the node's stack trace.
StackTraces = dict[str, dict[int, str]]


def describe_error(error_type: str, message: str, generated: StackTraces | None = None) -> dict[str, Any]:
    """Type, message, the user's source line the exporter names, and an operator if one is named."""
    found: dict[str, Any] = {"type": error_type, "message": message[:MESSAGE_CHARS]}
    source = source_line(message, generated or {})
    if source:
        found["source"] = source
    operator = _OPERATOR.search(message)
    if operator:
        found["operator"] = operator.group(0)
    return found


def source_line(text: str, generated: StackTraces, tool: str = "\0") -> str | None:
    """``file:line in function: code`` of the innermost user frame in ``text`` (not an installed package's, nor one
    under the folder ``tool``), through generated code."""
    frame = _innermost_user_frame(text, tool)
    if frame is None:
        return None
    if not frame["file"].startswith(GENERATED):
        return _at(frame) + _deeper(text, frame)
    made_by = _innermost_user_frame(generated.get(frame["file"], {}).get(int(frame["line"]), ""))
    if made_by is not None and not made_by["file"].startswith(GENERATED):
        return _at(made_by)
    # No user line known: the generated one, and which function FX traced (if it says).
    key, _, traced = frame["file"].partition(" from ")
    of = f" (FX code traced from {traced.rsplit('/', 1)[-1]})" if traced else ""
    return f"{key}:{frame['line']} in {frame['function']}{of}: {frame['code'].strip()}"


def _innermost_user_frame(text: str, tool: str = "\0") -> re.Match[str] | None:
    frames = [m for m in _FRAME.finditer(text) if not m["file"].startswith(tool)]
    # The team's own files first; else a model an installed package defines (timm's LeViT, issue 63), not torch's.
    found = ([m for m in frames if "site-packages" not in m["file"]]
             or [m for m in frames if not FRAMEWORK.search(m["file"])])
    return found[-1] if found else None


def _deeper(text: str, frame: re.Match[str]) -> str:
    """Where the team's line calls into a package that defines the model (ultralytics' C2f under a team's wrapper):
    `` → `` and the innermost line of that package, which makes the operator; else nothing."""
    inner = [m for m in _FRAME.finditer(text, frame.end()) if "site-packages" in m["file"]
             and not FRAMEWORK.search(m["file"])]
    return f" → {_at(inner[-1])}" if inner else ""


def _at(frame: re.Match[str]) -> str:
    return f"{frame['file'].rsplit('/', 1)[-1]}:{frame['line']} in {frame['function']}: {frame['code'].strip()}"


def with_causes(error: BaseException, most: int = 3) -> str:
    """``error``'s message, then each error it was raised from (``raise … from``) that says more: a pass manager's
    "An error occurred when running the 'DuplicateDQPass' pass" says only where it broke, its cause says what."""
    said, cause, seen = [str(error)], error.__cause__, {id(error)}
    while cause is not None and id(cause) not in seen and len(said) <= most:
        seen.add(id(cause))
        # Its first line: a graph's error goes on to print the graph.
        if (text := (str(cause).strip().splitlines() or [""])[0][:CAUSE_CHARS]) and text not in said[0]:
            said.append(f"{CAUSED_BY}{type(cause).__name__}: {text}")
        cause = cause.__cause__
    return " — ".join(said)


def own_words(message: str) -> str:
    """A message as ``with_causes`` wrote it, without its causes: what the error itself says, which a reproducer
    matches against the error it raises."""
    return message.partition(f" — {CAUSED_BY}")[0]


def told_traceback(error: BaseException) -> str:
    """The traceback of the exception being handled, as ``traceback.format_exc`` tells it; where telling it fails
    (Python 3.11 on an FX trace of ``forward(self, *inputs)``: "generator raised StopIteration"), the exception
    alone and why, so that the stage still records the model's own error rather than the worker crashing."""
    try:
        return traceback.format_exc()
    except Exception as broken:  # noqa: BLE001 - any failure to format must not hide the error being recorded
        return "".join(traceback.format_exception_only(type(error), error)) + \
            f"(its traceback could not be told: {type(broken).__name__}: {broken})\n"
