"""The results schema's codec (schema/codec.py): every record round-trips through its JSON,
its keys keep their order, an error names its JSON path, and an older file reads."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from upgrade_gate._atomic import to_json
from upgrade_gate.config.plan import Shard
from upgrade_gate.config.settings import Settings
from upgrade_gate.errors import RecordError
from upgrade_gate.releases import _table
from upgrade_gate.releases._table import Bisection, Release, ReleaseRecord
from upgrade_gate.run import shards
from upgrade_gate.run.shards import ShardManifest
from upgrade_gate.schema import codec, comparison, diagnosis, measured, project, results, stack, verdict
from upgrade_gate.schema.comparison import Attribution, Comparison, OutputMetrics, Side, TaskAgreement
from upgrade_gate.schema.diagnosis import CacheUse, Diagnosis
from upgrade_gate.schema.measured import (
    BusyRounds,
    DeviceLatency,
    DeviceMemory,
    LatencyRatio,
    LatencyReproducer,
    LatencySummary,
    Measured,
    RatioEstimate,
    RoundsEnded,
    Target,
)
from upgrade_gate.schema.measurement import Contention, RoundLoad, StackLoad
from upgrade_gate.schema.project import (
    CaseChange,
    Finding,
    NewWarning,
    OutcomeDiff,
    PatchedTests,
    ProjectResults,
    ProjectStack,
    RaisedWarning,
    Rewrite,
    ScanResults,
    TestRun,
)
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.records import Stage, StageError
from upgrade_gate.schema.results import ExtraRequirement, Installed, ModelResults, Results, StackInfo
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import (
    BaselineFinding,
    GateResult,
    GateStatus,
    JudgedArtifact,
    Quantity,
    Remedy,
    Severity,
    Unit,
    Verdict,
    VerdictRecord,
    WithRemedies,
)

# -- populated instances of every record ---------------------------------------------

QUANTITY = Quantity(value=1.099, unit=Unit.RATIO, low=1.062, high=1.177, level=0.961)
GATE = GateResult(gate="latency", stack="candidate", model="vit", severity=Severity.SOFT,
                  status=GateStatus.INCONCLUSIVE, metric="ratio", measured=QUANTITY, op="≤",
                  threshold=Quantity(value=1.1, unit=Unit.RATIO), condition="at 1 thread", note="forward",
                  evidence="measurements/vit/threads-1.json", blocked_by="export", warnings=("busy machine",),
                  not_reached=True)
FINDING = BaselineFinding(model="minilm", output="forward.output_0", rel_l2=2e-3, max_rel_l2=1e-4, snr_db=31.5,
                          min_snr_db=20.0, cosine=0.99, gate_min_cosine=0.999, failure="",
                          task={"min_cosine": 0.97})
VERDICT = VerdictRecord(tool_version="0.1.0", generated_at="2026-01-01T00:00:00+00:00", verdict=Verdict.NO_GO,
                        baseline="legacy", candidates={"candidate": Verdict.NO_GO, "other": Verdict.GO},
                        gates=(GATE,), baseline_findings=(FINDING,), warnings=("w",), incomplete=("i",),
                        remedies=(Remedy(stack="candidate", model="vit", gate="numerics", methods=("forward",),
                                         operators=("aten.gelu.default(approximate='tanh')",), passes=True,
                                         rel_l2=3e-7, threshold=1e-4, latency_ratio=RatioEstimate(
                                             median=1.01, low=0.99, high=1.03, per_round=(0.99, 1.01, 1.03)),
                                         threads=1, bytes=1000, shipped_bytes=990, code="partitioner = 1",
                                         reproducers=("stacks/candidate/models/vit/diagnose/repro/forward",)),),
                        with_remedies={"candidate": WithRemedies(
                            verdict=Verdict.GO_WITH_CONDITIONS, remedies=1, clears=("numerics (vit)",),
                            conditions=("forward ×1.2 against the shipped artifact",))},
                        artifacts=(JudgedArtifact(stack="candidate", model="vit", file="forward.pte", sha256="ab" * 32,
                                                  bytes=1000),))
OUTPUT = OutputMetrics(name="forward.output_0", shape=(1, 16), reference_shape=(1, 16), shape_match=True, finite=True,
                       reference_finite=True, max_abs=0.01, mean_abs=0.005, max_rel=0.02, rel_l2=0.01,
                       snr_db=math.inf, cosine=1.0, min_atol=0.01, reference_max_abs=1.0, reference_spread=2.0,
                       read_extent=(1, 4, 16))
TASK = TaskAgreement(kind="generation", values={"prompts": 2, "token_agreement": 0.5, "first_divergence": [3, None],
                                                "logits_snr_db": math.inf, "top5_overlap": None})
COMPARISON = Comparison(purpose="candidate artifact vs reference", actual=Side(stack="candidate", kind="artifact"),
                        reference=Side(stack="legacy", kind="eager"), missing=None, outputs=(OUTPUT,), task=TASK,
                        task_missing="no task", absent=(Side(stack="my(odd)stack", kind="eager"),), damaged="x.npz")
LATENCY = LatencySummary(runs=50, min_ms=1.0, p50_ms=2.0, p90_ms=3.0, p99_ms=4.0, trimmed_mean_ms=2.1, iqr_ms=0.5,
                         max_ms=9.0)
ESTIMATE = RatioEstimate(median=1.1, low=1.0, high=1.2, per_round=(1.0, 1.1, 1.2), confidence=0.95, level=0.961,
                         dropped=1)
MEASURED = Measured(status="ok", problem="slow", latency={"forward": LATENCY}, rounds={"forward": 9}, load_ms=12.5,
                    first_run_ms=3.25, runtime_memory_bytes=1 << 20, peak_rss_bytes=1 << 22, idle_rss_bytes=1 << 21,
                    image_input=True, host="ci-7")
LOAD = StackLoad(seconds=2.0, waited_share=0.01, others_cores=0.5, steal_share=0.0, run_queue=3)
ROUND = RoundLoad(round=1, order=("legacy", "candidate"), disturbed=True, loads={"legacy": LOAD, "candidate": None})
CONTENTION = Contention(threads=2, cores=4, cpu="Xeon", rounds=(ROUND,), most=9, ended=RoundsEnded.REPEATS_RAN_OUT,
                        intervals=4)
BUSY = BusyRounds(stack="candidate", threads=2, method="forward", per_round=(1.84, 2.35))
RATIO = LatencyRatio(stack="candidate", threads=2, method="forward", estimate=ESTIMATE)
STAGES = (Stage(stage="build", status="ok", duration_s=1.5, details={"fixtures": {"weights": "ab"}, "task": "generic"}),
          Stage(stage="save", status="ok", duration_s=0.5, details={"bytes": 1000}),
          Stage(stage="export", status="failed", duration_s=2.0, reason="r",
                error=StageError(type="ValueError", message="m", traceback_tail=("a", "b"), errno=28)))
DIAGNOSIS = Diagnosis(record_dir="stacks/candidate/models/vit/diagnose", cache=CacheUse(key="d"), stages=(
    Stage(stage="build", status="ok", duration_s=1.0, details={"methods": ["forward"]}),
    Stage(stage="search", status="ok", duration_s=9.0, details={"methods": {"forward": {
        "status": "found", "rel_l2": 2e-4, "culprits": [{"operator": "aten.gelu.default(approximate='tanh')"}]}}})))
STACK_RESULTS = StackResults(record_dir="stacks/candidate/models/vit", stages=STAGES, measured={2: MEASURED, 1: MEASURED},
                             export_peak_rss_bytes=10, runtime_phase_peak_rss_bytes=20,
                             cache={"export": CacheUse(key="k", reused_from="old"), "runtime": CacheUse(key=None)},
                             damaged=("x.npz",), diagnosis=DIAGNOSIS)
TARGET = Target(name="local", cpu="Some CPU", architecture="aarch64", cores=8, isa=("asimd", "i8mm"))
DEVICE = DeviceLatency(target=dataclasses.replace(TARGET, name="device:Pixel 8"), stack="candidate", threads=1,
                       method="forward", rounds=9, planned=9, candidate_p50_ms=1.5, baseline_p50_ms=2.0,
                       estimate=ESTIMATE, ended="decided", disturbed=2)
DEVICE_MEMORY = DeviceMemory(target=TARGET, stack="candidate", threads=1, candidate_bytes=3 << 20,
                             baseline_bytes=None, candidate_cold_ms=12.5, baseline_cold_ms=40.0)
UNJUDGED = DeviceLatency(target=TARGET, stack="candidate", threads=2, method="decode", rounds=0, planned=9,
                         missing="candidate, round 1: Killed")
MODEL = ModelResults(name="vit@int8", factory="models.vit:make", description="ViT", source="built-in",
                     variant="int8", task_kind="classification", stacks={"candidate": STACK_RESULTS},
                     comparisons=(COMPARISON,), ratios=(RATIO,), contention={2: CONTENTION}, busy_rounds=(BUSY,),
                     device_latency=(DEVICE, UNJUDGED), device_memory=(DEVICE_MEMORY,),
                     attributions=(Attribution(stack="candidate", method="forward", output="forward.output_0",
                                               quantization_rel_l2=0.03, lowering_rel_l2=math.inf, floor=1e-4,
                                               method_threshold=0.06, allowances={"output_0": 0.06}),),
                     latency_reproducer=LatencyReproducer(stack="candidate", threads=2, method="forward",
                                                          found_ratio=1.27, threshold=1.05, script="m/repro/repro.py",
                                                          exit_code=1, said="slower, as found"))
INSTALLED = Installed(python="3.12.1", executable="/venv/bin/python", platform="linux", cpu="x86_64", cpu_count=None,
                      architecture="x86_64", isa=("avx2", "fma"), torch_version="2.8.0",
                      distributions={"torch": "2.8.0", "timm": None})
EXTRA = ExtraRequirement(requirement="timm>=1.0", distribution="timm")
STACK_INFO = StackInfo(name="candidate", role="candidate", file="candidate.toml", description="d",
                       requirements=("torch==2.8.0",), exporter="executorch", runtime="xnnpack", installed=INSTALLED,
                       extra_requirements=(EXTRA, ExtraRequirement(requirement="-e .", distribution=None)),
                       packages={"timm": "1.0.9"})
CHANGE = CaseChange(test_id="tests/test_a.py::test_a", baseline="passed", candidate="failed", message="boom",
                    allowed="known")
DIFF = OutcomeDiff(newly_failing=(CHANGE,), still_failing=(dataclasses.replace(CHANGE, allowed=None),),
                   unused_allow=("tests/test_typo.py",))
RUN = TestRun(status="ran", command=("python", "-m", "pytest"), exit_code=1, duration_s=3.5, problem=None,
              install_error="e", installed={"torch": "2.8.0"})
NEW_WARNING = NewWarning(category="FutureWarning", message="m", location="a.py:1", count=2, tests=("t1", "t2"))
SCAN = ScanResults(torchfix="0.7.0", rules=11, files_scanned=40,
                   findings=(Finding(file="m.py", line=1, column=2, code="UG101", call="torch.jit.script(m)",
                                     summary="s", why="w", replacement="r", allowed="onnx export", rewritten=True),),
                   set_aside=(Finding(file="m.py", line=9, column=1, code="UG108", call="GradScaler()",
                                      summary="s", why="w", replacement="", set_aside="`TORCH_2_4` is True"),),
                   torch=("2.8.0",), unused_allow=("TOR102 old/*.py",), errors=(("bad.py", "SyntaxError"),),
                   rewrites=(Rewrite(file="m.py", sha256="ab" * 32, text="import torch\n"),))
PROJECT = ProjectResults(root="/team", install=("uv", "pip", "install", "."), test=("pytest",), allow={"t": "why"},
                         stacks={"legacy": ProjectStack(run=RUN, counts={"passed": 2}, junit="project/legacy/junit.xml",
                                                        warnings={"t1": 1}),
                                 "candidate": ProjectStack(run=None, counts={}, junit="j", problem="p",
                                                           warnings=None, warnings_problem="wp")},
                         diffs={"candidate": DIFF}, new_warnings={"candidate": (NEW_WARNING,)}, scan=SCAN,
                         scan_problem="sp", scan_file="project/scan-1.json",
                         patched={"candidate": PatchedTests(stack=ProjectStack(run=RUN, counts={"passed": 2}, junit="j"),
                                                            files=("m.py",), diff=DIFF)})
RESULTS = Results(tool_version="0.1.0", generated_at="2026-01-01T00:00:00+00:00", config_path="/team/pyproject.toml",
                  settings=Settings.from_dict({}, path=Path("/team/pyproject.toml")),
                  stacks={"candidate": STACK_INFO}, models=(MODEL,), project=PROJECT, verdict=VERDICT)
RELEASE = Release(executorch=Version("0.7.0"), released="2025-07-01", torch="2.8.0", torchvision="0.23.0", torchao=None,
                  numpy=">=2", pythons=("3.10", "3.12"), source="https://example.org")
EVERY = [QUANTITY, GATE, FINDING, VERDICT, OUTPUT, TASK, COMPARISON, LATENCY, ESTIMATE, MEASURED, LOAD, ROUND,
         CONTENTION, BUSY, RATIO, DEVICE, UNJUDGED, DEVICE_MEMORY, STACK_RESULTS, MODEL, INSTALLED, TARGET, EXTRA, STACK_INFO, CHANGE, DIFF, RUN, NEW_WARNING,
         SCAN.findings[0], SCAN, SCAN.rewrites[0], PROJECT.patched["candidate"], DIAGNOSIS, MODEL.attributions[0], MODEL.latency_reproducer, VERDICT.remedies[0], VERDICT.artifacts[0], VERDICT.with_remedies["candidate"], PROJECT.stacks["legacy"], PROJECT, RESULTS, CacheUse(key="k"),
         RaisedWarning(test="t", category="UserWarning", message="m", location="a.py:1", count=1),
         ShardManifest(tool_version="0.1.0", shard=Shard(2, 4), selection=("a", "b"), models=("a",), stacks=("x",),
                       specs={"x": "digest"}, host="ci"),
         RELEASE, ReleaseRecord(release=RELEASE, status="judged", reason="r", adapter="a", verdict=Verdict.GO,
                                models=("vit",), seconds=12.5),
         Bisection(gate="numerics", model="vit", states={"executorch-0.7.0": "fails"}, built=("executorch-0.7.0",),
                   answer="a", monotone=False, located=False)]


def through_json(record: Any) -> Any:
    """The record written as a file is, and read back."""
    data = json.loads(json.dumps(to_json(record.to_dict())))
    return type(record).from_reader(Reader(data, "file.json"))


@pytest.mark.parametrize("record", EVERY, ids=lambda r: type(r).__name__)
def test_every_record_reads_back_as_written(record):
    assert through_json(record) == record


def test_every_record_of_the_schema_is_round_tripped_here():
    modules = (verdict, comparison, measured, stack, diagnosis, results, project, _table, shards)
    records = {cls for module in modules for _, cls in inspect.getmembers(module, inspect.isclass)
               if issubclass(cls, codec.Record) and cls is not codec.Record and cls.__module__ == module.__name__}
    assert records - {type(r) for r in EVERY} == set()


# -- the JSON written: its keys, in their order --------------------------------------


def test_keys_and_their_order_are_the_files():
    assert list(MODEL.to_dict()) == ["model", "factory", "description", "source", "variant", "task", "fixtures",
                                     "stacks", "comparisons", "latency_ratios", "contention", "busy_rounds",
                                     "device_latency", "device_memory", "attributions", "latency_reproducer"]
    assert MODEL.to_dict()["contention"] == [CONTENTION.to_dict()]
    assert list(CONTENTION.to_dict()) == ["threads", "cores", "cpu", "rounds", "planned", "ended", "intervals"]
    assert CONTENTION.to_dict()["ended"] == "repeats ran out"
    assert MODEL.to_dict()["fixtures"] == {"candidate": {"weights": "ab"}}
    assert list(COMPARISON.to_dict()) == ["purpose", "actual", "reference", "missing", "worst_rel_l2", "worst_output",
                                          "outputs", "task", "task_missing", "absent", "damaged"]
    assert COMPARISON.to_dict()["absent"] == ["eager(my(odd)stack)"]
    assert MEASURED.to_dict() == {
        "status": "ok", "problem": "slow", "latency": {"forward": {**dataclasses.asdict(LATENCY), "per_second": 500.0}},
        "rounds": {"forward": 9}, "cold_start": {"load_ms": 12.5, "first_run_ms": 3.25},
        "memory": {"runtime_bytes": 1 << 20, "peak_rss_bytes": 1 << 22, "idle_rss_bytes": 1 << 21},
        "image_input": True, "host": "ci-7"}
    assert list(MEASURED.to_dict()) == ["status", "problem", "latency", "rounds", "cold_start", "memory",
                                        "image_input", "host"]
    assert list(STACK_RESULTS.to_dict()) == ["record_dir", "stages", "measured", "export_peak_rss_bytes",
                                             "runtime_phase_peak_rss_bytes", "cache", "damaged", "diagnosis",
                                             "remedied_measured", "artifact",
                                             "planned_memory_bytes", "runtime_memory_bytes"]
    assert list(STACK_RESULTS.to_dict()["measured"]) == ["2", "1"]
    assert list(STACK_INFO.to_dict()) == ["spec", "installed", "extra_requirements", "packages"]
    assert STACK_INFO.to_dict()["extra_requirements"] == [
        {"requirement": "timm>=1.0", "distribution": "timm", "version": "1.0.9"},
        {"requirement": "-e .", "distribution": None, "version": None}]
    assert list(RESULTS.to_dict()) == ["schema_version", "tool_version", "generated_at", "config", "settings",
                                       "stacks", "package_differences", "measured_on", "models", "project", "verdict"]
    assert list(VERDICT.to_dict()) == ["schema_version", "tool_version", "generated_at", "verdict", "baseline",
                                       "candidates", "gates", "baseline_findings", "warnings", "incomplete", "remedies",
                                       "with_remedies", "artifacts"]
    assert VERDICT.to_dict()["with_remedies"] == {"candidate": {
        "verdict": "GO-WITH-CONDITIONS", "remedies": 1, "clears": ["numerics (vit)"],
        "conditions": ["forward ×1.2 against the shipped artifact"]}}
    assert list(PROJECT.to_dict()) == ["root", "install", "test", "allow", "stacks", "diffs", "new_warnings",
                                       "package_changes", "scan", "scan_problem", "scan_file", "patched"]
    assert list(PROJECT.stacks["legacy"].to_dict()) == ["run", "problem", "counts", "junit", "warnings",
                                                        "warnings_problem"]
    assert SCAN.to_dict() == {"scanner": {"torchfix": "0.7.0", "rules": 11}, "files_scanned": 40,
                              "findings": [SCAN.findings[0].to_dict()], "set_aside": [SCAN.set_aside[0].to_dict()],
                              "torch": ["2.8.0"], "unused_allow": ["TOR102 old/*.py"],
                              "errors": [{"file": "bad.py", "error": "SyntaxError"}], "reused_from": None,
                              "rewrites": [{"file": "m.py", "sha256": "ab" * 32, "text": "import torch\n"}]}
    assert (SCAN.findings[0].to_dict()["allowed"], SCAN.findings[0].to_dict()["set_aside"]) == ("onnx export", "")
    assert list(CHANGE.to_dict())[0] == "test"
    assert list(ROUND.to_dict()) == ["round", "order", "disturbed", "load", "cut", "servers_ended"]


def test_spread_values_are_written_beside_the_others():
    assert RATIO.to_dict() == {"stack": "candidate", "threads": 2, "method": "forward", "median": 1.1, "low": 1.0,
                               "high": 1.2, "per_round": [1.0, 1.1, 1.2], "confidence": 0.95, "level": 0.961,
                               "dropped": 1, "planned": 0, "most": 0}
    assert list(FINDING.to_dict())[-3:] == ["failure", "stage", "min_cosine"]
    assert TASK.to_dict() == {"kind": "generation", **TASK.values, "first_divergence": [3, None]}


def test_release_records_keep_their_file():
    record = EVERY[-2]
    assert list(record.to_dict()) == ["record_version", "release", "name", "status", "reason", "adapter", "verdict",
                                      "models", "seconds", "reproducers"]
    assert record.to_dict()["name"] == "executorch-0.7.0" and record.to_dict()["release"]["executorch"] == "0.7.0"
    assert dataclasses.replace(record, seconds=12.345).to_dict()["seconds"] == 12.3


# -- errors name their path ----------------------------------------------------------


def results_json() -> dict[str, Any]:
    return json.loads(json.dumps(to_json(RESULTS.to_dict())))


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(RecordError) as raised:
        Results.from_reader(Reader(data, "results.json"))
    return str(raised.value)


def test_a_missing_required_key_is_named_with_its_path():
    data = results_json()
    del data["models"][0]["model"]
    assert error_of(data) == "Missing key 'model' in 'results.json.models[0]'"
    data = results_json()
    del data["stacks"]["candidate"]["spec"]
    assert error_of(data) == "Missing key 'spec' in 'results.json.stacks.candidate'"
    data = results_json()
    del data["stacks"]["candidate"]["spec"]["runtime"]
    assert error_of(data) == "Missing key 'runtime' in 'results.json.stacks.candidate.spec'"


@pytest.mark.parametrize(("path", "value", "message"), [
    (("models", 0, "stacks", "candidate", "measured", "2", "rounds", "forward"), "seven",
     "Unexpected type str (expected int) in 'results.json.models[0].stacks.candidate.measured.2.rounds.forward'"),
    (("models", 0, "comparisons", 0, "outputs", 0, "shape", 1), 1.5,
     "Unexpected type float (expected int) in 'results.json.models[0].comparisons[0].outputs[0].shape[1]'"),
    (("models", 0, "comparisons", 0, "outputs", 0, "rel_l2"), "small",
     "Unexpected type str (expected int or float) in 'results.json.models[0].comparisons[0].outputs[0].rel_l2'"),
    (("models", 0, "comparisons", 0, "outputs", 0, "finite"), 1,
     "Unexpected type int (expected bool) in 'results.json.models[0].comparisons[0].outputs[0].finite'"),
    (("models", 0, "comparisons", 0, "outputs", 0, "read_extent"), [1, 4],
     "Expected 3 items in 'results.json.models[0].comparisons[0].outputs[0].read_extent', got [1, 4]"),
    (("models", 0, "contention", 0, "rounds", 0, "load", "legacy", "run_queue"), True,
     "Unexpected type bool (expected int) in 'results.json.models[0].contention[0].rounds[0].load.legacy.run_queue'"),
    (("models", 0, "contention", 0, "ended"), "bored",
     "Unknown ended 'bored' in 'results.json.models[0].contention[0].ended'; expected one of planned, decided, "
     "repeats ran out, server ended"),
    (("models", 0, "stacks", "candidate", "measured"), {"one": {}},
     "Unexpected key 'one' (expected a whole number) in 'results.json.models[0].stacks.candidate.measured'"),
    (("models", 0, "comparisons", 0, "absent", 0), "weights(legacy)",
     "not a side: 'weights(legacy)' (expected eager(<stack>), quantized(<stack>), artifact(<stack>)) in "
     "'results.json.models[0].comparisons[0].absent[0]'"),
    (("models",), {}, "Unexpected type dict (expected list) in 'results.json.models'"),
    (("verdict", "gates", 0), "gate", "Unexpected type str (expected dict) in 'results.json.verdict.gates[0]'"),
    (("stacks", "candidate", "installed", "distributions", "timm"), 1,
     "Unexpected type int (expected str) in 'results.json.stacks.candidate.installed.distributions.timm'"),
])
def test_a_wrong_type_is_named_with_its_path(path, value, message):
    data = results_json()
    place = data
    for step in path[:-1]:
        place = place[step]
    place[path[-1]] = value
    assert error_of(data) == message


def test_an_unknown_enum_value_is_named_with_the_allowed_ones():
    data = results_json()
    data["verdict"]["gates"][0]["severity"] = "fatal"
    assert error_of(data) == "Unknown severity 'fatal' in 'results.json.verdict.gates[0].severity'; expected one of " \
                             "hard, soft"
    data = results_json()
    data["verdict"]["candidates"]["other"] = "MAYBE"
    assert error_of(data) == ("Unknown other 'MAYBE' in 'results.json.verdict.candidates.other'; expected one of GO, "
                              "GO-WITH-CONDITIONS, INCOMPLETE, NO-GO")


def test_a_null_where_a_value_is_required_is_a_wrong_type():
    data = results_json()
    data["models"][0]["factory"] = None
    assert error_of(data) == "Unexpected type NoneType (expected str) in 'results.json.models[0].factory'"


# -- older files ---------------------------------------------------------------------


def test_an_older_file_without_a_defaulted_field_still_reads():
    data = results_json()
    for key in ("reference_finite", "reference_max_abs", "reference_spread", "read_extent"):
        del data["models"][0]["comparisons"][0]["outputs"][0][key]
    for key in ("scan_file", "new_warnings"):
        del data["project"][key]
    del data["verdict"]["gates"][0]["warnings"]
    del data["stacks"]["candidate"]["packages"], data["stacks"]["candidate"]["extra_requirements"]
    del data["models"][0]["stacks"]["candidate"]["measured"]["2"]["memory"]
    del data["project"]["scan"]["scanner"]
    found = Results.from_reader(Reader(data, "results.json"))
    output = found.models[0].comparisons[0].outputs[0]
    assert output.reference_finite and output.reference_max_abs is None and output.read_extent is None
    assert found.project.scan_file == "project/scan.json" and found.project.new_warnings == {}
    assert found.verdict.gates[0].warnings == ()
    assert found.stacks["candidate"].packages == {} and found.stacks["candidate"].extra_requirements == ()
    assert found.models[0].stacks["candidate"].measured[2].runtime_memory_bytes is None
    assert (found.project.scan.torchfix, found.project.scan.rules) == ("?", 0)
    # Null reads as the default where the field cannot be None.
    data["project"]["stacks"]["legacy"]["run"]["duration_s"] = None
    assert Results.from_reader(Reader(data, "results.json")).project.stacks["legacy"].run.duration_s == 0.0


def test_a_2_10_verdict_reads_without_remedied_verdicts_and_its_unreached_gates_from_their_notes():
    """Before 2.11 a gate --fail-fast did not reach said so only at the start of its note, and verdict.json did
    not keep the remedied verdict."""
    data = json.loads(json.dumps(to_json(VERDICT.to_dict())))
    del data["with_remedies"]
    gate = data["gates"][0]
    del gate["not_reached"]
    gate.update(status="incomplete", note="not reached: --fail-fast stopped candidate's run at vit's failed numerics gate")
    found = VerdictRecord.from_reader(Reader(data, "verdict.json"))
    assert found.with_remedies == {} and found.gates[0].not_reached
    # Any other incomplete gate, and a gate whose note only mentions the words, was reached.
    gate["note"] = "machine busy: not reached: --fail-fast"
    assert not VerdictRecord.from_reader(Reader(data, "verdict.json")).gates[0].not_reached
    gate.update(status="passed", note="not reached: --fail-fast")
    assert not VerdictRecord.from_reader(Reader(data, "verdict.json")).gates[0].not_reached


def test_a_warning_outside_any_test_is_named_by_when_it_was_raised():
    data = {"test": "", "when": "collect", "category": "UserWarning", "message": "m", "location": "a.py:1", "count": 1}
    assert RaisedWarning.from_reader(Reader(data, "warnings.json")).test == "(collection)"


# -- the codec on its own ------------------------------------------------------------


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, kw_only=True, slots=True)
class Inner(codec.Record):
    n: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample(codec.Record):
    """Every kind of field the codec knows, one of each."""

    text: str = field(metadata=codec.key("name"))
    colour: Colour | None
    ratio: float = field(default=0.0, metadata=codec.group("numbers"))
    count: int = field(default=0, metadata=codec.group("numbers"))
    inner: Inner | None = None
    inners: tuple[Inner, ...] = ()
    by_threads: dict[int, Inner] = field(default_factory=dict)
    maybe: dict[str, Inner | None] = field(default_factory=dict)
    anything: dict[str, Any] = field(default_factory=dict)
    pair: tuple[str, int] | None = None

    DERIVED = (codec.derived("double", lambda s: 2 * s.count, after="numbers"), codec.derived("last", lambda s: 1))


def test_the_codec_writes_and_reads_each_kind_of_field():
    sample = Sample(text="a", colour=Colour.BLUE, ratio=-math.inf, count=3, inner=Inner(n=1), inners=(Inner(n=2),),
                    by_threads={4: Inner(n=4)}, maybe={"x": None, "y": Inner(n=5)}, anything={"k": [1, {"j": None}]},
                    pair=("p", 7))
    written = sample.to_dict()
    assert written == {"name": "a", "colour": "blue", "numbers": {"ratio": -math.inf, "count": 3}, "double": 6,
                       "inner": {"n": 1}, "inners": [{"n": 2}], "by_threads": {"4": {"n": 4}},
                       "maybe": {"x": None, "y": {"n": 5}}, "anything": {"k": [1, {"j": None}]}, "pair": ["p", 7],
                       "last": 1}
    assert list(written) == ["name", "colour", "numbers", "double", "inner", "inners", "by_threads", "maybe",
                             "anything", "pair", "last"]
    assert through_json(sample) == sample
    # Only the required fields: a value that may be None is still required, and may be null.
    assert Sample.from_reader(Reader({"name": "b", "colour": None}, "s")) == Sample(text="b", colour=None)
    with pytest.raises(RecordError, match=re.escape("Missing key 'colour' in 's'")):
        Sample.from_reader(Reader({"name": "b"}, "s"))
    with pytest.raises(RecordError, match=re.escape("Unexpected type list (expected object) in 's'")):
        Sample.from_reader(Reader([], "s"))


def test_a_derived_value_must_follow_a_key_the_record_writes():
    @dataclass(frozen=True, kw_only=True, slots=True)
    class Lost(codec.Record):
        n: int
        DERIVED = (codec.derived("m", lambda _: 0, after="nowhere"),)

    with pytest.raises(TypeError, match=r"Lost.DERIVED: \['m'\] follow no key it writes"):
        Lost(n=1).to_dict()


def test_a_method_in_the_multi_method_program_has_no_bytes_of_its_own():
    """A remedied method is sized against its own shipped file; a program's bytes are every method's."""
    program = {"file": "program.pte", "bytes": 900, "sha256": "p"}
    in_program = Stage(stage="save", status="ok", duration_s=0.5,
                       details={"bytes": 900, "program": "program.pte", "methods": {"prefill": program, "decode": program}})
    own_files = Stage(stage="save", status="ok", duration_s=0.5, details={"bytes": 1000, "methods": {
        "prefill": {"file": "prefill.pte", "bytes": 600, "sha256": "a"},
        "decode": {"file": "decode.pte", "bytes": 400, "sha256": "b"}}})
    shipped = StackResults(record_dir="stacks/candidate/models/llm", stages=(in_program,), measured={})
    separate = StackResults(record_dir="stacks/candidate/models/llm", stages=(own_files,), measured={})
    assert shipped.program == ("program.pte", 900, ("prefill", "decode")) and shipped.artifact_bytes == 900
    assert shipped.method_bytes("prefill") is None and shipped.method_bytes("vision") is None
    assert separate.program is None and (separate.method_bytes("prefill"), separate.method_bytes("decode")) == (600, 400)
