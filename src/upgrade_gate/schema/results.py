"""The results schema: every record of a report's results.json and verdict.json.

Each record is a frozen dataclass with its ``to_dict`` and ``from_reader``
beside it (Polygraphy's comparator/struct.py pattern); the values inside them
that other modules compute keep their own pair there (metrics.OutputMetrics,
stats.LatencySummary and RatioEstimate, tasks.TaskAgreement,
project.ProjectResults). compare.py builds these records from the workers'
files, policy.py adds the gates and the verdict, and every renderer — report.md
and report.html (report.py), junit.xml and the step summary (junit.py), ``nox
-s diff`` (diff.py) — reads them, never the JSON. A report written by another
run is read back with ``Results.load``, which refuses another major version.

Views of a stage's details (delegation, profile, other backends, where an
export breaks) are typed here too: the worker writes them as free-form details,
this module is the one place that reads their keys.

One module on purpose, though longer than most: the schema is read in one place.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from upgrade_gate import text
from upgrade_gate.config.settings import Settings
from upgrade_gate.errors import EXIT_GO, EXIT_INCOMPLETE, EXIT_NO_GO, ConfigError, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.judge.agreement import HEADLINE, TaskAgreement
from upgrade_gate.judge.numerics import OutputMetrics
from upgrade_gate.judge.records import Reader, Stage, StagesOf
from upgrade_gate.measure.stats import LatencySummary, RatioEstimate, fewest_rounds
from upgrade_gate.project.session import ProjectResults
from upgrade_gate.run import packages

# 2.0: gates keep their outcome as an enum and their numbers as numbers; 1.x wrote prose.
# 2.1: gates keep their warnings; compared outputs the reference's range; each stack's packages and
# extra requirements; the project's warnings and test venvs' packages (2.0 files read without them).
SCHEMA_VERSION = Version("2.1")


def check_version(reader: Reader, path: Path | str) -> None:
    """Read the same major version only: another's records mean other things."""
    found = reader.data.get("schema_version") if isinstance(reader.data, dict) else None
    try:
        version = Version(str(found))
    except InvalidVersion:
        version = None
    if version is None or version.major != SCHEMA_VERSION.major:
        raise RecordError(f"{path}: results schema {found!r}; this upgrade-gate reads {SCHEMA_VERSION.major}.x — "
                          f"write the report again with this version (`{command('report', '--out DIR')}`)")


# How a comparison whose reference has NaN or Inf says so (``Comparison.reference_not_finite``).
NOT_FINITE_REFERENCE = "the reference output is not finite"


# -- outcomes ----------------------------------------------------------------------


class Verdict(str, Enum):
    """Per candidate and overall (the worst candidate's); policy.py has the table.

    INCOMPLETE is the tool's, not the candidate's: the evidence could not be
    gathered (an interrupted run, a damaged report folder, a measurement that
    never ran). It ranks below NO-GO — a hard failure the evidence does show
    decides whatever else is missing — and above every verdict it could hide.
    """

    GO = "GO"
    GO_WITH_CONDITIONS = "GO-WITH-CONDITIONS"
    INCOMPLETE = "INCOMPLETE"
    NO_GO = "NO-GO"

    @property
    def rank(self) -> int:
        return list(Verdict).index(self)

    @property
    def exit_code(self) -> int:
        return {Verdict.NO_GO: EXIT_NO_GO, Verdict.INCOMPLETE: EXIT_INCOMPLETE}.get(self, EXIT_GO)

    def __str__(self) -> str:
        return self.value


class GateStatus(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    # The evidence does not decide (a latency interval straddles the threshold): not a failure.
    INCONCLUSIVE = "inconclusive"
    # The baseline could not give what the gate compares with (its export or measurement
    # failed): neither the candidate's failure nor its pass.
    NOT_COMPARABLE = "not comparable"
    # Another of the model's gates failed and took this one's evidence with it: that
    # gate is the root cause, counted once; this one is listed, not counted.
    BLOCKED = "blocked"
    # The evidence was not gathered for a reason that is not the candidate's: the run
    # was interrupted, a file of the report folder is damaged, a session did not run.
    INCOMPLETE = "incomplete"

    @property
    def label(self) -> str:
        """As console lines and tables show it: a failure stands out."""
        return "FAILED" if self is GateStatus.FAILED else self.value

    @property
    def decided(self) -> bool:
        """Passed or failed on evidence that was there to judge."""
        return self in (GateStatus.PASSED, GateStatus.FAILED)

    def __bool__(self) -> bool:
        """True unless the gate failed (nox's Status does the same)."""
        return self is not GateStatus.FAILED

    def __str__(self) -> str:
        return self.label


class Severity(str, Enum):
    HARD = "hard"  # a failure is NO-GO
    SOFT = "soft"  # a failure is a condition

    def __str__(self) -> str:
        return self.value


class Unit(str, Enum):
    """What a gate's number counts; each is written one way (``format``)."""

    REL_L2 = "rel_l2"  # ‖actual − reference‖ / ‖reference‖
    RATIO = "ratio"  # candidate / baseline
    BYTES = "bytes"
    MIB = "MiB"
    MS = "ms"
    DB = "dB"
    SHARE = "share"  # a fraction of a whole, shown in percent
    AGREEMENT = "agreement"  # a fraction of items that agree
    COSINE = "cosine"
    COUNT = "count"

    def show(self, value: float) -> str:
        if self is Unit.REL_L2:
            return f"{value:.2e}"
        if self is Unit.BYTES:
            return text.exact_size(value)
        if self is Unit.MIB:
            return f"{value:.1f} MiB"
        if self is Unit.MS:
            return f"{value:.3f} ms"
        if self is Unit.DB:
            return "∞ dB" if math.isinf(value) and value > 0 else f"{value:.1f} dB"
        if self is Unit.SHARE:
            return f"{value:.1%}"
        if self is Unit.COSINE:
            return f"{value:.6f}"
        if self is Unit.COUNT:
            return str(int(value))
        return f"{value:.3f}"  # ratio, agreement


@dataclass(frozen=True, kw_only=True, slots=True)
class Quantity:
    """A number with its unit, and its interval where it has one."""

    value: float
    unit: Unit
    low: float | None = None
    high: float | None = None
    level: float | None = None  # the interval's coverage: what it says, it says with this probability

    def __str__(self) -> str:
        shown = self.unit.show(self.value)
        if self.low is not None and self.high is not None:
            interval = f"[{self.unit.show(self.low)}, {self.unit.show(self.high)}]"
            shown += f", {self.level:.1%} interval {interval}" if self.level is not None else f" {interval}"
        return shown

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit.value, "low": self.low, "high": self.high, "level": self.level}

    @classmethod
    def from_reader(cls, r: Reader) -> Quantity:
        return cls(value=r.number("value"), unit=_enum(Unit, r, "unit"), low=r.opt_number("low"),
                   high=r.opt_number("high"), level=r.opt_number("level"))


