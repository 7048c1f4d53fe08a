"""The results schema: what results.json and verdict.json hold reads back as it was
written, its value types round-trip through their text, and the page shows
everything report.md shows."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.runs import make_project
from helpers.stack_records import (
    REFERENCE,
    junit_of,
    warning,
    write_project_run,
    write_stack_model,
    write_stack_packages,
)

from upgrade_gate import layout, pipeline
from upgrade_gate.config.plan import load_plan
from upgrade_gate.errors import ConfigError
from upgrade_gate.schema.comparison import Side
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import GateResult, GateStatus, Quantity, Severity, Unit, Verdict, VerdictRecord

DEAD = np.zeros((1, 4), np.float32)  # an output that is 0 whatever the input: a degenerate reference
LOCALIZED = {"method": "forward", "attempts": 4, "seconds": 2.5, "complete": True, "budget_s": 300,
             "culprits": [{"module": "blocks.1.gate", "class": "ValueGate", "type": "torch._dynamo.exc.UserError",
                           "message": "Dynamic control flow is not supported\nmore", "source":
                               "smoke.py:50 in forward: if y.mean() > 0:", "same_failure_in": ["blocks.2.gate"]}]}


# What the candidate's export stage records of a method, as compat/executorch_xnnpack.py writes it.
DELEGATION = {"delegate": "XnnpackBackend", "delegate_partitions": 2, "delegated_nodes": 95, "portable_nodes": 5,
              "portable_ops": {"aten_cumsum_default": 5},
              "by_operator": {"aten_cumsum_default": {"delegated": 0, "portable": 5}},
              "planned_memory_bytes": {"forward": 4096}, "planned_buffers_bytes": {"forward": [4096]},
              "seconds": 1.25}
# A team's scan as compat/scan.py writes it: one rule of ours found 12 times, TorchFix's TOR102 7 times
# (each with its own rendered fix), as in issue 26's timm checkout.
UG101_WHY = ("Still works on 2.8, but a ScriptModule is a dead end: torch.export.export rejects it and ExecuTorch "
             "lowers only torch.export programs.")
# A call as compat/scan.py cuts it (120 characters), with no space to break at: it widened the scan's table.
LONG_CALL = "torch.jit.script(self.blocks[0].attention.query_key_value_projection_with_rotary_embedding_and_grouped" \
            "_heads_and_bias.…"
TOR102_WHY = "torch 2.6 made weights_only=True the default: a checkpoint that pickles more fails to load."
SCAN = {"schema_version": "1.0", "scanner": {"torchfix": "0.7.0", "rules": 11}, "root": "/team", "paths": ["."],
        "files_scanned": 40, "errors": [], "findings": [
            *({"file": f"timm/models/m{n}.py", "line": 10 + n, "column": 5, "code": "UG101", "source": "upgrade-gate",
               "name": "torch.jit.script", "call": f"torch.jit.script(model_{n})" if n else LONG_CALL,
               "summary": "TorchScript capture",
               "why": UG101_WHY, "replacement": "torch.export.export(model, example_inputs)"} for n in range(12)),
            *({"file": f"timm/models/_hub{n}.py", "line": 3, "column": 9, "code": "TOR102", "source": "torchfix",
               "name": "torch.load", "call": f"torch.load(path_{n}, map_location='cpu')",
               "summary": "torch.load without weights_only parameter is unsafe.", "why": TOR102_WHY,
               "replacement": f"torch.load(path_{n}, map_location='cpu', weights_only=True)"} for n in range(7))]}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report whose candidate fails to export one model (localized), and is 1% off on another,
    whose second output is degenerate (a warning); its stacks' packages differ beside torch, and the
    team's tests break and warn on the candidate. Written once for the module: tests only read it."""
    project = make_project(tmp_path_factory.mktemp("team"))
    config = project / "pyproject.toml"
    config.write_text(config.read_text() + '[tool.upgrade-gate.extra-requirements]\n"*" = ["timm>=1.0", "-e ."]\n'
                      '[tool.upgrade-gate.project]\nroot = "."\n')
    plan = load_plan(["--out", "out", "--models", "vit-smoke,minilm-smoke@fp32"], invoked_from=project,
                     config_path=config)
    out = plan.settings.out_dir
    extras = [("timm>=1.0", "timm"), ("-e .", "edge-app")]
    write_stack_packages(out, "legacy", {"numpy": "1.26.4", "timm": "1.0.9", "torch": "2.2.2"}, extras)
    write_stack_packages(out, "candidate", {"executorch": "0.7.0", "numpy": "2.1.0", "timm": "1.0.9",
                                            "torch": "2.8.0"}, extras)
    deprecated = "`torch.cpu.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cpu', args...)`"
    write_project_run(out, "legacy", junit_of(test_a="passed", test_b="passed"), warnings=[],
                      installed={"setuptools": "80.9.0", "torch": "2.2.2"})
    write_project_run(out, "candidate", junit_of(test_a="failed", test_b="passed"),
                      warnings=[warning("tests/test_m.py::test_b", "FutureWarning", deprecated, 2)],
                      installed={"setuptools": "80.9.0", "torch": "2.8.0"})
    layout.scan_file(out).write_text(json.dumps(SCAN))
    for stack in ("legacy", "candidate"):
        broken = stack == "candidate"
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=None if broken else [REFERENCE],
                          failed_stage="export" if broken else None, localize=LOCALIZED if broken else None)
        write_stack_model(out, stack, "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[REFERENCE * 1.02],
                          quantize="PT2E" if broken else "FX", export_details=DELEGATION if broken else None)
        write_stack_model(out, stack, "minilm-smoke", eager=[REFERENCE, DEAD],
                          artifact=[REFERENCE * 1.01 if broken else REFERENCE, DEAD], task="embedding")
    assert pipeline.report(plan) == 1
    return out


