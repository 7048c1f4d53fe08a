from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers.runs import busy_run_shows
from helpers.signs import miss_over_every_sign_sequence
from helpers.stack_records import add_round_loads, add_task, write_remedied, write_stack_model

from upgrade_gate import layout, pipeline
from upgrade_gate._atomic import to_json
from upgrade_gate.config.plan import load_plan
from upgrade_gate.errors import RecordError
from upgrade_gate.judge.gather import gather
from upgrade_gate.judge.policy import decide, evaluate, headline, with_remedied_verdicts, with_remedies
from upgrade_gate.report._verdict_section import verdict_blocks
from upgrade_gate.report.render import Bullets, to_markdown
from upgrade_gate.report.write import report_blocks
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.records import runtime_key
from upgrade_gate.schema.verdict import (
    GateResult,
    GateStatus,
    Quantity,
    Remedy,
    Severity,
    Unit,
    Verdict,
    VerdictRecord,
    WithRemedies,
)

REFERENCE = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(1, 64)


def counted(found: WithRemedies | None) -> tuple[Verdict, int] | None:
    """A remedied verdict and how many remedies make it."""
    return None if found is None else (found.verdict, found.remedies)


def remedied(record: VerdictRecord) -> tuple[Verdict, int] | None:
    """The candidate's remedied verdict as verdict.json keeps it."""
    return counted(record.with_remedies.get("candidate"))


def gate(severity: str, passed: bool) -> GateResult:
    return GateResult(gate="g", stack="candidate", model="m", severity=Severity(severity),
                      status=GateStatus.PASSED if passed else GateStatus.FAILED, metric="m")


@pytest.mark.parametrize(
    ("gates", "verdict"),
    [
        ([], Verdict.GO),
        ([gate("hard", True), gate("soft", True)], Verdict.GO),
        ([gate("hard", True), gate("soft", False)], Verdict.GO_WITH_CONDITIONS),
        ([gate("hard", False), gate("soft", True)], Verdict.NO_GO),
        ([gate("hard", False), gate("soft", False)], Verdict.NO_GO),
    ],
)
def test_decision_table(gates, verdict):
    assert decide(gates) is verdict


@pytest.fixture
def plan(project: Path):
    return load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project, config_path=project / "pyproject.toml")


def results_by_gate(plan) -> tuple[dict[str, GateResult], Verdict]:
    verdict = evaluate(plan, gather(plan))
    assert verdict.candidates == {"candidate": verdict.verdict}
    return {g.gate: g for g in verdict.gates}, verdict.verdict


def write_pair(out: Path, *, candidate_artifact, legacy_ms=10.0, candidate_ms=10.0, **candidate):
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=legacy_ms)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=candidate_artifact,
                      latency_ms=candidate_ms, **candidate)


def test_all_gates_pass(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE + 1e-7], candidate_ms=9.0)
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.GO
    assert sorted(gates) == ["artifact-size", "export", "latency", "memory", "numerics", "same-inputs"]
    assert all(g.status is GateStatus.PASSED for g in gates.values())
    latency = gates["latency"]
    assert latency.measured == Quantity(value=pytest.approx(0.9), unit=Unit.RATIO, low=pytest.approx(0.9),
                                        high=pytest.approx(0.9), level=pytest.approx(1 - 2 / 2**7))
    # Seven rounds (the records here): [min, max], which covers the median 98.4% of the time, and says so; the
    # gate judged two (1 and 2 threads), which hold their ratios together at least 96.9% of the time.
    assert latency.note == "1 thread(s): 9.000 ms / 10.000 ms; the gate's 2 intervals together: at least 96.9%"
    assert latency.measured_text == ("ratio = 0.900, 98.4% interval [0.900, 0.900] (1 thread(s): 9.000 ms / "
                                     "10.000 ms; the gate's 2 intervals together: at least 96.9%)")
    assert gates["numerics"].evidence == "artifact(candidate) vs eager(legacy)"


def test_slower_candidate_is_a_condition_not_a_stop(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], candidate_ms=10.6)
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.GO_WITH_CONDITIONS
    latency = gates["latency"]
    assert latency.status is GateStatus.FAILED and latency.severity is Severity.SOFT
    assert (latency.op, latency.threshold) == ("≤", Quantity(value=1.05, unit=Unit.RATIO))
    assert latency.threshold_text == ("ratio ≤ 1.050, the median's whole interval, per thread count and method, the "
                                      "gate's intervals at least 95% together; methods at most 0.05 ms slower at its "
                                      "top pass")


def test_a_few_microseconds_slower_is_not_judged_by_ratio(plan):
    # 8 µs against 11 µs is a ratio of 1.4 that timer and call overhead make.
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], legacy_ms=0.008, candidate_ms=0.011)
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.GO and gates["latency"].status is GateStatus.PASSED
    assert gates["latency"].measured.value == pytest.approx(1.375)
    assert gates["latency"].note == "1 thread(s): 0.011 ms / 0.008 ms; the gate's 2 intervals together: at least 96.9%"


def test_numerics_beyond_tolerance_is_no_go(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE * 1.001])
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.NO_GO
    numerics = gates["numerics"]
    assert numerics.status is GateStatus.FAILED
    assert numerics.measured.unit is Unit.REL_L2 and numerics.measured.value == pytest.approx(1e-3, rel=1e-4)
    assert numerics.threshold == Quantity(value=1e-4, unit=Unit.REL_L2)
    assert numerics.measured_text == "rel_l2 = 1.00e-03" and numerics.threshold_text == "rel_l2 ≤ 1.00e-04"


def test_nan_in_the_artifact_fails_numerics(plan):
    broken = REFERENCE.copy()
    broken[0, 3] = np.nan
    write_pair(plan.settings.out_dir, candidate_artifact=[broken])
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.NO_GO
    assert gates["numerics"].measured is None
    assert gates["numerics"].note == "forward.output_0: NaN or Inf in the outputs"


def test_nan_in_the_reference_is_the_models_not_the_candidates(plan):
    # The inputs give NaN in the baseline's eager output, and so in every artifact: the same NaN.
    nan_out = REFERENCE.copy()
    nan_out[0, 3] = np.nan
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[nan_out], artifact=[nan_out])
    write_stack_model(out, "candidate", "vit-smoke", eager=[nan_out], artifact=[nan_out])
    judged = evaluate(plan, gather(plan))
    gates = {g.gate: g for g in judged.gates}
    assert judged.verdict is Verdict.INCOMPLETE and judged.verdict.exit_code == 3  # never GO, never NO-GO
    assert gates["numerics"].status is GateStatus.INCOMPLETE and gates["numerics"].measured is None
    note = ("the reference output is not finite (eager(legacy): forward.output_0): the model or its inputs give NaN "
            "or Inf — fix them; no artifact can be judged against it")
    assert gates["numerics"].note == note
    assert {g.gate: g.status for g in judged.gates if g.gate != "numerics"} == {
        "same-inputs": GateStatus.PASSED, "export": GateStatus.PASSED, "artifact-size": GateStatus.PASSED,
        "latency": GateStatus.PASSED, "memory": GateStatus.PASSED}
    # Running again would give the same NaN: the verdict says what to fix, not to resume.
    assert judged.incomplete == (f"vit-smoke: {note}",)
    # The baseline's own artifact is not called a bug in what ships today for it either.
    assert judged.baseline_findings == ()


def test_a_failed_export_is_one_root_cause_and_blocks_what_needed_it(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=None, failed_stage="export")
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.NO_GO
    assert gates["export"].status is GateStatus.FAILED
    assert gates["export"].measured_text == "export failed: RuntimeError: export broke"
    # The gates that needed the export's evidence are listed, blocked by it, and not counted again.
    for name in ("artifact-size", "numerics", "latency", "memory"):
        gate = gates[name]
        assert (gate.status, gate.blocked_by, gate.measured) == (GateStatus.BLOCKED, "export", None), gate
        assert gate.note == "blocked by export (export failed: RuntimeError: export broke)"
    assert gates["same-inputs"].status is GateStatus.PASSED
    verdict_record = evaluate(plan, gather(plan))
    assert [(g.gate, g.status) for g in verdict_record.gates if g.status is GateStatus.FAILED] == [
        ("export", GateStatus.FAILED)]


