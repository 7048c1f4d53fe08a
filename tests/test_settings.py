from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from helpers.runs import plan_for

from upgrade_gate.config.gate_settings import GateSettings
from upgrade_gate.config.plan import load_plan
from upgrade_gate.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]




def error_for(project: Path, *posargs: str) -> str:
    with pytest.raises(ConfigError) as caught:
        plan_for(project, *posargs)
    return str(caught.value)


def set_config(project: Path, text: str) -> Path:
    path = project / "pyproject.toml"
    path.write_text(text)
    return path


def test_defaults(project):
    plan = plan_for(project)
    assert [s.name for s in plan.stacks] == ["legacy", "candidate"]
    assert plan.baseline.is_baseline and [c.name for c in plan.candidates] == ["candidate"]
    # Each model, then its quantized variants.
    assert [m.name for m in plan.models] == [
        "mobilenet-v3-small", "mobilenet-v3-small@int8", "vit-smoke", "vit-smoke@int8-dynamic",
        "llama-smoke", "llama-smoke@8da4w", "minilm-smoke", "nanovlm-smoke"]
    int8 = plan.models[1]
    assert (int8.base, int8.variant, int8.quantized, plan.models[0].quantized) == (
        "mobilenet-v3-small", "int8", True, False)
    settings = plan.settings
    assert (settings.variants, settings.localize_budget_s) == (("int8", "int8-dynamic", "8da4w"), 300.0)
    assert (settings.threads, settings.export_jobs, settings.warmup, settings.iterations) == ((1, 2), 2, 10, 50)
    assert (settings.rounds, settings.time_budget_s) == (9, 2.0)
    assert settings.out_dir == project / "report"
    assert settings.gates == GateSettings.defaults()
    assert settings.gates["artifact-size"].threshold == 1_500_000_000
    assert (settings.gates["numerics"].threshold, settings.gates["numerics"].severity) == (1e-4, "hard")
    assert (settings.gates["latency"].threshold, settings.gates["latency"].severity) == (1.05, "soft")
    legacy, candidate = plan.stacks
    assert [str(r) for r in legacy.requirements] == ["torch==2.2.2", "numpy<2", "torchvision==0.17.2"]
    assert "executorch==0.7.0" in [str(r) for r in candidate.requirements]
    assert "setuptools<81" in [str(r) for r in candidate.requirements]


def test_this_repositorys_own_configuration_loads():
    plan = load_plan([], invoked_from=REPO, config_path=REPO / "pyproject.toml")
    assert [m.name for m in plan.models if not m.quantized] == [
        "vit-ti16", "vit-s14", "mobilenet-v3-small", "smollm2-135m", "minilm-l6", "nanovlm",
    ]
    assert [m.name for m in plan.models if m.quantized] == [
        "vit-ti16@int8-dynamic", "vit-s14@int8-dynamic", "mobilenet-v3-small@int8", "smollm2-135m@int8-dynamic",
        "smollm2-135m@8da4w", "minilm-l6@int8-dynamic", "nanovlm@int8-dynamic",
    ]
    assert plan.settings.gates == GateSettings.defaults()


def test_posargs_override_out_and_models(project):
    plan = plan_for(project, "--out", "elsewhere", "--models", "vit-smoke, data-dependent-branch")
    assert plan.settings.out_dir == project / "elsewhere"
    assert [m.name for m in plan.models] == ["vit-smoke", "vit-smoke@int8-dynamic", "data-dependent-branch"]
    # A variant by name runs alone; @fp32 is the float model.
    picked = plan_for(project, "--models", "llama-smoke@8da4w,vit-smoke@fp32").models
    assert [(m.name, m.variant) for m in picked] == [("llama-smoke@8da4w", "8da4w"), ("vit-smoke", "fp32")]
    assert error_for(project, "--models", "vit-smoke@8da4w") == (
        "--models: vit-smoke has no variant '8da4w'; its variants: fp32, int8-dynamic")


def test_suite_option_picks_the_built_in_suite(project):
    full = [m.name for m in plan_for(project, "--suite", "full").models]
    assert {"vit-b14", "resnet18", "llama32-1b-dims", "nanovlm-full", "smollm2-135m"} <= set(full)
    assert "vit-smoke" not in full
    # The 1B export needs most of the memory: it runs beside no other export.
    assert [m.name for m in plan_for(project, "--suite", "full").models if m.exclusive] == [
        "llama32-1b-dims", "llama32-1b-dims@int8-dynamic", "llama32-1b-dims@8da4w"]
    # The option is read by the setting's own parser: one check, one message.
    assert error_for(project, "--suite", "huge") == "--suite: expected one of smoke, default, full, none; got 'huge'"


