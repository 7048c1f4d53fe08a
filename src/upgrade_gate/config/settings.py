"""``[tool.upgrade-gate]``: every setting declared once.

Each setting is one declaration below — its key, its default as written in
TOML, how a value is read and checked, and its help — and everything else is
derived from the declarations (nox's ``_options.py`` is the model):

- ``load_settings`` reads a configuration file through them;
- ``Settings.to_dict`` writes the effective table back (results.json's
  ``settings``), and ``Settings.from_dict`` reads that through the same parsers;
- ``defaults_text`` renders the commented table of defaults that pyproject.toml
  shows (a test keeps the two equal);
- the command-line options that override a setting (``--out``, ``--suite``,
  upgrade_gate.config.plan) are read by the setting's own parser.

Paths in the table are relative to the file that holds it. Everything is
checked before any stack is built: a typo costs a second, not a venv build.
Longer than most modules on purpose: every setting, with its parser, in one place.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate.config import catalog
from upgrade_gate.config.catalog import QUANTIZED_VARIANTS, SUITES, VARIANT_SEPARATOR, ModelEntry
from upgrade_gate.config.tomlfile import Table, read_toml
from upgrade_gate.errors import ConfigError
from upgrade_gate.layout import cache_root
from upgrade_gate.measure.stats import fewest_rounds
from upgrade_gate.run.stages import EXPORT_STAGES, MEASURE_STAGES, RUNTIME_STAGES

CONFIG_ENV_VAR = "UPGRADE_GATE_CONFIG"
TABLE = "tool.upgrade-gate"
SEVERITIES = ("hard", "soft", "off")
ALL_STACKS = "*"


def default_config_path() -> Path:
    """``$UPGRADE_GATE_CONFIG`` if set, else the pyproject.toml of the folder nox runs in: the
    noxfile's own (nox changes into it), a team's repository, or this checkout."""
    return Path(os.environ.get(CONFIG_ENV_VAR) or Path.cwd() / "pyproject.toml").resolve()


# -- how values are read ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Kind:
    """How one setting's TOML value becomes the value the tool uses, and back."""

    read: Callable[[Table, str, Any, Path], Any]  # (table, key, raw value, the file's folder) → value
    write: Callable[[Any], Any] = lambda value: value


def _raw(table: Table, key: str, default: Any) -> Any:
    return table.data.get(key, default)


def _text(choices: tuple[str, ...] = ()) -> Kind:
    def read(table: Table, key: str, raw: Any, base: Path) -> str:
        value = table.get(key, str, raw)
        if choices and value not in choices:
            raise table.error(key, f"expected one of {', '.join(choices)}; got {value!r}")
        return value
    return Kind(read=read)


def _folder(table: Table, key: str, raw: Any, base: Path) -> Path:
    text = table.get(key, str, raw)
    if not text.strip():
        raise table.error(key, "empty; give a folder")
    return (base / text).resolve()


FOLDER = Kind(read=_folder, write=str)


def _names(table: Table, key: str, raw: Any, base: Path) -> tuple[str, ...]:
    names = table.get_str_list(key, raw)
    if len(set(names)) != len(names):
        raise table.error(key, f"a name appears twice in {names!r}")
    return tuple(names)


NAMES = Kind(read=_names, write=list)


def _integer(minimum: int) -> Kind:
    def read(table: Table, key: str, raw: Any, base: Path) -> int:
        return table.positive(key, int, raw, minimum=minimum)
    return Kind(read=read)


def _number(*, zero_is_off: bool = False) -> Kind:
    """A finite number: greater than 0, or 0 and more where 0 turns a feature off."""
    def read(table: Table, key: str, raw: Any, base: Path) -> float:
        value = finite(table, key, raw)
        if zero_is_off and value < 0:
            raise table.error(key, f"must be 0 (off) or more, got {value!r}")
        if not zero_is_off and value <= 0:
            raise table.error(key, f"must be greater than 0, got {value!r}")
        return value
    return Kind(read=read)


def finite(table: Table, key: str, default: Any) -> float:
    """A number that is one: TOML's nan and inf are not a duration, a size or a threshold."""
    value = table.get(key, float, default)
    if not math.isfinite(value):
        raise table.error(key, f"must be a finite number, got {table.data.get(key, default)!r}")
    return float(value)


