"""Which layers of a quantized variant to keep in float, so that it meets its quantized-numerics gate
(Polygraphy's ``debug precision``, for a stack's own quantization recipe).

A variant's artifact is further from the float model than the gate allows. The recipe is run again in
eager mode with some layers left in float (the adapter says which layers it quantizes and how to leave
some out), and each quantized module is compared with the float model on the same real inputs:

1. Every layer quantized, then every layer in float: the first must fail (else the quantization is not
   what departs: the lowering is, and nothing is claimed) and the second must pass (else what stays
   quantized outside the layers is the cause: "not pinned", said as such).
2. Sensitivity: each unit (a layer, or a parent module of several where the budget cannot try each
   layer) quantized alone, the others in float: the noise it adds, ‖Δ‖²/‖ref‖², over what the
   always-quantized rest adds.
3. Units are kept in float in the order of that noise, largest first, until the noise left is
   estimated within the gate (noise powers of independent roundings add); from there each set is
   quantized and checked, a unit added at a time, until one passes.
4. Units of the passing set are put back to int one at a time, least noisy first, where the variant
   still passes: the set is then minimal for this order. A set of more than half the units is no remedy
   (most of the model in float): "spread", said with its size, and nothing is lowered.

Every quantization counts against the budget; a search the budget stops before a set passes says where
it stopped and claims nothing. Runs in the stack's venv (no torch here: the adapter brings it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class OutOfBudget(Exception):
    """The search's time budget ran out before its answer."""


@dataclass(frozen=True)
class Departure:
    """A quantized module's outputs against the float model's: the worst output's relative L2 error
    (the SNR is −20·log10 of it) and the worst cosine."""

    rel_l2: float
    cosine: float

    @property
    def snr_db(self) -> float:
        return -20 * math.log10(self.rel_l2) if self.rel_l2 > 0 else math.inf


@dataclass
class Trials:
    """One search: the departure of the variant quantized with some units kept in float, and its cost."""

    departure_of: Callable[[frozenset[str]], Departure]  # units kept in float → departure from float
    min_snr_db: float
    min_cosine: float
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    tried: list[dict[str, Any]] = field(default_factory=list)

    def passes(self, found: Departure) -> bool:
        return found.snr_db >= self.min_snr_db and found.cosine >= self.min_cosine

    def departure(self, keep_float: Iterable[str], why: str) -> Departure:
        if time.monotonic() - self.started > self.budget_s:
            raise OutOfBudget(f"stopped at budget ({self.budget_s:g} s) before trying {why}")
        kept = frozenset(keep_float)
        start = time.monotonic()
        found = self.departure_of(kept)
        self.tried.append({"kept_float": why, "units": len(kept), "rel_l2": found.rel_l2, "cosine": found.cosine,
                           "seconds": round(time.monotonic() - start, 2)})
        return found


def units_of(layers: list[str], most: int) -> list[str]:
    """The layers, or their parent modules where there are more than ``most``, in model order: the deepest
    names go up a level first ("blocks.3.mlp.up" → "blocks.3.mlp" → "blocks.3"), so that no unit holds
    another (a unit kept in float keeps all it holds); a top-level module stays itself."""
    units = list(layers)
    while len(units) > most:
        deepest = max(name.count(".") for name in units)
        if deepest == 0:
            break
        units = list(dict.fromkeys(name.rpartition(".")[0] if name.count(".") == deepest else name
                                   for name in units))
    return units


def find(units: list[str], trials: Trials) -> dict[str, Any]:
    """The smallest set of units, found as the module docstring says, that left in float brings the
    variant within its gate. Returns the record the report reads: ``status`` one of ``found``, ``spread``,
    ``not pinned``, ``stopped at budget``, ``does not reproduce``."""
    record: dict[str, Any] = {"tried": trials.tried, "units": units, "min_snr_db": trials.min_snr_db,
                              "min_cosine": trials.min_cosine}
    everything = frozenset(units)
    noise: dict[str, float] = {}  # unit → the noise power it adds, quantized alone
    try:
        whole = trials.departure((), "nothing (every layer quantized)")
        record["rel_l2"], record["cosine"] = whole.rel_l2, whole.cosine
        if trials.passes(whole):
            return {**record, "status": "does not reproduce",
                    "reason": f"quantized again in eager mode, the variant meets its gate (SNR {whole.snr_db:.1f} dB, "
                              f"cosine {whole.cosine:.5f}): the lowering, not the quantization, departs"}
        floor = trials.departure(everything, f"all {len(units)} units in float")
        if not trials.passes(floor):
            return {**record, "status": "not pinned",
                    "reason": f"with every quantized layer in float the variant still fails (SNR "
                              f"{floor.snr_db:.1f} dB, cosine {floor.cosine:.5f}): what the recipe quantizes outside "
                              "its layers departs"}
        for unit in units:
            alone = trials.departure(everything - {unit}, f"{unit} alone quantized")
            noise[unit] = max(0.0, alone.rel_l2 ** 2 - floor.rel_l2 ** 2)
        ranked = sorted(units, key=lambda unit: -noise[unit])  # stable: model order among equals
        target = 10 ** (-trials.min_snr_db / 10)  # the noise power the gate allows
        kept: list[str] = []
        found = whole
        for unit in ranked:
            kept.append(unit)
            left = floor.rel_l2 ** 2 + sum(noise[u] for u in units if u not in kept)
            if left > target and len(kept) < len(ranked):
                continue  # estimated still over: no quantization spent on it
            found = trials.departure(kept, f"{len(kept)} noisiest units in float")
            if trials.passes(found):
                break
        else:  # every unit in float: the floor, which passes
            found = floor
        kept, found = put_back(kept, found, noise, trials, record)
    except OutOfBudget as stopped:
        return {**record, "status": "stopped at budget", "reason": str(stopped),
                "noise": noise}
    if len(kept) * 2 > len(units):
        # Most of the model in float is no remedy: the recipe does not meet the gate on this model.
        return {**record, "status": "spread", "kept_float": kept, "found_rel_l2": found.rel_l2,
                "reason": f"the quantization noise is spread over the model: {len(kept)} of its {len(units)} units "
                          f"would stay in float to meet the gate (SNR {found.snr_db:.1f} dB), which un-quantizes "
                          "most of it; no remedy is offered"}
    total = sum(noise.values()) or 1.0
    return {**record, "status": "found", "kept_float": kept,
            "found_rel_l2": found.rel_l2, "found_cosine": found.cosine,
            "culprits": [{"operator": unit, "share": noise[unit] / total,
                          "rel_l2_alone": math.sqrt(floor.rel_l2 ** 2 + noise[unit]),
                          "rel_l2_without": found.rel_l2, "calls": []} for unit in kept]}


def put_back(kept: list[str], found: Departure, noise: dict[str, float], trials: Trials,
             record: dict[str, Any]) -> tuple[list[str], Departure]:
    """Put back to int what the gate does not need in float: each unit of ``kept``, the quietest first, where the
    variant still meets its gate without it. A budget that runs out ends it, said in ``record``."""
    for unit in sorted(kept, key=lambda u: noise[u]):
        if len(kept) == 1:
            break
        fewer = [u for u in kept if u != unit]
        try:
            tried = trials.departure(fewer, f"{unit} back to int")
        except OutOfBudget:
            record["reason"] = f"not minimized further: the budget ({trials.budget_s:g} s) ran out"
            break
        if trials.passes(tried):
            kept, found = fewer, tried
    return kept, found
