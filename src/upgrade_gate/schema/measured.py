"""The measure session's results: latency per method and thread count, the candidate/baseline ratio by
rounds with its interval (the interval's maths: upgrade_gate.stats), cold start, memory; the rounds tried and the
machine's load are the measurement file's (schema.measurement)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from upgrade_gate.schema import codec
from upgrade_gate.stats import CONFIDENCE, median_interval

# -- latency -------------------------------------------------------------------------

TRIM_FRACTION = 0.1  # drop the fastest and slowest 10% for the trimmed mean


def remedied(stack: str) -> str:
    """A candidate measured with its remedies (the diagnose phase's remedied artifacts in place of the shipped
    ones): its entry in a measurement file and its ratios' stack, judged by the latency gate as the candidate is.
    "+" is in no stack's name (layout.NAME_SHAPE), so it names no stack of its own."""
    return f"{stack}+remedy"

@dataclass(frozen=True, kw_only=True, slots=True)
class LatencySummary(codec.Record):
    DERIVED = (codec.derived("per_second"),)  # for readers of the file

    runs: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    trimmed_mean_ms: float
    iqr_ms: float  # p75 − p25
    max_ms: float

    @property
    def per_second(self) -> float:
        """Calls per second at the median: frames per second for a vision model."""
        return 1000.0 / self.p50_ms if self.p50_ms > 0 else math.inf