def test_a_baseline_that_fails_makes_its_comparisons_not_comparable_and_is_a_finding(plan):
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=None, failed_stage="export")
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE + 1e-7])
    verdict = evaluate(plan, gather(plan))
    gates = {g.gate: g for g in verdict.gates}
    # Not the candidate's failure: the verdict does not drop.
    assert verdict.verdict is Verdict.GO
    for name in ("latency", "memory"):
        assert gates[name].status is GateStatus.NOT_COMPARABLE, gates[name]
        assert gates[name].note == "nothing to compare with: legacy's export failed: RuntimeError: export broke"
    # What the candidate shows on its own is still judged: the reference (legacy's eager) is there.
    assert gates["export"].status is GateStatus.PASSED and gates["numerics"].status is GateStatus.PASSED
    finding, = verdict.baseline_findings
    assert (finding.model, finding.failure) == ("vit-smoke", "export failed: RuntimeError: export broke")


def test_without_a_reference_the_candidate_is_judged_against_its_own_eager_model(plan):
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=None, artifact=None, failed_stage="build")
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE * 1.01])
    gates = {g.gate: g for g in evaluate(plan, gather(plan)).gates}
    numerics = gates["numerics"]
    assert numerics.status is GateStatus.FAILED and numerics.evidence == "artifact(candidate) vs eager(candidate)"
    assert numerics.note == "against its own eager model: nothing to compare with: legacy's build failed: RuntimeError: build broke"
    assert gates["same-inputs"].status is GateStatus.NOT_COMPARABLE


def test_an_interrupted_export_is_incomplete_not_a_failure(plan):
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE])
    # A Ctrl-C while the candidate exported: the runner records the stage interrupted.
    phase = layout.model_dir(out, "candidate", "vit-smoke") / "export.json"
    data = json.loads(phase.read_text())
    data["stages"][2].update(status="interrupted", error={"type": "interrupted", "message": "the run was interrupted",
                                                          "traceback_tail": []})
    phase.write_text(json.dumps(data))
    verdict = evaluate(plan, gather(plan))
    gates = {g.gate: g for g in verdict.gates}
    assert verdict.verdict is Verdict.INCOMPLETE and verdict.verdict.exit_code == 3
    assert gates["export"].status is GateStatus.INCOMPLETE
    assert gates["export"].note == "candidate: export interrupted: the run was interrupted"
    assert verdict.incomplete == ("vit-smoke: candidate: export interrupted: the run was interrupted",
                                  "run `nox -s compare` again with the same options: it reuses what finished and "
                                  "redoes the rest")


@pytest.mark.parametrize(("status", "message", "gate_status", "verdict"), [
    # kill -9 from outside, no out-of-memory kill counted: the machine's, not the candidate's.
    ("killed", "worker killed by signal SIGKILL from outside (not by upgrade-gate, and the kernel counted no "
     "out-of-memory kill; peak resident memory 0.50 GiB)", GateStatus.INCOMPLETE, Verdict.INCOMPLETE),
    # The kernel's out-of-memory killer: the export's memory, the candidate's finding.
    ("out-of-memory", "stage export: worker killed by the kernel's out-of-memory killer (SIGKILL; it counted 1 "
     "out-of-memory kill(s) while the worker ran; peak resident memory 5.50 GiB)", GateStatus.FAILED, Verdict.NO_GO),
])
def test_an_export_killed_from_outside_is_charged_by_who_killed_it(plan, status, message, gate_status, verdict):
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE])
    phase = layout.model_dir(out, "candidate", "vit-smoke") / "export.json"
    data = json.loads(phase.read_text())
    data["stages"][2].update(status=status, error={"type": status, "message": message, "traceback_tail": []})
    phase.write_text(json.dumps(data))
    judged = evaluate(plan, gather(plan))
    gates = {g.gate: g for g in judged.gates}
    assert judged.verdict is verdict
    assert gates["export"].status is gate_status
    assert gates["export"].note.endswith(f"export {status}: {message}"), gates["export"].note


@pytest.mark.parametrize(("statuses", "verdict"), [
    ((("hard", GateStatus.INCOMPLETE), ("soft", GateStatus.FAILED)), Verdict.INCOMPLETE),
    ((("hard", GateStatus.FAILED), ("soft", GateStatus.INCOMPLETE)), Verdict.NO_GO),
    ((("soft", GateStatus.INCOMPLETE),), Verdict.INCOMPLETE),
    ((("hard", GateStatus.BLOCKED), ("hard", GateStatus.NOT_COMPARABLE), ("soft", GateStatus.INCONCLUSIVE)),
     Verdict.GO),
])
def test_incomplete_evidence_is_no_verdict_unless_a_hard_failure_decides(statuses, verdict):
    gates = [GateResult(gate="g", stack="candidate", model="m", severity=Severity(severity), status=status, metric="m")
             for severity, status in statuses]
    assert decide(gates) is verdict


def test_oversized_artifact(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], artifact_bytes=1_500_000_001)
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.NO_GO
    assert gates["artifact-size"].measured == Quantity(value=1_500_000_001, unit=Unit.BYTES)
    assert gates["artifact-size"].measured_text == "size = 1.40 GiB (1,500,000,001 B)"


def test_different_weights_are_caught(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE],
               hashes={"weights_sha256": "f" * 64, "inputs_sha256": "b" * 64})
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.NO_GO and gates["same-inputs"].status is GateStatus.FAILED


def test_budgets(project):
    (project / "pyproject.toml").write_text(
        ''
        "[tool.upgrade-gate.gates.budgets.vit-smoke]\nlatency-p50-ms = 8\npeak-rss-mb = 400\nseverity = \"soft\"\n"
    )
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project, config_path=project / "pyproject.toml")
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], candidate_ms=9.0,
               runtime_memory=300 * 2**20)
    gates, verdict = results_by_gate(plan)
    assert verdict is Verdict.GO_WITH_CONDITIONS
    assert gates["budget-latency"].status is GateStatus.FAILED
    assert gates["budget-latency"].measured == Quantity(value=pytest.approx(9.0), unit=Unit.MS)
    assert gates["budget-memory"].status is GateStatus.PASSED
    assert gates["budget-memory"].measured == Quantity(value=300.0, unit=Unit.MIB)
    # 300 MiB against the baseline's 100: three times the memory, 200 MiB more.
    assert gates["memory"].status is GateStatus.FAILED and gates["memory"].measured.value == 3.0
    assert gates["memory"].measured_text == "memory ratio = 3.000 (300.0 MiB / 100.0 MiB)"


def test_gate_turned_off_is_not_reported(project):
    (project / "pyproject.toml").write_text(
        '[tool.upgrade-gate.gates]\nlatency = { severity = "off" }\n'
    )
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project, config_path=project / "pyproject.toml")
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], candidate_ms=50.0)
    gates, verdict = results_by_gate(plan)
    assert "latency" not in gates and verdict is Verdict.GO


def test_memory_within_min_delta_passes_whatever_the_ratio(plan):
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], runtime_memory=110 * 2**20)
    gates, _ = results_by_gate(plan)
    assert gates["memory"].status is GateStatus.PASSED
    assert gates["memory"].measured.value == pytest.approx(1.1) and gates["memory"].note == "110.0 MiB / 100.0 MiB"


def noisy_rounds(ratio: float, spread: list[float]) -> list[list[float]]:
    """Seven rounds whose candidate/baseline medians are ``ratio`` times each factor of ``spread``."""
    return [[10.0 * ratio * factor] * 8 for factor in spread]


@pytest.mark.parametrize(("spread", "status", "verdict"), [
    # Every round 20% slower: the interval lies wholly above 1.05.
    ([1.18, 1.2, 1.2, 1.21, 1.22, 1.19, 1.2], GateStatus.FAILED, Verdict.GO_WITH_CONDITIONS),
    # Rounds from 0.95 to 1.15: the interval straddles 1.05.
    ([0.95, 1.0, 1.15, 1.08, 1.02, 1.12, 0.97], GateStatus.INCONCLUSIVE, Verdict.GO),
    ([0.97, 1.0, 1.01, 0.99, 1.02, 0.98, 1.0], GateStatus.PASSED, Verdict.GO),
])
def test_latency_gate_judges_the_interval(plan, spread, status, verdict):
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=10.0)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=noisy_rounds(1.0, spread))
    gates, overall = results_by_gate(plan)
    assert gates["latency"].status is status and overall is verdict