def test_project_models_join_the_suite(project):
    set_config(project, """
[tool.upgrade-gate]
suite = "none"
[tool.upgrade-gate.models]
tiny = "mypkg.nets:tiny"
other = { factory = "mypkg.nets:other", description = "our other net", exclusive = true, variants = [] }
[tool.upgrade-gate.extra-requirements]
"*" = ["-e ."]
candidate = ["mypkg-runtime==1.0"]
""")
    plan = plan_for(project)
    tiny, tiny_int8, other = plan.models
    assert (tiny_int8.name, tiny_int8.factory) == ("tiny@int8", "mypkg.nets:tiny")
    assert (tiny.name, tiny.factory, tiny.source, tiny.project_root) == ("tiny", "mypkg.nets:tiny", "project", project)
    assert (other.description, other.exclusive, tiny.exclusive) == ("our other net", True, False)
    assert plan.extra_requirements("candidate") == ["-e .", "mypkg-runtime==1.0"]
    assert plan.extra_requirements("legacy") == ["-e ."]
    assert [m.name for m in plan_for(project, "--models", "other").models] == ["other"]


def test_per_model_gate_thresholds(project):
    set_config(project, """
[tool.upgrade-gate.gates]
task = { min-cosine = 0.99 }
[tool.upgrade-gate.gates.models.vit-smoke]
max-rel-l2 = 1e-3
""")
    gates = plan_for(project).settings.gates
    assert gates.for_model("vit-smoke", "max-rel-l2") == 1e-3
    assert gates.for_model("llama-smoke", "max-rel-l2") == 1e-4
    assert gates.for_model("minilm-smoke", "min-cosine") == 0.99
    assert gates.for_model("minilm-smoke", "min-token-agreement") == 0.9


def test_a_third_spec_is_one_more_candidate(project):
    (project / "envs" / "next.toml").write_text((project / "envs" / "candidate.toml").read_text())
    plan = plan_for(project)
    assert [s.name for s in plan.stacks] == ["legacy", "candidate", "next"]
    assert [s.role for s in plan.stacks] == ["baseline", "candidate", "candidate"]


def test_gates_and_budgets_parse(project):
    set_config(project, """
[tool.upgrade-gate.gates]
export = "soft"
numerics = { max-rel-l2 = 1e-3 }
latency = { max-ratio = 1.2, severity = "off" }
[tool.upgrade-gate.gates.budgets.vit-smoke]
latency-p50-ms = 5
peak-rss-mb = 900
""")
    gates = plan_for(project).settings.gates
    assert gates["export"].severity == "soft"
    assert (gates["numerics"].threshold, gates["numerics"].severity) == (1e-3, "hard")
    assert (gates["latency"].threshold, gates["latency"].severity) == (1.2, "off")
    (model, budget), = gates.budgets
    assert (model, budget.latency_p50_ms, budget.peak_rss_mb, budget.severity) == ("vit-smoke", 5.0, 900.0, "hard")


# -- bad input: one message naming file and key ----------------------------------


def test_malformed_toml_names_file_and_line(project):
    path = set_config(project, "[tool.upgrade-gate]\nthreads = 1\nenvs = [\n")
    assert error_for(project) == f"{path}: invalid TOML at line 3, column 0: unexpected end of file"


def test_unknown_setting(project):
    path = set_config(project, "[tool.upgrade-gate]\nthread = 2\n")
    assert error_for(project) == (
        f"{path}: tool.upgrade-gate.thread: unknown key; expected one of: backends-budget, baseline, cache, candidates, diagnose-budget, "
        "envs, export-jobs, extra-requirements, gates, iterations, localize-budget, memory-limit, models, most-rounds, out, profile, project, rounds, stop-early, suite, "
        "targets, threads, "
        "time-budget, timeouts, variants, warmup, worker-start"
    )


def test_unknown_gate_key(project):
    path = set_config(project, "[tool.upgrade-gate.gates]\nlatncy = { max-ratio = 1.1 }\n")
    assert error_for(project) == (
        f"{path}: tool.upgrade-gate.gates.latncy: unknown key; expected one of: artifact-size, budgets, "
        "delegation, export, latency, memory, models, numerics, quantized, task"
    )


