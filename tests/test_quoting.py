"""Issue 61, item 2: every text the tool did not write — a module path, a source line, an operator's argument, an
exception's message, a method's name — stays text in every file the tool generates. One hostile line goes through
each generator (compat/search/quoting.py's rules on the worker's side; report/render.py's on the parent's): repro.py and
program.py are parsed and run, ISSUE.md, report.md and the upgrade-path page are read by a CommonMark parser,
report.html and the upgrade-path page by an HTML parser."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.compat_package import compat_module
from markdown_it import MarkdownIt

from upgrade_gate.report.render import Code, code_span, to_markdown

quoting = compat_module("quoting_under_test", "search.quoting")
reproducers = compat_module("quoting_under_test", "reproducers")
recipe_reproducers = compat_module("quoting_under_test", "recipe_reproducers")
program_source = compat_module("quoting_under_test", "search.program_source")
diagnose_reproducer = compat_module("quoting_under_test", "diagnose.diagnose_reproducer")

# Each piece has closed what held a quoted text somewhere: a docstring (N10's source line), a string, a comment (a
# line break of any kind), an encoding declaration (UTF-7 reads ``+AAo-`` as a line break), a Markdown fence, code
# span, heading, table or link, an HTML attribute or tag (N13's method name), str.format's braces. Each would
# create PWNED in the working directory if it ever ran as code.
HOSTILE = ('m.py:7 in forward: y = f(x)  # """;open("PWNED","w");""" \'\'\';open("PWNED","w");\'\'\' '
           "` `` ```` x' y\" </h3><img src=x onerror=alert(1)><script>alert(2)</script> [a](javascript:alert(3)) "
           "{kind} {0} }}{{ \\N{BULLET} \\\n"
           'open("PWNED","w")\r\nopen("PWNED","w")\ropen("PWNED","w")\x0bopen("PWNED","w")\x0c'
           'open("PWNED","w")\x1c\x85\u2028\u2029 \x1b[31m \x07 \ud800 '
           "coding: utf-7 +AAo-open(+ACI-PWNED+ACI-,+ACI-w+ACI-)\n"
           "# Injected heading\n## Injected\n| a | b |\n|---|---|\n- injected item\n```\n")
ONE_LINE = " ".join(HOSTILE.splitlines())  # what a record keeps of a message, or a reproducer printed
# Pieces that, found outside a string constant or a comment, would be the hostile text read as code.
MARKERS = ("PWNED", "onerror", "alert", "Injected", "BULLET", "utf-7")


# -- the rules ------------------------------------------------------------------------


def test_a_string_literal_reads_back_as_the_text():
    assert ast.literal_eval(quoting.python_string(HOSTILE)) == HOSTILE


def test_comment_lines_are_comments_whatever_the_text_breaks_its_lines_with():
    comment = quoting.python_comment(HOSTILE, "    ")
    lines = comment.split("\n")
    assert len(lines) == len(HOSTILE.splitlines())
    assert all(line.startswith("    #") for line in lines)
    # Nothing but comments: compiled, it is an empty module; tokenized, it is comments and line ends only.
    assert ast.parse(comment).body == []
    kinds = {token.type for token in tokenize.generate_tokens(io.StringIO(comment).readline)}
    assert kinds <= {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT,
                     tokenize.DEDENT}
    # What compile() refuses (a NUL) or cannot write as UTF-8 (a lone surrogate), and what a reader would not see,
    # is shown as an escape; a tab stays.
    assert "\\x1b[31m \\x07 \\ud800" in comment and quoting.python_comment("a\tb") == "# a\tb"
    assert not [char for char in "".join(lines) if char != "\t" and (ord(char) < 32 or 0xD800 <= ord(char) < 0xE000)]
    assert quoting.python_comment("a\x00b") == "# a\\x00b"


@pytest.mark.parametrize("text", ["plain", "a`b", "``double``", "`lead", "trail`", "a <b> & c", HOSTILE])
def test_the_workers_markdown_quoting_is_the_reports(text):
    """The same rule on both sides of the process boundary (compat/ cannot import upgrade_gate): ISSUE.md's code
    spans and fences are report.md's."""
    assert quoting.markdown_code(text) == code_span(text)
    assert quoting.markdown_fence(text) + "\n" == to_markdown([Code(text.split("\n"))])


