"""The measure session's file, ``measurements/<model>/threads-<n>.json`` (upgrade_gate.measure.rounds writes it):
how its rounds were designed (``RoundsDesign``), every round tried and whether it counted, why they ended, and each
side's samples, cold start and memory. Read in one place, ``read_measurement``, which reads older files too."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate.errors import RecordError
from upgrade_gate.schema import codec
from upgrade_gate.schema.measured import LatencyReproducer, RatioEstimate, RoundsEnded, ratio_by_rounds
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.records import check_schema
from upgrade_gate.stats import fewest_rounds, interval_confidence, sequential_looks


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundsDesign(codec.Record):
    """How a measurement's rounds were designed, read alike by their stop rule (measure/round_loop.py), the gate's
    ratios (judge/gather.py, judge/_device_rounds.py) and the merge of shards (run/shards.py). Its keys are the
    measurement file's ``settings`` (a file from before one was recorded reads as its default)."""

    planned: int = field(default=0, metadata=codec.key("rounds"))  # the quiet rounds asked for (`rounds`)
    stop_early: bool = False  # the rounds may stop at a look of the sequential design once every gate is decided
    # The most rounds they could take, going on past `planned` while an interval straddled; 0: a file from before.
    most: int = field(default=0, metadata=codec.key("most_rounds"))
    # The intervals the model's latency gate judges (thread counts × methods): they share its 95%.
    intervals: int = 1

    @classmethod
    def of(cls, *, planned: int, most_rounds: int, stop_early: bool, intervals: int) -> RoundsDesign:
        """The design of ``planned`` rounds for a gate of ``intervals``: with stop-early, going on up to
        ``most_rounds`` where looks past ``planned`` fit each interval's share (stats.looks_past); without, fixed."""
        most = max(sequential_looks(planned, interval_confidence(intervals), most_rounds)) if stop_early else planned
        return cls(planned=planned, stop_early=stop_early, most=most, intervals=intervals)

    @property
    def confidence(self) -> float:
        """What each interval must cover: its share of the gate's (stats.interval_confidence)."""
        return interval_confidence(self.intervals)

    @property
    def needs(self) -> int:
        """The quiet rounds an interval needs for its share of the coverage."""
        return fewest_rounds(self.confidence)

    @property
    def at_most(self) -> int:
        """The quiet rounds the measurement could count, going on where an interval straddled."""
        return max(self.planned, self.most)

    @property
    def looks(self) -> dict[int, int]:
        """Where the rounds may stop, ``{rounds: rank}`` (stats.sequential_looks); none for fixed rounds."""
        return sequential_looks(self.planned, self.confidence, self.most) if self.stop_early else {}

    def ratio(self, candidate_rounds: list[list[float]], baseline_rounds: list[list[float]]) -> RatioEstimate | None:
        """The candidate/baseline ratio by rounds, its interval of this design (the sequential one where the
        rounds could stop early) at each interval's share of the gate's coverage."""
        sequential = self.stop_early and self.planned > 0
        return ratio_by_rounds(candidate_rounds, baseline_rounds, confidence=self.confidence,
                               planned=self.planned if sequential else 0, most=self.most if sequential else 0)


