"""``migrate/project.diff``: the project's own calls that the move changes, written for the candidate (the API scan's
rewrites, upgrade_gate.project.patch), never applied; with what the project's tests said when a candidate ran them
on a copy with it applied."""

from __future__ import annotations

from pathlib import Path

from upgrade_gate.project.patch import HEADER, patch_of, with_safe_globals
from upgrade_gate.schema.project import PatchedTests, ProjectResults

FILE = "project.diff"


def project_diff(project: ProjectResults, candidate: str) -> tuple[str | None, list[str]]:
    """project.diff's text (None: nothing to rewrite, or no scan) and migrate/README.md's lines about it."""
    scan = project.scan
    if scan is None:
        return None, [f"- `{FILE}`: none — {project.scan_problem or 'the API scan did not run'}"]
    patched = project.patched.get(candidate)
    # The classes the patched run found torch.load refusing, allowed where the project defines them (project/patch.py).
    patch = with_safe_globals(patch_of(scan, Path(project.root)), Path(project.root),
                              patched.safe_globals if patched else ())
    unwritten = [f for f in scan.to_change if not f.rewritten]
    lines = [f"  - {name}: left out — {why}" for name, why in patch.left_out.items()]
    if patched is not None and patched.safe_globals:
        lines.append(f"  - allows {', '.join(f'`{name}`' for name in patched.safe_globals)} for `torch.load`, whose "
                     "`weights_only=True` refused it when the tests first ran with the diff "
                     "(`torch.serialization.add_safe_globals`, after the class)")
    if unwritten:
        lines.append(f"  - {len(unwritten)} of the scan's {len(scan.to_change)} findings have no rewrite: "
                     "compat.md gives each its replacement to write by hand")
    if not patch.files:
        return None, [f"- `{FILE}`: none — no finding of the scan has a rewrite that applies", *lines]
    tested = _tested(patched, candidate)
    rewritten = sum(f.rewritten and f.file in patch.files for f in scan.to_change)
    head = (f"- `{FILE}`: {rewritten} call(s) in {len(patch.files)} file(s) of the project, written for "
            f"{candidate}; never applied (`git apply migrate/{FILE}` at the project's root). {tested}")
    return HEADER.format(tested=tested) + patch.unified_diff(Path(project.root)), [head, *lines]


def _tested(patched: PatchedTests | None, candidate: str) -> str:
    """What the project's tests said with the diff applied to a copy, in one sentence."""
    if patched is None:
        return f"The project's tests did not run with it (`project({candidate})` runs them after the scan)."
    run = patched.stack
    if run.problem is not None:
        return f"The project's tests with it in {candidate}: {run.problem}."
    said = ", ".join(f"{n} {outcome}" for outcome, n in run.counts.items() if n)
    if patched.diff is None:
        return f"The project's tests with it in {candidate}: {said}."
    broken = [change.test_id for change in patched.diff.newly_failing if not change.allowed]
    against = ("every test that passes on the baseline passes" if not broken else
               f"still failing, though it passes on the baseline: {', '.join(broken)}" if len(broken) == 1 else
               f"still failing, though they pass on the baseline: {len(broken)}, {', '.join(broken)}")
    return f"The project's tests with it in {candidate}: {said}; {against}."
