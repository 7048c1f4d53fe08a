"""The release table, the range and options of `nox -s releases`, and the bisection (upgrade_gate.releases._table)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from packaging.version import Version

from upgrade_gate.config.specs import load_spec
from upgrade_gate.errors import ConfigError
from upgrade_gate.releases._table import FAILS, HOLDS_NOT, Bisect, bisect, load_table
from upgrade_gate.releases.explore import load_request

REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_table_reads_oldest_first_with_an_adapter_rule_for_every_release():
    table = load_table()
    versions = [r.executorch for r in table.releases]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert versions[0] == Version("0.2.0") and versions[-1] == Version("1.5.1")
    for release in table.releases:
        assert table.adapter_for(release) is not None, release.name
        assert table.python in release.pythons, f"{release.name} has no wheels for the table's Python"
    # The built-in candidate is the 0.7.0 row: the same torch, executorch and torchvision pins.
    candidate = load_spec(REPO / "envs" / "candidate.toml", adapters_dir=REPO / "compat", is_baseline=False)
    row = table.find("0.7.0", key="--from")
    pins = {str(r) for r in candidate.requirements if r.name in ("torch", "executorch", "torchvision")}
    assert pins <= set(table.requirements_of(row))
    assert table.adapter_for(row).adapter == candidate.adapter


def test_a_row_requires_its_pins_and_the_tables_shared_requirements_once():
    table = load_table()
    row = table.find("0.2.0", key="--from")
    assert table.requirements_of(row) == [
        "torch==2.3.0", "executorch==0.2.0", "torchvision==0.18.0", "numpy<2", "setuptools<81"]
    newest = table.find("executorch-1.5.1", key="--to")
    assert "torchao==0.18.0" in table.requirements_of(newest) and "numpy" in table.requirements_of(newest)


def test_releases_without_the_export_api_are_named_with_what_they_lack():
    table = load_table()
    old = table.adapter_for(table.find("0.3.0", key="--from"))
    assert old.adapter is None and "to_edge_transform_and_lower" in old.missing
    assert table.adapter_for(table.find("0.6.0", key="--from")).adapter == "executorch_xnnpack"


def test_the_range_is_inclusive_and_checked():
    table = load_table()
    chosen = table.between("0.7.0", "1.1.0")
    assert [str(r.executorch) for r in chosen] == ["0.7.0", "1.0.0", "1.0.1", "1.1.0"]
    assert table.between(None, "0.2.1")[0].executorch == Version("0.2.0")
    with pytest.raises(ConfigError, match="--from 1.1.0 is newer than --to 0.7.0"):
        table.between("1.1.0", "0.7.0")
    with pytest.raises(ConfigError, match=r"--to: no executorch 9\.9 in .*releases: 0\.2\.0"):
        table.between(None, "9.9")
    with pytest.raises(ConfigError, match="not a release version"):
        table.between("latest", None)


def write_table(tmp_path: Path, text: str) -> Path:
    """A table of one adapter rule and ``text``; its top-level keys (``requirements = …``) go first, as TOML wants."""
    path = tmp_path / "table.toml"
    top = text if text.startswith("requirements") else ""
    path.write_text(f'python = "3.11"\n{top}[[adapters]]\nexecutorch = ">=0.6"\nadapter = "executorch_xnnpack"\n'
                    + (ROW if top else text))
    return path


ROW = ('[[releases]]\nexecutorch = "0.7.0"\ntorch = "2.8.0"\ntorchvision = "0.23.0"\npythons = ["3.11"]\n'
       'source = "pyproject"\n')


@pytest.mark.parametrize("text, message", [
    ("", "releases: empty"),
    (ROW + ROW, "executorch 0.7.0 is listed twice"),
    (ROW.replace('torch = "2.8.0"', 'torch = "two"'), r"releases\[0\]\.torch: not a version: 'two'"),
    (ROW.replace('source = "pyproject"\n', ""), r"releases\[0\]\.source: missing"),
    (ROW + 'flavour = "x"\n', r"releases\[0\]\.flavour: unknown key"),
    (ROW + 'numpy = "2"\n', r"releases\[0\]\.numpy: not a version specifier"),
    ('[[adapters]]\nexecutorch = "<0.6"\nadapter = "nope"\n' + ROW, r"adapters\[1\]\.adapter: no adapter 'nope'"),
    ('[[adapters]]\nexecutorch = "<0.6"\n' + ROW, r"adapters\[1\]\.adapter: give either adapter"),
    ('[[adapters]]\nexecutorch = "0.6"\nmissing = "x"\n' + ROW, r"adapters\[1\]\.executorch: not a version spec"),
    # Issue 61, N19: a requirement that is none was blamed on the spec made from the table, after work had started.
    ('requirements = ["numpy", "setuptools<<81"]\n', r"requirements\[1\]: not a valid requirement 'setuptools<<81': "),
    ('requirements = ["numpy===>2"]\n', r"requirements\[0\]: not a valid requirement 'numpy===>2': '===' "),
    # A release's name is its stack's, its folder's and its venv's: the allowed shape.
    (ROW.replace('"0.7.0"', '"0.7.0+cpu"'), r"releases\[0\]\.executorch: the release's stack is named after it, and "
                                            r"'executorch-0\.7\.0\+cpu' is not a name upgrade-gate can use as a folder"),
])
def test_a_bad_table_names_its_file_and_key(tmp_path, text, message):
    path = write_table(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_table(path)
    assert str(caught.value).startswith(str(path))


def test_a_requirement_with_a_marker_makes_a_release_spec_that_reads(tmp_path):
    """The table's requirements go into each release's spec as the table wrote them: a marker's quotes included."""
    from upgrade_gate.releases.explore import release_spec

    marker = 'numpy; python_version < "3.12"'
    table = write_table(tmp_path, f"requirements = [{json.dumps(marker)}, \"setuptools<81\"]\n")
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    request = request_for(config, "--table", str(table))
    assert request.table.requirements_of(request.releases[0])[-2:] == [marker, "setuptools<81"]
    spec = release_spec(request, request.releases[0], "executorch_xnnpack")
    assert [str(r) for r in spec.requirements] == [
        "torch==2.8.0", "executorch==0.7.0", "torchvision==0.23.0", marker, "setuptools<81"]


