"""Which files are the team's source (upgrade_gate/project/source.py): what the scan reads and what keys the
project's reused results — never a venv, build output, a report folder or a cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from upgrade_gate.project.source import SourcePathError, files_digest, project_files
from upgrade_gate.run import cache_folder, shards
from upgrade_gate.run._folder_lock import lock_out_dir

CALL = "import torch\nstate = torch.load(path)\n"


def test_venvs_build_output_report_folders_and_caches_are_not_the_teams_source(tmp_path):
    root = tmp_path / "team"
    for folder in (".venv", ".nox/s/lib", "__pycache__", "build", "dist", "node_modules", "lib/site-packages",
                   "myenv", "src/team_app.egg-info", "src/app", "report-old", "ci-report", "cache/results"):
        (root / folder).mkdir(parents=True)
        (root / folder / "mod.py").write_text(CALL)
    (root / "myenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "src" / "app" / "notes.txt").write_text(CALL)
    # Issue 37: a report folder inside the repository — its diagnose reproducer was listed among the team's
    # calls to change. Each carries the lock file every session takes (this process takes it, as a run does).
    report = root / "report"
    repro = report / "stacks" / "candidate" / "models" / "m" / "diagnose" / "repro" / "forward" / "repro.py"
    repro.parent.mkdir(parents=True)
    repro.write_text(CALL)
    lock_out_dir(report)
    (root / "report-old" / ".upgrade-gate.lock").write_text("")
    # One downloaded from CI has lost its hidden files, not its shard.json.
    (root / "ci-report" / shards.MANIFEST).write_text("{}")
    cache_folder.tag_cache(root / "cache" / "results")  # a result cache configured inside the repository
    assert project_files(root, ["."], suffix=".py") == [Path("src/app/mod.py")]
    assert project_files(root) == [Path("src/app/mod.py"), Path("src/app/notes.txt")]
    assert (root / "cache" / "results" / cache_folder.CACHE_TAG).read_text().startswith(
        "Signature: 8a477f597d28d172789f06886806bc55\n")  # the standard tag's own, for backup tools too


def test_each_file_once_in_a_fixed_order_and_a_folder_named_is_read(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "build").mkdir()
    for name in ("b/z.py", "b/a.py", "top.py", "build/gen.py"):
        (tmp_path / name).write_text("")
    assert project_files(tmp_path, ["top.py", "b", ".", "build"], suffix=".py") == [
        Path("top.py"), Path("b/a.py"), Path("b/z.py"), Path("build/gen.py")]


@pytest.mark.parametrize(("path", "message"), [
    ("lib", "'lib' does not exist under {root}"),
    ("..", "'..' is outside the project's root {root}"),
])
def test_a_bad_path_is_named(tmp_path, path, message):
    with pytest.raises(SourcePathError) as raised:
        project_files(tmp_path, [path])
    assert str(raised.value) == message.format(root=tmp_path.resolve())


def test_the_digest_changes_with_a_files_content_or_name_and_not_with_where_the_project_is(tmp_path):
    def digest(root: Path) -> str:
        return files_digest(root, project_files(root))

    first, second = tmp_path / "one", tmp_path / "two"
    for root in (first, second):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "m.py").write_text("x = 1\n")
        (root / "data.csv").write_text("a,b\n")
    assert digest(first) == digest(second)
    (second / "data.csv").write_text("a,c\n")
    assert digest(first) != digest(second)
    (second / "data.csv").write_text("a,b\n")
    (second / "pkg" / "m.py").rename(second / "pkg" / "n.py")
    assert digest(first) != digest(second)
