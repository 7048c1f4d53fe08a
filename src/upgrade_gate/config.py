"""The ``[tool.upgrade-gate]`` table, the model catalog, and the run plan.

Everything the parent needs is read and validated here, before any stack is
built: a typo in the configuration costs a second, not a 25-second venv build.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from upgrade_gate.errors import ConfigError
from upgrade_gate.specs import StackSpec, load_stacks
from upgrade_gate.tomlfile import Table, read_toml

# The repository holds the worker-side folders next to the parent package.
REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T", "TaskGate", "QuantizedGate")
CONFIG_ENV_VAR = "UPGRADE_GATE_CONFIG"
CACHE_ENV_VAR = "UPGRADE_GATE_CACHE"

SEVERITIES = ("hard", "soft", "off")
SETTINGS_KEYS = {
    "envs", "baseline", "suite", "models", "extra-requirements", "out", "cache", "threads", "export-jobs", "warmup",
    "iterations", "rounds", "time-budget", "timeouts", "memory-limit", "gates", "variants",
    "localize-budget", "backends-budget", "project",
}
SUITES = ("smoke", "default", "full")
GATE_KEYS = {"export", "artifact-size", "numerics", "latency", "memory", "task", "quantized", "delegation", "budgets",
             "models"}
BUDGET_KEYS = {"latency-p50-ms", "peak-rss-mb", "severity"}
# Task gates: the minimum agreement a candidate artifact must keep with the reference.
TASK_THRESHOLD_KEYS = ("min-top1-agreement", "min-cosine", "min-token-agreement")
# A quantized variant is judged by signal-to-noise and cosine against the fp32 reference instead.
QUANTIZED_THRESHOLD_KEYS = ("min-snr-db", "min-cosine", "min-top1-agreement", "min-token-agreement")
MODEL_GATE_KEYS = {"max-rel-l2", *TASK_THRESHOLD_KEYS, *QUANTIZED_THRESHOLD_KEYS}
# The float model every stack exports; quantized variants are run beside it.
FP32 = "fp32"
# Quantized variants a stack's adapter may offer (compat/*.py QUANTIZATIONS):
# int8 in both default stacks, 8da4w (ExecuTorch's LLM recipe) in the candidate.
QUANTIZED_VARIANTS = ("int8", "8da4w")
# A variant's name is its model's plus this and the variant: "vit-ti16@int8".
VARIANT_SEPARATOR = "@"
ALL_STACKS = "*"

# The stages a worker runs (compat/worker.py), each under its own deadline.
# "start" is the time before the first stage (interpreter start, imports);
# "default" covers any stage without its own entry.
EXPORT_STAGES = ("build", "eager", "eager-task", "quantize", "export", "localize", "save", "program", "backends")
RUNTIME_STAGES = ("inputs", "load", "run", "program-run", "task", "profile")
# The measurement server's steps (upgrade_gate.measure): start → load and first
# inference → warm-up, then one round at a time.
MEASURE_STAGES = ("warm-up", "round")
DEFAULT_TIMEOUTS_S = {"default": 1800.0, "start": 600.0, "export": 3600.0}
TIMEOUT_KEYS = {"default", "start", *EXPORT_STAGES, *RUNTIME_STAGES, *MEASURE_STAGES}
# A runaway export must not take the machine down (seed 000 died at 5-6 GB
# and left a 0-byte .pte); two exports may run at once, the limit is per worker.
DEFAULT_MEMORY_LIMIT = "85%"
DEFAULT_THREADS = (1, 2)
DEFAULT_ROUNDS = 7
MIN_ROUNDS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Gate:
    """One configured gate: a threshold and how much failing it matters."""

    severity: str
    threshold: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    latency_p50_ms: float | None
    peak_rss_mb: float | None
    severity: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskGate:
    """Task-aware gates; which one applies depends on the model's task."""

    severity: str = "hard"
    min_top1_agreement: float = 1.0
    min_cosine: float = 0.999
    min_token_agreement: float = 0.9

    def threshold(self, key: str) -> float:
        return float(getattr(self, key.replace("-", "_")))