@pytest.fixture
def smoke_config(tmp_path: Path) -> Path:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    return config


def request_for(config: Path, *posargs: str):
    return load_request(list(posargs), invoked_from=config.parent, config_path=config)


def test_a_request_judges_latency_at_one_thread_in_one_folder_per_release(smoke_config):
    request = request_for(smoke_config, "--from", "0.7.0", "--to", "1.0.1", "--models", "vit-smoke")
    assert [r.name for r in request.releases] == ["executorch-0.7.0", "executorch-1.0.0", "executorch-1.0.1"]
    settings = request.plan.settings
    assert settings.threads == (1,) and settings.backends_budget_s == 0 and settings.diagnose_budget_s == 0
    assert [m.name for m in request.plan.models] == ["vit-smoke", "vit-smoke@int8-dynamic"]
    assert request.folder(request.releases[0]) == smoke_config.parent / "report" / "releases" / "executorch-0.7.0"


def test_a_shard_takes_every_nth_release(smoke_config):
    parts = [request_for(smoke_config, "--from", "0.6.0", "--shard", f"{k}/3").releases for k in (1, 2, 3)]
    names = [r.name for part in parts for r in part]
    assert sorted(names) == sorted(r.name for r in load_table().between("0.6.0", None))
    assert all(parts)


