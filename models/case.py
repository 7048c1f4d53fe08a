"""What a model factory returns.

The simplest factory returns ``(module, example_inputs)``; the worker wraps it
in a ModelCase with one method, ``forward``. A richer model returns a ModelCase
naming several methods (an LLM's prefill and decode, a VLM's six modules), each
exported as its own program, and a Task saying how its outputs are judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# call(method, *tensors) runs one method — the eager module or its artifact —
# and returns its output tensors as a flat list.
Call = Callable[..., list[torch.Tensor]]

TASK_KINDS = ("generic", "classification", "embedding", "generation")


@dataclass(frozen=True)
class Method:
    """One entry point: a module and the example inputs it is exported and timed with.

    ``read_extents`` says which part of an output a later call reads, where that
    is not all of it: ``{output_index: (axis, count)}`` — only the first ``count``
    entries along ``axis`` (an LLM's KV cache: the slots filled so far; the rest is
    padding or empty, overwritten before any step reads it). Outputs are compared
    on that part alone, and the report says so.
    """

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    read_extents: Mapping[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """How a model's outputs are judged beyond the generic tensor metrics.

    * ``classification`` — the first output is logits [batch, classes]: top-1/top-5 agreement.
    * ``embedding`` — the first output is embeddings [items, dim]: cosine, and whether the
      similarity ranking of item pairs is preserved.
    * ``generation`` — ``drive(call)`` runs an end-to-end loop (greedy decoding) through the
      methods and returns ``{"tokens": [[int, …] per prompt], "text": [str per prompt],
      "step_logits": Tensor[prompts, steps, vocab]}``; compared as token agreement, first
      divergence, logits SNR and top-5 overlap.
    """

    kind: str = "generic"
    drive: Callable[[Call], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in TASK_KINDS:
            raise ValueError(f"Task kind {self.kind!r}: expected one of {', '.join(TASK_KINDS)}")
        if (self.kind == "generation") != (self.drive is not None):
            raise ValueError("a generation task needs drive(call), and only a generation task has one")


@dataclass(frozen=True)
class ModelCase:
    # Owns every weight: its state_dict is what the stacks must share.
    module: torch.nn.Module
    # Inputs of module.forward, when the case has no named methods.
    inputs: tuple[torch.Tensor, ...] = ()
    # Named entry points, exported in this order; empty means {"forward": Method(module, inputs)}.
    methods: Mapping[str, Method] = field(default_factory=dict)
    task: Task = field(default_factory=Task)
    # "fixture": random weights, drawn by the first stack and saved for the others
    #   (two torch versions need not draw the same numbers from one seed).
    # "deterministic": the factory builds identical weights in every stack (from
    #   converted assets, or numpy's generator), so nothing is saved.
    weights: str = "fixture"
    # With several methods: where the stack can, also write all of them into one
    # artifact (ExecuTorch's multi-method .pte). That keeps every lowered method
    # in memory at once, which a 1B-parameter model cannot afford here.
    multi_method_artifact: bool = True

    def entry_points(self) -> dict[str, Method]:
        return dict(self.methods) if self.methods else {"forward": Method(self.module, self.inputs)}


def as_case(made: Any, *, factory: str) -> ModelCase:
    """Accept what a factory may return: a ModelCase or ``(module, inputs_tuple)``."""
    if isinstance(made, ModelCase):
        return made
    if (
        isinstance(made, tuple)
        and len(made) == 2
        and isinstance(made[0], torch.nn.Module)
        and isinstance(made[1], tuple)
        and all(isinstance(t, torch.Tensor) for t in made[1])
    ):
        return ModelCase(module=made[0], inputs=made[1])
    raise TypeError(
        f"{factory} returned {type(made).__name__}; expected (torch.nn.Module, tuple of tensors) "
        "or models.case.ModelCase"
    )
