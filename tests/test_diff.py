"""`nox -s diff -- OLD NEW`: what moved between two reports, and only what moved beyond noise."""

from __future__ import annotations

import pytest
from helpers.stack_records import report_on

from upgrade_gate.errors import ConfigError
from upgrade_gate.report import diff


def test_a_fixed_regression_shows_in_verdict_gates_and_metrics(project):
    old = report_on(project, "old", error=0.01, candidate_ms=1.0, size=1000, memory=100 * 2**20)
    new = report_on(project, "new", error=0.0, candidate_ms=3.0, size=1005, memory=104 * 2**20)
    text = diff.main([str(old), str(new / "results.json")])
    assert f"# upgrade-gate diff: {old} → {new}" in text
    assert "**Verdict: NO-GO → GO-WITH-CONDITIONS** (changed;" in text
    assert "- candidate: NO-GO → GO-WITH-CONDITIONS" in text
    assert "| candidate | vit-smoke | numerics | FAILED | passed | rel_l2 = 1.00e-02 | rel_l2 = 0.00e+00 |" in text
    assert "| candidate | vit-smoke | latency | passed | FAILED |" in text
    # Beyond noise: the numerics and the latency ratio; within it: 0.5% of size, 4 MiB of memory.
    assert "| vit-smoke | rel L2 of artifact(candidate) vs the reference | 0.01 | 0 | factor > 2 |" in text
    assert ("| vit-smoke | latency ratio candidate forward at 1 thread(s) | 0.500, 98.4% interval [0.500, 0.500] | "
            "1.500, 98.4% interval [1.500, 1.500] | intervals apart, and moved +200.0%: more than runs of an "
            "unchanged stack do (±9%) |") in text
    assert "artifact size" not in text and "runtime memory" not in text


def test_the_same_report_twice_has_no_changes(project):
    old = report_on(project, "old", error=0.01, candidate_ms=1.0, size=1000, memory=100 * 2**20)
    text = diff.main([str(old), str(old)])
    assert "**Verdict: NO-GO → NO-GO** (unchanged;" in text
    assert "## Gates that changed (0)\n\nNone." in text and "## Metrics beyond noise (0)\n\nNone." in text


def test_bad_arguments_name_the_file(project, tmp_path):
    with pytest.raises(ConfigError, match="give two report folders"):
        diff.main([str(tmp_path)])
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nowhere'}: no such report"):
        diff.main([str(tmp_path / "nowhere"), str(tmp_path / "nowhere")])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text("{")
    with pytest.raises(ConfigError, match=f"{broken / 'results.json'}: not a readable results.json"):
        diff.main([str(broken), str(broken)])


def test_a_move_within_what_reruns_scatter_by_is_not_beyond_noise(project):
    """Two re-measures of an unchanged model: narrow intervals that do not overlap, a 4% move
    (seen here: 0.628 → 0.603) — within the run-to-run scatter, so no change."""
    old = report_on(project, "old", error=0.0, candidate_ms=1.256, size=1000, memory=100 * 2**20)
    new = report_on(project, "new", error=0.0, candidate_ms=1.206, size=1000, memory=100 * 2**20)
    text = diff.main([str(old), str(new)])
    assert "## Metrics beyond noise (0)" in text
    assert "## Latency moves within run-to-run noise (2)" in text  # at 1 and 2 threads
    assert ("| vit-smoke | latency ratio candidate forward at 1 thread(s) | 0.628, 98.4% interval [0.628, 0.628] | "
            "0.603, 98.4% interval [0.603, 0.603] | intervals apart, but moved -4.0%: within what runs of an "
            "unchanged stack scatter by (±9%) |") in text


def test_relative_folders_are_from_where_the_command_ran(project):
    old = report_on(project, "old", error=0.01, candidate_ms=1.0, size=1000, memory=100 * 2**20)
    new = report_on(project, "new", error=0.0, candidate_ms=1.0, size=1000, memory=100 * 2**20)
    # nox runs the session in the noxfile's folder: the names are the user's, from the folder they ran it in.
    text = diff.main(["old", "new"], invoked_from=project)
    assert f"# upgrade-gate diff: {old} → {new}" in text
    with pytest.raises(ConfigError) as caught:
        diff.main(["nowhere", "new"], invoked_from=project)
    assert str(caught.value) == (f"{project / 'nowhere'}: no such report; pass report folders written by "
                                 "`nox -s compare`")
