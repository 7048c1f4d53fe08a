"""The export scheduler: how many exports run at once, and which run alone."""

from __future__ import annotations

import threading
import time

from test_settings import plan_for

from upgrade_gate import runner


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

    runner._export_all(plan, fake_export)

    assert set(overlaps) == {m.name for m in plan.models}
    assert overlaps["llama32-1b-dims"] == set()
    assert most_at_once == plan.settings.export_jobs == 2