# -- the rounds tried ----------------------------------------------------------------


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
    # The stacks whose part ran past its limit and was cut short, with the limit in seconds (compat/measure_server.py
    # part_limit_s): the round is disturbed whatever the load read.
    cut: dict[str, float] = field(default_factory=dict)
    # The sides whose measurement server ended in this round (failed, killed: each side's record says how). Each
    # ends alone: the others' rounds go on while the baseline and another side run (round_loop.run_rounds).
    servers_ended: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Contention(codec.Record):
    """The rounds of one model at one thread count: how busy the machine was, which ones count, why they ended."""

    threads: int
    cores: int | None  # the machine's
    cpu: str
    rounds: tuple[RoundLoad, ...]
    # The most quiet rounds it could count (schema.measurement.RoundsDesign.at_most): results 2.6 named it planned.
    most: int = field(default=0, metadata=codec.key("planned"))
    ended: RoundsEnded | None = None  # None: a measurement file from before it was recorded
    # The intervals the model's latency gate judges (thread counts × methods), which share its 5%: the
    # rounds were designed for them (RoundsDesign.intervals). 1: a file from before.
    intervals: int = 1

    @property
    def quiet(self) -> int:
        return sum(not r.disturbed for r in self.rounds)

    @property
    def needs(self) -> int:
        """The quiet rounds an interval of this gate needs for its share of the coverage."""
        return RoundsDesign(intervals=self.intervals).needs

    def quiet_rounds(self) -> set[int]:
        """The rounds whose ratios count."""
        return {r.round for r in self.rounds if not r.disturbed}

    def _loads(self) -> list[StackLoad]:
        return [load for r in self.rounds for load in r.loads.values() if load is not None]

    def _time_weighted(self, figure: Callable[[StackLoad], float]) -> float | None:
        """A part's figure averaged over every part of every round, each weighed by how long it lasted."""
        loads = self._loads()
        seconds = sum(load.seconds for load in loads)
        return sum(figure(load) * load.seconds for load in loads) / seconds if seconds > 0 else None

    @property
    def typical_others(self) -> float | None:
        """The cores other processes kept busy, on average over every part of every round (weighted
        by time: a single part is counted in 10 ms clock ticks, the sum of them much finer)."""
        return self._time_weighted(lambda load: load.others_cores)

    @property
    def typical_steal(self) -> float | None:
        """The share of the CPU time the virtual machine's host took from it (steal), over every part of every
        round: a machine no process of its own keeps busy can still be too busy to time on."""
        return self._time_weighted(lambda load: load.steal_share)

    @property
    def typical_wait(self) -> float | None:
        """The share of the timed threads' time spent waiting for a CPU, over every part of every round."""
        return self._time_weighted(lambda load: load.waited_share)

    @property
    def free_cores(self) -> float | None:
        others = self.typical_others
        return None if others is None or self.cores is None else max(0.0, self.cores - others)

    @property
    def busy(self) -> bool:
        """Too few quiet rounds for an interval because the machine disturbed the others (policy.latency_gate):
        the latency here is not judged. Rounds that all ran quiet and are still too few were too few asked for;
        rounds a server's end cut short are the server's (``servers_ended``), never a busy machine's. A file from
        before why they ended was recorded is judged by its quiet rounds alone."""
        return self.quiet < self.needs and self.ended in (RoundsEnded.REPEATS_RAN_OUT, None)

    @property
    def servers_ended(self) -> dict[str, int]:
        """Each side whose measurement server ended, and the round (as tried) it ended in."""
        return {name: r.round for r in self.rounds for name in r.servers_ended}

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
        if cut := [f"{r.round} ({', '.join(f'{stack} at {s:g} s' for stack, s in r.cut.items())})"
                   for r in self.rounds if r.cut]:
            shown += f"; parts cut short, their calls far slower than warm: round {'; '.join(cut)}"
        if others is not None and wait is not None:
            shown += (f"; the timed threads waited {wait:.1%} of their time for a CPU, other processes kept "
                      f"{others:.2f} of {self.cores} cores busy, the run queue reached {queue}")
        if self.oversubscribed:
            shown += f"; more threads than free cores: {self.threads} threads, {self.free_cores:.2f} cores free"
        if self.servers_ended and self.ended is not RoundsEnded.SERVER_ENDED:
            shown += "; " + "; ".join(f"{name}'s measurement server ended in round {number}, the others went on "
                                      "without it" for name, number in self.servers_ended.items())
        if self.ended is not None:
            shown += f"; {self.ending()}"
        return shown

    def ending(self) -> str:
        """Why the rounds ended, in words."""
        of = f" of {self.most}" if self.most else ""
        return {
            RoundsEnded.PLANNED: f"all {self.quiet} quiet rounds asked for ran",
            RoundsEnded.DECIDED: f"stopped after {self.quiet}{of} quiet rounds, every gate decided (stop-early)",
            RoundsEnded.REPEATS_RAN_OUT: f"the repeats ran out: {len(self.rounds)} rounds tried, {self.quiet}{of} "
                                         "quiet",
            RoundsEnded.SERVER_ENDED: ("the rounds ended with the measurement server of " + ", ".join(
                f"{name} (round {number})" for name, number in self.servers_ended.items())
                if self.servers_ended else f"a measurement server ended after {len(self.rounds)} rounds"),
            None: "",
        }[self.ended]


# -- the file -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasureSettings(codec.Record):
    """How a measurement was made: its rounds' design, and each round's calls."""

    design: RoundsDesign = field(default_factory=RoundsDesign, metadata=codec.spread())
    warmup: int | None = field(default=None, metadata=codec.omitted())
    iterations: int | None = field(default=None, metadata=codec.omitted())
    time_budget_s: float | None = field(default=None, metadata=codec.omitted())


