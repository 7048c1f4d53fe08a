"""The measure session's results: latency per method and thread count, cold start, memory, the machine's load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from upgrade_gate.judge.records import Reader
from upgrade_gate.measure.stats import LatencySummary, RatioEstimate, fewest_rounds

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
