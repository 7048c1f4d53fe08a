"""The rounds of a measurement and the rule that ends them.

The stacks take turns within each round, the order reversed every other counted round (A B, B A, …): in each
round every side times each method, and a round's medians saw the same machine, so their ratio is the round's
candidate/baseline ratio (schema.measured.ratio_by_rounds; its interval, upgrade_gate.stats). Around each side's
part the rest of the machine's load is measured (upgrade_gate.measure._contention); a round it disturbed is
repeated in the same order, and does not count. The rounds follow one ``RoundsDesign`` (schema.measurement): with
stop-early they stop at a look of its sequential design once every candidate's latency gate is decided
(``clear_of_threshold``), and go on past the planned rounds, up to its most, while an interval still straddles.
Why they ended is the file's ``ended`` (schema.measured.RoundsEnded).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import numpy as np

from upgrade_gate import stats
from upgrade_gate.config.plan import Plan
from upgrade_gate.measure import _contention
from upgrade_gate.run import measure_server
from upgrade_gate.schema.measured import RatioEstimate, RoundsEnded
from upgrade_gate.schema.measurement import RoundsDesign

# The cores a measurement shares with the rest of the machine.
CORES = os.cpu_count() or 1
# Rounds tried at most, as a multiple of the rounds wanted: a busy machine gets a second chance, not an endless one.
REPEAT_BUDGET = 2


class _Process(Protocol):
    @property
    def pid(self) -> int: ...


class RoundServer(Protocol):
    """What the rounds ask of a measurement server: measure_server.Server, or an in-process stand-in
    (tests/benchmarks/scripted.py: the benchmarks' and tests' rounds of known ratios, a run's rounds replayed)."""

    @property
    def process(self) -> _Process: ...

    def request(self, command: dict[str, Any] | None, until: str) -> dict[str, Any]: ...

    def stop(self) -> None: ...


AnyServer = TypeVar("AnyServer", bound=RoundServer)
# Watches the machine around one stack's part of a round: (every server's pid, the timed one's) → the end of the
# watch, which gives the part's load (_contention.watch; a stand-in's in tests/benchmarks/scripted.py).
Watch = Callable[[list[int], int], Callable[[], _contention.Load | None]]


def run_rounds(servers: dict[str, AnyServer], stacks: dict[str, dict[str, Any]], design: RoundsDesign, threads: int,
               on_round: Callable[[str], Any] | None = None, clear: Callable[[set[int]], bool] | None = None, *,
               watch: Watch | None = None, baseline: str | None = None) -> tuple[list[dict[str, Any]], RoundsEnded]:
    """The ``design``'s planned quiet rounds, the stacks in turn — A B, then B A, so that whatever running
    first or second does to a stack (a warm cache, a clock still ramping, the other's
    leftovers) falls on both alike. A round the rest of the machine disturbed (``watch``:
    upgrade_gate.measure._contention by default) is repeated in the same order, up to as many
    rounds again as planned, so the rounds that count alternate whatever the machine did: an
    order effect that came with the disturbances would otherwise tip them to one side. Its
    samples are kept in the record but its ratio is not used. Each stack's samples of a round are its
    ``rounds`` entry (``stats.kept_samples``, with the calls they stand for); the round's order and load
    are the measurement's. With ``clear`` (stop-early), after a quiet round that is one of the design's looks
    the rounds stop when ``clear(quiet rounds)`` says every ratio is decided; they go on past the planned
    ones, up to the design's most, while it does not (``stop_rule``).

    A side whose server ends (it failed, was killed: its record says how) ends alone, named in the round's
    ``servers_ended``: while the ``baseline``'s server and another side's run, the others go on to their
    decision (issue 61: a remedied side's server that ended had ended every side's rounds, and the candidate's
    own gate read "machine busy"). Once the baseline's ends, or no other is left — or with no ``baseline``
    given — the rounds end: ``RoundsEnded.SERVER_ENDED``. Returns every round tried and why the rounds ended."""
    watch = watch or functools.partial(_contention.watch, threads=threads, cores=CORES)
    names = list(servers)
    counted: set[int] = set()
    tried: list[dict[str, Any]] = []
    wanted, at_most, looks = design.planned, design.at_most, design.looks
    while servers:
        if len(counted) == at_most:
            return tried, RoundsEnded.PLANNED
        if len(tried) >= REPEAT_BUDGET * max(wanted, len(counted) + 1):  # a round past the planned ones adds its share
            return tried, RoundsEnded.REPEATS_RAN_OUT
        number, place = len(tried) + 1, len(counted) + 1
        if on_round is not None:  # "n/wanted" up to the planned rounds, then how far it may go; a repeat says so
            repeat = bool(tried) and tried[-1]["round"] not in counted
            of = f"/{wanted}" if place <= wanted else f" of up to {at_most} (an interval still straddles)"
            on_round(f"{'repeating busy round' if repeat else 'round'} {place}{of}")
        order = [n for n in (names if place % 2 else names[::-1]) if n in servers]
        loads, cut, ended = _round_parts(servers, stacks, order, number, watch)
        disturbed = bool(cut) or any(load is not None and load.disturbed for load in loads.values())
        if not disturbed and loads:  # every side still timed gave its part (one that ended gave none)
            counted.add(number)
        tried.append({"round": number, "order": order, "disturbed": disturbed,
                      "load": {name: load.to_dict() if load else None for name, load in loads.items()},
                      **({"cut": cut} if cut else {}), **({"servers_ended": ended} if ended else {})})
        if len(servers) < len(names) and not (baseline in servers and len(servers) > 1):
            break  # the baseline's server ended, or every other's: no more ratios to be had; what finished is kept
        if (clear is not None and number in counted and len(counted) < at_most and len(counted) in looks
                and clear(counted)):
            return tried, RoundsEnded.DECIDED
    return tried, RoundsEnded.SERVER_ENDED


def _round_parts(servers: dict[str, AnyServer], stacks: dict[str, dict[str, Any]], order: list[str], number: int,
                 watch: Watch) -> tuple[dict[str, _contention.Load | None], dict[str, float], list[str]]:
    """Each side's part of round ``number``, in ``order``, its samples into its record: the parts' loads, the sides
    whose server cut its part short (and after how many seconds: part_limit_s), and those whose server ended, each
    left out of ``servers`` from then on with its record saying how it ended."""
    loads: dict[str, _contention.Load | None] = {}
    cut: dict[str, float] = {}
    ended: list[str] = []
    for name in order:
        watched = watch([server.process.pid for server in servers.values()], servers[name].process.pid)
        try:
            event = servers[name].request({"command": "round", "round": number}, "round")
        except measure_server.ServerFailed as failure:
            stacks[name].update(failed_record(failure))
            servers.pop(name).stop()
            ended.append(name)
            continue
        loads[name] = watched()
        samples: dict[str, list[float]] = event["samples_ms"]
        stacks[name]["rounds"].append({"round": number,
                                       "samples_ms": {m: stats.kept_samples(v) for m, v in samples.items()},
                                       "calls": {m: len(v) for m, v in samples.items()}})
        if "cut_after_s" in event:
            cut[name] = round(float(event["cut_after_s"]), 3)
    return loads, cut, ended


def ratio_to_decide(baseline: str, candidates: Collection[str], timed: Collection[str]) -> bool:
    """Whether the stacks ``timed`` make a ratio a latency gate decides: the baseline's and a candidate's (or a
    remedied side's). Where they do not (a variant only one stack has, a stack whose artifact did not load),
    stop-early has nothing to decide and the rounds are the planned ones: no stop at a look, none past them."""
    return baseline in timed and any(name in timed for name in candidates)


def stop_rule(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], timed: Collection[str],
              *, design: RoundsDesign, threshold: float,
              min_delta_ms: float) -> tuple[RoundsDesign, Callable[[set[int]], bool] | None]:
    """How the rounds of the stacks ``timed`` end: the ``design`` they run with, and at its looks the latency
    gate's rule over every candidate's ratios so far (``clear_of_threshold``, reading ``stacks`` as the rounds
    fill it). Where the stacks make no ratio to decide (``ratio_to_decide``), the planned rounds, no look and no
    rule: none past them. The measure session's, a target's (measure/target_rounds.py) and the benchmarks'
    (scripted.py)."""
    if not (design.stop_early and ratio_to_decide(baseline, candidates, timed)):
        return replace(design, most=design.planned), None
    return design, functools.partial(clear_of_threshold, baseline, candidates, stacks, design=design,
                                     threshold=threshold, min_delta_ms=min_delta_ms)