def test_unknown_gate_threshold_key(project):
    path = set_config(project, "[tool.upgrade-gate.gates]\nnumerics = { max-rel-l1 = 1e-4 }\n")
    assert error_for(project) == (
        f"{path}: tool.upgrade-gate.gates.numerics.max-rel-l1: unknown key; expected one of: max-rel-l2, severity"
    )


def test_bad_severity(project):
    path = set_config(project, '[tool.upgrade-gate.gates]\nexport = "strict"\n')
    assert error_for(project) == f"{path}: tool.upgrade-gate.gates.export: expected one of hard, soft, off, got 'strict'"


def test_wrong_type(project):
    path = set_config(project, '[tool.upgrade-gate]\nthreads = "two"\n')
    assert error_for(project) == (
        f"{path}: tool.upgrade-gate.threads: expected a thread count or a list of them like [1, 2], got 'two'")


@pytest.mark.parametrize(("value", "expected"), [("4", (4,)), ("[2, 1]", (2, 1))])
def test_thread_counts(project, value, expected):
    set_config(project, f"[tool.upgrade-gate]\nthreads = {value}\n")
    assert plan_for(project).settings.threads == expected


@pytest.mark.parametrize(("value", "message"), [
    ("[1, 1]", "a thread count appears twice in [1, 1]"),
    ("[1, 0]", "thread counts must be integers greater than 0, got 0"),
    ("[]", "expected a thread count or a list of them like [1, 2], got []"),
])
def test_bad_thread_counts(project, value, message):
    path = set_config(project, f"[tool.upgrade-gate]\nthreads = {value}\n")
    assert error_for(project) == f"{path}: tool.upgrade-gate.threads: {message}"


def test_too_few_rounds_for_a_95_percent_interval(project):
    path = set_config(project, "[tool.upgrade-gate]\nrounds = 5\n")
    assert error_for(project) == f"{path}: tool.upgrade-gate.rounds: must be at least 6, got 5"


def test_too_few_rounds_for_a_gates_intervals_together(project):
    """Each thread count is an interval of the latency gate, and they share its 95%: [min, max] of 6 rounds
    covers 96.9%, short of the 97.5% each of two needs (issue 37)."""
    path = set_config(project, "[tool.upgrade-gate]\nrounds = 6\n")
    assert error_for(project) == (f"{path}: tool.upgrade-gate.rounds: must be at least 7 with 2 thread counts (threads "
                                  "= [1, 2]): a latency gate's intervals, one per thread count and method, share its "
                                  "95%; got 6")
    set_config(project, "[tool.upgrade-gate]\nrounds = 6\nthreads = [1]\n")
    assert plan_for(project).settings.rounds == 6


def test_most_rounds_below_the_planned_ones(project):
    """`most-rounds` is where rounds that go on while an interval straddles stop: fewer than `rounds` would stop
    before the planned ones, so it is refused; equal to it, the rounds never go past them."""
    path = set_config(project, "[tool.upgrade-gate]\nrounds = 12\nmost-rounds = 10\n")
    assert error_for(project) == (f"{path}: tool.upgrade-gate.most-rounds: must be at least `rounds` (12; equal to "
                                  "it: never past them), got 10")
    set_config(project, "[tool.upgrade-gate]\nrounds = 12\nmost-rounds = 12\n")
    assert plan_for(project).settings.most_rounds == 12


def test_too_few_timed_runs(project):
    path = set_config(project, "[tool.upgrade-gate]\niterations = 20\n")
    assert error_for(project) == f"{path}: tool.upgrade-gate.iterations: must be at least 50, got 20"


def test_diagnostic_budgets_turn_off_at_zero(project):
    set_config(project, "[tool.upgrade-gate]\nbackends-budget = 0\nlocalize-budget = 0\n")
    settings = load_plan([], invoked_from=project, config_path=project / "pyproject.toml").settings
    assert (settings.backends_budget_s, settings.localize_budget_s) == (0, 0)
    path = set_config(project, "[tool.upgrade-gate]\nbackends-budget = -1\n")
    assert error_for(project) == f"{path}: tool.upgrade-gate.backends-budget: must be 0 (off) or more, got -1.0"


