"""``[tool.upgrade-gate]``: every setting declared once — its key, its default as written in TOML, how a value
is read and checked, its help — and everything else derived from the declarations (nox's ``_options.py`` is the
model): ``load_settings``, ``Settings.to_dict``/``from_dict`` (results.json's ``settings``), ``defaults_text``
(pyproject.toml's commented defaults) and the command-line overrides. Everything is checked before any stack is
built: a typo costs a second, not a venv build.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate.config import catalog
from upgrade_gate.config._kinds import (
    FLAG,
    FOLDER,
    MEMORY,
    NAMES,
    THREADS,
    VARIANTS,
    Kind,
    finite,
    integer_kind,
    number_kind,
    raw_value,
    text_kind,
)
from upgrade_gate.config.catalog import QUANTIZED_VARIANTS, SUITES, ModelEntry
from upgrade_gate.config.gate_settings import GATE_OPTIONS, GateSettings, load_gates
from upgrade_gate.config.project_settings import ProjectSettings, load_project
from upgrade_gate.config.targets import RemoteTarget, load_targets
from upgrade_gate.config.tomlfile import Table, read_toml
from upgrade_gate.errors import ConfigError
from upgrade_gate.layout import cache_root
from upgrade_gate.stages import EXPORT_STAGES, MEASURE_STAGES, RUNTIME_STAGES
from upgrade_gate.stats import CONFIDENCE, fewest_rounds, interval_confidence

CONFIG_ENV_VAR = "UPGRADE_GATE_CONFIG"
TABLE = "tool.upgrade-gate"
ALL_STACKS = "*"


def default_config_path() -> Path:
    """``$UPGRADE_GATE_CONFIG``, else the pyproject.toml of the folder nox runs in (nox changes into its noxfile's)."""
    return Path(os.environ.get(CONFIG_ENV_VAR) or Path.cwd() / "pyproject.toml").resolve()


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
    Option(key="baseline", attribute="baseline", default="legacy", kind=text_kind(),
           help="the stack shipped today, by spec name"),
    Option(key="candidates", attribute="candidates", default=[], kind=NAMES,
           help="the stacks to judge against it ([]: every other spec)"),
    Option(key="suite", attribute="suite", default="default", kind=text_kind((*SUITES, catalog.NO_SUITE)),
           flag="--suite",
           help="built-in models to run: smoke, default, full or none (models/suite.toml)"),
    Option(key="out", attribute="out_dir", default="report", kind=FOLDER, flag="--out",
           help="report folder (`nox -s compare -- --out DIR` overrides)"),
    Option(key="cache", attribute="cache_dir", default=None, kind=FOLDER,
           shown='"~/.cache/upgrade-gate/results"',
           help="finished phases by content hash (default: $UPGRADE_GATE_CACHE/results)"),
    Option(key="threads", attribute="threads", default=[1, 2], kind=THREADS,
           help="intra-op thread counts: latency is measured at each, set identically in every stack"),
    Option(key="export-jobs", attribute="export_jobs", default=2, kind=integer_kind(1),
           help="export phases at once (each is one busy core); nothing runs beside a measurement"),
    # ≈ 5 s of imports per ExecuTorch phase with warm bytecode, 13 s cold (docs/benchmarks-log.md); the same results.
    Option(key="worker-start", attribute="worker_start", default="fork", kind=text_kind(("fork", "fresh")),
           help="fork: each stack's phases are forked from one process that imported its packages once; "
                "fresh: a new interpreter per phase"),
    # At least 10 warm-up and 50 timed runs: fewer say nothing on a noisy machine.
    Option(key="warmup", attribute="warmup", default=10, kind=integer_kind(10),
           help="untimed runs per measurement process, before its first round (at least 10)"),
    Option(key="iterations", attribute="iterations", default=50, kind=integer_kind(50),
           help="timed runs per stack, method and thread count, spread over the rounds (at least 50)"),
    Option(key="time-budget", attribute="time_budget_s", default=2.0, kind=number_kind(),
           help="… or at least this many seconds of them, whichever is more"),
    # Fewer than 6 rounds cannot give the median a 95% interval, 7 not two intervals 95% together (threads = [1, 2],
    # load_settings); 9 hold up to 12 intervals together, nanoVLM's six methods at two thread counts (stats.py).
    Option(key="rounds", attribute="rounds", default=9, kind=integer_kind(fewest_rounds()),
           help="quiet rounds, the stacks in turn (A B, B A, …), one candidate/baseline ratio each (at least 6; 7 "
                "with 2 thread counts)"),
    # Looks before the last round cost coverage; the looks' ranks keep it at 95% in all (stats.py).
    Option(key="stop-early", attribute="stop_early", default=True, kind=FLAG,
           help="stop the rounds once every latency interval lies wholly on one side of the threshold"),
    # Rounds past `rounds` keep their looks and parts: they decide near-threshold gates of up to 6 intervals more
    # often and cost time only where one straddles (docs/benchmarks-log.md, near-threshold gates; stats.looks_past).
    Option(key="most-rounds", attribute="most_rounds", default=15, kind=integer_kind(fewest_rounds()),
           help="with stop-early, the rounds go on past `rounds` while a latency interval still straddles the "
                "threshold, up to this many (`rounds`: never past them)"),
    # A runaway export must not take the machine down (seed 000 died at 5-6 GB
    # and left a 0-byte .pte); two exports may run at once, the limit is per worker.
    Option(key="memory-limit", attribute="memory_limit_bytes", default="85%", kind=MEMORY,
           help='per worker (with its children): "85%" of the machine, "12 GiB", or bytes'),
    Option(key="variants", attribute="variants", default=list(QUANTIZED_VARIANTS), kind=VARIANTS,
           help="quantized variants run beside fp32 where a model has them ([] for none)"),
    Option(key="localize-budget", attribute="localize_budget_s", default=300, kind=number_kind(zero_is_off=True),
           help="seconds to find the submodules behind a failed export (compat/search/localize.py); 0: off"),
    Option(key="backends-budget", attribute="backends_budget_s", default=300, kind=number_kind(zero_is_off=True),
           help="seconds per model for export-only tries of the candidate's other backends; 0: off"),
    Option(key="diagnose-budget", attribute="diagnose_budget_s", default=300, kind=number_kind(zero_is_off=True),
           help="seconds per model to find the operators behind an artifact that departs from its own "
                "eager model (compat/search/culprit.py); 0: off"),
    # perf sampling costs about 5 s per ExecuTorch method; a CI job that reads only the verdict can skip it.
    Option(key="profile", attribute="profile", default=True, kind=FLAG,
           help="a per-operator profile of each artifact after its checks (explains latency; gates nothing)"),
)
OPTION = {option.key: option for option in OPTIONS}
# Sub-tables, each read by its own function below.
TABLES = ("timeouts", "gates", "models", "extra-requirements", "project", "targets")

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
class Settings:
    """``[tool.upgrade-gate]`` read: one attribute per declaration (``OPTIONS``) and per sub-table."""

    config_path: Path
    envs_dir: Path
    baseline: str
    candidates: tuple[str, ...]
    suite: str
    out_dir: Path
    cache_dir: Path
    threads: tuple[int, ...]
    export_jobs: int
    worker_start: str
    warmup: int
    iterations: int
    time_budget_s: float
    rounds: int
    stop_early: bool
    most_rounds: int
    memory_limit_bytes: int
    variants: tuple[str, ...]
    localize_budget_s: float
    backends_budget_s: float
    diagnose_budget_s: float
    profile: bool
    # stage name (or "start", "default") → seconds
    timeouts_s: tuple[tuple[str, float], ...]
    gates: GateSettings
    project_models: tuple[ModelEntry, ...] = ()
    # stack name (or "*") → extra requirement strings, installed from the project root
    extra_requirements: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The team's own tests and code ([tool.upgrade-gate.project]); None when not configured.
    project: ProjectSettings | None = field(default=None)
    # Machines besides this one where latency is measured, over ssh ([tool.upgrade-gate.targets], docs/device.md).
    targets: tuple[RemoteTarget, ...] = ()

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
        if self.targets:
            table["targets"] = {target.name: target.to_toml() for target in self.targets}
        return table

    @classmethod
    def from_dict(cls, table: dict[str, Any], *, path: Path) -> Settings:
        """What ``to_dict`` wrote; nothing on this machine is checked (a report may come from another one)."""
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
    table = Table(raw, path=config_path, key=TABLE)
    settings = _load(table, config_path, check_files=True)
    # A latency gate judges an interval per thread count and method, which share its 95%: with more thread counts
    # each needs more rounds (stats.py). A model of several methods may need more still: its gate says so.
    needed = fewest_rounds(interval_confidence(len(settings.threads)))
    if settings.rounds < needed:
        raise table.error("rounds", f"must be at least {needed} with {len(settings.threads)} thread counts (threads = "
                                    f"{list(settings.threads)}): a latency gate's intervals, one per thread count and "
                                    f"method, share its {CONFIDENCE:.0%}; got {settings.rounds}")
    if settings.most_rounds < settings.rounds:
        raise table.error("most-rounds", f"must be at least `rounds` ({settings.rounds}; equal to it: never past "
                                         f"them), got {settings.most_rounds}")
    return settings