def _enum(kind: Any, r: Reader, key: str) -> Any:
    value = r.text(key)
    try:
        return kind(value)
    except ValueError:
        raise RecordError(f"Unknown {key} {value!r} in '{r.where}.{key}'; expected one of "
                          f"{', '.join(member.value for member in kind)}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class GateResult:
    """One gate for one candidate and model: its outcome, the number it measured
    and the limit it holds that number to (same unit), and what the numbers do
    not say — where it was measured, or why there is no number."""

    gate: str
    stack: str
    model: str
    severity: Severity
    status: GateStatus
    metric: str  # what is measured: "rel_l2", "ratio", "size" …
    measured: Quantity | None = None  # None: not measured, or a yes/no gate
    op: str = ""  # "≤" or "≥": how ``measured`` must stand to ``threshold``
    threshold: Quantity | None = None
    condition: str = ""  # the rest of the rule, in words
    note: str = ""  # where the number comes from, or why there is none
    evidence: str = ""  # the record or comparison it comes from
    blocked_by: str = ""  # the gate whose failure took this one's evidence (status blocked)
    # What the outcome does not say, whatever it is: e.g. a reference output too flat to compare with.
    warnings: tuple[str, ...] = ()

    @property
    def measured_text(self) -> str:
        """The number and where it comes from; a warning goes with the number it qualifies."""
        shown = self.note if self.measured is None else (
            f"{self.metric} = {self.measured}" + (f" ({self.note})" if self.note else ""))
        return shown + "".join(f" ⚠ {warning}" for warning in self.warnings)

    @property
    def threshold_text(self) -> str:
        if self.threshold is None:
            return self.condition
        rule = f"{self.metric} {self.op} {self.threshold}"
        if not self.condition:
            return rule
        # "… and cosine ≥ 0.99", "… or at most 16 MiB more" continue the rule; anything else qualifies it.
        joiner = " " if self.condition.startswith(("and ", "or ")) else ", "
        return rule + joiner + self.condition

    def __str__(self) -> str:
        """The greppable console line."""
        return (f"{self.status.label:6} | {self.severity} | {self.gate} | {self.stack} | {self.model} | "
                f"{self.measured_text} (threshold {self.threshold_text})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate, "stack": self.stack, "model": self.model, "severity": self.severity.value,
            "status": self.status.value, "metric": self.metric,
            "measured": self.measured.to_dict() if self.measured else None, "op": self.op,
            "threshold": self.threshold.to_dict() if self.threshold else None,
            "condition": self.condition, "note": self.note, "evidence": self.evidence, "blocked_by": self.blocked_by,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_reader(cls, r: Reader) -> GateResult:
        measured, threshold = r.child("measured"), r.child("threshold")
        return cls(gate=r.text("gate"), stack=r.text("stack"), model=r.text("model"),
                   severity=_enum(Severity, r, "severity"), status=_enum(GateStatus, r, "status"),
                   metric=r.text("metric"), measured=Quantity.from_reader(measured) if measured else None,
                   op=r.text("op"), threshold=Quantity.from_reader(threshold) if threshold else None,
                   condition=r.text("condition"), note=r.text("note"), evidence=r.text("evidence"),
                   blocked_by=r.text("blocked_by"), warnings=r.texts("warnings"))


@dataclass(frozen=True, kw_only=True, slots=True)
class BaselineFinding:
    """What is already wrong with what ships today, whatever the verdict: a model whose
    baseline artifact departs from the baseline's own eager outputs by more than the
    numerics gate lets a candidate, or one the baseline stack cannot export, run or measure."""

    model: str
    output: str = ""
    rel_l2: float | None = None
    max_rel_l2: float | None = None
    task: dict[str, float] = field(default_factory=dict)  # the task's headline value, by name
    failure: str = ""  # the baseline's stage that did not succeed, when it is one
    # A quantized variant's own artifact against the fp32 reference, by the quantized-numerics gate's
    # thresholds: its worst SNR and cosine, and theirs (rel_l2 is the float models' measure).
    snr_db: float | None = None
    min_snr_db: float | None = None
    cosine: float | None = None
    # Not "min_cosine": that is the embedding task's headline, which to_dict writes beside these.
    gate_min_cosine: float | None = None

    def __str__(self) -> str:
        if self.failure:
            return f"**{self.model}**: {self.failure}"
        if self.snr_db is not None:
            shown = (f"**{self.model}**: SNR = {text.num(self.snr_db, '{:.1f}')} dB ({self.output}), cosine "
                     f"{text.num(self.cosine, '{:.5f}')}, against the fp32 reference: under the quantized gate's "
                     f"{text.num(self.min_snr_db, '{:g}')} dB and {text.num(self.gate_min_cosine, '{:g}')}")
        else:
            shown = (f"**{self.model}**: rel_l2 = {text.num(self.rel_l2)} ({self.output}), over the "
                     f"{text.num(self.max_rel_l2, '{:.1e}')} gate")
        return shown + "".join(f"; {key.replace('_', ' ')} {value:.3f}" for key, value in self.task.items())

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "output": self.output, "rel_l2": self.rel_l2, "max_rel_l2": self.max_rel_l2,
                "snr_db": self.snr_db, "min_snr_db": self.min_snr_db, "cosine": self.cosine,
                "gate_min_cosine": self.gate_min_cosine, "failure": self.failure, **self.task}

    @classmethod
    def from_reader(cls, r: Reader) -> BaselineFinding:
        headlines = {key for key, _ in HEADLINE.values()}
        return cls(model=r.text("model"), output=r.text("output"), rel_l2=r.opt_number("rel_l2"),
                   max_rel_l2=r.opt_number("max_rel_l2"), failure=r.text("failure"),
                   snr_db=r.opt_number("snr_db"), min_snr_db=r.opt_number("min_snr_db"),
                   cosine=r.opt_number("cosine"), gate_min_cosine=r.opt_number("gate_min_cosine"),
                   task={key: r.number(key) for key in r.data if key in headlines})


@dataclass(frozen=True, kw_only=True, slots=True)
class VerdictRecord:
    """verdict.json: the verdict per candidate and overall, and every gate."""

    tool_version: str
    generated_at: str
    verdict: Verdict
    baseline: str
    candidates: dict[str, Verdict]
    gates: tuple[GateResult, ...]
    baseline_findings: tuple[BaselineFinding, ...] = ()
    warnings: tuple[str, ...] = ()
    # Why the evidence is incomplete, each reason once, and what to do about it.
    incomplete: tuple[str, ...] = ()

    def of(self, stack: str) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if g.stack == stack)

    @property
    def gate_warnings(self) -> tuple[str, ...]:
        """Every gate's warnings, each naming its model, stack and gate."""
        return tuple(f"{g.model} ({g.stack}, {g.gate}): {warning}" for g in self.gates for warning in g.warnings)

    @property
    def not_passed(self) -> tuple[GateResult, ...]:
        """Failed first, hard before soft; then the incomplete, inconclusive, not comparable and blocked ones."""
        order = [GateStatus.FAILED, GateStatus.INCOMPLETE, GateStatus.INCONCLUSIVE, GateStatus.NOT_COMPARABLE,
                 GateStatus.BLOCKED]
        found = [g for g in self.gates if g.status is not GateStatus.PASSED]
        return tuple(sorted(found, key=lambda g: (order.index(g.status), g.severity is not Severity.HARD)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": str(SCHEMA_VERSION), "tool_version": self.tool_version,
            "generated_at": self.generated_at, "verdict": self.verdict.value, "baseline": self.baseline,
            "candidates": {name: verdict.value for name, verdict in self.candidates.items()},
            "gates": [g.to_dict() for g in self.gates],
            # Not gates: the baseline is what ships today; these say where it is already off.
            "baseline_findings": [f.to_dict() for f in self.baseline_findings],
            "warnings": list(self.warnings),
            "incomplete": list(self.incomplete),
        }

    @classmethod
    def from_reader(cls, r: Reader) -> VerdictRecord:
        candidates = r.required_child("candidates")
        return cls(tool_version=r.text("tool_version"), generated_at=r.text("generated_at"),
                   verdict=_enum(Verdict, r, "verdict"), baseline=r.text("baseline"),
                   candidates={name: _enum(Verdict, candidates, name) for name in candidates.data},
                   gates=tuple(GateResult.from_reader(g) for g in r.children("gates")),
                   baseline_findings=tuple(BaselineFinding.from_reader(f) for f in r.children("baseline_findings")),
                   warnings=r.texts("warnings"), incomplete=r.texts("incomplete"))


# -- comparisons ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Side:
    """One tensor set: a stack's eager reference or its artifact's outputs."""

    stack: str
    kind: str  # "eager" | "artifact"

    KINDS = ("eager", "artifact")

    def __str__(self) -> str:
        return f"{self.kind}({self.stack})"

    @classmethod
    def parse(cls, shown: str) -> Side:
        """The inverse of ``str``: ``Side.parse(str(side)) == side``."""
        match = _SIDE.fullmatch(shown)
        if match is None:
            raise ValueError(f"not a side: {shown!r} (expected eager(<stack>) or artifact(<stack>))")
        return cls(kind=match[1], stack=match[2])


_SIDE = re.compile(r"(eager|artifact)\((.+)\)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    purpose: str
    actual: Side
    reference: Side
    outputs: tuple[OutputMetrics, ...] | None  # None: one side has no outputs
    missing: str | None = None  # why it could not be computed
    task: TaskAgreement | None = None
    task_missing: str | None = None
    absent: tuple[Side, ...] = ()  # the sides that have no outputs (their stage did not succeed)
    damaged: str | None = None  # a file of the report folder that does not read: the tool's problem, not a side's

    @property
    def label(self) -> str:
        return f"{self.actual} vs {self.reference}"

    @property
    def comparable_outputs(self) -> tuple[OutputMetrics, ...]:
        return tuple(o for o in self.outputs or () if o.comparable)

    @property
    def worst_output(self) -> OutputMetrics | None:
        """The output with the largest relative L2 error; None if any output is incomparable."""
        if not self.outputs or not all(o.comparable for o in self.outputs):
            return None
        return max((o for o in self.outputs if o.rel_l2 is not None), key=lambda o: o.rel_l2 or 0.0, default=None)

    @property
    def worst_rel_l2(self) -> float | None:
        worst = self.worst_output
        return worst.rel_l2 if worst else None

    @property
    def reference_not_finite(self) -> str | None:
        """Why the reference cannot judge anything: an output of it is NaN or Inf (the model's
        or its inputs' doing, not the artifact's); None when every reference output is finite."""
        bad = [o.name for o in self.outputs or () if not o.reference_finite]
        if not bad:
            return None
        return (f"{NOT_FINITE_REFERENCE} ({self.reference}: {', '.join(bad)}): the model or its inputs give NaN or "
                "Inf — fix them; no artifact can be judged against it")

    def why_incomparable(self) -> str:
        if self.missing:
            return self.missing
        if self.reference_not_finite:
            return self.reference_not_finite
        for output in self.outputs or ():
            if not output.shape_match:
                return f"{output.name}: shape {list(output.shape)} vs reference {list(output.reference_shape)}"
            if not output.finite:
                return f"{output.name}: NaN or Inf in the outputs"
        return "no outputs"

    def to_dict(self) -> dict[str, Any]:
        return {
            "purpose": self.purpose,
            "actual": str(self.actual),
            "reference": str(self.reference),
            "missing": self.missing,
            # Derived, for readers of the file; not read back.
            "worst_rel_l2": self.worst_rel_l2,
            "worst_output": self.worst_output.name if self.worst_output else None,
            "outputs": [o.to_dict() for o in self.outputs] if self.outputs is not None else None,
            "task": self.task.to_dict() if self.task else None,
            "task_missing": self.task_missing,
            "absent": [str(side) for side in self.absent],
            "damaged": self.damaged,
        }

    @classmethod
    def from_reader(cls, r: Reader) -> Comparison:
        outputs, task = r.opt_children("outputs"), r.child("task")
        return cls(purpose=r.text("purpose"), actual=_side(r, "actual"), reference=_side(r, "reference"),
                   outputs=None if outputs is None else tuple(OutputMetrics.from_reader(o) for o in outputs),
                   missing=r.opt_text("missing"), task=TaskAgreement.from_reader(task) if task else None,
                   task_missing=r.opt_text("task_missing"), damaged=r.opt_text("damaged"),
                   absent=tuple(_parse_side(text, f"{r.where}.absent") for text in r.texts("absent")))


def _side(r: Reader, key: str) -> Side:
    return _parse_side(r.text(key), f"{r.where}.{key}")


def _parse_side(shown: str, where: str) -> Side:
    try:
        return Side.parse(shown)
    except ValueError as error:
        raise RecordError(f"{error} in '{where}'") from None


# -- measurements --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """One stack at one thread count, from the measure session."""

    status: str  # "ok", "not measured", or how its measurement server ended
    problem: str | None = None
    latency: dict[str, LatencySummary] = field(default_factory=dict)  # per method, every round pooled
    rounds: dict[str, int] = field(default_factory=dict)  # per method, the rounds timed
    load_ms: float | None = None  # cold start: loading every method's artifact in a fresh process
    first_run_ms: float | None = None  # cold start: the first call of every method, summed
    runtime_memory_bytes: int | None = None  # peak RSS minus the process with only the runtime started
    peak_rss_bytes: int | None = None
    idle_rss_bytes: int | None = None
    image_input: bool = False  # a method takes images (N, C, H, W): its rate is frames per second
    host: str | None = None  # the machine that timed it

    @property
    def p50_sum_ms(self) -> float | None:
        """One call of every method, at the median: a model's latency."""
        return sum(lat.p50_ms for lat in self.latency.values()) if self.latency else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "problem": self.problem,
            "latency": {method: lat.to_dict() for method, lat in self.latency.items()},
            "rounds": dict(self.rounds),
            "cold_start": {"load_ms": self.load_ms, "first_run_ms": self.first_run_ms},
            "memory": {"runtime_bytes": self.runtime_memory_bytes, "peak_rss_bytes": self.peak_rss_bytes,
                       "idle_rss_bytes": self.idle_rss_bytes},
            "image_input": self.image_input,
            "host": self.host,
        }

    @classmethod
    def from_reader(cls, r: Reader) -> Measured:
        cold, memory = r.child("cold_start") or Reader({}, r.where), r.child("memory") or Reader({}, r.where)
        rounds = r.child("rounds") or Reader({}, r.where)
        return cls(status=r.text("status"), problem=r.opt_text("problem"),
                   latency={method: LatencySummary.from_reader(s) for method, s in r.entries("latency").items()},
                   rounds={method: rounds.integer(method) for method in rounds.data},
                   load_ms=cold.opt_number("load_ms"), first_run_ms=cold.opt_number("first_run_ms"),
                   runtime_memory_bytes=memory.opt_integer("runtime_bytes"),
                   peak_rss_bytes=memory.opt_integer("peak_rss_bytes"),
                   idle_rss_bytes=memory.opt_integer("idle_rss_bytes"), image_input=r.flag("image_input"),
                   host=r.opt_text("host"))


@dataclass(frozen=True, kw_only=True, slots=True)
class StackLoad:
    """What the rest of the machine did while one stack's part of a round was timed (measure.contention)."""

    seconds: float
    waited_share: float  # of the timed threads' time, spent waiting for a CPU
    others_cores: float
    steal_share: float
    run_queue: int

    @classmethod
    def from_reader(cls, r: Reader) -> StackLoad:
        return cls(seconds=r.number("seconds"), waited_share=r.number("waited_share"),
                   others_cores=r.number("others_cores"), steal_share=r.number("steal_share"),
                   run_queue=r.integer("run_queue"))

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "waited_share": self.waited_share, "others_cores": self.others_cores,
                "steal_share": self.steal_share, "run_queue": self.run_queue}


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundLoad:
    """One round tried: the stacks' order, their loads, and whether the rest of the machine disturbed it."""

    round: int
    order: tuple[str, ...]
    loads: dict[str, StackLoad | None]  # None: not measured here (no /proc)
    disturbed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "order": list(self.order), "disturbed": self.disturbed,
                "load": {name: load.to_dict() if load else None for name, load in self.loads.items()}}

    @classmethod
    def from_reader(cls, r: Reader) -> RoundLoad:
        return cls(round=r.integer("round"), order=r.texts("order"), disturbed=r.flag("disturbed"),
                   loads={name: StackLoad.from_reader(load) if load else None
                          for name, load in r.opt_entries("load").items()})