@pytest.mark.parametrize("posargs, message", [
    (["--bisect", "numerics"], "--bisect: 'numerics' is not GATE:MODEL"),
    (["--bisect", "numerics:nanovlm"], "--bisect: 'nanovlm' is not among the models of this run"),
    (["--bisect", "numerics:vit-smoke", "--from", "1.5.1"], "a bisection needs at least two releases"),
    (["--bisect", "numerics:vit-smoke", "--shard", "1/2"], "--shard: a bisection decides which release"),
    (["--colour"], "unknown option '--colour'"),
    (["--bisect", "numerix:vit-smoke"], "--bisect: 'numerix:vit-smoke': no gate 'numerix'; a model's gates: same-inputs,"),
    (["--to", "0.1"], "--to: no executorch 0.1 in"),
    (["--table", "nowhere.toml"], "nowhere.toml: file not found"),
])
def test_bad_options_are_one_message(smoke_config, posargs, message):
    with pytest.raises(ConfigError) as caught:
        request_for(smoke_config, *posargs)
    assert message in str(caught.value)


# -- the bisection, on releases whose outcome the test decides --------------------------------


def bisect_over(outcomes: list[str], earlier: dict[int, str] | None = None):
    table = load_table()
    chosen = list(table.releases[:len(outcomes)])
    built: list[str] = []

    def judge(release):
        built.append(release.name)
        return outcomes[chosen.index(release)]

    def seen_before(release):
        return (earlier or {}).get(chosen.index(release))

    found = bisect(chosen, Bisect(gate="numerics", model="m"), judge, seen_before)
    assert list(found.built) == built  # each release built once, in the order the answer lists
    return chosen, found


@pytest.mark.parametrize("start", range(1, 16))
def test_a_bisection_finds_where_a_failure_starts_in_about_log2_builds(start):
    outcomes = [HOLDS_NOT] * start + [FAILS] * (16 - start)
    chosen, found = bisect_over(outcomes)
    assert f"starts failing between {chosen[start - 1].name} ({HOLDS_NOT}) and {chosen[start].name} ({FAILS})" \
        in found.answer
    assert len(found.built) <= math.ceil(math.log2(16)) + 2 and found.monotone


def test_a_bisection_finds_where_a_failure_stops():
    chosen, found = bisect_over([FAILS] * 5 + [HOLDS_NOT] * 4)
    assert f"stops failing between {chosen[4].name} (fails) and {chosen[5].name}" in found.answer


def test_a_release_that_cannot_be_judged_is_passed_over():
    outcomes = [HOLDS_NOT, HOLDS_NOT, "unknown (not installed)", "unknown (not installed)", FAILS, FAILS, FAILS]
    chosen, found = bisect_over(outcomes)
    assert f"between {chosen[1].name} ({HOLDS_NOT}) and {chosen[4].name} ({FAILS})" in found.answer
    assert f"could not be judged ({chosen[2].name}, {chosen[3].name})" in found.answer


def test_the_ends_that_cannot_be_judged_move_inwards():
    outcomes = ["unknown (not covered)", HOLDS_NOT, HOLDS_NOT, FAILS, "unknown (adapter does not load)"]
    chosen, found = bisect_over(outcomes)
    assert f"between {chosen[2].name} ({HOLDS_NOT}) and {chosen[3].name} ({FAILS})" in found.answer


def test_the_same_outcome_at_both_ends_builds_two_releases():
    chosen, found = bisect_over([FAILS] * 9)
    assert found.built == (chosen[0].name, chosen[8].name)
    assert "fails at both ends" in found.answer and "no change to locate" in found.answer


def test_earlier_evidence_that_contradicts_the_answer_is_called_not_monotone():
    outcomes = [HOLDS_NOT] * 3 + [FAILS] * 6
    # A run before this one judged release 7 and saw the failure gone there.
    chosen, found = bisect_over(outcomes, earlier={7: HOLDS_NOT})
    assert not found.monotone and f"{chosen[7].name} {HOLDS_NOT}" in found.answer
    chosen, found = bisect_over([FAILS] * 9, earlier={4: HOLDS_NOT})
    assert not found.monotone and "not monotone" in found.answer


