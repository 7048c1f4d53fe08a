"""Finished phases, kept by the SHA-256 of everything that determines them: the stack (spec and every installed
distribution), the model's code, its weights and inputs, the worker's and adapter's code, and for a later phase
the one before it. A later run with the same key copies the files instead of running the phase; a stored file
that does not match its manifest is a corrupt entry, deleted, and the phase runs again.

    <cache>/<stack>/<model>/<phase>/<key>/{manifest.json, files…}
"""

from __future__ import annotations

import ast
import fcntl
import functools
import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate import __version__
from upgrade_gate._atomic import naming_full_disk, sha256_file
from upgrade_gate._confined import remove_tree
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.specs import WORKER_MODULES, WORKER_WINGS
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.run import packages

MANIFEST = "manifest.json"
# The code every stack's worker runs, whatever its adapter, relative to the repository: compat/'s
# modules that are no adapter and nothing only an adapter imports (specs.WORKER_MODULES), every file of its
# wings (specs.WORKER_WINGS, by glob: a new one is keyed), and models/'s package and case.py, which checks what
# every factory returns — a project's model's too, whose own key holds only the project's files.
# tests/test_compat.py reads the worker's imports to keep this whole.
WORKER_FILES = (*(f"compat/{name}.py" for name in WORKER_MODULES),
                *sorted(path.relative_to(TOOL_ROOT).as_posix() for wing in WORKER_WINGS
                        for path in (TOOL_ROOT / "compat" / wing).rglob("*.py")),
                "models/__init__.py", "models/case.py")
# compat/'s name inside a stack: a team's adapter file builds on ours with
# `from upgrade_gate_compat.executorch_xnnpack import …` (compat/worker.py).
COMPAT_PACKAGE = "upgrade_gate_compat"
# Entries kept per stack, model and phase: the newest few, so that switching
# between two versions of a model does not redo either, and the cache does not grow forever.
KEEP_PER_PHASE = 2
# Outcomes worth keeping: a stage that raised does so again with the same inputs.
# A deadline, a crash or the memory limit may depend on the machine: run again.
CACHEABLE_STATUSES = {"ok", "failed", "skipped"}