def _threads(table: Table, key: str, raw: Any, base: Path) -> tuple[int, ...]:
    """``threads = [1, 2]``, or one count; each once, in the order given (the first is the default)."""
    counts = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(counts, (list, tuple)) or not counts:
        raise table.error(key, f"expected a thread count or a list of them like [1, 2], got {raw!r}")
    for count in counts:
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise table.error(key, f"thread counts must be integers greater than 0, got {count!r}")
    if len(set(counts)) != len(counts):
        raise table.error(key, f"a thread count appears twice in {list(counts)!r}")
    return tuple(counts)


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


def parse_memory_limit(table: Table, name: str, raw: Any, total: int) -> int:
    """``"85%"`` of the machine, ``"12 GiB"``, ``"12GB"`` or a number of bytes."""
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


MEMORY = Kind(read=lambda table, key, raw, base: parse_memory_limit(table, key, raw, total_memory_bytes()))
VARIANTS = Kind(read=lambda table, key, raw, base: catalog.load_variants(table, key, tuple(raw)), write=list)
THREADS = Kind(read=_threads, write=list)


def severity(table: Table, name: str, default: str) -> str:
    """A gate's severity: hard, soft or off."""
    value = table.get(name, str, default)
    if value not in SEVERITIES:
        raise table.error(name, f"expected one of {', '.join(SEVERITIES)}, got {value!r}")
    return value


# -- the declarations --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One key of ``[tool.upgrade-gate]``."""

    key: str
    attribute: str  # on Settings
    default: Any  # as written in TOML
    kind: Kind
    help: str
    shown: str | None = None  # the default as the docs show it, where it is computed (the cache folder)
    flag: str | None = None  # the command-line option that overrides it


OPTIONS = (
    # The built-in stacks (legacy, candidate) are upgrade-gate's own envs/: a team's folder need not exist.
    Option(key="envs", attribute="envs_dir", default="envs", kind=FOLDER,
           help="your stack specs, one *.toml per stack: added to the built-in ones, or replacing one by name"),
    Option(key="baseline", attribute="baseline", default="legacy", kind=_text(),
           help="the stack shipped today, by spec name"),
    Option(key="candidates", attribute="candidates", default=[], kind=NAMES,
           help="the stacks to judge against it ([]: every other spec)"),
    Option(key="suite", attribute="suite", default="default", kind=_text((*SUITES, catalog.NO_SUITE)), flag="--suite",
           help="built-in models to run: smoke, default, full or none (models/suite.toml)"),
    Option(key="out", attribute="out_dir", default="report", kind=FOLDER, flag="--out",
           help="report folder (`nox -s compare -- --out DIR` overrides)"),
    Option(key="cache", attribute="cache_dir", default=None, kind=FOLDER,
           shown='"~/.cache/upgrade-gate/results"',
           help="finished phases by content hash (default: $UPGRADE_GATE_CACHE/results)"),
    Option(key="threads", attribute="threads", default=[1, 2], kind=THREADS,
           help="intra-op thread counts: latency is measured at each, set identically in every stack"),
    Option(key="export-jobs", attribute="export_jobs", default=2, kind=_integer(1),
           help="export phases at once (each is one busy core); nothing runs beside a measurement"),
    # At least 10 warm-up and 50 timed runs: fewer say nothing on a noisy machine.
    Option(key="warmup", attribute="warmup", default=10, kind=_integer(10),
           help="untimed runs per measurement process, before its first round (at least 10)"),
    Option(key="iterations", attribute="iterations", default=50, kind=_integer(50),
           help="timed runs per stack, method and thread count, spread over the rounds (at least 50)"),
    Option(key="time-budget", attribute="time_budget_s", default=2.0, kind=_number(),
           help="… or at least this many seconds of them, whichever is more"),
    # Fewer than 6 rounds cannot give the median a 95% interval; 9 is the fewest that trims it
    # ([2nd, 8th] of 9 ratios, 96.1%: upgrade_gate.measure.stats).
    Option(key="rounds", attribute="rounds", default=9, kind=_integer(fewest_rounds()),
           help="quiet rounds, the stacks in turn (A B, B A, …), one candidate/baseline ratio each (at least 6)"),
    # A runaway export must not take the machine down (seed 000 died at 5-6 GB
    # and left a 0-byte .pte); two exports may run at once, the limit is per worker.
    Option(key="memory-limit", attribute="memory_limit_bytes", default="85%", kind=MEMORY,
           help='per worker (with its children): "85%" of the machine, "12 GiB", or bytes'),
    Option(key="variants", attribute="variants", default=list(QUANTIZED_VARIANTS), kind=VARIANTS,
           help="quantized variants run beside fp32 where a model has them ([] for none)"),
    Option(key="localize-budget", attribute="localize_budget_s", default=300, kind=_number(zero_is_off=True),
           help="seconds to find the submodules behind a failed export (compat/localize.py); 0: off"),
    Option(key="backends-budget", attribute="backends_budget_s", default=300, kind=_number(zero_is_off=True),
           help="seconds per model for export-only tries of the candidate's other backends; 0: off"),
)
OPTION = {option.key: option for option in OPTIONS}
# Sub-tables, each read by its own function below.
TABLES = ("timeouts", "gates", "models", "extra-requirements", "project")