def test_nothing_judgeable_is_said_so():
    chosen, found = bisect_over(["unknown (not installed)"] * 3)
    assert "could not be judged at two releases" in found.answer and not found.located


@pytest.mark.parametrize("error, the_release", [
    # uv 0.13's words, seen here: a version the index does not have, and no wheel for the table's Python.
    ("error: No solution found when resolving dependencies cause: Because there is no version of executorch==1.9.0 "
     "and you require executorch==1.9.0, we can conclude that your requirements are unsatisfiable.", True),
    ("error: No solution found when resolving dependencies cause: Because executorch==0.2.0 has no wheels with a "
     "matching Python ABI tag (e.g., `cp313`) and you require executorch==0.2.0, we can conclude that your "
     "requirements are unsatisfiable.", True),
    ("error: Failed to fetch: `https://files.example/torch.whl` Caused by: error sending request", False),
    ("error: Failed to install: torch-2.9.0 Caused by: No space left on device (os error 28)", False),
])
def test_only_the_index_refusing_a_row_is_the_releases_fault(error, the_release):
    from upgrade_gate.releases.explore import refused_by_the_index

    assert refused_by_the_index(error) is the_release


def test_the_sample_workflows_commands_are_requests_the_explorer_takes(smoke_config):
    """docs/ci/releases.yml: each matrix job's command and the merge job's, as its shell expands them."""
    workflow = (REPO / "docs" / "ci" / "releases.yml").read_text()
    matrix, merge = [line.split("run: upgrade-gate releases -- ", 1)[1].split(" || ")[0]
                     for line in workflow.splitlines() if line.strip().startswith("run: upgrade-gate releases ")]
    expand = {"${{ inputs.from }}": "0.6.0", "${{ inputs.to }}": "1.5.1"}
    for variable, value in expand.items():
        matrix, merge = matrix.replace(variable, value), merge.replace(variable, value)
    in_range = [r.name for r in load_table().between("0.6.0", "1.5.1")]
    shares = [[r.name for r in request_for(smoke_config, *matrix.replace("${{ matrix.part }}", str(k)).split()).releases]
              for k in (1, 2, 3, 4)]
    # The four jobs build every release in range between them, each once.
    assert sorted(name for share in shares for name in share) == sorted(in_range) and all(shares)
    # The merge job: the parts the artifacts download to (parts/part-K/releases/…), the whole range.
    parts = [smoke_config.parent / "parts" / f"part-{k}" for k in (1, 2, 3, 4)]
    for part in parts:
        (part / "releases").mkdir(parents=True)
    request = request_for(smoke_config, *merge.replace("parts/*", " ".join(map(str, parts))).split())
    assert request.merge == tuple(parts) and [r.name for r in request.releases] == in_range


def gates_of(release: str, statuses: dict[tuple[str, str], str]):
    from upgrade_gate.schema.verdict import GateResult, GateStatus, Severity

    return [GateResult(gate=gate, stack=release, model=model, severity=Severity.SOFT if gate == "latency" else
                       Severity.HARD, status=GateStatus(status), metric="x") for (gate, model), status in
            statuses.items()]


