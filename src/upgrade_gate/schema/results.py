"""The results schema: every record of a report's results.json and verdict.json, below the code that fills
them (schema imports nothing above config). judge/gather.py builds them from the workers' files, judge/policy.py adds
the gates and the verdict, and every renderer reads them, never the JSON. This module holds the whole report, its
models and stacks; the schema's other modules the parts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from upgrade_gate.config.settings import Settings
from upgrade_gate.errors import ConfigError, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.schema import codec
from upgrade_gate.schema.comparison import Attribution, Comparison, Side
from upgrade_gate.schema.measured import (
    LOCAL,
    BusyRounds,
    DeviceLatency,
    DeviceMemory,
    LatencyRatio,
    LatencyReproducer,
    RatioEstimate,
    Target,
)
from upgrade_gate.schema.measurement import Contention
from upgrade_gate.schema.project import Differences, ProjectResults, differing
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.stack import SlowdownSplit, StackResults
from upgrade_gate.schema.verdict import RESULTS_VERSION, GateResult, VerdictRecord, check_version

# -- one model ---------------------------------------------------------------------

# A variant's name is its model's, this, and the variant: "vit-ti16@int8" (catalog.VARIANT_SEPARATOR).
_VARIANT = "@"


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelResults(codec.Record):
    """One model (or quantized variant) in every stack, compared."""

    name: str = field(metadata=codec.key("model"))
    factory: str
    description: str
    source: str  # built-in or project
    variant: str  # fp32, or the quantized variant
    task_kind: str = field(metadata=codec.key("task"))
    stacks: dict[str, StackResults]  # baseline first
    comparisons: tuple[Comparison, ...]
    ratios: tuple[LatencyRatio, ...] = field(default=(), metadata=codec.key("latency_ratios"))
    # Per thread count; written as a list, each knows its thread count.
    contention: dict[int, Contention] = field(default_factory=dict, metadata=codec.custom(
        write=lambda m: [c.to_dict() for c in m.contention.values()],
        read=lambda r, key: {c.threads: c for c in map(Contention.from_reader, r.opt_children(key) or ())}))
    # Where a busy machine left a thread count unjudged: every round's ratio, disturbed or not.
    busy_rounds: tuple[BusyRounds, ...] = ()
    # On devices (`upgrade-gate device-results`): each candidate's ratio per target, thread count and method.
    device_latency: tuple[DeviceLatency, ...] = ()
    # On targets timed over ssh: each candidate's runtime memory and cold start per target and thread count.
    device_memory: tuple[DeviceMemory, ...] = ()
    # A candidate's quantized variant, per method: its lowering weighed against its quantization (judge/attribution.py).
    attributions: tuple[Attribution, ...] = ()
    # A candidate found slower than the latency gate allows in the rounds, handed on (measure/latency_reproducer.py).
    latency_reproducer: LatencyReproducer | None = None

    DERIVED = (codec.derived("fixtures", lambda m: m.fixture_hashes, after="task"),)  # for readers of the file

    @property
    def base(self) -> str:
        """The model's own name: every variant shares its weights and inputs."""
        return self.name.partition(_VARIANT)[0]

    @property
    def quantized(self) -> bool:
        return self.variant != "fp32"

    def comparison(self, actual: Side, reference: Side) -> Comparison | None:
        return next((c for c in self.comparisons if c.actual == actual and c.reference == reference), None)

    def attribution(self, stack: str, method: str) -> Attribution | None:
        return next((a for a in self.attributions if (a.stack, a.method) == (stack, method)), None)

    def ratio(self, stack: str, threads: int, method: str) -> RatioEstimate | None:
        return next((r.estimate for r in self.ratios
                     if (r.stack, r.threads, r.method) == (stack, threads, method)), None)

    def slowdown_split(self, stack: str, method: str) -> SlowdownSplit | None:
        """Where the method's time goes in the stack's profile, at its highest ratio over the thread counts."""
        ratios = [r.estimate.median for r in self.ratios if (r.stack, r.method) == (stack, method)]
        operators = self.stacks[stack].profile.get(method) if stack in self.stacks else None
        return SlowdownSplit.of(max(ratios), operators) if ratios and operators else None

    def ratios_of(self, stack: str, threads: int) -> list[RatioEstimate]:
        return [r.estimate for r in self.ratios if (r.stack, r.threads) == (stack, threads)]

    def every_round(self, stack: str, threads: int) -> list[BusyRounds]:
        """A busy thread count's ratios of every round tried, per method (none where it was not busy)."""
        return [r for r in self.busy_rounds if (r.stack, r.threads) == (stack, threads)]

    def busy_at(self, threads: int) -> Contention | None:
        """The rounds at this thread count when the machine was too busy for an interval (a ratio of so few rounds
        is no judgement: reports show none there)."""
        machine = self.contention.get(threads)
        return machine if machine is not None and machine.busy else None

    @property
    def fixture_hashes(self) -> dict[str, dict[str, str] | None]:
        """Weights and inputs hashes each stack loaded: equal means same numbers in."""
        return {name: stack.fixtures for name, stack in self.stacks.items()}


