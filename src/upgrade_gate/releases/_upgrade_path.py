"""The upgrade-path report: ``<out>/upgrade-path.{md,html,json}`` from the release folders
`nox -s releases` wrote — release × model, each finding's first and last release, and one
recommendation: the newest judged release with no hard failure on the chosen models."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.errors import EXIT_GO, EXIT_INCOMPLETE, EXIT_NO_GO
from upgrade_gate.invocation import command
from upgrade_gate.releases._reproducers import ReproducerRun
from upgrade_gate.releases._table import (
    RECORD_VERSION,
    Bisection,
    Release,
    ReleaseRecord,
    ReleaseTable,
    gate_of,
    read_record,
    release_folder,
    release_results,
)
from upgrade_gate.report import junit
from upgrade_gate.report.render import Block, Bullets, Heading, Item, Paragraph, Table, code_span, to_html, to_markdown
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import GateResult, GateStatus, Severity, Verdict

REPORT_NAME = layout.UPGRADE_PATH
MATRIX_HEADING = "Release × model"


# The columns of the release × model table: a header, and the gates a cell may come from (fp32, quantized).
COLUMNS = (
    ("export", ("export", "quantized-export")),
    ("numerics vs the baseline's eager", ("numerics", "quantized-numerics")),
    ("task agreement", ("task-classification", "task-embedding", "task-generation", "task-tokens",
                        "quantized-task")),
    ("latency ratio, 1 thread", ("latency",)),
    ("artifact size", ("artifact-size",)),
)


def _cell(results: Results | None, stack: str, model: str, gates: tuple[str, ...]) -> tuple[str, GateResult | None]:
    found = next((g for name in gates if (g := gate_of(results, name, model, stack)) is not None), None)
    if found is None:
        # Task gates are named by the task's kind; take any of this model's.
        if gates[0].startswith("task"):
            found = next((g for g in (results.verdict.gates if results else ())
                          if g.model == model and g.stack == stack and "task" in g.gate), None)
        if found is None:
            return "—", None
    if found.status is GateStatus.BLOCKED:  # the root cause is in the export cell
        text = f"blocked by {found.blocked_by}"
    elif found.gate in ("export", "quantized-export"):
        text = "ok" if found.status is GateStatus.PASSED else f"{found.status.label}: {found.note}"
    elif found.measured is not None:
        text = f"{found.measured}" + ("" if found.status is GateStatus.PASSED else f" ({found.status.label})")
    else:
        text = f"{found.status.label}" + (f": {found.note}" if found.note else "")
    return text, found


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """A gate that fails for a model in some release: where it holds, where it appears and goes."""

    gate: str
    model: str
    severity: str
    statuses: dict[str, str]  # release name → status label, every judged release
    failing: tuple[str, ...]
    first: str
    last: str
    gone_in: str | None  # the first judged release after the last failing one, where it passes
    appeared_after: str | None  # the judged release before the first failing one

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        judged = list(self.statuses)
        text = f"**{self.gate}** ({self.severity}) for {code_span(self.model)}: fails in {', '.join(self.failing)}"
        if self.appeared_after:
            text += f"; appears in {self.first} (passed in {self.appeared_after})"
        elif self.first == judged[0]:
            text += f"; fails from the oldest release judged ({self.first})"
        else:
            text += f"; first fails in {self.first}, and no earlier release passed it"
        if self.gone_in:
            text += f"; gone in {self.gone_in}"
        elif self.last == judged[-1]:
            text += f"; still fails in the newest release judged ({self.last})"
        else:
            text += f"; last fails in {self.last}, and no later release passed it"
        return text


@dataclass(frozen=True, kw_only=True, slots=True)
class UpgradePath:
    baseline: str
    models: tuple[str, ...]
    records: tuple[ReleaseRecord, ...]
    rows: tuple[dict[str, Any], ...]
    findings: tuple[Finding, ...]
    recommendation: str | None
    recommendation_text: str
    undecided: tuple[str, ...] = ()
    bisection: Bisection | None = None
    generated_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))

    def exit_code(self) -> int:
        """0: a release to move to; 1: releases were judged and none is fit; 3: undecided (none judged, or one
        newer than the answer INCOMPLETE). With --bisect too: a CI job reads 0 as "a release is recommended"."""
        if self.undecided or not any(r.judged for r in self.records):
            return EXIT_INCOMPLETE
        return EXIT_GO if self.recommendation else EXIT_NO_GO

    def to_dict(self) -> dict[str, Any]:
        return {"record_version": RECORD_VERSION, "generated_at": self.generated_at, "baseline": self.baseline,
                "models": list(self.models), "releases": [r.to_dict() for r in self.records], "rows": list(self.rows),
                "findings": [f.to_dict() for f in self.findings], "recommendation": self.recommendation,
                "recommendation_text": self.recommendation_text, "undecided": list(self.undecided),
                "bisection": self.bisection.to_dict() if self.bisection else None}


def not_run_per_release() -> str:
    """What a team with [tool.upgrade-gate.project] gets no verdict on per release, and how to get it."""
    return ("the project's tests and API scan are not run per release: copy a release's spec "
            "(releases/<release>/<release>.toml) into your stack specs' folder as candidate.toml and run "
            f"`{command('compat')}` to judge them")


def upgrade_path(out: Path, releases: Sequence[Release], table: ReleaseTable, baseline: str,
                 bisection: Bisection | None, not_run: str = "") -> UpgradePath:
    """The releases in range that finished, read back from their folders in ``out``."""
    records, results = [], {}
    for release in releases:
        record = read_record(release_folder(out, release), table)
        if record is None:
            continue
        records.append(record)
        if record.judged:
            results[release.name] = release_results(release_folder(out, release))
    models = tuple(dict.fromkeys(m for r in records for m in r.models))
    rows = []
    for record in records:
        for model in models if record.judged else ():
            if model not in record.models:
                continue
            cells = {}
            for header, gates in COLUMNS:
                text, found = _cell(results.get(record.release.name), record.release.name, model, gates)
                cells[header] = {"text": text, "status": found.status.value if found else None,
                                 "measured": found.measured.to_dict() if found and found.measured else None}
            rows.append({"release": record.release.name, "model": model, "cells": cells})
    findings = findings_from({r.release.name: (of.verdict.gates if (of := results.get(r.release.name)) else ())
                              for r in records if r.judged})
    best, text, undecided = recommend(records, findings, models, not_run)
    return UpgradePath(baseline=baseline, models=models, records=tuple(records), rows=tuple(rows),
                       findings=findings, recommendation=best, recommendation_text=text, undecided=undecided,
                       bisection=bisection)


def recommend(records: Sequence[ReleaseRecord], findings: Sequence[Finding], models: Sequence[str],
              not_run: str = "") -> tuple[str | None, str, tuple[str, ...]]:
    """The newest judged release with no hard failure, the sentence that says so (or what blocks each release), and the
    INCOMPLETE releases newer than it, which could have changed it; ``not_run``: what no release was judged on."""
    judged = [r for r in records if r.judged]
    fit = [r for r in judged if r.verdict in (Verdict.GO, Verdict.GO_WITH_CONDITIONS)]
    best = fit[-1] if fit else None
    undecided = tuple(r.release.name for r in judged if r.verdict is Verdict.INCOMPLETE
                      and (best is None or r.release.executorch > best.release.executorch))
    if best is not None:
        text = (f"**{best.release.name}** (torch {best.release.torch}): the newest release in range with no hard "
                f"failure on {', '.join(models)} — {best.verdict}")
        newer = [r for r in judged if r.release.executorch > best.release.executorch]
        if newer:
            text += "; newer: " + ", ".join(f"{r.release.name} {r.verdict}" for r in newer)
    else:
        blocking: dict[str, list[str]] = {}
        for finding in findings:
            if finding.severity == Severity.HARD.value:
                for name in finding.failing:
                    blocking.setdefault(name, []).append(f"{finding.gate} for {finding.model}")
        text = "**none in range**: " + ("; ".join(
            f"{r.release.name}: {', '.join(blocking.get(r.release.name, [])) or r.verdict or r.status}"
            for r in records) if records else "no release in range finished")
    if undecided:
        # What is INCOMPLETE in a release (a busy machine, a killed measurement) can change on a re-run.
        text += (f". Not decided: {', '.join(undecided)} (INCOMPLETE — its report says what was missing); run the same "
                 "command again to decide it")
    if not_run:
        text += f". Judged on the models alone: {not_run}"
    return (best.release.name if best else None), text, undecided


def findings_from(gates: dict[str, Sequence[GateResult]]) -> tuple[Finding, ...]:
    """Each (gate, model) that failed in some release, followed across ``gates`` (each judged
    release's own gates, oldest release first): hard findings first."""
    keys: dict[tuple[str, str], str] = {}
    for release, judged in gates.items():
        for result in judged:
            if result.stack == release and result.status is GateStatus.FAILED:
                keys.setdefault((result.gate, result.model), result.severity.value)
    findings = []
    for (gate, model), severity in sorted(keys.items(), key=lambda item: (item[1] != Severity.HARD.value, item[0])):
        statuses = {release: found.status.label for release, judged in gates.items()
                    if (found := next((g for g in judged if g.gate == gate and g.model == model and g.stack == release),
                                      None)) is not None}
        names = list(statuses)
        failing = tuple(n for n in names if statuses[n] == GateStatus.FAILED.label)
        first, last = names.index(failing[0]), names.index(failing[-1])
        passed = GateStatus.PASSED.label
        before = next((names[i] for i in range(first - 1, -1, -1) if statuses[names[i]] == passed), None)
        after = next((names[i] for i in range(last + 1, len(names)) if statuses[names[i]] == passed), None)
        findings.append(Finding(gate=gate, model=model, severity=severity, statuses=statuses, failing=failing,
                                first=failing[0], last=failing[-1], gone_in=after, appeared_after=before))
    return tuple(findings)


def upgrade_path_blocks(path: UpgradePath, table: ReleaseTable) -> list[Block]:
    blocks: list[Block] = [
        Heading(1, "Upgrade path"),
        Paragraph(f"Recommendation: {path.recommendation_text}", style="verdict"),
        Paragraph(f"Baseline `{path.baseline}`; every release judged against it with the gates of `nox -s compare` "
                  f"(numerics against the baseline's eager outputs, latency at one thread). Release table: "
                  f"`{table.path.name}`. Generated {path.generated_at}.", style="meta"),
    ]
    if path.bisection is not None:
        blocks += [Heading(2, "Bisection"), Paragraph(path.bisection.answer),
                   Table(["release", f"{path.bisection.gate} for {path.bisection.model}"],
                         [[name, state] for name, state in path.bisection.states.items()])]
    blocks += [Heading(2, "Releases"), Table(
        ["release", "torch", "released", "adapter", "outcome", "report", "time"],
        [[r.release.name, r.release.torch, r.release.released, f"`{r.adapter}`" if r.adapter else "—",
          str(r.verdict) if r.judged else f"{r.status}: {r.reason}",
          f"`releases/{r.release.name}/report.md`" if r.judged else "—", f"{r.seconds:.0f} s"]
         for r in path.records])]
    blocks += [Heading(2, "Findings")]
    reproduced = _reproduced(path.records)
    if path.findings:
        blocks.append(Bullets([Item(f.summary(), ["per release: " + ", ".join(
            f"{name.removeprefix('executorch-')} {status}" for name, status in f.statuses.items()),
            *(f"compare's reproducer {code_span(script)}: " + _answers(runs)
              for (model, script), runs in reproduced.items() if model == f.model)])
            for f in path.findings]))
    else:
        blocks.append(Paragraph("No gate failed in any judged release."))
    if reproduced:
        releases = [r.release.name for r in path.records if r.reproducers]
        blocks += [Heading(2, "Compare's reproducers, in each release"), Paragraph(
            "Each reproducer `nox -s compare` wrote in this report folder, run as its docstring says with each "
            "release's Python before its venv was removed: exit 1 with the error it measured, it reproduces; exit 0, "
            "the release fixes it; exit 3 or a crash, it could not run there (its last line shown): no answer. "
            "To ask a release yourself: `<its venv>/bin/python <script>`, from the report folder "
            "(`--keep-stacks` keeps the explorer's venvs)."), Table(
            ["model", "reproducer", *releases],
            [[code_span(model), code_span(script), *(_answer(runs.get(name)) for name in releases)]
             for (model, script), runs in reproduced.items()])]
    if path.rows:
        headers = [header for header, _ in COLUMNS]
        blocks += [Heading(2, MATRIX_HEADING), Table(
            ["release", "model", *headers],
            [[row["release"], row["model"], *(row["cells"][h]["text"] for h in headers)] for row in path.rows])]
    blocks.append(Paragraph("Each judged release's own report (every gate with its threshold, the measured value and "
                            "the evidence) is in `releases/<release>/`.", style="meta"))
    return blocks


def _reproduced(records: Sequence[ReleaseRecord]) -> dict[tuple[str, str], dict[str, ReproducerRun]]:
    """Each reproducer's runs, by (model, script), then release."""
    found: dict[tuple[str, str], dict[str, ReproducerRun]] = {}
    for record in records:
        for run in record.reproducers:
            found.setdefault((run.model, run.script), {})[record.release.name] = run
    return found


def _answer(run: ReproducerRun | None) -> str:
    if run is None:
        return "—"
    if run.answer in ("fixed", "reproduces"):
        return f"{run.answer} (exit {run.exit_code}{'; rebuilt from program.py' if run.rebuilt else ''})"
    return f"{run.answer}" + (f" (exit {run.exit_code})" if run.exit_code is not None else "") + f": {run.said}"


def _answers(runs: dict[str, ReproducerRun]) -> str:
    """"reproduces in 0.7.0, 1.0.0; fixed in 1.5.1" — release by release, grouped by answer in order; and, for a
    whole method's reproducer, the releases that loaded its program.pt2 and those that ran it rebuilt from
    program.py (torch.export.save's format is not kept across releases)."""
    groups: dict[str, list[str]] = {}
    for name, run in runs.items():
        groups.setdefault(run.answer, []).append(name.removeprefix("executorch-"))
    said = "; ".join(f"{answer} in {', '.join(names)}" for answer, names in groups.items())
    answered = {name.removeprefix("executorch-"): run.rebuilt for name, run in runs.items()
                if run.answer in ("fixed", "reproduces")}
    if any(answered.values()):
        loaded = [name for name, rebuilt in answered.items() if not rebuilt]
        said += (f" (program.pt2 loaded in {', '.join(loaded) or 'none'}; rebuilt from program.py in "
                 f"{', '.join(name for name, rebuilt in answered.items() if rebuilt)})")
    return said


ISSUE_RELEASES = "## In ExecuTorch's releases"


def note_releases_in_issues(out: Path, records: Sequence[ReleaseRecord]) -> None:
    """Each reproducer's ISSUE.md (compat/search/issue_text.py) gains what the releases said of it: where it reproduces,
    the first release that fixes it. Written whole under a new name (the file may be a result cache's hard link),
    and only inside ``out``; a later explorer run replaces the section."""
    root = out.resolve()
    for (_, script), runs in _reproduced(records).items():
        issue = out / Path(script).parent / "ISSUE.md"
        if issue.is_symlink() or not issue.is_file() or not issue.resolve().is_relative_to(root):
            continue
        fixed = next((name.removeprefix("executorch-") for name, run in runs.items() if run.answer == "fixed"), None)
        first = (f"The first of them that fixes it: ExecuTorch {fixed}." if fixed
                 else "None of them fixes it.")
        text = issue.read_text(encoding="utf-8").split(f"\n{ISSUE_RELEASES}\n")[0].rstrip("\n")
        write_text_atomic(issue, f"{text}\n\n{ISSUE_RELEASES}\n\nRun with each release's own Python by "
                                 f"`nox -s releases` (exit 1: reproduces, 0: fixed, 3 or a crash: could not run): "
                                 f"{_answers(runs)}. {first}\n")


def _detail(blocks: list[Block]) -> list[Block]:
    """The release × model section: its heading and table."""
    start = next((i for i, b in enumerate(blocks) if isinstance(b, Heading) and b.text == MATRIX_HEADING), None)
    return [] if start is None else blocks[start:start + 2]


def write_upgrade_path(out: Path, releases: Sequence[Release], table: ReleaseTable, baseline: str,
                       bisection: Bisection | None, log: Callable[[str], Any] = print, not_run: str = "") -> int:
    """The report in its three files, a line per release and the recommendation on the console; the exit status."""
    path = upgrade_path(out, releases, table, baseline, bisection, not_run)
    blocks = upgrade_path_blocks(path, table)
    files = [out / f"{REPORT_NAME}.md", out / f"{REPORT_NAME}.html", out / f"{REPORT_NAME}.json"]
    write_text_atomic(files[0], to_markdown(blocks))
    write_text_atomic(files[1], to_html(blocks, "upgrade-gate: upgrade path"))
    write_json_atomic(files[2], path.to_dict())
    note_releases_in_issues(out, path.records)
    # On a GitHub Actions run's page: everything but the release × model table, which the page has.
    junit.append_to_step_summary(to_markdown([block for block in blocks if block not in _detail(blocks)]))
    for record in path.records:
        log(f"releases: {record.release.name}: " + (str(record.verdict) if record.judged else record.status))
    if bisection is not None:
        log(f"Bisection: {bisection.answer}")
    log(f"Recommendation: {path.recommendation_text.replace('**', '')}")
    log("Report: " + ", ".join(str(f) for f in files))
    return path.exit_code()
