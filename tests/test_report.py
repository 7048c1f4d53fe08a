from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.stack_records import REFERENCE, add_round_loads, write_stack_model

from upgrade_gate import layout, pipeline
from upgrade_gate.config.plan import load_plan


@pytest.fixture
def plan(project: Path):
    return load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project, config_path=project / "pyproject.toml")


def test_the_verdict_line_names_hard_failures_and_counts_soft_ones(plan):
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    # Off by 1% (hard) and three times slower (soft).
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE * 1.01], latency_ms=3.0)
    assert pipeline.report(plan) == 1
    report = (out / "report.md").read_text()
    assert ("- **candidate** vs baseline **legacy**: **NO-GO** — hard: numerics (vit-smoke); 1 soft gate failed "
            "(listed below)") in report
    assert "<a href='#failing-gates'>listed below</a>" in (out / "report.html").read_text()
    # Only soft ones: the count alone.
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=3.0)
    assert pipeline.report(plan) == 0
    assert "**GO-WITH-CONDITIONS** — 1 soft gate failed (listed below)" in (out / "report.md").read_text()


def test_report_files_verdict_first(plan, capsys):
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=2.0)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE * 1.01],
                      latency_ms=1.0)

    assert pipeline.report(plan) == 1  # NO-GO: numerics off by 1%

    report = (out / "report.md").read_text()
    lines = report.splitlines()
    assert lines[0] == "# upgrade-gate: legacy → candidate"
    assert lines[2] == "## Verdict: **NO-GO**"
    assert "- **candidate** vs baseline **legacy**: **NO-GO** — hard: numerics (vit-smoke)" in report
    # The gates that did not pass, right under the verdict.
    start = report.index("### Gates that did not pass")
    failing = report[start:report.index("\n## ", start)]
    assert ("| FAILED | hard | candidate | vit-smoke | numerics | rel_l2 = 1.00e-02 | rel_l2 ≤ 1.00e-04 | "
            "artifact(candidate) vs eager(legacy) |") in failing
    assert "latency" not in failing
    assert report.index("## Decision matrix") < report.index("## Requirements") < report.index("## Models")
    assert ("| passed | soft | candidate | vit-smoke | latency | ratio = 0.500, 98.4% interval [0.500, 0.500] "
            "(1 thread(s): 1.000 ms / 2.000 ms; the gate's 2 intervals together: at least 96.9%) |") in report
    assert ("| forward | candidate | 56 | 1.000 ms | 1.000 ms | 1.000 ms | 1.000 ms | 1.000 ms | 0.000 ms | 1000.0 FPS | "
            "0.500, 98.4% interval [0.500, 0.500] | candidate |") in report

    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "NO-GO" and verdict["candidates"] == {"candidate": "NO-GO"}
    assert {g["gate"] for g in verdict["gates"]} == {"same-inputs", "export", "artifact-size", "numerics", "latency",
                                                     "memory"}
    numerics = next(g for g in verdict["gates"] if g["gate"] == "numerics")
    assert (numerics["status"], numerics["model"], numerics["severity"]) == ("failed", "vit-smoke", "hard")
    # Numbers stay numbers, with their unit; prose is rendered from them.
    assert numerics["measured"]["unit"] == "rel_l2" and numerics["measured"]["value"] == pytest.approx(0.01, rel=1e-5)
    assert numerics["threshold"] == {"value": 1e-4, "unit": "rel_l2", "low": None, "high": None, "level": None}

    results = json.loads((out / "results.json").read_text())
    assert results["schema_version"] == "2.14"
    model, = results["models"]
    assert model["stacks"]["candidate"]["measured"]["2"]["latency"]["forward"]["p50_ms"] == 1.0
    assert {(r["threads"], r["median"]) for r in model["latency_ratios"]} == {(1, 0.5), (2, 0.5)}
    reference = next(c for c in model["comparisons"] if c["purpose"] == "candidate artifact vs reference")
    assert reference["worst_rel_l2"] == pytest.approx(0.01, rel=1e-5)
    drift = next(c for c in model["comparisons"] if c["purpose"] == "torch upgrade drift (eager)")
    assert drift["outputs"][0]["snr_db"] == "inf"  # identical eager outputs; JSON has no infinity

    assert "Verdict: NO-GO  [candidate: NO-GO — hard: numerics (vit-smoke)]" in capsys.readouterr().out