# Deadlines in seconds per worker stage.
TIMEOUT_KEYS = ("default", "start", *EXPORT_STAGES, *RUNTIME_STAGES, *MEASURE_STAGES)
DEFAULT_TIMEOUTS_S = {"default": 1800, "start": 600, "export": 3600}
TIMEOUTS_HELP = (
    "Deadlines in seconds per worker stage; a stage running longer is killed and",
    "recorded as a timeout. \"start\" is the worker's start-up, \"default\" any stage",
    f"without its own entry. Stages: {' '.join(EXPORT_STAGES)}",
    f"(export phase), {' '.join(RUNTIME_STAGES)} (runtime phase), load {' '.join(MEASURE_STAGES)}",
    "(measurement: load covers the cold start, round one timed round).",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class GateOption:
    """One gate of ``[tool.upgrade-gate.gates]``: its severity, and its thresholds
    (the first is the gate's own; the others qualify it)."""

    key: str
    severity: str
    thresholds: tuple[tuple[str, float], ...] = ()
    help: tuple[str, ...] = ()  # comment lines above it
    note: str = ""  # a comment after it


GATE_OPTIONS = (
    GateOption(key="export", severity="hard", note="every candidate model exports, loads and runs"),
    GateOption(key="artifact-size", severity="hard", thresholds=(("max-bytes", 1_500_000_000),)),
    GateOption(key="numerics", severity="hard", thresholds=(("max-rel-l2", 1e-4),),
               note="candidate artifact vs baseline eager, per output"),
    GateOption(key="latency", severity="soft", thresholds=(("max-ratio", 1.05), ("min-delta-ms", 0.05)), help=(
        "Candidate/baseline latency per thread count and method: the median of the quiet rounds' ratios and",
        "its interval (order statistics, ≥ 95% coverage). Fails when the interval lies wholly above max-ratio, is",
        "inconclusive when it straddles it; methods at most min-delta-ms slower (at the interval's top) always pass.",
        "Fewer than 6 quiet rounds at a thread count (the machine was busy): incomplete, neither failed nor passed.")),
    GateOption(key="memory", severity="soft", thresholds=(("max-ratio", 1.25), ("min-delta-mb", 16)), help=(
        "Runtime memory (peak RSS of a fresh process that loads and runs the model, minus the same process",
        "with only the runtime started), candidate/baseline; at most min-delta-mb MiB more always passes.")),
    GateOption(key="task", severity="hard", thresholds=(
        ("min-top1-agreement", 1.0), ("min-cosine", 0.999), ("min-token-agreement", 0.9)), help=(
        "Task-aware gates, candidate artifact vs baseline eager: classifiers' top-1",
        "agreement, encoders' embedding cosine, LLMs' greedy token agreement.")),
    GateOption(key="quantized", severity="soft", thresholds=(
        ("min-snr-db", 20), ("min-cosine", 0.99), ("min-top1-agreement", 0.66), ("min-token-agreement", 0.5)), help=(
        "Quantized variants (vit-ti16@int8 …) against the fp32 reference: every output's SNR and cosine,",
        "classifiers' top-1 agreement, LLMs' greedy tokens over the first 32. Soft: the fp32 model still ships.")),
    GateOption(key="delegation", severity="off", thresholds=(("min-fraction", 0.9),), help=(
        "Share of a candidate artifact's operator nodes inside delegate partitions (XNNPACK), every method.",)),
)
GATE_OPTION = {gate.key: gate for gate in GATE_OPTIONS}
GATE_TABLES = ("budgets", "models")
BUDGET_KEYS = ("latency-p50-ms", "peak-rss-mb")
# A threshold set for one model (gates.models.<name>) belongs to the gate that owns its
# key: numerics or the task gates for a float model; a quantized variant's are all the quantized gates'.
FLOAT_MODEL_KEYS = {"max-rel-l2": "numerics", **{key: "task" for key, _ in GATE_OPTION["task"].thresholds}}
MODEL_GATE_KEYS = {*FLOAT_MODEL_KEYS, *(key for key, _ in GATE_OPTION["quantized"].thresholds)}


# -- the settings ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Gate:
    """One configured gate: how much failing it matters, and its thresholds by key."""

    severity: str
    thresholds: tuple[tuple[str, float], ...] = ()

    @property
    def threshold(self) -> float:
        """The gate's own threshold (max-ratio, max-rel-l2 …)."""
        return self.thresholds[0][1]

    def __getitem__(self, key: str) -> float:
        return dict(self.thresholds)[key]


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    latency_p50_ms: float | None
    peak_rss_mb: float | None
    severity: str


@dataclass(frozen=True, kw_only=True, slots=True)
class GateSettings:
    """Every gate by name, per-model budgets, and thresholds that differ for one model."""

    gates: tuple[tuple[str, Gate], ...]
    budgets: tuple[tuple[str, Budget], ...] = ()
    # model → ((key, value), …): thresholds that differ for one model or variant
    per_model: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()

    @classmethod
    def defaults(cls) -> GateSettings:
        return cls(gates=tuple((g.key, Gate(severity=g.severity, thresholds=g.thresholds)) for g in GATE_OPTIONS))

    def __getitem__(self, name: str) -> Gate:
        return dict(self.gates)[name]

    def for_model(self, model: str, key: str) -> float:
        """The threshold ``key`` for ``model`` (or a variant, "smollm2-135m@8da4w"):
        its own if configured, else the default — the quantized gates' for a variant."""
        own = dict(dict(self.per_model).get(model, ()))
        if key in own:
            return own[key]
        owner = "quantized" if VARIANT_SEPARATOR in model else FLOAT_MODEL_KEYS.get(key, "quantized")
        return self[owner][key]

    def to_dict(self) -> dict[str, Any]:
        # As they are written: a gate without thresholds is its severity alone (`export = "hard"`).
        table: dict[str, Any] = {name: {**dict(gate.thresholds), "severity": gate.severity} if gate.thresholds
                                 else gate.severity for name, gate in self.gates}
        table["budgets"] = {model: {"latency-p50-ms": b.latency_p50_ms, "peak-rss-mb": b.peak_rss_mb,
                                    "severity": b.severity} for model, b in self.budgets}
        table["models"] = {model: dict(overrides) for model, overrides in self.per_model}
        return table


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

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "install": list(self.install), "test": list(self.test),
                "scan": list(self.scan), "timeout": self.timeout_s, "severity": self.severity,
                "scan-severity": self.scan_severity, "allow": dict(self.allow)}