@dataclass(frozen=True, kw_only=True, slots=True)
class Machine(codec.Record):
    """The CPU that timed a measurement, by model name and core count."""

    cpu: str = "unknown"
    cores: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TimedRound(codec.Record):
    """One side's part of a round: its samples per method (stats.kept_samples) and the calls they stand for."""

    round: int
    samples_ms: dict[str, tuple[float, ...]]
    calls: dict[str, int] = field(default_factory=dict, metadata=codec.omitted())


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerError(codec.Record):
    """How a side's measurement server ended (run/measure_server.py ServerFailed)."""

    stage: str | None = None
    message: str | None = None
    traceback_tail: Any = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TimedSide(codec.Record):
    """One side's entry: a stack's (or a remedied side's) rounds, cold start and memory, or why it has none."""

    status: str  # "ok", "not measured", or how its server ended
    reason: str | None = field(default=None, metadata=codec.omitted())  # why it was not measured
    error: ServerError | None = field(default=None, metadata=codec.omitted())
    host: str | None = field(default=None, metadata=codec.omitted())  # a merge of shards checks it
    cold: dict[str, Any] | None = field(default=None, metadata=codec.omitted())  # load_ms, first_ms per method
    idle_memory: dict[str, Any] | None = field(default=None, metadata=codec.omitted())
    after_first_run_memory: dict[str, Any] | None = field(default=None, metadata=codec.omitted())
    warm_mean_ms: Any = field(default=None, metadata=codec.omitted())
    runs_per_round: Any = field(default=None, metadata=codec.omitted())
    input_shapes: dict[str, Any] | None = field(default=None, metadata=codec.omitted())
    rounds: tuple[TimedRound, ...] | None = field(default=None, metadata=codec.omitted())  # None: none written
    supervisor_peak_rss_bytes: int | None = field(default=None, metadata=codec.omitted())
    exit_memory: dict[str, Any] | None = field(default=None, metadata=codec.omitted())
    runtime_memory_bytes: int | None = field(default=None, metadata=codec.omitted())


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement(codec.Record):
    """One model at one thread count, every side measured in the same rounds."""

    schema_version: str
    model: str
    threads: int
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    order: tuple[str, ...] = ()  # the stacks measured (their cache entry's name); () for a merge of shards
    remedied: dict[str, dict[str, str]] = field(default_factory=dict)  # a remedied side's files, by method
    key: str | None = None
    machine: Machine = field(default_factory=Machine)  # the cache key has it too: timings are one machine's
    # Every round tried, its order, load, and whether it counts; a part cut short, a server's end, only where any.
    rounds: tuple[RoundLoad, ...] = field(default=(), metadata=codec.custom(write=lambda m: [
        {key: value for key, value in r.to_dict().items() if value or key not in ("cut", "servers_ended")}
        for r in m.rounds]))
    ended: RoundsEnded | None = None  # None: a file from before it was recorded
    elapsed_s: float | None = None  # servers' start to exit: what the model costs the measure session
    stacks: dict[str, TimedSide] = field(default_factory=dict)
    merged_from: dict[str, str] = field(default_factory=dict, metadata=codec.omitted())  # shard folder per side

    @property
    def design(self) -> RoundsDesign:
        return self.settings.design


def load_measurement(out: Path, model: str, threads: int) -> Measurement | None:
    """The measure session's file for one model and thread count, or None where it has none."""
    path = layout.measurement_file(out, model, threads)
    return read_measurement(path, path.relative_to(out).as_posix()) if path.is_file() else None


def load_latency_reproducer(out: Path, model: str) -> LatencyReproducer | None:
    """The measure session's latency reproducer of the model (measure/latency_reproducer.py), or None."""
    path = layout.latency_reproducer_file(out, model)
    if not path.is_file():
        return None
    where = path.relative_to(out).as_posix()
    try:
        return LatencyReproducer.from_reader(Reader(json.loads(path.read_text(encoding="utf-8")), where))
    except ValueError as error:
        raise RecordError(f"{where}: not valid JSON ({error})") from None


def read_measurement(path: Path, where: str) -> Measurement:
    """A measurement file (``where``: its name in errors), older ones too: a file from before the machine's load
    was measured counts every round as quiet; one from before ``ended`` ended as stop-early said (``stopped``)."""
    try:
        reader = Reader(json.loads(path.read_text(encoding="utf-8")), where)
    except ValueError as error:
        raise RecordError(f"{where}: not valid JSON ({error})") from None
    check_schema(reader)
    data = dict(reader.data)
    sides = {name: dict(side) if isinstance(side, dict) else side for name, side in (data.get("stacks") or {}).items()}
    for side in sides.values():  # a round's number: its place, in a file from before it was written
        if isinstance(side, dict) and isinstance(side.get("rounds"), list):
            side["rounds"] = [{"round": i, **entry} if isinstance(entry, dict) else entry
                              for i, entry in enumerate(side["rounds"], start=1)]
    data["stacks"] = sides
    if data.get("rounds") is None:
        numbers = sorted({int(entry["round"]) for side in sides.values() if isinstance(side, dict)
                          for entry in side.get("rounds") or ()})
        data["rounds"] = [{"round": n, "order": data.get("order", []), "disturbed": False, "load": {}}
                          for n in numbers]
    elif data.get("ended") is None and data["rounds"] and data["rounds"][-1].get("stopped"):
        data["ended"] = RoundsEnded.DECIDED.value
    measurement = Measurement.from_reader(Reader(data, where))
    if measurement.design.intervals < 1:
        raise RecordError(f"Unexpected value (expected at least 1) in '{where}.settings.intervals'")
    return measurement
