"""The release table and what became of each release (`nox -s releases`, docs/releases.md: the table's rows,
each release's status, what can be recommended), and the bisection (``--bisect GATE:MODEL``): which releases to
build, given what each one showed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from upgrade_gate import layout
from upgrade_gate.config.specs import load_requirements
from upgrade_gate.config.tomlfile import Table as TomlTable
from upgrade_gate.config.tomlfile import read_toml
from upgrade_gate.errors import ConfigError
from upgrade_gate.releases._reproducers import ReproducerRun
from upgrade_gate.schema import codec
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import GateResult, GateStatus, Verdict

TABLE_FILE = layout.BUILT_IN_ENVS / "releases" / "executorch.toml"
RECORD = layout.RELEASE_FILE
RECORD_VERSION = 1


# -- the release table ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Release(codec.Record):
    """One row: an ExecuTorch release and the stack it pairs with."""

    executorch: Version = field(metadata=codec.custom(write=lambda r: str(r.executorch),
                                                      read=lambda r, key: Version(r.text(key))))
    released: str
    torch: str
    torchvision: str
    torchao: str | None
    numpy: str | None  # a specifier, where the torch wheels need one
    pythons: tuple[str, ...]
    source: str

    @property
    def name(self) -> str:
        """The stack's name: its report folder, its venv, its cache entries."""
        return f"executorch-{self.executorch}"

    def pins(self) -> list[str]:
        pins = [f"torch=={self.torch}", f"executorch=={self.executorch}", f"torchvision=={self.torchvision}"]
        if self.torchao:
            pins.append(f"torchao=={self.torchao}")
        if self.numpy:
            pins.append(f"numpy{self.numpy}")
        return pins


@dataclass(frozen=True, kw_only=True, slots=True)
class AdapterRule:
    """The adapter for the releases a specifier matches; none names the API no adapter covers."""

    specifier: SpecifierSet
    adapter: str | None
    missing: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseTable:
    path: Path
    python: str
    requirements: tuple[Requirement, ...]  # beside each row's pins, checked when the table is read
    adapters: tuple[AdapterRule, ...]
    releases: tuple[Release, ...]  # oldest first

    def adapter_for(self, release: Release) -> AdapterRule | None:
        return next((rule for rule in self.adapters if release.executorch in rule.specifier), None)

    def requirements_of(self, release: Release) -> list[str]:
        pins = release.pins()
        pinned = {canonicalize_name(Requirement(pin).name) for pin in pins}
        return pins + [str(r) for r in self.requirements if canonicalize_name(r.name) not in pinned]

    def find(self, text: str, *, key: str) -> Release:
        try:
            version = Version(text.removeprefix("executorch-"))
        except InvalidVersion:
            raise ConfigError(f"{text!r} is not a release version (e.g. 0.7.0)", key=key) from None
        for release in self.releases:
            if release.executorch == version:
                return release
        raise ConfigError(f"no executorch {version} in {self.path}; releases: {self.versions()}", key=key)

    def versions(self) -> str:
        return ", ".join(str(r.executorch) for r in self.releases)

    def between(self, first: str | None, last: str | None) -> list[Release]:
        """The releases from ``first`` to ``last`` (either end left out: the table's)."""
        start = self.find(first, key="--from").executorch if first else self.releases[0].executorch
        end = self.find(last, key="--to").executorch if last else self.releases[-1].executorch
        if start > end:
            raise ConfigError(f"--from {start} is newer than --to {end}", key="--from")
        return [r for r in self.releases if start <= r.executorch <= end]


RELEASE_KEYS = {"executorch", "released", "torch", "torchvision", "torchao", "numpy", "pythons", "source"}