def device_rounds(out: Path, candidate: list[list[float]], *, failed: str = "", stale: bool = False,
                  disturbed: frozenset[int] = frozenset(), more: tuple[dict, ...] = ()) -> None:
    """A device's rounds of vit-smoke read into the report folder, as `device-results` keeps them: the baseline at
    10 ms a call, the candidate's rounds as given; ``failed``: the candidate's last round gave none; ``disturbed``:
    the rounds a target timed over ssh found busy; ``more``: lines only such a target's file has."""
    lines = [{"record": "bundle", "manifest_sha256": "ab" * 32, "format": 1, "rounds": len(candidate)},
             {"record": "target", "name": "device:Pixel 8", "cpu": "Tensor G3", "architecture": "aarch64", "cores": 9,
              "isa": ["asimd", "asimddp", "i8mm"], "runner": "adb"}]
    for number, samples in enumerate(candidate, start=1):
        for stack, ms in (("legacy", [10.0] * len(samples)), ("candidate", samples)):
            if failed and stack == "candidate" and number == len(candidate):
                lines.append({"record": "failed", "model": "vit-smoke", "stack": stack, "threads": 1, "round": number,
                              "error": failed})
                continue
            lines.append({"record": "round", "model": "vit-smoke", "stack": stack, "threads": 1, "round": number,
                          "samples_ms": {"forward": ms}, "disturbed": number in disturbed})
    lines += more
    text = "".join(json.dumps(line) + "\n" for line in lines)
    text += json.dumps({"record": "end", "sha256": hashlib.sha256(text.encode()).hexdigest()}) + "\n"
    kept = layout.device_results_file(out, "device:Pixel 8")
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)
    keys = {stack: runtime_key(out, stack, "vit-smoke") for stack in ("legacy", "candidate")}
    if stale:
        keys["candidate"] = "an earlier export's"
    layout.device_manifest_file(kept).write_text(json.dumps({"models": {"vit-smoke": {
        "methods": ["forward"], "threads": [1], "stacks": {s: {"runtime_key": k} for s, k in keys.items()}}}}))


@pytest.mark.parametrize(("candidate", "failed", "stale", "status", "said"), [
    # Every round 20% slower on the phone, whatever the host said: wholly over 1.05.
    (noisy_rounds(1.2, [1.0, 0.99, 1.01, 1.0, 1.02, 0.98, 1.0]), "", False, GateStatus.FAILED,
     "device:Pixel 8, 1 thread(s): 12.000 ms / 10.000 ms over 7 rounds (Tensor G3, aarch64, 9 cores; ISA asimd"),
    (noisy_rounds(1.0, [0.95, 1.0, 1.15, 1.08, 1.02, 1.12, 0.97]), "", False, GateStatus.INCONCLUSIVE,
     "the interval straddles 1.05"),
    (noisy_rounds(0.5, [1.0, 0.99, 1.01, 1.0, 1.02, 0.98, 1.0]), "", False, GateStatus.PASSED, "5.000 ms / 10.000 ms"),
    # The device could not give a round: not the candidate's failure — the device or its setup may be at fault.
    (noisy_rounds(1.2, [1.0] * 7), "Killed", False, GateStatus.INCOMPLETE, "candidate, round 7: Killed"),
    # Rounds of artifacts the report no longer judges: never a ratio of these.
    (noisy_rounds(1.2, [1.0] * 7), "", True, GateStatus.INCOMPLETE, "candidate's artifacts of an earlier export"),
])
def test_a_devices_rounds_are_judged_by_the_latency_gates_rule(plan, candidate, failed, stale, status, said):
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE])  # on the host: the same latency
    device_rounds(out, candidate, failed=failed, stale=stale)
    gates, _ = results_by_gate(plan)
    assert gates["latency"].status is GateStatus.PASSED
    device = gates["device-latency"]
    assert device.status is status and said in device.note, device.note
    assert device.severity is gates["latency"].severity and device.threshold == gates["latency"].threshold
    assert "no contention check on the device" in device.evidence


def server_line(stack: str, peak_mib: float | None) -> dict:
    return {"record": "server", "model": "vit-smoke", "stack": stack, "threads": 1, "load_ms": 20.0,
            "first_ms": {"forward": 5.0}, "idle_rss_bytes": 100 << 20, "after_first_run_rss_bytes": 150 << 20,
            "peak_rss_bytes": None if peak_mib is None else int((100 + peak_mib) * 2**20)}


@pytest.mark.parametrize(("candidate_mib", "status", "said"), [
    (300.0, GateStatus.FAILED, "device:Pixel 8, 1 thread(s): 300.0 MiB / 100.0 MiB"),
    (105.0, GateStatus.PASSED, "105.0 MiB / 100.0 MiB"),
    (None, GateStatus.INCOMPLETE, "gave no peak"),
])
def test_a_target_timed_over_ssh_is_judged_as_the_host_is(plan, candidate_mib, status, said):
    """Issue 41, item 2: a target's rounds timed from here leave out the rounds its own accounting found busy (here
    ×3, which would fail the gate), say they ran with the stop rule and contention check, judge each interval by
    the sequential design they stopped with, and judge the target's memory by the memory gate's rule."""
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE])
    busy = noisy_rounds(3.0, [1.0, 1.0])
    device_rounds(out, noisy_rounds(1.0, [0.99, 1.0, 1.01, 1.0, 0.98, 1.0, 1.02]) + busy, disturbed=frozenset({8, 9}),
                  more=({"record": "rounds", "model": "vit-smoke", "threads": 1, "ended": "planned", "stop_early": True,
                         "tried": 9, "counted": 7}, server_line("legacy", 100.0), server_line("candidate", candidate_mib)))
    gates, _ = results_by_gate(plan)
    device = gates["device-latency"]
    assert device.status is GateStatus.PASSED, device.note
    assert "over 7 rounds (2 more left out, the target busy)" in device.note
    assert "the stop rule, the contention check" in device.evidence
    assert device.measured is not None and device.measured.value == pytest.approx(1.0, abs=0.02)
    memory = gates["device-memory"]
    assert memory.status is status and said in memory.note, memory.note
    assert memory.severity is gates["memory"].severity
    assert "device-budget-latency" not in gates  # no budget for the model: none judged anywhere
    pipeline.report(plan)  # the page: a column per target in the latency table, a row of memory and cold start
    report = (out / "report.md").read_text()
    assert "| candidate/legacy on device:Pixel 8, 1t |" in report and "| 1.000 [" in report
    assert "| Runtime memory and cold start on device:Pixel 8 (where) |" in report
    assert "cold start up to 25 ms against 25 ms (vit-smoke)" in report
    assert "timed from here over ssh" in report


@pytest.mark.parametrize(("budgets", "latency", "memory"), [
    # The team's budget is the phone's: 10 ms passes on the target (its p50 there is 10 ms), 250 MiB of 300 fails.
    ("latency-p50-ms = 10\npeak-rss-mb = 250\n", GateStatus.PASSED, GateStatus.FAILED),
    ("latency-p50-ms = 9\npeak-rss-mb = 400\n", GateStatus.FAILED, GateStatus.PASSED),
])
def test_a_models_budget_is_judged_on_each_target(project, budgets, latency, memory):
    (project / "pyproject.toml").write_text(f"[tool.upgrade-gate.gates.budgets.vit-smoke]\n{budgets}")
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE], candidate_ms=5.0)  # the host is fast: within every budget
    device_rounds(out, noisy_rounds(1.0, [1.0] * 7), more=(
        {"record": "rounds", "model": "vit-smoke", "threads": 1, "ended": "planned", "stop_early": True, "tried": 7,
         "counted": 7}, server_line("legacy", 280.0), server_line("candidate", 300.0)))
    gates, _ = results_by_gate(plan)
    assert gates["budget-latency"].status is GateStatus.PASSED
    assert gates["device-budget-latency"].status is latency
    assert gates["device-budget-latency"].measured.value == pytest.approx(10.0)
    assert gates["device-budget-latency"].note == "on device:Pixel 8"
    assert gates["device-budget-memory"].status is memory
    assert gates["device-budget-memory"].measured.value == pytest.approx(300.0)