@pytest.mark.parametrize("text", ["plain", "a`b", "``double``", "`lead", "trail`", HOSTILE])
def test_a_fence_and_a_code_span_hold_any_text(text):
    parsed = MarkdownIt("commonmark").parse(f"before\n\n{quoting.markdown_fence(text, 'python')}\n\nafter\n")
    fences = [t for t in parsed if t.type == "fence"]
    assert [(t.info, t.content) for t in fences] == [("python", re.sub("\r\n?", "\n", text) + "\n")]  # CommonMark's line ends
    spans = [t.content for t in MarkdownIt("commonmark").parseInline(f"x {quoting.markdown_code(text)} y")[0].children
             if t.type == "code_inline"]
    assert spans == [" ".join(text.splitlines())]


# -- the generated Python -------------------------------------------------------------


def _executorch_operator(text: str) -> str:
    return reproducers.executorch_operator(kind=text, executorch=text, found_in=f"m's forward:\n{text}",
                                           call="torch.ops.aten.gelu.default(x0, approximate='tanh')", arguments=1,
                                           threshold=1e-4, remedy=_remedy(text), fails_with=text)


def _executorch_method(text: str) -> str:
    return reproducers.executorch_method(kind=text, executorch=text, found_in=f"m's forward:\n{text}", program=text,
                                         saved_by=text, source_note=text, threshold=[1e-4, 2e-4], remedy=_remedy(text),
                                         fails_with=text, fails_as_found=text)


def _torchscript_method(text: str) -> str:
    return reproducers.torchscript_method(kind=text, torch_version=text, found_in=f"m's forward:\n{text}",
                                          threshold=1e-4, remedy="optimization_blocklist = set()\n")


# A recipe's lines as compat/executorch_migrate.py writes them (no torch needed to write it): the adapter's own text.
_RECIPE = "def quantize_captured(captured, inputs, quantizer=None):\n    return captured\n"


def _executorch_quantize(text: str) -> str:
    return recipe_reproducers.executorch_quantize(executorch=text, found_in=f"m's forward:\n{text}", module=text,
                                                  recipe=_RECIPE, fails_with=text, fails_as_found=text)


def _torch_export(text: str) -> str:
    # An option's line is the adapter's own text (EXPORT_REMEDIES), run by exec; its name is quoted.
    return recipe_reproducers.torch_export(torch_version=text, found_in=f"m's forward:\n{text}", module=text,
                                           options=[(text, "program = model")], fails_with=text, fails_as_found=text)


def _executorch_precision(text: str) -> str:
    kept = f"KEEP_FLOAT = {{{quoting.python_string(text)}}}\nquantizer = None\n"  # keep_float_code's layer names
    return recipe_reproducers.executorch_precision(executorch=text, found_in=f"m's forward:\n{text}", recipe=_RECIPE,
                                                   remedy=kept, min_snr_db=20.0, min_cosine=0.99,
                                                   extents={0: (1, 3)})


def _program_source(text: str) -> str:
    return program_source.source_text(what=text, saved_by=text, lifted=[(text, "PARAMETER")],
                                      code="def graph(p, x):\n    return (x + p,)")


def _remedy(text: str) -> str:
    """A remedy's lines as executorch_diagnose.kept_out_code writes them: the culprit named in a comment, its
    argument in a condition."""
    return "\n".join([quoting.python_comment(f"{text} stays out of XNNPACK"), "class Kept:",
                      f"    def check(self, node):\n        return node.args[1] == {quoting.python_string(text)}",
                      "partitioner = Kept()"]) + "\n"


GENERATED = {"repro.py, one operator (ExecuTorch)": _executorch_operator,
             "repro.py, a method (ExecuTorch)": _executorch_method,
             "repro.py, a method (optimize_for_mobile)": _torchscript_method,
             "repro.py, a recipe that raises (ExecuTorch)": _executorch_quantize,
             "repro.py, a recipe below its gate (ExecuTorch)": _executorch_precision,
             "repro.py, a module whose export raises (torch)": _torch_export,
             "program.py": _program_source}