def test_results_json_reads_back_as_written(report):
    written = json.loads((report / "results.json").read_text())
    results = Results.load(report)
    assert json.loads(json.dumps(_json(results.to_dict()))) == written
    # And the verdict file is the verdict record, the same one results.json carries.
    verdict = VerdictRecord.from_reader(Reader(json.loads((report / "verdict.json").read_text()), "verdict.json"))
    assert verdict == results.verdict
    assert verdict.verdict is Verdict.NO_GO and verdict.candidates == {"candidate": Verdict.NO_GO}
    # The gates' warnings and the outputs' reference range come back too.
    numerics = next(g for g in results.verdict.gates if (g.model, g.gate) == ("minilm-smoke", "numerics"))
    assert numerics.status is GateStatus.FAILED and numerics.warnings == (DEAD_WARNING,)
    comparison = results.model("minilm-smoke").comparisons[0]
    assert [(o.reference_max_abs, o.reference_spread) for o in comparison.outputs] == [(1.0, 2.0), (0.0, 0.0)]
    # The stacks' packages, the extras with their versions, and where the venvs differ.
    candidate = written["stacks"]["candidate"]
    assert candidate["extra_requirements"] == [
        {"requirement": "timm>=1.0", "distribution": "timm", "version": "1.0.9"},
        {"requirement": "-e .", "distribution": "edge-app", "version": None}]
    assert written["package_differences"] == {"executorch": {"legacy": None, "candidate": "0.7.0"},
                                              "numpy": {"legacy": "1.26.4", "candidate": "2.1.0"},
                                              "torch": {"legacy": "2.2.2", "candidate": "2.8.0"}}
    assert [w.category for w in results.project.new_warnings["candidate"]] == ["FutureWarning"]


DEAD_WARNING = ("reference output forward.output_1 is degenerate (≈ 0: max |value| 0.0e+00 ≤ 1e-06): the comparison "
                "with it says little")


def _json(value):
    from upgrade_gate._atomic import to_json

    return to_json(value)


def test_another_major_version_is_refused_naming_the_file(report, tmp_path):
    data = json.loads((report / "results.json").read_text())
    data["schema_version"] = "1.0"
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"results\.json: .*results schema '1\.0'; this upgrade-gate reads 2\.x"):
        Results.load(tmp_path)


def test_a_wrong_type_is_named_by_its_path(report, tmp_path):
    data = json.loads((report / "results.json").read_text())
    data["models"][0]["stacks"]["legacy"]["measured"]["1"]["rounds"]["forward"] = "seven"
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=re.escape(
            "Unexpected type str (expected int) in 'results.json.models[0].stacks.legacy.measured.1.rounds.forward'")):
        Results.load(tmp_path)