# The model's one output, the same in every stack and artifact: the numerics gate passes.
DEGENERATE = {
    "all zero (a dead model)": (np.zeros((1, 16), np.float32), "≈ 0: max |value| 0.0e+00 ≤ 1e-06"),
    "constant (a saturated head)": (np.full((1, 16), 0.25, np.float32),
                                    "constant: values spread 0.0e+00 ≤ 1e-06 × max |value| 0.25"),
}


@pytest.mark.parametrize(("output", "why"), DEGENERATE.values(), ids=DEGENERATE.keys())
def test_a_degenerate_reference_output_is_a_warning_of_the_numerics_gate(plan, output, why):
    out = plan.settings.out_dir
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[output], artifact=[output])

    assert pipeline.report(plan) == 0  # a warning, not a failure: GO

    warning = f"reference output forward.output_0 is degenerate ({why}): the comparison with it says little"
    numerics = next(g for g in json.loads((out / "verdict.json").read_text())["gates"] if g["gate"] == "numerics")
    assert (numerics["status"], numerics["warnings"]) == ("passed", [warning])
    listed = f"vit-smoke (candidate, numerics): {warning}"
    markdown, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    # Under the verdict, and beside the number it qualifies in the gate's row.
    assert f"Warnings:\n\n- {listed}\n" in markdown
    assert f"<li>{html.escape(listed, quote=False)}</li>" in page
    row = f"| passed | hard | candidate | numerics | rel_l2 = 0.00e+00 ⚠ {warning} |".replace("|value|", "\\|value\\|")
    assert row in markdown
    # The page draws the sign, which needs no emoji font (issue 26).
    assert re.search(re.escape("<td>rel_l2 = 0.00e+00 ") + "<svg class='mark'[^>]*aria-label='condition'.*?</svg> "
                     + re.escape(f"{html.escape(warning, quote=False)}</td>"), page)
    # The numerics table says it of every comparison against that output.
    assert markdown.count(f"| degenerate reference ({why})".replace("|value|", "\\|value\\|")) == 5


def test_a_normal_reference_output_gives_no_warning(plan):
    out = plan.settings.out_dir
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])

    assert pipeline.report(plan) == 0

    numerics = next(g for g in json.loads((out / "verdict.json").read_text())["gates"] if g["gate"] == "numerics")
    assert (numerics["status"], numerics["warnings"]) == ("passed", [])
    markdown = (out / "report.md").read_text()
    assert "Warnings:" not in markdown and "⚠" not in markdown and "degenerate" not in markdown


def test_report_without_any_results_is_a_usage_error(plan, capsys):
    with pytest.raises(SystemExit) as stopped:
        pipeline.report(plan)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"upgrade-gate: error: {plan.settings.out_dir}: no stack results to report on; run `nox -s compare` first\n"
    )
    assert not (plan.settings.out_dir / "report.md").exists()


def test_damaged_record_is_named(plan, capsys):
    out = plan.settings.out_dir
    directory = write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    data = json.loads((directory / "runtime.json").read_text())
    data["stages"][2]["duration_s"] = "slow"
    (directory / "runtime.json").write_text(json.dumps(data))
    # A damaged report folder is no verdict and no usage error: INCOMPLETE, naming the file and what to do.
    with pytest.raises(SystemExit) as stopped:
        pipeline.report(plan)
    assert stopped.value.code == 3
    assert capsys.readouterr().err == (
        f"upgrade-gate: incomplete: {out}: Unexpected type str (expected int or float) in "
        "'stacks/legacy/models/vit-smoke/runtime.json.stages[2].duration_s'; "
        f"run `nox -s compare -- --out {out}` again: it rewrites the records (the result cache copies back what "
        "finished)\n"
    )


