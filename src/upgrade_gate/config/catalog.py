"""The models the tool knows by name: the built-in suite (models/suite.toml), a
project's own models (``[tool.upgrade-gate.models]``), and their quantized variants."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path

from upgrade_gate.config.tomlfile import Table, read_toml
from upgrade_gate.errors import ConfigError
from upgrade_gate.layout import ASSET_SOURCES, TOOL_ROOT, method_problem, name_problem

CATALOG = TOOL_ROOT / "models" / "suite.toml"
SUITES = ("smoke", "default", "full")
NO_SUITE = "none"  # the suite setting's value for "the project's models only"
# The float model every stack exports; quantized variants are run beside it.
FP32 = "fp32"
# Quantized variants a stack's adapter may offer (compat/*.py QUANTIZATIONS; docs/models.md says which family
# runs which, and why).
QUANTIZED_VARIANTS = ("int8", "int8-dynamic", "8da4w")
# A variant's name is its model's plus this and the variant: "vit-ti16@int8".
VARIANT_SEPARATOR = "@"
DEFAULT_VARIANTS = ("int8",)  # what a model has unless its entry says otherwise
ENTRY_KEYS = {"factory", "description", "exclusive", "variants", "cost"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelEntry:
    name: str
    factory: str  # module:function — inside models/ for built-in models, the project's for its own
    description: str
    suites: tuple[str, ...] = ()
    # Its export needs most of the machine's memory: no other export runs beside it.
    exclusive: bool = False
    # What the model and its variants cost in a run, relative to others (about the minutes of their
    # exports): `--shard` balances its parts by it (plan.Shard.families).
    cost: float = 1.0
    # The project's own models' root, put on sys.path in the worker; None for built-in models.
    project_root: Path | None = None
    defined_in: Path | None = None
    # The quantized variants this model has (a model that cannot quantize lists none).
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    # fp32, or the quantized variant this entry runs: then its name is "<model>@<variant>".
    variant: str = FP32
    # The asset folders (models/sources/<name>.py builds each) a built-in model reads; a project's model none.
    assets: tuple[str, ...] = ()

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


def offered(known: dict[str, ModelEntry]) -> list[str]:
    """The names a message offers a user: every suite's models and the project's own. A built-in model in no
    suite is one of the tests' failure paths (models/suite.toml: hang, segfault, memory-hog, …): ``--models``
    still runs it, but no message suggests it."""
    return sorted(name for name, entry in known.items() if entry.suites or entry.project_root is not None)


def unknown_model(name: str, known: dict[str, ModelEntry]) -> str:
    """The message for a model name nobody declared: the closest offered name, and the offered names."""
    names = offered(known)
    close = difflib.get_close_matches(name, names, n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown model {name!r}{guess}; known models: {', '.join(names)}"


def load_variants(table: Table, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A list of quantized variant names, each known and once."""
    names = table.get_str_list(key, list(default))
    for name in names:
        if name not in QUANTIZED_VARIANTS:
            raise table.error(key, f"unknown variant {name!r}; expected some of {', '.join(QUANTIZED_VARIANTS)} "
                                   "(fp32 always runs)")
    if len(set(names)) != len(names):
        raise table.error(key, f"a variant appears twice in {names!r}")
    return tuple(names)