def test_a_model_the_bundle_could_not_hold_is_incomplete_on_the_device_never_left_out(plan):
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE])
    device_rounds(out, noisy_rounds(1.0, [1.0] * 7))
    kept = layout.device_results_file(out, "device:Pixel 8")
    layout.device_manifest_file(kept).write_text(json.dumps({"models": {}, "not_bundled": {
        "vit-smoke": "candidate: ValueError: no device runtime for .xyz artifacts"}}))
    gates, _ = results_by_gate(plan)
    device = gates["device-latency"]
    assert device.status is GateStatus.INCOMPLETE
    assert "device:Pixel 8, 1 thread(s), every method: not in the bundle: candidate: ValueError" in device.note


@pytest.mark.parametrize(("remedied_ms", "status", "said"), [
    # Every round ×1.31 the baseline's: wholly over 1.05, a failure.
    (noisy_rounds(1.31, [1.0, 0.99, 1.01, 1.0, 1.02, 0.98, 1.0]), GateStatus.FAILED, "ratio = 1.310"),
    # Rounds from 0.95 to 1.15: the interval straddles 1.05.
    (noisy_rounds(1.0, [0.95, 1.0, 1.15, 1.08, 1.02, 1.12, 0.97]), GateStatus.INCONCLUSIVE, "straddles 1.05"),
    # The same rounds on a 0.01 ms call: at most 0.05 ms slower at the interval's top, so it passes.
    ([[v / 1000 for v in r] for r in noisy_rounds(1.0, [0.95, 1.0, 1.15, 1.08, 1.02, 1.12, 0.97])],
     GateStatus.PASSED, "ratio = "),
    # Not timed: incomplete, never judged on the shipped candidate's figures.
    (None, GateStatus.INCOMPLETE, "the remedied artifacts were not timed in the measure session"),
])
def test_a_remedys_latency_is_the_latency_gate_on_the_candidate_timed_with_it(plan, remedied_ms, status, said):
    """Issue 39, item 4: the candidate with its remedy, timed in the measure session's rounds against the baseline,
    judged by the latency gate's own code — every thread count, min-delta-ms, "inconclusive" when it straddles;
    the shipped candidate's own latency (it passes here) decides nothing about the remedy's."""
    out = plan.settings.out_dir
    legacy_ms = 10.0 if remedied_ms is None or remedied_ms[0][0] > 1 else 0.01
    write_pair(out, candidate_artifact=[REFERENCE + 0.5], legacy_ms=legacy_ms, candidate_ms=legacy_ms)
    write_remedied(out, "candidate", "vit-smoke", remedy_outputs=[REFERENCE], latency_ms=remedied_ms,
                   threads=plan.settings.threads)
    record = evaluate(plan, gather(plan))
    gates = {g.gate: g for g in record.gates}
    assert gates["numerics"].status is GateStatus.FAILED and gates["latency"].status is GateStatus.PASSED
    (remedy,) = record.remedies
    assert remedy.latency_gate is not None and remedy.latency_gate.status is status
    assert remedy.latency_gate.gate == "latency" and remedy.latency_gate.stack == "candidate+remedy"
    assert said in remedy.latency_gate.measured_text
    # The latency gate is soft here: the remedy passes the numerics gate it answers, its latency a condition.
    assert remedy.passes
    if status is GateStatus.PASSED:
        assert remedy.conditions == () and remedied(record) == (Verdict.GO, 1)
    else:
        assert remedy.conditions == (f"the latency gate with the remedy: {status.value} "
                                     f"({remedy.latency_gate.measured_against_rule})",)
        assert remedied(record) == (Verdict.GO_WITH_CONDITIONS, 1)
        # verdict.json keeps it whole: what the remedy clears, and its cost as the condition.
        assert record.with_remedies["candidate"].clears == ("numerics (vit-smoke)",)
        assert record.with_remedies["candidate"].conditions == remedy.conditions


def test_a_remedy_over_a_hard_latency_gate_does_not_pass(project: Path):
    """Where the latency gate is hard, a remedy the gate fails on is no remedy: the headline claims nothing."""
    with open(project / "pyproject.toml", "a") as config:
        config.write('\n[tool.upgrade-gate.gates.latency]\nseverity = "hard"\n')
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE + 0.5])
    write_remedied(out, "candidate", "vit-smoke", remedy_outputs=[REFERENCE], threads=plan.settings.threads,
                   latency_ms=noisy_rounds(1.31, [1.0, 0.99, 1.01, 1.0, 1.02, 0.98, 1.0]))
    record = evaluate(plan, gather(plan))
    (remedy,) = record.remedies
    assert not remedy.passes and remedy.note.startswith("the latency gate with the remedy: failed (ratio = 1.310")
    assert remedied(record) is None and record.with_remedies == {}


@pytest.mark.parametrize(("remedy_tokens", "passes", "note"), [
    # The loop run with the remedy decodes the reference's tokens: the task gate passes with it, so the remedy does.
    ([[1, 2, 3, 4], [5, 6, 7, 1]], True, ""),
    # It diverges from the second step of one prompt: token agreement 5/8 under the hard task gate's 0.9.
    ([[1, 2, 3, 4], [5, 2, 2, 2]], False, "the task-generation gate with the remedy: failed (token agreement = "
                                          "0.625 (1/2 prompts identical, first divergence [None, 1]"),
    # The loop did not run with the remedy: nothing judged, nothing claimed.
    (None, False, "the task-generation gate with the remedy: failed (the remedy's loop did not run"),
])
def test_a_generators_remedy_is_judged_by_its_loop_run_with_the_remedy(plan, remedy_tokens, passes, note):
    """Issue 39, item 4: the task-agreement gate re-judged with the remedy — a generator's token agreement from its
    loop run with the remedied artifact (the diagnose phase's task stage), by the stack's own task gate."""
    out = plan.settings.out_dir
    reference = [[1, 2, 3, 4], [5, 6, 7, 1]]
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], task="generation",
                      latency_ms=10.0)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE + 0.5], task="generation",
                      latency_ms=10.0)
    add_task(out, "legacy", "vit-smoke", "eager", reference)
    add_task(out, "candidate", "vit-smoke", "artifact", [[1, 7, 7, 7], [5, 6, 7, 1]])  # the shipped one diverges
    write_remedied(out, "candidate", "vit-smoke", remedy_outputs=[REFERENCE], task_tokens=remedy_tokens,
                   latency_ms=noisy_rounds(1.0, [1.0] * 7), threads=plan.settings.threads)
    record = evaluate(plan, gather(plan))
    gates = {g.gate: g for g in record.gates}
    assert gates["task-generation"].status is GateStatus.FAILED and gates["numerics"].status is GateStatus.FAILED
    (remedy,) = record.remedies
    judged = {g.gate: g for g in remedy.gates}
    assert judged["numerics"].status is GateStatus.PASSED and judged["numerics"].stack == "candidate+remedy"
    assert judged["task-generation"].status is (GateStatus.PASSED if passes else GateStatus.FAILED)
    assert remedy.passes is passes and remedy.note.startswith(note)
    # A remedy that passes answers both failed hard gates it was judged by: numerics and the task's.
    assert remedied(record) == ((Verdict.GO, 1) if passes else None)
    if passes:
        assert record.with_remedies["candidate"].clears == ("numerics (vit-smoke)", "task-generation (vit-smoke)")


# -- quantized variants and delegation ------------------------------------------


def with_snr(reference: np.ndarray, snr_db: float) -> np.ndarray:
    """``reference`` plus an error ``snr_db`` below it (in the L2 norm)."""
    noise = np.resize(np.array([1.0, -1.0], dtype=np.float32), reference.shape)
    return reference + noise * (np.linalg.norm(reference) / np.linalg.norm(noise) / 10 ** (snr_db / 20))


def quantized_plan(project: Path, config: str = "", models: str = "vit-smoke"):
    (project / "pyproject.toml").write_text(config)
    return load_plan(["--out", "out", "--models", models], invoked_from=project,
                     config_path=project / "pyproject.toml")


def write_variants(out: Path, *, candidate_snr_db: float, legacy_int8: str | None = "FX static (qnnpack)", **candidate):
    write_pair(out, candidate_artifact=[REFERENCE])
    legacy_recipe = legacy_int8 or "no recipe"
    legacy_artifact = [with_snr(REFERENCE, 30.0)] if legacy_int8 else None
    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=legacy_artifact,
                      quantize=legacy_recipe)
    write_stack_model(out, "candidate", "vit-smoke@int8-dynamic", eager=[REFERENCE],
                      artifact=[with_snr(REFERENCE, candidate_snr_db)], quantize="PT2E (XNNPACKQuantizer)", **candidate)


