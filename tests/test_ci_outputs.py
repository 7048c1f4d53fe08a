"""What CI systems and people read besides report.md: junit.xml, the GitHub step
summary, and report.html rendered in a real (headless) Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.readers import colours, render, validate_junit
from helpers.runs import make_project
from helpers.stack_records import REFERENCE, write_stack_model

from upgrade_gate import pipeline
from upgrade_gate.config.plan import load_plan


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished report whose candidate is 1% off: NO-GO on the numerics gate (written once; tests read it)."""
    project = make_project(tmp_path_factory.mktemp("team"))
    summary = project / "step-summary.md"
    summary.write_text("earlier step\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                         config_path=project / "pyproject.toml")
        out = plan.settings.out_dir
        write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=2.0)
        write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE * 1.01],
                          latency_ms=1.0)
        assert pipeline.report(plan) == 1
    return out, summary


def test_junit_has_one_case_per_gate_and_model(failed_run):
    out, _ = failed_run
    gates = json.loads((out / "verdict.json").read_text())["gates"]
    tree = validate_junit(out / "junit.xml")
    cases = tree.findall(".//testcase")
    assert sorted((c.get("classname"), c.get("name")) for c in cases) == sorted(
        (f"{g['stack']}.{g['model']}", g["gate"]) for g in gates)
    suite = tree.find("testsuite")
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == ("candidate vs legacy", str(len(gates)), "1")
    failure, = tree.findall(".//testcase[@name='numerics']/failure")
    assert failure.get("message") == "rel_l2 = 1.00e-02 (threshold rel_l2 ≤ 1.00e-04)"
    assert failure.get("type") == "hard gate"
    assert {p.get("name"): p.get("value") for p in suite.iter("property")}["verdict"] == "NO-GO"


def test_step_summary_is_appended_when_github_actions_sets_it(failed_run):
    out, summary = failed_run
    text = summary.read_text()
    assert text.startswith("earlier step\n## upgrade-gate: NO-GO\n")
    assert "| FAILED | hard | candidate | vit-smoke | numerics | rel_l2 = 1.00e-02" in text
    assert str(out / "report.html") in text


@pytest.mark.browser
def test_html_report_is_one_self_contained_file(failed_run, tmp_path):
    out, _ = failed_run
    page = (out / "report.html").read_text()
    assert page.index("id='verdict'") < page.index("id='failing-gates'") < page.index("id='plots'")
    assert "src='http" not in page and "href='http" not in page and "<script" not in page
    # Shown in a real browser: the verdict on top, every plot drawn, nothing fetched, no errors.
    shown = render(out / "report.html", tmp_path / "report.png")
    assert shown.verdict == "Verdict: NO-GO"
    assert shown.console_errors == [] and shown.requests == []
    plots = {figure: (width, height) for figure, _, width, height in shown.images}
    # No stage failed and no operator was profiled here: the plots that have data, and the
    # histogram of the failed numerics gate's error.
    assert set(plots) == {"plot-latency", "plot-latency-ratio", "plot-numerics", "plot-stages", "plot-size-memory",
                          "error-candidate-vit-smoke-numerics"}
    assert all(width > 100 and height > 100 for width, height in plots.values()), plots
    assert colours(shown.screenshot) > 50
