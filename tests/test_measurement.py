"""The measurement file's record (upgrade_gate.schema.measurement): read in one place, older files too, its errors
naming their path, and the one ``RoundsDesign`` that the stop rule, the gate's ratios and the merge of shards read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from benchmarks import scripted
from helpers.stack_records import REFERENCE, write_stack_model

from upgrade_gate import __version__, layout, stats
from upgrade_gate.config.plan import load_plan
from upgrade_gate.errors import RecordError
from upgrade_gate.judge.gather import gather
from upgrade_gate.measure import round_loop
from upgrade_gate.run import shards
from upgrade_gate.schema.measured import RoundsEnded
from upgrade_gate.schema.measurement import (
    Machine,
    Measurement,
    MeasureSettings,
    RoundLoad,
    RoundsDesign,
    TimedRound,
    TimedSide,
    load_measurement,
    read_measurement,
)

pytestmark = pytest.mark.unit

# Written by the measure session's own writer at 89dee16, before the record (rounds.measurement_data over
# rounds.play_rounds, scripted servers): stop-early, a gate of 2 intervals, round 2 disturbed, the remedied side's
# server ended in round 3, one stack not measured.
WRITTEN_BEFORE = Path(__file__).parent / "data" / "measurement" / "written-at-89dee16.json"


def _file(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "threads-1.json"
    path.write_text(json.dumps(data))
    return path


def test_a_file_the_writer_wrote_before_the_record_reads_and_writes_back_the_same():
    measurement = read_measurement(WRITTEN_BEFORE, "threads-1.json")
    assert measurement.design == RoundsDesign(planned=9, stop_early=True, most=15, intervals=2)
    assert measurement.ended is RoundsEnded.DECIDED and measurement.machine.cores == 2
    assert [r.round for r in measurement.rounds if r.disturbed] == [2] and measurement.rounds[1].disturbed
    assert measurement.rounds[2].servers_ended == ("candidate+remedy",)
    remedy = measurement.stacks["candidate+remedy"]
    assert remedy.status == "failed" and remedy.error is not None and len(remedy.rounds or ()) == 2
    assert measurement.stacks["other"] == TimedSide(status="not measured",
                                                    reason="its artifact did not load and run (runtime phase)")
    assert measurement.to_dict() == json.loads(WRITTEN_BEFORE.read_text())


def test_a_record_round_trips():
    measurement = Measurement(
        schema_version="1.0", model="m", threads=2,
        settings=MeasureSettings(design=RoundsDesign.of(planned=9, most_rounds=15, stop_early=True, intervals=2),
                                 warmup=10, iterations=50, time_budget_s=2.0),
        order=("a", "b"), key="k", machine=Machine(cpu="CPU", cores=4),
        rounds=(RoundLoad(round=1, order=("a", "b"), disturbed=False, loads={"a": None, "b": None}, cut={"b": 4.0}),),
        ended=RoundsEnded.PLANNED, elapsed_s=3.5,
        stacks={"a": TimedSide(status="ok", host="h", rounds=(TimedRound(round=1, samples_ms={"forward": (1.0, 2.0)},
                                                                          calls={"forward": 2}),)),
                "b": TimedSide(status="not measured", reason="why")})
    assert Measurement.from_dict(measurement.to_dict(), "m") == measurement
    assert measurement.to_dict()["settings"] == {"rounds": 9, "stop_early": True, "most_rounds": 15, "intervals": 2,
                                                 "warmup": 10, "iterations": 50, "time_budget_s": 2.0}


def test_older_files_read_through_the_one_function(tmp_path):
    """Before the rounds' loads were measured (every round quiet, from the stacks' rounds), before ``ended`` (the
    last round's ``stopped``), before a round was numbered, before the design was written (fixed, one interval)."""
    no_loads = {"schema_version": "1.0", "model": "m", "threads": 1, "order": ["a"],
                "stacks": {"a": {"status": "ok", "rounds": [{"samples_ms": {"forward": [1.0]}}] * 3}}}
    old = read_measurement(_file(tmp_path, no_loads), "old.json")
    assert [(r.round, r.disturbed, r.order) for r in old.rounds] == [(1, False, ("a",)), (2, False, ("a",)),
                                                                     (3, False, ("a",))]
    assert old.design == RoundsDesign() and old.design.ratio([[2.0]] * 7, [[1.0]] * 7).planned == 0
    assert old.ended is None
    stopped = {**no_loads, "rounds": [{"round": 1, "order": ["a"], "disturbed": False, "load": {}, "stopped": True}]}
    assert read_measurement(_file(tmp_path, stopped), "old.json").ended is RoundsEnded.DECIDED


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["settings"].update(intervals="two"),
     "Unexpected type str (expected int) in 'm.json.settings.intervals'"),
    (lambda d: d["settings"].update(intervals=0), "Unexpected value (expected at least 1) in 'm.json.settings.intervals'"),
    (lambda d: d["stacks"]["legacy"]["rounds"][4]["samples_ms"].update(forward=[1.0, "fast"]),
     "Unexpected type str (expected int or float) in 'm.json.stacks.legacy.rounds[4].samples_ms.forward[1]'"),
    (lambda d: d.update(ended="bored"),
     "Unknown ended 'bored' in 'm.json.ended'; expected one of planned, decided, repeats ran out, server ended"),
    (lambda d: d["rounds"][0].pop("disturbed"), "Missing key 'disturbed' in 'm.json.rounds[0]'"),
])
def test_a_bad_field_is_named_by_its_path(tmp_path, change, message):
    data = json.loads(WRITTEN_BEFORE.read_text())
    change(data)
    with pytest.raises(RecordError) as error:
        read_measurement(_file(tmp_path, data), "m.json")
    assert str(error.value) == message