def test_the_profile_is_on_unless_turned_off(project):
    assert load_plan([], invoked_from=project, config_path=project / "pyproject.toml").settings.profile is True
    set_config(project, "[tool.upgrade-gate]\nprofile = false\n")
    assert load_plan([], invoked_from=project, config_path=project / "pyproject.toml").settings.profile is False
    path = set_config(project, "[tool.upgrade-gate]\nprofile = 0\n")
    assert error_for(project) == f"{path}: tool.upgrade-gate.profile: expected true or false, got 0"


def test_unknown_baseline_stack_file(project):
    path = set_config(project, '[tool.upgrade-gate]\nbaseline = "legacy22"\n')
    assert error_for(project) == f"{path}: tool.upgrade-gate.baseline: no stack spec named 'legacy22'; specs: candidate, legacy"


def test_missing_envs_folder(project):
    path = set_config(project, '[tool.upgrade-gate]\nenvs = "stacks"\n')
    assert error_for(project) == (f"{path}: tool.upgrade-gate.envs: {project / 'stacks'} is not a folder; give the "
                                  f"folder of your stack specs (*.toml), relative to {project}")


def test_without_an_envs_folder_the_built_in_stacks_are_compared(tmp_path):
    set_config(tmp_path, "[tool.upgrade-gate]\n")
    plan = plan_for(tmp_path)
    assert [(s.name, s.role, s.path) for s in plan.stacks] == [
        ("legacy", "baseline", REPO / "envs" / "legacy.toml"), ("candidate", "candidate", REPO / "envs" / "candidate.toml")]


def test_a_teams_spec_replaces_the_built_in_one_of_its_name_and_adds_its_others(tmp_path):
    (tmp_path / "envs").mkdir()
    own = (REPO / "envs" / "candidate.toml").read_text().replace('"torch==2.8.0"', '"torch==2.9.0"')
    (tmp_path / "envs" / "candidate.toml").write_text(own)
    (tmp_path / "envs" / "nightly.toml").write_text(own)
    set_config(tmp_path, "[tool.upgrade-gate]\n")
    plan = plan_for(tmp_path)
    assert [(s.name, s.path) for s in plan.stacks] == [
        ("legacy", REPO / "envs" / "legacy.toml"), ("candidate", tmp_path / "envs" / "candidate.toml"),
        ("nightly", tmp_path / "envs" / "nightly.toml")]
    assert "torch==2.9.0" in [str(r) for r in plan.stack("candidate").requirements]
    set_config(tmp_path, '[tool.upgrade-gate]\ncandidates = ["nightly"]\n')
    assert [(s.name, s.role) for s in plan_for(tmp_path).stacks] == [("legacy", "baseline"), ("nightly", "candidate")]


@pytest.mark.parametrize(("candidates", "error"), [
    ('["nightly"]', "tool.upgrade-gate.candidates: no stack spec named 'nightly'; specs: candidate, legacy"),
    ('["legacy"]', "tool.upgrade-gate.candidates: 'legacy' is the baseline; name the stacks to judge against it"),
    ('["candidate", "candidate"]', "tool.upgrade-gate.candidates: a name appears twice in ['candidate', 'candidate']"),
    ('"candidate"', "tool.upgrade-gate.candidates: expected an array, got 'candidate'"),
])
def test_candidates_name_specs_other_than_the_baseline(tmp_path, candidates, error):
    path = set_config(tmp_path, f"[tool.upgrade-gate]\ncandidates = {candidates}\n")
    assert error_for(tmp_path) == f"{path}: {error}"


def test_unknown_suite(project):
    path = set_config(project, '[tool.upgrade-gate]\nsuite = "tiny"\n')
    assert error_for(project) == f"{path}: tool.upgrade-gate.suite: expected one of smoke, default, full, none; got 'tiny'"


def test_project_model_factory_path_is_checked(project):
    path = set_config(project, '[tool.upgrade-gate.models]\nmine = "mypkg.nets.tiny"\n')
    assert error_for(project) == (
        f"{path}: tool.upgrade-gate.models.mine: expected \"package.module:function\", got 'mypkg.nets.tiny'"
    )


def test_project_model_may_not_take_a_built_in_name(project):
    path = set_config(project, '[tool.upgrade-gate.models]\nvit-smoke = "mypkg.nets:tiny"\n')
    assert error_for(project) == (
        f"{path}: tool.upgrade-gate.models.vit-smoke: 'vit-smoke' is a built-in model's name; rename the project's model"
    )