def runs_pytest(command: list[str] | tuple[str, ...]) -> bool:
    """``pytest …``, ``py.test …`` or ``python -m pytest …``."""
    if not command:
        return False
    if Path(command[0]).name in ("pytest", "py.test"):
        return True
    return len(command) >= 3 and Path(command[0]).name.startswith("python") and list(command[1:3]) == ["-m", "pytest"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """``[tool.upgrade-gate]`` read: one attribute per declaration (``OPTIONS``) and per sub-table."""

    config_path: Path
    envs_dir: Path
    baseline: str
    candidates: tuple[str, ...]
    suite: str
    out_dir: Path
    # Content-addressed store of finished phases, shared by every report folder.
    cache_dir: Path
    # Intra-op thread counts: every latency measurement is made at each, in every stack.
    threads: tuple[int, ...]
    export_jobs: int
    warmup: int
    iterations: int
    time_budget_s: float
    rounds: int
    memory_limit_bytes: int
    variants: tuple[str, ...]
    localize_budget_s: float
    backends_budget_s: float
    # stage name (or "start", "default") → seconds
    timeouts_s: tuple[tuple[str, float], ...]
    gates: GateSettings
    project_models: tuple[ModelEntry, ...] = ()
    # stack name (or "*") → extra requirement strings, installed from the project root
    extra_requirements: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The team's own tests and code ([tool.upgrade-gate.project]); None when not configured.
    project: ProjectSettings | None = field(default=None)

    def timeout_key(self, stage: str) -> str:
        """The ``timeouts`` entry that applies to a stage: its own, else ``default``."""
        return stage if stage in dict(self.timeouts_s) else "default"

    def timeout_s(self, stage: str) -> float:
        return dict(self.timeouts_s)[self.timeout_key(stage)]

    def to_dict(self) -> dict[str, Any]:
        """The effective ``[tool.upgrade-gate]`` table, every default filled in, paths absolute."""
        table = {option.key: option.kind.write(getattr(self, option.attribute)) for option in OPTIONS}
        table["timeouts"] = dict(self.timeouts_s)
        table["gates"] = self.gates.to_dict()
        table["models"] = catalog.project_model_table(self.project_models)
        table["extra-requirements"] = {stack: list(reqs) for stack, reqs in self.extra_requirements}
        if self.project is not None:
            table["project"] = self.project.to_dict()
        return table

    @classmethod
    def from_dict(cls, table: dict[str, Any], *, path: Path) -> Settings:
        """What ``to_dict`` wrote, read back through the same declarations; nothing
        on this machine is checked (a report may come from another one)."""
        return _load(Table(table, path=path, key=TABLE), path, check_files=False)


def load_settings(config_path: Path) -> Settings:
    """Read ``[tool.upgrade-gate]``; paths in it are relative to the file."""
    document = read_toml(config_path)
    tool = document.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"expected a table, got {tool!r}", path=config_path, key="tool")
    raw = tool.get("upgrade-gate", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a table of settings, got {raw!r}; write [tool.upgrade-gate] and its keys",
                          path=config_path, key=TABLE)
    return _load(Table(raw, path=config_path, key=TABLE), config_path, check_files=True)


