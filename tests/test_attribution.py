"""judge/attribution.py: a quantized variant's lowering weighed against its quantization, output by output."""

from __future__ import annotations

import numpy as np
import pytest

from upgrade_gate.judge.attribution import attributions
from upgrade_gate.judge.numerics import compare_outputs
from upgrade_gate.schema.comparison import LOWERING_FACTOR

REFERENCE = np.linspace(-1.0, 1.0, 16).reshape(1, 16)


def moved(reference: np.ndarray, rel_l2: float) -> np.ndarray:
    """``reference`` plus a uniform offset whose relative L2 against it is exactly ``rel_l2``."""
    return reference + rel_l2 * np.linalg.norm(reference) / np.sqrt(reference.size)


def weighed(quantization: dict[str, float], lowering: dict[str, float]):
    """The float model, a quantized one ``quantization`` away per output, an artifact ``lowering`` away from it."""
    eager = {f"forward.output_{i}": REFERENCE * (i + 1) for i in range(len(quantization))}
    quantized = {name: moved(eager[name], quantization[name]) for name in eager}
    artifact = {name: moved(quantized[name], lowering[name]) for name in eager}
    return attributions(compare_outputs(quantized, eager), compare_outputs(artifact, quantized), floor=1e-4)


def test_an_output_the_lowering_breaks_is_not_hidden_by_another_the_recipe_quantizes_badly():
    """Logits quantized to 0.03 and a cache quantized to 0.6 (an LLM's value cache at ~4 dB): a lowering that
    takes the logits 1.0 away departs, though 1.0 is within twice the cache's 0.6 — the worst outputs, compared
    with each other, would have said "the quantization". The search on the method may then leave what its most
    lenient output allows (the cache's rounding), the figures said are the departing output's."""
    (found,) = weighed({"forward.output_0": 0.03, "forward.output_1": 0.6},
                       {"forward.output_0": 1.0, "forward.output_1": 0.5}).values()
    assert found.lowering_departs and found.output == "forward.output_0"
    assert found.lowering_rel_l2 == pytest.approx(1.0) and found.quantization_rel_l2 == pytest.approx(0.03)
    assert found.search_threshold == pytest.approx(LOWERING_FACTOR * 0.6)
    # Each output's own allowance, for the search to hold it to (the logits' is not the cache's).
    assert dict(found.allowances) == {"output_0": pytest.approx(LOWERING_FACTOR * 0.03),
                                      "output_1": pytest.approx(LOWERING_FACTOR * 0.6)}
    assert "forward.output_0 is at SNR 0.0 dB" in found.said() and "quantization is at SNR 30.5 dB" in found.said()


@pytest.mark.parametrize(("lowering", "departs"), [(1.9 * 0.05, False), (2.1 * 0.05, True)])
def test_the_lowering_may_add_twice_the_quantizations_error_and_no_more(lowering, departs):
    (found,) = weighed({"forward.output_0": 0.05}, {"forward.output_0": lowering}).values()
    assert found.lowering_departs is departs


def test_an_output_the_recipe_leaves_in_float_is_held_to_the_float_rule():
    """No quantization error at all: the lowering may add what the float numerics gate allows (1e-4 here)."""
    (within,) = weighed({"forward.output_0": 0.0}, {"forward.output_0": 5e-5}).values()
    (beyond,) = weighed({"forward.output_0": 0.0}, {"forward.output_0": 5e-4}).values()
    assert not within.lowering_departs and beyond.lowering_departs
