"""Stack specs: one TOML file per stack, upgrade-gate's own in ``envs/`` and a team's in its ``envs`` folder (a
team's spec replaces the built-in one of the same name): the venv's Python and requirements, and the adapter that
exports and runs models there (a module of ``compat/`` by name, or the team's own file, relative to the spec).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from upgrade_gate.config.tomlfile import Table, read_toml
from upgrade_gate.errors import ConfigError
from upgrade_gate.layout import name_problem, same_folder, same_folder_problem

SPEC_KEYS = {"description", "python", "requirements", "adapter", "exporter", "runtime"}

# compat/ modules that are not adapters (tests/test_compat.py checks every compat/*.py is one or the other):
# the worker and what it runs for every stack, whatever the adapter (their code keys every result:
# upgrade_gate.run.cache.WORKER_FILES, with every file of its wings); what an adapter builds on (keyed with the
# adapters that import it: upgrade_gate.run.cache.adapter_files); and the project scan (a venv of its own).
WORKER_MODULES = ("__init__", "worker", "common", "contract", "phases", "export_phase", "runtime_phase",
                  "measure_server", "probe", "fork_server", "bundle_phase", "device_runner")
# compat/'s folders, which the worker runs whole: the diagnose phases, and the searches they share with the adapters.
WORKER_WINGS = ("diagnose", "search")
ADAPTER_HELPERS = ("executorch_runtime", "executorch_profile", "executorch_backends", "executorch_diagnose",
                   "executorch_precision", "executorch_load", "executorch_migrate", "torchscript_diagnose",
                   "torchscript_migrate", "reproducers", "recipe_reproducers", "handed_module")
NOT_ADAPTERS = (*WORKER_MODULES, *ADAPTER_HELPERS, "scan", "scan_visitor", "scan_guards", "scan_rewrites")


@dataclass(frozen=True, kw_only=True, slots=True)
class StackSpec:
    name: str
    path: Path
    description: str
    python: str
    requirements: tuple[Requirement, ...]
    adapter: str
    exporter: str
    runtime: str
    is_baseline: bool

    @property
    def role(self) -> str:
        return "baseline" if self.is_baseline else "candidate"

    def pinned(self, name: str) -> list[str]:
        """The release the spec pins distribution ``name`` to (``==``), if it does."""
        return [pin.version for req in self.requirements if req.name == name for pin in req.specifier
                if pin.operator == "=="]

    @property
    def distributions(self) -> list[str]:
        """Distribution names whose installed versions the report records."""
        return [req.name for req in self.requirements]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "role": self.role,
            "file": self.path.name,
            "description": self.description,
            "python": self.python,
            "requirements": [str(req) for req in self.requirements],
            "adapter": self.adapter,
            "exporter": self.exporter,
            "runtime": self.runtime,
        }


def load_spec(path: Path, *, adapters_dir: Path, is_baseline: bool) -> StackSpec:
    """Read and validate one spec file."""
    table = Table(read_toml(path), path=path, key="")
    table.reject_unknown(SPEC_KEYS)
    for required in ("python", "requirements", "adapter"):
        if required not in table.data:
            raise table.error(required, "missing; every stack spec needs python, requirements and adapter")

    python = table.get("python", str, "")
    try:
        Version(python)
    except InvalidVersion:
        raise table.error("python", f"not a Python version: {python!r} (e.g. \"3.11\")") from None

    requirements = load_requirements(table)
    if not requirements:
        raise table.error("requirements", "empty; a stack needs at least torch")

    adapter = table.get("adapter", str, "")
    if adapter.endswith(".py"):
        # The team's own exporter and runtime, beside its spec.
        own = (path.parent / adapter).resolve()
        if not own.is_file():
            raise table.error("adapter", f"no adapter file {own}; a path is relative to the spec's folder")
        adapter = str(own)
    elif not (adapters_dir / f"{adapter}.py").is_file() or adapter in NOT_ADAPTERS:
        known = sorted(p.stem for p in adapters_dir.glob("*.py") if p.stem not in NOT_ADAPTERS)
        raise table.error("adapter", f"no adapter {adapter!r} in {adapters_dir}; known: {', '.join(known)}")

    return StackSpec(
        name=path.stem,
        path=path,
        description=table.get("description", str, path.stem),
        python=python,
        requirements=tuple(requirements),
        adapter=adapter,
        exporter=table.get("exporter", str, adapter),
        runtime=table.get("runtime", str, adapter),
        is_baseline=is_baseline,
    )


def load_requirements(table: Table) -> list[Requirement]:
    """A table's ``requirements``, each read as the installer will (a stack spec's, the release table's): an entry
    that is no requirement names its key, before anything is built."""
    requirements = []
    for index, text in enumerate(table.get_str_list("requirements", [])):
        try:
            requirement = Requirement(text)
        except InvalidRequirement as error:
            raise table.error(f"requirements[{index}]", f"not a valid requirement {text!r}: {error}") from None
        for specifier in requirement.specifier:
            # packaging reads `torch===>2.8` as arbitrary equality with the string ">2.8": a typo
            # that only the installer would find, after the baseline stack was built and ran.
            if specifier.operator == "===" and not _is_version(specifier.version):
                raise table.error(f"requirements[{index}]", (
                    f"not a valid requirement {text!r}: '===' (arbitrary equality) with {specifier.version!r}, "
                    f"which is no version; write e.g. \"{requirement.name}==2.8.0\" or \"{requirement.name}>=2.8\""))
        requirements.append(requirement)
    return requirements


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def load_stacks(folders: list[Path], *, baseline: str, candidates: tuple[str, ...], adapters_dir: Path,
                config_path: Path) -> list[StackSpec]:
    """The specs in ``folders`` (a later folder's replaces an earlier one's): the baseline first, then candidates."""
    by_name = {p.stem: p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.toml"))}
    if not by_name:
        raise ConfigError(f"no stack specs (*.toml) in {', '.join(map(str, folders))}", path=config_path,
                          key="tool.upgrade-gate.envs")
    for name, path in by_name.items():
        if problem := name_problem(name):
            raise ConfigError(f"a stack's name is its spec's file name, and {problem}; rename the file",
                              path=path)
    if twins := same_folder(by_name):
        raise ConfigError(f"a stack's name is its spec's file name, and {same_folder_problem(*twins)}",
                          path=by_name[twins[1]])
    known = ", ".join(sorted(by_name))
    if baseline not in by_name:
        raise ConfigError(f"no stack spec named {baseline!r}; specs: {known}", path=config_path,
                          key="tool.upgrade-gate.baseline")
    unknown = [name for name in candidates if name not in by_name]
    if unknown:
        raise ConfigError(f"no stack spec named {unknown[0]!r}; specs: {known}", path=config_path,
                          key="tool.upgrade-gate.candidates")
    if baseline in candidates:
        raise ConfigError(f"{baseline!r} is the baseline; name the stacks to judge against it",
                          path=config_path, key="tool.upgrade-gate.candidates")
    chosen = list(candidates) or sorted(name for name in by_name if name != baseline)
    if not chosen:
        raise ConfigError(f"only the baseline spec {by_name[baseline]}; add a candidate stack spec beside it",
                          path=config_path, key="tool.upgrade-gate.envs")
    return [load_spec(by_name[name], adapters_dir=adapters_dir, is_baseline=name == baseline)
            for name in [baseline, *sorted(chosen)]]