# The models a user is offered: each suite's (models/suite.toml read here, not through the catalog).
SUITE_MODELS = sorted(name for name, entry in tomllib.loads((REPO / "models" / "suite.toml").read_text()).items()
                      if entry.get("suites"))
TESTS_ONLY = ("hang", "segfault", "memory-hog", "killed-from-outside", "broken-submodule", "planted-operator")


def test_unknown_model_on_the_command_line_offers_the_suites_models_not_the_tests(project):
    # Issue 37: the list offered the tests' failure paths (hang, segfault, memory-hog, …) to a user.
    set_config(project, '[tool.upgrade-gate]\nsuite = "smoke"\n[tool.upgrade-gate.models]\nmy-net = "mypkg.nets:tiny"\n')
    assert error_for(project, "--models", "vit-ti17") == (
        f"--models: unknown model 'vit-ti17' (did you mean 'vit-ti16'?); known models: "
        f"{', '.join(sorted([*SUITE_MODELS, 'my-net']))}")
    assert error_for(project, "--models", "nope") == (
        f"--models: unknown model 'nope'; known models: {', '.join(sorted([*SUITE_MODELS, 'my-net']))}")
    assert not set(TESTS_ONLY) & set(SUITE_MODELS) and "vit-ti16" in SUITE_MODELS
    # Still there for the tests, by --models.
    assert [m.name for m in plan_for(project, "--models", "hang,segfault").models] == ["hang", "segfault"]


@pytest.mark.parametrize(("posargs", "message"), [
    (["--outdir", "x"], "unknown option '--outdir' (did you mean --out?); usage: nox -s compare --"),
    (["--modelz", "vit-smoke"], "unknown option '--modelz' (did you mean --models?); usage: nox -s compare --"),
    (["--modelz=vit-smoke"], "unknown option '--modelz=vit-smoke' (did you mean --models?); usage: nox -s compare --"),
    (["--colour"], "unknown option '--colour'; usage: nox -s compare --"),
])
def test_unknown_option_suggests_the_closest(project, posargs, message):
    assert error_for(project, *posargs).startswith(message)


def test_budget_for_unknown_model(project):
    path = set_config(project, "[tool.upgrade-gate.gates.budgets.resnet]\npeak-rss-mb = 10\n")
    assert error_for(project).startswith(
        f"{path}: tool.upgrade-gate.gates: gates for unknown model 'resnet'"
    )


# -- stack specs -------------------------------------------------------------------


def spec_error(project: Path, text: str) -> tuple[Path, str]:
    path = project / "envs" / "candidate.toml"
    path.write_text(text)
    return path, error_for(project)


GOOD_SPEC = 'python = "3.11"\nrequirements = ["torch==2.8.0"]\nadapter = "executorch_xnnpack"\n'


def test_spec_malformed_toml(project):
    path, message = spec_error(project, 'python = "3.11\n')
    assert message.startswith(f"{path}: invalid TOML at line 1")


def test_spec_unknown_key(project):
    path, message = spec_error(project, GOOD_SPEC + 'pyhton = "3.12"\n')
    assert message == (
        f"{path}: pyhton: unknown key; expected one of: adapter, description, exporter, python, requirements, runtime"
    )


def test_spec_bad_requirement(project):
    path, message = spec_error(project, GOOD_SPEC.replace('"torch==2.8.0"', '"torch==2.8.0", "executorch=0.7"'))
    assert message.startswith(f"{path}: requirements[1]: not a valid requirement 'executorch=0.7': ")


def test_spec_bad_python(project):
    path, message = spec_error(project, GOOD_SPEC.replace('"3.11"', '"three"'))
    assert message == f"{path}: python: not a Python version: 'three' (e.g. \"3.11\")"


def test_spec_unknown_adapter(project):
    path, message = spec_error(project, GOOD_SPEC.replace("executorch_xnnpack", "executorch_qnn"))
    assert message.startswith(f"{path}: adapter: no adapter 'executorch_qnn' in ")
    assert message.endswith("; known: executorch_xnnpack, torchscript_mobile")


def test_spec_missing_key(project):
    path, message = spec_error(project, 'python = "3.11"\nadapter = "executorch_xnnpack"\n')
    assert message == f"{path}: requirements: missing; every stack spec needs python, requirements and adapter"


# -- deadlines, memory, cache ---------------------------------------------------