def load_catalog(path: Path = CATALOG) -> dict[str, ModelEntry]:
    """The models the tool knows by name (``models/suite.toml``)."""
    catalog = {}
    for name, raw in read_toml(path).items():
        if not isinstance(raw, dict):
            raise ConfigError("expected a table with factory and description", path=path, key=name)
        entry = Table(raw, path=path, key=name)
        entry.reject_unknown({*ENTRY_KEYS, "suites", "assets"})
        factory = entry.get("factory", str, "")
        if ":" not in factory:
            raise entry.error("factory", f"expected 'module:function', got {factory!r}")
        suites = entry.get_str_list("suites", [])
        for suite in suites:
            if suite not in SUITES:
                raise entry.error("suites", f"unknown suite {suite!r}; expected some of {', '.join(SUITES)}")
        needs = entry.get_str_list("assets", [])
        for asset in needs:
            if asset not in ASSET_SOURCES:
                raise entry.error("assets", f"unknown asset {asset!r}; expected some of {', '.join(ASSET_SOURCES)}")
        catalog[name] = ModelEntry(name=name, factory=factory, description=entry.get("description", str, name),
                                   suites=tuple(suites), exclusive=entry.get("exclusive", bool, False),
                                   defined_in=path, variants=load_variants(entry, "variants", DEFAULT_VARIANTS),
                                   assets=tuple(needs), cost=load_cost(entry))
    return catalog


def load_cost(entry: Table) -> float:
    """An entry's ``cost``: a positive number (default 1)."""
    cost = entry.get("cost", float, 1.0)
    if not 0 < cost < float("inf"):
        raise entry.error("cost", f"expected a positive number (the model's relative cost in a run), got {cost!r}")
    return float(cost)


def load_project_models(table: Table, *, project_root: Path) -> tuple[ModelEntry, ...]:
    """``name = "package.module:factory"`` or ``name = { factory = …, description = … }``."""
    entries = []
    for name, raw in table.data.items():
        exclusive, cost = False, 1.0
        variants: tuple[str, ...] = DEFAULT_VARIANTS
        if VARIANT_SEPARATOR in name:
            raise table.error(name, f"a model's name may not contain {VARIANT_SEPARATOR!r}: it names variants")
        if problem := name_problem(name):
            raise table.error(name, f"{problem}; rename the entry")
        if isinstance(raw, str):
            factory, description = raw, None
        else:
            entry = table.get_table(name)
            entry.reject_unknown(ENTRY_KEYS)
            variants = load_variants(entry, "variants", variants)
            if "factory" not in entry.data:
                raise entry.error("factory", "missing; expected \"package.module:function\"")
            factory, description = entry.get("factory", str, ""), entry.get("description", str, "")
            exclusive, cost = entry.get("exclusive", bool, False), load_cost(entry)
        module, _, function = factory.partition(":")
        if not (module and function and all(part.isidentifier() for part in (*module.split("."), function))):
            raise table.error(name, f"expected \"package.module:function\", got {factory!r}")
        entries.append(ModelEntry(name=name, factory=factory, description=description or f"{factory} (project model)",
                                  exclusive=exclusive, project_root=project_root, defined_in=table.path,
                                  variants=variants, cost=cost))
    return tuple(entries)


def method_refused(entry: ModelEntry, method: str) -> ConfigError:
    """A method whose name cannot name its files (the worker refuses it before it writes one): the model's
    configuration error, naming its entry."""
    problem = method_problem(method) or f"{method!r}"
    key = f"tool.upgrade-gate.models.{entry.base}" if entry.project_root else entry.base
    return ConfigError(f"factory {entry.factory!r} returns a ModelCase whose method {problem}; rename the method "
                       "(a key of its ModelCase's methods)", path=entry.defined_in, key=key)


def project_model_table(entries: tuple[ModelEntry, ...]) -> dict[str, object]:
    """``[tool.upgrade-gate.models]`` as written, for a record of the settings."""
    return {e.name: {"factory": e.factory, "description": e.description, "exclusive": e.exclusive,
                     "variants": list(e.variants), "cost": e.cost} for e in entries}


def units(catalog: dict[str, ModelEntry], name: str, variants: tuple[str, ...]) -> list[ModelEntry]:
    """"vit-ti16": its fp32 model and each variant the settings ask for; "vit-ti16@int8": that variant alone."""
    base, _, variant = name.partition(VARIANT_SEPARATOR)
    entry = catalog[base]
    if variant:
        return [entry if variant == FP32 else entry.with_variant(variant)]
    return [entry, *(entry.with_variant(v) for v in variants if v in entry.variants)]