def test_a_finding_is_followed_to_where_it_appears_and_where_it_is_gone():
    from upgrade_gate.releases._upgrade_path import findings_from

    order = ["executorch-0.7.0", "executorch-1.0.0", "executorch-1.0.1", "executorch-1.1.0", "executorch-1.2.0"]
    numerics = ["passed", "failed", "failed", "passed", "passed"]
    latency = ["failed", "passed", "incomplete", "failed", "blocked"]
    gelu = ["failed"] * 5
    found = findings_from({release: gates_of(release, {
        ("numerics", "vit"): numerics[i], ("latency", "vit"): latency[i], ("numerics", "nanovlm"): gelu[i],
        ("export", "vit"): "passed"}) for i, release in enumerate(order)})
    # Hard findings first; a gate that never failed is none.
    assert [(f.gate, f.model) for f in found] == [("numerics", "nanovlm"), ("numerics", "vit"), ("latency", "vit")]
    gelu_finding, vit, slow = found
    assert gelu_finding.failing == tuple(order) and gelu_finding.appeared_after is None and gelu_finding.gone_in is None
    assert "fails from the oldest release judged (executorch-0.7.0)" in gelu_finding.summary()
    assert "still fails in the newest release judged (executorch-1.2.0)" in gelu_finding.summary()
    assert vit.failing == ("executorch-1.0.0", "executorch-1.0.1")
    assert (vit.appeared_after, vit.gone_in) == ("executorch-0.7.0", "executorch-1.1.0")
    assert "appears in executorch-1.0.0 (passed in executorch-0.7.0); gone in executorch-1.1.0" in vit.summary()
    # Comes and goes: each release's status is kept, and the newest failure is not called gone.
    assert slow.failing == ("executorch-0.7.0", "executorch-1.1.0") and slow.gone_in is None
    assert slow.statuses["executorch-1.0.1"] == "incomplete" and slow.severity == "soft"
    assert "last fails in executorch-1.1.0, and no later release passed it" in slow.summary()


def test_prune_and_keep_stacks_exclude_each_other(smoke_config):
    assert request_for(smoke_config, "--prune").prune
    with pytest.raises(ConfigError, match="--prune: --prune removes what --keep-stacks keeps"):
        request_for(smoke_config, "--prune", "--keep-stacks")


def records_of(*outcomes: str):
    from upgrade_gate.releases._table import JUDGED, ReleaseRecord
    from upgrade_gate.schema.verdict import Verdict

    table = load_table()
    rows = table.between("0.7.0", None)
    return [ReleaseRecord(release=rows[i], status=JUDGED, verdict=Verdict(outcome)) if outcome in
            {v.value for v in Verdict} else ReleaseRecord(release=rows[i], status=outcome)
            for i, outcome in enumerate(outcomes)]


def test_the_newest_fit_release_is_recommended_with_what_the_newer_ones_said():
    from upgrade_gate.releases._upgrade_path import recommend

    records = records_of("GO", "GO-WITH-CONDITIONS", "NO-GO", "not installed")
    best, text, undecided = recommend(records, [], ["vit-smoke"])
    assert best == "executorch-1.0.0" and not undecided
    assert "GO-WITH-CONDITIONS; newer: executorch-1.0.1 NO-GO" in text


def test_an_incomplete_release_newer_than_the_answer_leaves_it_undecided():
    from upgrade_gate.releases._upgrade_path import UpgradePath, recommend

    records = records_of("GO", "INCOMPLETE", "NO-GO")
    best, text, undecided = recommend(records, [], ["vit-smoke"])
    assert best == "executorch-0.7.0" and undecided == ("executorch-1.0.0",) and "Not decided: executorch-1.0.0" in text
    path = UpgradePath(baseline="legacy", models=("vit-smoke",), records=tuple(records), rows=(), findings=(),
                       recommendation=best, recommendation_text=text, undecided=undecided)
    assert path.exit_code() == 3
    # Nothing judged at all: undecided too, never a NO-GO; judged and none fit: 1.
    assert dataclasses.replace(path, records=tuple(records_of("not covered", "not installed")), undecided=(),
                               recommendation=None).exit_code() == 3
    assert dataclasses.replace(path, records=tuple(records_of("NO-GO", "NO-GO")), undecided=(),
                               recommendation=None).exit_code() == 1


def test_none_in_range_names_what_blocks_each_release():
    from upgrade_gate.releases._upgrade_path import findings_from, recommend

    records = records_of("NO-GO", "NO-GO", "not covered")
    findings = findings_from({r.release.name: gates_of(r.release.name, {("numerics", "nanovlm"): "failed"})
                              for r in records[:2]})
    best, text, _ = recommend(records, findings, ["nanovlm"])
    assert best is None
    assert text == ("**none in range**: executorch-0.7.0: numerics for nanovlm; executorch-1.0.0: numerics for "
                    "nanovlm; executorch-1.0.1: not covered")