def gates_of(plan) -> tuple[dict[tuple[str, str], GateResult], Verdict]:
    verdict = evaluate(plan, gather(plan))
    return {(g.model, g.gate): g for g in verdict.gates}, verdict.verdict


def test_a_quantized_variant_is_judged_against_the_fp32_reference_by_its_own_gates(project):
    plan = quantized_plan(project)
    write_variants(plan.settings.out_dir, candidate_snr_db=35.0)
    gates, verdict = gates_of(plan)
    assert verdict is Verdict.GO
    int8 = {gate for model, gate in gates if model == "vit-smoke@int8-dynamic"}
    # Not the fp32 numerics gate (1e-4 would fail any int8 model): SNR and cosine instead.
    assert int8 == {"same-inputs", "quantized-export", "quantized-numerics", "artifact-size", "latency", "memory"}
    numerics = gates[("vit-smoke@int8-dynamic", "quantized-numerics")]
    assert numerics.measured.unit is Unit.DB and numerics.measured.value == pytest.approx(35.0)
    assert numerics.note.startswith("forward.output_0; cosine 0.99")
    assert (numerics.threshold, numerics.severity) == (Quantity(value=20.0, unit=Unit.DB), Severity.SOFT)
    assert numerics.threshold_text == "SNR ≥ 20.0 dB and cosine ≥ 0.99, every output"
    assert numerics.evidence == "artifact(candidate) vs eager(legacy)"


def test_a_degenerate_reference_is_a_warning_of_the_quantized_numerics_gate_too(project):
    plan = quantized_plan(project)
    out = plan.settings.out_dir
    saturated = np.full((1, 64), 0.5, np.float32)
    write_pair(out, candidate_artifact=[REFERENCE])
    for stack, recipe in (("legacy", "FX static (qnnpack)"), ("candidate", "PT2E (XNNPACKQuantizer)")):
        write_stack_model(out, stack, "vit-smoke@int8-dynamic", eager=[saturated], artifact=[saturated], quantize=recipe)
    gates, verdict = gates_of(plan)
    assert verdict is Verdict.GO  # a warning, not a failure
    numerics = gates[("vit-smoke@int8-dynamic", "quantized-numerics")]
    assert numerics.status is GateStatus.PASSED and numerics.warnings == (
        "reference output forward.output_0 is degenerate (constant: values spread 0.0e+00 ≤ 1e-06 × max |value| "
        "0.5): the comparison with it says little",)
    assert gates[("vit-smoke", "numerics")].warnings == ()  # the fp32 model's output is a normal one


def test_a_noisy_quantized_variant_is_a_condition_not_a_stop(project):
    plan = quantized_plan(project)
    write_variants(plan.settings.out_dir, candidate_snr_db=12.0)
    gates, verdict = gates_of(plan)
    assert verdict is Verdict.GO_WITH_CONDITIONS
    assert gates[("vit-smoke@int8-dynamic", "quantized-numerics")].status is GateStatus.FAILED


def test_quantized_thresholds_per_variant(project):
    plan = quantized_plan(project, '[tool.upgrade-gate.gates.quantized]\nmin-snr-db = 10\nseverity = "hard"\n'
                                   '[tool.upgrade-gate.gates.models."vit-smoke@int8-dynamic"]\nmin-snr-db = 40\n')
    write_variants(plan.settings.out_dir, candidate_snr_db=35.0)
    gates, verdict = gates_of(plan)
    assert verdict is Verdict.NO_GO
    assert gates[("vit-smoke@int8-dynamic", "quantized-numerics")].threshold == Quantity(value=40.0, unit=Unit.DB)


def test_a_variant_the_baseline_cannot_make_is_not_timed_against_it(project):
    plan = quantized_plan(project)
    write_variants(plan.settings.out_dir, candidate_snr_db=35.0, legacy_int8=None)
    gates, verdict = gates_of(plan)
    assert verdict is Verdict.GO
    assert ("vit-smoke@int8-dynamic", "quantized-numerics") in gates
    assert ("vit-smoke@int8-dynamic", "latency") not in gates and ("vit-smoke@int8-dynamic", "memory") not in gates


def test_a_failed_quantization_names_its_stage(project):
    plan = quantized_plan(project)
    write_variants(plan.settings.out_dir, candidate_snr_db=35.0, failed_stage="quantize")
    gates, verdict = gates_of(plan)
    assert verdict is Verdict.GO_WITH_CONDITIONS
    assert gates[("vit-smoke@int8-dynamic", "quantized-export")].note == "quantize failed: RuntimeError: quantize broke"


DELEGATION = {"delegate": "XnnpackBackend", "delegate_partitions": 3, "delegated_nodes": 90, "portable_nodes": 10,
              "portable_ops": {"aten_cumsum_default": 6, "aten_sort_default": 4}}


def test_delegation_gate_is_off_unless_asked_for(project):
    plan = quantized_plan(project, models="vit-smoke@fp32")
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], export_details=DELEGATION)
    gates, _ = gates_of(plan)
    assert ("vit-smoke", "delegation") not in gates


def test_delegation_gate_names_the_operators_that_fell_out(project):
    plan = quantized_plan(project, '[tool.upgrade-gate.gates]\ndelegation = { min-fraction = 0.95, severity = "soft" }\n',
                          models="vit-smoke@fp32")
    write_pair(plan.settings.out_dir, candidate_artifact=[REFERENCE], export_details=DELEGATION)
    gates, verdict = gates_of(plan)
    gate = gates[("vit-smoke", "delegation")]
    assert gate.status is GateStatus.FAILED and verdict is Verdict.GO_WITH_CONDITIONS
    assert gate.measured == Quantity(value=0.9, unit=Unit.SHARE)
    assert gate.note == "not delegated: aten_cumsum_default ×6, aten_sort_default ×4"
    assert gate.threshold_text == "delegated share ≥ 95.0%, of operator nodes, every method"


# -- latency on a busy machine, and measurements cut short ----------------------


def test_a_busy_machine_is_incomplete_not_a_failure(plan):
    """Rounds the rest of the machine disturbed are not judged, however slow they read;
    with fewer quiet rounds than an interval needs, the gate says the machine was busy."""
    out = plan.settings.out_dir
    slow_in_busy_rounds = [[10.0 * (4.0 if n % 3 else 1.0)] * 8 for n in range(1, 15)]
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 14)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=slow_in_busy_rounds)
    for threads in (1, 2):
        add_round_loads(out, "vit-smoke", threads, [(0.6, 1.9) if n % 3 else (0.01, 1.9) for n in range(1, 15)])
    gates, verdict = results_by_gate(plan)
    latency = gates["latency"]
    assert latency.status is GateStatus.INCOMPLETE and verdict is Verdict.INCOMPLETE
    assert latency.measured is None
    # Short: every busy model's gate says it; the figures are said once, under the verdict (test_report).
    assert latency.note == "1 thread(s): machine busy: 4 of 14 rounds quiet; an interval needs 6 quiet rounds"


def test_only_quiet_rounds_make_the_ratio(plan):
    """Nine quiet rounds at 0.9 and five disturbed ones at 4×: the ratio is the quiet rounds' 0.9."""
    out = plan.settings.out_dir
    loads = [(0.5, 1.9) if n in (2, 5, 8, 11, 13) else (0.0, 0.02) for n in range(1, 15)]
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 14)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=[[40.0 if waited > 0.05 else 9.0] * 8 for waited, _ in loads])
    for threads in (1, 2):
        add_round_loads(out, "vit-smoke", threads, loads)
    gates, verdict = results_by_gate(plan)
    latency = gates["latency"]
    assert latency.status is GateStatus.PASSED and verdict is Verdict.GO
    assert latency.measured.value == pytest.approx(0.9) and latency.measured.high == pytest.approx(0.9)
    # Nine rounds: x(2)..x(8) misses the median when at most one round lies below it, or above: 2·(1+9)/2⁹.
    assert latency.measured.level == pytest.approx(1 - 2 * 10 / 2**9)


