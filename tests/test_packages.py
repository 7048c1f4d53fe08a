"""What a venv has installed, which distribution an extra requirement names, and where venvs differ."""

from __future__ import annotations

from pathlib import Path

import pytest

from upgrade_gate.run.packages import installed_versions, requirement_names
from upgrade_gate.schema.project import differing


def venv_with(root: Path, *dist_infos: str) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    for name in dist_infos:
        (site / name).mkdir(parents=True)
    return root


def test_installed_versions_by_canonical_name(tmp_path):
    venv = venv_with(tmp_path / "venv", "torch-2.8.0.dist-info", "typing_extensions-4.12.2.dist-info",
                     "Jinja2-3.1.4.dist-info", "zope.interface-7.0.dist-info", "torch")
    assert installed_versions(venv) == {"jinja2": "3.1.4", "torch": "2.8.0", "typing-extensions": "4.12.2",
                                        "zope-interface": "7.0"}
    assert installed_versions(tmp_path / "nowhere") == {}


def test_only_packages_that_differ_are_listed_with_every_stacks_version():
    legacy = {"numpy": "1.26.4", "torch": "2.2.2", "filelock": "3.16.1"}
    candidate = {"numpy": "2.3.1", "torch": "2.8.0", "filelock": "3.16.1", "executorch": "0.7.0"}
    other = {"numpy": "2.3.1", "torch": "2.8.0", "filelock": "3.16.1", "executorch": "0.7.0"}
    assert differing({"legacy": legacy, "candidate": candidate, "other": other}) == {
        "executorch": {"legacy": None, "candidate": "0.7.0", "other": "0.7.0"},
        "numpy": {"legacy": "1.26.4", "candidate": "2.3.1", "other": "2.3.1"},
        "torch": {"legacy": "2.2.2", "candidate": "2.8.0", "other": "2.8.0"}}
    assert differing({"candidate": candidate, "other": other}) == {}


@pytest.fixture
def team(tmp_path: Path) -> Path:
    (tmp_path / "lib").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "Edge_App"\nversion = "0.3.0"\n')
    (tmp_path / "lib" / "pyproject.toml").write_text('[project]\nname = "edge-lib"\n')
    (tmp_path / "requirements.txt").write_text("# the team's pins\ntimm==1.0.9  # for the encoder\n-e lib\n\n"
                                               "--index-url https://example.org/simple\nsafetensors\n")
    return tmp_path


@pytest.mark.parametrize(("arguments", "expected"), [
    (["timm>=1.0", "onnx[reference]==1.17"], [("timm>=1.0", "timm"), ("onnx[reference]==1.17", "onnx")]),
    (["-e", "."], [("-e .", "edge-app")]),
    (["-e ."], [("-e .", "edge-app")]),  # as [tool.upgrade-gate.extra-requirements] holds it: one string
    (["--editable=lib", "-r  requirements.txt"], [("--editable lib", "edge-lib"), ("timm==1.0.9", "timm"),
                                                  ("-e lib", "edge-lib"), ("safetensors", "safetensors")]),
    (["--editable", "lib"], [("--editable lib", "edge-lib")]),
    (["."], [(".", "edge-app")]),
    (["dist/My_Pkg-1.0-py3-none-any.whl"], [("dist/My_Pkg-1.0-py3-none-any.whl", "my-pkg")]),
    (["name @ https://example.org/name-1.0.tar.gz"], [("name @ https://example.org/name-1.0.tar.gz", "name")]),
    (["-r", "requirements.txt"], [("timm==1.0.9", "timm"), ("-e lib", "edge-lib"), ("safetensors", "safetensors")]),
    (["-c", "constraints.txt", "--index-url", "https://example.org/simple", "--no-build-isolation", "timm"],
     [("timm", "timm")]),
    (["-r", "missing.txt"], [("-r missing.txt", None)]),
    (["https://example.org/archive.zip?x=1"], [("https://example.org/archive.zip?x=1", None)]),
])
def test_each_extra_requirement_names_the_distribution_it_installs(team, arguments, expected):
    assert requirement_names(arguments, team) == expected
