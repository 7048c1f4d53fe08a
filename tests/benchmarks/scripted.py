"""Measurement servers played in-process, for the measure session's own loop (round_loop.run_rounds).

The rounds of a finished run played again (``nox -s benchmark -- stop-early``, ``-- most-rounds``), or rounds whose true
ratio is known (``coverage`` and ``gate``, tests/test_rounds.py): what they drive is the loop, the
order, the repeats, the stop rule and the gate's rule that run on a real machine; only the timing and
the machine's load are scripted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from upgrade_gate import stats
from upgrade_gate.judge._latency_gates import deciding
from upgrade_gate.measure import _contention, round_loop
from upgrade_gate.run.measure_server import ServerFailed
from upgrade_gate.schema.measured import RatioEstimate, RoundsEnded
from upgrade_gate.schema.measurement import RoundsDesign

Samples = dict[str, list[float]]  # one round's samples per method, in ms

# What a scripted machine did around a stack's part of a round: others kept both cores busy and the timed
# threads waited (disturbed, by _contention's rule), or nothing else ran.
BUSY = _contention.Load(seconds=0.25, waited_share=0.3, others_cores=2.0, steal_share=0.0, run_queue=4,
                        free_cores=1.0)
QUIET = _contention.Load(seconds=0.25, waited_share=0.0, others_cores=0.0, steal_share=0.0, run_queue=1,
                         free_cores=1.0)


@dataclass(frozen=True)
class _Process:
    pid: int


class ScriptedServer:
    """A measurement server whose answer to round ``n`` (as tried, from 1) is ``script(n)``: its samples per
    method, or None when it has none left — it then ends as a server that failed does."""

    def __init__(self, script: Callable[[int], Samples | None], pid: int) -> None:
        self.process = _Process(pid)
        self.script = script
        self.asked: list[int] = []  # the rounds it timed, in order

    def request(self, command: dict[str, Any] | None, until: str) -> dict[str, Any]:
        number = int((command or {})["round"])
        samples = self.script(number)
        if samples is None:
            raise ServerFailed("failed", until, f"no samples scripted for round {number}")
        self.asked.append(number)
        return {"event": "round", "round": number, "samples_ms": samples}

    def stop(self) -> None:
        pass


def scripted_watch(disturbed: Callable[[int], bool]) -> round_loop.Watch:
    """A machine that disturbs every stack's part of round ``n`` (as tried, from 1) where ``disturbed(n)``."""
    parts: dict[int, int] = {}  # per timed server: the parts watched so far

    def watch(ours: list[int], timed: int) -> Callable[[], _contention.Load | None]:
        parts[timed] = parts.get(timed, 0) + 1
        load = BUSY if disturbed(parts[timed]) else QUIET
        return lambda: load

    return watch


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One thread count measured by run_rounds: its rounds, why they ended, every ratio with its outcome."""

    tried: list[dict[str, Any]]
    ended: RoundsEnded
    outcomes: list[tuple[str, RatioEstimate]]  # per method, the gate's outcome of its ratio


def measure(per_round: Sequence[Sequence[float]], *, threshold: float, planned: int, stop_early: bool,
            intervals: int, disturbed: Callable[[int], bool] = lambda n: False, most: int = 0) -> Measurement:
    """A baseline whose every call takes 1 ms and a candidate whose method m takes ``per_round[m][i]`` ms in
    the i-th quiet round, measured as the measure session measures them (``run_rounds`` with its stop rule,
    ``clear_of_threshold``, ``planned`` rounds, going on up to ``most`` while an interval straddles where looks
    past them fit (``RoundsDesign.of``, as the session has it); the machine disturbs round n, as tried, where
    ``disturbed(n)``), then judged as the latency gate judges each method (its ratio as gather makes it, of
    the quiet rounds; ``RatioEstimate.outcome`` against ``threshold``), each interval at its share of a gate
    of ``intervals``."""
    methods = [f"m{index}" for index in range(len(per_round))]

    def baseline(number: int) -> Samples:
        return {method: [1.0] for method in methods}

    def candidate(number: int) -> Samples | None:
        place = sum(not disturbed(n) for n in range(1, number))  # the quiet rounds before this one
        if place >= len(per_round[0]):
            return None
        return {method: [per_round[m][place]] for m, method in enumerate(methods)}

    servers = {"baseline": ScriptedServer(baseline, pid=1), "candidate": ScriptedServer(candidate, pid=2)}
    design = RoundsDesign.of(planned=planned, most_rounds=most, stop_early=stop_early, intervals=intervals)
    return _played(servers, "baseline", ["candidate"], "candidate", threshold=threshold, min_delta_ms=0.0,
                   design=design, threads=1, watch=scripted_watch(disturbed))


def gate(measurements: Sequence[Measurement]) -> str:
    """The latency gate's outcome over its thread counts' measurements, by its own rule (``deciding``)."""
    rows = [(outcome, "", estimate, threads) for threads, measured in enumerate(measurements, start=1)
            for outcome, estimate in measured.outcomes]
    return deciding(rows)[0] if rows else "incomplete"


def replay(data: dict[str, Any], *, baseline: str, candidates: Sequence[str], candidate: str, threshold: float,
           min_delta_ms: float, confidence: float, planned: int, most: int) -> Measurement:
    """A finished measurement's recorded rounds (a measurement file's ``data``) played again through the measure
    session's loop with stop-early where they make a ratio to decide (round_loop.ratio_to_decide): ``planned`` rounds,
    going on up to ``most`` while an interval straddles (``planned``: never past them), every round disturbed as
    it was; then ``candidate``'s ratios judged as the gate judges them. A stack whose recorded rounds run out ends
    as a server that failed does."""
    recorded = {name: {entry["round"]: entry["samples_ms"] for entry in stack.get("rounds") or ()}
                for name, stack in data["stacks"].items() if stack.get("status") == "ok"}
    servers = {name: ScriptedServer(mine.get, pid=index) for index, (name, mine) in enumerate(recorded.items(), start=1)}
    disturbed = {entry["round"] for entry in data.get("rounds") or () if entry["disturbed"]}
    # The intervals whose share ``confidence`` is (stats.interval_confidence): the benchmark passes the share.
    intervals = round((1 - stats.CONFIDENCE) / (1 - confidence))
    design = RoundsDesign.of(planned=planned, most_rounds=most, stop_early=True, intervals=intervals)
    return _played(servers, baseline, candidates, candidate, threshold=threshold, min_delta_ms=min_delta_ms,
                   design=design, threads=int(data["threads"]), watch=scripted_watch(disturbed.__contains__))


def _played(servers: dict[str, ScriptedServer], baseline: str, candidates: Sequence[str], candidate: str, *,
            threshold: float, min_delta_ms: float, design: RoundsDesign, threads: int,
            watch: round_loop.Watch) -> Measurement:
    """``servers`` measured as the measure session measures them (``run_rounds`` ended by ``round_loop.stop_rule``),
    then ``candidate``'s ratios of the quiet rounds judged as the latency gate judges each method
    (``RatioEstimate.outcome``), the sequential design's where the rounds could stop early."""
    stacks: dict[str, dict[str, Any]] = {name: {"status": "ok", "rounds": []} for name in servers}
    design, clear = round_loop.stop_rule(baseline, candidates, stacks, servers, design=design, threshold=threshold,
                                         min_delta_ms=min_delta_ms)
    tried, ended = round_loop.run_rounds(dict(servers), stacks, design, threads, clear=clear, watch=watch,
                                         baseline=baseline)
    quiet = {entry["round"] for entry in tried if not entry["disturbed"]}
    found = (round_loop.ratios_so_far(baseline, [candidate], stacks, quiet, design) or {}).get(candidate, [])
    return Measurement(tried=tried, ended=ended,
                       outcomes=[(estimate.outcome(threshold, baseline_ms, min_delta_ms), estimate)
                                 for estimate, baseline_ms in found])
