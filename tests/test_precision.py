"""compat/diagnose/precision.py's search for the layers of a quantized variant to keep in float, on simulated
quantizations whose rounding noise adds (the real recipe and lowering: tests/test_diagnose.py)."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from upgrade_gate.layout import TOOL_ROOT

spec = importlib.util.spec_from_file_location("precision_under_test",
                                              TOOL_ROOT / "compat" / "diagnose" / "precision.py")
precision = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = precision
spec.loader.exec_module(precision)

MIN_SNR_DB, MIN_COSINE = 20.0, 0.99  # the quantized gate's defaults: a relative L2 of at most 0.1


def quantization(noise: dict[str, float], floor: float = 1e-6, interacts: dict[str, str] | None = None):
    """A variant whose every unit quantized adds its noise power (‖Δ‖²/‖ref‖²) to ``floor`` (what stays quantized
    outside the units); ``interacts[b] = a``: b's noise is there only while a is quantized too. Returns the
    departure function and the sets it was asked for."""
    asked: list[frozenset[str]] = []

    def departure_of(keep_float: frozenset[str]):
        asked.append(keep_float)
        power = floor + sum(value for unit, value in noise.items() if unit not in keep_float
                            and (interacts or {}).get(unit) not in keep_float)
        return precision.Departure(rel_l2=math.sqrt(power), cosine=1 - power / 2)
    return departure_of, asked


def trials(departure_of, budget_s: float = 60):
    return precision.Trials(departure_of=departure_of, min_snr_db=MIN_SNR_DB, min_cosine=MIN_COSINE, budget_s=budget_s)


def test_one_noisy_layer_is_the_one_kept_in_float():
    departure_of, asked = quantization({"up": 1e-4, "proj": 0.05, "down": 2e-4})  # proj alone: 13 dB
    found = precision.find(["up", "proj", "down"], trials(departure_of))
    assert found["status"] == "found" and found["kept_float"] == ["proj"]
    assert found["found_rel_l2"] == pytest.approx(math.sqrt(1e-6 + 3e-4))
    # Everything quantized, everything float, each unit alone, then the one set the estimate said would pass.
    assert asked == [frozenset(), frozenset({"up", "proj", "down"}), frozenset({"proj", "down"}),
                     frozenset({"up", "down"}), frozenset({"up", "proj"}), frozenset({"proj"})]
    [culprit] = found["culprits"]
    assert culprit["operator"] == "proj" and culprit["share"] == pytest.approx(0.05 / (0.05 + 3e-4))
    assert culprit["rel_l2_alone"] == pytest.approx(math.sqrt(1e-6 + 0.05))


def test_layers_are_kept_in_the_order_of_their_noise_until_the_gate_passes():
    # Each of a, b, c alone is within the gate (a noise power under 0.01); any two are not: the two noisiest go.
    noise = {"a": 0.005, "b": 0.007, "c": 0.006, "d": 1e-5}
    departure_of, _ = quantization(noise)
    found = precision.find(list(noise), trials(departure_of))
    assert found["status"] == "found" and found["kept_float"] == ["b", "c"]
    assert -20 * math.log10(found["found_rel_l2"]) >= MIN_SNR_DB


def test_a_layer_that_is_noisy_only_beside_another_goes_back_to_int():
    # b's noise comes from a's rounding: once a is float, b quantizes well, and the search puts it back.
    departure_of, asked = quantization({"a": 0.02, "b": 0.015, "c": 1e-5}, interacts={"b": "a"})
    found = precision.find(["a", "b", "c"], trials(departure_of))
    assert found["status"] == "found" and found["kept_float"] == ["a"]
    assert frozenset({"a", "b"}) in asked  # the estimate (noise powers add) asked for both first


def test_what_stays_quantized_outside_the_layers_is_not_pinned_to_them():
    departure_of, asked = quantization({"a": 0.02, "b": 1e-4}, floor=0.03)  # 15 dB with every layer float
    found = precision.find(["a", "b"], trials(departure_of))
    assert found["status"] == "not pinned" and "kept_float" not in found and "culprits" not in found
    assert "outside its layers" in found["reason"] and len(asked) == 2


def test_a_variant_that_meets_its_gate_in_eager_mode_is_the_lowerings_not_the_quantizations():
    departure_of, asked = quantization({"a": 1e-4, "b": 1e-4})
    found = precision.find(["a", "b"], trials(departure_of))
    assert found["status"] == "does not reproduce" and "culprits" not in found and len(asked) == 1


def test_a_search_the_budget_stops_claims_nothing():
    departure_of, _ = quantization({"a": 0.05, "b": 1e-4})
    found = precision.find(["a", "b"], trials(departure_of, budget_s=0))
    assert found["status"] == "stopped at budget" and "culprits" not in found and "kept_float" not in found
    assert found["reason"].startswith("stopped at budget (0 s) before trying nothing")


def test_layers_are_ranked_as_their_parents_when_there_are_more_than_the_budget_tries():
    layers = [f"blocks.{b}.{part}.{name}" for b in range(3) for part, names in (("attn", ("q", "k")), ("mlp", ("up",)))
              for name in names] + ["head"]
    assert precision.units_of(layers, 10) == layers
    assert precision.units_of(layers, 7) == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp",
                                             "blocks.2.attn", "blocks.2.mlp", "head"]
    assert precision.units_of(layers, 4) == ["blocks.0", "blocks.1", "blocks.2", "head"]
    assert precision.units_of(layers, 1) == ["blocks", "head"]  # a top-level module stays itself


def test_layers_at_different_depths_group_into_units_none_of_which_holds_another():
    # MobileNetV3's: a stem convolution two levels down, the blocks' four, the classifier's one.
    layers = ["features.0.0", *(f"features.{b}.block.{i}.0" for b in (1, 2) for i in range(3)), "classifier.0"]
    for most in range(1, len(layers) + 1):
        units = precision.units_of(layers, most)
        assert not any(a != b and b.startswith(a + ".") for a in units for b in units), (most, units)
        assert all(any(layer == u or layer.startswith(u + ".") for u in units) for layer in layers), (most, units)
    assert precision.units_of(layers, 5) == ["features.0.0", "features.1.block", "features.2.block", "classifier.0"]


def test_noise_spread_over_most_layers_is_said_so_and_offers_no_remedy():
    # Eight layers of equal noise, 0.02 together against the gate's 0.01: five must stay float.
    departure_of, _ = quantization({f"blocks.{i}": 0.0025 for i in range(8)})
    found = precision.find([f"blocks.{i}" for i in range(8)], trials(departure_of))
    assert found["status"] == "spread" and len(found["kept_float"]) == 5 and "culprits" not in found
    assert "5 of its 8 units would stay in float" in found["reason"]
