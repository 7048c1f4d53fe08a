"""One stack's results for one model: its stages, typed views of their details, and its measurements.

The worker writes a stage's details free-form; this module is the one place that reads their keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from upgrade_gate.schema import codec
from upgrade_gate.schema.diagnosis import CacheUse, Diagnosis
from upgrade_gate.schema.measured import LatencySummary, Measured
from upgrade_gate.schema.records import Stage, StagesOf

# -- views of the stages' details ----------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Delegation:
    """How much of one method's graph a delegate took (ExecuTorch's get_delegation_info)."""

    delegate: str
    partitions: int
    delegated_nodes: int
    portable_nodes: int
    portable_ops: dict[str, int]  # operator → nodes left to the portable kernels

    @property
    def share(self) -> float:
        total = self.delegated_nodes + self.portable_nodes
        return self.delegated_nodes / total if total else 0.0

    def portable_summary(self, limit: int = 8) -> str:
        ops = sorted(self.portable_ops.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{op} ×{count}" for op, count in ops[:limit])
        return shown + (f", … ({len(ops) - limit} more)" if len(ops) > limit else "")

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> Delegation | None:
        if "delegated_nodes" not in details:
            return None
        return cls(delegate=str(details.get("delegate", "delegate")), partitions=int(details["delegate_partitions"]),
                   delegated_nodes=int(details["delegated_nodes"]), portable_nodes=int(details["portable_nodes"]),
                   portable_ops={str(k): int(v) for k, v in (details.get("portable_ops") or {}).items()})


# ExecuTorch's portable kernel in the candidate's profile (compat/executorch_profile.py), outside the delegate.
PORTABLE_KERNEL = "aten::"
# A float method whose portable batch norms take at least this share of its profiled time gets a latency search
# (upgrade_gate.run.diagnosis, compat/diagnose/latency_phase.py): folding them before export hands them to the delegate.
PORTABLE_SHARE = 0.25


@dataclass(frozen=True, kw_only=True, slots=True)
class OperatorTime:
    name: str
    calls: int
    total_ms: float
    share: float  # of the profiled run's time

    @property
    def portable(self) -> bool:
        """An ExecuTorch kernel outside the delegate (in a candidate's profile)."""
        return self.name.startswith(PORTABLE_KERNEL)


# A delegate's calls in the candidate's profile (compat/executorch_profile.py): "DELEGATE_CALL:<backend>".
DELEGATE_CALL = "DELEGATE_CALL:"


@dataclass(frozen=True, kw_only=True, slots=True)
class SlowdownSplit:
    """Where a slower method's time goes, from its profile: what its portable kernels take, what its delegate's
    calls take, and the ratio it would still have were its portable kernels free (a bound: their time is all the
    portable kernels could give back). Beyond the gate's threshold, the gap is the delegate's own."""

    ratio: float  # the latency gate's median ratio of the method
    portable: tuple[OperatorTime, ...]  # by share, largest first
    delegates: tuple[OperatorTime, ...]

    @property
    def portable_share(self) -> float:
        return sum(op.share for op in self.portable)

    @property
    def without_portable(self) -> float:
        return self.ratio * (1.0 - self.portable_share)

    def in_delegate(self, threshold: float) -> bool:
        return bool(self.delegates) and self.without_portable > threshold

    @classmethod
    def of(cls, ratio: float, operators: list[OperatorTime]) -> SlowdownSplit:
        return cls(ratio=ratio, portable=tuple(op for op in operators if op.portable),
                   delegates=tuple(op for op in operators if op.name.startswith(DELEGATE_CALL)))


def operator_profile(details: dict[str, Any]) -> dict[str, list[OperatorTime]]:
    """The runtime phase's profile stage's details: per method, its operators by time."""
    return {name: [OperatorTime(name=str(op["name"]), calls=int(op["calls"]), total_ms=float(op["total_ms"]),
                                share=float(op["share"])) for op in found.get("operators", [])]
            for name, found in details.get("methods", {}).items() if isinstance(found, dict)}


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendTry:
    """One method lowered, export only, for another backend of the stack."""

    status: str  # ok, failed, unavailable, not tried
    why: str = ""  # the error or the reason, when not ok
    delegated_nodes: int = 0
    portable_nodes: int = 0
    partitions: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> BackendTry:
        return cls(status=str(details.get("status", "?")), why=str(details.get("error") or details.get("reason") or ""),
                   delegated_nodes=int(details.get("delegated_nodes", 0)),
                   portable_nodes=int(details.get("portable_nodes", 0)),
                   partitions=int(details.get("delegate_partitions", 0)), bytes=int(details.get("bytes", 0)),
                   seconds=float(details.get("seconds", 0.0)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Culprit:
    """A submodule that fails to export on its own (compat/search/localize.py)."""

    module: str
    class_name: str
    error_type: str
    message: str
    source: str | None = None  # the user's source line the exporter names (through FX-generated code)
    operator: str | None = None
    same_failure_in: tuple[str, ...] = ()

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> Culprit:
        return cls(module=str(details.get("module", "?")), class_name=str(details.get("class", "?")),
                   error_type=str(details.get("type", "?")), message=str(details.get("message") or ""),
                   source=details.get("source"), operator=details.get("operator"),
                   same_failure_in=tuple(details.get("same_failure_in") or ()))


@dataclass(frozen=True, kw_only=True, slots=True)
class Localization:
    """Where a failed quantization or export breaks: the smallest submodules that fail alone."""

    method: str
    attempt: str  # the stage tried on each submodule alone: "quantize" or "export"
    culprits: tuple[Culprit, ...]
    attempts: int
    seconds: float
    complete: bool  # False: stopped at the budget
    budget_s: float
    # Its first culprit as a standalone reproducer (compat/export_phase.py), its folder relative to the model's
    # record folder and its runs there as a diagnosis's are, (args, exit, what it printed); or why none was written.
    reproducer: str | None = None
    reproducer_of: str = "lowering"  # what it runs: "quantize" (the recipe), "export" or "lowering"
    reproducer_runs: tuple[tuple[str, int, str], ...] = ()
    reproducer_problem: str = ""

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> Localization:
        written = details.get("reproducer") or {}
        return cls(method=str(details.get("method", "forward")), attempt=str(details.get("attempt", "export")),
                   culprits=tuple(Culprit.from_details(c) for c in details.get("culprits", [])),
                   attempts=int(details.get("attempts", 0)), seconds=float(details.get("seconds", 0.0)),
                   complete=bool(details.get("complete", True)), budget_s=float(details.get("budget_s", 0.0)),
                   reproducer=str(written["folder"]) if written.get("folder") else None,
                   # A record written before it said, by its attempt: a recipe's, or a block's lowering.
                   reproducer_of=str(written.get("of") or ("quantize" if details.get("attempt") == "quantize"
                                                            else "lowering")),
                   reproducer_runs=tuple((" ".join(r.get("args", [])), int(r.get("exit", -1)), str(r.get("said", "")))
                                         for r in written.get("runs", [])),
                   reproducer_problem=str(written.get("why", "")))


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratedText:
    """An end-to-end generation loop's answers, prompt by prompt."""

    prompts: tuple[str, ...]
    text: tuple[str, ...]


# -- one stack, one model ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StackResults(StagesOf, codec.Record):
    """Everything one stack produced for one model: its stages and measurements."""

    record_dir: str  # relative to the report folder
    stages: tuple[Stage, ...]
    # Per thread count, in the configured order: summaries (the samples stay in measurements/).
    measured: dict[int, Measured]
    export_peak_rss_bytes: int | None = None
    runtime_phase_peak_rss_bytes: int | None = None
    cache: dict[str, CacheUse] = field(default_factory=dict)  # per phase
    # Files of the report folder that are not what the stages recorded (truncated, corrupt, missing).
    damaged: tuple[str, ...] = ()
    # Where the artifact departed from its own eager model: the operators behind it (None: not run).
    diagnosis: Diagnosis | None = None
    # A candidate measured with its remedy (measured.remedied), per thread count: judged by the latency gate as
    # ``measured`` is (judge/_remedies.py); empty where it was not timed.
    remedied_measured: dict[int, Measured] = field(default_factory=dict)

    # Derived, for readers of the file; not read back.
    DERIVED = (codec.derived("artifact"), codec.derived("planned_memory_bytes"), codec.derived("runtime_memory_bytes"))

    def reused_phases(self) -> list[str]:
        return [phase for phase, use in self.cache.items() if use.reused_from]

    @property
    def fixtures(self) -> dict[str, str] | None:
        """The weights and inputs hashes this stack loaded (the build stage's)."""
        return self.details_of("build").get("fixtures")

    @property
    def task_kind(self) -> str | None:
        return self.details_of("build").get("task")

    @property
    def artifact_bytes(self) -> int | None:
        return int(self.artifact["bytes"]) if self.artifact else None

    def method_bytes(self, method: str) -> int | None:
        """None where the method has no artifact of its own (not saved, or in the multi-method program)."""
        saved = ((self.artifact or {}).get("methods") or {}).get(method) or {}
        if not saved.get("bytes") or saved.get("file") == (self.artifact or {}).get("program"):
            return None
        return int(saved["bytes"])

    @property
    def skipped_variant(self) -> bool:
        """This stack has no recipe for the quantized variant: nothing was made."""
        quantize = self.stage("quantize")
        return quantize is not None and quantize.status == "skipped"

    @property
    def recipe(self) -> str | None:
        """The quantization each method really got: the legacy recipe falls back to dynamic where FX cannot trace."""
        quantize = self.stage("quantize")
        if quantize is None:
            return "float"
        used = [m.get("recipe", "") for m in (quantize.details.get("methods") or {}).values()]
        return " / ".join(dict.fromkeys(used)) or quantize.details.get("recipe")

    @property
    def delegation(self) -> dict[str, Delegation]:
        """Per method, where the stack delegates (none for the Lite Interpreter)."""
        found = {name: Delegation.from_details(d) for name, d in self.details_of("export").get("methods", {}).items()
                 if isinstance(d, dict)}
        return {name: d for name, d in found.items() if d is not None}

    @property
    def export_details(self) -> dict[str, Any]:
        return self.details_of("export")

    @property
    def planned_memory_bytes(self) -> dict[str, int] | None:
        """Each method's memory-planned buffers (ExecuTorch), from the export; None where the runtime has no plan."""
        export = self.details_of("export")
        planned = {name: sum(d["planned_memory_bytes"].values())
                   for name, d in export.get("methods", {}).items()
                   if isinstance(d, dict) and isinstance(d.get("planned_memory_bytes"), dict)}
        # A multi-method program's plan is the program's, by method.
        in_program = (export.get("program") or {}).get("planned_memory_bytes")
        if isinstance(in_program, dict):
            planned.update({str(name): int(size) for name, size in in_program.items()})
        return planned or None

    @property
    def program(self) -> tuple[str, int, tuple[str, ...]] | None:
        """The multi-method artifact every method is in: file, bytes, methods."""
        saved = self.artifact or {}
        if not saved.get("program"):
            return None
        return str(saved["program"]), int(saved.get("bytes", 0)), tuple(saved.get("methods") or ())

    @property
    def profile(self) -> dict[str, list[OperatorTime]]:
        """Per method, operators by time in the stack's own runtime (the runtime phase's profile stage)."""
        return operator_profile(self.details_of("profile"))

    @property
    def other_backends(self) -> dict[str, dict[str, BackendTry]]:
        """Export-only tries of the stack's other backends: backend → method → outcome."""
        return {backend: {method: BackendTry.from_details(d) for method, d in methods.items()}
                for backend, methods in self.details_of("backends").get("backends", {}).items()
                if isinstance(methods, dict)}

    @property
    def localized(self) -> Localization | None:
        """Where a failed export breaks (compat/search/localize.py)."""
        details = self.details_of("localize")
        return Localization.from_details(details) if details else None

    def generated(self, which: str) -> GeneratedText | None:
        """What the generation loop answered: ``eager`` (export phase) or ``artifact`` (runtime phase)."""
        details = self.details_of("eager-task" if which == "eager" else "task")
        if not details:
            return None
        return GeneratedText(prompts=tuple(str(p) for p in details.get("prompts", [])),
                             text=tuple(str(t) for t in details.get("text", [])))

    @property
    def latency(self) -> dict[str, LatencySummary] | None:
        """Per method at the first thread count (the budgets' and the matrix's)."""
        first = next(iter(self.measured.values()), None)
        return first.latency if first and first.latency else None

    @property
    def runtime_memory_bytes(self) -> int | None:
        """The most loading and running took, over the thread counts."""
        values = [m.runtime_memory_bytes for m in self.measured.values() if m.runtime_memory_bytes is not None]
        return max(values) if values else None
