"""`nox -s releases` end to end: real release stacks built from the table, the smoke models
exported, run and timed in each against the real baseline, and the upgrade-path report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from readers import verdict_of

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration
# Three releases, two torch builds (0.7.0 shares the built-in candidate's; 1.0.0 and 1.0.1 pair with 2.9.0).
FIRST, LAST = "0.7.0", "1.0.1"
MODELS = "vit-smoke,nanovlm-smoke"


def nox(*args: str, config: Path, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nox", "--noxfile", str(REPO / "noxfile.py"), "--no-color", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "UPGRADE_GATE_CONFIG": str(config)})


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("releases")
    path = folder / "pyproject.toml"
    # fp32 only and a quarter of the timing budget: three stacks' worth of exports within the test budget.
    path.write_text(f'[tool.upgrade-gate]\nenvs = "{REPO / "envs"}"\nsuite = "smoke"\nvariants = []\n'
                    "time-budget = 0.5\n")
    return path


@pytest.fixture(scope="module")
def explored(config):
    out = config.parent / "report"
    result = nox("-s", "releases", "--", "--from", FIRST, "--to", LAST, "--models", MODELS, "--out", str(out),
                 config=config)
    return out, result, json.loads((out / "upgrade-path.json").read_text())


def test_three_releases_are_built_compared_and_judged(explored):
    out, result, path = explored
    assert [r["name"] for r in path["releases"]] == ["executorch-0.7.0", "executorch-1.0.0", "executorch-1.0.1"]
    for record in path["releases"]:
        assert record["status"] == "judged", record
        folder = out / "releases" / record["name"]
        verdict = verdict_of(folder)
        # The release's own report: an ordinary comparison with the baseline, its verdict the release's.
        assert list(verdict.candidates) == [record["name"]] and verdict.baseline == "legacy"
        assert record["verdict"] == verdict.candidates[record["name"]].value
        stack = json.loads((folder / "stacks" / record["name"] / "stack.json").read_text())
        torch = {"executorch-0.7.0": "2.8.0"}.get(record["name"], "2.9.0")
        assert stack["packages"]["torch"].startswith(torch) and stack["packages"]["executorch"] == record["release"][
            "executorch"]
    # The stacks no longer needed are gone.
    assert not (out / ".venvs").exists()


def test_every_release_shows_each_model_with_its_evidence(explored):
    out, _, path = explored
    rows = {(row["release"], row["model"]): row["cells"] for row in path["rows"]}
    assert len(rows) == 3 * 2
    for (release, model), cells in rows.items():
        assert cells["export"]["text"] == "ok", (release, model, cells["export"])
        size = cells["artifact size"]["measured"]
        assert size["unit"] == "bytes" and size["value"] > 1000
        latency = cells["latency ratio, 1 thread"]
        if latency["measured"] is not None:  # judged; a busy machine would make it incomplete, which says so
            measured = latency["measured"]
            assert measured["low"] <= measured["value"] <= measured["high"] and measured["level"] >= 0.95
        else:
            assert latency["status"] == "incomplete", latency
    # vit-smoke's artifacts agree with the baseline's eager outputs in every release.
    for release in ("executorch-0.7.0", "executorch-1.0.0", "executorch-1.0.1"):
        assert rows[(release, "vit-smoke")]["numerics vs the baseline's eager"]["status"] == "passed"


def test_the_tanh_gelu_finding_is_followed_across_releases(explored):
    out, result, path = explored
    finding = next(f for f in path["findings"] if f["gate"] == "numerics" and f["model"] == "nanovlm-smoke")
    # XNNPACK computes the tanh-approximated GELU as the exact one in every release here.
    assert finding["failing"] == ["executorch-0.7.0", "executorch-1.0.0", "executorch-1.0.1"]
    assert finding["appeared_after"] is None and finding["gone_in"] is None
    # A hard failure in every release: none to recommend, and nox says so with exit status 1.
    assert path["recommendation"] is None and path["recommendation_text"].startswith("**none in range**")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Recommendation: none in range" in result.stdout + result.stderr
    page = (out / "upgrade-path.html").read_text()
    markdown = (out / "upgrade-path.md").read_text()
    for text in ("executorch-1.0.1", "numerics", "nanovlm-smoke", "none in range"):
        assert text in page and text in markdown


def test_a_bisection_builds_the_ends_and_says_nothing_changed(explored, config):
    out = explored[0]
    result = nox("-s", "releases", "--", "--from", FIRST, "--to", LAST, "--models", MODELS, "--out", str(out),
                 "--bisect", "numerics:nanovlm-smoke", config=config)
    path = json.loads((out / "upgrade-path.json").read_text())
    bisection = path["bisection"]
    assert bisection["built"] == ["executorch-0.7.0", "executorch-1.0.1"], bisection
    assert "fails at both ends" in bisection["answer"] and bisection["monotone"]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_releases_that_cannot_be_built_are_rows_that_say_why(tmp_path, config):
    shipped = (REPO / "envs" / "releases" / "executorch.toml").read_text()
    table = tmp_path / "table.toml"
    table.write_text(shipped.split("[[releases]]")[0] + '''
[[releases]]
executorch = "0.3.0"
torch = "2.4.0"
torchvision = "0.19.0"
pythons = ["3.11"]
source = "pyproject"

[[releases]]
executorch = "1.9.0"
torch = "2.15.0"
torchvision = "0.30.0"
pythons = ["3.11"]
source = "a release the index does not have"
''')
    out = tmp_path / "report"
    result = nox("-s", "releases", "--", "--table", str(table), "--models", "vit-smoke", "--out", str(out),
                 config=config, timeout=900)
    path = json.loads((out / "upgrade-path.json").read_text())
    old, missing = path["releases"]
    # Nothing is built for a release whose export API no adapter covers; uv's own words for one it cannot install.
    assert old["status"] == "not covered" and "to_edge_transform_and_lower" in old["reason"]
    assert missing["status"] == "not installed" and "executorch==1.9.0" in missing["reason"]
    assert not (out / "releases" / "executorch-0.3.0" / "stacks").exists()
    # No release could be judged: the tool could not decide (3), which is not a NO-GO (1).
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
