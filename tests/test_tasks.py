from __future__ import annotations

import math

import numpy as np
import pytest

from upgrade_gate.judge import agreement


def test_classification_agreement_counts_top1_and_top5():
    reference = np.array([[0.1, 0.9, 0.0, 0.2, 0.3, 0.4], [0.8, 0.1, 0.0, 0.2, 0.3, 0.4]])
    swapped = reference.copy()
    swapped[1, [0, 5]] = swapped[1, [5, 0]]  # second item now picks class 5
    result = agreement.classification(swapped, reference)
    assert result.values["top1_agreement"] == 0.5
    assert result.values["top5_overlap"] == 1.0  # the same five classes, reordered
    assert result.headline == 0.5


def test_embedding_cosine_and_ranking():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(5, 16))
    same = agreement.embedding(reference * 3.0, reference)  # scale does not matter
    assert same.values["min_cosine"] == pytest.approx(1.0)
    assert same.values["ranking_preserved"] and same.values["pair_order_agreement"] == 1.0

    shuffled = reference[[1, 0, 2, 3, 4]]
    moved = agreement.embedding(shuffled, reference)
    assert moved.values["min_cosine"] < 0.9
    assert not moved.values["ranking_preserved"]


def test_generation_first_divergence_and_agreement():
    vocab = 8
    reference_tokens = [[1, 2, 3, 4], [5, 6, 7, 1]]
    actual_tokens = [[1, 2, 3, 4], [5, 6, 0, 0]]
    reference_logits = np.random.default_rng(1).normal(size=(2, 4, vocab))
    actual_logits = reference_logits.copy()
    actual_logits[1, 2] += 0.5
    result = agreement.generation(actual_tokens, reference_tokens, actual_logits, reference_logits)
    assert result.values["first_divergence"] == [None, 2]
    assert result.values["identical_prompts"] == 1
    # 4 of prompt 1 plus the 2 tokens before prompt 2 diverges, of 8.
    assert result.headline == pytest.approx(6 / 8)
    assert 0 < result.values["logits_snr_db"] < math.inf


def test_generation_identical_is_infinite_snr():
    logits = np.ones((1, 3, 4))
    result = agreement.generation([[1, 2, 3]], [[1, 2, 3]], logits, logits)
    assert result.values["token_agreement"] == 1.0 and result.values["logits_snr_db"] == math.inf
