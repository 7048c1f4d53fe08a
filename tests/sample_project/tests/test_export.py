from __future__ import annotations

from pathlib import Path

import torch

from edge_app import runtime
from edge_app.export import export_lite
from edge_app.model import build


def test_lite_interpreter_matches_eager(tmp_path: Path) -> None:
    model, example = build()
    path = export_lite(model, example, tmp_path / "model.ptl")
    module = runtime.load(path)
    images = torch.rand(example[0].shape)  # the shape it was exported with
    with torch.no_grad():
        expected = model(images)
        actual = module(images)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    assert torch.equal(runtime.classify(module, images), expected.argmax(dim=1))


def test_classify_gives_one_class_per_image() -> None:
    model, _ = build()
    classes = runtime.classify(model, torch.rand(5, 3, 32, 32))
    assert classes.shape == (5,)
    assert classes.dtype == torch.int64
