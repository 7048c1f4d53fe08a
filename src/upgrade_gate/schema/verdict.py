"""verdict.json: each gate's outcome with its numbers and units, the baseline's findings, the verdict.

The results schema's version is here: verdict.json and results.json share it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from packaging.version import InvalidVersion, Version

from upgrade_gate import text
from upgrade_gate.errors import EXIT_GO, EXIT_INCOMPLETE, EXIT_NO_GO, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.schema import codec
from upgrade_gate.schema.comparison import HEADLINE
from upgrade_gate.schema.measured import RatioEstimate
from upgrade_gate.schema.reader import Reader

# A minor version adds fields an older file of the same major reads without (docs/report.md says how older files
# read; this line's git history, what each version added); 1.x wrote prose where 2.0 keeps enums and numbers.
RESULTS_VERSION = Version("2.14")


def check_version(reader: Reader, path: Path | str) -> None:
    """Read the same major version only: another's records mean other things."""
    found = reader.data.get("schema_version") if isinstance(reader.data, dict) else None
    try:
        version = Version(str(found))
    except InvalidVersion:
        version = None
    if version is None or version.major != RESULTS_VERSION.major:
        raise RecordError(f"{path}: results schema {found!r}; this upgrade-gate reads {RESULTS_VERSION.major}.x — "
                          f"write the report again with this version (`{command('report', '--out DIR')}`)")


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
class Quantity(codec.Record):
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


# The start of a gate's note when --fail-fast stopped the run before it: how a 2.10 file says `not_reached`.
NOT_REACHED = "not reached: --fail-fast"


def _not_reached(r: Reader, key: str) -> bool:
    if r.data.get(key) is not None:
        return r.flag(key)
    return r.data.get("status") == GateStatus.INCOMPLETE.value and str(r.data.get("note", "")).startswith(NOT_REACHED)


@dataclass(frozen=True, kw_only=True, slots=True)
class GateResult(codec.Record):
    """One gate for one candidate and model: its outcome, its number and the limit it holds it to (same unit),
    and what the numbers do not say — where it was measured, or why there is no number."""

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
    # Incomplete because --fail-fast stopped the candidate's run before it (judge/fail_fast.py): counted, not listed.
    not_reached: bool = field(default=False, metadata=codec.custom(read=_not_reached))

    @property
    def measured_text(self) -> str:
        """The number and where it comes from; a warning goes with the number it qualifies."""
        shown = self.note if self.measured is None else (
            f"{self.metric} = {self.measured}" + (f" ({self.note})" if self.note else ""))
        return shown + "".join(f" ⚠ {warning}" for warning in self.warnings)

    @property
    def measured_against_rule(self) -> str:
        """The number and the threshold it was held to, without the rule's conditions (a remedy's row says it)."""
        rule = f"; {self.metric} {self.op} {self.threshold}" if self.threshold is not None else ""
        return self.measured_text + rule

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


_HEADLINES = {key for key, _ in HEADLINE.values()}  # the task keys a baseline finding carries


@dataclass(frozen=True, kw_only=True, slots=True)
class BaselineFinding(codec.Record):
    """What is already wrong with what ships today, whatever the verdict: a model whose
    baseline artifact departs from the baseline's own eager outputs by more than the
    numerics gate lets a candidate, or one the baseline stack cannot export, run or measure."""

    model: str
    output: str = ""
    rel_l2: float | None = None
    max_rel_l2: float | None = None
    # A quantized variant's own artifact against the fp32 reference, by the quantized-numerics gate's
    # thresholds: its worst SNR and cosine, and theirs (rel_l2 is the float models' measure).
    snr_db: float | None = None
    min_snr_db: float | None = None
    cosine: float | None = None
    # Not "min_cosine": that is the embedding task's headline, which is written beside these.
    gate_min_cosine: float | None = None
    failure: str = ""  # the baseline's stage that did not succeed, when it is one
    # That stage (quantize, export, load, run, measure, …): what ships today fails there, before any departure.
    stage: str = ""
    # The task's headline value, by name: written beside the others, read back by the headlines' names.
    task: dict[str, float] = field(default_factory=dict, metadata=codec.spread(
        read=lambda r, _: {key: r.number(key) for key in r.data if key in _HEADLINES}))

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


@dataclass(frozen=True, kw_only=True, slots=True)
class JudgedArtifact(codec.Record):
    """A candidate's file its gates judged: what the team's export script (upgrade_gate.migrate) must rebuild."""

    stack: str
    model: str
    file: str  # relative to the model's record folder; a remedy's, to the report folder
    sha256: str
    bytes: int
    method: str = ""  # a remedy's file: the one method it holds, remedied (empty: the artifact as shipped)


