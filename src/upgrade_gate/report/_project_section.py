"""The team's project in the report: the per-test diff, new warnings, and the API scan's findings."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from upgrade_gate.report._stack_section import package_blocks
from upgrade_gate.report._verdict_section import model_anchor
from upgrade_gate.report.render import Block, Code, Heading, Paragraph, Table, bullets, code_span
from upgrade_gate.schema.project import Finding, ProjectResults
from upgrade_gate.text import first_line, seconds, short


def project_blocks(project: ProjectResults, base: str, candidates: list[str]) -> list[Block]:
    """The team's tests per stack, what changed per test, and the scan's findings."""
    blocks: list[Block] = [
        Heading(2, "Project compatibility", anchor=model_anchor("project")),
        # Quoted as a shell would need them (a `-k "not slow"` expression), so the line can be pasted.
        Paragraph(f"The team's project at {code_span(project.root)}: "
                  f"{code_span(f'uv pip install {shlex.join(project.install)}')} into each stack, then "
                  f"{code_span(shlex.join(project.test))}.")]
    rows = []
    runs = [*project.stacks.items(), *((f"{stack} with project.diff", patched.stack)
                                       for stack, patched in project.patched.items())]
    for stack, tests in runs:
        run = tests.run
        warned = tests.warning_total
        rows.append([stack, (f"{run.status} (reused)" if run.reused_from else run.status) if run else "did not run",
                     *[str(tests.counts.get(k, 0)) for k in ("passed", "failed", "error", "skipped")],
                     "not counted" if warned is None else str(warned),
                     seconds(run.duration_s) if run and run.duration_s else "—", tests.problem or tests.junit])
    blocks.append(Table(["Stack", "Run", "passed", "failed", "errors", "skipped", "warnings", "time", "Outcomes"],
                        rows))
    reused = [f"{stack}'s tests ({code_span(tests.run.reused_from)})" for stack, tests in project.stacks.items()
              if tests.run and tests.run.reused_from]
    if project.scan and project.scan.reused_from:
        reused.append(f"the scan ({code_span(project.scan.reused_from)})")
    if reused:
        blocks.append(Paragraph("Reused from the result cache, their key unchanged (the project's files, the installed "
                                f"packages, the command or scanner): {', '.join(reused)}. `--fresh` runs them again."))
    uncounted = [f"{stack}: {tests.warnings_problem}" for stack, tests in project.stacks.items()
                 if tests.warnings_problem and not tests.problem]
    if uncounted:
        blocks += [Paragraph("Warnings not counted:"), bullets(*uncounted)]
    for stack in candidates:
        diff = project.diffs.get(stack)
        blocks.append(Heading(3, f"Tests: {stack} against {base}"))
        if diff is None:
            blocks.append(Paragraph("Not compared: one of the runs has no outcomes (above)."))
            continue
        groups = diff.groups()
        if not any(changes for _, _, changes in groups):
            blocks.append(Paragraph("Every test has the same outcome in both stacks."))
        for _, title, changes in groups:
            if not changes:
                continue
            blocks.append(Paragraph(f"{title.format(base=base, stack=stack)}: {len(changes)}"))
            blocks.append(Table(["Test", base, stack, "Message", "Allow-list"], [
                [code_span(c.test_id), c.baseline, c.candidate, first_line(c.message), c.allowed or ""]
                for c in changes]))
        for change in diff.newly_failing:
            if change.message:
                blocks += [Paragraph(f"{code_span(change.test_id)} on {stack}:"), Code(change.message.splitlines())]
        if diff.unused_allow:
            blocks.append(Paragraph("Allow-list entries that name no test of either run (a typo, or a test that is "
                                    "gone): " + ", ".join(code_span(t) for t in diff.unused_allow)))
        blocks += _patched_blocks(project, base, stack)
        blocks += new_warning_blocks(project, base, stack)
        blocks += package_blocks(project.package_changes(stack), [base, stack],
                                 "Packages whose versions differ between the two test venvs (a test that changed may "
                                 "owe it to one of these rather than to torch)")
    return blocks + scan_blocks(project)


def _patched_blocks(project: ProjectResults, base: str, stack: str) -> list[Block]:
    """The candidate's tests again with migrate/project.diff applied to a copy: what still breaks."""
    patched = project.patched.get(stack)
    if patched is None:
        return []
    files = ", ".join(code_span(name) for name in patched.files)
    said = f"With `migrate/project.diff` applied to a copy of the project ({files}), on {stack}: "
    if patched.diff is None:
        return [Paragraph(said + (patched.stack.problem or "no outcomes to compare") + ".")]
    broken = patched.diff.newly_failing
    if not broken:
        return [Paragraph(said + f"every test that passes on {base} passes.")]
    return [Paragraph(said + f"{len(broken)} test(s) that pass on {base} still fail:"),
            Table(["Test", base, stack, "Message", "Allow-list"], [
                [code_span(c.test_id), c.baseline, c.candidate, first_line(c.message), c.allowed or ""]
                for c in broken])]