def _load(table: Table, config_path: Path, *, check_files: bool) -> Settings:
    table.reject_unknown({*OPTION, *TABLES})
    base = config_path.parent
    values = {option.attribute: option.kind.read(table, option.key, raw_value(table, option.key, option.default), base)
              for option in OPTIONS if option.default is not None or option.key in table.data}
    values.setdefault("cache_dir", cache_root() / "results")
    extra = table.get_table("extra-requirements")
    return Settings(
        config_path=config_path, **values,
        timeouts_s=_load_timeouts(table.get_table("timeouts")),
        gates=load_gates(table.get_table("gates")),
        project_models=catalog.load_project_models(table.get_table("models"), project_root=base.resolve()),
        extra_requirements=tuple((stack, tuple(extra.get_str_list(stack, []))) for stack in extra.data),
        project=load_project(table.get_table("project"), base, check_files) if "project" in table.data else None,
        targets=load_targets(table.get_table("targets"), base),
    )


def _load_timeouts(table: Table) -> tuple[tuple[str, float], ...]:
    table.reject_unknown(set(TIMEOUT_KEYS))
    timeouts = {key: float(value) for key, value in DEFAULT_TIMEOUTS_S.items()}
    for key in table.data:
        timeouts[key] = finite(table, key, 0.0)
        if timeouts[key] <= 0:
            raise table.error(key, f"must be greater than 0, got {timeouts[key]!r}")
    return tuple(sorted(timeouts.items()))


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
