"""Where every file lives, in one place: this tool's own folders, the cache shared by
every run on a machine, and every file of a run in its report folder.

    <TOOL_ROOT>/compat, models, envs, noxfile.py     the worker side, the built-in suite and stacks, the sessions
                                                     (a checkout's top level, or the installed package's _tool/)
    <cache>/ ($UPGRADE_GATE_CACHE, else ~/.cache/upgrade-gate)
      results/<stack>/<model>/<phase>/<key>/         finished phases (upgrade_gate.run.cache)
      assets/<digest>/                               converted weights, prompts and photos
      results/fixtures/<model>-<code>/{weights,inputs}.npz   the same for every stack and run

    <out>/
      report.md  report.html  results.json  verdict.json  junit.xml
      shard.json                                       what the folder holds: shard, stacks, specs, version
      stacks/<stack>/stack.json                        spec + what is installed (the probe, every package, the extras)
      stacks/<stack>/stopped.json                      --fail-fast: the failed hard gate the stack's run stopped at
      stacks/<stack>/models/<model>/
          export.json  runtime.json                    stage records per phase
          export.log   runtime.log                     the worker's stderr
          export.cache.json  runtime.cache.json        the phase's cache key, and whether it was reused
          eager.npz  artifact.npz  <method>.ptl|<method>.pte   the artifacts only with --keep-artifacts: by
                                                       default they stay in the result cache, listed by digest
                                                       under "released" in export.cache.json (run/artifacts.py)
          quantized.npz                                a quantized variant's: its quantized model run eagerly
          diagnose/                                    only where the artifact departs from its own eager model:
              diagnose.json  diagnose.log  diagnose.cache.json   the culprit search's stages, as a phase's
              repro/<method>/repro.py  inputs.pt       a reproducer to hand upstream (torch and executorch only)
          localize/repro/<method>/repro.py  …          a failed quantize, export or lowering's culprit: its reproducer
      measurements/<model>/threads-<n>.json            latency rounds, cold start and memory of every stack
      measurements/<model>/threads-<n>.<stack>.log     each measurement process's stderr
      measurements/<model>/repro/repro.py  …           a candidate found slower than the latency gate allows: both
      measurements/<model>/latency-reproducer.json     stacks' artifacts timed in turns, and what its run answered
      migrate/README.md  migrate/<model>/              what a GO hands over (upgrade_gate.migrate): export.py,
          export.py  MIGRATION.md  weights.npz  inputs.npz   which rebuilds the judged artifact, and the app's change
      migrate/project.diff                             the project's calls the move changes, written for the
                                                       candidate by the scan's rewrites; never applied
      bundle/  (docs/device.md)                        `nox -s bundle`, the device bundle: manifest.json,
          run-on-device.sh  device_runner.py  …        SHA256SUMS, plan.tsv, <model>/inputs.npz, <model>/<stack>/…
      device/<target>.jsonl  <target>.manifest.json    `device-results`: a device's rounds, and the bundle they ran
      device/<target>.failed.json                      a target of [tool.upgrade-gate.targets] that gave none: why
      project/<stack>/run.json  junit.xml  test.log    the team's tests in one stack ([tool.upgrade-gate.project])
      project/<stack>/warnings.json  progress.json     what upgrade-gate's pytest plugin saw of them
      project/<stack>/tests.cache.json                 the run's cache key and entry (upgrade_gate.project.session)
      project/patched/<stack>/run.json  junit.xml  …    a candidate's tests again, on a copy with migrate/project.diff
                                                       applied (the copy, in tree/, is gone after the run)
      project/scan.json  scan.cache.json  scan.log     the API scan of the team's source, its key, the scanner's output
      project/evidence/<stack>-<digest>/               what a report cites of a stack's test run: copies of the four
          run.json  junit.xml  test.log  warnings.json   files above, in a folder named by their SHA-256, so that
      project/evidence/scan-<digest>.json               a later run (`compat` after `compare`) never changes an
                                                       earlier report's evidence; likewise the scan
      compat.md  compat.json                           `nox -s compat`'s own report
      upgrade-path.md  .html  .json                    `nox -s releases`' report
      releases/<release>/release.json                  what became of one release, beside its own report folder
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from upgrade_gate.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent
# A wheel carries compat/, models/, envs/ and noxfile.py in the package (pyproject.toml's
# force-include); a checkout, and an editable install of it, has them at the repository's top level.
_INSTALLED = PACKAGE_DIR / "_tool"
TOOL_ROOT = _INSTALLED if (_INSTALLED / "noxfile.py").is_file() else PACKAGE_DIR.parents[1]
NOXFILE = TOOL_ROOT / "noxfile.py"
BUILT_IN_ENVS = TOOL_ROOT / "envs"
# Set by upgrade_gate.sessions when it loads NOXFILE into a team's own noxfile.
NOXFILE_IN_TEAM_NOXFILE = "upgrade_gate_sessions"
CACHE_ENV_VAR = "UPGRADE_GATE_CACHE"
# The assets' builders (nox -s assets, run/asset_build.py): each asset folder is built by the module of its
# name here (build.py runs them), so these are the asset names a model may read.
ASSET_BUILDERS = TOOL_ROOT / "models" / "sources"
ASSET_SOURCES = tuple(sorted(p.stem for p in ASSET_BUILDERS.glob("*.py") if p.stem not in ("build", "__init__")))
PHASES = ("export", "runtime")
EXPORT = PHASES[0]
# The phase after them where an artifact departs from its own eager model (upgrade_gate.run.diagnosis).
DIAGNOSE = "diagnose"
# The export phase's own folder: where its localize stage writes the first culprit's reproducer.
LOCALIZE = "localize"


# Every name upgrade-gate did not choose that becomes a folder, a file's name or a record's key has this one shape
# (the worker is sent METHOD_SHAPE in its job: compat/ cannot import this package), so no name — "..", "/abs", "",
# a 300-character one — reaches outside the folder it names.
def _shape(marks: str) -> re.Pattern[str]:
    return re.compile(rf"[A-Za-z0-9][A-Za-z0-9{marks}]{{0,63}}")


NAME_SHAPE = _shape("._-")
NAME_RULE = "1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit"
# A method's name (a key of a ModelCase's methods) names its artifact, ``<method><SUFFIX>``, and keys its inputs
# and outputs in the records, ``prefill.output_0``, which are read back at the first '.': so it has none. And the
# multi-method artifact is ``program<SUFFIX>`` (compat/common.py PROGRAM): no method may take that name.
METHOD_SHAPE = _shape("_-")
RESERVED_METHODS = ("program",)
METHOD_RULE = "1 to 64 letters, digits, '-' or '_', starting with a letter or digit, and not 'program'"


def name_problem(name: str) -> str | None:
    """None for a name of the allowed shape, else what is wrong with it and a name that would do."""
    if NAME_SHAPE.fullmatch(name):
        return None
    fixed = _suggested(name, "._-") or "my-model"
    return f"{name!r} is not a name upgrade-gate can use as a folder: {NAME_RULE}; e.g. {fixed!r}"


def method_problem(name: str) -> str | None:
    """None for a method's name of the allowed shape, else what is wrong with it and a name that would do."""
    if METHOD_SHAPE.fullmatch(name) and name not in RESERVED_METHODS:
        return None
    fixed = f"{name}-method" if name in RESERVED_METHODS else _suggested(name, "_-") or "forward"
    return (f"{name!r} is not a name upgrade-gate can use for a method's files and records: {METHOD_RULE}; "
            f"e.g. {fixed!r}")


