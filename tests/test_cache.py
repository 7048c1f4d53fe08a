"""The result cache: what a key depends on, verified entries, corrupt ones rebuilt."""

from __future__ import annotations

import errno
import json
import textwrap
from pathlib import Path

import pytest

from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.run import cache, cache_folder
from upgrade_gate.schema.records import RECORDS_VERSION


def built_in(factory: str) -> ModelEntry:
    return ModelEntry(name=factory, factory=factory, description="")


def test_a_built_in_models_sources_are_its_module_and_what_it_imports():
    names = {p.relative_to(TOOL_ROOT).as_posix() for p in cache.source_files(built_in("nanovlm:nanovlm"))}
    assert names == {"models/__init__.py", "models/nanovlm.py", "models/nanovlm_vision.py", "models/llama.py",
                     "models/decoding.py", "models/case.py", "models/assets.py"}
    vit = {p.name for p in cache.source_files(built_in("vit:vit_ti16"))}
    assert "llama.py" not in vit and {"vit.py", "case.py"} <= vit


def project_model(root: Path, name: str, factory: str) -> ModelEntry:
    return ModelEntry(name=name, factory=factory, description="", project_root=root)


def test_editing_one_project_model_changes_only_its_key(tmp_path):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "__init__.py").write_text("")
    (tmp_path / "nets" / "layers.py").write_text("WIDTH = 8\n")
    (tmp_path / "nets" / "a.py").write_text("from .layers import WIDTH\ndef build(): ...\n")
    (tmp_path / "nets" / "b.py").write_text("import nets.layers\ndef build(): ...\n")
    (tmp_path / "nets" / "c.py").write_text("import torch\ndef build(): ...\n")
    models = [project_model(tmp_path, n, f"nets.{n}:build") for n in "abc"]
    before = [cache.model_code_digest(m) for m in models]

    (tmp_path / "nets" / "layers.py").write_text("WIDTH = 16\n")
    after = [cache.model_code_digest(m) for m in models]
    assert [b != a for b, a in zip(before, after)] == [True, True, False]

    (tmp_path / "nets" / "c.py").write_text(textwrap.dedent("import torch\ndef build(): return 1\n"))
    assert cache.model_code_digest(models[2]) != after[2]
    assert cache.model_code_digest(models[0]) == after[0]


def phase_files(tmp_path: Path) -> list[Path]:
    out = tmp_path / "out"
    out.mkdir()
    (out / "export.json").write_text('{"complete": true}\n')
    (out / "forward.pte").write_bytes(b"\x00pte" * 1000)
    return sorted(out.iterdir())


def test_a_stored_entry_is_found_verified_and_linked(tmp_path):
    store = cache.ResultCache(tmp_path / "cache")
    files = phase_files(tmp_path)
    store.store("candidate", "vit", "export", "k1", files, {"seconds": 3.0})
    hit, problem = store.lookup("candidate", "vit", "export", "k1")
    assert problem is None and hit is not None
    assert set(hit.files) == {"export.json", "forward.pte"} and hit.manifest["seconds"] == 3.0
    assert (hit.path / "forward.pte").read_bytes() == files[1].read_bytes()
    assert store.lookup("candidate", "vit", "export", "k2") == (None, None)


def test_a_corrupt_entry_is_detected_by_its_hash_and_deleted(tmp_path):
    store = cache.ResultCache(tmp_path / "cache")
    entry = store.store("candidate", "vit", "export", "k1", phase_files(tmp_path), {}).path
    stored = entry / "forward.pte"
    data = bytearray(stored.read_bytes())
    data[10] ^= 0xFF  # same size, one byte flipped
    stored.unlink()
    stored.write_bytes(bytes(data))
    hit, problem = store.lookup("candidate", "vit", "export", "k1")
    assert hit is None and problem is not None
    assert "forward.pte does not match its SHA-256" in problem and not entry.exists()


def test_only_the_newest_entries_of_a_phase_are_kept(tmp_path):
    store = cache.ResultCache(tmp_path / "cache")
    files = phase_files(tmp_path)
    for key in ("k1", "k2", "k3"):
        store.store("legacy", "vit", "export", key, files, {})
    kept = sorted(p.name for p in (tmp_path / "cache" / "legacy" / "vit" / "export").iterdir())
    assert len(kept) == cache.KEEP_PER_PHASE and "k3" in kept


