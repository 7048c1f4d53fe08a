"""A command line or configuration that cannot run: exit 2, one message naming the file, key or
option and the fix, nothing written — through nox, as a user meets it, and before any venv is built."""

from __future__ import annotations

import pytest
from helpers.runs import nox, user_project

from upgrade_gate import layout


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[tool.upgrade-gate]\nmodels = [\n", "pyproject.toml: invalid TOML at line 2, column 0: unexpected end of file"),
        ("[tool.upgrade-gate.gates]\nlatency-ratio = 1.1\n", "pyproject.toml: tool.upgrade-gate.gates.latency-ratio: unknown key"),
        ('[tool.upgrade-gate]\nbaseline = "torch22"\n', "pyproject.toml: tool.upgrade-gate.baseline: no stack spec named 'torch22'; specs: candidate, legacy"),
        # Read when nox imports the noxfile: a traceback and exit 1 before they were caught there.
        ("[tool.upgrade-gate]\nrounds = 7\nrounds = 9\n",
         "pyproject.toml: invalid TOML at line 3, column 11: key 'rounds' is set twice; keep one"),
        ("[tool.upgrade-gate]\ntime-budget = nan\n",
         "pyproject.toml: tool.upgrade-gate.time-budget: must be a finite number, got nan"),
        ("[tool]\nupgrade-gate = 5\n", "pyproject.toml: tool.upgrade-gate: expected a table of settings, got 5"),
        ("[tool.upgrade-gate]\n# caf\udce9\n", "pyproject.toml: not UTF-8 text (byte 0xe9 at line 2)"),
    ],
)
def test_bad_configuration_exits_2_and_writes_nothing(tmp_path, config, message):
    env = user_project(tmp_path, config)
    out = tmp_path / "report"
    result = nox("-s", "compare", "--", "--out", str(out), env=env, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_malformed_stack_spec_exits_2(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    (tmp_path / "envs" / "candidate.toml").write_text('python = "3.11"\nrequirements = ["torch==2.8.0"\n')
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"), env=env, timeout=300)
    assert result.returncode == 2
    assert f"upgrade-gate: error: {tmp_path / 'envs' / 'candidate.toml'}: invalid TOML at line 2" in result.stderr
    assert not (tmp_path / "report").exists()


def test_an_empty_report_folder_name_exits_2(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    result = nox("-s", "compare", "--", "--out", "", env=env, timeout=300)
    assert result.returncode == 2 and "upgrade-gate: error: --out: empty; give a folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_model_name_exits_2_naming_it(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"), "--models", "vit-smoke,vit-tiny",
                 env=env, timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    # The models a user can pick (the tests' failure paths — hang, segfault, … — are not offered).
    assert errors == ["upgrade-gate: error: --models: unknown model 'vit-tiny' (did you mean 'vit-ti16'?); known "
                      "models: llama-smoke, llama32-1b-dims, minilm-l6, minilm-smoke, mobilenet-v3-small, nanovlm, "
                      "nanovlm-full, nanovlm-smoke, resnet18, smollm2-135m, vit-b14, vit-s14, vit-smoke, vit-ti16"
                      ], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "report").exists()


def test_a_misspelt_option_exits_2_with_the_one_it_was_meant_to_be(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"), "--modelz", "vit-smoke", env=env,
                 timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert errors == ["upgrade-gate: error: unknown option '--modelz' (did you mean --models?); usage: nox -s compare "
                      "-- [-h] [--out DIR] [--suite SUITE] [--models A,B]"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "report").exists()


def test_an_unwritable_report_folder_exits_2_before_any_work(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    (tmp_path / "taken").write_text("a file where the folder should go\n")
    out = tmp_path / "taken" / "report"
    result = nox("-s", "compare", "--", "--out", str(out), env=env, timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert errors == [f"upgrade-gate: error: {out}: report folder is not writable (Not a directory); "
                      "choose another with --out DIR"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_compat_without_a_project_table_exits_2_naming_it(tmp_path):
    env = user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    result = nox("-s", "compat", "--", "--out", str(tmp_path / "report"), env=env, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    error, = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert "pyproject.toml: tool.upgrade-gate.project: missing; say what to install and how to test" in error
    assert not (tmp_path / "report" / "compat.md").exists()


def test_measure_on_a_folder_where_a_stack_never_ran_exits_2_saying_what_to_run(tmp_path):
    env = user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    out = tmp_path / "report"
    layout.stack_file(out, "legacy").parent.mkdir(parents=True)
    layout.stack_file(out, "legacy").write_text("{}")
    result = nox("-s", "measure", "--", "--out", str(out), env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert errors == ["upgrade-gate: error: " + (
        f"{out}: stack candidate has not run in this report folder, so there is nothing of it to time; run "
        f"`nox -s compare -- --out {out}`, or `nox -s \"run(candidate)\" -- --out {out}` before "
        f"`nox -s measure -- --out {out}`")]


def test_a_stack_run_without_the_assets_its_models_read_exits_2_saying_how_to_build_them(tmp_path):
    """`compare` queues the assets session first; `run(<stack>)` alone on a fresh cache would have charged
    the model with the missing photos (an export failure) instead."""
    env = {**user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n'), layout.CACHE_ENV_VAR: str(tmp_path / "cache")}
    result = nox("-s", "run(legacy)", "--", "--out", str(tmp_path / "report"), "--models", "mobilenet-v3-small@fp32",
                 env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert error.endswith(": the assets photos that these models read are not built; run `nox -s assets -- --only "
                          "photos` first (`nox -s compare` builds them itself)"), error
    assert error.startswith(f"upgrade-gate: error: {tmp_path / 'cache' / 'assets'}"), error
