"""The worker's two phases for one model in one stack, each in a fresh process:

* ``export``  — build → eager [→ eager-task] [→ quantize] → export [→ localize] → save [→ backends]
* ``runtime`` — inputs → load → run [→ task] → profile, like an app that only has the artifacts

``eager-task`` and ``task`` run a generation loop (greedy decoding) for models
that have one. A model with several methods that asks for one artifact (an LLM's
prefill and decode) is saved, where the stack can, as one multi-method
``program<SUFFIX>`` that holds the shared weights once; the runtime phase and the
measurement run each method from it, as an app does.

Every stage leaves a record (status, duration, error with traceback tail). A
stage that raises is recorded and the stages that depend on it are skipped; the
phase file is rewritten after every stage, so a crash or a kill leaves the
stages that finished and names the one that was running.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .common import (
    RECORDS_VERSION,
    error_record,
    peak_rss_bytes,
    sha256_file,
    write_json_atomic,
)


class StageSkipped(Exception):
    """A stage could not start because a stage it needs did not succeed."""


class PhaseLog:
    """The stage records of one phase, persisted after every change."""

    def __init__(self, path: Path, job: dict[str, Any], phase: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema_version": RECORDS_VERSION,
            "phase": phase,
            "stack": job["stack"],
            "model": job["model"],
            "pid": os.getpid(),
            "stages": [],
            "facts": {},
        }
        self.results: dict[str, Any] = {}
        # Folders of files the tool gives the phase (the shared weights and inputs, the converted assets):
        # one that vanishes while the phase runs was removed from outside (a prune, a person), not lost
        # by the model: its stage is "vanished", which a re-run resumes, never the candidate's failure.
        # Only those there when the phase starts: one never made (its export failed) did not vanish.
        self.provided = [folder for key in ("fixtures_dir", "assets_dir") if job.get(key)
                         and (folder := Path(job[key]).resolve()).is_dir()]
        self._save()

    def stage(self, name: str, needs: tuple[str, ...], func: Callable[[], Any]) -> Any:
        """Run one stage and record its outcome; return its value or None."""
        # started_at (wall clock) is what the parent measures this stage's deadline from.
        record: dict[str, Any] = {"stage": name, "status": "running", "duration_s": 0.0, "started_at": time.time()}
        self.data["stages"].append(record)
        missing = [n for n in needs if n not in self.results]
        if missing:
            record.update(status="skipped", reason=f"needs {', '.join(missing)}")
            self._save()
            return None
        self._save()
        start = time.perf_counter()
        try:
            value, details = func()
        except StageSkipped as why:
            record.update(status="skipped", reason=str(why), duration_s=time.perf_counter() - start)
            self._save()
            return None
        except Exception as error:  # noqa: BLE001 - every failure becomes a record
            status = "vanished" if self._vanished(error) else "failed"
            record.update(status=status, duration_s=time.perf_counter() - start, error=error_record(error))
            self._save()
            return None
        record.update(status="ok", duration_s=time.perf_counter() - start)
        if details:
            record["details"] = details
        self.results[name] = value
        self._save()
        return value

    def _vanished(self, error: Exception) -> bool:
        """A file the tool provided, missing when the stage reached for it."""
        if not isinstance(error, FileNotFoundError) or not error.filename:
            return False
        missing = Path(os.fsdecode(error.filename)).resolve()
        return any(missing.is_relative_to(folder) for folder in self.provided)

    def finish(self, **facts: Any) -> None:
        self.data["facts"].update(facts)
        self.data["facts"]["peak_rss_bytes"] = peak_rss_bytes()
        self.data["complete"] = True
        self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, self.data)



# -- tensors in and out --------------------------------------------------------


def save_arrays(path: Path, arrays: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    arrays = {k: v.detach().cpu().contiguous().numpy() if hasattr(v, "detach") else v for k, v in arrays.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half file behind
    return {
        "file": path.name,
        "outputs": [{"name": k, "shape": list(a.shape), "dtype": str(a.dtype)} for k, a in arrays.items()],
    }


def method_outputs(per_method: dict[str, list[tuple[str, Any]]]) -> dict[str, Any]:
    """``{"prefill.output_0": tensor, "forward.output_0[logits]": …}``: one flat namespace for
    every method's named outputs (``named_outputs``)."""
    return {f"{method}.{name}": t for method, named in per_method.items() for name, t in named}