def test_other_schema_major_is_rejected(plan, capsys):
    out = plan.settings.out_dir
    directory = write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    data = json.loads((directory / "export.json").read_text())
    data["schema_version"] = "2.0"
    (directory / "export.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit):
        pipeline.report(plan)
    assert "schema_version 2.0 in 'stacks/legacy/models/vit-smoke/export.json'; this tool reads 1.x" in capsys.readouterr().err


def test_unwritable_out_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as stopped:
        pipeline.check_writable(blocker / "report")
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith(f"upgrade-gate: error: {blocker / 'report'}: report folder is not writable")


def test_a_baseline_artifact_off_from_its_own_eager_model_is_a_finding(plan):
    # The candidate is fine; the baseline's own export is what is broken (as
    # optimize_for_mobile's conv-BatchNorm folding is for MobileNetV3).
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[-REFERENCE])
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])

    assert pipeline.report(plan) == 0

    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "GO"
    finding, = verdict["baseline_findings"]
    assert (finding["model"], finding["output"], finding["rel_l2"]) == ("vit-smoke", "forward.output_0", 2.0)
    assert "- **vit-smoke**: rel_l2 = 2.00e+00 (forward.output_0), over the 1.0e-04 gate" in (
        out / "report.md").read_text()


def test_damaged_measurement_is_named(plan, capsys):
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    path = out / "measurements" / "vit-smoke" / "threads-2.json"
    data = json.loads(path.read_text())
    data["stacks"]["candidate"]["rounds"][4]["samples_ms"]["forward"] = "fast"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as stopped:
        pipeline.report(plan)
    assert stopped.value.code == 3
    assert capsys.readouterr().err == (
        f"upgrade-gate: incomplete: {out}: Unexpected type str (expected list) in "
        "'measurements/vit-smoke/threads-2.json.stacks.candidate.rounds[4].samples_ms.forward'; "
        f"run `nox -s compare -- --out {out}` again: it rewrites the records (the result cache copies back what "
        "finished)\n"
    )


def test_variants_delegation_profile_and_localization_in_the_report(project):
    plan = load_plan(["--out", "out", "--models", "vit-smoke"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    delegation = {"delegate": "XnnpackBackend", "delegate_partitions": 2, "delegated_nodes": 95, "portable_nodes": 5,
                  "portable_ops": {"aten_cumsum_default": 5}}
    profile = {"operators": [{"name": "DELEGATE_CALL", "calls": 5, "total_ms": 4.0, "share": 0.8},
                             {"name": "native_call_cumsum.out", "calls": 5, "total_ms": 1.0, "share": 0.2}]}
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=2.0,
                      profile={"operators": [{"name": "aten::linear", "calls": 10, "total_ms": 9.0, "share": 0.9}]})
    backends = {"coreml": {"forward": {"status": "ok", "bytes": 3 * 2**20, "seconds": 20.0, "delegate_partitions": 1,
                                       "delegated_nodes": 10, "portable_nodes": 0}},
                "qnn": {"forward": {"status": "unavailable", "reason": "needs Qualcomm's QNN SDK"}},
                "vulkan": {"forward": {"status": "failed", "error": "IndexError: list index out of range"}}}
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0,
                      export_details=delegation, profile=profile, backends=backends)
    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=None, quantize="FX",
                      failed_stage="export")
    write_stack_model(out, "candidate", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[REFERENCE * 1.01],
                      latency_ms=0.5, quantize="PT2E", export_details=delegation)

    # The baseline's int8 failing is no failure of the candidate's: nothing to time it against.
    assert pipeline.report(plan) == 0
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "GO"
    latency, = [g for g in verdict["gates"] if g["model"] == "vit-smoke@int8-dynamic" and g["gate"] == "latency"]
    assert latency["status"] == "not comparable"
    report = (out / "report.md").read_text()
    # Side by side under the fp32 model: every stack's fp32 and int8.
    assert ("| legacy | int8-dynamic | **export failed: RuntimeError: export broke** | FX | — | — | — | — | — | — |"
            in report)
    assert "| candidate | int8-dynamic | ok | PT2E | 40.0 | 1.00000 | — | 0.500 ms (2.00× faster than fp32) | 1000 B | 95.0% |" in report
    assert ("- candidate XnnpackBackend took 95 of 100 operator nodes (95.0%) in 2 partition(s); "
            "not delegated: aten_cumsum_default ×5") in report
    assert "| 1 | `aten::linear` | 9.000 ms | 90.0% | 10 | `DELEGATE_CALL` | 4.000 ms | 80.0% | 5 |" in report
    assert "| Delegated operator nodes (least, per method) | — (no delegate) | 95.0% (vit-smoke · forward) |" in report
    assert "| candidate | coreml | ok | 1 | 100.0% | 3.0 MiB | 20.0 s |  |" in report
    assert "| candidate | qnn | unavailable |  |  | — |  | needs Qualcomm's QNN SDK |" in report
    assert "| candidate | vulkan | failed |  |  | — |  | IndexError: list index out of range |" in report
    assert "| Other backends, export only (models lowered) | — | coreml 1/1; vulkan 0/1; unavailable here: qnn |" in report


