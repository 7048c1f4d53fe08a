"""The adapter contract: what a stack's adapter module gives the worker.

A stack spec names its adapter (``adapter = "executorch_xnnpack"``, a module of compat/, or ``adapter = "own.py"``,
a file of the team's own beside the spec, which may build on ours: ``from upgrade_gate_compat.executorch_xnnpack
import SUFFIX, load, lower, run, save, set_threads``). The module itself is the adapter: its top-level names are the
members below.

Every adapter is an ``Adapter``. What it can do beyond that is one Protocol per capability (``Quantizes``,
``MultiMethod``, ``Profiles`` …: CAPABILITIES), checked with ``isinstance`` — a module conforms by having the members.
A capability is all of its members or none: the stage that uses one an adapter has in part fails naming what it lacks
(``require_whole``), so a misspelt ``quantise`` is not "no recipe". ``ProfilerCheck`` is the one optional member.

Who checks: the probe (``compat/probe.py``), before any export — the parent ends the run with exit 2 naming the spec
and the members its adapter lacks — and the worker again where it uses the adapter (``require``): a phase or a
measurement started without the probe records a ``ContractError`` naming the adapter and the missing members on the
stage that needed them, as for anything else that raises. mypy checks the built-in adapters against these Protocols,
signatures included (the end of this file).

Types: torch is not installed where the parent runs mypy: modules, tensors and programs are ``Any``. Standard
library only (it runs inside the stacks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable


class ContractError(TypeError):
    """An adapter that lacks members of the contract, or part of a capability it has."""


@runtime_checkable
class Adapter(Protocol):
    """Export a model and run the artifact in the stack's own mobile runtime (required of every adapter).

    A model has one method (``forward``) or several (an LLM's ``prefill`` and
    ``decode``); each is lowered, saved, loaded and run as an artifact of its own,
    ``<model folder>/<method><SUFFIX>`` — unless the model asks for one artifact and the adapter is
    ``MultiMethod``: then every method is in ``program<SUFFIX>``.
    """

    # Constants are read-only properties: a module's ``SUFFIX = ".pte"`` keeps them (a settable one must match exactly).
    @property
    def SUFFIX(self) -> str:
        """The artifact's file suffix, dot included: ``".ptl"``, ``".pte"``."""

    def set_threads(self, count: int) -> None:
        """Set the runtime's intra-op thread count. The runtime phase and the measurement server call it
        first, before anything is loaded (ExecuTorch 0.7 hung on a threadpool reset after a load)."""

    def lower(self, module: Any, inputs: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
        """The ``export`` stage, once per method, under ``torch.no_grad()``: an eval-mode
        ``torch.nn.Module`` (the float model's, or what ``quantize`` returned) and the fixture's inputs
        (tensors) → the exported program in memory, and what to record about it on the stage
        (``operators``; ExecuTorch's delegation counts). What it raises fails the stage; ``localize``
        then calls it again on submodules with their real inputs, so it takes any module."""

    def save(self, lowered: Any, path: Path) -> dict[str, Any] | None:
        """Write ``lowered`` to ``path`` (a temporary name the worker renames when this returns; the
        ``save`` stage then requires a non-empty file); ``lowered`` is not used again. A dict returned is
        recorded with the method (ExecuTorch: each method's planned memory)."""

    def load(self, path: Path) -> Any:
        """The artifact, loaded in the stack's mobile runtime, in a fresh process that has not exported
        anything (the runtime phase, the measurement server, whose cold start this is): import only what
        an app would have."""

    def run(self, program: Any, inputs: tuple[Any, ...]) -> Any:
        """One call of a loaded artifact: its outputs, tensors or tuples, lists and dicts of them (flattened
        in a stable order, dicts by key). The measurement times exactly this call: no copies, no autograd."""


@runtime_checkable
class Quantizes(Protocol):
    """Quantization recipes by variant name (``vit-ti16@int8`` is the model ``vit-ti16``, variant ``int8``)."""

    @property
    def QUANTIZATIONS(self) -> Mapping[str, str]:
        """Variant (``"int8"``, ``"8da4w"``) → its recipe in words, recorded and shown in the report. A variant
        not named here is skipped in this stack ("this stack has no int8 recipe")."""

    def quantize(self, module: Any, inputs: tuple[Any, ...], variant: str) -> tuple[Any, dict[str, Any]]:
        """The ``quantize`` stage, once per method, before ``export``: a module ``lower`` takes like any
        other, calibrated on ``inputs`` (the same in every stack), and what it did — ``recipe`` and
        ``quantized_modules`` or ``quantize_nodes``; 0 in every method fails the stage (the artifact would
        be the float model)."""


@runtime_checkable
class MultiMethod(Protocol):
    """Every method of a model in one artifact, ``program<SUFFIX>`` (ExecuTorch's multi-method .pte), for
    models with several methods that ask for one: their shared weights are shipped, cached and loaded
    once. Such a model has no per-method artifact; its methods are loaded and run from the program."""

    def save_program(self, lowered: dict[str, Any], path: Path) -> dict[str, Any] | None:
        """The end of the ``export`` stage: method name → what ``lower`` returned, written as one artifact
        at ``path`` (``save`` is not called). A dict returned is recorded on the stage as ``program``
        (ExecuTorch: each method's planned memory, by method name)."""

    def run_method(self, program: Any, name: str, inputs: tuple[Any, ...]) -> Any:
        """One call of method ``name`` of the loaded multi-method artifact: what ``run`` is to a one-method
        artifact, in the runtime phase and the measurement (which times exactly this call)."""


@runtime_checkable
class Profiles(Protocol):
    """Time per operator in the stack's own runtime: the runtime phase's ``profile`` stage, which explains
    a result and fails no gate."""

    def profile(self, path: Path, inputs: tuple[Any, ...], runs: int) -> dict[str, Any]:
        """Load the artifact at ``path`` and profile ``runs`` calls: ``{"source": how, "total_ms": one call,
        "operators": [{"name", "calls", "total_ms", "share"}, …] by time}``, per call; more keys are kept.
        A ``MultiMethod`` adapter's profile also takes ``method=``: the method of a multi-method program."""


@runtime_checkable
class ProfilerCheck(Protocol):
    """Optional beside ``Profiles``: whether this machine can profile. Without it nothing is missing."""

    def profiler_missing(self) -> str | None:
        """What this machine lacks for ``profile`` and how to get it (the stage is skipped with it as its
        reason), or None."""


@runtime_checkable
class OtherBackends(Protocol):
    """Export-only tries of the runtime's other backends (ExecuTorch: Core ML, MPS, Vulkan …), for float
    models, in the export phase's ``backends`` stage, within ``backends-budget``; they fail no gate."""

    @property
    def OTHER_BACKENDS(self) -> tuple[str, ...]:
        """The backends' names, tried in this order."""

    def backend_unavailable(self, backend: str) -> str | None:
        """Why ``backend`` cannot be tried in this stack and what it needs (recorded as "unavailable" whatever
        the budget: asking costs nothing), or None."""

    def export_only(self, backend: str, module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
        """Lower one method for ``backend`` without running it: ``{"status": "ok", "bytes", "seconds",
        delegation counts…}``, ``{"status": "failed", "error"}`` or ``{"status": "unavailable", "reason"}``."""


@runtime_checkable
class Diagnoses(Protocol):
    """Where an artifact departs from eager: the lowering again with parts kept out (compat/search/culprit.py,
    compat/diagnose/diagnose_phase.py), a reproducer, and the lines of an export script that avoid the culprit.
    A part is what the lowering can leave out: a source call the delegate takes (ExecuTorch), a pass of
    ``optimize_for_mobile`` (the Lite Interpreter)."""

    @property
    def REMEDY_NAME(self) -> str:
        """The name the remedy's code binds to what the lowering takes (``partitioner``,
        ``optimization_blocklist``)."""

    def lowering_parts(self, module: Any, inputs: tuple[Any, ...],
                       start: Any = None) -> tuple[Any, list[dict[str, Any]]]:
        """What the lowering starts from (the exported program, the traced module) and the parts of it the
        lowering takes: ``[{"key", "kind", "backend", "module", "source"}, …]`` in graph order; ``key``
        names one source call (culprit.source_key) or pass; ``"runs_alone": False`` for a part that is
        no operator (a pass), which is neither run alone nor given an operator's reproducer. ``start``:
        SearchesBlocks' ``lowering_start`` of the same module and inputs, where the caller has it (not made
        again: an LLM method's export is seconds)."""

    def lower_keeping_out(self, lowerable: Any, keep_out: frozenset[str]) -> Any:
        """Lowered as ``lower`` does, the parts keyed in ``keep_out`` left out."""

    def lower_with_remedy(self, remedy: dict[str, Any]) -> Any:
        """Lowered as the remedy's code says: its names once it ran with ``program`` bound to what the lowering
        starts from, which it may rewrite, and ``REMEDY_NAME`` bound to what the lowering takes."""

    def run_lowered(self, lowered: Any, inputs: tuple[Any, ...]) -> list[Any]:
        """A lowered program serialized and run in the stack's runtime: its outputs, as ``run`` gives them."""

    def remedy_options(self, lowerable: Any, culprits: list[tuple[str, str]], *,
                       fused: Sequence[str] = ()) -> list[tuple[str, str, bool]]:
        """The remedies a team would try for the culprits (kind, key of its first part), the one expected
        cheapest first, each ``(what it does, Python that binds REMEDY_NAME, tried only when none before it
        passed)``; the last keeps every culprit out, as the search did. ``fused``: the kinds of a pair the
        backend fuses that fails where each alone does not (the fusion to break)."""

    def reproducer_source(self, *, kind: str, call: str, arguments: int, threshold: float, remedy: str,
                          found_in: str) -> str:
        """A standalone script, torch and the stack's own packages only, that lowers the operator ``call``
        on ``inputs.pt`` beside it and exits 1 while it differs from eager (0 with ``--with-remedy``
        when the remedy fixes it)."""

    def method_reproducer(self, lowerable: Any, inputs: tuple[Any, ...], folder: Path, *, kind: str,
                          threshold: float | list[float], remedy: str, found_in: str, fails_with: str = "",
                          program: str = "the whole method") -> None:
        """Where the culprit does not fail alone: the whole method, or the block of it the search ran on (what
        ``program`` says), as a file the stack's packages load without the model's code, its inputs and
        ``repro.py`` written in ``folder``, with the same exits; ``fails_with``, where the method did not lower at
        all, the lowering's error, which then reads as "reproduces"."""


@runtime_checkable
class SearchesBlocks(Protocol):
    """A Diagnoses whose lowering starts from a ``torch.export`` program: the search may run on the method's first
    repeated block as a program of its own (compat/diagnose/blocks.py), a fraction of a lowering of the whole
    method, where that block departs as lowered. The remedies are still judged on the whole method."""

    def lowering_start(self, module: Any, inputs: tuple[Any, ...]) -> Any:
        """What ``lowering_parts`` starts from (the exported program), without lowering it."""


@runtime_checkable
class AnswersLoadFailures(Protocol):
    """Where a program lowers and fails when the runtime loads it (compat/diagnose/load_phase.py): the runtime's own
    words matched to the calls that make the node they name, that call alone as a reproducer, and the remedies the
    words point at."""

    def load_culprits(self, lowerable: Any, said: str) -> dict[str, Any]:
        """The search's finding from the runtime's words ``said``: ``{"status": "found", "reason", "culprits": [{
        "operator", "backend", "calls": [{"key", "module", "source", "inputs"}]}]}``, or ``"not pinned"`` and why."""

    def load_call_code(self, lowerable: Any, key: str, arguments: tuple[Any, ...]) -> tuple[str, list[Any]]:
        """The call ``key`` alone as a reproducer's code, on the real arguments that reached it, and its tensors."""

    def load_remedy_options(self, lowerable: Any, found: dict[str, Any]) -> list[tuple[str, str, bool]]:
        """The remedies for ``found`` (load_culprits'), as Diagnoses.remedy_options gives them."""

    def load_reproducer_source(self, *, kind: str, call: str, arguments: int, threshold: float, remedy: str,
                               found_in: str, fails_with: str) -> str:
        """As Diagnoses.reproducer_source, exiting 1 while the program fails to load with ``fails_with``."""


@runtime_checkable
class KeepsFloat(Protocol):
    """Where a quantized variant departs from the float model beyond its gate: the recipe run again with
    some layers left in float (compat/diagnose/precision.py, compat/diagnose/precision_phase.py), and the lines
    of an export script that leave them so."""

    def quantizable_layers(self, module: Any, variant: str) -> list[str]:
        """The modules the variant's recipe quantizes, by their path in ``module``, in model order."""

    def precision_start(self, module: Any, inputs: tuple[Any, ...], variant: str) -> Any:
        """What each quantization of the search starts from (a captured graph, the module itself)."""

    def quantize_with_remedy(self, start: Any, inputs: tuple[Any, ...], variant: str, remedy: dict[str, Any]) -> Any:
        """The variant quantized with what the remedy's code defined (its names): a module that runs eagerly
        and that ``lower`` exports."""

    def keep_float_code(self, variant: str, keep_float: list[str]) -> str:
        """Python for an export script: the recipe, the layers in ``keep_float`` left in float."""


@runtime_checkable
class ReExports(Protocol):
    """Where a method does not export: the export API's options in order (diagnose/export_remedy_phase.py)."""

    @property
    def EXPORT_REMEDIES(self) -> Sequence[tuple[str, str]]:
        """(name, code) to try, the first the stack's; code binds ``program`` from ``model``, ``example_inputs``."""

    def export_with(self, module: Any, inputs: tuple[Any, ...], code: str) -> tuple[Any, list[str]]:
        """The program one of ``EXPORT_REMEDIES`` makes (what ``lower_keeping_out`` lowers), and what it assumed
        of the example inputs (each decision specialized to their values), said for the report."""

    def export_reproducer(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], folder: Path, *,
                          fails_with: str, found_in: str, named: str) -> None:
        """repro.py in ``folder``: ``module`` called with ``args`` and ``kwargs`` exported as the stack exports (with
        ``--option NAME``, another of ``EXPORT_REMEDIES``): exit 1 while it raises ``fails_with``, 0 when it exports."""


@runtime_checkable
class WritesExportScript(Protocol):
    """What a GO hands the team (issue 64, upgrade_gate.migrate): the stack's recipe as the lines of the team's own
    export script, the calls ``quantize``, ``lower`` and ``save`` (or ``save_program``) make, with the steps a remedy's
    lines replace (compat/diagnose/remedy_trial.py REPLACED_STEPS), so that the script rebuilds the judged artifact
    byte for byte (tests/test_migrate.py checks it)."""

    def export_script(self, variant: str) -> str:
        """Python that imports only the stack's packages and defines ``quantize(module, inputs, replaced=None)`` (the
        variant's recipe, ``replaced``: what a quantization remedy binds in place of its own; the module itself for
        fp32), ``exported(module, inputs)``, ``lowered(program, partitioner=None)`` (a lowering remedy's partitioner,
        else the stack's) and ``program_bytes(methods)`` (the lowered methods serialized, several in one program)."""

    def method_signature(self, program: Any, method: str) -> dict[str, Any]:
        """The loaded ``program``'s metadata of ``method``: ``{"inputs": [{"sizes", "dtype"}], "outputs": [...]}``,
        what the app-side code of the migration is filled with."""


@runtime_checkable
class WritesExportLines(Protocol):
    """The stack's export as the lines a team's script writes today (the legacy stack's): what MIGRATION.md shows
    beside the candidate's script (upgrade_gate.migrate); tests/test_migrate.py runs them as written."""

    def export_lines(self, variant: str, file: str) -> str:
        """Python that quantizes ``model`` with ``variant``'s recipe, exports it on ``example_inputs`` and writes
        ``file``, as the stack's quantize, lower and save do."""


@runtime_checkable
class ReproducesQuantizeFailures(Protocol):
    """A recipe's failure as a standalone reproducer (float program, real inputs, the recipe's lines): one that
    raises (the localize stage's) and one below its gate (the keep-float search's)."""

    def quantize_reproducer(self, module: Any, inputs: tuple[Any, ...], folder: Path, *, variant: str,
                            fails_with: str, found_in: str, named: str, nothing: bool = False) -> None:
        """repro.py in ``folder``: exit 1 while the recipe raises ``fails_with`` (``nothing``: quantizes nothing of
        the module), 0 when it quantizes."""

    def precision_reproducer(self, module: Any, inputs: tuple[Any, ...], expected: list[Any], folder: Path, *,
                             variant: str, keep_float: list[str], min_snr_db: float, min_cosine: float,
                             extents: dict[int, tuple[int, int]], found_in: str) -> None:
        """repro.py in ``folder``: exit 1 while below the gate against ``expected``, the float outputs (with
        ``--with-remedy``, the layers in ``keep_float`` left in float)."""


@runtime_checkable
class Recaptures(Protocol):
    """Where a recipe raises: the capture's options in order (diagnose/quantize_remedy_phase.py)."""

    @property
    def CAPTURE_REMEDIES(self) -> Sequence[tuple[str, str]]:
        """(name, code) to try, the first the stack's; code binds ``captured`` from ``capture``, ``module``,
        ``inputs``, in place of the export script's own capture."""

    def quantize_with_capture(self, module: Any, inputs: tuple[Any, ...], variant: str, code: str) -> Any:
        """The variant quantized by its recipe from what one of ``CAPTURE_REMEDIES`` captures: what ``lower``
        takes."""


# What the report calls each capability. ProfilerCheck and SearchesBlocks are none: they refine Profiles and
# Diagnoses.
CAPABILITIES: dict[str, type] = {"quantize": Quantizes, "program": MultiMethod, "profile": Profiles,
                                 "backends": OtherBackends, "diagnose": Diagnoses,
                                 "keep-float": KeepsFloat, "re-export": ReExports, "migrate": WritesExportScript,
                                 "export-lines": WritesExportLines, "quantize-repro": ReproducesQuantizeFailures,
                                 "re-capture": Recaptures}
# What a capability is, in the message that names an adapter having only part of one.
_DESCRIBED: dict[type, str] = {Quantizes: "quantization recipes", MultiMethod: "the multi-method program",
                               Profiles: "the profiler", OtherBackends: "other backends",
                               Diagnoses: "the culprit search", KeepsFloat: "the layer-precision search",
                               ReExports: "the export options", AnswersLoadFailures: "the load-failure search",
                               WritesExportScript: "the export script", WritesExportLines: "the export's lines",
                               ReproducesQuantizeFailures: "a recipe's reproducers", Recaptures: "the capture options"}


def declared(protocol: type) -> list[str]:
    """The names a module must define to be ``protocol``, in the order the Protocol declares them."""
    return [name for name, value in vars(protocol).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))]