def _shape(source: str) -> str:
    """The code without its string constants' values: what a text could change only by becoming code."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


@pytest.mark.parametrize("make", GENERATED.values(), ids=GENERATED.keys())
def test_a_hostile_line_in_a_generated_script_is_only_comments_and_string_constants(make):
    source = make(HOSTILE)
    tree = ast.parse(source)
    # The hostile text changed no code: the same tree as with a plain name.
    assert _shape(source) == _shape(make("plain"))
    # The docstring is the tool's own words; the file's first two lines are its (PEP 263 reads an encoding there).
    doc = ast.get_docstring(tree, clean=False) or ""
    assert not [marker for marker in MARKERS if marker in doc] and not any("{" in line for line in doc.splitlines())
    assert source.startswith('"""') and "#" not in "".join(source.splitlines()[:2])
    # Every place the text lands is a string constant or a comment.
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if any(marker in token.string for marker in MARKERS):
            assert token.type in (tokenize.STRING, tokenize.COMMENT), token
    assert sum(token.type == tokenize.COMMENT and "PWNED" in token.string
               for token in tokenize.generate_tokens(io.StringIO(source).readline)) >= HOSTILE.count("PWNED")
    # The constants the code reads hold the text as it was.
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and isinstance(node.value, ast.Constant)}
    assert [name for name, value in constants.items() if value == HOSTILE] == [
        name for name in ("KIND", "FAILS_WITH", "FAILS", "SAVED_BY") if name in constants]


@pytest.mark.parametrize("make", [m for name, m in GENERATED.items() if name.startswith("repro.py")],
                         ids=[name for name in GENERATED if name.startswith("repro.py")])
