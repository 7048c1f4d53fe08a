"""Which remedy options the diagnose phase lowers and which one it prints (diagnose_phase.py ``remedy``),
from the rows it has tried: each that passes against eager was timed against the shipped artifact, in turns."""

from __future__ import annotations

import math
import statistics
from typing import Any

# A later option is lowered past one that passes only when that one is slower than the latency gate with this
# confidence: its rounds' ratios, a sign test against the gate's ratio (one noisy median must not cost a lowering).
CLEARLY_SLOWER_CONFIDENCE = 0.95
# One is said to be within the latency gate as the gate says a ratio passes: its 95% interval of the rounds' median
# ratio wholly at or under the gate's ratio (upgrade_gate.stats.median_interval_rank's order statistics), which a
# remedy whose true ratio is the gate's shows at most 2.5% of the time (the interval's miss on that side).
WITHIN_CONFIDENCE = 0.95


def round_ratios(tried: dict[str, Any]) -> list[float]:
    """Each round's remedied over shipped median call, as timed in turns."""
    rounds = (tried.get("latency") or {}).get("rounds") or []
    return [statistics.median(r["remedied"]) / statistics.median(r["shipped"]) for r in rounds
            if r.get("remedied") and r.get("shipped")]


def slowdown(tried: dict[str, Any]) -> float | None:
    """A remedy's cost in the worker's own terms: the median over rounds of each round's remedied over shipped
    median call (the parent judges the chosen one's interval as the stack is)."""
    ratios = round_ratios(tried)
    return statistics.median(ratios) if ratios else None


def _as_few_by_chance(few: int, rounds: int) -> float:
    """The sign test's chance: that of ``rounds`` fair coins at most ``few`` land on one side."""
    return sum(math.comb(rounds, k) for k in range(few + 1)) / 2**rounds


def clearly_slower(ratios: list[float], max_ratio: float) -> bool:
    """The sign test: so few rounds at or under ``max_ratio`` that, were the median ratio there or under, as few
    would come with a probability of at most 1 − CLEARLY_SLOWER_CONFIDENCE."""
    under = sum(ratio <= max_ratio for ratio in ratios)
    return bool(ratios) and _as_few_by_chance(under, len(ratios)) <= 1 - CLEARLY_SLOWER_CONFIDENCE


def clearly_within(ratios: list[float], max_ratio: float) -> bool:
    """The latency gate's pass: the WITHIN_CONFIDENCE interval of the median ratio, [x(k), x(n−k+1)], at or under
    ``max_ratio`` — so few rounds over it (fewer than k) that, were the median ratio over it, as few would come with
    a probability of at most half of 1 − WITHIN_CONFIDENCE. (Of 6 rounds none may be over, of 9 one, of 15 three;
    with fewer than 6 it is never said.)"""
    over = sum(ratio > max_ratio for ratio in ratios)
    return bool(ratios) and _as_few_by_chance(over, len(ratios)) <= (1 - WITHIN_CONFIDENCE) / 2


def why_not_tried(tried: list[dict[str, Any]], fallback: bool, max_slowdown: float | None) -> str:
    """Why the next remedy option is not lowered (empty: it is). Options come expected cheapest first, the later
    keeping more out of the delegate: after one that passes and is not clearly slower than the latency gate's
    ``max-ratio`` of the shipped artifact, each would cost a whole lowering (minutes for an LLM) to lift no
    condition. A fallback (every call of the kind kept out) is tried only where none before it passes."""
    for earlier in tried:
        ratios = round_ratios(earlier)
        if not earlier["passes"] or not ratios or max_slowdown is None:
            continue
        ratio = statistics.median(ratios)  # slowdown(earlier), from the ratios at hand
        said = f"\"{earlier['remedy']}\" passes at ×{ratio:.3f} the shipped artifact's latency"
        if clearly_within(ratios, max_slowdown):  # not its median alone: that is under the gate half the time there
            return f"{said}, within the latency gate's ×{max_slowdown:g}"
        if not clearly_slower(ratios, max_slowdown):
            under = sum(r <= max_slowdown for r in ratios)
            return (f"{said}, not clearly slower than the latency gate's ×{max_slowdown:g} ({under} of its "
                    f"{len(ratios)} rounds at or under it)")
    if fallback and any(t["passes"] for t in tried):
        return "tried only where no option before it passes"
    return ""


def cheapest(tried: list[dict[str, Any]]) -> dict[str, Any]:
    """The remedy to print: of those that pass, the least slowdown (options come cheapest-expected first, so
    the first where none is timed); where none passes, the one closest to eager, else the last."""
    def cost(remedy: dict[str, Any]) -> tuple[bool, float]:
        ratio = slowdown(remedy)
        return ratio is None, ratio or 0.0

    passing = [t for t in tried if t["passes"]]
    ran = [t for t in tried if "rel_l2" in t]
    best: dict[str, Any] = (min(passing, key=cost) if passing else min(ran, key=lambda t: t["rel_l2"]) if ran
                            else tried[-1])
    return dict(best)  # a copy: the caller takes its outputs out
