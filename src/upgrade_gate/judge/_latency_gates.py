"""The latency, memory and budget gates: a ratio's interval against the threshold, rounds the machine
disturbed left out (a busy machine's note: judge/_busy_machine.py)."""

from __future__ import annotations

from collections.abc import Iterable

from upgrade_gate.config.plan import Plan
from upgrade_gate.config.settings import OPTION
from upgrade_gate.judge._busy_machine import busy_note, over_in_every_round
from upgrade_gate.judge._gates import Gates, Missing, Rule
from upgrade_gate.schema.measured import RatioEstimate, RoundsEnded
from upgrade_gate.schema.measurement import Contention, RoundsDesign
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import (
    GateStatus,
    Quantity,
    Unit,
)
from upgrade_gate.stats import CONFIDENCE, together
from upgrade_gate.text import size

# Where a gate still straddles after every round it could take, the `most-rounds` that would decide it more often
# where looks past `rounds` fit its intervals' shares (stats.looks_past): the default, simulated in `nox -s benchmark
# -- looks` (docs/benchmarks-log.md, near-threshold gates). Named to a run that set fewer.
MORE_ROUNDS = int(OPTION["most-rounds"].default)


def latency_gate(found: Gates, severity: str) -> None:
    """Over every thread count and method: the deciding row's ratio and its interval (the rule: docs/report.md,
    ``latency``). A thread count without the quiet rounds an interval needs is incomplete, neither a failure nor a
    pass; a definite failure at another thread count still fails."""
    plan, model, stack, base = found.plan, found.model, found.stack, found.plan.baseline.name
    max_ratio = plan.settings.gates["latency"].threshold
    rule = _latency_rule(plan, model)
    judged: list[Row] = []
    for threads in plan.settings.threads:
        mine, theirs = found.candidate.measured[threads], found.baseline.measured[threads]
        if mine.host and theirs.host and mine.host != theirs.host:
            # Shards of a CI matrix, one stack each: two machines' clocks, not a ratio.
            found.add("latency", severity, True, rule, inconclusive=True,
                      note=f"not comparable: {stack} was timed on {mine.host}, {base} on {theirs.host}; run both "
                           "stacks of a shard in one job to gate on latency")
            return
        for name, measured in ((stack, mine), (base, theirs)):
            if measured.status != "ok" or not measured.latency:
                found.missing("latency", severity, rule, found.measured_missing(name, measured))
                return
        if set(mine.latency) != set(theirs.latency):
            found.add("latency", severity, False, rule,
                      note=f"the stacks measured different methods at {threads} thread(s): "
                           f"{sorted(mine.latency)} / {sorted(theirs.latency)}")
            return
        machine = model.contention.get(threads)
        busy = model.busy_at(threads)
        if busy is not None:
            over = over_in_every_round(model.every_round(stack, threads), max_ratio)
            judged.append(("incomplete", busy_note(threads, busy) + (f"; not judged, but {over}" if over else ""),
                           None, threads))
            continue
        if machine is not None and machine.ended is RoundsEnded.SERVER_ENDED and machine.quiet < machine.needs:
            # A file from before each side ended alone (results 2.9): another side's server ended every side's
            # rounds. The server's end, never a busy machine; measuring again goes on without it.
            judged.append(("incomplete", f"{threads} thread(s): {machine.ending()}; an interval needs "
                                         f"{machine.needs} quiet rounds", None, threads))
            continue
        judged += _method_rows(found, threads)
    if not judged:
        found.missing("latency", severity, rule, Missing(status=GateStatus.INCOMPLETE, note="no thread count measured"))
        return
    outcome, where, estimate, deciding_threads = deciding(judged)
    if estimate is None:
        found.missing("latency", severity, rule, Missing(status=GateStatus.INCOMPLETE, note=where))
        return
    where += _why_so_few(plan, model.contention.get(deciding_threads), outcome, estimate)
    levels = [e.level for _, _, e, _ in judged if e is not None]
    where += f"; the gate's {len(levels)} intervals together: at least {together(levels):.1%}" if len(levels) > 1 \
        else ""
    found.add("latency", severity, outcome != "failed", rule, inconclusive=outcome == "inconclusive",
              measured=Quantity(value=estimate.median, unit=Unit.RATIO, low=estimate.low, high=estimate.high,
                                level=estimate.level), note=where)


def _latency_rule(plan: Plan, model: ModelResults) -> Rule:
    gate, rounds = plan.settings.gates["latency"], plan.settings.rounds
    most = max((machine.most for machine in model.contention.values()), default=rounds)
    return Rule(metric="ratio", op="≤", threshold=Quantity(value=gate.threshold, unit=Unit.RATIO),
                condition=f"the median's whole interval, per thread count and method, the gate's intervals at least "
                          f"{CONFIDENCE:.0%} together; methods at most {gate['min-delta-ms']:g} ms slower at its top "
                          "pass",
                evidence=f"measurements/{model.name}/threads-*.json ("
                         f"{'up to ' if plan.settings.stop_early else ''}{rounds} quiet rounds, "
                         f"{f'{most} while an interval straddled, ' if most > rounds else ''}the order alternating)")


