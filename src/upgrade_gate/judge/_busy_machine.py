"""A machine too busy to time on: the note of a latency gate it left incomplete, what every round tried says all
together, and the one line under the verdict for every such gate (policy)."""

from __future__ import annotations

from upgrade_gate.schema.measured import BusyRounds
from upgrade_gate.schema.measurement import Contention
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import GateResult, GateStatus
from upgrade_gate.stats import fewest_rounds


def busy_note(threads: int, machine: Contention) -> str:
    """A latency gate incomplete for a busy machine: short, as every busy model's gate says it; the figures
    are said once, under the verdict (machine_busy_line), and in the model's latency section."""
    return (f"{threads} thread(s): machine busy: {machine.quiet} of {len(machine.rounds)} rounds quiet; an interval "
            f"needs {machine.needs} quiet rounds")


def over_in_every_round(every: list[BusyRounds], threshold: float) -> str:
    """What a busy thread count's rounds say together where they say one thing: every round, disturbed or not, over the
    threshold, per method ("" where none is). Not a judgement (a disturbed round may have slowed either stack), but a
    2× regression a busy machine could not time is not 'nothing to see' (issue 37: levit_128s at 1.84×–2.35×)."""
    said = [f"{'' if rounds.method == 'forward' else rounds.method + ' '}{min(rounds.per_round):.2f}×–"
            f"{max(rounds.per_round):.2f}× in every one of its {len(rounds.per_round)} rounds, disturbed or not"
            for rounds in every if len(rounds.per_round) >= fewest_rounds() and min(rounds.per_round) > threshold]
    return f"over {threshold:.2f}: {'; '.join(said)}" if said else ""


# A host's steal worth naming in the busy line: a tenth of what disturbs a round (measure/_contention.py's 5%).
STEAL_SAID = 0.005


def machine_busy_line(models: list[ModelResults], gates: list[GateResult]) -> tuple[str | None, list[GateResult]]:
    """One line for every latency gate a busy machine left incomplete — the models and thread counts, and how
    busy — and those gates (issue 26: a paragraph per model filled the report's first screen)."""
    by_name = {model.name: model for model in models}
    affected: list[GateResult] = []
    for gate in gates:
        model = by_name.get(gate.model)
        if gate.gate != "latency" or gate.status is not GateStatus.INCOMPLETE or model is None:
            continue
        if any(gate.note.startswith(busy_note(threads, machine)) for threads, machine in model.contention.items()):
            affected.append(gate)
    if not affected:
        return None, []
    where, machines = [], []
    for name in dict.fromkeys(gate.model for gate in affected):
        busy = [(threads, machine) for threads, machine in sorted(by_name[name].contention.items()) if machine.busy]
        machines += [machine for _, machine in busy]
        gates_here = [gate for gate in affected if gate.model == name and gate.threshold is not None]

        def over(threads: int, gates: list[GateResult] = gates_here, model: ModelResults = by_name[name]) -> str:
            said = [(gate.stack, over_in_every_round(model.every_round(gate.stack, threads), gate.threshold.value))
                    for gate in gates if gate.threshold is not None]
            return "".join(f"; {stack + ': ' if len(gates) > 1 else ''}{figures}" for stack, figures in said if figures)

        where.append(f"{name} at " + ", ".join(f"{threads} thread(s) ({machine.quiet} of {len(machine.rounds)} quiet"
                                               f"{over(threads)})" for threads, machine in busy))
    figures = []
    others = [m.typical_others for m in machines if m.typical_others is not None]
    if others:
        cores = max((m.cores for m in machines if m.cores), default=None)
        figures.append(f"other processes kept up to {max(others):.2f}" + (f" of {cores}" if cores else "")
                       + " cores busy")
    waits = [m.typical_wait for m in machines if m.typical_wait is not None]
    if waits:
        figures.append(f"the timed threads waited up to {max(waits):.1%} of their time for a CPU")
    steals = [m.typical_steal for m in machines if m.typical_steal]
    if steals and max(steals) >= STEAL_SAID:
        figures.append(f"the virtual machine's host took up to {max(steals):.1%} of its CPU time (steal)")
    queues = [m.peak_run_queue for m in machines if m.peak_run_queue is not None]
    if queues:
        figures.append(f"the run queue reached {max(queues)}")
    needs = sorted({m.needs for m in machines}) or [fewest_rounds()]  # by the number of intervals each gate judges
    line = (f"machine busy: too few quiet rounds to judge latency (an interval needs "
            f"{needs[0] if len(needs) == 1 else f'{needs[0]}–{needs[-1]}'}) for "
            + "; ".join(where) + (f" — {', '.join(figures)}" if figures else "")
            + ". Measure again when the machine is quieter: `--remeasure` times again without exporting")
    return line, affected
