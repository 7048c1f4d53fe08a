"""What one run does: the settings, the stacks (baseline first), the models, and
the options after ``--`` on the nox command line, each declared once below."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path

from upgrade_gate.config import catalog
from upgrade_gate.config.catalog import FP32, VARIANT_SEPARATOR, ModelEntry
from upgrade_gate.config.settings import ALL_STACKS, OPTION, TABLE, Settings, default_config_path, load_settings
from upgrade_gate.config.specs import StackSpec, load_stacks
from upgrade_gate.config.tomlfile import Table
from upgrade_gate.errors import ConfigError
from upgrade_gate.invocation import command
from upgrade_gate.layout import BUILT_IN_ENVS, TOOL_ROOT, same_folder, same_folder_problem


@dataclass(frozen=True, slots=True)
class Shard:
    """Part ``index`` of ``count`` of a run's models (`--shard 2/4`), for a CI matrix."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def takes(self, item: int) -> bool:
        """Whether the ``item``-th of a list (the release explorer's releases) is ours: every N-th in turn."""
        return item % self.count == self.index - 1

    def families(self, costs: list[float]) -> set[int]:
        """Which model families (by index in suite order, with their costs) are ours: the costliest first, each to
        the part with the least cost so far (ties: the lower), so the parts take about as long in every job."""
        loads = [0.0] * self.count
        ours = set()
        for family in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
            part = min(range(self.count), key=lambda p: (loads[p], p))
            loads[part] += costs[family]
            if part == self.index - 1:
                ours.add(family)
        return ours


def parse_shard(text: str) -> Shard:
    """``K/N``: the inverse of ``str(shard)``."""
    index, _, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        raise ConfigError(f"{text!r} is not K/N (the K-th of N parts, e.g. 2/4)", key="--shard") from None
    if not 1 <= shard.index <= shard.count:
        raise ConfigError(f"{text!r}: K must be between 1 and N", key="--shard")
    return shard


@dataclass(frozen=True, kw_only=True, slots=True)
class Argument:
    """One option after ``--``; one that overrides a setting is read by that setting's parser."""

    name: str  # "--out", or a positional's name
    help: str = ""
    setting: str | None = None  # the [tool.upgrade-gate] key it overrides
    switch: bool = False  # takes no value
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    def help_text(self) -> str:
        if self.setting is None:
            return self.help
        return f"{OPTION[self.setting].help} (default: [{TABLE}] {self.setting})"


ARGUMENTS = (
    Argument(name="--out", setting="out", metavar="DIR"),
    Argument(name="--suite", setting="suite"),
    Argument(name="--models", metavar="A,B",
             help="comma-separated model names (a variant as vit-ti16@int8), instead of the suite and the "
                  "project's models"),
    Argument(name="--fresh", switch=True, help="run every phase again instead of reusing cached results"),
    Argument(name="--remeasure", switch=True,
             help="measure latency, cold start and memory again; reuse cached exports and checks"),
    Argument(name="--keep-artifacts", switch=True,
             help="keep the .pte/.ptl artifacts in the report folder (by default they stay in the result cache, "
                  "named by digest)"),
    Argument(name="--fail-fast", switch=True,
             help="stop at the first failed hard gate (pull-request gating): exit 1 with that gate; what was not "
                  "reached is listed as such, never as passed"),
    Argument(name="--shard", metavar="K/N", help="run only the K-th of N parts of the models (a CI matrix job)"),
    Argument(name="merge", metavar="SHARD_DIR", help="`nox -s report` only: shard folders to merge into one report"),
)