def test_a_reproducer_with_a_hostile_line_runs_without_running_it(make, tmp_path):
    """Run as the diagnose phase runs it, here without torch: its guard answers "could not run" (exit 3), and
    nothing the hostile line says was done."""
    (tmp_path / "repro.py").write_text(make(HOSTILE), encoding="utf-8")
    ran = subprocess.run([sys.executable, "-I", "repro.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert (ran.returncode, ran.stderr) == (3, ""), ran
    assert ran.stdout.startswith("could not run: ") and sorted(p.name for p in tmp_path.iterdir()) == ["repro.py"]


def test_an_export_reproducer_given_an_option_it_does_not_have_exits_2_naming_the_ones_it_has(tmp_path):
    (tmp_path / "repro.py").write_text(_torch_export("plain"), encoding="utf-8")
    for args in (["--option", "nope"], ["--option"], ["--with-remedy"]):
        ran = subprocess.run([sys.executable, "-I", "repro.py", *args], cwd=tmp_path, capture_output=True, text=True,
                             timeout=60)
        assert (ran.returncode, ran.stdout, ran.stderr) == (
            2, "usage: python repro.py [--option NAME], NAME one of: plain\n", ""), (args, ran)


# -- ISSUE.md --------------------------------------------------------------------------


class _Phase(diagnose_reproducer.Reproducers):
    """What write_issue reads of the diagnose phase: a model, a block the search ran on, a remedy that failed."""

    PROGRAM, MADE = "the program", " (made by a test)"

    def __init__(self, text: str) -> None:
        self.job = {"model": text}
        self.blocks = {text: SimpleNamespace(path=text, of=2)}
        self.output_thresholds: dict[str, Any] = {}
        self.log = SimpleNamespace(results={"remedy": {text: {"remedy": "kept out of the delegate",
                                                             "code": _remedy(text), "error": ONE_LINE}}})

    def search_threshold(self, method: str) -> float:
        return 1e-4


def _issue(tmp_path: Path, fails_with: str = "") -> str:
    runs = [{"args": [], "exit": 1, "said": ONE_LINE}, {"args": ["--with-remedy"], "exit": 3, "said": ONE_LINE}]
    _Phase(HOSTILE).write_issue(tmp_path, HOSTILE, quoting.markdown_code(HOSTILE), "XNNPACK delegate", "block", runs,
                                fails_with)
    return (tmp_path / "ISSUE.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("fails_with", ["", ONE_LINE], ids=["differs", "does not lower"])
def test_issue_md_keeps_every_name_and_message_as_text(tmp_path, fails_with):
    text = _issue(tmp_path, fails_with)
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    inline = [child for token in tokens for child in token.children or ()]
    # Its own headings only, no tag, link, image or table, and one list: the environment's.
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[1:] == ["What happens", "To reproduce", "Expected", "Actual", "Workaround", "Environment"]
    assert headings[0].startswith("[XNNPACK delegate] ") and headings[0].endswith(")")
    assert not [t for t in tokens + inline if t.type in ("html_block", "html_inline", "link_open", "image",
                                                         "table_open")]
    assert [t.type for t in tokens].count("bullet_list_open") == 1
    # Each text is quoted whole (a lone surrogate as its escape: UTF-8 has none): names in code spans, what the
    # reproducer printed and the remedy in fences.
    line = ONE_LINE.encode("utf-8", "backslashreplace").decode()
    spans = [t.content for t in inline if t.type == "code_inline"]
    # The culprit (or the lowering's error) in the title; the block, the model, the method and the remedy's error;
    # where it does not lower, its error and the culprit once more.
    assert spans.count(line) == (7 if fails_with else 5), spans
    fences = [(t.info, t.content) for t in tokens if t.type == "fence"]
    assert fences == [("", f"$ python repro.py\n{line}\n(exit 1: differs)\n\n$ python repro.py --with-remedy\n"
                           f"{line}\n(exit 3: could not run)\n"), ("", line + "\n"),
                      ("python", _remedy(HOSTILE).encode("utf-8", "backslashreplace").decode())]


# -- report.md, report.html, the upgrade-path page -------------------------------------

# A name as a record holds it: one line (a method's, a module's path).
NAME = ONE_LINE


def _diagnosed(project: Path) -> Path:
    """A report folder whose candidate's Way out is all model text: the method, the block, the culprit and its line,
    the remedy's lines and error, what the reproducer printed; and a model whose description and failure
    message are hostile."""
    import json

    import numpy as np
    from helpers.stack_records import REFERENCE, write_stack_model

    from upgrade_gate import layout
    from upgrade_gate.schema.records import RECORDS_VERSION

    (project / "team_model.py").write_text("def build(): ...\n")
    with (project / "pyproject.toml").open("a") as config:
        config.write(f'[tool.upgrade-gate.models.team-model]\nfactory = "team_model:build"\n'
                     f"description = {json.dumps(NAME.replace(chr(0xD800), ''))}\n")  # TOML has no lone surrogate
    out = project / "out"
    write_stack_model(out, "legacy", "team-model", eager=[REFERENCE], artifact=[REFERENCE])
    write_stack_model(out, "candidate", "team-model", eager=[REFERENCE], artifact=[REFERENCE * np.float32(1.5)])
    culprit = {"operator": NAME, "backend": "XNNPACK delegate", "share": 0.99, "rel_l2_without": 3e-7,
               "rel_l2_alone": 2e-4, "calls": [{"key": "k", "module": NAME, "source": NAME}]}
    remedy = {"remedy": "kept out of the delegate", "code": _remedy(HOSTILE), "passes": False, "error": NAME}
    stages = [
        {"stage": "build", "status": "ok", "duration_s": 1.0, "details": {"methods": [NAME]}},
        {"stage": "search", "status": "ok", "duration_s": 1.0, "details": {"methods": {NAME: {
            "status": "found", "rel_l2": 0.3, "culprits": [culprit], "tried": [{}], "block": {"path": NAME, "of": 2}}}}},
        {"stage": "remedy", "status": "ok", "duration_s": 1.0, "details": {"methods": {NAME: {**remedy,
                                                                                              "tried": [remedy]}}}},
        {"stage": "reproducer", "status": "ok", "duration_s": 1.0, "details": {"methods": {NAME: {
            "status": "written", "folder": f"repro/{NAME}", "operator": NAME, "scope": "block", "reason": NAME,
            "runs": [{"args": [], "exit": 1, "said": NAME}], "issue": "ISSUE.md"}}}},
    ]
    directory = layout.diagnose_dir(out, "candidate", "team-model")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{layout.DIAGNOSE}.json").write_text(json.dumps({
        "schema_version": str(RECORDS_VERSION), "phase": layout.DIAGNOSE, "stack": "candidate",
        "model": "team-model", "stages": stages, "facts": {}, "complete": True}))
    return out