def test_a_failure_at_one_thread_count_decides_over_a_busy_one(plan):
    """Quiet at 1 thread and 20% slower there; too busy at 2: the regression shown is a failure."""
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 9)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=[[12.0] * 8] * 9)
    add_round_loads(out, "vit-smoke", 1, [(0.0, 0.95)] * 9)  # one core taken: 1 thread keeps its own
    add_round_loads(out, "vit-smoke", 2, [(0.45, 0.95)] * 9)  # … and 2 threads wait for it
    gates, verdict = results_by_gate(plan)
    assert gates["latency"].status is GateStatus.FAILED and verdict is Verdict.GO_WITH_CONDITIONS
    assert gates["latency"].note == "1 thread(s): 12.000 ms / 10.000 ms"


# -- why the rounds ended, and what each figure covers (issue 37) ---------------------------------


def measured_as(plan, candidate: list[list[float]], loads: list[tuple[float, float]], ended: str, *,
                rounds: int = 9, intervals: int = 2, threads: tuple[int, ...] = (1, 2), most: int = 0) -> GateResult:
    """The latency gate over rounds recorded as the measure session writes them: the candidate's samples per
    round tried (the baseline's 10 ms), the load around each, why the rounds ended, the design they ran to."""
    out = plan.settings.out_dir
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=[[10.0] * 8] * len(candidate), threads=threads)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=candidate,
                      threads=threads)
    for count in threads:
        add_round_loads(out, "vit-smoke", count, loads, ended=ended,
                        settings={"rounds": rounds, "stop_early": True, "intervals": intervals,
                                  **({"most_rounds": most} if most else {})})
    gates, _ = results_by_gate(plan)
    return gates["latency"]


QUIET, BUSY = (0.0, 0.02), (0.6, 1.9)


def test_a_gate_decided_past_the_planned_rounds_says_so_with_that_designs_coverage(plan):
    """Issue 40, item 4: a measurement that went on past its 9 rounds while an interval straddled, decided at the
    look at 12 (its file: `most_rounds` 15). The gate reads the interval of that design — [x(2), x(11)] of 12 —
    with its coverage, and its note says how far the rounds could have gone."""
    candidate = [[10.2] * 8] + [[11.0] * 8] * 8 + [[12.0] * 8] * 3
    latency = measured_as(plan, candidate, [QUIET] * 12, "decided", most=15)
    assert latency.status is GateStatus.FAILED
    assert (latency.measured.low, latency.measured.high) == (pytest.approx(1.1), pytest.approx(1.2))
    # That design's coverage, counted over every sign sequence of 15 rounds (tests/test_rounds.py has the same).
    assert latency.measured.level == pytest.approx(1 - miss_over_every_sign_sequence({7: 1, 8: 1, 9: 1, 12: 2, 13: 2,
                                                                                      14: 2, 15: 3}))
    assert "stopped after 12 of 15 quiet rounds, every gate decided (stop-early)" in latency.note, latency.note
    assert "up to 9 quiet rounds, 15 while an interval straddled, the order alternating" in latency.evidence


def test_a_gate_stopped_early_says_it_was_decided(plan):
    latency = measured_as(plan, [[20.0] * 8] * 7, [QUIET] * 7, "decided")
    assert latency.status is GateStatus.FAILED
    # Each of the gate's 2 intervals at its share, 97.5%: [min, max] of 7 looks, 98.4% (the design's).
    assert latency.measured.level == pytest.approx(1 - 2 / 2**7)
    assert latency.note == ("1 thread(s): 20.000 ms / 10.000 ms; stopped after 7 of 9 quiet rounds, every gate "
                            "decided (stop-early); the gate's 2 intervals together: at least 96.9%")


def test_rounds_ended_by_a_busy_machine_are_not_said_to_be_decided(plan):
    """Ten of eighteen rounds disturbed: eight quiet ones, an interval that straddles the threshold — the note
    used to say 'stopped after 8 of 9 rounds, every interval decided' (issue 37, item 1)."""
    loads = [BUSY if n in (1, 2, 4, 5, 7, 8, 10, 11, 13, 14) else QUIET for n in range(1, 19)]
    candidate = [[10.0 * (1.0 if n % 2 else 1.1)] * 8 for n in range(1, 19)]
    latency = measured_as(plan, candidate, loads, "repeats ran out")
    assert latency.status is GateStatus.INCONCLUSIVE
    assert latency.note.endswith("; the interval straddles 1.05; the repeats ran out: 18 rounds tried, 8 of 9 quiet; "
                                 "the gate's 2 intervals together: at least 96.9%"), latency.note
    assert "decided" not in latency.note


@pytest.mark.parametrize(("rounds", "intervals", "ended", "advised"), [
    (9, 2, "planned", True),  # every round ran (most-rounds = 9) and it straddles: more would decide it more often
    (15, 2, "planned", False),  # it had them
    (9, 2, "repeats ran out", False),  # a busy machine, not the rounds, left it undecided
    (9, 12, "planned", False),  # 9 rounds spend nearly all of 12 intervals' shares: no look past them fits to 15
])
def test_a_gate_that_straddles_after_every_round_says_which_rounds_would_decide_it(plan, rounds, intervals, ended,
                                                                                    advised):
    """docs/benchmarks-log.md's looks benchmark: rounds past 9 while an interval straddles decide small gates that 9
    leave straddling more often; the note names `most-rounds` where every round the run could take ran (a file
    of 9 rounds with none past them) and looks past them would fit the gate's intervals."""
    candidate = [[10.0 * (1.0 if n % 2 else 1.1)] * 8 for n in range(1, rounds + 1)]
    latency = measured_as(plan, candidate, [QUIET] * rounds, ended, rounds=rounds, intervals=intervals)
    assert latency.status is GateStatus.INCONCLUSIVE
    said = (f"the interval straddles 1.05 after all {rounds} rounds (`most-rounds = 15` goes on only while an interval "
            "straddles")
    assert (said in latency.note) is advised, latency.note


def test_a_gate_of_more_intervals_needs_more_quiet_rounds(plan):
    """Each of a gate's 12 intervals (6 methods at 2 thread counts) may miss 5%/12: [min, max] of 8 rounds
    (99.2%) falls short of 99.58%. A busy machine that left 8 is 'machine busy'; 8 rounds asked for and all
    quiet were too few asked for, and the gate names the setting."""
    busy = measured_as(plan, [[20.0] * 8] * 18, [BUSY if n % 2 else QUIET for n in range(1, 17)] + [BUSY, BUSY],
                       "repeats ran out", intervals=12)
    assert busy.status is GateStatus.INCOMPLETE
    assert busy.note == ("1 thread(s): machine busy: 8 of 18 rounds quiet; an interval needs 9 quiet rounds; not "
                         "judged, but over 1.05: 2.00×–2.00× in every one of its 18 rounds, disturbed or not")
    said = evaluate(plan, gather(plan)).incomplete[0]
    assert said.startswith("machine busy: too few quiet rounds to judge latency (an interval needs 9) for vit-smoke at "
                           "1 thread(s) (8 of 18 quiet; over 1.05: 2.00×–2.00× in every one of its 18 rounds, disturbed "
                           "or not), 2 thread(s) (8 of 18 quiet; over 1.05: "), said
    too_few = measured_as(plan, [[20.0] * 8] * 8, [QUIET] * 8, "planned", rounds=8, intervals=12)
    assert too_few.status is GateStatus.INCONCLUSIVE
    assert too_few.note == ("1 thread(s): 20.000 ms / 10.000 ms; only 8 quiet rounds: the interval covers 99.2%, short "
                            "of the 99.58% each of the gate's intervals needs (set `rounds` to at least 9); the gate's "
                            "2 intervals together: at least 98.4%")


def test_a_busy_machine_does_not_hide_a_regression_every_round_shows(project):
    """Issue 37, item 11: on a shared runner all 18 disturbed rounds of a model were 1.84× to 2.35× its
    baseline, and the gate said only 'incomplete'. Still not judged — a disturbed round may slow either stack —
    but said, with the figures."""
    (project / "pyproject.toml").write_text("[tool.upgrade-gate]\nthreads = [1]\n")
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    factors = [1.84, 2.35, 2.1, 1.9, 2.0, 2.2, 1.95, 2.05, 2.3, 1.88, 2.15, 2.0, 1.97, 2.25, 2.02, 1.9, 2.1, 2.0]
    latency = measured_as(plan, [[10.0 * f] * 8 for f in factors], [BUSY] * 18, "repeats ran out", threads=(1,),
                          intervals=1)
    assert latency.status is GateStatus.INCOMPLETE and latency.measured is None
    assert latency.note == ("1 thread(s): machine busy: 0 of 18 rounds quiet; an interval needs 6 quiet rounds; not "
                            "judged, but over 1.05: 1.84×–2.35× in every one of its 18 rounds, disturbed or not")
    # One round within the threshold, and there is no one thing to say.
    latency = measured_as(plan, [[10.0 * f] * 8 for f in [*factors[:-1], 1.0]], [BUSY] * 18, "repeats ran out",
                          threads=(1,), intervals=1)
    assert latency.note == "1 thread(s): machine busy: 0 of 18 rounds quiet; an interval needs 6 quiet rounds"


