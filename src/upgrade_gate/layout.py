"""Where every file of a run lives in the output folder, in one place.

    <out>/
      report.md  results.json  verdict.json
      fixtures/<model>-<key>/{weights,inputs}.npz     same for every stack
      stacks/<stack>/stack.json                        spec + what is installed
      stacks/<stack>/models/<model>/
          export.json  runtime.json                    stage records per phase
          export.log   runtime.log                     the worker's stderr
          eager.npz  artifact.npz  model.ptl|model.pte
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from upgrade_gate.config import REPO_ROOT

PHASES = ("export", "runtime")


def stack_dir(out: Path, stack: str) -> Path:
    return out / "stacks" / stack


def model_dir(out: Path, stack: str, model: str) -> Path:
    return stack_dir(out, stack) / "models" / model


def fixtures_dir(out: Path, model: str, factory: str) -> Path:
    """Keyed by the model code, so that editing a model makes new weights and
    inputs instead of loading stale ones of another shape."""
    digest = hashlib.sha256(factory.encode())
    for source in sorted((REPO_ROOT / "models").rglob("*.py")):
        digest.update(source.relative_to(REPO_ROOT).as_posix().encode())
        digest.update(source.read_bytes())
    return out / "fixtures" / f"{model}-{digest.hexdigest()[:12]}"
