"""The results schema: what results.json and verdict.json hold reads back as it was
written, its value types round-trip through their text, and the page shows
everything report.md shows."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from records import junit_of, warning, write_project_run, write_stack_model, write_stack_packages

from upgrade_gate import pipeline
from upgrade_gate.errors import ConfigError
from upgrade_gate.plan import load_plan
from upgrade_gate.records import Reader
from upgrade_gate.results import (
    GateResult,
    GateStatus,
    Quantity,
    Results,
    Severity,
    Side,
    Unit,
    Verdict,
    VerdictRecord,
)

REFERENCE = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(1, 16)
DEAD = np.zeros((1, 4), np.float32)  # an output that is 0 whatever the input: a degenerate reference
LOCALIZED = {"method": "forward", "attempts": 4, "seconds": 2.5, "complete": True, "budget_s": 300,
             "culprits": [{"module": "blocks.1.gate", "class": "ValueGate", "type": "torch._dynamo.exc.UserError",
                           "message": "Dynamic control flow is not supported\nmore", "source":
                               "smoke.py:50 in forward: if y.mean() > 0:", "same_failure_in": ["blocks.2.gate"]}]}


@pytest.fixture
def report(project: Path) -> Path:
    """A report whose candidate fails to export one model (localized), and is 1% off on another,
    whose second output is degenerate (a warning); its stacks' packages differ beside torch, and the
    team's tests break and warn on the candidate."""
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
    for stack in ("legacy", "candidate"):
        broken = stack == "candidate"
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=None if broken else [REFERENCE],
                          failed_stage="export" if broken else None, localize=LOCALIZED if broken else None)
        write_stack_model(out, stack, "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[REFERENCE * 1.02],
                          quantize="PT2E" if broken else "FX")
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
    from upgrade_gate.atomic import to_json

    return to_json(value)


def test_another_major_version_is_refused_naming_the_file(report):
    data = json.loads((report / "results.json").read_text())
    data["schema_version"] = "1.0"
    (report / "results.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"results\.json: .*results schema '1\.0'; this upgrade-gate reads 2\.x"):
        Results.load(report)


def test_a_wrong_type_is_named_by_its_path(report):
    data = json.loads((report / "results.json").read_text())
    data["models"][0]["stacks"]["legacy"]["measured"]["1"]["rounds"]["forward"] = "seven"
    (report / "results.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=re.escape(
            "Unexpected type str (expected int) in 'results.json.models[0].stacks.legacy.measured.1.rounds.forward'")):
        Results.load(report)


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
    assert f"⚠ {DEAD_WARNING}".replace("|", "\\|") in markdown and f"⚠ {DEAD_WARNING}</td>" in page


def test_the_page_shows_where_an_export_breaks(report):
    page = (report / "report.html").read_text()
    assert "<b>candidate: where the export of forward breaks</b> (4 submodule exports in 2.5 s):" in page
    assert ("<li><code>blocks.1.gate</code> (ValueGate): torch._dynamo.exc.UserError: Dynamic control flow is not "
            "supported (the same in blocks.2.gate) — at smoke.py:50 in forward: if y.mean() &gt; 0:</li>") in page
    # Linked from the gates that did not pass, to the model's section.
    assert "<a href='#model-vit-smoke'>vit-smoke</a>" in page and "<h3 id='model-vit-smoke'>vit-smoke</h3>" in page
