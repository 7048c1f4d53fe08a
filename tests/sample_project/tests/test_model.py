from __future__ import annotations

import torch

from edge_app.model import INPUT_SHAPE, NUM_CLASSES, build, embed, scores_bfloat16


def test_build_gives_one_score_per_class() -> None:
    model, example = build()
    assert not model.training
    assert example[0].shape == INPUT_SHAPE
    with torch.no_grad():
        scores = model(*example)
    assert scores.shape == (1, NUM_CLASSES)
    assert torch.isfinite(scores).all()


def test_build_is_deterministic() -> None:
    first, first_example = build()
    second, second_example = build()
    assert torch.equal(first_example[0], second_example[0])
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name]), name


def test_embeddings_have_unit_rms() -> None:
    model, _ = build()
    images = torch.rand(4, *INPUT_SHAPE[1:])
    with torch.no_grad():
        embeddings = embed(model, images)
    rms = embeddings.pow(2).mean(dim=1).sqrt()
    assert torch.allclose(rms, torch.ones(4), atol=1e-3)


def test_bfloat16_scores_stay_close_to_float() -> None:
    model, _ = build()
    images = torch.rand(8, *INPUT_SHAPE[1:], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(images)
    torch.testing.assert_close(scores_bfloat16(model, images).float(), expected, rtol=0.05, atol=0.05)
