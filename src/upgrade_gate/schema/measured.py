"""The measure session's results: latency per method and thread count, cold start, memory, the machine's load."""

from __future__ import annotations

from dataclasses import dataclass, field

from upgrade_gate.measure.stats import LatencySummary, RatioEstimate, fewest_rounds
from upgrade_gate.schema import codec

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


@dataclass(frozen=True, kw_only=True, slots=True)
class StackLoad(codec.Record):
    """What the rest of the machine did while one stack's part of a round was timed (measure.contention)."""

    seconds: float
    waited_share: float  # of the timed threads' time, spent waiting for a CPU
    others_cores: float
    steal_share: float
    run_queue: int



@dataclass(frozen=True, kw_only=True, slots=True)
class RoundLoad(codec.Record):
    """One round tried: the stacks' order, their loads, and whether the rest of the machine disturbed it."""

    round: int
    order: tuple[str, ...]
    disturbed: bool
    loads: dict[str, StackLoad | None] = field(metadata=codec.key("load"))  # None: not measured here (no /proc)


@dataclass(frozen=True, kw_only=True, slots=True)
class Contention(codec.Record):
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
        """Too few quiet rounds for an interval (policy.latency_gate): the latency here is not judged."""
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


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyRatio(codec.Record):
    """A candidate's latency against the baseline's for one method at one thread count, by rounds."""

    stack: str
    threads: int
    method: str
    estimate: RatioEstimate = field(metadata=codec.spread())  # its keys beside the others
