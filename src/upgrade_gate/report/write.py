"""Writes the report folder's files from the results (report.md, report.html, results.json, verdict.json,
junit.xml, the step summary; compat.md and compat.json for `nox -s compat`). ``report_blocks`` is the page from
top to bottom, its sections made once, for both renderings, in the ``*_section`` modules beside this one.
"""

from __future__ import annotations

from pathlib import Path

from upgrade_gate import __version__
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.invocation import command
from upgrade_gate.report import junit
from upgrade_gate.report._figures import plot_figures
from upgrade_gate.report._matrix_section import matrix_rows
from upgrade_gate.report._model_section import model_blocks
from upgrade_gate.report._project_section import project_blocks
from upgrade_gate.report._stack_section import package_blocks, stack_blocks
from upgrade_gate.report._verdict_section import (
    gate_table,
    latency_table,
    model_anchor,
    verdict_blocks,
    where_measured_blocks,
)
from upgrade_gate.report._way_out_section import way_out_blocks
from upgrade_gate.report.render import Block, Heading, Paragraph, Table, bullets, to_html, to_markdown
from upgrade_gate.schema.project import ProjectResults
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import VerdictRecord
from upgrade_gate.stats import CONFIDENCE

REPORT_FILES = ("results.json", "verdict.json", "report.md", "report.html", "junit.xml")


def write_reports(results: Results, out: Path, *, step_summary: bool = True) -> list[Path]:
    """Write every report file; each replaces its old version whole. ``step_summary``: append the
    verdict to a GitHub Actions step's summary (the release explorer writes one of its own)."""
    paths = [out / name for name in REPORT_FILES]
    write_json_atomic(paths[0], results.to_dict())
    write_json_atomic(paths[1], results.verdict.to_dict())
    blocks = report_blocks(results, out)
    write_text_atomic(paths[2], to_markdown(blocks))
    write_text_atomic(paths[3], to_html(blocks, f"upgrade-gate: {results.verdict.verdict} "
                                                f"({' → '.join(results.stacks)})"))
    write_text_atomic(paths[4], junit.junit_xml(results.verdict))
    if step_summary:
        junit.append_to_step_summary(junit.step_summary(results.verdict, out))
    return paths


def write_compat_report(verdict: VerdictRecord, project: ProjectResults, stacks: list[str], out: Path) -> list[Path]:
    """`nox -s compat`: the project's gates and evidence alone, in compat.md and compat.json."""
    paths = [out / "compat.md", out / "compat.json"]
    write_json_atomic(paths[1], {**verdict.to_dict(), "project": project.to_dict()})
    blocks: list[Block] = [Heading(1, f"upgrade-gate compat: {' → '.join(stacks)}")]
    blocks += verdict_blocks(verdict)
    blocks += [Paragraph(f"Generated {verdict.generated_at} by upgrade-gate {__version__} (`{command('compat')}`: the "
                         f"project alone; `{command('compare')}` judges it with the models)", style="meta")]
    blocks += [gate_table(verdict.gates)]
    blocks += project_blocks(project, verdict.baseline, list(verdict.candidates))
    write_text_atomic(paths[0], to_markdown(blocks))
    return paths