def members(protocol: type) -> list[str]:
    """The names a module must define to be ``protocol``, sorted."""
    return sorted(declared(protocol))


def missing(module: Any, protocol: type = Adapter) -> list[str]:
    """The members of ``protocol`` that ``module`` lacks, sorted."""
    return [name for name in members(protocol) if not hasattr(module, name)]


def capabilities(module: Any) -> list[str]:
    """The capabilities ``module`` has whole, by the report's names."""
    return [name for name, protocol in CAPABILITIES.items() if isinstance(module, protocol)]


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def require(module: Any, name: str) -> None:
    """Raise ContractError naming the adapter and what it lacks, unless ``module`` is an ``Adapter``."""
    if isinstance(module, Adapter):
        return
    raise ContractError(f"adapter {name!r} lacks {', '.join(missing(module))}; an adapter provides "
                        f"{_listed(declared(Adapter))} (compat/contract.py)")


def claims(module: Any, protocol: type) -> bool:
    """Whether ``module`` has any member of ``protocol``: a capability it offers, whole or in part."""
    return len(missing(module, protocol)) < len(members(protocol))


def require_whole(module: Any, protocol: type, name: str) -> None:
    """Raise ContractError naming the adapter, what it has and what it lacks, if ``module`` has part of
    ``protocol`` but not all: a capability meant and misspelt is named, not taken for one not offered."""
    if isinstance(module, protocol) or not claims(module, protocol):
        return
    lacking = missing(module, protocol)
    present = [member for member in declared(protocol) if member not in lacking]
    raise ContractError(f"adapter {name!r} has {_listed(present)} but lacks {_listed(lacking)}; a capability is "
                        f"all of its members or none ({_DESCRIBED.get(protocol, protocol.__name__)}: "
                        f"{_listed(declared(protocol))}; compat/contract.py)")