@pytest.mark.parametrize("side", [Side(stack="legacy", kind="eager"), Side(stack="candidate", kind="artifact"),
                                  Side(stack="my(odd)stack", kind="artifact")])
def test_a_side_round_trips_through_its_text(side):
    assert Side.parse(str(side)) == side


@pytest.mark.parametrize("text", ["eager", "artifact()", "weights(legacy)", "eager(legacy) "])
def test_a_side_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="not a side"):
        Side.parse(text)


@pytest.mark.parametrize(("quantity", "shown"), [
    (Quantity(value=1.79e-4, unit=Unit.REL_L2), "1.79e-04"),
    (Quantity(value=1.099, unit=Unit.RATIO, low=1.062, high=1.177), "1.099 [1.062, 1.177]"),
    (Quantity(value=1_500_000_000, unit=Unit.BYTES), "1.40 GiB (1,500,000,000 B)"),
    (Quantity(value=512, unit=Unit.BYTES), "512 B"),
    (Quantity(value=math.inf, unit=Unit.DB), "∞ dB"),
    (Quantity(value=-4.04, unit=Unit.DB), "-4.0 dB"),
    (Quantity(value=0.853, unit=Unit.SHARE), "85.3%"),
    (Quantity(value=3, unit=Unit.COUNT), "3"),
])
def test_a_quantity_is_written_one_way_per_unit_and_reads_back(quantity, shown):
    assert str(quantity) == shown
    assert Quantity.from_reader(Reader(json.loads(json.dumps(_json(quantity.to_dict()))), "q")) == quantity


def test_a_gate_keeps_its_numbers_and_renders_them():
    gate = GateResult(gate="numerics", stack="candidate", model="nanovlm", severity=Severity.HARD,
                      status=GateStatus.FAILED, metric="rel_l2", measured=Quantity(value=1.79e-4, unit=Unit.REL_L2),
                      op="≤", threshold=Quantity(value=1e-4, unit=Unit.REL_L2), note="vision_encoder.output_0",
                      evidence="artifact(candidate) vs eager(legacy)")
    assert str(gate) == ("FAILED | hard | numerics | candidate | nanovlm | rel_l2 = 1.79e-04 (vision_encoder.output_0) "
                         "(threshold rel_l2 ≤ 1.00e-04)")
    assert not gate.status and GateStatus.INCONCLUSIVE and GateStatus.PASSED
    assert GateResult.from_reader(Reader(gate.to_dict(), "gate")) == gate
    # A warning goes with the number it qualifies, in every line that shows it, and reads back.
    warned = dataclasses.replace(gate, status=GateStatus.PASSED, warnings=("reference output x is degenerate",))
    assert str(warned) == ("passed | hard | numerics | candidate | nanovlm | rel_l2 = 1.79e-04 "
                           "(vision_encoder.output_0) ⚠ reference output x is degenerate (threshold rel_l2 ≤ 1.00e-04)")
    assert GateResult.from_reader(Reader(warned.to_dict(), "gate")) == warned


def markdown_headings(text: str) -> list[str]:
    return [re.sub(r"\*\*|`", "", title) for title in re.findall(r"^#+ (.+)$", text, re.MULTILINE)]


def page_headings(page: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", title).replace("&gt;", ">").replace("&amp;", "&")
            for _, title in re.findall(r"<h(\d)[^>]*>(.*?)</h\1>", page)]


def test_the_page_shows_every_section_and_table_of_the_markdown(report):
    markdown, page = (report / "report.md").read_text(), (report / "report.html").read_text()
    headings = markdown_headings(markdown)
    shown = page_headings(page)
    assert headings and [h for h in headings if h not in shown] == []
    # In the same order: the page has only its plots' heading besides.
    assert [h for h in shown if h in headings] == headings and set(shown) - set(headings) == {"Plots"}
    # Every table, list and code block of the Markdown is on the page.
    assert markdown.count("\n|---") == page.count("<table>")
    assert len(re.findall(r"^```$", markdown, re.MULTILINE)) == 2 * page.count("<pre>")
    # The labels that introduce each model's tables.
    for label in re.findall(r"^([A-Z][^|\n]{3,80}):$", markdown, re.MULTILINE):
        assert f">{label}:<" in page, label