def _method_rows(found: Gates, threads: int) -> list[Row]:
    """Each method's row at ``threads``: its ratio's outcome, or why it has none."""
    gate, model = found.plan.settings.gates["latency"], found.model
    mine, theirs = found.candidate.measured[threads], found.baseline.measured[threads]
    machine = model.contention.get(threads)
    rows: list[Row] = []
    for method in mine.latency:
        estimate = model.ratio(found.stack, threads, method)
        if estimate is None:
            rows.append(("incomplete", f"{threads} thread(s), {method}: no rounds in common", None, threads))
            continue
        where = (f"{threads} thread(s){'' if method == 'forward' else f', {method}'}: "
                 f"{mine.latency[method].p50_ms:.3f} ms / {theirs.latency[method].p50_ms:.3f} ms")
        if machine is not None and machine.oversubscribed:
            where += f" ({machine.threads} threads on {machine.free_cores:.2f} free cores)"
        rows.append((estimate.outcome(gate.threshold, theirs.latency[method].p50_ms, gate["min-delta-ms"]), where,
                     estimate, threads))
    return rows


def _why_so_few(plan: Plan, machine: Contention | None, outcome: str, estimate: RatioEstimate) -> str:
    """What the deciding row's note adds: why its interval is short or straddles, and why the rounds ended."""
    where = ""
    if outcome == "inconclusive" and not estimate.holds:
        where += f"; only {len(estimate.per_round)} quiet rounds: the interval covers {estimate.level:.1%}, short of " \
                 f"the {estimate.confidence:.2%} each of the gate's intervals needs"
        if machine is not None and machine.ended is RoundsEnded.PLANNED and machine.needs > machine.most:
            where += f" (set `rounds` to at least {machine.needs})"
    elif outcome == "inconclusive":
        where += f"; the interval straddles {plan.settings.gates['latency'].threshold:.2f}"
        if (machine is not None and machine.ended is RoundsEnded.PLANNED and plan.settings.stop_early
                and RoundsDesign.of(planned=plan.settings.rounds, most_rounds=MORE_ROUNDS, stop_early=True,
                                    intervals=machine.intervals).most > machine.most):
            where += (f" after all {machine.most} rounds (`most-rounds = {MORE_ROUNDS}` goes on only while an "
                      f"interval straddles and decides such a gate more often: docs/benchmarks-log.md, near-threshold "
                      f"gates)")
    if estimate.dropped:
        where += f"; {estimate.dropped} round(s) left out (samples that are not durations)"
    if machine is not None and machine.ended in (RoundsEnded.DECIDED, RoundsEnded.REPEATS_RAN_OUT):
        where += f"; {machine.ending()}"  # why there are not as many rounds as asked for
    return where


def device_latency_gate(found: Gates, severity: str) -> None:
    """The latency gate's rule on each device the report read rounds from (docs/report.md, ``device-latency``): one
    gate over every target, so each interval has its share of the gate's 95% over all of them (``judged_targets``).
    A row the device could not give is incomplete, never the candidate's failure: the device, its setup or the
    bundle may be at fault."""
    rows = [row for row in found.model.device_latency if row.stack == found.stack]
    if not rows:
        return
    gates = found.plan.settings.gates
    max_ratio, min_delta = gates["latency"].threshold, gates["latency"]["min-delta-ms"]
    targets = list(dict.fromkeys(row.target.name for row in rows))
    checked = [row for row in rows if row.ended]
    how = (f"timed from here over ssh as the host is: up to {max(row.planned for row in rows)} alternating rounds, "
           "the stop rule, the contention check" if len(checked) == len(rows) else
           f"run-on-device.sh: {max(row.planned for row in rows)} rounds, the order alternating; no contention "
           "check on the device" if not checked else
           "over ssh with the host's stop rule and contention check, and run-on-device.sh's fixed rounds, unchecked")
    rule = Rule(metric="ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"on {', '.join(targets)}: the median's whole interval, per target, thread count and method, "
                          f"the gate's intervals at least {CONFIDENCE:.0%} together; methods at most {min_delta:g} ms "
                          f"slower at its top pass",
                evidence=f"device/*.jsonl ({how})")
    judged: list[Row] = []
    for row in rows:
        where = f"{row.target.name}, {row.threads} thread(s){'' if row.method == 'forward' else f', {row.method}'}"
        if row.estimate is None or row.baseline_p50_ms is None:
            judged.append(("incomplete", f"{where}: {row.missing or 'not measured'}", None, row.threads))
            continue
        where += f": {row.candidate_p50_ms:.3f} ms / {row.baseline_p50_ms:.3f} ms over {row.rounds} rounds" + (
            f" ({row.disturbed} more left out, the target busy)" if row.disturbed else "")
        judged.append((row.estimate.outcome(max_ratio, row.baseline_p50_ms, min_delta), where, row.estimate,
                       row.threads))
    decided = deciding(judged)
    outcome, where, estimate, _ = decided
    where += f" ({rows[judged.index(decided)].target.described.split(': ', 1)[-1]})"  # its name is said first
    if estimate is None:
        found.missing("device-latency", severity, rule, Missing(status=GateStatus.INCOMPLETE, note=where))
        return
    if outcome == "inconclusive":
        where += (f"; the interval straddles {max_ratio:.2f}" if estimate.holds else
                  f"; only {len(estimate.per_round)} rounds: the interval covers {estimate.level:.1%}, short of the "
                  f"{estimate.confidence:.2%} it needs (run-on-device.sh --rounds)")
    levels = [e.level for _, _, e, _ in judged if e is not None]
    where += f"; the gate's {len(levels)} intervals together: at least {together(levels):.1%}" if len(levels) > 1 \
        else ""
    found.add("device-latency", severity, outcome != "failed", rule, inconclusive=outcome == "inconclusive",
              measured=Quantity(value=estimate.median, unit=Unit.RATIO, low=estimate.low, high=estimate.high,
                                level=estimate.level), note=where)