if TYPE_CHECKING:
    # mypy checks each built-in adapter module against the Protocols it means to keep, member by member
    # and signature by signature (the parent's tests see only the names).
    from . import executorch_xnnpack, torchscript_mobile

    _legacy: Adapter = torchscript_mobile
    _legacy_quantizes: Quantizes = torchscript_mobile
    _legacy_profiles: Profiles = torchscript_mobile
    _legacy_profiler_check: ProfilerCheck = torchscript_mobile
    _legacy_diagnoses: Diagnoses = torchscript_mobile
    _legacy_export_lines: WritesExportLines = torchscript_mobile
    _candidate: Adapter = executorch_xnnpack
    _candidate_quantizes: Quantizes = executorch_xnnpack
    _candidate_program: MultiMethod = executorch_xnnpack
    _candidate_profiles: Profiles = executorch_xnnpack
    _candidate_profiler_check: ProfilerCheck = executorch_xnnpack
    _candidate_backends: OtherBackends = executorch_xnnpack
    _candidate_diagnoses: Diagnoses = executorch_xnnpack
    _candidate_searches_blocks: SearchesBlocks = executorch_xnnpack
    _candidate_keeps_float: KeepsFloat = executorch_xnnpack
    _candidate_load_failures: AnswersLoadFailures = executorch_xnnpack
    _candidate_re_exports: ReExports = executorch_xnnpack
    _candidate_export_script: WritesExportScript = executorch_xnnpack
    _candidate_quantize_repro: ReproducesQuantizeFailures = executorch_xnnpack
    _candidate_recaptures: Recaptures = executorch_xnnpack