@dataclass(frozen=True, kw_only=True, slots=True)
class QuantizedGate:
    """What a quantized variant must keep of the fp32 reference (the baseline's
    eager outputs): every output's SNR and cosine, and the task's agreement —
    top-1 for classifiers (one of three photos may flip), greedy tokens over
    the generation's first 32 for LLMs. Soft: the fp32 model still ships."""

    severity: str = "soft"
    min_snr_db: float = 20.0
    min_cosine: float = 0.99
    min_top1_agreement: float = 0.66
    min_token_agreement: float = 0.5

    def threshold(self, key: str) -> float:
        return float(getattr(self, key.replace("-", "_")))


@dataclass(frozen=True, kw_only=True, slots=True)
class GateSettings:
    """Defaults from the seeds: a .pte ≤ 1.5 GB, fp32 numerics to 1e-4, and no
    more than 5% slower than what ships today."""

    export: Gate = Gate(severity="hard")
    artifact_size: Gate = Gate(severity="hard", threshold=1_500_000_000)
    numerics: Gate = Gate(severity="hard", threshold=1e-4)
    latency: Gate = Gate(severity="soft", threshold=1.05)
    # A method slower by no more than this passes whatever its ratio: at tens of
    # microseconds per call the ratio measures timer and call overhead.
    latency_min_delta_ms: float = 0.05
    # Runtime memory (peak RSS of a process that loads and runs the artifact,
    # minus the same process with only the runtime started), candidate/baseline.
    memory: Gate = Gate(severity="soft", threshold=1.25)
    # A model that needs at most this much more than the baseline passes whatever its ratio.
    memory_min_delta_mb: float = 16.0
    task: TaskGate = TaskGate()
    quantized: QuantizedGate = QuantizedGate()
    # The share of a candidate artifact's operator nodes inside delegate
    # partitions (XNNPACK); off unless a team asks for it.
    delegation: Gate = Gate(severity="off", threshold=0.9)
    budgets: tuple[tuple[str, Budget], ...] = ()
    # model → {"max-rel-l2": …, "min-cosine": …}: thresholds that differ for one model
    per_model: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()

    def for_model(self, model: str, key: str) -> float:
        """The threshold ``key`` for ``model`` (or a variant, "smollm2-135m@8da4w"):
        its own if configured, else the default — the quantized gates' for a variant."""
        own = dict(dict(self.per_model).get(model, ()))
        if key in own:
            return own[key]
        if VARIANT_SEPARATOR in model:
            return self.quantized.threshold(key)
        if key == "max-rel-l2":
            return float(self.numerics.threshold or 0)
        return self.task.threshold(key)

    def to_dict(self) -> dict[str, object]:
        return {
            "export": {"severity": self.export.severity},
            "artifact-size": {"max-bytes": self.artifact_size.threshold, "severity": self.artifact_size.severity},
            "numerics": {"max-rel-l2": self.numerics.threshold, "severity": self.numerics.severity},
            "latency": {"max-ratio": self.latency.threshold, "min-delta-ms": self.latency_min_delta_ms,
                        "severity": self.latency.severity},
            "memory": {"max-ratio": self.memory.threshold, "min-delta-mb": self.memory_min_delta_mb,
                       "severity": self.memory.severity},
            "task": {"severity": self.task.severity, **{k: self.task.threshold(k) for k in TASK_THRESHOLD_KEYS}},
            "quantized": {"severity": self.quantized.severity,
                          **{k: self.quantized.threshold(k) for k in QUANTIZED_THRESHOLD_KEYS}},
            "delegation": {"min-fraction": self.delegation.threshold, "severity": self.delegation.severity},
            "models": {model: dict(overrides) for model, overrides in self.per_model},
            "budgets": {
                model: {"latency-p50-ms": b.latency_p50_ms, "peak-rss-mb": b.peak_rss_mb, "severity": b.severity}
                for model, b in self.budgets
            },
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelEntry:
    name: str
    factory: str  # module:function — inside models/ for built-in models, the project's for its own
    description: str
    suites: tuple[str, ...] = ()
    # Its export needs most of the machine's memory: no other export runs beside it.
    exclusive: bool = False
    # The user's project root for the project's own models (put on sys.path in
    # the worker); None for built-in models.
    project_root: Path | None = None
    defined_in: Path | None = None
    # The quantized variants this model has (a model that cannot quantize lists none).
    variants: tuple[str, ...] = ("int8",)
    # fp32, or the quantized variant this entry runs: then its name is "<model>@<variant>".
    variant: str = FP32

    @property
    def source(self) -> str:
        return "project" if self.project_root else "built-in"

    @property
    def base(self) -> str:
        """The model's own name: every variant shares its weights and inputs."""
        return self.name.partition(VARIANT_SEPARATOR)[0]

    @property
    def quantized(self) -> bool:
        return self.variant != FP32

    def with_variant(self, variant: str) -> ModelEntry:
        return dataclasses.replace(self, name=f"{self.base}{VARIANT_SEPARATOR}{variant}", variant=variant,
                                   description=f"{self.description} — {variant}")


PROJECT_KEYS = {"root", "install", "test", "scan", "timeout", "severity", "scan-severity", "allow"}
# Where a non-pytest test command takes its JUnit XML output path.
JUNIT_PLACEHOLDER = "{junit}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectSettings:
    """``[tool.upgrade-gate.project]``: the team's own code, tested in every stack and scanned."""

    root: Path
    # `uv pip install` arguments, run in ``root``, beside the stack's own requirements.
    install: tuple[str, ...]
    # The test command, run in ``root`` with the stack's venv first on PATH; JUnit XML
    # goes where {junit} stands (pytest commands get --junitxml added).
    test: tuple[str, ...]
    # Files and folders the API scan reads, relative to ``root``.
    scan: tuple[str, ...]
    timeout_s: float
    severity: str  # the project-tests gate
    scan_severity: str  # the api-scan gate
    # test id → why its failure on the candidate is known and accepted
    allow: tuple[tuple[str, str], ...] = ()
    defined_in: Path | None = None

    def test_command(self, junit: Path) -> list[str]:
        """The test command with its JUnit XML output at ``junit``."""
        if any(JUNIT_PLACEHOLDER in arg for arg in self.test):
            return [arg.replace(JUNIT_PLACEHOLDER, str(junit)) for arg in self.test]
        # xunit1 records each test's file, from which the pytest node id is rebuilt.
        return [*self.test, f"--junitxml={junit}", "-o", "junit_family=xunit1"]


def runs_pytest(command: list[str] | tuple[str, ...]) -> bool:
    """``pytest …``, ``py.test …`` or ``python -m pytest …``."""
    if not command:
        return False
    if Path(command[0]).name in ("pytest", "py.test"):
        return True
    return len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1:3] == ["-m", "pytest"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    config_path: Path
    envs_dir: Path
    baseline: str
    suite: str
    project_models: tuple[ModelEntry, ...]
    # stack name (or "*") → extra requirement strings, installed from the project root
    extra_requirements: tuple[tuple[str, tuple[str, ...]], ...]
    out_dir: Path
    # Content-addressed store of finished phases, shared by every report folder.
    cache_dir: Path
    # Ignore the cache's entries (still store new ones): `--fresh`.
    fresh: bool
    # Ignore cached measurements only: `--remeasure`.
    remeasure: bool
    # Intra-op thread counts: every latency measurement is made at each, in every stack.
    threads: tuple[int, ...]
    # Export phases run at once; nothing runs beside a measurement.
    export_jobs: int
    # Untimed runs per measurement process before the first round.
    warmup: int
    # Timed runs per stack, method and thread count, spread over the rounds …
    iterations: int
    # … and at least this many seconds of them (a 1 ms model gets more than 50 runs).
    time_budget_s: float
    # Alternating measurements of the stacks (A B A B …): one candidate/baseline ratio each.
    rounds: int
    # stage name (or "start", "default") → seconds
    timeouts_s: tuple[tuple[str, float], ...]
    memory_limit_bytes: int
    gates: GateSettings
    # Quantized variants to run beside fp32, where a model has them.
    variants: tuple[str, ...] = QUANTIZED_VARIANTS
    # Seconds the search for the submodules behind a failed export may take (compat/localize.py); 0: off.
    localize_budget_s: float = 300.0
    # Seconds per model for export-only tries of the candidate's other backends (compat/executorch_backends.py); 0: off.
    backends_budget_s: float = 300.0
    # The team's own tests and code ([tool.upgrade-gate.project]); None when not configured.
    project: ProjectSettings | None = None

    def timeout_key(self, stage: str) -> str:
        """The ``timeouts`` entry that applies to a stage: its own, else ``default``."""
        return stage if stage in dict(self.timeouts_s) else "default"

    def timeout_s(self, stage: str) -> float:
        return dict(self.timeouts_s)[self.timeout_key(stage)]


@dataclass(frozen=True, slots=True)
class Shard:
    """Part ``index`` of ``count`` of a run's models (`--shard 2/4`), for a CI matrix."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def takes(self, family: int) -> bool:
        """Whether the ``family``-th model family (a model with its variants, in suite order) is ours."""
        return family % self.count == self.index - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What one comparison runs: settings, stacks (baseline first) and models."""

    settings: Settings
    stacks: tuple[StackSpec, ...]
    models: tuple[ModelEntry, ...]
    # Every unit of the run before `--shard` took its part: what shards of one run share.
    selection: tuple[str, ...] = ()
    shard: Shard | None = None
    # `nox -s report -- DIR...`: shard folders to merge into the report folder.
    merge: tuple[Path, ...] = ()

    def extra_requirements(self, stack: str) -> list[str]:
        """The project's extra requirements for one stack: those for every stack, then its own."""
        extra = dict(self.settings.extra_requirements)
        return [*extra.get(ALL_STACKS, ()), *extra.get(stack, ())]

    @property
    def baseline(self) -> StackSpec:
        return self.stacks[0]

    @property
    def candidates(self) -> tuple[StackSpec, ...]:
        return self.stacks[1:]

    def stack(self, name: str) -> StackSpec:
        for spec in self.stacks:
            if spec.name == name:
                return spec
        raise ConfigError(f"no stack named {name!r}; stacks: {', '.join(s.name for s in self.stacks)}")


def cache_root() -> Path:
    """Converted assets and finished phases, shared by every run on this machine:
    ``$UPGRADE_GATE_CACHE``, else ``$XDG_CACHE_HOME/upgrade-gate``, else ``~/.cache/upgrade-gate``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "upgrade-gate"


def default_config_path() -> Path:
    """``$UPGRADE_GATE_CONFIG`` if set, else this repository's pyproject.toml."""
    return Path(os.environ.get(CONFIG_ENV_VAR) or REPO_ROOT / "pyproject.toml").resolve()


def load_settings(config_path: Path) -> Settings:
    """Read ``[tool.upgrade-gate]``; paths in it are relative to the file."""
    document = read_toml(config_path)
    tool = document.get("tool", {})
    raw = tool.get("upgrade-gate", {}) if isinstance(tool, dict) else {}
    table = Table(raw if isinstance(raw, dict) else {}, path=config_path, key="tool.upgrade-gate")
    table.reject_unknown(SETTINGS_KEYS)
    base = config_path.parent
    suite = table.get("suite", str, "default")
    if suite not in (*SUITES, "none"):
        raise table.error("suite", f"expected one of {', '.join(SUITES)}, none; got {suite!r}")
    requirements_table = table.get_table("extra-requirements")
    return Settings(
        config_path=config_path,
        envs_dir=(base / table.get("envs", str, "envs")).resolve(),
        baseline=table.get("baseline", str, "legacy"),
        suite=suite,
        project_models=_load_project_models(table.get_table("models"), project_root=base.resolve()),
        extra_requirements=tuple(
            (stack, tuple(requirements_table.get_str_list(stack, []))) for stack in requirements_table.data
        ),
        out_dir=(base / table.get("out", str, "report")).resolve(),
        cache_dir=(base / table.get("cache", str, str(cache_root() / "results"))).resolve(),
        fresh=False,
        remeasure=False,
        threads=_load_threads(table),
        export_jobs=table.positive("export-jobs", int, 2),
        # At least 10 warm-up and 50 timed runs: fewer say nothing on a noisy machine.
        warmup=table.positive("warmup", int, 10, minimum=10),
        iterations=table.positive("iterations", int, 50, minimum=50),
        time_budget_s=table.positive("time-budget", float, 2.0),
        # Fewer rounds give an interval as wide as the rounds' spread: never conclusive.
        rounds=table.positive("rounds", int, DEFAULT_ROUNDS, minimum=MIN_ROUNDS),
        timeouts_s=_load_timeouts(table.get_table("timeouts")),
        memory_limit_bytes=parse_memory_limit(table, "memory-limit", total_memory_bytes()),
        gates=_load_gates(table.get_table("gates")),
        variants=_load_variants(table, "variants", QUANTIZED_VARIANTS),
        localize_budget_s=table.non_negative("localize-budget", float, 300.0),
        backends_budget_s=table.non_negative("backends-budget", float, 300.0),
        project=_load_project(table, base) if "project" in table.data else None,
    )


def _command(table: Table, name: str, default: list[str]) -> list[str]:
    """A command as an array of arguments, or one string split like a shell would."""
    raw = table.data.get(name, default)
    if isinstance(raw, str):
        try:
            return shlex.split(raw)
        except ValueError as error:
            raise table.error(name, f"cannot split {raw!r} into arguments: {error}") from None
    return table.get_str_list(name, default)


def _load_project(settings: Table, base: Path) -> ProjectSettings:
    table = settings.get_table("project")
    table.reject_unknown(PROJECT_KEYS)
    root = (base / table.get("root", str, ".")).resolve()
    if not root.is_dir():
        raise table.error("root", f"{root} is not a folder; give the project's folder relative to {base}")
    install = _command(table, "install", ["."])
    if not install:
        raise table.error("install", 'nothing to install; e.g. ["-e", ".[test]"]')
    test = _command(table, "test", ["python", "-m", "pytest"])
    if not test:
        raise table.error("test", 'no command; e.g. "python -m pytest tests"')
    if not runs_pytest(test) and not any(JUNIT_PLACEHOLDER in arg for arg in test):
        raise table.error("test", f"cannot tell where {test[0]!r} writes JUnit XML; put {JUNIT_PLACEHOLDER} where the "
                                  "command takes that file's path (pytest commands get --junitxml added)")
    scan = table.get_str_list("scan", ["."])
    for path in scan:
        if not (root / path).exists():
            raise table.error("scan", f"{path!r} does not exist under {root}")
    allow = table.get_table("allow")
    for test_id in allow.data:
        if not allow.get(test_id, str, "").strip():
            raise allow.error(test_id, "give the reason the break is accepted, as a string")
    return ProjectSettings(
        root=root, install=tuple(install), test=tuple(test), scan=tuple(scan),
        timeout_s=table.positive("timeout", float, 1800.0),
        severity=_severity(table, "severity", "hard"), scan_severity=_severity(table, "scan-severity", "soft"),
        allow=tuple((test_id, allow.data[test_id]) for test_id in allow.data), defined_in=table.path,
    )


def _load_variants(table: Table, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A list of quantized variant names, each known and once."""
    names = table.get_str_list(key, list(default))
    for name in names:
        if name not in QUANTIZED_VARIANTS:
            raise table.error(key, f"unknown variant {name!r}; expected some of {', '.join(QUANTIZED_VARIANTS)} "
                                   "(fp32 always runs)")
    if len(set(names)) != len(names):
        raise table.error(key, f"a variant appears twice in {names!r}")
    return tuple(names)


def _load_threads(table: Table) -> tuple[int, ...]:
    """``threads = [1, 2]``, or one count; each once, in the order given (the first is the default)."""
    raw = table.data.get("threads", list(DEFAULT_THREADS))
    counts = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(counts, list) or not counts:
        raise table.error("threads", f"expected a thread count or a list of them like [1, 2], got {raw!r}")
    for count in counts:
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise table.error("threads", f"thread counts must be integers greater than 0, got {count!r}")
    if len(set(counts)) != len(counts):
        raise table.error("threads", f"a thread count appears twice in {counts!r}")
    return tuple(counts)


def _load_timeouts(table: Table) -> tuple[tuple[str, float], ...]:
    table.reject_unknown(TIMEOUT_KEYS)
    timeouts = {**DEFAULT_TIMEOUTS_S, **{key: table.positive(key, float, 0.0) for key in table.data}}
    return tuple(sorted(timeouts.items()))


def total_memory_bytes() -> int:
    """The machine's memory (MemTotal), or 0 where /proc/meminfo is not there."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_memory_limit(table: Table, name: str, total: int) -> int:
    """``"85%"`` of the machine, ``"12 GiB"``, ``"12GB"`` or a number of bytes."""
    raw = table.data.get(name, DEFAULT_MEMORY_LIMIT)
    hint = 'expected a share of the machine like "85%", a size like "12 GiB", or bytes'
    if isinstance(raw, int) and not isinstance(raw, bool):
        limit = raw
    elif isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            share = float(raw.strip()[:-1])
        except ValueError:
            raise table.error(name, f"{hint}; got {raw!r}") from None
        if not 0 < share <= 100:
            raise table.error(name, f"a share must be in (0, 100]%, got {raw!r}")
        if not total:
            raise table.error(name, "this machine's memory is unknown (no /proc/meminfo); give a size like \"12 GiB\"")
        limit = int(total * share / 100)
    elif isinstance(raw, str):
        size = _SIZE.fullmatch(raw)
        if size is None or size.group(2).upper() not in _UNITS:
            raise table.error(name, f"{hint}; got {raw!r}")
        limit = int(float(size.group(1)) * _UNITS[size.group(2).upper()])
    else:
        raise table.error(name, f"{hint}; got {raw!r}")
    if limit <= 0:
        raise table.error(name, f"must be greater than 0, got {raw!r}")
    return limit



def _load_project_models(table: Table, *, project_root: Path) -> tuple[ModelEntry, ...]:
    """``name = "package.module:factory"`` or ``name = { factory = …, description = … }``."""
    entries = []
    for name, raw in table.data.items():
        exclusive = False
        variants: tuple[str, ...] = ("int8",)
        if VARIANT_SEPARATOR in name:
            raise table.error(name, f"a model's name may not contain {VARIANT_SEPARATOR!r}: it names variants")
        if isinstance(raw, str):
            factory, description = raw, None
        else:
            entry = table.get_table(name)
            entry.reject_unknown({"factory", "description", "exclusive", "variants"})
            variants = _load_variants(entry, "variants", variants)
            if "factory" not in entry.data:
                raise entry.error("factory", "missing; expected \"package.module:function\"")
            factory, description = entry.get("factory", str, ""), entry.get("description", str, "")
            exclusive = entry.get("exclusive", bool, False)
        module, _, function = factory.partition(":")
        if not (module and function and all(part.isidentifier() for part in (*module.split("."), function))):
            raise table.error(name, f"expected \"package.module:function\", got {factory!r}")
        entries.append(ModelEntry(name=name, factory=factory, description=description or f"{factory} (project model)",
                                  exclusive=exclusive, project_root=project_root, defined_in=table.path,
                                  variants=variants))
    return tuple(entries)


def _load_gates(table: Table) -> GateSettings:
    table.reject_unknown(GATE_KEYS)
    defaults = GateSettings()

    def threshold_gate(name: str, threshold_key: str, default: Gate, *others: str) -> Gate:
        gate = table.get_table(name)
        gate.reject_unknown({threshold_key, "severity", *others})
        return Gate(
            severity=_severity(gate, "severity", default.severity),
            threshold=gate.positive(threshold_key, float, float(default.threshold or 0)),
        )

    budgets = []
    budgets_table = table.get_table("budgets")
    for model in budgets_table.data:
        budget = budgets_table.get_table(model)
        budget.reject_unknown(BUDGET_KEYS)
        budgets.append(
            (
                model,
                Budget(
                    latency_p50_ms=budget.positive("latency-p50-ms", float, 0.0) if "latency-p50-ms" in budget.data else None,
                    peak_rss_mb=budget.positive("peak-rss-mb", float, 0.0) if "peak-rss-mb" in budget.data else None,
                    severity=_severity(budget, "severity", "hard"),
                ),
            )
        )
    def thresholds(name: str, default: T, keys: tuple[str, ...]) -> T:
        """A table of minimum values sharing one severity: task, quantized."""
        owner = table.get_table(name)
        owner.reject_unknown({"severity", *keys})
        return type(default)(
            severity=_severity(owner, "severity", default.severity),
            **{key.replace("-", "_"): owner.positive(key, float, default.threshold(key)) for key in keys},
        )

    task = thresholds("task", defaults.task, TASK_THRESHOLD_KEYS)
    quantized = thresholds("quantized", defaults.quantized, QUANTIZED_THRESHOLD_KEYS)
    per_model = []
    models_table = table.get_table("models")
    for model in models_table.data:
        overrides = models_table.get_table(model)
        overrides.reject_unknown(MODEL_GATE_KEYS)
        per_model.append((model, tuple((key, overrides.positive(key, float, 0.0)) for key in overrides.data)))
    return GateSettings(
        export=Gate(severity=_severity(table, "export", defaults.export.severity)),
        artifact_size=threshold_gate("artifact-size", "max-bytes", defaults.artifact_size),
        numerics=threshold_gate("numerics", "max-rel-l2", defaults.numerics),
        latency=threshold_gate("latency", "max-ratio", defaults.latency, "min-delta-ms"),
        latency_min_delta_ms=table.get_table("latency").positive("min-delta-ms", float, defaults.latency_min_delta_ms),
        memory=threshold_gate("memory", "max-ratio", defaults.memory, "min-delta-mb"),
        memory_min_delta_mb=table.get_table("memory").positive("min-delta-mb", float, defaults.memory_min_delta_mb),
        task=task,
        quantized=quantized,
        delegation=threshold_gate("delegation", "min-fraction", defaults.delegation),
        budgets=tuple(budgets),
        per_model=tuple(per_model),
    )


def _severity(owner: Table, name: str, default: str) -> str:
    """A gate's severity: hard, soft or off."""
    value = owner.get(name, str, default)
    if value not in SEVERITIES:
        raise owner.error(name, f"expected one of {', '.join(SEVERITIES)}, got {value!r}")
    return value


def load_catalog(path: Path) -> dict[str, ModelEntry]:
    """The models the tool knows by name (``models/suite.toml``)."""
    catalog = {}
    for name, raw in read_toml(path).items():
        entry = Table(raw if isinstance(raw, dict) else {}, path=path, key=name)
        if not isinstance(raw, dict):
            raise ConfigError("expected a table with factory and description", path=path, key=name)
        entry.reject_unknown({"factory", "description", "suites", "exclusive", "variants"})
        factory = entry.get("factory", str, "")
        if ":" not in factory:
            raise entry.error("factory", f"expected 'module:function', got {factory!r}")
        suites = entry.get_str_list("suites", [])
        for suite in suites:
            if suite not in SUITES:
                raise entry.error("suites", f"unknown suite {suite!r}; expected some of {', '.join(SUITES)}")
        catalog[name] = ModelEntry(name=name, factory=factory, description=entry.get("description", str, name),
                                   suites=tuple(suites), exclusive=entry.get("exclusive", bool, False),
                                   defined_in=path, variants=_load_variants(entry, "variants", ("int8",)))
    return catalog


def stacks_of(settings: Settings) -> list[StackSpec]:
    """The stack specs the settings point at, baseline first."""
    return load_stacks(
        settings.envs_dir,
        baseline=settings.baseline,
        adapters_dir=REPO_ROOT / "compat",
        config_path=settings.config_path,
    )


def parse_posargs(posargs: list[str]) -> argparse.Namespace:
    """Options after ``--`` on the nox command line."""
    parser = argparse.ArgumentParser(prog="nox -s compare --", exit_on_error=False)
    parser.add_argument("--out", type=Path, help="report folder (default: [tool.upgrade-gate] out)")
    parser.add_argument("--suite", help=f"built-in suite: {', '.join(SUITES)} or none (default: [tool.upgrade-gate] suite)")
    parser.add_argument("--models", help="comma-separated model names, instead of the suite and the project's models")
    parser.add_argument("--fresh", action="store_true", help="run every phase again instead of reusing cached results")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure latency, cold start and memory again; reuse cached exports and checks")
    parser.add_argument("--shard", help="K/N: run only the K-th of N parts of the models (a CI matrix job)")
    parser.add_argument("merge", nargs="*", type=Path, metavar="SHARD_DIR",
                        help="`nox -s report` only: shard folders to merge into one report")
    try:
        args, unknown = parser.parse_known_args(posargs)
    except argparse.ArgumentError as error:
        raise ConfigError(f"{error}; {parser.format_usage().strip()}") from None
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}; {parser.format_usage().strip()}")
    return args


def load_plan(posargs: list[str], *, invoked_from: Path, config_path: Path | None = None,
              models_required: bool = True) -> Plan:
    """Everything a run needs, validated; raises ConfigError naming file and key.

    `nox -s compat` runs no models: it needs ``[tool.upgrade-gate.project]`` instead."""
    config_path = config_path or default_config_path()
    args = parse_posargs(posargs)
    settings = load_settings(config_path)
    stacks = stacks_of(settings)
    catalog_path = REPO_ROOT / "models" / "suite.toml"
    catalog = load_catalog(catalog_path)
    for entry in settings.project_models:
        if entry.name in catalog:
            raise ConfigError(
                f"{entry.name!r} is a built-in model's name; rename the project's model",
                path=config_path, key=f"tool.upgrade-gate.models.{entry.name}",
            )
        catalog[entry.name] = entry
    if args.suite is not None and args.suite not in (*SUITES, "none"):
        raise ConfigError(f"unknown suite {args.suite!r}; expected one of {', '.join(SUITES)}, none", key="--suite")
    if args.models is not None:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
        if not names:
            raise ConfigError("no models to run", key="--models")
        for name in names:
            base, _, variant = name.partition(VARIANT_SEPARATOR)
            if base not in catalog:
                raise ConfigError(f"unknown model {base!r}; known models: {', '.join(sorted(catalog))}", key="--models")
            if variant and variant != FP32 and variant not in catalog[base].variants:
                raise ConfigError(f"{base} has no variant {variant!r}; its variants: "
                                  f"{', '.join((FP32, *catalog[base].variants))}", key="--models")
    else:
        suite = args.suite or settings.suite
        names = [e.name for e in catalog.values() if suite in e.suites]
        names += [e.name for e in settings.project_models]
        if not names and models_required:
            raise ConfigError(
                f"no models to run: suite {suite!r} and no [tool.upgrade-gate.models] entries",
                path=config_path, key="tool.upgrade-gate.suite",
            )
    for model, _ in (*settings.gates.budgets, *settings.gates.per_model):
        base, _, variant = model.partition(VARIANT_SEPARATOR)
        if base not in catalog or (variant and variant not in catalog[base].variants):
            raise ConfigError(
                f"gates for unknown model {model!r}; known models: {', '.join(sorted(catalog))}"
                f" (a quantized variant as \"<model>{VARIANT_SEPARATOR}int8\")",
                path=config_path,
                key="tool.upgrade-gate.gates",
            )
    out_dir = (invoked_from / args.out).resolve() if args.out else settings.out_dir
    settings = dataclasses.replace(settings, out_dir=out_dir, fresh=args.fresh, remeasure=args.remeasure)
    units = tuple({u.name: u for name in names for u in _units(catalog, name, settings.variants)}.values())
    shard = parse_shard(args.shard) if args.shard is not None else None
    families = list(dict.fromkeys(u.base for u in units))
    chosen = tuple(u for u in units if shard is None or shard.takes(families.index(u.base)))
    return Plan(settings=settings, stacks=tuple(stacks), models=chosen, selection=tuple(u.name for u in units),
                shard=shard, merge=tuple((invoked_from / d).resolve() for d in args.merge))


def parse_shard(text: str) -> Shard:
    index, _, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        raise ConfigError(f"{text!r} is not K/N (the K-th of N parts, e.g. 2/4)", key="--shard") from None
    if not 1 <= shard.index <= shard.count:
        raise ConfigError(f"{text!r}: K must be between 1 and N", key="--shard")
    return shard


def _units(catalog: dict[str, ModelEntry], name: str, variants: tuple[str, ...]) -> list[ModelEntry]:
    """What a name runs: "vit-ti16" its fp32 model and each of its quantized
    variants the settings ask for; "vit-ti16@int8" that variant alone."""
    base, _, variant = name.partition(VARIANT_SEPARATOR)
    entry = catalog[base]
    if variant:
        return [entry if variant == FP32 else entry.with_variant(variant)]
    return [entry, *(entry.with_variant(v) for v in variants if v in entry.variants)]