def check_like_reference(outputs: dict[str, Any], reference: dict[str, Any]) -> None:
    """An artifact that runs must give what its eager model gives: the same
    outputs by name, shape and dtype, and no NaN or Inf where eager has none."""
    import torch

    missing, extra = sorted(set(reference) - set(outputs)), sorted(set(outputs) - set(reference))
    if missing or extra:
        raise ValueError(f"the artifact's outputs are not the eager model's: missing {missing or 'none'}, "
                         f"unexpected {extra or 'none'}")
    for name, expected in reference.items():
        got = outputs[name]
        if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
            raise ValueError(f"{name}: the artifact gives {got.dtype} {tuple(got.shape)}, "
                             f"the eager model {expected.dtype} {tuple(expected.shape)}")
        if got.is_floating_point():
            bad = ~torch.isfinite(got) & torch.isfinite(expected)
            if bool(bad.any()):
                raise ValueError(f"{name}: {int(bad.sum())} of {got.numel()} values are NaN or Inf "
                                 "where the eager model's are finite")


def failed_at(step: str, failure: Exception) -> str:
    """A remedy's row where it did not lower, save, load or run: the step, and the error."""
    said = " — ".join([str(failure)[:500], *getattr(failure, "__notes__", [])])  # a runtime's own words (runtime_said)
    return f"{step}: {type(failure).__name__}: {said}"


def run_task(case: Any, call: Callable[..., list[Any]], path: Path) -> tuple[bool, dict[str, Any]]:
    """A generation task's end-to-end loop; its tokens and logits go to ``path``."""
    import torch

    result = case.task.drive(call)
    tokens = [list(map(int, seq)) for seq in result["tokens"]]
    steps = max((len(seq) for seq in tokens), default=0)
    padded = torch.full((len(tokens), steps), -1, dtype=torch.int64)
    for row, seq in enumerate(tokens):
        padded[row, : len(seq)] = torch.tensor(seq, dtype=torch.int64)
    save_arrays(path, {"tokens": padded, "step_logits": result["step_logits"].float()})
    return True, {"file": path.name, "prompts": list(result.get("prompts", [])), "tokens": tokens,
                  "text": list(result["text"])}


# -- the phases ----------------------------------------------------------------


# The float model's variant; a quantized variant runs the adapter's quantize() first.
FP32 = "fp32"


def failed(log: PhaseLog, stage: str) -> bool:
    return any(r["stage"] == stage and r["status"] == "failed" for r in log.data["stages"])


def written_artifact(path: Path) -> dict[str, Any]:
    """The file an exporter wrote: name, size, SHA-256. An exporter can
    "succeed" and leave an empty file (seed 000: OOM during partitioning left a
    0-byte .pte); only a non-empty file counts."""
    if not path.is_file():
        raise FileNotFoundError(f"exporter wrote no artifact at {path}")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"exporter wrote an empty artifact ({path.name}: 0 bytes)")
    return {"file": path.name, "bytes": size, "sha256": sha256_file(path)}


@contextlib.contextmanager
def partial_file(path: Path) -> Iterator[Path]:
    """A name to write ``path`` under, renamed to it only when the writer returns:
    a writer killed midway leaves no truncated artifact behind (and a run that stops
    removes these names: upgrade_gate.pipeline.stop_writers)."""
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    partial.unlink(missing_ok=True)
    try:
        yield partial
        if partial.exists():  # a writer that wrote nothing is caught by written_artifact
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
