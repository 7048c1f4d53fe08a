"""The benchmarks' own bookkeeping: the statuses they count are the ones verdict.json writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from benchmarks import benchmark, repeated_runs, run_times
from helpers.stack_records import write_stack_model

from upgrade_gate import pipeline
from upgrade_gate.config.plan import load_plan
from upgrade_gate.schema.verdict import GateStatus


def run(index: int, **statuses: str) -> dict:
    return {"run": index, "seconds": 90.0, "ratios": [], "machine": [],
            "latency_gates": {model: {"status": status, "measured": None, "note": ""} for model, status in statuses.items()}}


def test_a_planted_slowdown_counts_as_failed_as_verdict_json_writes_it():
    # verdict.json writes GateStatus values; the variant only one stack ran has no latency gate.
    runs = [run(i, a=GateStatus.FAILED.value, b=GateStatus.FAILED.value if i < 4 else "inconclusive") for i in range(1, 6)]
    summary = repeated_runs.summarize_runs("sensitivity", "quiet", ["a", "b", "b@int8"], runs)
    assert summary["failed"] == 8 and summary["inconclusive"] == 2
    assert summary["failed_runs_per_model"] == {"a": 5, "b": 3, "b@int8": 0}
    assert summary["met"] is False  # b failed in 3 of 5
    assert repeated_runs.summarize_runs("sensitivity", "quiet", ["a"], runs)["met"] is True
    assert repeated_runs.summarize_runs("sensitivity", "all-cores", ["a", "b"], runs)["met"] is None
    assert repeated_runs.summarize_runs("noise", "quiet", ["a"], runs)["met"] is False
    assert repeated_runs.summarize_runs("noise", "quiet", ["a"], [run(1, a="passed"), run(2, a="incomplete")])["met"] is True
    assert "no gate (one stack)" in repeated_runs._compare_markdown(
        {**summary, "runs": [{**runs[0], "machine": [{"model": "b@int8", "threads": 1, "rounds": 9, "quiet": 9,
                                                       "others_cores": 0.01, "oversubscribed": False}]}]})


def test_stages_sums_each_phase_and_the_measure_sessions_calls(project):
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    reference = np.ones((1, 4), dtype=np.float32)
    # Seven rounds of eight 2 ms calls per stack and thread count (1 and 2).
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[reference], artifact=[reference], latency_ms=2.0)
    pipeline.report(plan)
    parts = run_times.run_parts(out, export_jobs=2)
    for stack in ("legacy", "candidate"):
        phases = {p: json.loads((out / "stacks" / stack / "models" / "vit-smoke" / f"{p}.json").read_text())
                  for p in ("export", "runtime")}
        expected = {p: sum(s["duration_s"] for s in data["stages"]) for p, data in phases.items()}
        assert parts["stacks"][stack]["vit-smoke"] == pytest.approx({**expected, "diagnose": 0.0})  # nothing departed
    assert parts["candidate_export_floor_s"] == pytest.approx(parts["totals"]["candidate"]["export"] / 2)
    assert parts["measure"]["measurements"] == 4  # two stacks at two thread counts
    assert parts["measure"]["timed_calls_s"] == pytest.approx(4 * 7 * 8 * 2.0 / 1000)

    # The family's minutes: both stacks' phases and the measurements' wall time — their calls where a file has no
    # elapsed_s (from before it was recorded), else that; its suite cost beside them; one family, one part of two.
    phases_s = sum(sum(parts["stacks"][stack]["vit-smoke"].values()) for stack in ("legacy", "candidate"))
    costs = run_times.family_costs(out, parts)
    assert costs["families"] == [{"family": "vit-smoke", "cost": 1.0,
                                  "minutes": pytest.approx((phases_s + 4 * 7 * 8 * 2.0 / 1000) / 60)}]
    for threads in (1, 2):
        path = out / "measurements" / "vit-smoke" / f"threads-{threads}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "elapsed_s": 30.0}))
    costs = run_times.family_costs(out, parts)
    assert costs["families"][0]["minutes"] == pytest.approx((phases_s + 60.0) / 60)
    assert costs["shards_by_suite_costs"] == costs["shards_by_these_minutes"] == [pytest.approx((phases_s + 60) / 60), 0]

    # A worker's seconds outside its stages: what the supervisor saw of it, less its stages' durations.
    for stack, phase, outside, forked in (("candidate", "export", 3.0, True), ("legacy", "runtime", 1.5, False)):
        record_file = out / "stacks" / stack / "models" / "vit-smoke" / f"{phase}.json"
        record = json.loads(record_file.read_text())
        inside = sum(s["duration_s"] for s in record["stages"])
        record.setdefault("facts", {})["supervisor"] = {"elapsed_s": inside + outside, "forked": forked}
        record_file.write_text(json.dumps(record))
    assert run_times.worker_start_up(out) == {
        "candidate": {"export": {"start_up_s": pytest.approx(3.0), "forked": 1, "fresh": 0}},
        "legacy": {"runtime": {"start_up_s": pytest.approx(1.5), "forked": 0, "fresh": 1}}}


def test_stop_early_replays_a_runs_rounds_through_the_measure_sessions_loop(project):
    """A run measured with fixed rounds, played again through round_loop.run_rounds with its stop rule: a candidate
    twice as slow in every round is decided at the first look its gate's intervals have — [min, max] of 7
    for each of two (1 and 2 threads) — and the seconds of the rounds after it are what stopping early saves;
    a disturbed round does not count towards the look."""
    from helpers.stack_records import add_round_loads

    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    reference = np.ones((1, 4), dtype=np.float32)
    write_stack_model(out, "legacy", "vit-smoke", eager=[reference], artifact=[reference], latency_ms=[[2.0] * 8] * 10)
    write_stack_model(out, "candidate", "vit-smoke", eager=[reference], artifact=[reference],
                      latency_ms=[[4.0] * 8] * 10)
    for threads, loads in ((1, [(0.0, 0.02)] * 9), (2, [(0.0, 0.02), (0.6, 1.9)] + [(0.0, 0.02)] * 8)):
        add_round_loads(out, "vit-smoke", threads, loads, ended="planned",
                        settings={"rounds": 9, "stop_early": False, "intervals": 2})
    pipeline.report(plan)
    # Relative folders are from where the command ran, not the noxfile's folder nox runs the session in.
    assert out == project / "out"
    assert benchmark.main(["stop-early", "--report", "out", "--out", "bench"], log=lambda _: None,
                          invoked_from=project) == 0
    rows = {row["measurement"]: row for row in json.loads((project / "bench" / "stop-early.json").read_text())["rows"]}
    one, two = rows["measurements/vit-smoke/threads-1.json"], rows["measurements/vit-smoke/threads-2.json"]
    # Every part of a round lasted 0.5 s (add_round_loads): two stacks, 1 s a round.
    assert (one["rounds"], one["stopped_after"], one["rounds_s"], one["saved_s"]) == (9, 7, 9.0, 2.0)
    assert (two["rounds"], two["stopped_after"], two["rounds_s"], two["saved_s"]) == (10, 7, 10.0, 2.0)


def test_most_rounds_counts_the_gates_the_rounds_past_the_planned_ones_decided(project, tmp_path):
    """A run made with 9 rounds, up to 15: a candidate as fast as the baseline in its first round and ×1.2 in every
    other. Its gate of two intervals (1 and 2 threads) looks at 7–9 with [min, max], which the first round keeps over
    the threshold, and at 12 with [x(2), x(11)], wholly above it: inconclusive at the planned rounds, failed as run,
    and the three rounds past 9 are what it cost. The replay of the run's own design stops where the run did."""
    from helpers.stack_records import add_round_loads

    from upgrade_gate import stats

    looks = stats.sequential_looks(9, stats.interval_confidence(2), 15)
    assert {n: looks[n] for n in (7, 8, 9, 12)} == {7: 1, 8: 1, 9: 1, 12: 2}  # what the rounds below are made for
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    reference = np.ones((1, 4), dtype=np.float32)
    write_stack_model(out, "legacy", "vit-smoke", eager=[reference], artifact=[reference], latency_ms=[[2.0] * 8] * 12)
    write_stack_model(out, "candidate", "vit-smoke", eager=[reference], artifact=[reference],
                      latency_ms=[[2.0] * 8] + [[2.4] * 8] * 11)
    for threads in (1, 2):
        add_round_loads(out, "vit-smoke", threads, [(0.0, 0.02)] * 12, ended="decided",
                        settings={"rounds": 9, "stop_early": True, "most_rounds": 15, "intervals": 2})
    pipeline.report(plan)
    assert benchmark.main(["most-rounds", "--report", str(out), "--out", str(tmp_path)], log=lambda _: None) == 0
    found = json.loads((tmp_path / "most-rounds.json").read_text())
    (row,) = found["rows"]
    assert (row["at_planned"], row["as_run"], row["verdict"]) == ("inconclusive", "failed", GateStatus.FAILED.value)
    assert row["rounds"] == {"1": 12, "2": 12} and row["replayed_as_run"]
    # Each part of a round lasted 0.5 s (add_round_loads): two stacks, two thread counts, three rounds past 9.
    assert row["past_planned_s"] == pytest.approx(2 * 3 * 1.0)
    assert found["inconclusive"] == {"at_planned": 1, "as_run": 0}

    # A run whose recorded rounds went on past where its own design stops is not this replay's: exit 1, said.
    for threads in (1, 2):
        add_round_loads(out, "vit-smoke", threads, [(0.0, 0.02)] * 12, ended="decided",
                        settings={"rounds": 9, "stop_early": True, "most_rounds": 9, "intervals": 2})
    said: list[str] = []
    assert benchmark.main(["most-rounds", "--report", str(out), "--out", str(tmp_path)], log=said.append) == 1
    assert "the replay did not stop where the run did" in said[0]


def test_an_out_folder_that_cannot_be_one_exits_2_naming_it(tmp_path, capsys):
    """Issue 61, N21: a bad `--out` was a fault of the tool, its traceback in the system's temporary folder."""
    taken = tmp_path / "taken"
    taken.write_text("a file where the folder should go\n")
    with pytest.raises(SystemExit) as ended:
        benchmark.main(["gate", "--out", str(taken / "gate")], log=lambda _: None)
    assert ended.value.code == 2
    assert capsys.readouterr().err == (f"upgrade-gate: error: {taken / 'gate'}: benchmark folder is not writable (Not a "
                                       "directory); choose another with --out DIR\n")
