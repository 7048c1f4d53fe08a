"""Task-aware agreement, what a model's user would notice: the same top-1 class and top-5 (classification),
parallel embeddings that keep their similarity ranking (embedding), the same greedy tokens and where they
first diverge (generation). Pure numpy; thresholds live in the gates.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from upgrade_gate.schema.comparison import TaskAgreement


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    k = min(k, logits.shape[-1])
    return np.argsort(-logits, axis=-1, kind="stable")[..., :k]


def _top5_overlap(actual: np.ndarray, reference: np.ndarray) -> float:
    """Mean share of the reference's top-5 that is also in the actual top-5, over rows."""
    a, r = _top_k(actual, 5), _top_k(reference, 5)
    return float(np.mean([len(set(x) & set(y)) / r.shape[-1] for x, y in zip(a, r)]))


def classification(actual: np.ndarray, reference: np.ndarray) -> TaskAgreement:
    actual, reference = actual.reshape(actual.shape[0], -1), reference.reshape(reference.shape[0], -1)
    top1 = float(np.mean(actual.argmax(-1) == reference.argmax(-1)))
    return TaskAgreement(kind="classification", values={
        "items": int(actual.shape[0]),
        "top1_agreement": top1,
        "top5_overlap": _top5_overlap(actual, reference),
    })


def _normalized(x: np.ndarray) -> np.ndarray:
    x = x.reshape(x.shape[0], -1).astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)


def embedding(actual: np.ndarray, reference: np.ndarray) -> TaskAgreement:
    a, r = _normalized(actual), _normalized(reference)
    cosines = np.sum(a * r, axis=-1)
    # Every pair of items is ranked by its similarity; a pair of pairs is
    # concordant when both sides order it the same way.
    pairs = list(itertools.combinations(range(a.shape[0]), 2))
    sim_a = np.array([a[i] @ a[j] for i, j in pairs])
    sim_r = np.array([r[i] @ r[j] for i, j in pairs])
    order_a, order_r = np.argsort(-sim_a, kind="stable"), np.argsort(-sim_r, kind="stable")
    concordant = total = 0
    for x, y in itertools.combinations(range(len(pairs)), 2):
        total += 1
        concordant += np.sign(sim_a[x] - sim_a[y]) == np.sign(sim_r[x] - sim_r[y])
    return TaskAgreement(kind="embedding", values={
        "items": int(a.shape[0]),
        "min_cosine": float(cosines.min()),
        "mean_cosine": float(cosines.mean()),
        "ranking_preserved": bool(np.array_equal(order_a, order_r)),
        "pair_order_agreement": float(concordant / total) if total else 1.0,
    })


def generation(
    actual_tokens: list[list[int]],
    reference_tokens: list[list[int]],
    actual_logits: np.ndarray,
    reference_logits: np.ndarray,
) -> TaskAgreement:
    """Token agreement over all prompts; logits compared up to each prompt's first divergence (then texts differ)."""
    matched = total = 0
    divergence: list[int | None] = []
    snrs, overlaps = [], []
    for row, (a, r) in enumerate(zip(actual_tokens, reference_tokens)):
        steps = max(len(a), len(r))
        first = next((i for i in range(steps) if i >= len(a) or i >= len(r) or a[i] != r[i]), None)
        divergence.append(first)
        matched += sum(1 for x, y in zip(a, r) if x == y) if first is None else first
        total += steps
        upto = steps if first is None else first + 1
        la, lr = actual_logits[row, :upto].astype(np.float64), reference_logits[row, :upto].astype(np.float64)
        error = np.linalg.norm(la - lr)
        snrs.append(math.inf if error == 0 else 20 * math.log10(np.linalg.norm(lr) / error))
        overlaps.append(_top5_overlap(la, lr))
    return TaskAgreement(kind="generation", values={
        "prompts": len(reference_tokens),
        "token_agreement": matched / total if total else 1.0,
        "identical_prompts": sum(1 for d in divergence if d is None),
        "first_divergence": divergence,
        "logits_snr_db": min(snrs) if snrs else None,
        "top5_overlap": float(np.mean(overlaps)) if overlaps else None,
    })