def test_every_gate_the_policy_gives_a_model_can_be_bisected():
    import re

    from upgrade_gate.judge import _latency_gates, _model_gates
    from upgrade_gate.judge.policy import MODEL_GATES

    source = "".join(Path(module.__file__).read_text() for module in (_model_gates, _latency_gates))
    named = set(re.findall(r'found\.(?:add|missing)\("([a-z-]+)"', source))
    named |= {f"{prefix}{kind}" for prefix in re.findall(r'f"((?:quantized-)?task-)\{model\.task_kind\}"', source)
              for kind in ("classification", "embedding", "generation")}
    assert named and named <= set(MODEL_GATES), named - set(MODEL_GATES)


# -- issue 26: a team with a project table, and the exit status of a bisection ------------------------

NOT_RUN = ("the project's tests and API scan are not run per release: copy a release's spec "
           "(releases/<release>/<release>.toml) into your stack specs' folder as candidate.toml and run "
           "`nox -s compat` to judge them")


def test_a_team_with_a_project_table_gets_a_recommendation_and_is_told_what_was_not_run(tmp_path, monkeypatch):
    from upgrade_gate.releases._upgrade_path import not_run_per_release, recommend

    monkeypatch.delenv("UPGRADE_GATE_COMMAND", raising=False)
    assert not_run_per_release() == NOT_RUN
    best, text, undecided = recommend(records_of("GO", "NO-GO"), [], ["vit-smoke"], NOT_RUN)
    assert best == "executorch-0.7.0" and not undecided
    assert text == ("**executorch-0.7.0** (torch 2.8.0): the newest release in range with no hard failure on "
                    f"vit-smoke — GO; newer: executorch-1.0.0 NO-GO. Judged on the models alone: {NOT_RUN}")
    # Installed, the advice names the command the team types.
    monkeypatch.setenv("UPGRADE_GATE_COMMAND", "upgrade-gate")
    assert not_run_per_release().endswith("run `upgrade-gate compat` to judge them")


def test_releases_do_not_judge_the_project_they_do_not_run(tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n[tool.upgrade-gate.project]\n'
                      'install = ["-e", "."]\ntest = "python -m pytest"\n')
    request = request_for(config, "--from", "0.7.0", "--to", "1.0.0", "--models", "vit-smoke")
    # No project gates in a release's verdict: they could only say "incomplete" and hold every release there.
    assert request.plan.settings.project is None
    assert request.not_run == NOT_RUN
    without = tmp_path / "plain" / "pyproject.toml"
    without.parent.mkdir()
    without.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    assert request_for(without).not_run == ""


def test_a_bisection_exits_as_its_recommendation_does():
    from upgrade_gate.releases._table import Bisection
    from upgrade_gate.releases._upgrade_path import UpgradePath, recommend

    located = Bisection(gate="numerics", model="nanovlm", states={}, built=(), answer="fails at both ends")
    for outcomes, status in ((("NO-GO", "NO-GO"), 1), (("GO", "NO-GO"), 0), (("NO-GO", "INCOMPLETE"), 3)):
        records = records_of(*outcomes)
        best, text, undecided = recommend(records, [], ["nanovlm"])
        path = UpgradePath(baseline="legacy", models=("nanovlm",), records=tuple(records), rows=(), findings=(),
                           recommendation=best, recommendation_text=text, undecided=undecided, bisection=located)
        assert path.exit_code() == status, (outcomes, text)


def test_merge_folders_and_out_are_from_the_folder_the_command_ran_in(smoke_config, tmp_path):
    here = tmp_path / "ci"
    here.mkdir()
    request = load_request(["--out", "all", "part-1", "part-2"], invoked_from=here, config_path=smoke_config)
    assert request.merge == (here / "part-1", here / "part-2") and request.out == here / "all"