def _suggested(name: str, marks: str) -> str:
    """``name`` made of the shape's characters: every run of others one '-', cut to 64."""
    return re.sub(rf"[^A-Za-z0-9{marks}]+", "-", name).lstrip("-._")[:64].rstrip("-._")


def same_folder(names: Iterable[str]) -> tuple[str, str] | None:
    """Two of ``names`` that differ only in case, and so are one folder where a file system ignores case (macOS's,
    where a device bundle may be run: bundle/<model>/<stack>/): the first such pair, else None."""
    seen: dict[str, str] = {}
    for name in names:
        if (first := seen.setdefault(name.casefold(), name)) != name:
            return first, name
    return None


def same_folder_problem(first: str, second: str) -> str:
    return (f"{first!r} and {second!r} differ only in case: on a file system that ignores case (macOS's) they would be "
            "one folder; rename one")


class NotAnEntry(ConfigError):
    """A name that would build a path outside the folder it belongs in."""


def entry(folder: Path, name: str) -> Path:
    """``folder / name``; a name that is no single entry (a record edited by hand, a fault of the tool) would write
    elsewhere: refused before anything is written (planted links: _confined.py)."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise NotAnEntry(f"{name!r} would make {folder / name} a path outside {folder}; upgrade-gate writes only in "
                         "its report folder and its result cache: a name there is one folder or file")
    return folder / name


def cache_root() -> Path:
    """Converted assets and finished phases, shared by every run on this machine."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "upgrade-gate"


def temporary_dir() -> Path:
    """The temporary folder (TMPDIR) of the programs the tool runs in a stack's venv (run/workers.py venv_env):
    what torch and the packages it calls put in the system's one — inductor's torchinductor_<user>, an export's
    structured trace, flatc's scratch files — stays in the cache."""
    return cache_root() / "tmp"


# The report folder's files named here, beside the functions that place them.
MANIFEST = "shard.json"
STACK_FILE, PROBE_FILE = "stack.json", "probe.json"
RELEASE_FILE = "release.json"
UPGRADE_PATH = "upgrade-path"  # upgrade-path.md, .html and .json