def play_rounds(plan: Plan, threads: int, servers: dict[str, AnyServer], stacks: dict[str, dict[str, Any]],
                remedied_sides: Sequence[str], design: RoundsDesign, *, log: Callable[[str], Any],
                on_round: Callable[[str], Any] | None = None,
                watch: Watch | None = None) -> tuple[list[dict[str, Any]], RoundsEnded, RoundsDesign]:
    """The measure session's rounds of the loaded ``servers`` (``run_rounds``) as ``design`` plans them, ended by the
    stop rule (``stop_rule``) over every candidate's ratios and its remedied side's (their latency gate is judged as
    the stack's is, so the rounds go on until they are decided too): every round tried, why they ended, the design
    they ran with. A side whose server ends ends alone; the others go on to their decision."""
    gate = plan.settings.gates["latency"]
    design, clear = stop_rule(plan.baseline.name, [spec.name for spec in plan.candidates] + list(remedied_sides),
                              stacks, servers, design=design, threshold=gate.threshold,
                              min_delta_ms=gate["min-delta-ms"])
    log(f"{'up to ' if clear else ''}{design.planned} rounds"
        f"{f' (up to {design.most} while an interval straddles)' if design.most > design.planned else ''} of "
        f"{', '.join(servers) or 'no stack'}")
    tried, ended = run_rounds(servers, stacks, design, threads, on_round, clear, watch=watch,
                              baseline=plan.baseline.name)
    return tried, ended, design