def test_compares_reproducers_are_shown_beside_the_finding_release_by_release(tmp_path):
    from upgrade_gate.releases._reproducers import ReproducerRun
    from upgrade_gate.releases._table import RECORD, read_record
    from upgrade_gate.releases._upgrade_path import Finding, UpgradePath, upgrade_path_blocks
    from upgrade_gate.report.render import to_markdown

    script = "stacks/candidate/models/nanovlm/diagnose/repro/vision_encoder/repro.py"
    said = {1: "relative L2 error 0.000196 against eager (threshold 0.0001)", 0: "relative L2 error 2.4e-08"}
    records = [dataclasses.replace(record, reproducers=(ReproducerRun(
        model="nanovlm", method="vision_encoder", script=script, exit_code=code, said=said[code]),))
        for record, code in zip(records_of("NO-GO", "NO-GO", "GO"), (1, 1, 0))]
    # Written and read back as release.json is.
    (tmp_path / RECORD).write_text(json.dumps(records[2].to_dict()))
    assert read_record(tmp_path, load_table()) == records[2]
    names = [r.release.name for r in records]
    finding = Finding(gate="numerics", model="nanovlm", severity="hard",
                      statuses=dict(zip(names, ("failed", "failed", "passed"))), failing=tuple(names[:2]),
                      first=names[0], last=names[1], gone_in=names[2], appeared_after=None)
    path = UpgradePath(baseline="legacy", models=("nanovlm",), records=tuple(records), rows=(), findings=(finding,),
                       recommendation=names[2], recommendation_text="x")
    text = to_markdown(upgrade_path_blocks(path, load_table()))
    short = [name.removeprefix("executorch-") for name in names]
    assert (f"  - compare's reproducer `{script}`: reproduces in {short[0]}, {short[1]}; fixed in {short[2]}"
            in text), text
    assert "## Compare's reproducers, in each release" in text
    assert f"| `nanovlm` | `{script}` | reproduces (exit 1) | reproduces (exit 1) | fixed (exit 0) |" in text, text


def test_a_reproducer_that_could_not_run_is_no_answer():
    """Issue 39, item 7: a crash, exit 3 (the script's own "could not run") or an exit 1 without the error it
    measures (an uncaught exception, from a reproducer written before exit 3) is not "reproduces"."""
    from upgrade_gate.releases._reproducers import ReproducerRun

    def answer(code: int | None, said: str) -> str:
        return ReproducerRun(model="m", method="forward", script="s", exit_code=code, said=said).answer

    measured = "torch 2.8.0: the method lowered to XNNPACK: relative L2 error 0.000196 against eager (threshold 0.0001)"
    assert answer(1, measured) == "reproduces" and answer(0, measured.replace("0.000196", "2.4e-08")) == "fixed"
    assert answer(1, "RuntimeError: compileModel failed: 0x11") == "could not run"
    assert answer(3, "could not run: RuntimeError: compileModel failed: 0x11") == "could not run"
    assert answer(-11, "") == "could not run" and answer(None, "did not finish in 900 s") == "did not finish"