def test_outputs_compared_in_part_say_so_once(project):
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    padded = np.concatenate([REFERENCE, REFERENCE], axis=0)  # row 0 is read later; row 1 is padding
    garbage = padded.copy()
    garbage[1] = 7.0
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[padded], artifact=[garbage if stack == "candidate" else padded],
                          build_details={"read_extents": {"forward.output_0": [0, 1]}})
    assert pipeline.report(plan) == 0
    verdict = json.loads((out / "verdict.json").read_text())
    numerics, = [g for g in verdict["gates"] if g["gate"] == "numerics"]
    assert numerics["status"] == "passed"  # the padding the candidate fills differently is not read
    report = (out / "report.md").read_text()
    assert report.count("Outputs compared in part: `forward.output_0` compared on entries 0–0 of 2 along axis 0") == 1


def test_a_busy_machine_is_said_once_and_its_few_rounds_make_no_ratio(project):
    """Issue 26: four near-identical "machine busy" paragraphs filled the first screen, and the matrix
    showed one quiet round's ratio as "1.324, 0.0% interval [1.324, 1.324]"."""
    from upgrade_gate.report import _plots as plots

    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32,minilm-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    for model, candidate_ms in (("vit-smoke", 10.0), ("minilm-smoke", 13.24)):
        write_stack_model(out, "legacy", model, eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 9)
        write_stack_model(out, "candidate", model, eager=[REFERENCE], artifact=[REFERENCE],
                          latency_ms=[[candidate_ms] * 8] * 9)
    quiet, busy = [(0.0, 0.02)] * 9, [(0.0, 0.02)] + [(0.6, 1.9)] * 8  # busy: one quiet round of nine
    add_round_loads(out, "vit-smoke", 1, quiet)
    add_round_loads(out, "vit-smoke", 2, busy)
    add_round_loads(out, "minilm-smoke", 1, busy)
    add_round_loads(out, "minilm-smoke", 2, busy)

    assert pipeline.report(plan) == 3  # INCOMPLETE

    # Once, with the models and thread counts; the figures are those of the rounds written above: others
    # kept 1.9 of 2 cores busy, the timed threads waited 0.6 of their time in 8 of every 9 rounds.
    # minilm-smoke's candidate is 1.32× the baseline in every round, disturbed or not: said, never judged (issue 37).
    said = ("machine busy: too few quiet rounds to judge latency (an interval needs 6) for vit-smoke at 2 thread(s) "
            "(1 of 9 quiet); minilm-smoke at 1 thread(s) (1 of 9 quiet; over 1.05: 1.32×–1.32× in every one of its 9 "
            "rounds, disturbed or not), 2 thread(s) (1 of 9 quiet; over 1.05: 1.32×–1.32× in every one of its 9 "
            "rounds, disturbed or not) — other processes "
            f"kept up to {(1.9 * 8 + 0.02) / 9:.2f} of 2 cores busy, the timed threads waited up to {0.6 * 8 / 9:.1%} "
            "of their time for a CPU, the run queue reached 3. Measure again when the machine is quieter: "
            "`--remeasure` times again without exporting")
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["incomplete"][0] == said and len(verdict["incomplete"]) == 2  # and what to do
    markdown, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert markdown.count(said) == 1 and page.count(html.escape(said, quote=False).replace("`", "")) <= 1
    first_screen = markdown[:markdown.index("## Models")]
    assert first_screen.count("cores busy") == 1 and first_screen.count("waited") == 1
    # The gates' rows say it short.
    assert ("| incomplete | soft | candidate | minilm-smoke | latency | 1 thread(s): machine busy: 1 of 9 rounds "
            "quiet; an interval needs 6 quiet rounds; not judged, but over 1.05: 1.32×–1.32× in every one of its 9 "
            "rounds, disturbed or not |") in first_screen

    # No ratio, no interval, where one quiet round is all there is; the quiet thread count keeps its own.
    assert "0.0% interval" not in markdown and "0.0% interval" not in page and "[1.324" not in markdown
    matrix = markdown[markdown.index("## Decision matrix"):markdown.index("## Requirements")]
    # One short line per thread count; the figures per method are the latency table's.
    assert ("| Latency at 1 thread(s), candidate/baseline per method (table) |  | ×1.00 typical over 1 method: 0 faster, "
            "0 slower, 1 not told apart; 1 model not timed: machine busy [incomplete] |") in matrix
    assert ("| Latency at 2 thread(s), candidate/baseline per method (table) |  | no ratio; 2 models not timed: machine "
            "busy [incomplete] |") in matrix
    table = markdown[markdown.index("### Latency"):markdown.index("## Requirements")]
    assert ("| minilm-smoke · forward | 10.000 ms | 13.240 ms | machine busy | 10.000 ms | 13.240 ms | machine busy |"
            in table)
    assert "| vit-smoke · forward | 10.000 ms | 10.000 ms | 1.000 [1.000, 1.000] | 10.000 ms | 10.000 ms | machine busy |" \
        in table  # 1 thread: 9 quiet rounds (docs)
    assert max(len(cell) for line in matrix.splitlines()[2:] for cell in line.split(" | ")) <= 300
    assert "| forward | candidate | 8 | 13.240 ms | 13.240 ms | 13.240 ms | 13.240 ms | 13.240 ms | 0.000 ms" in markdown
    assert "| — (machine busy) |  |" in markdown

    # The plot draws the judged ratios only: none, once every thread count is busy (the ratios stay in results.json).
    add_round_loads(out, "vit-smoke", 1, busy)
    results = pipeline.judge(plan)
    assert all(m.ratios for m in results.models)
    assert plots.ratios(results) is None


