"""Every sign sequence of a latency gate's rounds, counted here (not by upgrade_gate.stats) and driven through the
code that runs: with every true ratio at the threshold, a round's ratio falls under it as a fair coin, and an
interval [x(k), x(n−k+1)] of the first n rounds is wholly above the threshold when fewer than k rounds fell under,
wholly under when fewer than k fell over. So a design's exact figures are sums over sign sequences, and a simulation
of the gate can be made exact by playing it one sequence of each kind, weighted by how many sequences are of it.
A kind is an interval's states at the design's looks, where the code decides (tests/test_rounds.py holds it to
that: its rounds stop at the first look that decides, not between looks); tests/test_rounds.py also plays every
one of the 512 sequences of 9 rounds, no kind assumed."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from benchmarks import scripted

THRESHOLD = 1.05


def below_at_every_look(looks: dict[int, int]) -> np.ndarray:
    """Every sign sequence of ``max(looks)`` rounds (rows), each round 1 when its ratio falls under the threshold."""
    length = max(looks)
    return (np.arange(2**length)[:, None] >> np.arange(length)) & 1


def miss_over_every_sign_sequence(looks: dict[int, int]) -> float:
    """The share of sign sequences in which some look's interval — ``{n: k}``: [x(k), x(n−k+1)] of the first n
    rounds — misses the true median (fewer than k rounds on one side of it): the design's exact miss."""
    below = below_at_every_look(looks)
    counts = np.cumsum(below, axis=1)
    missed = np.zeros(len(below), dtype=bool)
    for n, k in looks.items():
        missed |= (counts[:, n - 1] < k) | (n - counts[:, n - 1] < k)
    return float(missed.mean())


def interval_paths(looks: dict[int, int]) -> dict[tuple[str, ...], tuple[float, list[float]]]:
    """One interval's states at each look ("failed": wholly above the threshold, "passed": wholly under, else
    "inconclusive"), up to the first failed one (the rounds stop there: one interval wholly above decides the gate),
    each with the share of sign sequences that have it and the ratios of one of them (distinct values, 1–2% from
    the threshold). Of a path cut at a failed look, the sequence played has the most rounds under the threshold
    after it: were the rounds to go on, that interval would soonest straddle again, and the gate say otherwise."""
    below = below_at_every_look(looks)
    counts = np.cumsum(below, axis=1)
    # Per sequence and look: 0 failed, 1 passed, 2 inconclusive.
    states = np.stack([np.where(counts[:, n - 1] < k, 0, np.where(n - counts[:, n - 1] < k, 1, 2))
                       for n, k in looks.items()], axis=1)
    names, at = ("failed", "passed", "inconclusive"), list(looks)
    shares: dict[tuple[str, ...], float] = {}
    played: dict[tuple[str, ...], tuple[int, list[int]]] = {}  # the rounds under after the failed look, the signs
    for row, low in zip(states.tolist(), below.tolist(), strict=True):
        cut = row.index(0) + 1 if 0 in row else len(row)
        path = tuple(names[state] for state in row[:cut])
        shares[path] = shares.get(path, 0.0) + 0.5 ** len(low)
        after = sum(low[at[cut - 1]:])
        if path not in played or after > played[path][0]:
            played[path] = (after, low)
    return {path: (share, [THRESHOLD * (1 - 0.01 - i / 1000 if under else 1 + 0.01 + i / 1000)
                           for i, under in enumerate(played[path][1])]) for path, share in shares.items()}


def gate_errors_through_the_code(threads: int, methods: int, looks: dict[int, int], *, planned: int, stop_early: bool,
                                 intervals: int, most: int = 0) -> tuple[float, float]:
    """How often a gate of ``threads`` × ``methods`` intervals, every true ratio at the threshold, fails wrongly and
    calls any interval clear, as the code that runs decides it: every thread count's measurement played through the
    rounds' loop and stop rule (scripted.measure, the design ``looks`` the code draws for these settings), each
    method one interval's kind of sign sequence (``interval_paths``), every combination weighted by its share; the
    measurements' outcomes combined by the gate's own rule (scripted.gate), every combination of thread counts."""
    paths = list(interval_paths(looks).values())
    by_outcomes: dict[tuple[str, ...], tuple[float, scripted.Measurement]] = {}
    for combination in itertools.product(paths, repeat=methods):
        share = float(np.prod([p for p, _ in combination]))
        measured = scripted.measure([ratios for _, ratios in combination], threshold=THRESHOLD, planned=planned,
                                    stop_early=stop_early, intervals=intervals, most=most)
        outcomes = tuple(outcome for outcome, _ in measured.outcomes)
        before = by_outcomes.get(outcomes, (0.0, measured))
        by_outcomes[outcomes] = (before[0] + share, before[1])
    failed = clear = 0.0
    for chosen in itertools.product(by_outcomes.values(), repeat=threads):
        share = float(np.prod([p for p, _ in chosen]))
        measurements: Sequence[scripted.Measurement] = [m for _, m in chosen]
        failed += share * (scripted.gate(measurements) == "failed")
        clear += share * any(o != "inconclusive" for m in measurements for o, _ in m.outcomes)
    return failed, clear