def test_a_release_that_cannot_load_the_saved_program_is_said_to_have_run_it_rebuilt():
    """Issue 39, item 7: a whole method's reproducer saved with torch 2.8 (program.pt2) runs in a release whose
    torch cannot load it from program.py; the page says which releases loaded the saved program and which ran
    the rebuilt one, beside each answer."""
    from upgrade_gate.releases._reproducers import ReproducerRun
    from upgrade_gate.releases._upgrade_path import _answer, _answers

    script = "stacks/candidate/models/m/diagnose/repro/prefill/repro.py"
    loaded = "torch 2.8.0: the method lowered to XNNPACK: relative L2 error 1.2 against eager (threshold 0.1)"
    rebuilt = ("torch 2.11.0: the method lowered to XNNPACK (rebuilt from program.py: program.pt2, saved by torch "
               "2.8.0, does not load here: RuntimeError): relative L2 error 0.01 against eager (threshold 0.1)")
    runs = {"executorch-0.7.0": ReproducerRun(model="m", method="prefill", script=script, exit_code=1, said=loaded),
            "executorch-1.2.0": ReproducerRun(model="m", method="prefill", script=script, exit_code=0, said=rebuilt),
            "executorch-1.5.1": ReproducerRun(model="m", method="prefill", script=script, exit_code=3,
                                              said="could not run: RuntimeError: compileModel failed: 0x11")}
    assert [run.rebuilt for run in runs.values()] == [False, True, False]
    assert _answers(runs) == ("reproduces in 0.7.0; fixed in 1.2.0; could not run in 1.5.1 (program.pt2 loaded in "
                              "0.7.0; rebuilt from program.py in 1.2.0)")
    assert _answer(runs["executorch-1.2.0"]) == "fixed (exit 0; rebuilt from program.py)"
    assert _answer(runs["executorch-0.7.0"]) == "reproduces (exit 1)"
    # An operator's reproducer has no saved program: nothing is said of one.
    assert "program.pt2" not in _answers({"executorch-0.7.0": runs["executorch-0.7.0"]})


def test_each_reproducers_issue_text_says_what_the_releases_said_of_it(tmp_path):
    """Issue 39, item 8: with `nox -s releases` run on the same folder, ISSUE.md names the releases it reproduces
    in and the first that fixes it; run again, the section is replaced, not repeated; a file outside the
    report folder is never written."""
    from upgrade_gate.releases._reproducers import ReproducerRun
    from upgrade_gate.releases._upgrade_path import ISSUE_RELEASES, note_releases_in_issues

    script = "stacks/candidate/models/nanovlm/diagnose/repro/vision_encoder/repro.py"
    issue = tmp_path / script.replace("repro.py", "ISSUE.md")
    issue.parent.mkdir(parents=True)
    issue.write_text("# [XNNPACK delegate] aten.gelu … differs from eager\n\n## Environment\n\n- torch 2.8.0\n")
    said = {1: "relative L2 error 0.000196 against eager (threshold 0.0001)", 0: "relative L2 error 2.4e-08",
            3: "could not run: RuntimeError: compileModel failed: 0x11"}

    def records(*codes: int) -> list:
        return [dataclasses.replace(record, reproducers=(ReproducerRun(
            model="nanovlm", method="vision_encoder", script=script, exit_code=code, said=said[code]),))
            for record, code in zip(records_of("NO-GO", "NO-GO", "GO"), codes)]

    names = [r.release.name.removeprefix("executorch-") for r in records(1, 1, 0)]
    note_releases_in_issues(tmp_path, records(1, 3, 0))
    text = issue.read_text()
    assert text.startswith("# [XNNPACK delegate] aten.gelu") and "- torch 2.8.0" in text
    assert text.endswith(f"{ISSUE_RELEASES}\n\nRun with each release's own Python by `nox -s releases` (exit 1: "
                         f"reproduces, 0: fixed, 3 or a crash: could not run): reproduces in {names[0]}; could not run "
                         f"in {names[1]}; fixed in {names[2]}. The first of them that fixes it: ExecuTorch {names[2]}.\n")
    note_releases_in_issues(tmp_path, records(1, 1, 1))
    text = issue.read_text()
    assert text.count(ISSUE_RELEASES) == 1 and text.endswith(f"reproduces in {', '.join(names)}. None of them fixes it.\n")
    # A folder whose reproducer path leads outside it (a planted link) is left alone.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ISSUE.md").write_text("theirs")
    other = tmp_path / "report"
    (other / Path(script).parent).parent.mkdir(parents=True)
    (other / Path(script).parent).symlink_to(outside)
    note_releases_in_issues(other, records(1, 1, 0))
    assert (outside / "ISSUE.md").read_text() == "theirs"
