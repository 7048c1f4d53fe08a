"""Text the tool did not write — a model's names and module paths, a source line, an operator's arguments, an
exception's message, what a reproducer printed — as it goes into a file the worker writes: one way per kind of
file, so that no such text can end what holds it and become code, a heading or a tag.

- Python (repro.py, program.py, a remedy's lines): a string literal (``repr``) or comment lines, each line of the
  text a ``#`` line of its own; never inside a docstring, whose closing quotes the text could write itself (a
  model's source line ending in ``# \"\"\";open(...)`` did: issue 61, N10). A comment is never one of a file's
  first two lines: PEP 263 reads an encoding there, and ``coding: utf-7`` makes ``+AAo-`` a new line.
- Markdown (ISSUE.md): in a fence of backticks longer than any run of them in the text, or an inline code span
  fenced the same way.

compat/ runs in the stacks' venvs and cannot import upgrade_gate: the parent's report/render.py has the same
Markdown rule (``code_span``, its code blocks' fences); tests/test_quoting.py checks that the two agree."""

from __future__ import annotations

import re
import unicodedata

# Characters a comment shows escaped: control characters (a NUL stops compile(); the rest are unseen) and lone
# surrogates (no UTF-8 for them), written as repr writes them.
_UNSHOWN = {"Cc", "Cs"}


def python_string(text: object) -> str:
    """``text`` as a Python string literal: the code that reads it sees text, whatever quotes it holds."""
    return repr(str(text))


def python_comment(text: object, indent: str = "") -> str:
    """``text`` as comment lines at ``indent``, one per line of it (every line break Python's tokenizer knows,
    and more: ``str.splitlines``'), so that no line of it is code."""
    lines = str(text).splitlines() or [""]
    return "\n".join(f"{indent}# {_shown(line)}".rstrip() for line in lines)


def _shown(line: str) -> str:
    return "".join(repr(char)[1:-1] if char != "\t" and unicodedata.category(char) in _UNSHOWN else char
                   for char in line)


def markdown_fence(text: str, info: str = "") -> str:
    """``text`` as a fenced code block: its fence longer than any run of backticks in it (CommonMark: a line of
    fewer backticks does not close it), so what it quotes stays code; ``info``: the language, the tool's word."""
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def markdown_code(text: object) -> str:
    """``text`` as inline code on one line: fenced by one more backtick than its longest run, padded with a space
    where it starts or ends with one (CommonMark strips one space either side)."""
    shown = " ".join(str(text).splitlines())
    fence = "`" * (_longest_backtick_run(shown) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)
