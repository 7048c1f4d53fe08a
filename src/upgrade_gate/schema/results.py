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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate.config.settings import Settings
from upgrade_gate.errors import ConfigError, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.judge.records import Reader
from upgrade_gate.measure.stats import RatioEstimate
from upgrade_gate.run import packages
from upgrade_gate.schema.comparison import Comparison, Side
from upgrade_gate.schema.measured import Contention, LatencyRatio
from upgrade_gate.schema.project import ProjectResults
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import RESULTS_VERSION, GateResult, VerdictRecord, check_version

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
            "schema_version": str(RESULTS_VERSION),
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