def parser(prog: str | None = None, only: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The options after ``--``, from ``ARGUMENTS`` (``only`` those named: another session's share)."""
    built = argparse.ArgumentParser(prog=prog or f"{command('compare')} --", exit_on_error=False)
    for argument in ARGUMENTS:
        if only is not None and argument.name not in only:
            continue
        if argument.switch:
            built.add_argument(argument.name, action="store_true", help=argument.help_text())
        elif argument.name.startswith("--"):
            built.add_argument(argument.name, metavar=argument.metavar, help=argument.help_text())
        else:
            built.add_argument(argument.name, nargs="*", type=Path, metavar=argument.metavar,
                               help=argument.help_text())
    return built


def parse_posargs(posargs: list[str], built: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Options after ``--`` on the nox command line (``built``: another session's parser)."""
    built = built or parser()
    try:
        args, unknown = built.parse_known_args(posargs)
    except argparse.ArgumentError as error:
        raise ConfigError(f"{error}; {built.format_usage().strip()}") from None
    if unknown:
        given = unknown[0].partition("=")[0]
        options = [name for action in built._actions for name in action.option_strings]  # argparse has no public list
        close = difflib.get_close_matches(given, options, n=1, cutoff=0.75) if given.startswith("--") else []
        guess = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown option {unknown[0]!r}{guess}; {built.format_usage().strip()}")
    return args


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What one comparison runs: settings, stacks (baseline first) and models."""

    settings: Settings
    stacks: tuple[StackSpec, ...]
    models: tuple[ModelEntry, ...]
    # Every unit of the run before `--shard` took its part: what shards of one run share.
    selection: tuple[str, ...] = ()
    shard: Shard | None = None
    # The options after ``--`` (ARGUMENTS says each); `--fresh` ignores the cache's entries, still storing new ones.
    merge: tuple[Path, ...] = ()
    fresh: bool = False
    remeasure: bool = False
    fail_fast: bool = False
    keep_artifacts: bool = False

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

    @property
    def assets(self) -> list[str]:
        """The asset folders this run's models read (models/suite.toml ``assets``): all it builds."""
        return sorted({name for model in self.models for name in model.assets})

    def stack(self, name: str) -> StackSpec:
        for spec in self.stacks:
            if spec.name == name:
                return spec
        raise ConfigError(f"no stack named {name!r}; stacks: {', '.join(s.name for s in self.stacks)}")


def stacks_of(settings: Settings) -> list[StackSpec]:
    """The built-in stack specs and the team's (replacing them by name), baseline first."""
    own = settings.envs_dir
    # Left at its default, the team's folder may be absent: the built-in stacks alone.
    if not own.is_dir() and own != settings.config_path.parent / "envs":
        raise ConfigError(f"{own} is not a folder; give the folder of your stack specs (*.toml), relative to "
                          f"{settings.config_path.parent}", path=settings.config_path, key="tool.upgrade-gate.envs")
    return load_stacks([BUILT_IN_ENVS, own], baseline=settings.baseline, candidates=settings.candidates,
                       adapters_dir=TOOL_ROOT / "compat", config_path=settings.config_path)


def load_plan(posargs: list[str], *, invoked_from: Path, config_path: Path | None = None,
              models_required: bool = True) -> Plan:
    """Everything a run needs, validated; raises ConfigError naming file and key (`nox -s compat` runs no models)."""
    config_path = config_path or default_config_path()
    args = parse_posargs(posargs)
    settings = load_settings(config_path)
    # A command-line option is read by the parser of the setting it overrides (paths: from where nox ran).
    overrides = {}
    for argument in ARGUMENTS:
        value = getattr(args, argument.dest)
        if argument.setting and value is not None:
            option = OPTION[argument.setting]
            overrides[option.attribute] = option.kind.read(Table({argument.name: value}, path=None, key=""),
                                                           argument.name, value, invoked_from)
    settings = dataclasses.replace(settings, **overrides)
    stacks = stacks_of(settings)
    known = catalog.load_catalog()
    for entry in settings.project_models:
        if entry.name in known:
            raise ConfigError(
                f"{entry.name!r} is a built-in model's name; rename the project's model",
                path=config_path, key=f"{TABLE}.models.{entry.name}",
            )
        known[entry.name] = entry
    if twins := same_folder(known):  # a project's models come after the built-in ones: the second is the project's
        raise ConfigError(same_folder_problem(*twins), path=config_path, key=f"{TABLE}.models.{twins[1]}")
    names = _named_models(args.models, known, settings, models_required)
    for model, _ in (*settings.gates.budgets, *settings.gates.per_model):
        base, _, variant = model.partition(VARIANT_SEPARATOR)
        if base not in known or (variant and variant not in known[base].variants):
            raise ConfigError(
                f"gates for {catalog.unknown_model(model, known)} (a quantized variant as "
                f"\"<model>{VARIANT_SEPARATOR}int8\")",
                path=config_path, key=f"{TABLE}.gates",
            )
    units = tuple({u.name: u for name in names for u in catalog.units(known, name, settings.variants)}.values())
    shard = parse_shard(args.shard) if args.shard is not None else None
    families = list(dict.fromkeys(u.base for u in units))
    cost = {u.base: u.cost for u in units}
    ours = shard.families([cost[f] for f in families]) if shard is not None else set(range(len(families)))
    chosen = tuple(u for u in units if families.index(u.base) in ours)
    return Plan(settings=settings, stacks=tuple(stacks), models=chosen, selection=tuple(u.name for u in units),
                shard=shard, merge=tuple((invoked_from / d).resolve() for d in args.merge),
                fresh=args.fresh, remeasure=args.remeasure, fail_fast=args.fail_fast,
                keep_artifacts=args.keep_artifacts)


def _named_models(models: str | None, known: dict[str, ModelEntry], settings: Settings,
                  models_required: bool) -> list[str]:
    """The models ``--models`` names, each checked to be known (a variant: one the model has); without it, the
    suite's and the project's."""
    if models is not None:
        names = [m.strip() for m in models.split(",") if m.strip()]
        if not names:
            raise ConfigError("no models to run", key="--models")
        for name in names:
            base, separator, variant = name.partition(VARIANT_SEPARATOR)
            if separator and not variant:
                raise ConfigError(f"{name!r} names no variant after {VARIANT_SEPARATOR!r}; write {base!r} for the "
                                  f"model and its variants, or e.g. '{base}{VARIANT_SEPARATOR}{FP32}'", key="--models")
            if base not in known:
                raise ConfigError(catalog.unknown_model(base, known), key="--models")
            if variant and variant != FP32 and variant not in known[base].variants:
                raise ConfigError(f"{base} has no variant {variant!r}; its variants: "
                                  f"{', '.join((FP32, *known[base].variants))}", key="--models")
    else:
        names = [e.name for e in known.values() if settings.suite in e.suites]
        names += [e.name for e in settings.project_models]
        if not names and models_required:
            raise ConfigError(
                f"no models to run: suite {settings.suite!r} and no [{TABLE}.models] entries",
                path=settings.config_path, key=f"{TABLE}.suite",
            )
    return names

