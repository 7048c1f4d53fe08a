"""--shard K/N splits a run's models; `nox -s report -- DIR...` merges the shard folders
into the report one run would give, and refuses folders that are not of one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.stack_records import REFERENCE, add_round_loads, write_stack_model

from upgrade_gate import pipeline
from upgrade_gate.config.plan import Shard, load_plan
from upgrade_gate.errors import ConfigError
from upgrade_gate.run import shards
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import GateStatus

MODELS = "vit-smoke@fp32,mobilenet-v3-small@fp32,minilm-smoke@fp32"


def plan_for(project: Path, *args: str):
    return load_plan(["--models", MODELS, *args], invoked_from=project, config_path=project / "pyproject.toml")


def test_shards_split_the_model_families_between_them(project):
    whole = load_plan(["--suite", "smoke"], invoked_from=project, config_path=project / "pyproject.toml")
    parts = [load_plan(["--suite", "smoke", "--shard", f"{k}/2"], invoked_from=project,
                       config_path=project / "pyproject.toml") for k in (1, 2)]
    names = [[m.name for m in p.models] for p in parts]
    assert sorted(names[0] + names[1]) == sorted(m.name for m in whole.models)
    assert not set(names[0]) & set(names[1])
    # A model and its variants run in one shard: their fixtures are made once.
    assert {m.base for m in parts[0].models}.isdisjoint({m.base for m in parts[1].models})
    assert parts[0].selection == parts[1].selection == tuple(m.name for m in whole.models)


@pytest.mark.parametrize("text, message", [
    ("3/2", "--shard: '3/2': K must be between 1 and N"),
    ("two", "--shard: 'two' is not K/N"),
])
def test_a_bad_shard_is_named(project, text, message):
    with pytest.raises(ConfigError, match=message):
        plan_for(project, "--shard", text)


def write_run(plan, stacks=("legacy", "candidate"), host=None) -> None:
    for model in plan.models:
        for stack in stacks:
            write_stack_model(plan.settings.out_dir, stack, model.name, eager=[REFERENCE],
                              artifact=[REFERENCE * (1.01 if model.name == "vit-smoke" and stack == "candidate"
                                                     else 1.0)],
                              latency_ms=2.0 if stack == "legacy" else 1.0)
            if host:
                for threads in plan.settings.threads:
                    path = plan.settings.out_dir / "measurements" / model.name / f"threads-{threads}.json"
                    data = json.loads(path.read_text())
                    data["stacks"][stack]["host"] = host
                    path.write_text(json.dumps(data))
        for stack in stacks:
            shards.describe(plan, stack)


def test_merged_shards_give_the_single_run_report(project):
    single = plan_for(project, "--out", "single")
    write_run(single)
    assert pipeline.report(single) == 1
    folders = []
    for stack in ("legacy", "candidate"):
        for k in (1, 2):
            part = plan_for(project, "--out", f"{stack}-{k}", "--shard", f"{k}/2")
            write_run(part, stacks=(stack,))
            folders.append(str(project / f"{stack}-{k}"))
    merged = plan_for(project, "--out", "merged", *folders)
    assert pipeline.report(merged) == 1

    def verdict(folder: str) -> dict:
        data = json.loads((project / folder / "verdict.json").read_text())
        return {"verdict": data["verdict"], "gates": data["gates"]}

    assert verdict("merged") == verdict("single")
    results = [json.loads((project / f / "results.json").read_text())["models"] for f in ("single", "merged")]
    for before, after in zip(*results):
        for model in (before, after):
            for stack in model["stacks"].values():
                stack.pop("cache")
        assert before == after


def test_times_from_two_machines_are_not_compared(project):
    folders = []
    for stack, host in (("legacy", "runner-a"), ("candidate", "runner-b")):
        part = plan_for(project, "--out", stack, "--shard", "1/1")
        write_run(part, stacks=(stack,), host=host)
        folders.append(str(project / stack))
    merged = plan_for(project, "--out", "merged", *folders)
    pipeline.report(merged)
    latency = [g for g in Results.load(project / "merged").verdict.gates if g.gate == "latency"]
    assert latency and all(g.status is GateStatus.INCONCLUSIVE and g.measured is None for g in latency)
    assert latency[0].note.startswith("not comparable: candidate was timed on runner-b, legacy on runner-a")


def test_shards_of_another_run_are_refused(project, capsys):
    folders = []
    for stack in ("legacy", "candidate"):
        part = plan_for(project, "--out", stack, "--shard", "1/1")
        write_run(part, stacks=(stack,))
        folders.append(project / stack)

    def merge(*args) -> str:
        with pytest.raises(SystemExit) as exit:
            pipeline.report(plan_for(project, "--out", "merged", *map(str, args)))
        assert exit.value.code == 2
        return capsys.readouterr().err

    assert "shard(s) 1/1 missing from the folders given" in merge(folders[0])
    assert f"{folders[1]} and {folders[1]} both hold shard 1/1 of stack 'candidate'" in merge(*folders, folders[1])
    manifest = json.loads((folders[1] / "shard.json").read_text())
    manifest["tool_version"] = "0.0.1"
    (folders[1] / "shard.json").write_text(json.dumps(manifest))
    assert f"{folders[1]}: made with another upgrade-gate version than this report" in merge(*folders)
    manifest["tool_version"] = json.loads((folders[0] / "shard.json").read_text())["tool_version"]
    manifest["specs"]["candidate"] = "0" * 64
    (folders[1] / "shard.json").write_text(json.dumps(manifest))
    assert f"{folders[1]}: made with another stack specs (envs/) than this report" in merge(*folders)
    assert f"{project / 'nowhere'}: not a shard folder (no shard.json)" in merge(folders[0], project / "nowhere")


def test_merged_shards_keep_each_stacks_round_loads(project):
    """Each stack-only shard recorded the load of its own rounds: the merged measurement has
    both stacks' loads per round, a round disturbed in either shard is not quiet, and no order
    within a round is claimed for stacks timed in separate jobs."""
    folders = []
    for stack, busy_round in (("legacy", 2), ("candidate", 5)):
        part = plan_for(project, "--out", stack, "--shard", "1/1", "--models", "vit-smoke@fp32")
        write_run(part, stacks=(stack,))
        for threads in part.settings.threads:
            add_round_loads(part.settings.out_dir, "vit-smoke", threads,
                            [(0.4, 1.8) if n == busy_round else (0.0, 0.02) for n in range(1, 8)])
        folders.append(str(project / stack))
    merged = plan_for(project, "--out", "merged", "--models", "vit-smoke@fp32", *folders)
    pipeline.report(merged)
    model = Results.load(project / "merged").models[0]
    assert set(model.contention) == set(merged.settings.threads)  # every thread count, or the loop proves nothing
    for contention in model.contention.values():
        assert contention.quiet_rounds() == {1, 3, 4, 6, 7}
        assert all(set(r.loads) == {"legacy", "candidate"} and r.order == () for r in contention.rounds)
        assert [load.others_cores for r in contention.rounds[:2] if (load := r.loads["legacy"])] == [0.02, 1.8]


def test_shard_folders_and_out_are_from_the_folder_the_command_ran_in(project, tmp_path):
    # nox runs sessions in the noxfile's folder; relative names are the user's, from where they typed them.
    here = tmp_path / "ci"
    here.mkdir()
    plan = load_plan(["--models", MODELS, "--out", "all", "shard-1", "shard-2"], invoked_from=here,
                     config_path=project / "pyproject.toml")
    assert plan.settings.out_dir == here / "all" and plan.merge == (here / "shard-1", here / "shard-2")


def test_shards_balance_the_families_by_cost(project):
    """The default suite's costs (models/suite.toml): SmolLM2's family alone against the five others, about
    as costly, instead of every other family in turn (which put SmolLM2 and nanoVLM in one part)."""
    from upgrade_gate.config.catalog import load_catalog

    parts = [load_plan(["--suite", "default", "--shard", f"{k}/2"], invoked_from=project,
                       config_path=project / "pyproject.toml") for k in (1, 2)]
    bases = [{m.base for m in part.models} for part in parts]
    assert bases == [{"smollm2-135m"}, {"vit-ti16", "vit-s14", "mobilenet-v3-small", "minilm-l6", "nanovlm"}]
    catalog = load_catalog()
    totals = [sum(catalog[b].cost for b in part) for part in bases]
    assert max(totals) <= 1.2 * min(totals), totals
    # Equal costs: every other family in turn; the costliest first, each to the part with less so far.
    assert [Shard(k, 2).families([1.0] * 5) for k in (1, 2)] == [{0, 2, 4}, {1, 3}]
    assert [Shard(k, 3).families([1.0, 5.0, 1.0, 2.0, 2.0]) for k in (1, 2, 3)] == [{1}, {3, 0}, {4, 2}]


def test_a_cost_that_is_not_a_positive_number_is_named(project):
    (project / "pyproject.toml").write_text(
        '[tool.upgrade-gate]\nsuite = "smoke"\n[tool.upgrade-gate.models.mine]\nfactory = "pkg.mod:make"\ncost = 0\n')
    with pytest.raises(ConfigError) as error:
        load_plan([], invoked_from=project, config_path=project / "pyproject.toml")
    assert "tool.upgrade-gate.models.mine.cost: expected a positive number" in str(error.value)
