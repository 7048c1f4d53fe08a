"""Per test and per warning, what changed between the baseline's run of the team's tests and a candidate's."""

from __future__ import annotations

from upgrade_gate.project._junit import NOT_PASSING, CaseOutcome
from upgrade_gate.schema.project import NOT_IN_RUN, CaseChange, NewWarning, OutcomeDiff, RaisedWarning


def diff_outcomes(baseline: dict[str, CaseOutcome], candidate: dict[str, CaseOutcome],
                  allow: dict[str, str] | None = None) -> OutcomeDiff:
    """Sort every test of either run into what changed; unchanged tests are in neither list."""
    allow = allow or {}
    groups: dict[str, list[CaseChange]] = {}
    for test_id in [*baseline, *(t for t in candidate if t not in baseline)]:
        before, after = baseline.get(test_id), candidate.get(test_id)
        group = _group(before.outcome if before else None, after.outcome if after else None)
        if group is None:
            continue
        message = (after.message if after and after.outcome != "passed" else before.message if before else "")
        groups.setdefault(group, []).append(CaseChange(
            test_id=test_id, baseline=before.outcome if before else NOT_IN_RUN,
            candidate=after.outcome if after else NOT_IN_RUN, message=message,
            allowed=allow.get(test_id) if group == "newly_failing" else None))
    unused = tuple(t for t in allow if t not in baseline and t not in candidate)
    return OutcomeDiff(**{name: tuple(changes) for name, changes in groups.items()}, unused_allow=unused)


def _group(before: str | None, after: str | None) -> str | None:
    if before == "passed" and after in (*NOT_PASSING, None):
        return "newly_failing"
    if before is None:
        return "only_candidate"
    if after is None:
        return "only_baseline"
    if before in NOT_PASSING and after == "passed":
        return "newly_passing"
    if before in NOT_PASSING and after in NOT_PASSING:
        return "still_failing"
    if after == "skipped" and before != "skipped":
        return "newly_skipped"
    if before == "skipped" and after != "skipped":
        return "no_longer_skipped"
    return None


def new_warnings(baseline: tuple[RaisedWarning, ...], candidate: tuple[RaisedWarning, ...]) -> tuple[NewWarning, ...]:
    """The candidate's warnings whose kind the baseline's tests never raised, one per kind, in the order raised."""
    known = {w.kind for w in baseline}
    found: dict[tuple[str, str], list[RaisedWarning]] = {}
    for warning in candidate:
        if warning.kind not in known:
            found.setdefault(warning.kind, []).append(warning)
    return tuple(NewWarning(category=raised[0].category, message=raised[0].message, location=raised[0].location,
                            count=sum(w.count for w in raised), tests=tuple(dict.fromkeys(w.test for w in raised)))
                 for raised in found.values())


def per_test(warnings: tuple[RaisedWarning, ...]) -> dict[str, int]:
    """How many warnings each test raised."""
    tally: dict[str, int] = {}
    for warning in warnings:
        tally[warning.test] = tally.get(warning.test, 0) + warning.count
    return tally