@dataclass(frozen=True, kw_only=True, slots=True)
class Contention:
    """The rounds of one model at one thread count: how busy the machine was, which ones count."""

    threads: int
    cores: int | None  # the machine's
    cpu: str
    rounds: tuple[RoundLoad, ...]

    @property
    def quiet(self) -> int:
        return sum(not r.disturbed for r in self.rounds)

    def quiet_rounds(self) -> set[int]:
        """The rounds whose ratios count."""
        return {r.round for r in self.rounds if not r.disturbed}

    def _loads(self) -> list[StackLoad]:
        return [load for r in self.rounds for load in r.loads.values() if load is not None]

    @property
    def typical_others(self) -> float | None:
        """The cores other processes kept busy, on average over every part of every round (weighted
        by time: a single part is counted in 10 ms clock ticks, the sum of them much finer)."""
        loads = self._loads()
        seconds = sum(load.seconds for load in loads)
        return sum(load.others_cores * load.seconds for load in loads) / seconds if seconds > 0 else None

    @property
    def typical_wait(self) -> float | None:
        """The share of the timed threads' time spent waiting for a CPU, over every part of every round."""
        loads = self._loads()
        seconds = sum(load.seconds for load in loads)
        return sum(load.waited_share * load.seconds for load in loads) / seconds if seconds > 0 else None

    @property
    def free_cores(self) -> float | None:
        others = self.typical_others
        return None if others is None or self.cores is None else max(0.0, self.cores - others)

    @property
    def busy(self) -> bool:
        """Too few quiet rounds for an interval (policy._latency_gate): the latency here is not judged."""
        return self.quiet < fewest_rounds()

    @property
    def peak_run_queue(self) -> int | None:
        return max((load.run_queue for load in self._loads()), default=None)

    @property
    def oversubscribed(self) -> bool:
        """More threads than the cores others left free: the worst case for a multi-threaded run."""
        free = self.free_cores
        return free is not None and self.threads > free + 0.05

    def summary(self) -> str:
        """One line: how many rounds counted, which did not, how busy the others kept the machine."""
        others, wait = self.typical_others, self.typical_wait
        queue = self.peak_run_queue
        disturbed = [str(r.round) for r in self.rounds if r.disturbed]
        shown = f"{self.quiet} of {len(self.rounds)} rounds quiet"
        if disturbed:
            shown += f" (disturbed: round {', '.join(disturbed)})"
        if others is not None and wait is not None:
            shown += (f"; the timed threads waited {wait:.1%} of their time for a CPU, other processes kept "
                      f"{others:.2f} of {self.cores} cores busy, the run queue reached {queue}")
        if self.oversubscribed:
            shown += f"; more threads than free cores: {self.threads} threads, {self.free_cores:.2f} cores free"
        return shown

    def to_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "cores": self.cores, "cpu": self.cpu,
                "rounds": [r.to_dict() for r in self.rounds]}

    @classmethod
    def from_reader(cls, r: Reader) -> Contention:
        return cls(threads=r.integer("threads"), cores=r.opt_integer("cores"), cpu=r.text("cpu"),
                   rounds=tuple(RoundLoad.from_reader(x) for x in r.children("rounds")))


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyRatio:
    """A candidate's latency against the baseline's for one method at one thread count, by rounds."""

    stack: str
    threads: int
    method: str
    estimate: RatioEstimate

    def to_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "threads": self.threads, "method": self.method, **self.estimate.to_dict()}

    @classmethod
    def from_reader(cls, r: Reader) -> LatencyRatio:
        return cls(stack=r.text("stack"), threads=r.integer("threads"), method=r.text("method"),
                   estimate=RatioEstimate.from_reader(r))


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


