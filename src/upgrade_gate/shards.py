"""Sharded runs: a CI matrix splits the work, `nox -s report -- DIR...` joins it.

A job runs part of the models in one stack or all of them:

    nox -s "run(candidate)" measure -- --shard 2/4 --out shard-candidate-2

and its report folder says what it holds in ``shard.json``: the tool version,
the stack specs (by digest), the run's full model selection, which shard and
which stacks. Merging checks that every folder comes from the same tool, specs
and selection, that each stack has every shard exactly once, then links each
folder's records and artifacts into the report folder, where the report is
written as for a single run. Measurements of one model made by different jobs
(one stack each) are joined into one file; each stack's record names the host
that timed it, and the latency gate will not compare times from two machines.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Callable

from upgrade_gate import __version__, cache, layout
from upgrade_gate.atomic import write_json_atomic
from upgrade_gate.config import Plan
from upgrade_gate.errors import ConfigError

MANIFEST = "shard.json"


def spec_digests(plan: Plan) -> dict[str, str]:
    return {spec.name: cache.digest_of(spec.to_dict()) for spec in plan.stacks}


def describe(plan: Plan, stack: str) -> Path:
    """Add ``stack`` to the report folder's shard.json (written for every run, sharded or not)."""
    path = plan.settings.out_dir / MANIFEST
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    stacks = set(known.get("stacks") or []) if known.get("models") == [m.name for m in plan.models] else set()
    write_json_atomic(path, {
        "tool_version": __version__,
        "shard": str(plan.shard) if plan.shard else "1/1",
        "selection": list(plan.selection),
        "models": [m.name for m in plan.models],
        "stacks": sorted(stacks | {stack}),
        "specs": spec_digests(plan),
        "host": socket.gethostname(),
    })
    return path


def merge(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """Check the shard folders of ``plan.merge`` and link their results into the report folder."""
    manifests = [_manifest(folder) for folder in plan.merge]
    _check_same_run(plan, manifests)
    out = plan.settings.out_dir
    for folder, manifest in zip(plan.merge, manifests):
        for stack in manifest["stacks"]:
            source = layout.stack_dir(folder, stack)
            target = layout.stack_dir(out, stack)
            target.mkdir(parents=True, exist_ok=True)
            if (source / "stack.json").is_file() and not (target / "stack.json").exists():
                cache.link_or_copy(source / "stack.json", target / "stack.json")
            for model in manifest["models"]:
                _link_tree(source / "models" / model, target / "models" / model)
        log(f"merged {folder}: shard {manifest['shard']}, {', '.join(manifest['stacks'])}, "
            f"{len(manifest['models'])} model(s)")
    _merge_measurements(plan, manifests)


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{folder}: not a shard folder (no {MANIFEST}); make one with "
                          "`nox -s \"run(<stack>)\" measure -- --shard K/N --out DIR`") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: unreadable ({error}); run that shard again") from None
    for key in ("tool_version", "shard", "selection", "models", "stacks", "specs"):
        if key not in manifest:
            raise ConfigError(f"{path}: no {key!r}; it was written by another tool or damaged; run that shard again")
    manifest["folder"] = folder
    return manifest


def _check_same_run(plan: Plan, manifests: list[dict[str, Any]]) -> None:
    """One tool version, one set of stack specs, one model selection; every shard of every stack once."""
    here: dict[str, Any] = {"tool_version": __version__, "specs": spec_digests(plan), "selection": list(plan.selection)}
    what = {"tool_version": "upgrade-gate version", "specs": "stack specs (envs/)",
            "selection": "model selection (suite, --models, variants)"}
    for manifest in manifests:
        for key, expected in here.items():
            found = manifest[key]
            if key == "specs":
                found = {s: d for s, d in found.items() if s in manifest["stacks"]}
                expected = {s: d for s, d in expected.items() if s in manifest["stacks"]}
            if found != expected:
                raise ConfigError(
                    f"{manifest['folder']}: made with another {what[key]} than this report "
                    f"({_show(found)} here {_show(expected)}); merge only shards of one run, made with this "
                    "checkout, or re-run that shard")
    counts = {int(m["shard"].split("/")[1]) for m in manifests}
    if len(counts) > 1:
        raise ConfigError(f"shards of different splits ({', '.join(sorted({m['shard'] for m in manifests}))}); "
                          "merge the shards of one `--shard K/N` matrix")
    count = counts.pop()
    seen: dict[tuple[str, int], Path] = {}
    for manifest in manifests:
        index = int(manifest["shard"].split("/")[0])
        for stack in manifest["stacks"]:
            if (stack, index) in seen:
                raise ConfigError(f"{manifest['folder']} and {seen[stack, index]} both hold shard {index}/{count} "
                                  f"of stack {stack!r}; pass one of them")
            seen[stack, index] = manifest["folder"]
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
            cache.link_or_copy(file, destination)


def _merge_measurements(plan: Plan, manifests: list[dict[str, Any]]) -> None:
    """One measurement file per model and thread count, each stack's record from the shard that timed it."""
    out = plan.settings.out_dir
    for model in plan.models:
        for threads in plan.settings.threads:
            found = [(m, data) for m in manifests
                     if model.name in m["models"]
                     and (data := _read(layout.measurement_file(m["folder"], model.name, threads))) is not None]
            if not found:
                continue
            merged: dict[str, Any] = {**found[0][1], "stacks": {}, "merged_from": {}}
            for manifest, data in found:
                for stack in manifest["stacks"]:
                    record = (data.get("stacks") or {}).get(stack)
                    if record is not None:
                        merged["stacks"][stack] = record
                        merged["merged_from"][stack] = str(manifest["folder"])
            merged["order"] = [spec.name for spec in plan.stacks if spec.name in merged["stacks"]]
            write_json_atomic(layout.measurement_file(out, model.name, threads), merged)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