def report_blocks(results: Results, out: Path) -> list[Block]:
    names = list(results.stacks)
    verdict = results.verdict
    blocks: list[Block] = [Heading(1, f"upgrade-gate: {' → '.join(names)}")]
    blocks += verdict_blocks(verdict, link_models=True, measured_on=results.measured_on,
                             devices=results.measured_targets)
    warnings = (*verdict.warnings, *verdict.gate_warnings)
    if warnings:
        blocks += [Paragraph("Warnings:", style="warning"), bullets(*warnings)]
    # What ships today, whatever the verdict: a stage that fails is not a departure (issue 63: FX could not trace a
    # YOLO head, and it read as the baseline's artifact departing).
    for title, found in (("fails at a stage", [f for f in verdict.baseline_findings if f.stage]),
                         ("departs from its eager models", [f for f in verdict.baseline_findings if not f.stage])):
        if found:
            blocks += [Paragraph(f"What {verdict.baseline} ships today {title}, whatever the verdict:"),
                       bullets(*(f"{finding} — [details](#{model_anchor(finding.model)})" + (
                           " · [way out](#way-out)" if _diagnosed(results, finding.model, verdict.baseline) else "")
                           for finding in found))]
    blocks += way_out_blocks(results)
    settings = results.settings
    past = (f", going on up to {settings.most_rounds} while one still straddles where its gate's intervals leave "
            f"room" if settings.most_rounds > settings.rounds else "")
    rounds = (f"up to {settings.rounds} quiet rounds (stopping once each latency gate is decided{past})"
              if settings.stop_early else f"{settings.rounds} quiet rounds")
    blocks.append(Paragraph(
        f"Generated {verdict.generated_at} by upgrade-gate {results.tool_version} · models: "
        f"{', '.join(m.name for m in results.models)} · threads {', '.join(map(str, settings.threads))} · per stack, "
        f"method and thread count: {settings.warmup} warm-up runs, then {rounds}, the order "
        f"alternating, of at least {settings.iterations} timed runs or {settings.time_budget_s:g} s in all · files: "
        "report.md, report.html, results.json, verdict.json, junit.xml", style="meta"))
    blocks += [Heading(2, "Plots", anchor="plots", page_only=True), *plot_figures(results)]

    blocks += [Heading(2, "Decision matrix", anchor="decision-matrix")]
    header = [n if n == info.role else f"{n} ({info.role})" for n, info in results.stacks.items()]
    blocks.append(Table(["Factor", *header], matrix_rows(results)))
    blocks += latency_table(results)
    blocks += where_measured_blocks(results)
    blocks += [Heading(2, "Requirements", anchor="requirements"),
               gate_table(verdict.gates, link_models=True, folded=f"All {len(verdict.gates)} gates")]
    if results.project:
        blocks += project_blocks(results.project, verdict.baseline, list(verdict.candidates))
    blocks += [Heading(2, "Models", anchor="models")]
    for model in results.models:
        blocks += model_blocks(results, model, out)
    blocks += [Heading(2, "Stacks", anchor="stacks")]
    for info in results.stacks.values():
        blocks += stack_blocks(info)
    blocks += package_blocks(results.package_differences, [n for n, info in results.stacks.items() if info.packages],
                             "Packages whose versions differ between the stacks' venvs (the spec's pins, the extra "
                             "requirements and everything they pulled in)")
    blocks += [Heading(2, "Reading this report", anchor="reading"), READING_NOTES]
    return blocks


READING_NOTES = bullets(
    "*reference* is the baseline stack's eager output: what the team validates today. The numerics gate "
    "compares each candidate's artifact with it; the other comparisons locate where a difference comes from "
    "(the torch upgrade itself, or the export).",
    "rel_l2 = ‖actual − reference‖₂ / ‖reference‖₂; SNR = 20·log10(‖reference‖/‖error‖) dB; min atol is the "
    "smallest absolute tolerance at which every element matches.",
    "Latency ratio = candidate / baseline: the median over the rounds of each round's ratio of medians, the "
    "stacks measured in turn (A B, B A, …); the interval is the distribution-free one for a median (two of the "
    f"rounds' ratios, chosen so that it holds the true median with at least {CONFIDENCE:.0%} probability), and its "
    "coverage is written with it. A round the rest of the machine disturbed is repeated or left out. The latency "
    "gate fails only when the whole interval is above its threshold. Runtime memory = peak RSS of a fresh process "
    "that loads and runs the model minus the same process with only the runtime started.",
    "Every file named under *Evidence* is relative to this folder; `results.json` holds every record, "
    "`verdict.json` every gate.",
)


def _diagnosed(results: Results, model: str, stack: str) -> bool:
    """Whether the Way out section has the stack's search for the model."""
    found = results.model(model)
    return found is not None and stack in found.stacks and found.stacks[stack].diagnosis is not None