def test_both_renderings_show_a_gate_warning(report):
    markdown, page = (report / "report.md").read_text(), (report / "report.html").read_text()
    listed = f"minilm-smoke (candidate, numerics): {DEAD_WARNING}"
    assert f"Warnings:\n\n- {listed}\n" in markdown and f"<li>{listed}</li>" in page
    assert f"⚠ {DEAD_WARNING}".replace("|", "\\|") in markdown
    # The page draws the sign (issue 26: no emoji font in headless Chromium).
    assert re.search(r"<svg class='mark'[^>]*aria-label='condition'.*?</svg> " + re.escape(f"{DEAD_WARNING}</td>"), page)


# Emoji, and the variation selector that asks for an emoji's picture: a page without an emoji font shows boxes.
EMOJI = re.compile("[\u2600-\u27bf\u2b00-\u2bff\ufe0f\U0001f000-\U0001faff]")


def test_the_page_needs_no_emoji_font(report):
    page = (report / "report.html").read_text()
    assert EMOJI.findall(page) == []
    # The decision matrix's marks are drawn: the candidate failed a hard gate (export), and passed others.
    matrix = page[page.index("id='decision-matrix'"):page.index("id='requirements'")]
    assert "aria-label='FAILED'" in matrix and "aria-label='passed'" in matrix
    # report.md writes them as words; it keeps the text sign ⚠ (U+26A0, text presentation) of a gate's warning.
    markdown = (report / "report.md").read_text()
    assert set(EMOJI.findall(markdown)) == {"⚠"}
    assert re.search(r"\| Export → load → run \(fp32\) \| 2/2 models \| 1/2 models \[FAILED\] \|", markdown)


def test_no_python_repr_reaches_the_reports(report):
    markdown, page = (report / "report.md").read_text(), (report / "report.html").read_text()
    for text in (markdown, page.replace("&#x27;", "'")):
        assert "{'" not in text and "['" not in text and "': " not in text
    # The export's facts other sections do not show are words: here the method's export time.
    assert "- candidate export of forward: seconds 1.25" in markdown


def test_each_scan_rule_is_explained_once_and_cited_per_finding(report):
    markdown, page = (report / "report.md").read_text(), (report / "report.html").read_text()
    for why in (UG101_WHY, TOR102_WHY):
        assert markdown.count(why) == 1 and page.count(html.escape(why)) == 1
    assert "- **UG101** (12): TorchScript capture — " + UG101_WHY + " Instead: torch.export.export(model, " \
           "example_inputs)" in markdown
    # A finding cites its rule, and shows only what is its own: TorchFix's fix for that call.
    assert "| timm/models/m3.py:13 | UG101 | `torch.jit.script(model_3)` |  |  |" in markdown
    assert ("| timm/models/_hub2.py:3 | TOR102 | `torch.load(path_2, map_location='cpu')` |  | "
            "`torch.load(path_2, map_location='cpu', weights_only=True)` |") in markdown


def test_the_page_shows_where_an_export_breaks(report):
    page = (report / "report.html").read_text()
    assert "<b>candidate: where the export of forward breaks</b> (4 submodules tried alone in 2.5 s):" in page
    assert ("<li><code>blocks.1.gate</code> (ValueGate): torch._dynamo.exc.UserError: Dynamic control flow is not "
            "supported (the same in blocks.2.gate) — at smoke.py:50 in forward: if y.mean() &gt; 0:</li>") in page
    # Linked from the gates that did not pass, to the model's section.
    assert "<a href='#model-vit-smoke'>vit-smoke</a>" in page and "<h3 id='model-vit-smoke'>vit-smoke</h3>" in page


@pytest.mark.browser
def test_the_page_draws_its_marks_and_keeps_the_scan_table_within_its_width(report, tmp_path):
    from helpers.readers import render

    shown = render(report / "report.html", tmp_path / "report.png")
    assert shown.console_errors == [] and shown.requests == []
    labels = {label for label, _, _ in shown.marks}
    assert {"FAILED", "passed", "condition"} <= labels
    assert all(width > 10 and height > 10 for _, width, height in shown.marks)  # drawn at 14 px, not empty
    assert shown.page_width <= 1280  # the wide scan table scrolls in its own box