HOSTILE = ("```\n# Injected heading\n<script>alert(1)</script>\n| x | y |\n|---|---|\n"
           "[click](http://evil.example) ![img](http://evil.example/p.png) `` ` ``")



def test_a_machine_its_host_takes_the_cpu_from_is_said_busy_with_the_hosts_steal(project):
    """Seen on the default run of 2026-12-06: nanoVLM at 2 threads was left incomplete, 7 of 18 rounds quiet, and
    the line said only that other processes kept 0.00 cores busy and the threads waited 3.8% — the virtual machine's
    host had taken up to 38% of its CPU time (steal) in the rounds it disturbed. The line names the steal."""
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 9)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=[[10.0] * 8] * 9)
    add_round_loads(out, "vit-smoke", 1, [(0.0, 0.02)] * 9)
    add_round_loads(out, "vit-smoke", 2, [(0.01, 0.0)] * 9, steal=0.3)  # only the first round quiet
    assert pipeline.report(plan) == 3  # INCOMPLETE
    line = json.loads((out / "verdict.json").read_text())["incomplete"][0]
    assert line.startswith("machine busy: too few quiet rounds to judge latency") and "(1 of 9 quiet)" in line, line
    assert f"the virtual machine's host took up to {0.3 * 8 / 9:.1%} of its CPU time (steal)" in line, line
    # A quiet host is not said: the busy line of the test above names no steal.

