"""The result cache's folder as a whole: the lock every run holds on it, shared (``prune-cache`` takes it alone),
its CACHEDIR.TAG, and ``prune-cache``, which keeps only what a report folder reached."""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from upgrade_gate import layout
from upgrade_gate._confined import remove_tree
from upgrade_gate.errors import RecordError
from upgrade_gate.run.cache import MANIFEST, read_json
from upgrade_gate.schema.measurement import read_measurement

# The standard tag of a cache folder (https://bford.info/cachedir/): backup tools leave such a folder out,
# and so does the project's source (upgrade_gate.project.source) when the cache lives in the repository.
CACHE_TAG = "CACHEDIR.TAG"
CACHE_TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                  "# upgrade-gate's result cache: finished phases by content hash (docs/architecture.md).\n")

# Result caches this process uses: a shared flock held until it exits, as a venv's (run/venvs.py). `prune-cache`
# takes it alone: pruning under a live run removed fixtures its phases were reading (a false NO-GO).
USING: dict[Path, int] = {}
CACHE_LOCK = ".upgrade-gate-cache.lock"


def use_cache(root: Path) -> None:
    """This process uses the result cache: a shared lock on it (waiting while a prune runs)."""
    root = root.resolve()
    if root not in USING:
        root.mkdir(parents=True, exist_ok=True)
        USING[root] = _shared_lock(root / CACHE_LOCK)


def _shared_lock(path: Path) -> int:
    """A shared flock on an inode of this cache's own: a copy made with hard links (``cp -al``) shares the
    original's lock inode, and a run in one would hold the other; such a file is replaced by a new one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        if os.fstat(fd).st_nlink > 1:
            os.close(fd)
            fresh = path.with_name(f"{path.name}.{os.getpid()}.partial")
            os.close(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644))
            os.replace(fresh, path)
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            named = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            named = False
        if named:
            return fd
        os.close(fd)  # replaced while this process waited: lock the file the path names now


def alone_in_cache(root: Path) -> bool:
    """Take the result cache alone (True), or False while another process uses it."""
    use_cache(root)
    fd = USING[root.resolve()]
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_SH)  # converting gave the shared lock up: take it back
        return False
    return True


def share_cache(root: Path) -> None:
    """Back to a shared lock after a prune: other runs may use the cache again."""
    fcntl.flock(USING[root.resolve()], fcntl.LOCK_SH)


def tag_cache(folder: Path) -> None:
    """Mark ``folder`` as a cache (CACHEDIR.TAG), once."""
    tag = folder / CACHE_TAG
    if not tag.is_file():
        partial = folder / f".{CACHE_TAG}.{os.getpid()}.partial"
        partial.write_text(CACHE_TAG_TEXT, encoding="utf-8")
        os.replace(partial, tag)


def prune(root: Path, reached: set[tuple[str, str, str, str]], fixtures: set[str]) -> Pruned:
    """Delete every entry but those ``reached`` and every fixtures folder but those named: what a CI cache
    carries to the next run is what this run used."""
    kept = removed = 0
    removed_entries = 0
    for manifest in sorted(root.glob(f"*/*/*/*/{MANIFEST}")):
        entry = manifest.parent
        stack, model, phase, key = entry.relative_to(root).parts
        size = tree_bytes(entry)
        if (stack, model, phase, key) in reached:
            kept += size
            continue
        remove_tree(entry, within=root)
        removed, removed_entries = removed + size, removed_entries + 1
    for folder in sorted((root / layout.FIXTURES).glob("*/")):
        size = tree_bytes(folder)
        if folder.name in fixtures:
            kept += size
        else:
            remove_tree(folder, within=root)
            removed += size
    for pattern in ("*/*/*", "*/*", "*"):  # phases, then models, then stacks left empty
        for folder in sorted(p for p in root.glob(pattern) if p.is_dir() and not any(p.iterdir())):
            folder.rmdir()
    return Pruned(kept_bytes=kept, removed_bytes=removed, removed_entries=removed_entries)


@dataclass(frozen=True, kw_only=True, slots=True)
class Pruned:
    kept_bytes: int
    removed_bytes: int
    removed_entries: int


def tree_bytes(folder: Path) -> int:
    """Every file's bytes below ``folder`` (0 without one)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def reached_entries(out: Path) -> set[tuple[str, str, str, str]]:
    """The cache entries a report folder's phases, project runs and measurements came from or went to."""
    reached = set()
    for record in sorted(out.glob("stacks/*/models/*/*.cache.json")) + sorted(
            out.glob(f"stacks/*/models/*/{layout.DIAGNOSE}/*.cache.json")):
        model_dir = record.parent if record.parent.name != layout.DIAGNOSE else record.parent.parent
        phase = record.name.removesuffix(".cache.json")
        key = (read_json(record) or {}).get("key")
        if key:
            reached.add((model_dir.parent.parent.name, model_dir.name, phase, str(key)))
    # The project's test runs and scan (upgrade_gate.project.session): their records name their entry.
    for record in (sorted(out.glob("project/*.cache.json")) + sorted(out.glob("project/*/*.cache.json"))
                   + sorted(out.glob("project/patched/*/*.cache.json"))):
        data = read_json(record) or {}
        entry, key = data.get("entry"), data.get("key")
        if key and isinstance(entry, list) and len(entry) == 3:
            reached.add((str(entry[0]), str(entry[1]), str(entry[2]), str(key)))
    for file in sorted(out.glob("measurements/*/threads-*.json")):
        with contextlib.suppress(RecordError):  # a damaged file reached nothing the cache can keep
            if (measured := read_measurement(file, file.name)).key and measured.order:
                reached.add(("+".join(measured.order), file.parent.name, f"measure-t{measured.threads}", measured.key))
    return reached