DESIGNS = [RoundsDesign(planned=9, stop_early=True, most=15, intervals=2),
           RoundsDesign(planned=9, stop_early=True, most=9, intervals=12),
           RoundsDesign(planned=8, stop_early=False, most=8, intervals=4)]


@pytest.mark.parametrize("design", DESIGNS)
def test_the_stop_rule_the_gate_and_the_merge_read_the_files_one_design(project, design):
    """The file's design changed in one place, its settings, changes all three: the merge of shards keeps it, the
    gate's ratios and contention are of it, and the stop rule's rounds run as it says."""
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    for stack in ("legacy", "candidate"):
        write_stack_model(out, stack, "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE])
    data = json.loads(WRITTEN_BEFORE.read_text())
    data["settings"].update(design.to_dict())
    shard = project / "shard"
    layout.measurement_file(shard, "vit-smoke", 1).parent.mkdir(parents=True)
    layout.measurement_file(shard, "vit-smoke", 1).write_text(json.dumps(data))
    manifest = shards.ShardManifest(tool_version=__version__, shard=shards.WHOLE, selection=("vit-smoke",),
                                    models=("vit-smoke",), stacks=("legacy", "candidate"), specs={}, host="")
    shards._merge_measurements(plan, [(shard, manifest)])  # the merge
    merged = load_measurement(out, "vit-smoke", 1)
    assert merged is not None and merged.design == design and merged.merged_from

    (model,) = gather(plan)  # the gate's ratios and the contention it reads
    (ratio,) = [r for r in model.ratios if r.threads == 1 and r.stack == "candidate"]
    sequential = (design.planned, design.most) if design.stop_early else (0, 0)
    assert (ratio.estimate.confidence, (ratio.estimate.planned, ratio.estimate.most)) == (design.confidence, sequential)
    assert (model.contention[1].intervals, model.contention[1].most) == (design.intervals, design.at_most)
    assert model.contention[1].needs == design.needs

    stacks = {name: {"status": "ok", "rounds": []} for name in ("legacy", "candidate")}  # the stop rule
    ran, clear = round_loop.stop_rule("legacy", ["candidate"], stacks, stacks, design=merged.design, threshold=1.05,
                                      min_delta_ms=0.0)
    assert ran == design and (clear is None) is not design.stop_early
    servers = {"legacy": scripted.ScriptedServer(lambda n: {"forward": [1.0]}, pid=1),  # straddles throughout
               "candidate": scripted.ScriptedServer(lambda n: {"forward": [1.02 if n % 2 else 1.08]}, pid=2)}
    tried, ended = round_loop.run_rounds(servers, stacks, ran, 1, None, clear,
                                         watch=scripted.scripted_watch(lambda n: False))
    assert (len(tried), ended) == (design.at_most, RoundsEnded.PLANNED)


def test_where_no_ratio_is_to_decide_the_design_the_rounds_run_with_stops_at_the_planned_rounds():
    design = RoundsDesign.of(planned=9, most_rounds=15, stop_early=True, intervals=2)
    assert design.most == 15 and design.looks == stats.sequential_looks(9, stats.interval_confidence(2), 15)
    ran, clear = round_loop.stop_rule("base", ["a"], {}, {"a": 1}, design=design, threshold=1.05, min_delta_ms=0.0)
    assert clear is None and ran == replace(design, most=9)