def summarize(samples_ms: list[float], calls: int | None = None) -> LatencySummary | None:
    """None when there is nothing to summarize or a sample is not a finite duration. ``calls``: how many
    calls the samples stand for, when a round kept fewer (``stats.kept_samples``)."""
    values = _valid(samples_ms)
    if values is None:
        return None
    ordered = np.sort(values)
    cut = int(math.floor(ordered.size * TRIM_FRACTION))
    trimmed = ordered[cut : ordered.size - cut] if ordered.size > 2 * cut else ordered
    p25, p50, p75, p90, p99 = np.percentile(ordered, [25, 50, 75, 90, 99])
    return LatencySummary(
        runs=calls or int(ordered.size),
        min_ms=float(ordered[0]),
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        trimmed_mean_ms=float(trimmed.mean()),
        iqr_ms=float(p75 - p25),
        max_ms=float(ordered[-1]),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class RatioEstimate(codec.Record):
    """Candidate/baseline latency: the median of the per-round ratios of medians, with
    the order-statistic interval of that median and the coverage it achieves."""

    median: float
    low: float
    high: float
    per_round: tuple[float, ...]  # the rounds the ratio is made of
    confidence: float = CONFIDENCE  # the coverage asked of this interval (interval_confidence: its gate's share)
    level: float = CONFIDENCE  # the coverage the interval has (≥ confidence, or less with too few rounds)
    dropped: int = 0  # rounds left out: samples that were not finite durations on either side
    planned: int = 0  # a measurement that could stop early (sequential_looks): its planned rounds; 0: fixed rounds
    most: int = 0  # the rounds it could go on to while an interval straddled after them (most-rounds); 0: none

    @property
    def holds(self) -> bool:
        """Whether the interval has the coverage asked for."""
        return self.level >= self.confidence

    def judge(self, threshold: float) -> str:
        """``passed`` when the whole interval is within the threshold, ``failed``
        when it lies wholly beyond, ``inconclusive`` when it straddles it — or when
        too few rounds leave the interval short of its stated coverage."""
        if not self.holds:
            return "inconclusive"
        if self.high <= threshold:
            return "passed"
        if self.low > threshold:
            return "failed"
        return "inconclusive"

    def outcome(self, threshold: float, baseline_ms: float, min_delta_ms: float) -> str:
        """The latency gate's rule for one ratio: ``passed`` when the candidate is at most
        ``min_delta_ms`` slower than the baseline's ``baseline_ms`` even at the interval's top
        (timer and call overhead), else ``judge``. What the rounds stop on (stop-early) too. An interval short of
        its coverage (too few rounds) is inconclusive whatever its top says: its top is not yet a bound."""
        if self.holds and baseline_ms * (self.high - 1) <= min_delta_ms:
            return "passed"
        return self.judge(threshold)

    def __str__(self) -> str:
        return f"{self.median:.3f}, {self.level:.1%} interval [{self.low:.3f}, {self.high:.3f}]"


def ratio_by_rounds(candidate_rounds: list[list[float]], baseline_rounds: list[list[float]],
                    confidence: float = CONFIDENCE, planned: int = 0, most: int = 0) -> RatioEstimate | None:
    """One ratio per round (the candidate's median over the baseline's, both measured
    in that round), their median, and the order-statistic interval of that median —
    of the sequential design when the rounds could stop early (``planned`` rounds, up to ``most`` while an
    interval straddled).

    A round whose samples are not finite durations on either side is left out and
    counted; the others keep their ratio. None without one round of valid samples.
    """
    ratios, dropped = [], 0
    for candidate, baseline in zip(candidate_rounds, baseline_rounds):
        a, b = _valid(candidate), _valid(baseline)
        theirs = statistics.median(b.tolist()) if b is not None else 0.0  # a few samples: numpy's call costs more
        if a is None or theirs <= 0:
            dropped += 1
            continue
        ratios.append(statistics.median(a.tolist()) / theirs)
    if not ratios:
        return None
    median, low, high, level = median_interval(ratios, confidence, planned, most)
    return RatioEstimate(median=median, low=low, high=high, per_round=tuple(ratios), confidence=confidence,
                         level=level, dropped=dropped, planned=planned, most=most)


def _valid(samples_ms: list[float]) -> np.ndarray | None:
    values = np.asarray(samples_ms, dtype=np.float64)
    if values.size == 0 or not np.isfinite(values).all() or (values < 0).any():
        return None
    return values


# -- measurements --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured(codec.Record):
    """One stack at one thread count, from the measure session."""

    status: str  # "ok", "not measured", or how its measurement server ended
    problem: str | None = None
    latency: dict[str, LatencySummary] = field(default_factory=dict)  # per method, every round pooled
    rounds: dict[str, int] = field(default_factory=dict)  # per method, the rounds timed
    # Cold start: loading every method's artifact in a fresh process; the first call of every method, summed.
    load_ms: float | None = field(default=None, metadata=codec.group("cold_start"))
    first_run_ms: float | None = field(default=None, metadata=codec.group("cold_start"))
    # Peak RSS minus the process with only the runtime started; the peak, and the idle process's.
    runtime_memory_bytes: int | None = field(default=None, metadata=codec.group("memory") | codec.key("runtime_bytes"))
    peak_rss_bytes: int | None = field(default=None, metadata=codec.group("memory"))
    idle_rss_bytes: int | None = field(default=None, metadata=codec.group("memory"))
    image_input: bool = False  # a method takes images (N, C, H, W): its rate is frames per second
    host: str | None = None  # the machine that timed it

    @property
    def p50_sum_ms(self) -> float | None:
        """One call of every method, at the median: a model's latency."""
        return sum(lat.p50_ms for lat in self.latency.values()) if self.latency else None


class RoundsEnded(str, Enum):
    """Why a measurement's rounds ended (upgrade_gate.measure.round_loop.run_rounds; the file's ``ended``)."""

    PLANNED = "planned"  # every quiet round asked for ran
    DECIDED = "decided"  # stop-early: at a look, every candidate's gate was decided (round_loop.clear_of_threshold)
    REPEATS_RAN_OUT = "repeats ran out"  # the machine disturbed so many rounds that the tries allowed ran out
    SERVER_ENDED = "server ended"  # the baseline's measurement server ended, or every other side's: no more ratios


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyRatio(codec.Record):
    """A candidate's latency against the baseline's for one method at one thread count, by rounds."""

    stack: str
    threads: int
    method: str
    estimate: RatioEstimate = field(metadata=codec.spread())  # its keys beside the others


@dataclass(frozen=True, kw_only=True, slots=True)
class BusyRounds(codec.Record):
    """A candidate's ratio in every round tried at a thread count a busy machine left unjudged, disturbed or
    not: no interval (a disturbed round may have slowed either stack), but where all of them lie beyond the
    threshold on one side the gate says so (issue 37: 18 disturbed rounds between 1.84× and 2.35×)."""

    stack: str
    threads: int
    method: str
    per_round: tuple[float, ...]


# The target every figure is measured on today: the machine that runs the tool.
LOCAL = "local"
# platform.machine() of x86 hosts, 64- and 32-bit: their XNNPACK kernels are not the ones a phone runs.
X86_MACHINES = ("x86_64", "amd64", "i686", "i386")


@dataclass(frozen=True, kw_only=True, slots=True)
class Target(codec.Record):
    """A machine the latency, cold-start and memory figures were measured on, with what its kernels dispatch on."""

    name: str  # "local": the machine that ran the tool
    cpu: str  # by model name
    architecture: str  # platform.machine(): x86_64, aarch64, arm64
    cores: int | None
    isa: tuple[str, ...]  # the ISA extensions XNNPACK picks kernels by (avx2, avx512_vnni; asimddp, i8mm)

    @property
    def x86(self) -> bool:
        return self.architecture.lower() in X86_MACHINES

    @property
    def described(self) -> str:
        """``local: AMD EPYC 7B13, x86_64, 2 cores; ISA sse4_2 avx avx2 fma f16c``."""
        cores = f", {self.cores} cores" if self.cores else ""
        isa = f"; ISA {' '.join(self.isa)}" if self.isa else "; ISA extensions not read"
        return f"{self.name}: {self.cpu}, {self.architecture or 'architecture unknown'}{cores}{isa}"


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceLatency(codec.Record):
    """A candidate's latency against the baseline's for one method at one thread count on a device
    (`upgrade-gate device-results`): the same ratio by rounds as the host's, or why there is none."""

    target: Target
    stack: str
    threads: int
    method: str
    rounds: int  # rounds both stacks gave samples in
    planned: int  # rounds run-on-device.sh was asked for
    candidate_p50_ms: float | None = None
    baseline_p50_ms: float | None = None
    estimate: RatioEstimate | None = None
    missing: str = ""  # why it was not judged (a failed round, a stale bundle); "" when it was
    # Timed over ssh from the host (measure/target_rounds.py): why the rounds ended (RoundsEnded's value) and how
    # many the target's other work disturbed; "" where run-on-device.sh ran its fixed rounds, unchecked.
    ended: str = ""
    disturbed: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceMemory(codec.Record):
    """A candidate's runtime memory and cold start against the baseline's at one thread count on a target timed
    over ssh: memory as on the host (the peak less the started runtime), the cold start as the load and each
    method's first call."""

    target: Target
    stack: str
    threads: int
    candidate_bytes: int | None
    baseline_bytes: int | None
    candidate_cold_ms: float
    baseline_cold_ms: float


# The answers of a latency reproducer's run (measure/latency_repro_script.py's exit statuses).
REPRODUCER_ANSWERS = {1: "reproduces", 0: "does not reproduce here"}
# What a reproducer the measure session did not run says: its rounds found the machine too busy to time.
NOT_RUN = "not run here: "


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyReproducer(codec.Record):
    """A candidate's method the measure session's rounds found slower than the latency gate allows (the median of
    its rounds' ratios), handed on as a reproducer: both stacks' artifacts timed in alternating rounds, each in its
    own Python (measure/latency_reproducer.py), run once with the report's stacks."""

    stack: str
    threads: int
    method: str
    found_ratio: float  # the median of the rounds' ratios, as the measure session found it
    threshold: float  # the latency gate's
    script: str = ""  # relative to the report folder; "" where not written
    reason: str = ""  # why it was not written
    exit_code: int | None = None  # its run: 1 slower, 0 not, 3 no answer; None: it did not finish or did not run
    said: str = ""  # its last line

    def not_written(self, reason: str) -> LatencyReproducer:
        return replace(self, reason=reason)

    def written(self, script: str) -> LatencyReproducer:
        return replace(self, script=script)

    def answered(self, exit_code: int | None, said: str) -> LatencyReproducer:
        return replace(self, exit_code=exit_code, said=said)

    @property
    def answer(self) -> str:
        """reproduces, does not reproduce here, could not run (it failed before timing), did not finish, or not run
        (the machine busy)."""
        if self.exit_code is None:
            return "not run" if self.said.startswith(NOT_RUN) else "did not finish"
        return REPRODUCER_ANSWERS.get(self.exit_code, "could not run")
