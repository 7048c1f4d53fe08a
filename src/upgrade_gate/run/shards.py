"""Sharded runs: a CI matrix splits the work (`--shard K/N`, docs/ci.md), `nox -s report -- DIR...` joins it.

A job's report folder says what it holds in ``shard.json``; merging checks that every folder comes from the same
tool, specs and selection and that each stack has every shard once, then copies their records in. Each stack's
measurement names the host that timed it: the latency gate will not compare times from two machines.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from upgrade_gate import __version__, layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate.config.plan import Plan, Shard, parse_shard
from upgrade_gate.errors import ConfigError, RecordError
from upgrade_gate.invocation import command
from upgrade_gate.run import cache
from upgrade_gate.schema import codec
from upgrade_gate.schema.measured import remedied
from upgrade_gate.schema.measurement import Measurement, RoundLoad, TimedSide, load_measurement
from upgrade_gate.schema.reader import Reader

MANIFEST = layout.MANIFEST
WHOLE = Shard(1, 1)  # an unsharded run is its own single shard


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardManifest(codec.Record):
    """shard.json: what a report folder holds, so that shards of one run can be merged."""

    tool_version: str
    shard: Shard = field(metadata=codec.custom(write=lambda m: str(m.shard), read=lambda r, key: _shard(r, key)))
    selection: tuple[str, ...]  # every unit of the run, before --shard took its part
    models: tuple[str, ...]  # this shard's
    stacks: tuple[str, ...]  # the stacks that ran here
    specs: dict[str, str]  # every stack spec's digest
    host: str = field(metadata=codec.absent(""))


def _shard(r: Reader, key: str) -> Shard:
    try:
        return parse_shard(r.text(key))
    except ConfigError as error:
        raise RecordError(f"{error} in '{r.where}.{key}'") from None


def spec_digests(plan: Plan) -> dict[str, str]:
    return {spec.name: cache.digest_of(spec.to_dict()) for spec in plan.stacks}


def describe(plan: Plan, stack: str) -> None:
    """Add ``stack`` to the report folder's shard.json (written for every run, sharded or not)."""
    path = plan.settings.out_dir / MANIFEST
    try:
        known = read_manifest(path)
    except (OSError, ValueError, RecordError):
        known = None
    models = tuple(m.name for m in plan.models)
    stacks = set(known.stacks) if known is not None and known.models == models else set()
    write_json_atomic(path, ShardManifest(
        tool_version=__version__, shard=plan.shard or WHOLE, selection=plan.selection, models=models,
        stacks=tuple(sorted(stacks | {stack})), specs=spec_digests(plan), host=socket.gethostname()).to_dict())


def read_manifest(path: Path) -> ShardManifest:
    return ShardManifest.from_reader(Reader(json.loads(path.read_text()), str(path)))


def merge(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """Check the shard folders of ``plan.merge`` and link their results into the report folder."""
    manifests = [(folder, _manifest(folder)) for folder in plan.merge]
    _check_same_run(plan, manifests)
    out = plan.settings.out_dir
    for folder, manifest in manifests:
        for stack in manifest.stacks:
            source = layout.stack_dir(folder, stack)
            target = layout.stack_dir(out, stack)
            target.mkdir(parents=True, exist_ok=True)
            if (source / layout.STACK_FILE).is_file() and not (target / layout.STACK_FILE).exists():
                cache.copy_file(source / layout.STACK_FILE, target / layout.STACK_FILE)
            for model in manifest.models:
                _link_tree(source / "models" / model, target / "models" / model)
        log(f"merged {folder}: shard {manifest.shard}, {', '.join(manifest.stacks)}, "
            f"{len(manifest.models)} model(s)")
    _merge_measurements(plan, manifests)


def _manifest(folder: Path) -> ShardManifest:
    path = folder / MANIFEST
    try:
        return read_manifest(path)
    except FileNotFoundError:
        raise ConfigError(f"{folder}: not a shard folder (no {MANIFEST}); make one with "
                          f"`{command('run(<stack>)')} measure -- --shard K/N --out DIR`") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: unreadable ({error}); run that shard again") from None
    except RecordError as error:
        raise ConfigError(f"{path}: {error}; it was written by another tool or damaged; run that shard again") from None


def _check_same_run(plan: Plan, manifests: list[tuple[Path, ShardManifest]]) -> None:
    """One tool version, one set of stack specs, one model selection; every shard of every stack once."""
    digests = spec_digests(plan)
    for folder, manifest in manifests:
        checks = (
            ("upgrade-gate version", manifest.tool_version, __version__),
            ("stack specs (envs/)", {s: d for s, d in manifest.specs.items() if s in manifest.stacks},
             {s: d for s, d in digests.items() if s in manifest.stacks}),
            ("model selection (suite, --models, variants)", list(manifest.selection), list(plan.selection)),
        )
        for what, found, expected in checks:
            if found != expected:
                raise ConfigError(
                    f"{folder}: made with another {what} than this report ({_show(found)} here {_show(expected)}); "
                    "merge only shards of one run, made with this checkout, or re-run that shard")
    counts = {m.shard.count for _, m in manifests}
    if len(counts) > 1:
        raise ConfigError(f"shards of different splits ({', '.join(sorted({str(m.shard) for _, m in manifests}))}); "
                          "merge the shards of one `--shard K/N` matrix")
    count = counts.pop()
    seen: dict[tuple[str, int], Path] = {}
    for folder, manifest in manifests:
        for stack in manifest.stacks:
            if (stack, manifest.shard.index) in seen:
                raise ConfigError(f"{folder} and {seen[stack, manifest.shard.index]} both hold shard "
                                  f"{manifest.shard.index}/{count} of stack {stack!r}; pass one of them")
            seen[stack, manifest.shard.index] = folder
    for spec in plan.stacks:
        missing = [f"{k}/{count}" for k in range(1, count + 1) if (spec.name, k) not in seen]
        if missing:
            raise ConfigError(f"stack {spec.name!r}: shard(s) {', '.join(missing)} missing from the folders given; "
                              "pass every shard's folder")


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) < 120 else text[:117] + "…"


