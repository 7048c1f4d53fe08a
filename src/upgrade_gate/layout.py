"""Where every file of a run lives in the output folder, in one place.

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

    <cache>/fixtures/<model>-<code>/{weights,inputs}.npz   same for every stack and run
"""

from __future__ import annotations

from pathlib import Path


PHASES = ("export", "runtime")


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