# -- the stacks ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Installed(codec.Record):
    """What the probe found in a stack's venv."""

    python: str
    executable: str
    platform: str
    cpu: str
    cpu_count: int | None
    architecture: str = field(default="", metadata=codec.key("machine"))  # platform.machine(): x86_64, aarch64
    isa: tuple[str, ...] = ()  # the ISA extensions the kernels dispatch on (compat/common.py ISA_FLAGS)
    torch_version: str
    distributions: dict[str, str | None]  # the spec's requirements by name: version, None if absent


@dataclass(frozen=True, kw_only=True, slots=True)
class ExtraRequirement(codec.Record):
    """A requirement of [tool.upgrade-gate.extra-requirements] installed into a stack."""

    requirement: str  # as configured: "timm>=1.0", "-e ."
    distribution: str | None  # the distribution it installs; None when upgrade-gate cannot tell (packages.py)


_SPEC = codec.group("spec")  # the stack's spec, as its file says


@dataclass(frozen=True, kw_only=True, slots=True)
class StackInfo(codec.Record):
    """A stack: its spec as the report shows it, and what was installed."""

    name: str = field(metadata=_SPEC)
    role: str = field(metadata=_SPEC)  # baseline or candidate
    file: str = field(metadata=_SPEC)
    description: str = field(metadata=_SPEC)
    requirements: tuple[str, ...] = field(metadata=_SPEC)
    exporter: str = field(metadata=_SPEC)
    runtime: str = field(metadata=_SPEC)
    installed: Installed | None  # None: the stack was not built for this report
    # Each written with its installed version (from packages), for readers of the file.
    extra_requirements: tuple[ExtraRequirement, ...] = field(default=(), metadata=codec.custom(
        write=lambda s: [{**e.to_dict(), "version": s.version_of(e)} for e in s.extra_requirements]))
    # Every distribution in the venv, name → version ({} when not recorded).
    packages: dict[str, str] = field(default_factory=dict)

    @property
    def is_baseline(self) -> bool:
        return self.role == "baseline"

    def version_of(self, extra: ExtraRequirement) -> str | None:
        """The installed version of what an extra requirement installs, None if unknown or absent."""
        return self.packages.get(extra.distribution) if extra.distribution else None


# -- the whole report ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Results(codec.Record):
    """results.json: the configuration, the stacks, every model's results, the project's, and the verdict."""

    tool_version: str
    generated_at: str
    config_path: str = field(metadata=codec.key("config"))
    # Written as its effective table, read back through the same declarations (config/settings.py).
    settings: Settings = field(metadata=codec.custom(
        write=lambda r: r.settings.to_dict(),
        read=lambda r, key: Settings.from_dict(r.opt_dict(key), path=Path(r.text("config")))))
    stacks: dict[str, StackInfo]  # baseline first
    models: tuple[ModelResults, ...]
    project: ProjectResults | None = None
    verdict: VerdictRecord

    DERIVED = (codec.derived("schema_version", lambda _: str(RESULTS_VERSION), after=codec.START),
               codec.derived("package_differences", after="stacks"),  # for readers of the file
               codec.derived("measured_on", lambda r: codec.encode(r.measured_on), after="package_differences"))

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
    def measured_on(self) -> Target | None:
        """Where every local latency, cold-start and memory figure was measured, as the probes read it."""
        probed = next((s.installed for s in self.stacks.values() if s.installed is not None), None)
        if probed is None:
            return None
        return Target(name=LOCAL, cpu=probed.cpu, architecture=probed.architecture, cores=probed.cpu_count,
                      isa=probed.isa)

    @property
    def device_targets(self) -> list[Target]:
        """The devices whose rounds were read into this report (`upgrade-gate device-results`), each once."""
        found = {d.target.name: d.target for m in self.models for d in m.device_latency}
        return list(found.values())

    @property
    def measured_targets(self) -> list[Target]:
        """The devices of ``device_targets`` that gave rounds: the only ones a report may say latency was measured on
        (a target ssh could not reach has its rows too, each saying why it gave none)."""
        gave = {d.target.name for m in self.models for d in m.device_latency if d.rounds}
        return [target for target in self.device_targets if target.name in gave]

    @property
    def package_differences(self) -> Differences:
        """The packages whose versions differ between the stacks' venvs (those whose packages were recorded)."""
        recorded = {name: info.packages for name, info in self.stacks.items() if info.packages}
        return differing(recorded) if len(recorded) > 1 else {}

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
