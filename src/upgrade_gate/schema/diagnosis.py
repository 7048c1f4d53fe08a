"""The diagnose phase's results for one stack and model: per method, the operators behind a departure, the
remedies tried, and the remedy kept, as the worker's stage details say them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from upgrade_gate.schema import codec
from upgrade_gate.schema.comparison import Comparison
from upgrade_gate.schema.measured import RatioEstimate, ratio_by_rounds
from upgrade_gate.schema.records import Stage, StagesOf


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheUse(codec.Record):
    """A phase's key in the result cache, and the entry its files came from (None: made by this run)."""

    key: str | None
    reused_from: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CulpritCall:
    """One call of a culprit operator: where the model makes it."""

    module: str | None
    source: str | None
    share: float | None = None  # of the error, keeping this call out alone (when it is not the only one)
    # A load failure's call: how each input's quantization departs from the output's ("input 0: float").
    inputs: tuple[str, ...] = ()

    def where(self) -> str:
        if not self.module and not self.source:
            return "the whole method"  # a pass of the lowering, not an operator
        return f"{f'`{self.module}`' if self.module else 'the model itself'}, " \
               f"{f'at {self.source}' if self.source else 'at a line torch did not record'}"


@dataclass(frozen=True, kw_only=True, slots=True)
class CulpritOperator:
    """An operator whose lowering makes the artifact depart from eager (compat/search/culprit.py)."""

    operator: str  # "aten.gelu.default(approximate='tanh')"
    backend: str  # what runs it in the artifact: "XNNPACK delegate"
    calls: tuple[CulpritCall, ...]
    share: float  # of the error that keeping it out takes off
    rel_l2_without: float
    rel_l2_alone: float | None  # the operator alone on its real inputs
    # Where it passes alone: the operator the backend fuses it with, "following" or "preceding" it, that one's error
    # alone, and the pair's alone on the real tensors that reached it (the fusion is the culprit).
    fused_with: str = ""
    fused_position: str = ""
    fused_with_alone: float | None = None
    fused_rel_l2: float | None = None

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> CulpritOperator:
        alone = details.get("rel_l2_alone")
        fused = details.get("fused_with") or {}
        return cls(operator=str(details.get("operator", "?")), backend=str(details.get("backend", "?")),
                   calls=tuple(CulpritCall(module=c.get("module"), source=c.get("source"), share=c.get("share"),
                                           inputs=tuple(str(i) for i in c.get("inputs") or ()))
                               for c in details.get("calls", [])),
                   share=float(details.get("share", 0.0)), rel_l2_without=float(details.get("rel_l2_without", 0.0)),
                   rel_l2_alone=None if alone is None else float(alone),
                   fused_with=str(fused.get("operator", "")), fused_position=str(fused.get("position", "")),
                   fused_with_alone=_number(fused.get("rel_l2_alone")), fused_rel_l2=_number(fused.get("rel_l2_fused")))

    @property
    def named(self) -> str:
        """The operator, or the fusion, as compat/search/culprit.py ``named`` says it in the reproducer."""
        return f"{self.operator} fused with the {self.fused_position} {self.fused_with}" if self.fused_with \
            else self.operator


@dataclass(frozen=True, kw_only=True, slots=True)
class TriedRemedy:
    """One remedy the diagnose phase tried for a method (compat/diagnose/remedy_trial.py ``run_trial``): what it
    does, and how it fared lowered, saved, loaded and run against the stack's own eager model."""

    remedy: str  # "rewritten into operators the delegate takes", "kept out of the delegate" …
    passes: bool
    rel_l2: float | None = None
    error: str = ""  # the step that failed and its error
    bytes: int | None = None
    latency: RatioEstimate | None = None  # remedied over shipped (timed only when it passes)

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> TriedRemedy:
        return cls(remedy=str(details.get("remedy", "?")), passes=bool(details.get("passes")),
                   rel_l2=_number(details.get("rel_l2")), error=str(details.get("error") or ""),
                   bytes=details.get("bytes"),
                   latency=_remedy_latency(details))


def _number(value: Any) -> float | None:
    """A measure the worker wrote, as a float: a non-finite one is text ("inf": a lowering that failed)."""
    return None if value is None else float(value)