def ratios_so_far(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], quiet: set[int],
                  design: RoundsDesign) -> dict[str, list[tuple[RatioEstimate, float]]] | None:
    """Each candidate's ratios to the baseline, per method, over the ``quiet`` rounds (``design.ratio``), each with
    the baseline's median in ms; None without a baseline and a candidate, or where a ratio cannot be made."""
    theirs = _samples_by_method(stacks.get(baseline) or {}, quiet)
    # A candidate not measured, or whose server ended (its record says why), has no ratio, and does not make the
    # gate decided: the others' rounds go on to their own decision.
    measured = {name: samples for name in candidates if name in stacks and stacks[name].get("status") == "ok"
                and (samples := _samples_by_method(stacks[name], quiet))}
    if not theirs or not measured:
        return None
    found: dict[str, list[tuple[RatioEstimate, float]]] = {}
    for name, mine in measured.items():
        for method, rounds in mine.items():
            if method not in theirs or len(theirs[method]) != len(rounds):
                return None
            estimate = design.ratio(rounds, theirs[method])
            if estimate is None:
                return None
            found.setdefault(name, []).append(
                (estimate, float(np.median([v for samples in theirs[method] for v in samples]))))
    return found


def clear_of_threshold(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], quiet: set[int],
                       *, design: RoundsDesign, threshold: float, min_delta_ms: float) -> bool:
    """Whether every candidate's latency gate is decided by its ratios to the baseline (``ratios_so_far``) as the
    gate decides each (RatioEstimate.outcome: its interval wholly within or wholly beyond the threshold, or its
    top at most ``min_delta_ms`` slower): one of them wholly beyond (the gate fails whatever its other methods
    say: going on could only widen that interval back over the threshold), or every one decided. False without
    a baseline and a candidate."""
    found = ratios_so_far(baseline, candidates, stacks, quiet, design)
    if found is None:
        return False
    for pairs in found.values():
        outcomes = {estimate.outcome(threshold, baseline_ms, min_delta_ms) for estimate, baseline_ms in pairs}
        if "failed" not in outcomes and "inconclusive" in outcomes:
            return False
    return True


def _samples_by_method(record: dict[str, Any], quiet: set[int]) -> dict[str, list[list[float]]]:
    """A stack's samples of the ``quiet`` rounds, per method, in round order."""
    found: dict[str, list[list[float]]] = {}
    for entry in record.get("rounds", []):
        if entry["round"] in quiet:
            for method, samples in entry["samples_ms"].items():
                found.setdefault(method, []).append(samples)
    return found


def failed_record(failure: measure_server.ServerFailed) -> dict[str, Any]:
    """A side's record of how its server ended."""
    return {"status": failure.status, "error": {"stage": failure.stage, "message": failure.message,
                                                "traceback_tail": failure.traceback_tail}}