def _link_tree(source: Path, target: Path) -> None:
    if not source.is_dir():
        return
    for file in source.rglob("*"):
        if file.is_file():
            destination = target / file.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.unlink(missing_ok=True)
            cache.copy_file(file, destination)


def _merge_measurements(plan: Plan, manifests: list[tuple[Path, ShardManifest]]) -> None:
    """One measurement file per model and thread count, each stack's record from the shard that timed it; the
    rounds' design is the first shard's (every shard designs them alike: the gate's intervals, no ratio to stop on)."""
    out = plan.settings.out_dir
    for model in plan.models:
        for threads in plan.settings.threads:
            found = [(folder, manifest, data) for folder, manifest in manifests
                     if model.name in manifest.models
                     and (data := _read_measurement(folder, model.name, threads)) is not None]
            if not found:
                continue
            stacks: dict[str, TimedSide] = {}
            merged_from: dict[str, str] = {}
            for folder, manifest, data in found:
                for stack in (*manifest.stacks, *map(remedied, manifest.stacks)):  # a candidate's remedied side too
                    if stack in data.stacks:
                        stacks[stack], merged_from[stack] = data.stacks[stack], str(folder)
            # Stacks timed in separate jobs took no turns within a round: no order to state.
            together = len(set(merged_from.values())) == 1
            merged = replace(found[0][2], stacks=stacks, merged_from=merged_from,
                             order=tuple(spec.name for spec in plan.stacks if spec.name in stacks) if together else (),
                             rounds=_merge_rounds([(data, manifest.stacks) for _, manifest, data in found]))
            write_json_atomic(layout.measurement_file(out, model.name, threads), merged.to_dict())


def _merge_rounds(parts: list[tuple[Measurement, tuple[str, ...]]]) -> tuple[RoundLoad, ...]:
    """The rounds each shard tried, joined by round number: each stack's load (and part cut short) from the shard
    that timed it, and a round disturbed if it was in any of them."""
    by_number: dict[int, RoundLoad] = {}
    for data, stacks in parts:
        timed_here = {*stacks, *map(remedied, stacks)}
        for entry in data.rounds:
            joined = by_number.get(entry.round) or RoundLoad(round=entry.round, order=(), disturbed=False, loads={})
            by_number[entry.round] = replace(
                joined, order=entry.order if len(parts) == 1 else (),  # stacks timed in separate jobs took no turns
                disturbed=joined.disturbed or entry.disturbed,
                loads={**joined.loads, **{stack: load for stack, load in entry.loads.items() if stack in timed_here}},
                cut={**joined.cut, **{stack: s for stack, s in entry.cut.items() if stack in timed_here}})
    return tuple(by_number[n] for n in sorted(by_number))


def _read_measurement(folder: Path, model: str, threads: int) -> Measurement | None:
    """A shard's measurement file; None where it has none or it cannot be read (its stacks are then not merged)."""
    try:
        return load_measurement(folder, model, threads)
    except RecordError:
        return None