def test_a_busy_report_shows_what_the_tests_that_accept_one_check(project, tmp_path):
    """Issue 61, D3: the integration tests that accept a busy machine's INCOMPLETE check what such a run must show
    (helpers/runs.py busy_run_shows: the reason, nothing stored, the advice). Held to a report the code writes: it
    holds, and it fails once the busy measurement is found stored in the result cache, or the reason is missing."""
    (project / "pyproject.toml").write_text("[tool.upgrade-gate]\nthreads = [1]\n")
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    measured_as(plan, [[10.0] * 8] * 12, [QUIET] * 2 + [BUSY] * 10, "repeats ran out", threads=(1,), intervals=1)
    out = plan.settings.out_dir
    measurement = layout.measurement_file(out, "vit-smoke", 1)
    data = json.loads(measurement.read_text())  # as the measure session writes it: its key and the stacks timed
    measurement.write_text(json.dumps({**data, "key": "k" * 64, "order": ["legacy", "candidate"]}))
    assert pipeline.report(plan) == 3
    cache = tmp_path / "results"
    busy_run_shows(out, cache)
    entry = cache / "legacy+candidate" / "vit-smoke" / "measure-t1" / ("k" * 64)
    entry.mkdir(parents=True)  # an earlier, quiet measurement's under the same key: not these rounds
    (entry / measurement.name).write_text(json.dumps({**data, "rounds": data["rounds"][:6]}))
    busy_run_shows(out, cache)
    shutil.copy(measurement, entry / measurement.name)  # these rounds, stored
    with pytest.raises(AssertionError, match="measure-t1"):
        busy_run_shows(out, cache)
    verdict = json.loads((out / "verdict.json").read_text())
    (out / "verdict.json").write_text(json.dumps({**verdict, "incomplete": verdict["incomplete"][1:]}))
    with pytest.raises(AssertionError, match="^run `nox -s compare` again"):  # no busy line before the advice
        busy_run_shows(out, tmp_path / "empty")


def test_an_unknown_end_of_the_rounds_names_the_file(plan):
    out = plan.settings.out_dir
    write_pair(out, candidate_artifact=[REFERENCE])
    add_round_loads(out, "vit-smoke", 1, [QUIET] * 7, ended="bored")
    with pytest.raises(RecordError) as caught:
        gather(plan)
    assert str(caught.value) == ("Unknown ended 'bored' in 'measurements/vit-smoke/threads-1.json.ended'; expected "
                                 "one of planned, decided, repeats ran out, server ended")


def _cut_short(out: Path, status: str, message: str, rounds: int) -> None:
    write_stack_model(out, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=[[10.0] * 8] * 9)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                      latency_ms=[[30.0] * 8] * rounds)
    path = layout.measurement_file(out, "vit-smoke", 1)
    data = json.loads(path.read_text())
    data["stacks"]["candidate"].update(status=status, error={"stage": "round", "message": message})
    path.write_text(json.dumps(data))


def test_a_server_killed_part_way_is_incomplete_and_its_rounds_are_not_a_ratio(plan):
    out = plan.settings.out_dir
    _cut_short(out, "killed", "worker killed by signal SIGKILL (not by upgrade-gate: the kernel's out-of-memory "
                              "killer, or another process)", rounds=1)
    model = gather(plan)[0]
    assert model.ratio("candidate", 1, "forward") is None  # one round of three times slower: kept, never judged
    assert model.ratio("candidate", 2, "forward") is not None
    gates, verdict = results_by_gate(plan)
    latency = gates["latency"]
    assert latency.status is GateStatus.INCOMPLETE and verdict is Verdict.INCOMPLETE and latency.measured is None
    assert latency.note == ("candidate: killed (round: worker killed by signal SIGKILL (not by upgrade-gate: the "
                            "kernel's out-of-memory killer, or another process) after 1 round(s))")


def test_a_candidate_that_faults_under_measurement_fails_on_the_fault_not_on_its_rounds(plan):
    out = plan.settings.out_dir
    _cut_short(out, "crashed", "worker killed by signal SIGSEGV", rounds=2)
    gates, verdict = results_by_gate(plan)
    latency = gates["latency"]
    assert latency.status is GateStatus.FAILED and latency.measured is None
    assert latency.note == "candidate: crashed (round: worker killed by signal SIGSEGV after 2 round(s))"


# -- what ships today: the baseline's own quantized artifacts ---------------------------------


def _scaled(snr_db: float, *, flip: bool = False) -> np.ndarray:
    """REFERENCE with an error of exactly ``snr_db`` against it: artifact = (1 ± k)·reference, ‖Δ‖ = k‖ref‖."""
    k = 10 ** (-snr_db / 20)
    return REFERENCE * (1 - k if flip else 1 + k)


@pytest.mark.parametrize(("legacy_snr_db", "flip", "found"), [
    (-1.3, True, True),  # issue 26: legacy's int8 at -1.3 dB, and pointing the other way (cosine -1)
    (12.0, False, True),  # under the 20 dB of the quantized gate
    (30.0, False, False),  # as a quantized artifact may be: no finding
])
def test_a_baseline_int8_off_from_the_fp32_reference_is_a_baseline_finding(project, legacy_snr_db, flip, found):
    plan = load_plan(["--out", "out", "--models", "vit-smoke"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[_scaled(legacy_snr_db, flip=flip)],
                      quantize="FX")
    write_stack_model(out, "candidate", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[_scaled(36.2)], quantize="PT2E")

    verdict = evaluate(plan, gather(plan))

    # Not the candidate's: its int8 is judged against the fp32 reference, and passes.
    quantized = next(g for g in verdict.gates if (g.model, g.gate) == ("vit-smoke@int8-dynamic", "quantized-numerics"))
    assert quantized.status is GateStatus.PASSED and quantized.measured.value == pytest.approx(36.2)
    assert verdict.verdict is Verdict.GO
    if not found:
        assert verdict.baseline_findings == ()
        return
    finding, = verdict.baseline_findings
    assert (finding.model, finding.output) == ("vit-smoke@int8-dynamic", "forward.output_0")
    assert finding.snr_db == pytest.approx(legacy_snr_db)
    assert (finding.min_snr_db, finding.gate_min_cosine) == (20, 0.99)  # the quantized gates' defaults (docs/report.md)
    assert finding.cosine == pytest.approx(-1.0 if flip else 1.0)
    assert str(finding) == (f"**vit-smoke@int8-dynamic**: SNR = {legacy_snr_db:.1f} dB (forward.output_0), cosine "
                            f"{-1.0 if flip else 1.0:.5f}, against the fp32 reference: under the quantized gate's "
                            "20 dB and 0.99")
    # verdict.json keeps it, and reads it back.
    again = VerdictRecord.from_reader(Reader(json.loads(json.dumps(to_json(verdict.to_dict()))), "verdict.json"))
    assert again.baseline_findings == verdict.baseline_findings


def test_a_variant_the_baseline_has_no_recipe_for_is_no_finding_and_one_it_fails_to_make_is(project):
    plan = load_plan(["--out", "out", "--models", "vit-smoke"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    write_stack_model(out, "candidate", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[_scaled(36.2)], quantize="PT2E")
    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=None, quantize="no recipe")
    assert evaluate(plan, gather(plan)).baseline_findings == ()

    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=None, quantize="FX",
                      failed_stage="export")
    finding, = evaluate(plan, gather(plan)).baseline_findings
    assert (finding.model, finding.failure) == ("vit-smoke@int8-dynamic", "export failed: RuntimeError: export broke")
    # Issue 63: FX could not trace a YOLO head. A stage that fails is said as such, with the model's line, and the
    # report does not file it under the artifacts that depart.
    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=None, quantize="FX",
                      failed_stage="quantize", failed_at="head.py:52 in forward: if x.shape[0] > 1:")
    results = pipeline.judge(plan)
    finding, = results.verdict.baseline_findings
    assert (finding.stage, finding.failure) == (
        "quantize", "quantize failed: RuntimeError: quantize broke (at head.py:52 in forward: if x.shape[0] > 1:)")
    text = to_markdown(report_blocks(results, out))
    assert ("What legacy ships today fails at a stage, whatever the verdict:\n\n- **vit-smoke@int8-dynamic**: quantize "
            "failed") in text and "departs from its eager models" not in text