@dataclass(frozen=True, kw_only=True, slots=True)
class OperatorTime:
    name: str
    calls: int
    total_ms: float
    share: float  # of the profiled run's time


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
    """A submodule that fails to export on its own (compat/localize.py)."""

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
    """Where a failed export breaks: the smallest submodules that fail alone."""

    method: str
    culprits: tuple[Culprit, ...]
    attempts: int
    seconds: float
    complete: bool  # False: stopped at the budget
    budget_s: float

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> Localization:
        return cls(method=str(details.get("method", "forward")),
                   culprits=tuple(Culprit.from_details(c) for c in details.get("culprits", [])),
                   attempts=int(details.get("attempts", 0)), seconds=float(details.get("seconds", 0.0)),
                   complete=bool(details.get("complete", True)), budget_s=float(details.get("budget_s", 0.0)))


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratedText:
    """An end-to-end generation loop's answers, prompt by prompt."""

    prompts: tuple[str, ...]
    text: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheUse:
    """A phase's key in the result cache, and the entry its files came from (None: made by this run)."""

    key: str | None
    reused_from: str | None = None


# -- one stack, one model ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StackResults(StagesOf):
    """Everything one stack produced for one model: its stages and measurements."""

    record_dir: str  # relative to the report folder
    stages: tuple[Stage, ...]
    measured: dict[int, Measured]  # per thread count, in the configured order
    export_peak_rss_bytes: int | None = None
    runtime_phase_peak_rss_bytes: int | None = None
    cache: dict[str, CacheUse] = field(default_factory=dict)  # per phase
    # Files of the report folder that are not what the stages recorded (truncated, corrupt, missing).
    damaged: tuple[str, ...] = ()

    def reused_phases(self) -> list[str]:
        return [phase for phase, use in self.cache.items() if use.reused_from]

    def _details(self, stage: str) -> dict[str, Any]:
        found = self.stage(stage)
        return found.details if found is not None and found.ok else {}

    @property
    def fixtures(self) -> dict[str, str] | None:
        """The weights and inputs hashes this stack loaded (the build stage's)."""
        return self._details("build").get("fixtures")

    @property
    def task_kind(self) -> str | None:
        return self._details("build").get("task")

    @property
    def artifact(self) -> dict[str, Any] | None:
        """The save stage's record of the files written: bytes, and each method's file."""
        return self._details("save") or None

    @property
    def artifact_bytes(self) -> int | None:
        return int(self.artifact["bytes"]) if self.artifact else None

    @property
    def skipped_variant(self) -> bool:
        """This stack has no recipe for the quantized variant: nothing was made."""
        quantize = self.stage("quantize")
        return quantize is not None and quantize.status == "skipped"

    @property
    def recipe(self) -> str | None:
        """The quantization each method really got ("float" for the fp32 model); the
        legacy recipe falls back to dynamic quantization where FX cannot trace."""
        quantize = self.stage("quantize")
        if quantize is None:
            return "float"
        used = [m.get("recipe", "") for m in (quantize.details.get("methods") or {}).values()]
        return " / ".join(dict.fromkeys(used)) or quantize.details.get("recipe")

    @property
    def delegation(self) -> dict[str, Delegation]:
        """Per method, where the stack delegates (none for the Lite Interpreter)."""
        found = {name: Delegation.from_details(d) for name, d in self._details("export").get("methods", {}).items()
                 if isinstance(d, dict)}
        return {name: d for name, d in found.items() if d is not None}

    @property
    def export_details(self) -> dict[str, Any]:
        return self._details("export")

    @property
    def planned_memory_bytes(self) -> dict[str, int] | None:
        """Each method's memory-planned buffers (ExecuTorch), from the export; None where the runtime has no plan."""
        planned = {name: sum(d["planned_memory_bytes"].values())
                   for name, d in self._details("export").get("methods", {}).items()
                   if isinstance(d, dict) and isinstance(d.get("planned_memory_bytes"), dict)}
        return planned or None

    @property
    def program(self) -> tuple[str, int, tuple[str, ...]] | None:
        """The multi-method artifact: file, bytes, methods."""
        details = self._details("program")
        if not details:
            return None
        return str(details.get("file")), int(details.get("bytes", 0)), tuple(details.get("methods", ()))

    @property
    def profile(self) -> dict[str, list[OperatorTime]]:
        """Per method, operators by time in the stack's own runtime (the runtime phase's profile stage)."""
        return {name: [OperatorTime(name=str(op["name"]), calls=int(op["calls"]), total_ms=float(op["total_ms"]),
                                    share=float(op["share"])) for op in found.get("operators", [])]
                for name, found in self._details("profile").get("methods", {}).items() if isinstance(found, dict)}

    @property
    def other_backends(self) -> dict[str, dict[str, BackendTry]]:
        """Export-only tries of the stack's other backends: backend → method → outcome."""
        return {backend: {method: BackendTry.from_details(d) for method, d in methods.items()}
                for backend, methods in self._details("backends").get("backends", {}).items()
                if isinstance(methods, dict)}

    @property
    def localized(self) -> Localization | None:
        """Where a failed export breaks (compat/localize.py)."""
        details = self._details("localize")
        return Localization.from_details(details) if details else None

    def generated(self, which: str) -> GeneratedText | None:
        """What the generation loop answered: ``eager`` (export phase) or ``artifact`` (runtime phase)."""
        details = self._details("eager-task" if which == "eager" else "task")
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "record_dir": self.record_dir,
            "stages": [s.to_dict() for s in self.stages],
            # Raw samples stay in measurements/<model>/threads-<n>.json; summaries here.
            "measured": {str(threads): m.to_dict() for threads, m in self.measured.items()},
            "export_peak_rss_bytes": self.export_peak_rss_bytes,
            "runtime_phase_peak_rss_bytes": self.runtime_phase_peak_rss_bytes,
            "cache": {phase: {"key": use.key, "reused_from": use.reused_from} for phase, use in self.cache.items()},
            "damaged": list(self.damaged),
            # Derived, for readers of the file; not read back.
            "artifact": self.artifact,
            "planned_memory_bytes": self.planned_memory_bytes,
            "runtime_memory_bytes": self.runtime_memory_bytes,
        }

    @classmethod
    def from_reader(cls, r: Reader) -> StackResults:
        measured = r.entries("measured")
        if not all(threads.isdigit() for threads in measured):
            raise RecordError(f"a thread count that is not a number in '{r.where}.measured'")
        by_threads = {int(threads): Measured.from_reader(m) for threads, m in measured.items()}
        return cls(record_dir=r.text("record_dir"), stages=tuple(Stage.from_reader(s) for s in r.children("stages")),
                   measured=by_threads, export_peak_rss_bytes=r.opt_integer("export_peak_rss_bytes"),
                   runtime_phase_peak_rss_bytes=r.opt_integer("runtime_phase_peak_rss_bytes"),
                   cache={phase: CacheUse(key=c.opt_text("key"), reused_from=c.opt_text("reused_from"))
                          for phase, c in r.entries("cache").items()},
                   damaged=r.texts("damaged"))


