"""The export scheduler: how many exports run at once, and which run alone."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from helpers.runs import plan_for
from helpers.stack_records import write_remedied, write_stack_model

from upgrade_gate.run import cache, diagnosis, phases, runner

REFERENCE = np.ones((1, 4), dtype=np.float32)


def test_exports_share_the_machine_and_an_exclusive_one_runs_alone(project):
    plan = plan_for(project, "--suite", "full")
    lock = threading.Lock()
    active: list[str] = []
    overlaps: dict[str, set[str]] = {}
    most_at_once = 0

    def fake_export(model):
        nonlocal most_at_once
        with lock:
            overlaps[model.name] = set(active)
            for other in active:
                overlaps[other].add(model.name)
            active.append(model.name)
            most_at_once = max(most_at_once, len(active))
        time.sleep(0.05)
        with lock:
            active.remove(model.name)

    runner._in_parallel(plan, plan.models, fake_export)

    assert set(overlaps) == {m.name for m in plan.models}
    assert overlaps["llama32-1b-dims"] == set()
    assert most_at_once == plan.settings.export_jobs == 2


def test_the_costliest_exports_start_first_by_the_other_stacks_build_records(project):
    plan = plan_for(project, "--models", "mobilenet-v3-small,vit-smoke,llama-smoke")
    suite_order = [m.name for m in plan.models]

    def order(stack: str, phase: str = "export") -> list[str]:
        return [m.name for m in runner.phase_order(plan, stack, plan.models, phase)]

    # Nothing built yet: suite order.
    assert order("candidate") == suite_order
    sizes = {"mobilenet-v3-small": (2_500_000, 1), "vit-smoke": (50_000, 1), "llama-smoke": (100_000, 2)}
    for model in plan.models:
        if model.name == "vit-smoke@int8-dynamic":
            continue  # one model no other stack has built: after the others, in suite order
        parameters, methods = sizes[model.base]
        write_stack_model(plan.settings.out_dir, "legacy", model.name, eager=[REFERENCE], artifact=[REFERENCE],
                          build_details={"parameters": parameters, "methods": ["m"] * methods})
    assert order("candidate") == [
        "mobilenet-v3-small", "mobilenet-v3-small@int8", "llama-smoke", "llama-smoke@8da4w", "vit-smoke",
        "vit-smoke@int8-dynamic"]
    # The legacy stack's own records cover all but one model, and no other stack built any: suite order.
    assert order("legacy") == suite_order


def test_a_stacks_last_run_orders_its_phases_by_their_seconds(project):
    """Issue 40, item 3: where this stack's last run in the report folder recorded the phase for every model, the
    seconds it took order it (a diagnose phase by its own, which the exports' sizes say nothing of; an export with
    the diagnose phase that follows it)."""
    plan = plan_for(project, "--models", "vit-smoke,llama-smoke")
    out = plan.settings.out_dir
    took = {"vit-smoke": 0.3, "vit-smoke@int8-dynamic": 9.0, "llama-smoke": 2.0, "llama-smoke@8da4w": 0.1}
    for model in plan.models:
        directory = write_stack_model(out, "candidate", model.name, eager=[REFERENCE], artifact=[REFERENCE],
                                      build_details={"parameters": 1000, "methods": ["m"]})
        record = json.loads((directory / "export.json").read_text())
        for stage in record["stages"]:
            stage["duration_s"] = took[model.name] / len(record["stages"])
        (directory / "export.json").write_text(json.dumps(record))
    assert [m.name for m in runner.phase_order(plan, "candidate", plan.models, "export")] == [
        "vit-smoke@int8-dynamic", "llama-smoke", "vit-smoke", "llama-smoke@8da4w"]
    # The diagnose phase of two models, only one of which was diagnosed last time: not every model has its
    # seconds, so the sizes order them (all equal here: suite order).
    diagnosed = [m for m in plan.models if m.name in ("vit-smoke", "llama-smoke")]
    write_remedied(out, "candidate", "llama-smoke", remedy_outputs=[REFERENCE], latency_ms=None)
    assert [m.name for m in runner.phase_order(plan, "candidate", diagnosed, "diagnose")] == ["vit-smoke",
                                                                                             "llama-smoke"]
    write_remedied(out, "candidate", "vit-smoke", remedy_outputs=[REFERENCE], latency_ms=None)
    record_file = out / "stacks/candidate/models/vit-smoke/diagnose/diagnose.json"
    record = json.loads(record_file.read_text())
    record["stages"][0]["duration_s"] = 60.0  # vit-smoke's diagnose took 62 s, llama-smoke's 3 s
    record_file.write_text(json.dumps(record))
    assert [m.name for m in runner.phase_order(plan, "candidate", diagnosed, "diagnose")] == ["vit-smoke",
                                                                                             "llama-smoke"]
    # An export's job goes on with the model's diagnose phase: its cost counts both (0.3 + 62 s before 9 s).
    assert [m.name for m in runner.phase_order(plan, "candidate", plan.models, "export")] == [
        "vit-smoke", "vit-smoke@int8-dynamic", "llama-smoke", "llama-smoke@8da4w"]
    record["stages"][0]["duration_s"] = 0.5
    record_file.write_text(json.dumps(record))
    assert [m.name for m in runner.phase_order(plan, "candidate", diagnosed, "diagnose")] == ["llama-smoke",
                                                                                             "vit-smoke"]


def test_the_diagnose_phase_runs_where_a_float_artifact_departs_from_its_own_eager_model(project):
    plan = plan_for(project, "--models", "vit-smoke,mobilenet-v3-small")
    models = {m.name: m for m in plan.models}
    out, threshold = plan.settings.out_dir, plan.settings.gates.for_model("vit-smoke", "max-rel-l2")
    # An error of 2 × the threshold against its own eager outputs (relative L2 of a uniform offset).
    departed = REFERENCE + 2 * threshold * np.linalg.norm(REFERENCE) / np.sqrt(REFERENCE.size)
    write_stack_model(out, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[departed])
    write_stack_model(out, "candidate", "mobilenet-v3-small", eager=[REFERENCE], artifact=[REFERENCE * (1 + 1e-6)])
    write_stack_model(out, "candidate", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[departed * 1.5],
                      quantize="dynamic")
    found = diagnosis.departed_methods(plan, "candidate", models["vit-smoke"])
    assert list(found) == ["forward"] and 1.9 * threshold < found["forward"] < 2.1 * threshold
    assert diagnosis.diagnose_job(plan, "candidate", models["vit-smoke"]) == {
        "threshold": threshold, "methods": ["forward"], "budget_s": plan.settings.diagnose_budget_s,
        "artifacts": {"forward": "forward.pte"}, "rounds": plan.settings.rounds,
        "time_budget_s": plan.settings.time_budget_s, "max_slowdown": 1.05}  # the latency gate's max-ratio
    # Within the threshold; no records.
    assert diagnosis.diagnose_job(plan, "candidate", models["mobilenet-v3-small"]) is None
    assert diagnosis.diagnose_job(plan, "legacy", models["vit-smoke"]) is None
    # A quantized variant is judged by its own gate: 1.5 × the float outputs is an SNR of about 6 dB, below
    # the quantized gate's 20, so the candidate's searches which layers to keep in float ...
    snr = -20 * np.log10(np.linalg.norm(departed * 1.5 - REFERENCE) / np.linalg.norm(REFERENCE))
    assert diagnosis.below_gate_methods(plan, "candidate", models["vit-smoke@int8-dynamic"]) == \
        {"forward": pytest.approx(snr, abs=0.01)}
    assert diagnosis.diagnose_job(plan, "candidate", models["vit-smoke@int8-dynamic"]) == {
        "search": "keep-float", "variant": "int8-dynamic", "min_snr_db": 20, "min_cosine": 0.99,
        "methods": ["forward"], "budget_s": plan.settings.diagnose_budget_s, "artifacts": {"forward": "forward.pte"},
        "rounds": plan.settings.rounds, "time_budget_s": plan.settings.time_budget_s, "max_slowdown": 1.05}
    # ... which the baseline's never does (the quantized gates judge candidates); nor one within the gate (40 dB).
    write_stack_model(out, "legacy", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[departed * 1.5],
                      quantize="dynamic")
    assert diagnosis.diagnose_job(plan, "legacy", models["vit-smoke@int8-dynamic"]) is None
    write_stack_model(out, "candidate", "vit-smoke@int8-dynamic", eager=[REFERENCE], artifact=[REFERENCE * 1.01],
                      quantize="dynamic")
    assert diagnosis.diagnose_job(plan, "candidate", models["vit-smoke@int8-dynamic"]) is None
    # Turned off.
    (project / "pyproject.toml").write_text('[tool.upgrade-gate]\nsuite = "smoke"\ndiagnose-budget = 0\n')
    off = plan_for(project, "--models", "vit-smoke")
    assert diagnosis.diagnose_job(off, "candidate", off.models[0]) is None


def test_the_diagnose_phase_keeps_its_reproducers_folders_in_the_cache(tmp_path):
    folder = tmp_path / "model" / "diagnose"
    (folder / "repro" / "forward").mkdir(parents=True)
    (folder / "diagnose.json").write_text("{}")
    (folder / "diagnose-job.json").write_text("{}")  # the runner's own: not the phase's result
    (folder / "repro" / "forward" / "repro.py").write_text("print('repro')\n")
    (folder / "repro" / "forward" / "inputs.pt").write_bytes(b"\x00" * 100)
    files = phases._phase_files(folder, "diagnose")
    assert [f.relative_to(folder).as_posix() for f in files] == [
        "diagnose.json", "repro/forward/inputs.pt", "repro/forward/repro.py"]
    store = cache.ResultCache(tmp_path / "cache")
    store.store("candidate", "vit", "diagnose", "k1", files, {}, base=folder)
    hit, problem = store.lookup("candidate", "vit", "diagnose", "k1")
    assert problem is None and hit is not None
    assert (hit.path / "repro" / "forward" / "repro.py").read_text() == "print('repro')\n"
    assert set(hit.files) == {"diagnose.json", "repro/forward/inputs.pt", "repro/forward/repro.py"}


def offset(reference: np.ndarray, rel_l2: float) -> np.ndarray:
    """``reference`` moved by a uniform offset whose relative L2 against it is exactly ``rel_l2``."""
    return reference + rel_l2 * np.linalg.norm(reference) / np.sqrt(reference.size)


def test_a_quantized_variant_whose_lowering_departs_more_than_its_quantization_is_searched_for_operators(project):
    """The rule of judge/attribution.py: the artifact against its own quantized model run eagerly, weighed
    against that model against float. A lowering that zeroes the output (rel. L2 1 against the quantized model,
    whose quantization is 0.03: ~30 dB) is the lowering's: its operators are searched, the lowering allowed
    twice the quantization's error. One that adds 1.5 times the quantization's error is within the rule: the
    quantization is what departs, and its layers are searched."""
    plan = plan_for(project, "--models", "vit-smoke")
    variant = next(m for m in plan.models if m.name == "vit-smoke@int8-dynamic")
    out = plan.settings.out_dir
    quantized = offset(REFERENCE, 0.03)
    write_stack_model(out, "candidate", variant.name, eager=[REFERENCE], artifact=[-quantized],
                      quantize="dynamic", quantized=[quantized])
    job = diagnosis.diagnose_job(plan, "candidate", variant)
    assert job is not None and job["search"] == "quantized-lowering" and job["methods"] == ["forward"]
    assert job["thresholds"] == {"forward": pytest.approx(2 * 0.03)}
    assert job["output_thresholds"] == {"forward": {"output_0": pytest.approx(2 * 0.03)}}
    (found,) = diagnosis.lowering_departures(plan, "candidate", variant).values()
    assert found.lowering_rel_l2 == pytest.approx(2.0) and found.quantization_rel_l2 == pytest.approx(0.03)
    assert "SNR -6.0 dB against its own quantized model run eagerly" in found.said()
    assert "quantization is at SNR 30.5 dB" in found.said()
    # The judge keeps the same weighing in results.json, for the report to say: one rule, one floor (the float
    # numerics gate's max-rel-l2), made where the diagnose phase's search was chosen.
    from upgrade_gate.judge.gather import gather_model

    (kept,) = gather_model(plan, variant).attributions
    assert kept == found and kept.stack == "candidate" and kept.floor == plan.settings.gates.for_model(
        "vit-smoke", "max-rel-l2")

    quantized = offset(REFERENCE, 0.2)  # the quantization itself below the gate's 20 dB
    write_stack_model(out, "candidate", variant.name, eager=[REFERENCE], artifact=[offset(quantized, 0.3)],
                      quantize="dynamic", quantized=[quantized])
    assert diagnosis.lowering_departures(plan, "candidate", variant) == {}
    assert diagnosis.diagnose_job(plan, "candidate", variant)["search"] == "keep-float"
    # It did not lower at all: the same search, from the lowering's error, the lowering allowed twice what the
    # quantization alone departs.
    write_stack_model(out, "candidate", variant.name, eager=[REFERENCE], artifact=None, quantize="dynamic",
                      quantized=[offset(REFERENCE, 0.05)], failed_stage="export")
    job = diagnosis.diagnose_job(plan, "candidate", variant)
    assert job is not None and job["search"] == "quantized-lowering" and job["methods"] == ["forward"]
    assert job["thresholds"] == {"forward": pytest.approx(2 * 0.05)}
    # No quantized outputs (a module that did not run eagerly): nothing to weigh, the layers are searched.
    write_stack_model(out, "candidate", variant.name, eager=[REFERENCE], artifact=[-quantized], quantize="dynamic")
    assert diagnosis.diagnose_job(plan, "candidate", variant)["search"] == "keep-float"
    # Its recipe raised: no quantized model to weigh, nothing lowered; the capture's other options, every method,
    # judged by the quantized gates (and the baseline's own recipe failing is what ships today: no search).
    write_stack_model(out, "candidate", variant.name, eager=[REFERENCE], artifact=None, quantize="dynamic",
                      failed_stage="quantize")
    job = diagnosis.diagnose_job(plan, "candidate", variant)
    assert job is not None and (job["search"], job["methods"], job["variant"]) == ("quantize", ["forward"], "int8-dynamic")
    assert (job["min_snr_db"], job["min_cosine"]) == (plan.settings.gates.for_model(variant.name, "min-snr-db"),
                                                      plan.settings.gates.for_model(variant.name, "min-cosine"))
    write_stack_model(out, "legacy", variant.name, eager=[REFERENCE], artifact=None, quantize="dynamic",
                      failed_stage="quantize")
    assert diagnosis.diagnose_job(plan, "legacy", variant) is None