def load_table(path: Path = TABLE_FILE) -> ReleaseTable:
    """Read and check the release table; ConfigError naming the file and key."""
    top = TomlTable(read_toml(path), path=path, key="")
    top.reject_unknown({"python", "requirements", "adapters", "releases"})
    python = top.get("python", str, "")
    if not python:
        raise top.error("python", "missing; the Python every release stack is built for, e.g. \"3.11\"")
    requirements = tuple(load_requirements(top))
    adapters = []
    for index, data in enumerate(top.get("adapters", list, [])):
        rule = TomlTable(data, path=path, key=f"adapters[{index}]")
        rule.reject_unknown({"executorch", "adapter", "missing"})
        adapter = rule.get("adapter", str, "") or None
        missing = rule.get("missing", str, "")
        if bool(adapter) == bool(missing):
            raise rule.error("adapter", "give either adapter (a compat/ module) or missing (the API no adapter covers)")
        if adapter and not (layout.TOOL_ROOT / "compat" / f"{adapter}.py").is_file():
            raise rule.error("adapter", f"no adapter {adapter!r} in {layout.TOOL_ROOT / 'compat'}")
        adapters.append(AdapterRule(specifier=_specifier(rule, "executorch"), adapter=adapter, missing=missing))
    releases = []
    for index, data in enumerate(top.get("releases", list, [])):
        row = TomlTable(data, path=path, key=f"releases[{index}]")
        row.reject_unknown(RELEASE_KEYS)
        for required in ("executorch", "torch", "torchvision", "pythons", "source"):
            if required not in row.data:
                raise row.error(required, f"missing; every release names {', '.join(sorted(RELEASE_KEYS))}")
        versions = {name: _version(row, name) for name in ("executorch", "torch", "torchvision")}
        torchao = row.get("torchao", str, "") or None
        if torchao:
            _version(row, "torchao")
        numpy = row.get("numpy", str, "") or None
        if numpy:
            _specifier(row, "numpy")
        release = Release(executorch=versions["executorch"], released=row.get("released", str, ""),
                          torch=str(versions["torch"]), torchvision=str(versions["torchvision"]),
                          torchao=torchao, numpy=numpy, pythons=tuple(row.get_str_list("pythons", [])),
                          source=row.get("source", str, ""))
        if problem := layout.name_problem(release.name):  # its stack's, its folder's and its venv's name
            raise row.error("executorch", f"the release's stack is named after it, and {problem}; write the "
                                          "version without an epoch ('!') or a local label ('+')")
        releases.append(release)
    if not releases:
        raise top.error("releases", "empty; the table needs at least one release")
    ordered = sorted(releases, key=lambda r: r.executorch)
    seen = [r.executorch for r in ordered]
    twice = next((v for v in seen if seen.count(v) > 1), None)
    if twice is not None:
        raise top.error("releases", f"executorch {twice} is listed twice; keep one row")
    return ReleaseTable(path=path, python=python, requirements=requirements, adapters=tuple(adapters),
                        releases=tuple(ordered))


def _version(row: TomlTable, key: str) -> Version:
    text = row.get(key, str, "")
    try:
        return Version(text)
    except InvalidVersion:
        raise row.error(key, f"not a version: {text!r}") from None


def _specifier(row: TomlTable, key: str) -> SpecifierSet:
    text = row.get(key, str, "")
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise row.error(key, f"not a version specifier: {text!r} (e.g. \">=0.6\")") from None


def release_folder(out: Path, release: Release) -> Path:
    """A release's own report folder: an ordinary comparison of the baseline and the release."""
    return layout.release_dir(out, release.name)


# -- what became of a release ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseRecord(codec.Record):
    """What became of one release: ``<out>/releases/<release>/release.json`` (read back by ``read_record``)."""

    release: Release
    status: str  # judged, not covered, not installed, adapter does not load
    reason: str = ""
    adapter: str | None = None
    verdict: Verdict | None = None  # judged releases
    models: tuple[str, ...] = ()
    seconds: float = field(default=0.0, metadata=codec.custom(write=lambda r: round(r.seconds, 1)))
    reproducers: tuple[ReproducerRun, ...] = ()  # compare's, run with this release's Python

    DERIVED = (codec.derived("record_version", lambda _: RECORD_VERSION, after=codec.START),
               codec.derived("name", lambda r: r.release.name, after="release"))

    @property
    def judged(self) -> bool:
        return self.status == JUDGED


JUDGED, NOT_COVERED, NOT_INSTALLED, ADAPTER_FAILS = "judged", "not covered", "not installed", "adapter does not load"


def read_record(folder: Path, table: ReleaseTable) -> ReleaseRecord | None:
    """A release folder's record; None when there is none or it does not read (the release runs again)."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        release = table.find(str(data["release"]["executorch"]), key=RECORD)
        verdict = Verdict(data["verdict"]) if data.get("verdict") else None
        return ReleaseRecord(release=release, status=str(data["status"]), reason=str(data.get("reason", "")),
                             adapter=data.get("adapter"), verdict=verdict, models=tuple(data.get("models", ())),
                             seconds=float(data.get("seconds", 0.0)),
                             reproducers=tuple(ReproducerRun.from_json(r) for r in data.get("reproducers", ())))
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return None


def release_results(folder: Path) -> Results | None:
    """A judged release's results.json; None when it does not read."""
    try:
        return Results.load(folder)
    except ConfigError:
        return None


def gate_of(results: Results | None, gate: str, model: str, stack: str) -> GateResult | None:
    if results is None:
        return None
    return next((g for g in results.verdict.gates if g.gate == gate and g.model == model and g.stack == stack), None)