# -- one model ---------------------------------------------------------------------

# A variant's name is its model's, this, and the variant: "vit-ti16@int8" (catalog.VARIANT_SEPARATOR).
_VARIANT = "@"


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelResults:
    """One model (or quantized variant) in every stack, compared."""

    name: str
    factory: str
    description: str
    source: str  # built-in or project
    variant: str  # fp32, or the quantized variant
    task_kind: str
    stacks: dict[str, StackResults]  # baseline first
    comparisons: tuple[Comparison, ...]
    ratios: tuple[LatencyRatio, ...] = ()
    contention: dict[int, Contention] = field(default_factory=dict)  # per thread count

    @property
    def base(self) -> str:
        """The model's own name: every variant shares its weights and inputs."""
        return self.name.partition(_VARIANT)[0]

    @property
    def quantized(self) -> bool:
        return self.variant != "fp32"

    def comparison(self, actual: Side, reference: Side) -> Comparison | None:
        return next((c for c in self.comparisons if c.actual == actual and c.reference == reference), None)

    def ratio(self, stack: str, threads: int, method: str) -> RatioEstimate | None:
        return next((r.estimate for r in self.ratios
                     if (r.stack, r.threads, r.method) == (stack, threads, method)), None)

    def ratios_of(self, stack: str, threads: int) -> list[RatioEstimate]:
        return [r.estimate for r in self.ratios if (r.stack, r.threads) == (stack, threads)]

    def busy_at(self, threads: int) -> Contention | None:
        """The rounds at this thread count when the machine was too busy for an interval, else None.
        A ratio made of so few rounds is no judgement: reports show none there."""
        machine = self.contention.get(threads)
        return machine if machine is not None and machine.busy else None

    @property
    def fixture_hashes(self) -> dict[str, dict[str, str] | None]:
        """Weights and inputs hashes each stack loaded: equal means same numbers in."""
        return {name: stack.fixtures for name, stack in self.stacks.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "factory": self.factory,
            "description": self.description,
            "source": self.source,
            "variant": self.variant,
            "task": self.task_kind,
            "fixtures": self.fixture_hashes,  # derived, for readers of the file
            "stacks": {name: stack.to_dict() for name, stack in self.stacks.items()},
            "comparisons": [c.to_dict() for c in self.comparisons],
            "latency_ratios": [r.to_dict() for r in self.ratios],
            "contention": [c.to_dict() for c in self.contention.values()],
        }

    @classmethod
    def from_reader(cls, r: Reader) -> ModelResults:
        return cls(name=r.text("model"), factory=r.text("factory"), description=r.text("description"),
                   source=r.text("source"), variant=r.text("variant"), task_kind=r.text("task"),
                   stacks={name: StackResults.from_reader(s) for name, s in r.entries("stacks").items()},
                   comparisons=tuple(Comparison.from_reader(c) for c in r.children("comparisons")),
                   ratios=tuple(LatencyRatio.from_reader(x) for x in r.children("latency_ratios")),
                   contention={c.threads: c for c in map(Contention.from_reader, r.children("contention"))})