def stack_dir(out: Path, stack: str) -> Path:
    return entry(out / "stacks", stack)


def model_dir(out: Path, stack: str, model: str) -> Path:
    return entry(stack_dir(out, stack) / "models", model)


def diagnose_dir(out: Path, stack: str, model: str) -> Path:
    """Its own folder: a reproducer's folders stay apart from the export's and the runtime's files."""
    return model_dir(out, stack, model) / DIAGNOSE


def key_record_file(phase_dir: Path, phase: str) -> Path:
    """``<phase>.cache.json``, beside the phase's files: its cache key, and the entry they came from."""
    return phase_dir / f"{phase}.cache.json"


def stopped_file(out: Path, stack: str) -> Path:
    """``--fail-fast``: the failed hard gate a candidate's run stopped at (upgrade_gate.run.runner)."""
    return stack_dir(out, stack) / "stopped.json"


def stack_file(out: Path, stack: str) -> Path:
    return stack_dir(out, stack) / STACK_FILE


def probe_file(out: Path, stack: str) -> Path:
    return stack_dir(out, stack) / PROBE_FILE


def releases_dir(out: Path) -> Path:
    return out / "releases"


def release_dir(out: Path, release: str) -> Path:
    return entry(releases_dir(out), release)


def measurement_dir(out: Path, model: str) -> Path:
    return entry(out / "measurements", model)


def measurement_file(out: Path, model: str, threads: int) -> Path:
    return measurement_dir(out, model) / f"threads-{threads}.json"


def latency_reproducer_dir(out: Path, model: str) -> Path:
    return measurement_dir(out, model) / "repro"


def latency_reproducer_file(out: Path, model: str) -> Path:
    return measurement_dir(out, model) / "latency-reproducer.json"


def bundle_dir(out: Path) -> Path:
    return out / "bundle"


def bundle_manifest_file(out: Path) -> Path:
    """What the bundle holds (measure/device.py writes it; its SHA-256 names the bundle in a device's results)."""
    return bundle_dir(out) / "manifest.json"


def device_results_file(out: Path, target: str) -> Path:
    """A name of the allowed shape is the file's own (``pi.5`` and ``pi-5`` stay apart); one a device gives itself
    (``device:Pixel 8``) is made readable and marked by its digest after a '~', which no allowed name has."""
    if NAME_SHAPE.fullmatch(target):
        return entry(out / "device", f"{target}.jsonl")
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", target).strip("-")[:40] or "device"
    digest = hashlib.sha256(target.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return out / "device" / f"{readable}~{digest}.jsonl"


def device_manifest_file(results: Path) -> Path:
    """The bundle's manifest as it was when a device's results were read in, beside them."""
    return results.with_suffix(".manifest.json")


def device_results_files(out: Path) -> list[Path]:
    return sorted((out / "device").glob("*.jsonl"))


def device_failed_file(out: Path, target: str) -> Path:
    """Why a target of ``[tool.upgrade-gate.targets]`` gave no rounds this time (ssh's words), beside its results."""
    return device_results_file(out, target).with_suffix(".failed.json")


def device_failed_files(out: Path) -> list[Path]:
    return sorted((out / "device").glob("*.failed.json"))


# A stack's files in project/<stack>/ (project_dir), beside run.json.
RUN_FILE = "run.json"
JUNIT_FILE, LOG_FILE, WARNINGS_FILE, PROGRESS_FILE = "junit.xml", "test.log", "warnings.json", "progress.json"


def project_dir(out: Path, stack: str) -> Path:
    return entry(out / "project", stack)


def patched_project_dir(out: Path, stack: str) -> Path:
    """A candidate's run of the project's tests with migrate/project.diff applied to a copy."""
    return entry(out / "project" / "patched", stack)


def scan_file(out: Path) -> Path:
    return out / "project" / "scan.json"


def project_evidence_dir(out: Path) -> Path:
    """Where a report's copies of the project's evidence live (upgrade_gate.project.session.keep_evidence)."""
    return out / "project" / "evidence"


def stack_evidence_dir(out: Path, stack: str, digest: str) -> Path:
    return project_evidence_dir(out) / f"{stack}-{digest[:16]}"


def scan_evidence_file(out: Path, digest: str) -> Path:
    return project_evidence_dir(out) / f"scan-{digest[:16]}.json"


def fixtures_dir(cache_dir: Path, model: str, code_digest: str) -> Path:
    """Made once by the first stack to get there; keyed by the model's code, so that editing a model makes
    new ones instead of loading stale ones of another shape."""
    return entry(cache_dir / FIXTURES, f"{model}-{code_digest[:12]}")


FIXTURES = "fixtures"