def _remedy_latency(details: dict[str, Any]) -> RatioEstimate | None:
    rounds = (details.get("latency") or {}).get("rounds") or []
    return ratio_by_rounds([r.get("remedied", []) for r in rounds], [r.get("shipped", []) for r in rounds])


@dataclass(frozen=True, kw_only=True, slots=True)
class MethodDiagnosis:
    """What the culprit search found for one method, its reproducer, and the remedy checked."""

    method: str
    status: str  # found, combination, not pinned, stopped at budget, does not reproduce, not searched
    reason: str = ""
    rel_l2: float | None = None  # the artifact lowered again, as found
    culprits: tuple[CulpritOperator, ...] = ()
    lowerings: int = 0  # lowerings the search tried (a kept-float search: quantizations)
    # Where the search lowered the method's first repeated block as a program of its own (compat/diagnose/blocks.py):
    # its path and how many blocks the method has; empty where it lowered the whole method.
    block: str = ""
    blocks: int = 0
    # A kept-float search's: the layers the recipe quantizes, and the units it ranked (parent modules of
    # several layers where the budget could not try each).
    layers: int = 0
    units: int = 0
    # A failed export's search: the option that exports the method, what it assumed of the example inputs,
    # and each option tried before it ("strict: export: Unsupported: …"); a failed quantization's, the capture's.
    export_option: str | None = None
    assumed: tuple[str, ...] = ()
    export_tries: tuple[str, ...] = ()
    reproducer: str | None = None  # its folder, relative to the diagnose folder
    # "operator" (alone on its real tensors), "fusion" (a fused pair alone on them), "block" (the block searched) or
    # "method" (the whole method)
    reproducer_scope: str = ""
    reproducer_note: str = ""  # why it is the whole method, or the block
    # The reproducer run where it was written: (its arguments, exit status, last line printed), as lowered first.
    reproducer_runs: tuple[tuple[str, int, str], ...] = ()
    issue: str | None = None  # ISSUE.md beside it: the text to file upstream
    remedy_code: str | None = None
    # Where the search found nothing to keep out: the method whose remedy was tried here, as written
    # (compat/search/culprit.py carried_over), else empty.
    remedy_found_in: str = ""
    remedy_kind: str = ""  # what the chosen remedy does (one of ``remedies_tried``)
    remedies_tried: tuple[TriedRemedy, ...] = ()  # in the order tried, the chosen one among them
    # The options after them, not lowered: (what it does, why not: one before it passes, not clearly slower than the
    # latency gate).
    remedies_not_tried: tuple[tuple[str, str], ...] = ()
    remedy_rel_l2: float | None = None  # against the stack's own eager model (the worker's check)
    remedy_passes: bool | None = None
    remedy_error: str = ""  # the remedy's code did not lower, save, load or run: the step and the error
    remedy_file: str | None = None  # the remedied artifact, relative to the report folder
    remedy_bytes: int | None = None
    remedy_sha256: str | None = None  # what a migration's export script rebuilds (upgrade_gate.migrate)
    remedy_cosine: float | None = None  # a kept-float search's: the worst output's, against the float model
    # Remedied over shipped latency, from calls in turns in one process; or why there is none.
    latency: RatioEstimate | None = None
    latency_note: str = ""
    latency_threads: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnosis(StagesOf, codec.Record):
    """The diagnose phase of one stack and model (compat/diagnose/diagnose_phase.py), for the methods whose
    artifact departed from the stack's own eager model."""

    record_dir: str  # relative to the report folder
    stages: tuple[Stage, ...]
    cache: CacheUse | None = None
    # The remedied artifact's outputs against the reference (judge/_comparisons.py), each method's worst rel. L2.
    remedy_against: str | None = None
    remedy_rel_l2: dict[str, float] = field(default_factory=dict)
    remedy_cosine: dict[str, float] = field(default_factory=dict)  # each method's worst
    # The candidate as the team would ship it remedied (the remedied methods' outputs, the others' as shipped,
    # a generator's loop run with the remedy) against the reference: what the remedy's gates judge.
    remedy_comparison: Comparison | None = None

    @property
    def search(self) -> str:
        """What was searched, as run/diagnosis.py's job says: ``operators`` where it names none."""
        return str(self.details_of("build").get("search") or "operators")

    @property
    def failed_at(self) -> str:
        """The runtime stage a load search's program failed at (``load``, ``run``); empty for another search."""
        return str(self.details_of("build").get("failed_at") or "")

    @property
    def keeps_float(self) -> bool:
        return self.search == "keep-float"

    @property
    def remedy_replaces(self) -> str:
        """The step of an export script the remedies' lines take the place of (compat/diagnose/remedy_trial.py
        REPLACED_STEPS): ``lowering``, ``export``, ``quantization`` or ``capture``; empty where no remedy was tried."""
        return str(self.details_of("remedy").get("replaces") or "")

    @property
    def remedy_outputs_file(self) -> str | None:
        """The remedied artifacts' outputs (relative to the report folder), named as the artifact's are."""
        name = self.details_of("remedy").get("outputs")
        return f"{self.record_dir}/{name}" if name else None

    @property
    def methods(self) -> tuple[str, ...]:
        build = self.stage("build")
        return tuple(build.details.get("methods", ())) if build is not None else ()

    @property
    def findings(self) -> list[MethodDiagnosis]:
        """Per method searched; a search that did not run is ``not searched``, with the stage that stopped it."""
        searched = self.details_of("search").get("methods", {})
        written = self.details_of("reproducer").get("methods", {})
        checked = self.details_of("remedy").get("methods", {})
        stopped = self.first_problem()
        found = []
        for method in self.methods:
            result = searched.get(method)
            if result is None:
                found.append(MethodDiagnosis(method=method, status="not searched",
                                             reason=stopped.explain() if stopped else ""))
                continue
            repro, remedy = written.get(method) or {}, checked.get(method) or {}
            searched_block = result.get("block") or {}
            timing = remedy.get("latency") or {}
            latency = _remedy_latency(remedy)
            found.append(MethodDiagnosis(
                method=method, status=str(result.get("status", "?")), reason=str(result.get("reason", "")),
                rel_l2=_number(result.get("rel_l2")),
                culprits=tuple(CulpritOperator.from_details(c) for c in result.get("culprits", [])),
                lowerings=len(result.get("tried", [])), layers=int(result.get("layers", 0)),
                block=str(searched_block.get("path", "")), blocks=int(searched_block.get("of", 0)),
                units=len(result.get("units", [])), export_option=result.get("option"),
                assumed=tuple(str(a) for a in result.get("assumed", ())),
                export_tries=tuple(f"{t.get('option')}: {t.get('step')}: {t.get('error')}"
                                   for t in result.get("tried", []) if isinstance(t, dict) and t.get("ok") is False),
                reproducer=repro.get("folder"), reproducer_scope=str(repro.get("scope", "operator")),
                reproducer_note=str(repro.get("reason", "")),
                reproducer_runs=tuple((" ".join(r.get("args", [])), int(r.get("exit", -1)), str(r.get("said", "")))
                                      for r in repro.get("runs", ())),
                issue=repro.get("issue"),
                remedy_code=remedy.get("code"), remedy_kind=str(remedy.get("remedy", "")),
                remedy_found_in=str(remedy.get("found_in") or ""),
                remedies_tried=tuple(TriedRemedy.from_details(t) for t in remedy.get("tried", ())),
                remedies_not_tried=tuple((str(t.get("remedy", "?")), str(t.get("reason", "")))
                                         for t in remedy.get("not_tried", ())),
                remedy_rel_l2=remedy.get("rel_l2"), remedy_passes=remedy.get("passes"),
                remedy_error=str(remedy.get("error") or ""),
                remedy_file=f"{self.record_dir}/{remedy['file']}" if remedy.get("file") else None,
                remedy_bytes=remedy.get("bytes"), remedy_sha256=remedy.get("sha256"),
                remedy_cosine=remedy.get("cosine"),
                latency=latency, latency_note=str(timing.get("reason") or ("" if latency else "no timed rounds")),
                latency_threads=timing.get("threads")))
        return found