# The outcomes of a gate's rows, worst first: the worst decides the gate.
OUTCOME_ORDER = {"failed": 0, "incomplete": 1, "inconclusive": 2, "passed": 3}
# A gate's row: its outcome, where (the note), its ratio (None: not measured) and its thread count.
Row = tuple[str, str, RatioEstimate | None, int]


def deciding(judged: Iterable[Row]) -> Row:
    """The row that decides a latency gate, of its rows per thread count and method: the
    worst outcome — one interval wholly beyond the threshold fails the gate, one straddling it leaves it
    inconclusive, all within pass it — and within it the highest interval."""
    return min(judged, key=lambda j: (OUTCOME_ORDER[j[0]], -(j[2].high if j[2] else 0)))


def memory_missing(found: Gates) -> Missing | None:
    """Why one stack has no runtime memory figure: the first thread count's measurement says."""
    for name, stack in ((found.stack, found.candidate), (found.plan.baseline.name, found.baseline)):
        if stack.runtime_memory_bytes is None:
            return found.measured_missing(name, next(iter(stack.measured.values())))
    return None


def memory_gate(found: Gates, severity: str) -> None:
    """Runtime memory, candidate over baseline; passes when it needs at most ``min-delta-mb`` more."""
    gates = found.plan.settings.gates
    max_ratio, min_delta = gates["memory"].threshold, gates["memory"]["min-delta-mb"]
    rule = Rule(metric="memory ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"or at most {min_delta:g} MiB more",
                evidence=f"measurements/{found.model.name}/threads-*.json (peak RSS of load → run minus the started "
                         "runtime)")
    why = memory_missing(found)
    if why is not None:
        found.missing("memory", severity, rule, why)
        return
    mine, theirs = found.candidate.runtime_memory_bytes, found.baseline.runtime_memory_bytes
    assert mine is not None and theirs is not None
    passes, ratio = memory_rule(mine, theirs, max_ratio, min_delta)
    found.add("memory", severity, passes, rule, measured=Quantity(value=ratio, unit=Unit.RATIO),
              note=f"{size(mine)} / {size(theirs)}")


def memory_rule(mine: int, theirs: int, max_ratio: float, min_delta_mib: float) -> tuple[bool, float]:
    """The memory gate's rule, here and on a target: whether the candidate's runtime memory passes against the
    baseline's (at most ``max_ratio`` times, or at most ``min_delta_mib`` more), and the ratio."""
    ratio = mine / theirs if theirs else float("inf")
    return ratio <= max_ratio or (mine - theirs) / 2**20 <= min_delta_mib, ratio