class _Tags(HTMLParser):
    """Every element of a page, with its attributes, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


# What the page's own writer writes (report/render.py): its elements and their attributes.
PAGE_ELEMENTS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "h4", "p", "b", "code", "a",
                 "ul", "li", "pre", "div", "table", "thead", "tbody", "tr", "th", "td", "span", "details", "summary",
                 "svg", "circle", "path", "figure", "figcaption"}
PAGE_ATTRIBUTES = {"lang", "charset", "name", "content", "id", "class", "href", "viewbox", "width", "height", "role",
                   "aria-label", "fill", "cx", "cy", "r", "d", "stroke", "stroke-width"}


def _page_holds_only_its_own_elements(page: str) -> list[str]:
    """The page's elements checked against what the tool writes; its text, to look for the quoted names in."""
    parsed = _Tags()
    parsed.feed(page)
    assert {tag for tag, _ in parsed.elements} <= PAGE_ELEMENTS, {tag for tag, _ in parsed.elements} - PAGE_ELEMENTS
    attributes = {name for _, attrs in parsed.elements for name in attrs}
    assert attributes <= PAGE_ATTRIBUTES, attributes - PAGE_ATTRIBUTES
    # Ids, and the links to them, in the one shape (render.anchor_id): no name reaches an attribute as it is.
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", attrs["id"] or "") for _, attrs in parsed.elements if "id" in attrs)
    assert all(re.fullmatch(r"#[A-Za-z0-9_-]*", attrs["href"] or "") for _, attrs in parsed.elements
               if "href" in attrs)
    return parsed.text


def _markdown_holds_only_its_own_blocks(text: str) -> list[Any]:
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    flat = [t for token in tokens for t in (token, *(token.children or []))]
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not [h for h in headings if h.startswith("Injected")], headings  # a heading the text made of its own
    assert not [t.content for t in flat if t.type in ("html_block", "html_inline")]
    assert not [t.attrs for t in flat if t.type in ("link_open", "image")]
    header_cells = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "th_open"]
    assert "a" not in header_cells and "b" not in header_cells
    return flat


