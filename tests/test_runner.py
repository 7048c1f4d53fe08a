"""The export scheduler: how many exports run at once, and which run alone."""

from __future__ import annotations

import threading
import time

import numpy as np
from helpers.runs import plan_for
from helpers.stack_records import write_stack_model

from upgrade_gate.run import runner

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

    runner._export_all(plan, plan.models, fake_export)

    assert set(overlaps) == {m.name for m in plan.models}
    assert overlaps["llama32-1b-dims"] == set()
    assert most_at_once == plan.settings.export_jobs == 2


def test_the_costliest_exports_start_first_by_the_other_stacks_build_records(project):
    plan = plan_for(project, "--models", "mobilenet-v3-small,vit-smoke,llama-smoke")
    suite_order = [m.name for m in plan.models]
    # Nothing built yet: suite order.
    assert [m.name for m in runner.export_order(plan, "candidate")] == suite_order
    sizes = {"mobilenet-v3-small": (2_500_000, 1), "vit-smoke": (50_000, 1), "llama-smoke": (100_000, 2)}
    for model in plan.models:
        if model.name == "vit-smoke@int8-dynamic":
            continue  # one model no other stack has built: after the others, in suite order
        parameters, methods = sizes[model.base]
        write_stack_model(plan.settings.out_dir, "legacy", model.name, eager=[REFERENCE], artifact=[REFERENCE],
                          build_details={"parameters": parameters, "methods": ["m"] * methods})
    assert [m.name for m in runner.export_order(plan, "candidate")] == [
        "mobilenet-v3-small", "mobilenet-v3-small@int8", "llama-smoke", "llama-smoke@8da4w", "vit-smoke",
        "vit-smoke@int8-dynamic"]
    # A stack's own records are not its cost: the legacy stack has no other stack's.
    assert [m.name for m in runner.export_order(plan, "legacy")] == suite_order