def device_memory_gate(found: Gates, severity: str) -> None:
    """The memory gate's rule on each target timed over ssh: per target and thread count, the candidate's runtime
    memory over the baseline's, the worst row deciding; a row whose server gave no peak is incomplete."""
    rows = [row for row in found.model.device_memory if row.stack == found.stack]
    if not rows:
        return
    gates = found.plan.settings.gates
    max_ratio, min_delta = gates["memory"].threshold, gates["memory"]["min-delta-mb"]
    rule = Rule(metric="memory ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"on {', '.join(dict.fromkeys(row.target.name for row in rows))}, per thread count; or at "
                          f"most {min_delta:g} MiB more",
                evidence="device/*.jsonl (each server's peak RSS of load → run minus its started runtime, on the "
                         "target)")
    judged = []
    for row in rows:
        where = f"{row.target.name}, {row.threads} thread(s)"
        if row.candidate_bytes is None or row.baseline_bytes is None:
            found.missing("device-memory", severity, rule, Missing(
                status=GateStatus.INCOMPLETE, note=f"{where}: a server there gave no peak (it did not end cleanly)"))
            return
        passes, ratio = memory_rule(row.candidate_bytes, row.baseline_bytes, max_ratio, min_delta)
        judged.append((passes, ratio, f"{where}: {size(row.candidate_bytes)} / {size(row.baseline_bytes)}"))
    passes, ratio, note = min(judged, key=lambda j: (j[0], -j[1]))
    found.add("device-memory", severity, passes, rule, measured=Quantity(value=ratio, unit=Unit.RATIO), note=note)


def device_budget_gates(found: Gates, latency_ms: float | None, memory_mib: float | None, severity: str) -> None:
    """The team's budgets for the model on each target it was timed on (docs/report.md): the target furthest over its
    budget decides; one that gave no figure leaves the gate incomplete."""
    threads = found.plan.settings.threads[0]
    if latency_ms is not None:
        rows = [row for row in found.model.device_latency if row.stack == found.stack and row.threads == threads]
        rule = Rule(metric="p50", op="≤", threshold=Quantity(value=latency_ms, unit=Unit.MS),
                    condition=f"on each target, every method summed, at {threads} thread(s)",
                    evidence="device/*.jsonl")
        by_target: dict[str, list[float | None]] = {}
        for row in rows:
            by_target.setdefault(row.target.name, []).append(row.candidate_p50_ms if not row.missing else None)
        _budget_on_targets(found, "device-budget-latency", severity, rule, latency_ms, Unit.MS, {
            target: (None if None in p50s else sum(p50 for p50 in p50s if p50 is not None))
            for target, p50s in by_target.items()})
    if memory_mib is not None:
        used: dict[str, float | None] = {}
        for held in found.model.device_memory:
            if held.stack == found.stack:
                mib = None if held.candidate_bytes is None else held.candidate_bytes / 2**20
                before = used.get(held.target.name, 0.0)
                used[held.target.name] = None if mib is None or before is None else max(before, mib)
        rule = Rule(metric="runtime memory", op="≤", threshold=Quantity(value=memory_mib, unit=Unit.MIB),
                    condition="on each target, at every thread count",
                    evidence="device/*.jsonl (each server's peak RSS of load → run minus its started runtime)")
        _budget_on_targets(found, "device-budget-memory", severity, rule, memory_mib, Unit.MIB, used)


def _budget_on_targets(found: Gates, gate: str, severity: str, rule: Rule, budget: float, unit: Unit,
                       figures: dict[str, float | None]) -> None:
    if not figures:
        return
    unread = [target for target, value in figures.items() if value is None]
    if unread:
        found.missing(gate, severity, rule, Missing(status=GateStatus.INCOMPLETE,
                                                    note=f"{unread[0]}: no figure (its device gates say why)"))
        return
    target, value = max(((t, v) for t, v in figures.items() if v is not None), key=lambda item: item[1])
    found.add(gate, severity, value <= budget, rule, measured=Quantity(value=value, unit=unit), note=f"on {target}")


def budget_gates(found: Gates, latency_ms: float | None, memory_mib: float | None, severity: str) -> None:
    """The candidate alone against the team's budgets for the model."""
    name, threads = found.model.name, found.plan.settings.threads[0]
    first = found.candidate.measured[threads]
    if latency_ms is not None:
        rule = Rule(metric="p50", op="≤", threshold=Quantity(value=latency_ms, unit=Unit.MS),
                    condition=f"every method summed, at {threads} thread(s)",
                    evidence=f"measurements/{name}/threads-{threads}.json")
        p50 = first.p50_sum_ms
        if p50 is None:
            found.missing("budget-latency", severity, rule, found.measured_missing(found.stack, first))
        else:
            found.add("budget-latency", severity, p50 <= latency_ms, rule, measured=Quantity(value=p50, unit=Unit.MS))
    if memory_mib is not None:
        rule = Rule(metric="runtime memory", op="≤", threshold=Quantity(value=memory_mib, unit=Unit.MIB),
                    evidence=f"measurements/{name}/threads-*.json (peak RSS of load → run minus the started runtime)")
        used = found.candidate.runtime_memory_bytes
        if used is None:
            found.missing("budget-memory", severity, rule, found.measured_missing(found.stack, first))
        else:
            found.add("budget-memory", severity, used / 2**20 <= memory_mib, rule,
                      measured=Quantity(value=used / 2**20, unit=Unit.MIB))