def test_report_md_keeps_what_it_quotes_as_text(project):
    """report.md is posted as a step summary or a pull-request comment: an exception's message or a model's
    description that holds Markdown (a fence, a heading, a tag, a link) stays text, read by a CommonMark parser."""
    from markdown_it import MarkdownIt

    (project / "team_model.py").write_text("def build(): ...\n")
    with (project / "pyproject.toml").open("a") as config:
        config.write(f'[tool.upgrade-gate.models.team-model]\nfactory = "team_model:build"\n'
                     f"description = {json.dumps(HOSTILE.replace(chr(10), ' '))}\n")
    plan = load_plan(["--out", "out", "--models", "team-model@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "team-model", eager=[REFERENCE], artifact=[REFERENCE])
    directory = write_stack_model(out, "candidate", "team-model", eager=[REFERENCE], artifact=None,
                                  failed_stage="export")
    export = json.loads((directory / "export.json").read_text())
    for stage in export["stages"]:
        if stage["status"] == "failed":
            stage["error"].update(message=HOSTILE, traceback_tail=HOSTILE.splitlines())
    (directory / "export.json").write_text(json.dumps(export))
    assert pipeline.report(plan) == 1
    report = (out / "report.md").read_text()
    assert HOSTILE.splitlines()[1] in report  # quoted, in a code block
    tokens = MarkdownIt("commonmark").enable("table").parse(report)
    flat = [t for token in tokens for t in (token, *(token.children or []))]
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not [h for h in headings if "Injected" in h], headings
    assert not [t.content for t in flat if t.type in ("html_block", "html_inline")]
    assert not [t.attrs for t in flat if t.type in ("link_open", "image")]
    # Every table is one of the report's own: its header row is the report's, never the quoted "| x | y |".
    header_cells = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "th_open"]
    assert "x" not in header_cells and "y" not in header_cells


@pytest.mark.parametrize("text", ["plain", "a`b", "``double``", "`lead", "trail`", "a <b> & c"])
def test_a_code_span_shows_its_text_whatever_backticks_it_holds(text):
    from markdown_it import MarkdownIt

    from upgrade_gate.report.render import code_span, inline

    spans = [t.content for t in MarkdownIt("commonmark").parseInline(f"x {code_span(text)} y")[0].children
             if t.type == "code_inline"]
    assert spans == [text]
    assert inline(f"x {code_span(text)} y") == f"x <code>{html.escape(text, quote=True)}</code> y"


@pytest.mark.parametrize(("value_ms", "reference_ms", "expected"), [
    (1.153, 7.08, "6.14× faster than fp32"),  # issue 37: "1.153 ms (6.14× fp32)" read as slower
    (2.5, 2.0, "1.25× slower than fp32"),
    (1.0, 1.004, "as fast as fp32"),
    (1.0, 0.996, "as fast as fp32"),
    (0.001, 10.0, "10000.00× faster than fp32"),
])
def test_a_variants_latency_beside_fp32_says_which_way(value_ms, reference_ms, expected):
    from upgrade_gate.text import speed_against

    assert speed_against(value_ms, reference_ms, "fp32") == expected


def test_the_latency_section_says_what_each_figure_covers_and_why_the_rounds_ended(project):
    """Issue 37: a ratio's coverage is its interval's, at its share of the gate's; the gate's note says what
    its intervals reach together; the rounds' paragraph says why they ended."""
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 7)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=[[20.0] * 8] * 7)
    for threads in (1, 2):
        add_round_loads(out, "vit-smoke", threads, [(0.0, 0.02)] * 7, ended="decided",
                        settings={"rounds": 9, "stop_early": True, "intervals": 2})
    pipeline.report(plan)
    markdown = (out / "report.md").read_text()
    assert ("Latency at 1 thread(s), 7 quiet rounds, the stacks in turn (ratio: candidate/baseline, the median of the "
            "per-round ratios, with its interval and that interval's coverage; the latency gate's 2 intervals share "
            "its coverage, each at 97.50%):") in markdown
    assert "| forward | candidate | 56 |" in markdown and "| 2.000, 98.4% interval [2.000, 2.000] | legacy |" in markdown
    assert ("7 of 7 rounds quiet; the timed threads waited 0.0% of their time for a CPU, other processes kept 0.02 of "
            "2 cores busy, the run queue reached 3; stopped after 7 of 9 quiet rounds, every gate decided "
            "(stop-early).") in markdown
    assert ("ratio = 2.000, 98.4% interval [2.000, 2.000] (1 thread(s): 20.000 ms / 10.000 ms; stopped after 7 of 9 "
            "quiet rounds, every gate decided (stop-early); the gate's 2 intervals together: at least 96.9%)"
            ) in markdown