@dataclass(frozen=True, kw_only=True, slots=True)
class Remedy(codec.Record):
    """The change that avoids one failed hard gate of a candidate, found by its diagnose phase and judged as the
    stack is. The verdict as configured stands."""

    stack: str
    model: str
    gate: str  # the failed gate it answers
    methods: tuple[str, ...]
    operators: tuple[str, ...]  # what it keeps out of the lowering
    passes: bool  # every method within the gate's threshold against the reference
    rel_l2: float | None  # the worst method's, against the reference
    threshold: float
    latency_ratio: RatioEstimate | None = None  # remedied / shipped, the slowest method's (calls in turns, one process)
    threads: int | None = None
    # The candidate's gates with the remedy, each judged by the stack's own code (judge/_remedies.remedied_gates):
    # its numerics (or a quantized variant's), its task's agreement, its latency timed in the measure session.
    gates: tuple[GateResult, ...] = ()
    bytes: int | None = None  # the remedied artifacts'
    shipped_bytes: int | None = None
    code: str = ""  # the lines of an export script
    # Each remedied method's file, lowered alone with its lines, as the gates judged it (upgrade_gate.migrate).
    artifacts: tuple[JudgedArtifact, ...] = ()
    reproducers: tuple[str, ...] = ()  # folders, relative to the report folder
    note: str = ""  # why it does not pass, when it does not
    # A quantized variant's (gate "quantized-numerics"): the SNR the gate asks for (``threshold`` is its relative
    # L2, 10^(−SNR/20): the same measure), and the worst cosine with the gate's minimum.
    min_snr_db: float | None = None
    cosine: float | None = None
    min_cosine: float | None = None
    # What a soft gate would say of the remedied artifact (its latency against the shipped one): conditions.
    conditions: tuple[str, ...] = ()
    # Where the gate it answers was not judged (the machine too busy to time): why, and what was computed stands,
    # marked so (issue 63: a latency finding with its remedy lowered and timed was hidden).
    provisional: str = ""

    @property
    def latency_gate(self) -> GateResult | None:
        """The latency gate on the candidate timed with the remedy (None: off, or not judged)."""
        return next((g for g in self.gates if g.gate == "latency"), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class WithRemedies(codec.Record):
    """A NO-GO candidate's verdict were its passing remedies applied (judge/policy.py ``with_remedies``): the
    headline's second half, kept so that CI reads what a person reads; the verdict as configured sets the exit."""

    verdict: Verdict
    remedies: int  # the passing remedies applied
    clears: tuple[str, ...]  # the failed gates they answer, "gate (model)"
    # What stays a condition: a remedy's own cost, a gate a failed export blocked that the remedy leaves unmeasured.
    conditions: tuple[str, ...] = ()

    @property
    def counted(self) -> str:
        """"1 remedy", "2 remedies"."""
        return f"{self.remedies} {'remedy' if self.remedies == 1 else 'remedies'}"

    @property
    def said(self) -> str:
        """"GO-WITH-CONDITIONS with 1 remedy"."""
        return f"{self.verdict} with {self.counted}"


@dataclass(frozen=True, kw_only=True, slots=True)
class VerdictRecord(codec.Record):
    """verdict.json: the verdict per candidate and overall, and every gate."""

    DERIVED = (codec.derived("schema_version", lambda _: str(RESULTS_VERSION), after=codec.START),)

    tool_version: str
    generated_at: str
    verdict: Verdict
    baseline: str
    candidates: dict[str, Verdict]
    gates: tuple[GateResult, ...]
    # Not gates: the baseline is what ships today; these say where it is already off.
    baseline_findings: tuple[BaselineFinding, ...] = ()
    warnings: tuple[str, ...] = ()
    # Why the evidence is incomplete, each reason once, and what to do about it.
    incomplete: tuple[str, ...] = ()
    # The changes that avoid failed hard gates (the diagnose phase), each judged; the verdict above stands.
    remedies: tuple[Remedy, ...] = ()
    # Per candidate whose passing remedies answer every failed hard gate: its verdict with them.
    with_remedies: dict[str, WithRemedies] = field(default_factory=dict)
    # Each candidate's artifacts as judged, by SHA-256: what a migration's export script rebuilds (issue 64).
    artifacts: tuple[JudgedArtifact, ...] = ()

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