# -- the stacks ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Installed:
    """What the probe found in a stack's venv."""

    python: str
    executable: str
    platform: str
    cpu: str
    cpu_count: int | None
    torch_version: str
    distributions: dict[str, str | None]  # the spec's requirements by name: version, None if absent

    def to_dict(self) -> dict[str, Any]:
        return {"python": self.python, "executable": self.executable, "platform": self.platform, "cpu": self.cpu,
                "cpu_count": self.cpu_count, "torch_version": self.torch_version,
                "distributions": dict(self.distributions)}

    @classmethod
    def from_reader(cls, r: Reader) -> Installed:
        versions = r.child("distributions") or Reader({}, r.where)
        return cls(python=r.text("python"), executable=r.text("executable"), platform=r.text("platform"),
                   cpu=r.text("cpu"), cpu_count=r.opt_integer("cpu_count"), torch_version=r.text("torch_version"),
                   distributions={name: versions.opt_text(name) for name in versions.data})


@dataclass(frozen=True, kw_only=True, slots=True)
class ExtraRequirement:
    """A requirement of [tool.upgrade-gate.extra-requirements] installed into a stack."""

    requirement: str  # as configured: "timm>=1.0", "-e ."
    distribution: str | None  # the distribution it installs; None when upgrade-gate cannot tell (packages.py)

    def to_dict(self) -> dict[str, Any]:
        return {"requirement": self.requirement, "distribution": self.distribution}

    @classmethod
    def from_reader(cls, r: Reader) -> ExtraRequirement:
        return cls(requirement=r.text("requirement"), distribution=r.opt_text("distribution"))