def test_the_least_delegated_method_is_named_and_a_method_with_no_operator_node_is_said_apart():
    from types import SimpleNamespace

    from upgrade_gate.report._matrix_section import _least_delegated
    from upgrade_gate.schema.stack import Delegation

    def delegation(delegated: int, portable: int) -> Delegation:
        return Delegation(delegate="XnnpackBackend", partitions=1, delegated_nodes=delegated, portable_nodes=portable,
                          portable_ops={})

    nanovlm = SimpleNamespace(name="nanovlm", stacks={"candidate": SimpleNamespace(delegation={
        "vision_encoder": delegation(90, 10), "embed": delegation(0, 0), "lm_head": delegation(3, 1)})})
    assert _least_delegated((nanovlm,), "candidate") == ("75.0% (nanovlm · lm_head); 1 method with no operator node "
                                                          "to delegate")
    only_empty = SimpleNamespace(name="m", stacks={"candidate": SimpleNamespace(delegation={"embed": delegation(0, 0)})})
    assert _least_delegated((only_empty,), "candidate") == "— (1 method, none with an operator node to delegate)"


def installed_on(out: Path, stack: str, architecture: str, isa: list[str]) -> None:
    """stacks/<stack>/stack.json's probe, as compat/probe.py writes it on a machine of that architecture."""
    path = out / "stacks" / stack / "stack.json"
    data = json.loads(path.read_text()) if path.is_file() else {"spec": {}}
    data["installed"] = {"python": "3.11.9", "executable": f"/venv/{stack}/bin/python", "platform": "Linux",
                         "machine": architecture, "cpu": "Some CPU", "cpu_count": 8, "isa": isa,
                         "torch_version": "2.8.0", "torch_default_threads": 8, "distributions": {"torch": "2.8.0"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("architecture", "isa", "noted"), [("x86_64", ["avx2", "fma"], True),
                                                             ("aarch64", ["asimd", "asimddp", "i8mm"], False)])
def test_every_latency_figure_says_the_machine_it_was_measured_on(plan, architecture, isa, noted):
    """The target (issue 41): CPU, architecture, cores and the ISA extensions the kernels dispatch on, in
    results.json, the decision matrix and the page; an x86-64 host's verdict line says, once, that a phone runs
    other kernels."""
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    for stack in ("legacy", "candidate"):
        installed_on(out, stack, architecture, isa)
    pipeline.report(plan)
    results = json.loads((out / "results.json").read_text())
    assert results["measured_on"] == {"name": "local", "cpu": "Some CPU", "architecture": architecture, "cores": 8,
                                      "isa": isa}
    assert results["stacks"]["candidate"]["installed"]["isa"] == isa
    report = (out / "report.md").read_text()
    verdict_line = next(line for line in report.splitlines() if line.startswith("- **candidate** vs baseline"))
    assert verdict_line.endswith(f"; latency measured on an {architecture} host, not a phone (where)") is noted
    assert report.count("not a phone") == noted  # one note, on the verdict line
    described = f"local: Some CPU, {architecture}, 8 cores; ISA {' '.join(isa)}"
    assert f"| Latency, cold start and memory measured on (where) | {described} | {described} |" in report
    assert "| Latency at 1 thread(s) on local, candidate/baseline per method (table) |" in report
    where = report[report.index("### Where it measured"):report.index("## Requirements")]
    assert f"measured on **local**, the machine that ran the tool: Some CPU, {architecture}, 8 cores" in where
    assert ", ".join(isa) in where and ("a phone runs their Arm kernels" in where) is noted
    assert "href='#where-measured'" in (out / "report.html").read_text()


def test_a_target_that_gave_no_rounds_is_never_said_to_have_measured_latency(plan):
    """Issue 61, N5: with both targets of [tool.upgrade-gate.targets] refused (ssh's words in each failed file), the
    verdict line names no target as measured, the page says why each gave nothing, and their gates say it too."""
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    for stack in ("legacy", "candidate"):
        installed_on(out, stack, "x86_64", ["avx2"])
    layout.bundle_manifest_file(out).parent.mkdir(parents=True)
    layout.bundle_manifest_file(out).write_text(json.dumps({"models": {"vit-smoke": {
        "stacks": {"legacy": {}, "candidate": {}}, "threads": [1], "methods": ["forward"]}}}))
    for name in ("pi5", "lab"):
        layout.device_failed_file(out, name).parent.mkdir(exist_ok=True)
        layout.device_failed_file(out, name).write_text(json.dumps({
            "target": name, "address": f"ssh://ci@{name}.lab:22",
            "error": f"ssh ssh://ci@{name}.lab:22: Permission denied (publickey)."}))
    pipeline.report(plan)
    report = (out / "report.md").read_text()
    verdict_line = next(line for line in report.splitlines() if line.startswith("- **candidate** vs baseline"))
    assert verdict_line.endswith("; latency measured on an x86_64 host, not a phone (where)"), verdict_line
    where = report[report.index("### Where it measured"):report.index("## Requirements")]
    for name in ("lab", "pi5"):
        assert (f"Nothing was measured on **{name}**: no rounds from {name}: ssh ssh://ci@{name}.lab:22: Permission "
                f"denied (publickey).") in where
    assert "Latency on **" not in where
    gates = [g for g in json.loads((out / "verdict.json").read_text())["gates"] if g["gate"] == "device-latency"]
    assert gates and all(g["status"] == "incomplete" for g in gates), gates


def test_a_target_that_gave_rounds_is_named_on_the_verdict_line_and_one_that_did_not_is_not(plan):
    """Issue 61, N5: a device whose rounds were read in (device-results) is named beside the host; a refused one
    is left off the line."""
    from test_policy import device_rounds

    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=1.0)
    for stack in ("legacy", "candidate"):
        installed_on(out, stack, "x86_64", ["avx2"])
    device_rounds(out, [[10.0, 10.1]] * 7)
    layout.bundle_manifest_file(out).parent.mkdir(parents=True)
    layout.bundle_manifest_file(out).write_text(json.dumps({"models": {"vit-smoke": {
        "stacks": {"legacy": {}, "candidate": {}}, "threads": [1], "methods": ["forward"]}}}))
    layout.device_failed_file(out, "pi5").write_text(json.dumps({
        "target": "pi5", "address": "ssh://ci@pi5.lab:22", "error": "ssh ssh://ci@pi5.lab:22: Connection refused"}))
    pipeline.report(plan)
    report = (out / "report.md").read_text()
    verdict_line = next(line for line in report.splitlines() if line.startswith("- **candidate** vs baseline"))
    assert verdict_line.endswith("; latency measured on an x86_64 host, and on device:Pixel 8 (where)"), verdict_line
    where = report[report.index("### Where it measured"):report.index("## Requirements")]
    assert "Latency on **device:Pixel 8**" in where
    assert "Nothing was measured on **pi5**: no rounds from pi5: ssh ssh://ci@pi5.lab:22: Connection refused." in where