def new_warning_blocks(project: ProjectResults, base: str, stack: str) -> list[Block]:
    """The kinds of warning (category and message) the candidate's tests raise and the baseline's do not."""
    if stack not in project.new_warnings:
        return [Paragraph("Warnings not compared: they were not counted in both runs (above).")]
    found = project.new_warnings[stack]
    if not found:
        return [Paragraph(f"No warning is new on {stack}.")]
    return [Paragraph(f"Warnings new on {stack} (not raised by the tests on {base}): {len(found)}"),
            Table(["Category", "Message", "Raised at", "Count", "Tests"], [
                [w.category, short(w.message), code_span(w.location), str(w.count), _tests_cell(w.tests)]
                for w in found])]


def _tests_cell(tests: tuple[str, ...], shown: int = 3) -> str:
    listed = ", ".join(code_span(t) for t in tests[:shown])
    return listed + (f" and {len(tests) - shown} more" if len(tests) > shown else "")


def scan_blocks(project: ProjectResults) -> list[Block]:
    blocks: list[Block] = [Heading(3, "API scan")]
    scan = project.scan
    if scan is None:
        return blocks + [Paragraph(f"Not scanned: {project.scan_problem}")]
    findings = scan.to_change
    rewritten = sum(f.rewritten for f in findings)
    blocks.append(Paragraph(
        f"{len(findings)} calls to change in {scan.files_scanned} files (TorchFix {scan.torchfix} and "
        f"upgrade-gate's {scan.rules} rules for the move to the candidate, compat/migration_rules.toml)"
        + (f"; {rewritten} of them written for the candidate in `migrate/project.diff` (never applied), marked "
           "✎ below:" if rewritten else ":")))
    if findings:
        # Each rule's explanation once, as a legend; a finding cites its rule and says only what is its own
        # (issue 26: the same 60 words 12 times over). What every finding of a rule shares goes in the legend.
        by_code: dict[str, list[Finding]] = {}
        for f in findings:
            by_code.setdefault(f.code, []).append(f)
        shared = {code: (_same(f.summary for f in found), _same(f.why for f in found),
                         _same(f.replacement for f in found)) for code, found in by_code.items()}
        legend = []
        for code, (summary, why, replacement) in sorted(shared.items()):
            # A check with nothing shared by its findings (TorchFix's without our note): each row says its own.
            said = " — ".join(w for w in (summary, why) if w) or f"TorchFix's {code}: each row says what it found"
            if replacement:
                said += ("" if said.endswith((".", "!", "?")) else ".") + f" Instead: {replacement}"
            legend.append(f"**{code}** ({len(by_code[code])}): {said}")
        blocks += [Paragraph("The rules found, each explained once:"), bullets(*legend)]
        rows = []
        for f in findings:
            summary, why, replacement = shared[f.code]
            own = [part for part, common in ((f.summary, summary), (f.why, why)) if part and common is None]
            rows.append([f"{f.file}:{f.line}", f.code + (" ✎" if f.rewritten else ""), code_span(short(f.call)),
                         " — ".join(own),
                         code_span(short(f.replacement)) if f.replacement and replacement is None else ""])
        blocks.append(Table(["Where", "Rule", "Call", "What (where the rule's legend does not say it)",
                             "Replacement (where it is this call's own)"], rows))
    for title, found in (("On the scan allow-list (`project.scan-allow`), not counted:",
                          [(f, f.allowed) for f in scan.findings if f.allowed]),
                         ("Set aside, not counted: the candidate never runs them", [(f, f.set_aside) for f in
                                                                                   scan.set_aside])):
        if found:
            blocks += [Paragraph(title), bullets(*(f"{f.file}:{f.line} {f.code} {code_span(short(f.call))}: {why}"
                                                   for f, why in found))]
    if scan.unused_allow:
        blocks.append(Paragraph(f"`project.scan-allow` keys that allowed no finding: "
                                f"{', '.join(code_span(k) for k in scan.unused_allow)}"))
    if scan.errors:
        blocks += [Paragraph("Files the scan could not parse:"), bullets(*(f"{file}: {e}" for file, e in scan.errors))]
    return blocks


def _same(values: Iterable[str]) -> str | None:
    """The one value every finding of a rule has, or None when they differ."""
    found = set(values)
    return found.pop() if len(found) == 1 else None