def test_remedies_that_answer_every_hard_failure_say_what_the_verdict_would_be():
    def failed(model: str, name: str, severity: str) -> GateResult:
        return GateResult(gate=name, stack="candidate", model=model, severity=Severity(severity),
                          status=GateStatus.FAILED, metric="m")

    def remedy(model: str, passes: bool) -> Remedy:
        return Remedy(stack="candidate", model=model, gate="numerics", methods=("forward",), operators=("op",),
                      passes=passes, rel_l2=1e-7 if passes else 1e-3, threshold=1e-4)

    numerics, latency = failed("vit", "numerics", "hard"), failed("bert", "latency", "soft")
    record = VerdictRecord(tool_version="0", generated_at="t", verdict=Verdict.NO_GO, baseline="legacy",
                           candidates={"candidate": Verdict.NO_GO}, gates=(numerics, latency),
                           remedies=(remedy("vit", True),))
    # The soft failure still counts: GO-WITH-CONDITIONS, not GO.
    assert counted(with_remedies(record, "candidate")) == (Verdict.GO_WITH_CONDITIONS, 1)
    # The console's line says it the same way, from the record that keeps it.
    assert headline(with_remedied_verdicts(record), "candidate") == (
        "NO-GO as configured; GO-WITH-CONDITIONS with 1 remedy — hard: numerics (vit)")
    assert headline(with_remedied_verdicts(replace(record, remedies=(remedy("vit", False),))), "candidate") == (
        "NO-GO — hard: numerics (vit)")
    assert counted(with_remedies(replace(record, gates=(numerics,)), "candidate")) == (Verdict.GO, 1)
    # A remedy that does not pass, or a hard failure no remedy answers: nothing is claimed.
    assert with_remedies(replace(record, remedies=(remedy("vit", False),)), "candidate") is None
    assert with_remedies(replace(record, gates=(numerics, failed("llama", "export", "hard"))), "candidate") is None
    # Nothing failed hard: there is nothing to remedy.
    assert with_remedies(replace(record, gates=(latency,)), "candidate") is None
    # A remedy slower than the latency gate lets a candidate be: its cost is a condition.
    slow = replace(remedy("vit", True), conditions=("forward ×2.7 against the shipped artifact",))
    assert counted(with_remedies(replace(record, gates=(numerics,), remedies=(slow,)), "candidate")) == (
        Verdict.GO_WITH_CONDITIONS, 1)
    line = verdict_blocks(with_remedied_verdicts(record))[1]
    assert isinstance(line, Bullets) and line.items[0].text.startswith(
        "**candidate** vs baseline **legacy**: **NO-GO** as configured; **GO-WITH-CONDITIONS** with 1 remedy "
        "([Way out](#way-out)) — hard: numerics (vit)")
    # A remedy of a soft gate (a variant's layers in float) is counted by no headline.
    quantized = replace(remedy("vit@int8", True), gate="quantized-numerics")
    both = replace(record, gates=(numerics,), remedies=(remedy("vit", True), quantized))
    assert counted(with_remedies(both, "candidate")) == (Verdict.GO, 1)
    # An export a remedy makes: what the failure blocked is not measured with it, so at best a condition.
    export = failed("llama", "export", "hard")
    blocked = GateResult(gate="latency", stack="candidate", model="llama", severity=Severity.SOFT,
                         status=GateStatus.BLOCKED, metric="m", blocked_by="export")
    exported = replace(remedy("llama", True), gate="export")
    assert counted(with_remedies(replace(record, gates=(export, blocked), remedies=(exported,)), "candidate")) == (
        Verdict.GO_WITH_CONDITIONS, 1)
    found = with_remedies(replace(record, gates=(export, blocked), remedies=(exported,)), "candidate")
    assert found is not None and found.clears == ("export (llama)",)
    assert found.conditions == ("latency (llama): not measured with the remedy that exports it",)
    assert counted(with_remedies(replace(record, gates=(export,), remedies=(exported,)), "candidate")) == (Verdict.GO, 1)


def test_blocked_gates_are_counted_after_the_failure_that_blocks_them():
    export = GateResult(gate="export", stack="candidate", model="m", severity=Severity.HARD, status=GateStatus.FAILED,
                        metric="stages")
    blocked = [GateResult(gate=name, stack="candidate", model="m", severity=Severity.HARD, status=GateStatus.BLOCKED,
                          metric="m", blocked_by="export") for name in ("numerics", "latency")]
    record = VerdictRecord(tool_version="0", generated_at="t", verdict=Verdict.NO_GO, baseline="legacy",
                           candidates={"candidate": Verdict.NO_GO}, gates=(export, *blocked))
    line = verdict_blocks(record)[1]
    assert isinstance(line, Bullets) and line.items[0].text == (
        "**candidate** vs baseline **legacy**: **NO-GO** — hard: export (m); 2 gates blocked by a failure above "
        "([listed below](#failing-gates))")


def test_a_run_stopped_by_fail_fast_is_no_go_and_names_what_it_did_not_reach(project: Path):
    """--fail-fast: vit-smoke's candidate artifact fails numerics (hard), so the run stopped there: minilm-smoke
    was never exported in the candidate and nothing was measured. Its gates and the latency are not reached —
    incomplete, never passed — said once under the verdict, which the failed hard gate decides."""
    from upgrade_gate.judge.fail_fast import first_hard_failure

    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32,minilm-smoke@fp32", "--fail-fast"],
                     invoked_from=project, config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    assert plan.fail_fast
    write_pair(out, candidate_artifact=[REFERENCE + 0.5])
    write_stack_model(out, "legacy", "minilm-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    vit, _ = plan.models
    stop = first_hard_failure(plan, plan.candidates[0], vit)
    assert stop is not None and (stop["model"], stop["gate"], stop["stack"]) == ("vit-smoke", "numerics", "candidate")
    # What the console says it stopped at: the measured value against the rule (it printed "failed ()").
    assert re.fullmatch(r"rel_l2 = \d\.\d\de[+-]\d\d \(rel_l2 ≤ 1\.00e-04\)", stop["note"]), stop["note"]
    layout.stopped_file(out, "candidate").write_text(json.dumps(stop))
    for model in ("vit-smoke", "minilm-smoke"):  # the measure session skipped, and cleared an earlier run's
        for stale in layout.measurement_dir(out, model).glob("threads-*"):
            stale.unlink()

    verdict = evaluate(plan, gather(plan))
    assert verdict.verdict is Verdict.NO_GO
    by_model = {(g.model, g.gate): g for g in verdict.gates}
    assert by_model[("vit-smoke", "numerics")].status is GateStatus.FAILED
    unreached = [g for g in verdict.gates if g.model == "minilm-smoke"] + [by_model[("vit-smoke", "latency")]]
    assert unreached and all(g.status is GateStatus.INCOMPLETE for g in unreached)
    assert {g.note for g in unreached} == {
        "not reached: --fail-fast stopped candidate's run at vit-smoke's failed numerics gate"}
    assert not any(g.status is GateStatus.PASSED for g in verdict.gates if g.model == "minilm-smoke")
    count = sum(g.status is GateStatus.INCOMPLETE for g in verdict.gates)
    assert verdict.incomplete == (f"candidate: {count} gate(s) not reached: --fail-fast stopped the run at "
                                  "vit-smoke's failed numerics gate; run without --fail-fast to judge every gate",)
    # The verdict's line leads with the failure and counts what was not reached, instead of listing each gate.
    line = str(verdict_blocks(verdict)[1])
    assert "hard: numerics (vit-smoke)" in line and f"{count} gates not reached (--fail-fast)" in line, line
    assert "incomplete: " not in line
