from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.runs import QUICK_TIMING, make_project, nox, user_project

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
collect_ignore = ["sample_project"]  # a user project with its own tests, run inside the stacks
# The tiers other than unit, each marked where it is declared (pyproject.toml says what each costs).
COSTLY_TIERS = ("integration", "browser", "lint")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test not in a costlier tier is a unit test: `-m unit` is the fast tier, with no venv, browser or
    type checker, and a new test lands there unless it says otherwise.

    A test that needs the machine to itself is `alone`: one that reads real CPU accounting (`quiet`), and an
    integration test, whose runs time latency, unless it says its subject is something else
    (`shares_machine`). The README's test command runs the `alone` tests one at a time, then the others two
    at a time (pytest-xdist), so that no test's timing shares the cores with another test."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in COSTLY_TIERS):
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("quiet") or (item.get_closest_marker("integration")
                                                and not item.get_closest_marker("shares_machine")):
            item.add_marker(pytest.mark.alone)


@pytest.fixture(autouse=True)
def idle_machine_for_quiet_tests(request: pytest.FixtureRequest) -> None:
    """A `quiet` test reads real CPU accounting, which other work on the machine changes: it runs on an
    idle machine and is skipped, with the figure, on a busy one (a CI runner shared with other jobs)."""
    if not request.node.get_closest_marker("quiet"):
        return
    import os
    import time

    from upgrade_gate.measure import _contention

    before = _contention.snapshot([], os.getpid())
    time.sleep(0.5)
    load = _contention.load_between(before, _contention.snapshot([], os.getpid()), threads=1,
                                    cores=os.cpu_count() or 1)
    if load is not None and load.others_cores > QUIET_MACHINE_CORES:
        pytest.skip(f"the machine is busy (other processes kept {load.others_cores:.2f} cores busy over 0.5 s, more "
                    f"than {QUIET_MACHINE_CORES}); this test reads real CPU accounting and needs it idle")


# What other processes may keep busy for a `quiet` test to run: a stray tick, not a job.
QUIET_MACHINE_CORES = 0.3


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user project: a pyproject.toml and its own copy of the built-in stack specs, for tests to edit."""
    return make_project(tmp_path)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB file system: room for the records, not for the artifacts."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"needs root to mount a 2 MiB tmpfs, and this is not root ({mounted.stderr.strip()}): the "
                    "README's test command and .ci/run run as root, and there this test runs")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture(autouse=True)
def figures_in_the_browser_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test's report goes without the page's figures, as a report with nothing to plot does:
    matplotlib takes about 2 s per report, most of the unit tier's time. The browser tier draws every
    figure and checks each on the page, and tests/test_report.py draws each plot on its own."""
    if request.node.get_closest_marker("unit") and not request.node.get_closest_marker("figures"):
        from upgrade_gate.report import _figures

        monkeypatch.setattr(_figures, "drawing", lambda name, *args: lambda: None)


@pytest.fixture(scope="session")
def explained_run(tmp_path_factory):
    """The stages that explain a result, in one real compare: an unexportable model (its export failure
    localized), vit-smoke's float model (profiles, and export-only tries of the candidate's other backends;
    its int8-dynamic variant is the smoke run's), and
    planted-operator, whose artifact departs from its eager model (the culprit search: tests/test_diagnose.py),
    beside the same model without the wrong operator, and the int8-dynamic variant of a team's own model
    (declared in the project's pyproject), below its quantized gate until one layer stays in float (the
    layer-precision search), llama-smoke's int8-dynamic variant, whose lowering — not its quantization —
    departs (ExecuTorch 0.7's XNNPACK zeroes the KV cache: the operator search on the quantized program), a
    planted quantized variant that does not lower at all (the same search, from the lowering's error), and a
    planted fusion (a multiply and a ReLU, each right alone, wrong fused), a planted latency regression
    (batch norms after linear layers, which ExecuTorch 0.7's XNNPACK leaves to the portable kernel), and yolov8n's
    C2f block in int8, which the candidate lowers and does not load, and the baseline's FX cannot trace, and Llama's
    rotary angles in int8-dynamic, on whose nested no_grad and autocast regions the candidate's recipe raises."""
    folder = tmp_path_factory.mktemp("explained")
    out = folder / "report"
    (folder / "started").touch()  # when the run started: what it wrote elsewhere is newer (tests/test_diagnose.py)
    # The team's own model (tests/data/team_outlier.py), declared as a team declares one.
    shutil.copy(DATA / "team_outlier.py", folder / "team_outlier.py")
    team = '[tool.upgrade-gate.models.team-outlier]\nfactory = "team_outlier:outlier"\nvariants = ["int8-dynamic"]\n'
    models = ("data-dependent-branch,vit-smoke@fp32,planted-operator,planted-operator-removed,team-outlier@int8-dynamic,"
              "llama-quantized-smoke@int8-dynamic,planted-quantized-export@int8-dynamic,planted-fusion,planted-latency,"
              "planted-load@int8,planted-regions@int8-dynamic")
    result = nox("-s", "compare", "--", "--out", str(out), "--models", models, "--fresh",
                 env=user_project(folder, f"[tool.upgrade-gate]\n{QUICK_TIMING}{team}"))
    return out, result