def test_deadlines_per_stage_fall_back_to_the_default(project):
    set_config(project, "[tool.upgrade-gate.timeouts]\ndefault = 100\neager = 20\n")
    settings = plan_for(project).settings
    assert settings.timeout_s("eager") == 20 and settings.timeout_key("eager") == "eager"
    assert settings.timeout_s("latency") == 100 and settings.timeout_key("latency") == "default"
    assert settings.timeout_s("export") == 3600 and settings.timeout_s("start") == 600


def test_an_unknown_stage_in_timeouts_is_an_error(project):
    path = set_config(project, "[tool.upgrade-gate.timeouts]\nlowering = 20\n")
    message = error_for(project)
    assert message.startswith(f"{path}: tool.upgrade-gate.timeouts.lowering: unknown key; expected one of: backends, build,")


@pytest.mark.parametrize(
    ("value", "expected"),
    [('"12 GiB"', 12 * 2**30), ('"500MB"', 500 * 10**6), ("1000000", 10**6), ('"50%"', None)],
)
def test_memory_limit_forms(project, value, expected):
    set_config(project, f"[tool.upgrade-gate]\nmemory-limit = {value}\n")
    limit = plan_for(project).settings.memory_limit_bytes
    if expected is None:
        from upgrade_gate.config._kinds import total_memory_bytes

        assert abs(limit - total_memory_bytes() // 2) <= 1
    else:
        assert limit == expected


@pytest.mark.parametrize("value", ['"lots"', '"150%"', "-5", '"12 parsecs"'])
def test_a_bad_memory_limit_names_the_key(project, value):
    path = set_config(project, f"[tool.upgrade-gate]\nmemory-limit = {value}\n")
    assert error_for(project).startswith(f"{path}: tool.upgrade-gate.memory-limit: ")


def test_the_default_memory_limit_is_most_of_the_machine(project):
    from upgrade_gate.config._kinds import total_memory_bytes

    assert plan_for(project).settings.memory_limit_bytes == int(total_memory_bytes() * 0.85)


def test_fresh_and_the_cache_folder(project, monkeypatch):
    monkeypatch.setenv("UPGRADE_GATE_CACHE", str(project / "shared"))
    plan = plan_for(project)
    assert plan.settings.cache_dir == project / "shared" / "results" and not plan.fresh
    set_config(project, '[tool.upgrade-gate]\ncache = "my-cache"\n')
    plan = plan_for(project, "--fresh")
    assert plan.settings.cache_dir == project / "my-cache" and plan.fresh


# -- one declaration per setting ------------------------------------------------------


RICH = """
[tool.upgrade-gate]
suite = "smoke"
threads = [2, 1]
rounds = 9
time-budget = 0.5
memory-limit = "12 GiB"
variants = ["int8"]
localize-budget = 0
cache = "my-cache"
[tool.upgrade-gate.timeouts]
eager = 20
[tool.upgrade-gate.models]
tiny = { factory = "mypkg.nets:tiny", description = "ours", exclusive = true, variants = [] }
[tool.upgrade-gate.extra-requirements]
"*" = ["-e ."]
candidate = ["timm==1.0"]
[tool.upgrade-gate.gates]
export = "soft"
latency = { max-ratio = 1.2, min-delta-ms = 0.5, severity = "hard" }
[tool.upgrade-gate.gates.budgets.vit-smoke]
peak-rss-mb = 400
[tool.upgrade-gate.gates.models."vit-smoke@int8-dynamic"]
min-snr-db = 10
[tool.upgrade-gate.project]
root = "."
test = "python -m pytest tests"
[tool.upgrade-gate.project.allow]
"tests/test_a.py::test_b" = "known"
"""


@pytest.mark.parametrize("text", ["", RICH])
def test_the_effective_table_reads_back_as_it_was(project, text):
    from upgrade_gate.config.settings import Settings, load_settings

    settings = load_settings(set_config(project, text))
    table = json.loads(json.dumps(settings.to_dict()))  # as results.json holds it
    assert Settings.from_dict(table, path=settings.config_path) == settings
    assert table["memory-limit"] == settings.memory_limit_bytes and table["out"] == str(project / "report")


def test_pyprojects_commented_defaults_are_the_declarations():
    from upgrade_gate.config.settings import defaults_text

    assert defaults_text() in (REPO / "pyproject.toml").read_text()


def test_the_defaults_shown_are_the_defaults_loaded(tmp_path):
    """The commented table, loaded as a configuration, gives what no configuration gives."""
    import tomllib

    from upgrade_gate.config.settings import defaults_text, load_settings

    (tmp_path / "envs").mkdir()
    shown = tmp_path / "shown.toml"
    shown.write_text(defaults_text())
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert tomllib.loads(defaults_text())  # valid TOML
    assert load_settings(shown) == dataclasses.replace(load_settings(empty), config_path=shown)


def test_every_command_line_option_has_help_and_overrides_by_the_settings_parser(project):
    from upgrade_gate.config.plan import ARGUMENTS, parser

    usage = parser().format_help()
    assert all(argument.help_text() for argument in ARGUMENTS)
    assert "--out DIR" in usage and "(default: [tool.upgrade-gate] out)" in usage
    assert error_for(project, "--out", "") == "--out: empty; give a folder"
    assert error_for(project, "--suite", "tiny") == "--suite: expected one of smoke, default, full, none; got 'tiny'"


# -- bad input that used to be a traceback or a silent default ---------------------------


def test_a_key_set_twice_names_file_line_and_key(project):
    path = set_config(project, "[tool.upgrade-gate]\nrounds = 7\nrounds = 9\n")
    assert error_for(project) == f"{path}: invalid TOML at line 3, column 11: key 'rounds' is set twice; keep one"
    path = set_config(project, '[tool.upgrade-gate.gates]\nexport = "hard"\nexport = "soft"\n')
    assert error_for(project) == f"{path}: invalid TOML at line 3, column 16: key 'export' is set twice; keep one"


@pytest.mark.parametrize(("text", "where", "key"), [
    ("[tool.upgrade-gate]\nthreads = [1]\n[tool.upgrade-gate]\nrounds = 9\n", "line 3, column 19", "tool.upgrade-gate"),
    ("[tool.upgrade-gate]\ngates = { export = 'hard', export = 'soft' }\n", "line 2, column 43", "export"),
    ("[tool.upgrade-gate]\ngates.export = 'hard'\ngates.export = 'soft'\n", "line 3, column 22", "gates.export"),
])
def test_every_way_of_setting_a_key_twice_is_named_whatever_tomlkit_says(project, text, where, key):
    # tomlkit 0.13 raised KeyAlreadyPresent and 0.15 a ParseError: the message is the same with either.
    path = set_config(project, text)
    assert error_for(project) == f"{path}: invalid TOML at {where}: key {key!r} is set twice; keep one"


def test_a_file_that_is_not_utf8_is_named(project):
    path = project / "pyproject.toml"
    path.write_bytes("[tool.upgrade-gate]\n# café\n".encode("latin-1"))
    assert error_for(project) == f"{path}: not UTF-8 text (byte 0xe9 at line 2); TOML files are UTF-8: save it as UTF-8"


@pytest.mark.parametrize(("line", "key"), [
    ("time-budget = nan", "time-budget"), ("time-budget = inf", "time-budget"), ("localize-budget = -inf", "localize-budget"),
    ("[tool.upgrade-gate.gates]\nlatency = { max-ratio = nan }", "gates.latency.max-ratio"),
    ("[tool.upgrade-gate.timeouts]\nexport = inf", "timeouts.export"),
    ("[tool.upgrade-gate.gates.models.vit-smoke]\nmax-rel-l2 = nan", "gates.models.vit-smoke.max-rel-l2"),
])
def test_nan_and_inf_are_no_setting(project, line, key):
    path = set_config(project, f"[tool.upgrade-gate]\n{line}\n")
    assert error_for(project).startswith(f"{path}: tool.upgrade-gate.{key}: must be a finite number, got ")


@pytest.mark.parametrize("text", ["[tool]\nupgrade-gate = 5\n", 'tool = "x"\n'])
def test_a_settings_table_that_is_not_a_table_is_named(project, text):
    path = set_config(project, text)
    assert error_for(project).startswith(f"{path}: tool")
    assert "expected a table" in error_for(project)


def test_a_requirement_only_the_installer_would_refuse_is_refused_first(project):
    path, message = spec_error(project, GOOD_SPEC.replace('"torch==2.8.0"', '"torch===>2.8"'))
    assert message == (f"{path}: requirements[0]: not a valid requirement 'torch===>2.8': '===' (arbitrary equality) "
                       "with '>2.8', which is no version; write e.g. \"torch==2.8.0\" or \"torch>=2.8\"")