@dataclass(frozen=True, kw_only=True, slots=True)
class StackInfo:
    """A stack: its spec as the report shows it, and what was installed."""

    name: str
    role: str  # baseline or candidate
    file: str
    description: str
    requirements: tuple[str, ...]
    exporter: str
    runtime: str
    installed: Installed | None  # None: the stack was not built for this report
    # Every distribution in the venv, name → version ({} when not recorded), and the project's extras.
    packages: dict[str, str] = field(default_factory=dict)
    extra_requirements: tuple[ExtraRequirement, ...] = ()

    @property
    def is_baseline(self) -> bool:
        return self.role == "baseline"

    def version_of(self, extra: ExtraRequirement) -> str | None:
        """The installed version of what an extra requirement installs, None if unknown or absent."""
        return self.packages.get(extra.distribution) if extra.distribution else None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": {"name": self.name, "role": self.role, "file": self.file, "description": self.description,
                         "requirements": list(self.requirements), "exporter": self.exporter,
                         "runtime": self.runtime},
                "installed": self.installed.to_dict() if self.installed else None,
                # Each with its installed version (derived from packages, for readers of the file).
                "extra_requirements": [{**e.to_dict(), "version": self.version_of(e)}
                                       for e in self.extra_requirements],
                "packages": dict(self.packages)}

    @classmethod
    def from_reader(cls, r: Reader) -> StackInfo:
        spec, installed = r.required_child("spec"), r.child("installed")
        versions = r.child("packages") or Reader({}, r.where)
        return cls(name=spec.text("name"), role=spec.text("role"), file=spec.text("file"),
                   description=spec.text("description"), requirements=spec.texts("requirements"),
                   exporter=spec.text("exporter"), runtime=spec.text("runtime"),
                   installed=Installed.from_reader(installed) if installed else None,
                   packages={name: versions.text(name) for name in versions.data},
                   extra_requirements=tuple(ExtraRequirement.from_reader(e)
                                            for e in r.opt_children("extra_requirements") or ()))