def test_report_md_and_html_keep_a_hostile_method_and_its_findings_as_text(project):
    from upgrade_gate import pipeline
    from upgrade_gate.config.plan import load_plan

    out = _diagnosed(project)
    plan = load_plan(["--out", "out", "--models", "team-model@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    assert pipeline.report(plan) == 1
    shown = NAME.encode("utf-8", "backslashreplace").decode()  # a lone surrogate is written as its escape
    flat = _markdown_holds_only_its_own_blocks((out / "report.md").read_text(encoding="utf-8"))
    spans = [t.content for t in flat if t.type == "code_inline"]
    assert spans.count(shown) >= 4, spans  # the method (its heading), the block, the culprit, the remedy's source
    text = _page_holds_only_its_own_elements((out / "report.html").read_text(encoding="utf-8"))
    assert sum(shown in part for part in text) >= 4
    # The Way out's heading: the method's name as text, its id in the one shape.
    heading = re.search(r"<h3 id='(way-out-[^']*)'>", (out / "report.html").read_text(encoding="utf-8"))
    assert heading is not None and "onerror" in heading[1]  # made of the name, its other characters '-'


def test_the_upgrade_path_page_keeps_a_hostile_model_and_what_its_reproducer_printed_as_text(tmp_path):
    import dataclasses

    from test_releases import load_table, records_of

    from upgrade_gate.releases._reproducers import ReproducerRun
    from upgrade_gate.releases._upgrade_path import Finding, UpgradePath, upgrade_path_blocks
    from upgrade_gate.report.render import to_html

    records = [dataclasses.replace(record, reproducers=(ReproducerRun(
        model=NAME, method=NAME, script=f"stacks/candidate/models/m/diagnose/repro/{NAME}/repro.py", exit_code=code,
        said=NAME),)) for record, code in zip(records_of("NO-GO", "GO"), (1, 0))]
    names = [r.release.name for r in records]
    finding = Finding(gate="numerics", model=NAME, severity="hard", statuses=dict(zip(names, ("failed", "passed"))),
                      failing=tuple(names[:1]), first=names[0], last=names[0], gone_in=names[1], appeared_after=None)
    path = UpgradePath(baseline="legacy", models=(NAME,), records=tuple(records), rows=(), findings=(finding,),
                       recommendation=names[1], recommendation_text=NAME)
    blocks = upgrade_path_blocks(path, load_table())
    flat = _markdown_holds_only_its_own_blocks(to_markdown(blocks))
    spans = [t.content for t in flat if t.type == "code_inline"]
    # The model (the finding's, the table's), the reproducer's path (beside the finding, in the table).
    assert spans.count(NAME) == 2 and sum(NAME in span for span in spans) == 4, spans
    text = _page_holds_only_its_own_elements(to_html(blocks, "upgrade path"))
    assert sum(NAME in part for part in text) >= 3


def test_junit_xml_is_well_formed_whatever_a_gates_note_holds():
    """An exception's colour codes or a bell in a gate's note are no XML 1.0 character: each is written as its
    escape, and the rest as ElementTree escapes it."""
    import xml.etree.ElementTree as ET

    from upgrade_gate.report.junit import junit_xml
    from upgrade_gate.schema.verdict import GateResult, GateStatus, Severity, Verdict, VerdictRecord

    note = "export failed: RuntimeError: \x1b[31mbad\x1b[0m \x07 </failure><x/>"
    gate = GateResult(gate="export", stack="candidate", model="m", severity=Severity.HARD, status=GateStatus.FAILED,
                      metric="stages", note=note, evidence=NAME)
    record = VerdictRecord(tool_version="0", generated_at="t", verdict=Verdict.NO_GO, baseline="legacy",
                           candidates={"candidate": Verdict.NO_GO}, gates=(gate,))
    (failure,) = ET.fromstring(junit_xml(record)).iter("failure")
    assert "RuntimeError: \\x1b[31mbad\\x1b[0m \\x07 </failure><x/>" in failure.attrib["message"]
    assert "evidence: m.py:7 in forward" in failure.text and "\\x1b[31m \\x07 \\ud800" in failure.text


# -- a runtime's own words on a program that does not load ----------------------------------------------------

executorch_load = compat_module("quoting_under_test", "executorch_load")


@pytest.mark.parametrize(("said", "node"), [
    # The planted C2f block, as runtime_said joins the native lines.
    ("the runtime said: [XNNCompiler.cpp:1311] Failed to create cat3 node 52 with code: xnn_status_invalid_parameter"
     " · [XNNPACKBackend.cpp:119] XNNCompiler::compileModel failed: 0x1",
     {"node": "cat", "inputs": 3, "id": 52, "code": "xnn_status_invalid_parameter",
      "said": "[XNNCompiler.cpp:1311] Failed to create cat3 node 52 with code: xnn_status_invalid_parameter"}),
    # yolov8n's second C2f (two bottlenecks: four inputs), the line alone.
    ("[XNNCompiler.cpp:1311] Failed to create cat4 node 372 with code: xnn_status_invalid_parameter",
     {"node": "cat", "inputs": 4, "id": 372, "code": "xnn_status_invalid_parameter",
      "said": "[XNNCompiler.cpp:1311] Failed to create cat4 node 372 with code: xnn_status_invalid_parameter"}),
    # Its head's subtraction, once the concatenations load.
    ("[XNNCompiler.cpp:1614] Failed to create XNNSubtract node 1032 with code: xnn_status_invalid_parameter",
     {"node": "XNNSubtract", "inputs": None, "id": 1032, "code": "xnn_status_invalid_parameter",
      "said": "[XNNCompiler.cpp:1614] Failed to create XNNSubtract node 1032 with code: xnn_status_invalid_parameter"}),
    ("[XNNCompiler.cpp:900] Failed to create convolution node 3 with code: xnn_status_unsupported_parameter",
     {"node": "convolution", "inputs": None, "id": 3, "code": "xnn_status_unsupported_parameter",
      "said": "[XNNCompiler.cpp:900] Failed to create convolution node 3 with code: xnn_status_unsupported_parameter"}),
    ("[method.cpp:109] Init failed for backend XnnpackBackend: 0x1", None),
    ("", None),
])
def test_the_node_a_runtime_could_not_create_is_read_from_its_own_words(said, node):
    """Issue 63, item 1: XNNPACK's compiler names the node it refused, a concatenation by its number of inputs;
    words that name no node name none (the search then says why it names no operator)."""
    assert executorch_load.runtime_node(said) == node
