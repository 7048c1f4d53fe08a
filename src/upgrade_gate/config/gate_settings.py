"""``[tool.upgrade-gate.gates]``: each gate declared once (severity, thresholds, help), and the table
read through those declarations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from upgrade_gate.config._kinds import finite, severity
from upgrade_gate.config.catalog import VARIANT_SEPARATOR
from upgrade_gate.config.tomlfile import Table


@dataclass(frozen=True, kw_only=True, slots=True)
class GateOption:
    """One gate's declaration: its severity, and its thresholds (the first its own; the others qualify it)."""

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
        "its interval (order statistics; the gate's intervals ≥ 95% coverage together). Fails when an interval lies",
        "wholly above max-ratio, is inconclusive when one straddles it; methods at most min-delta-ms slower (at the",
        "interval's top) always pass. Too few quiet rounds at a thread count (the machine was busy): incomplete.")),
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
        """``model``'s own threshold if configured, else the default (the quantized gates' for a variant)."""
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


def load_gates(table: Table) -> GateSettings:
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