# -- the whole report ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Results:
    """results.json: the configuration, the stacks, every model's results, the project's, and the verdict."""

    tool_version: str
    generated_at: str
    config_path: str
    settings: Settings
    stacks: dict[str, StackInfo]  # baseline first
    models: tuple[ModelResults, ...]
    verdict: VerdictRecord
    project: ProjectResults | None = None

    @property
    def baseline(self) -> StackInfo:
        return next(s for s in self.stacks.values() if s.is_baseline)

    @property
    def candidates(self) -> list[StackInfo]:
        return [s for s in self.stacks.values() if not s.is_baseline]

    def model(self, name: str) -> ModelResults | None:
        return next((m for m in self.models if m.name == name), None)

    def family(self, model: ModelResults) -> list[ModelResults]:
        """The model's fp32 results and its quantized variants', in suite order."""
        return [m for m in self.models if m.base == model.base]

    def gates_of(self, model: str) -> tuple[GateResult, ...]:
        return tuple(g for g in self.verdict.gates if g.model == model)

    @property
    def package_differences(self) -> packages.Differences:
        """The packages whose versions differ between the stacks' venvs (those whose packages were recorded)."""
        recorded = {name: info.packages for name, info in self.stacks.items() if info.packages}
        return packages.differing(recorded) if len(recorded) > 1 else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": str(SCHEMA_VERSION),
            "tool_version": self.tool_version,
            "generated_at": self.generated_at,
            "config": self.config_path,
            "settings": self.settings.to_dict(),
            "stacks": {name: info.to_dict() for name, info in self.stacks.items()},
            "package_differences": self.package_differences,  # derived, for readers of the file
            "models": [m.to_dict() for m in self.models],
            "project": self.project.to_dict() if self.project else None,
            "verdict": self.verdict.to_dict(),
        }

    @classmethod
    def from_reader(cls, r: Reader) -> Results:
        project = r.child("project")
        return cls(tool_version=r.text("tool_version"), generated_at=r.text("generated_at"),
                   config_path=r.text("config"), settings=Settings.from_dict(r.opt_dict("settings"),
                                                                             path=Path(r.text("config"))),
                   stacks={name: StackInfo.from_reader(s) for name, s in r.entries("stacks").items()},
                   models=tuple(ModelResults.from_reader(m) for m in r.children("models")),
                   verdict=VerdictRecord.from_reader(r.required_child("verdict")),
                   project=ProjectResults.from_reader(project) if project else None)

    @classmethod
    def load(cls, path: Path) -> Results:
        """A report folder's results.json (or that file); ConfigError naming the file if it is not one."""
        file = path / "results.json" if path.is_dir() else path
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{file}: no such report; pass report folders written by "
                              f"`{command('compare')}`") from None
        except (OSError, ValueError) as error:
            raise ConfigError(f"{file}: not a readable results.json ({error})") from None
        reader = Reader(data, file.name)
        try:
            check_version(reader, file)
            return cls.from_reader(reader)
        except (RecordError, ConfigError) as error:
            raise ConfigError(f"{file}: not an upgrade-gate results.json of this version: {error}") from None