# -- the bisection ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Bisect:
    """``--bisect GATE:MODEL``: where the gate's failure for the model starts or stops."""

    gate: str
    model: str

    def __str__(self) -> str:
        return f"{self.gate}:{self.model}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Bisection(codec.Record):
    gate: str
    model: str
    states: dict[str, str]  # release name → failed / not failed / unknown (why), for every release built
    built: tuple[str, ...]  # in the order the bisection built them
    answer: str
    monotone: bool = True
    located: bool = True  # False: fewer than two releases in range could be judged


FAILS, HOLDS_NOT = "fails", "does not fail"


def gate_state(record: ReleaseRecord, folder: Path, target: Bisect) -> str:
    """Whether the gate fails for the model in a release: FAILS, HOLDS_NOT, or why it is not known."""
    if not record.judged:
        return f"unknown ({record.status})"
    found = gate_of(release_results(folder), target.gate, target.model, record.release.name)
    if found is None:
        return f"unknown (no {target.gate} gate for {target.model})"
    if found.status is GateStatus.FAILED:
        return FAILS
    if found.status in (GateStatus.PASSED, GateStatus.INCONCLUSIVE):
        return HOLDS_NOT
    return f"unknown ({found.status.label})"


def bisect(releases: list[Release], target: Bisect, judge: Callable[[Release], str],
           seen_before: Callable[[Release], str | None] = lambda release: None) -> Bisection:
    """Where ``target.gate`` starts or stops failing for ``target.model``: the two ends, then halves (about log2(n)
    releases built), a release ``judge`` cannot tell about passed over for its nearest neighbour. ``seen_before``,
    what earlier runs showed of the releases not built, says when there was more than the one change it assumes."""
    states: dict[str, str] = {}
    built: list[str] = []

    def state(index: int) -> str:
        release = releases[index]
        if release.name not in states:
            built.append(release.name)
            states[release.name] = judge(release)
        return states[release.name]

    def known(index: int) -> bool:
        return state(index) in (FAILS, HOLDS_NOT)

    def result(answer: str, expected: Callable[[int], str | None]) -> Bisection:
        return _against_earlier_runs(releases, target, states, built, seen_before, answer, expected)

    what = f"{target.gate} for {target.model}"
    low = next((i for i in range(len(releases)) if known(i)), None)
    high = None if low is None else next((i for i in reversed(range(low + 1, len(releases))) if known(i)), None)
    if low is None or high is None:
        answer = (f"{what} could not be judged at two releases in range: "
                  + "; ".join(f"{name}: {s}" for name, s in states.items()))
        return dataclasses.replace(result(answer, lambda index: None), located=False)
    first, last = state(low), state(high)
    if first == last:
        answer = (f"{what}: {first} at both ends ({releases[low].name}, {releases[high].name}); no change to locate "
                  f"in this range: {len(built)} of {len(releases)} releases built")
        ends = (low, high)
        return result(answer, lambda index: first if ends[0] <= index <= ends[1] else None)
    while high - low > 1:
        middle = (low + high) // 2
        # The judgeable release nearest the middle, inside (low, high).
        probe = next((i for offset in range(high - low) for i in (middle + offset, middle - offset)
                      if low < i < high and known(i)), None)
        if probe is None:
            break
        if state(probe) == first:
            low = probe
        else:
            high = probe
    gap = [r.name for r in releases[low + 1:high]]
    verb = "starts failing" if last == FAILS else "stops failing"
    answer = (f"{what} {verb} between {releases[low].name} ({first}) and {releases[high].name} ({last})"
              + (f"; the releases between could not be judged ({', '.join(gap)})" if gap else "")
              + f": {len(built)} of {len(releases)} releases built")
    return result(answer, lambda index: first if index <= low else last if index >= high else None)


def _against_earlier_runs(releases: list[Release], target: Bisect, states: dict[str, str], built: list[str],
                          seen_before: Callable[[Release], str | None], answer: str,
                          expected: Callable[[int], str | None]) -> Bisection:
    """The bisection's answer, with what earlier runs showed for the releases it did not build where that
    contradicts the one change it assumed (``expected``: the state each release should have, None if any)."""
    contradictions = []
    for index, release in enumerate(releases):
        seen = None if release.name in states else seen_before(release)
        if seen in (FAILS, HOLDS_NOT) and expected(index) not in (None, seen):
            contradictions.append(f"{release.name} {seen}")
    if contradictions:
        answer += (f". The evidence is not monotone: {', '.join(contradictions)} (earlier runs in this report "
                   "folder), so the failure comes and goes between releases; read the full table")
    return Bisection(gate=target.gate, model=target.model, states=states, built=tuple(built), answer=answer,
                     monotone=not contradictions)