def test_installed_distributions_are_read_without_importing(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name in ("torch-2.8.0.dist-info", "typing_extensions-4.12.2.dist-info", "torch"):
        (site / name).mkdir(parents=True)
    assert cache.installed_distributions(tmp_path / "venv") == ["torch==2.8.0", "typing-extensions==4.12.2"]


def test_nothing_done_to_the_cache_changes_a_finished_report_folder(tmp_path):
    """The report folder gets copies: a damaged cache file, found and deleted on the next
    lookup, leaves every report folder that copied it whole."""
    store = cache.ResultCache(tmp_path / "cache")
    files = phase_files(tmp_path)
    hit = store.store("candidate", "vit", "export", "k1", files, {})
    report = tmp_path / "report"
    report.mkdir()
    for name in hit.files:
        cache.copy_file(hit.path / name, report / name)
    kept = (report / "forward.pte").read_bytes()
    assert (report / "forward.pte").stat().st_ino != (hit.path / "forward.pte").stat().st_ino

    damaged = bytearray((hit.path / "forward.pte").read_bytes())
    damaged[7] ^= 0xFF
    with open(hit.path / "forward.pte", "r+b") as stream:  # in place, as a bad disk or a stray write would
        stream.write(damaged)
    found, problem = store.lookup("candidate", "vit", "export", "k1")
    assert found is None and "does not match its SHA-256" in problem
    assert (report / "forward.pte").read_bytes() == kept


def test_a_copy_is_whole_or_absent(tmp_path, monkeypatch):
    """A copy that fails midway (the disk fills up) leaves nothing under its name, nor a partial file."""
    source = tmp_path / "big"
    source.write_bytes(b"x" * 4096)
    target = tmp_path / "report" / "big"
    target.parent.mkdir()

    def disk_fills_up(src, dst):
        Path(dst).write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(cache.shutil, "copyfile", disk_fills_up)
    with pytest.raises(OSError) as failed:
        cache.copy_file(source, target)
    assert failed.value.errno == errno.ENOSPC
    assert list(target.parent.iterdir()) == []


def test_pruning_keeps_what_a_report_folder_reached_and_nothing_else(tmp_path):
    """The entries a CI cache carries: each phase's (its key record in the report folder), each
    measurement's (under the stacks it measured), the fixtures of the models run; not an older key of
    the same phase, nor another model's, nor stale fixtures."""
    store = cache.ResultCache(tmp_path / "cache")
    files = phase_files(tmp_path)
    for stack, model, phase, key in [("legacy", "vit", "export", "old"), ("legacy", "vit", "export", "new"),
                                     ("candidate", "vit", "runtime", "r1"), ("candidate", "vit", "diagnose", "d1"),
                                     ("candidate", "gone", "export", "g1"),
                                     ("legacy+candidate", "vit", "measure-t1", "m1"),
                                     ("legacy+candidate", "vit", "measure-t1", "m0")]:
        store.store(stack, model, phase, key, files, {})
    for name in ("vit-aaaaaaaaaaaa", "vit-bbbbbbbbbbbb"):
        (tmp_path / "cache" / "fixtures" / name).mkdir(parents=True)
        (tmp_path / "cache" / "fixtures" / name / "inputs.npz").write_bytes(b"x" * 100)
    out = tmp_path / "report"
    for stack, phase, key, where in [("legacy", "export", "new", ""), ("candidate", "runtime", "r1", ""),
                                     ("candidate", "diagnose", "d1", "diagnose")]:
        folder = out / "stacks" / stack / "models" / "vit" / where
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{phase}.cache.json").write_text(json.dumps({"key": key, "stored": True}))
    (out / "measurements" / "vit").mkdir(parents=True)
    (out / "measurements" / "vit" / "threads-1.json").write_text(
        json.dumps({"schema_version": str(RECORDS_VERSION), "model": "vit", "threads": 1, "key": "m1",
                    "order": ["legacy", "candidate"]}))

    reached = cache_folder.reached_entries(out)
    assert reached == {("legacy", "vit", "export", "new"), ("candidate", "vit", "runtime", "r1"),
                       ("candidate", "vit", "diagnose", "d1"), ("legacy+candidate", "vit", "measure-t1", "m1")}
    pruned = cache_folder.prune(store.root, reached, {"vit-bbbbbbbbbbbb"})
    left = {p.parent.relative_to(tmp_path / "cache").parts for p in (tmp_path / "cache").glob("*/*/*/*/manifest.json")}
    assert left == reached
    assert [p.name for p in (tmp_path / "cache" / "fixtures").iterdir()] == ["vit-bbbbbbbbbbbb"]
    assert pruned.removed_entries == 3 and pruned.removed_bytes > 100 and pruned.kept_bytes > 100
    assert not (tmp_path / "cache" / "candidate" / "gone").exists()  # no empty folders left behind
    for stack, model, phase, key in reached:
        assert store.lookup(stack, model, phase, key)[0] is not None
