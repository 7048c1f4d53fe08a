"""Writes worker records by hand, for tests of the parent's pure logic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from upgrade_gate import layout

HASHES = {"weights_sha256": "a" * 64, "inputs_sha256": "b" * 64}


def write_stack_model(
    out: Path,
    stack: str,
    model: str,
    *,
    eager: list[np.ndarray] | None,
    artifact: list[np.ndarray] | None,
    samples_ms: list[float] | None = None,
    artifact_bytes: int = 1000,
    failed_stage: str | None = None,
    hashes: dict[str, str] = HASHES,
    runtime_peak_rss: int = 300 * 2**20,
    task: str = "generic",
) -> Path:
    """Both phase files as the worker writes them; ``failed_stage`` fails there and skips what depends on it."""
    directory = layout.model_dir(out, stack, model)
    directory.mkdir(parents=True, exist_ok=True)
    failed = False

    def stage(name: str, details: dict | None = None) -> dict:
        nonlocal failed
        if failed:
            return {"stage": name, "status": "skipped", "duration_s": 0.0, "reason": "needs an earlier stage"}
        if name == failed_stage:
            failed = True
            return {"stage": name, "status": "failed", "duration_s": 0.5,
                    "error": {"type": "RuntimeError", "message": f"{name} broke", "traceback_tail": ["line"]}}
        return {"stage": name, "status": "ok", "duration_s": 0.1, "details": details or {}}

    export = [
        stage("build", {"fixtures": hashes, "methods": ["forward"], "task": task}),
        stage("eager", {"file": "eager.npz"}),
        stage("export"),
        stage("save", {"bytes": artifact_bytes,
                       "methods": {"forward": {"file": "forward.pte", "bytes": artifact_bytes, "sha256": "c" * 64}}}),
    ]
    runtime = [
        stage("inputs"),
        stage("load"),
        stage("run", {"file": "artifact.npz"}),
        stage("latency", {"threads": 1, "warmup": 10, "methods": {"forward": {"samples_ms": samples_ms or [1.0] * 50}}}),
    ]
    for phase, stages, rss in (("export", export, 500 * 2**20), ("runtime", runtime, runtime_peak_rss)):
        (directory / f"{phase}.json").write_text(json.dumps({
            "schema_version": "1.0", "phase": phase, "stack": stack, "model": model,
            "stages": stages, "facts": {"peak_rss_bytes": rss}, "complete": True,
        }))
    for name, tensors in (("eager", eager), ("artifact", artifact)):
        if tensors is not None:
            np.savez(directory / f"{name}.npz", **{f"forward.output_{i}": t for i, t in enumerate(tensors)})
    return directory