def _load(table: Table, config_path: Path, *, check_files: bool) -> Settings:
    table.reject_unknown({*OPTION, *TABLES})
    base = config_path.parent
    values = {option.attribute: option.kind.read(table, option.key, _raw(table, option.key, option.default), base)
              for option in OPTIONS if option.default is not None or option.key in table.data}
    values.setdefault("cache_dir", cache_root() / "results")
    extra = table.get_table("extra-requirements")
    return Settings(
        config_path=config_path, **values,
        timeouts_s=_load_timeouts(table.get_table("timeouts")),
        gates=_load_gates(table.get_table("gates")),
        project_models=catalog.load_project_models(table.get_table("models"), project_root=base.resolve()),
        extra_requirements=tuple((stack, tuple(extra.get_str_list(stack, []))) for stack in extra.data),
        project=_load_project(table.get_table("project"), base, check_files) if "project" in table.data else None,
    )


def _load_timeouts(table: Table) -> tuple[tuple[str, float], ...]:
    table.reject_unknown(set(TIMEOUT_KEYS))
    timeouts = {key: float(value) for key, value in DEFAULT_TIMEOUTS_S.items()}
    for key in table.data:
        timeouts[key] = finite(table, key, 0.0)
        if timeouts[key] <= 0:
            raise table.error(key, f"must be greater than 0, got {timeouts[key]!r}")
    return tuple(sorted(timeouts.items()))