def digest_of(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# -- what determines a phase ---------------------------------------------------


def source_files(model: ModelEntry) -> list[Path]:
    """The model's module and every module of its own package it imports, transitively.

    Built-in models live in models/; a project's models in its root. Imports of
    other packages (torch, numpy) are the stack's, keyed by its installed versions.
    """
    root = model.project_root or TOOL_ROOT / "models"
    module = model.factory.partition(":")[0]
    found: dict[str, Path] = {}
    pending = [module, "case"] if model.project_root is None else [module]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        path = _module_path(root, name)
        if path is None:
            continue
        found[name] = path
        parts = name.split(".")
        for depth in range(1, len(parts)):  # the packages' __init__ files run too
            init = _module_path(root, ".".join(parts[:depth]))
            if init is not None:
                found.setdefault(".".join(parts[:depth]), init)
        package = parts if path.name == "__init__.py" else parts[:-1]
        pending.extend(_imported_modules(path, package))
    if model.project_root is None and (root / "__init__.py").is_file():
        found["__init__"] = root / "__init__.py"
    return sorted(set(found.values()))


def _module_path(root: Path, name: str) -> Path | None:
    if not name:
        return root / "__init__.py" if (root / "__init__.py").is_file() else None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# ast.parse from several threads (the parallel exports each key their model) can fail in CPython 3.11
# with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905): one at a time.
_PARSING = threading.Lock()


def _imported_modules(path: Path, package: list[str]) -> list[str]:
    try:
        with _PARSING:
            tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return []  # the worker will report it; the file's bytes are still in the key
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            names.append(prefix)
            # `from . import assets` imports a module; `from .case import Method` a name (harmless if not a module).
            names += [f"{prefix}.{alias.name}" if prefix else alias.name for alias in node.names]
    return [n for n in names if n]


def files_digest(paths: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(f"{path.relative_to(root).as_posix() if path.is_relative_to(root) else path}\0".encode())
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def model_code_digest(model: ModelEntry) -> str:
    root = model.project_root or TOOL_ROOT
    return digest_of({"factory": model.factory, "sources": files_digest(source_files(model), root)})


def adapter_files(adapter: str) -> list[Path]:
    """The adapter's file (a module of compat/ by name, or a spec's own file) and every module of compat/
    it imports, transitively (parsed with ast): the candidate is keyed by executorch_profile.py too, and a
    team's file built on executorch_xnnpack by that module and what it imports."""
    compat = TOOL_ROOT / "compat"
    pending = [Path(adapter) if adapter.endswith(".py") else compat / f"{adapter}.py"]
    found: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.add(path)
        package = [COMPAT_PACKAGE, *path.parent.relative_to(compat).parts] if path.is_relative_to(compat) else []
        for name in _imported_modules(path, package):
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == COMPAT_PACKAGE and (module := _module_path(compat, ".".join(parts[1:]))):
                pending.append(module)
    return sorted(found)


def worker_code_digest(adapter: str) -> str:
    """The worker and the adapter: the code that turns a model into records."""
    # A spec's own adapter file is named by its file name, not its folder: a clone elsewhere reuses the cache.
    return digest_of({
        "tool": __version__,
        "worker": files_digest([TOOL_ROOT / name for name in WORKER_FILES], TOOL_ROOT),
        "adapter": {path.relative_to(TOOL_ROOT).as_posix() if path.is_relative_to(TOOL_ROOT) else path.name:
                    sha256_file(path) for path in adapter_files(adapter)},
    })


def installed_distributions(venv: Path) -> list[str]:
    """``name==version`` of everything installed in a venv, from its dist-info folders (no import)."""
    # Spelled as keys have always been (not canonicalize_name): a new spelling would miss every cache entry.
    return sorted(f"{name.lower().replace('_', '-')}=={version}" for name, version in packages.dist_infos(venv))


def fixtures_digest(fixtures_dir: Path) -> str | None:
    """The shared weights and inputs a phase used, or None before any stack wrote them."""
    if not (fixtures_dir / "inputs.npz").is_file():
        return None
    files = sorted(p for p in fixtures_dir.iterdir() if p.is_file())
    return _fixtures_digest(fixtures_dir, tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@functools.lru_cache(maxsize=256)
def _fixtures_digest(fixtures_dir: Path, stamps: tuple[tuple[str, int, int], ...]) -> str:
    # Fixture files are written once and never change; a 1B model's weights
    # are 5 GB, so each is hashed once per process, not before and after every phase.
    return files_digest([fixtures_dir / name for name, _, _ in stamps], fixtures_dir)


# -- the store ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Hit:
    """A verified entry: where its files are and what they are."""

    path: Path
    manifest: dict[str, Any]

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.manifest["files"]


class ResultCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry_dir(self, stack: str, model: str, phase: str, key: str) -> Path:
        return self.root / stack / model / phase / key

    def lookup(self, stack: str, model: str, phase: str, key: str) -> tuple[Hit | None, str | None]:
        """The verified entry for a key, or None and why (a corrupt entry is deleted)."""
        path = self.entry_dir(stack, model, phase, key)
        if not path.is_dir():
            return None, None
        manifest, problem = _verified_manifest(path, key)
        if manifest is None:
            remove_tree(path, within=self.root)
            return None, f"cache entry {path} is corrupt ({problem}); deleted, running the phase again"
        os.utime(path / MANIFEST)  # most recently used: kept longest
        return Hit(path=path, manifest=manifest), None

    def store(self, stack: str, model: str, phase: str, key: str, files: list[Path], meta: dict[str, Any],
              base: Path | None = None) -> Hit:
        """Keep ``files`` under ``key``, each by its name, or by its path under ``base`` (a phase whose
        folder has folders: the diagnose phase's reproducers); a concurrent writer of the same key is harmless."""
        final = self.entry_dir(stack, model, phase, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = final.parent / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        manifest_files = {}
        try:
            for source in files:
                name = source.relative_to(base).as_posix() if base else source.name
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                copy_file(source, staging / name)
                manifest_files[name] = {"bytes": source.stat().st_size, "sha256": sha256_file(staging / name)}
            manifest = {"key": key, "stack": stack, "model": model, "phase": phase, "stored_at": time.time(),
                        "files": manifest_files, **meta}
            with naming_full_disk(staging / MANIFEST):
                (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n",
                                                encoding="utf-8")
        except BaseException:  # a full cache disk: no half entry left behind
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if final.exists():  # --fresh ran it again: the new files replace the old
            remove_tree(final, within=self.root)
        try:
            os.rename(staging, final)
        except OSError:  # another run stored the same key meanwhile
            shutil.rmtree(staging, ignore_errors=True)
        self._prune(final.parent)
        return Hit(path=final, manifest=manifest)

    def _prune(self, phase_dir: Path) -> None:
        entries = [p for p in phase_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
        entries.sort(key=lambda p: (p / MANIFEST).stat().st_mtime if (p / MANIFEST).is_file() else 0, reverse=True)
        for old in entries[KEEP_PER_PHASE:]:
            remove_tree(old, within=self.root)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_manifest_files(manifest: Path) -> dict[str, dict[str, Any]]:
    """An entry's files as its manifest lists them (name → bytes, SHA-256), unverified; {} without one."""
    files = (read_json(manifest) or {}).get("files")
    return files if isinstance(files, dict) else {}


def _verified_manifest(path: Path, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """The entry's manifest if every file matches it, else None and what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("key") != key:
            return None, "its manifest names another key"
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                return None, f"{name} is missing"
            if file.stat().st_size != expected["bytes"] or sha256_file(file) != expected["sha256"]:
                return None, f"{name} does not match its SHA-256"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"unreadable manifest: {error}"
    return manifest, None


def copy_file(source: Path, target: Path) -> None:
    """A copy of its own, never a link: nothing done to the cache may change a finished report folder, nor a
    report folder the cache. Written under a temporary name and renamed; the blocks cloned where the file system
    can (btrfs, XFS), else the bytes copied.
    """
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    with naming_full_disk(target):
        _copy_file(source, target, partial)


def _copy_file(source: Path, target: Path, partial: Path) -> None:
    try:
        try:
            with open(source, "rb") as src, open(partial, "wb") as dst:
                fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError:  # no reflinks here (ext4, tmpfs) or across file systems: the bytes
            shutil.copyfile(source, partial)
        shutil.copystat(source, partial)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


# The ioctl that clones a file's blocks into another (linux/fs.h), absent from Python 3.11's fcntl.
FICLONE = 0x40049409
