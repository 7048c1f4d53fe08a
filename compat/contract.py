"""The adapter contract: what a stack's adapter module provides to the worker.

A stack spec names its adapter (``adapter = "executorch_xnnpack"``, a module of
compat/, or a file of the team's own). Every adapter is an ``Adapter``; what it
can do beyond that is one Protocol per capability, checked with ``isinstance``
— a module conforms by having the members, as a duck would. Standard library
only: this runs inside the stacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Adapter(Protocol):
    """Export a model and run the artifact in the stack's own mobile runtime."""

    SUFFIX: str  # the artifact's file suffix: ".ptl", ".pte"

    def set_threads(self, count: int) -> None:
        """The runtime's intra-op thread count; called before anything is loaded."""

    def lower(self, module: Any, inputs: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
        """The exported program in memory, and what to record about it (operators, delegate partitions)."""

    def save(self, lowered: Any, path: Path, *, keep: bool = False) -> dict[str, Any] | None:
        """Write the artifact; with ``keep`` the lowered program stays usable (for ``save_program``).
        May return details to record (ExecuTorch: each method's planned memory)."""

    def load(self, path: Path) -> Any:
        """The artifact, loaded in the stack's mobile runtime."""

    def run(self, program: Any, inputs: tuple[Any, ...]) -> Any:
        """One call: the outputs (tensors, or tuples, lists and dicts of them)."""


@runtime_checkable
class Quantizes(Protocol):
    """Quantization recipes by variant name."""

    QUANTIZATIONS: dict[str, str]  # variant ("int8", "8da4w") → the recipe, in words

    def quantize(self, module: Any, inputs: tuple[Any, ...], variant: str) -> tuple[Any, dict[str, Any]]:
        """A module ``lower`` takes like any other, calibrated on ``inputs``, and what it quantized
        (``quantized_modules`` or ``quantize_nodes``: 0 in every method fails the stage)."""


@runtime_checkable
class MultiMethod(Protocol):
    """Every method of a model in one artifact (ExecuTorch's multi-method .pte)."""

    def save_program(self, lowered: dict[str, Any], path: Path) -> dict[str, Any] | None:
        """Write the methods' lowered programs (kept by ``save(..., keep=True)``) as one artifact."""

    def run_method(self, program: Any, name: str, inputs: tuple[Any, ...]) -> Any:
        """One call of one method of the multi-method artifact."""


@runtime_checkable
class Profiles(Protocol):
    """Time per operator in the stack's own runtime."""

    def profiler_missing(self) -> str | None:
        """What this machine lacks for ``profile`` (and how to get it), or None."""

    def profile(self, path: Path, inputs: tuple[Any, ...], runs: int) -> dict[str, Any]:
        """Operators of one call, by time: ``{"source", "total_ms", "operators": [{name, calls, total_ms, share}]}``."""


@runtime_checkable
class OtherBackends(Protocol):
    """Export-only tries of the runtime's other backends (ExecuTorch: executorch_backends)."""

    OTHER_BACKENDS: tuple[str, ...]

    def backend_unavailable(self, backend: str) -> str | None:
        """Why ``backend`` cannot be tried in this stack (and what it needs), or None."""

    def export_only(self, backend: str, module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
        """Lower for ``backend`` without running: ok (delegated share, size), failed (why) or unavailable."""


# What the report calls each capability.
CAPABILITIES = {"quantize": Quantizes, "program": MultiMethod, "profile": Profiles, "backends": OtherBackends}


def members(protocol: type) -> list[str]:
    """The names a module must define to be ``protocol``."""
    declared = {name for name in vars(protocol) if not name.startswith("_")}
    return sorted(declared | set(getattr(protocol, "__annotations__", {})))


def missing(module: Any, protocol: type = Adapter) -> list[str]:
    """The members of ``protocol`` that ``module`` lacks."""
    return [name for name in members(protocol) if not hasattr(module, name)]


def capabilities(module: Any) -> list[str]:
    return [name for name, protocol in CAPABILITIES.items() if isinstance(module, protocol)]