def _load_gates(table: Table) -> GateSettings:
    table.reject_unknown({*GATE_OPTION, *GATE_TABLES})
    gates = []
    for option in GATE_OPTIONS:
        if not option.thresholds:  # severity alone: `export = "hard"`
            gates.append((option.key, Gate(severity=severity(table, option.key, option.severity))))
            continue
        own = table.get_table(option.key)
        own.reject_unknown({"severity", *(key for key, _ in option.thresholds)})
        thresholds = []
        for key, default in option.thresholds:
            value = finite(own, key, default)
            if value <= 0:
                raise own.error(key, f"must be greater than 0, got {value!r}")
            thresholds.append((key, value))
        gates.append((option.key, Gate(severity=severity(own, "severity", option.severity),
                                       thresholds=tuple(thresholds))))
    budgets = []
    budgets_table = table.get_table("budgets")
    for model in budgets_table.data:
        budget = budgets_table.get_table(model)
        budget.reject_unknown({*BUDGET_KEYS, "severity"})
        limits: dict[str, float | None] = {}
        for key in BUDGET_KEYS:
            limit = None if budget.data.get(key) is None else finite(budget, key, 0.0)
            if limit is not None and limit <= 0:
                raise budget.error(key, f"must be greater than 0, got {limit!r}")
            limits[key] = limit
        budgets.append((model, Budget(latency_p50_ms=limits["latency-p50-ms"], peak_rss_mb=limits["peak-rss-mb"],
                                      severity=severity(budget, "severity", "hard"))))
    per_model = []
    models_table = table.get_table("models")
    for model in models_table.data:
        overrides = models_table.get_table(model)
        overrides.reject_unknown(MODEL_GATE_KEYS)
        values = []
        for key in overrides.data:
            value = finite(overrides, key, 0.0)
            if value <= 0:
                raise overrides.error(key, f"must be greater than 0, got {value!r}")
            values.append((key, value))
        per_model.append((model, tuple(values)))
    return GateSettings(gates=tuple(gates), budgets=tuple(budgets), per_model=tuple(per_model))


def _command(table: Table, name: str, default: list[str]) -> list[str]:
    """A command as an array of arguments, or one string split like a shell would."""
    raw = table.data.get(name, default)
    if isinstance(raw, str):
        try:
            return shlex.split(raw)
        except ValueError as error:
            raise table.error(name, f"cannot split {raw!r} into arguments: {error}") from None
    return table.get_str_list(name, default)


def _load_project(table: Table, base: Path, check_files: bool) -> ProjectSettings:
    table.reject_unknown(PROJECT_KEYS)
    root = (base / table.get("root", str, ".")).resolve()
    if check_files and not root.is_dir():
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
    for path in scan if check_files else ():
        if not (root / path).exists():
            raise table.error("scan", f"{path!r} does not exist under {root}")
    allow = table.get_table("allow")
    for test_id in allow.data:
        if not allow.get(test_id, str, "").strip():
            raise allow.error(test_id, "give the reason the break is accepted, as a string")
    timeout = finite(table, "timeout", 1800.0)
    if timeout <= 0:
        raise table.error("timeout", f"must be greater than 0, got {timeout!r}")
    return ProjectSettings(
        root=root, install=tuple(install), test=tuple(test), scan=tuple(scan), timeout_s=timeout,
        severity=severity(table, "severity", "hard"), scan_severity=severity(table, "scan-severity", "soft"),
        allow=tuple((test_id, allow.data[test_id]) for test_id in allow.data), defined_in=table.path,
    )


# -- the commented defaults (pyproject.toml) ---------------------------------------------

HELP_COLUMN = 25  # where a key's help comment starts


def defaults_text() -> str:
    """The ``[tool.upgrade-gate]`` table with every default and its help, as pyproject.toml shows it."""
    lines = [f"[{TABLE}]"]
    for option in OPTIONS:
        entry = f"{option.key} = {option.shown or _toml(option.default)}"
        if option.default is None:
            entry = "# " + entry
        lines.append(f"{entry:<{HELP_COLUMN - 1}} # {option.help}")
    lines += ["", *(f"# {line}" for line in TIMEOUTS_HELP), f"[{TABLE}.timeouts]"]
    lines += [f"{key} = {_toml(value)}" for key, value in DEFAULT_TIMEOUTS_S.items()]
    lines += ["", f"[{TABLE}.gates]",
              '# severity: "hard" fails the verdict (NO-GO), "soft" adds a condition, "off" skips.']
    for gate in GATE_OPTIONS:
        lines += [f"# {line}" for line in gate.help]
        if gate.thresholds:
            fields = ", ".join(f"{key} = {_toml(value)}" for key, value in gate.thresholds)
            entry = f"{gate.key} = {{ {fields}, severity = {_toml(gate.severity)} }}"
        else:
            entry = f"{gate.key} = {_toml(gate.severity)}"
        lines.append(f"{entry:<58} # {gate.note}" if gate.note else entry)
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and value and abs(value) < 1e-3:
        mantissa, exponent = f"{value:e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:_}"
    if isinstance(value, float):
        return f"{value:.1f}" if value.is_integer() else f"{value:g}"
    return str(value)


if __name__ == "__main__":  # print the commented defaults for pyproject.toml
    print(defaults_text(), end="")
