"""Where every file lives, in one place: this tool's own folders, the cache shared by
every run on a machine, and every file of a run in its report folder.

    <REPO_ROOT>/compat, models, envs, noxfile.py     the worker side, the built-in suite, the default stacks
    <cache>/ ($UPGRADE_GATE_CACHE, else ~/.cache/upgrade-gate)
      results/<stack>/<model>/<phase>/<key>/         finished phases (upgrade_gate.cache)
      assets/<digest>/                               converted weights, prompts and photos
      results/fixtures/<model>-<code>/{weights,inputs}.npz   the same for every stack and run

    <out>/
      report.md  report.html  results.json  verdict.json  junit.xml
      shard.json                                       what the folder holds: shard, stacks, specs, version
      stacks/<stack>/stack.json                        spec + what is installed
      stacks/<stack>/models/<model>/
          export.json  runtime.json                    stage records per phase
          export.log   runtime.log                     the worker's stderr
          export.cache.json  runtime.cache.json        the phase's cache key, and whether it was reused
          eager.npz  artifact.npz  <method>.ptl|<method>.pte
      measurements/<model>/threads-<n>.json            latency rounds, cold start and memory of every stack
      measurements/<model>/threads-<n>.<stack>.log     each measurement process's stderr
      project/<stack>/run.json  junit.xml  test.log    the team's tests in one stack ([tool.upgrade-gate.project])
      project/scan.json                                the API scan of the team's source
      compat.md  compat.json                           `nox -s compat`'s own report
"""

from __future__ import annotations

import os
from pathlib import Path

# The repository holds the worker-side folders next to the parent package.
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ENV_VAR = "UPGRADE_GATE_CACHE"
PHASES = ("export", "runtime")


def cache_root() -> Path:
    """Converted assets and finished phases, shared by every run on this machine:
    ``$UPGRADE_GATE_CACHE``, else ``$XDG_CACHE_HOME/upgrade-gate``, else ``~/.cache/upgrade-gate``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "upgrade-gate"


def stack_dir(out: Path, stack: str) -> Path:
    return out / "stacks" / stack


def model_dir(out: Path, stack: str, model: str) -> Path:
    return stack_dir(out, stack) / "models" / model


def measurement_dir(out: Path, model: str) -> Path:
    return out / "measurements" / model


def measurement_file(out: Path, model: str, threads: int) -> Path:
    return measurement_dir(out, model) / f"threads-{threads}.json"


def project_dir(out: Path, stack: str) -> Path:
    return out / "project" / stack


def scan_file(out: Path) -> Path:
    return out / "project" / "scan.json"


def fixtures_dir(cache_dir: Path, model: str, code_digest: str) -> Path:
    """The weights and inputs every stack uses, made once by the first stack to
    get there. Kept in the cache beside the results made from them, and keyed by
    the model's code, so that editing a model makes new ones instead of loading
    stale ones of another shape."""
    return cache_dir / "fixtures" / f"{model}-{code_digest[:12]}"
