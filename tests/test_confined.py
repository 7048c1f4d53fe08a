"""Nothing outside the report folder and the result cache is written or deleted, whatever a name
says or a link planted there points to (issue 37's hostile probe): through nox, as a user meets it,
with a listing of the folders around the run before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.compat_package import compat_module
from helpers.runs import QUICK, nox, user_project

from upgrade_gate import layout
from upgrade_gate._confined import OutsideOwnFolder, planted_links, remove_file, remove_tree
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.run import cache_folder


def listing(folder: Path) -> dict[str, bytes | str]:
    """Every entry below ``folder`` (links not followed): a file's bytes, a link's target, a folder's name."""
    found: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files):
            path = Path(root) / name
            key = path.relative_to(folder).as_posix()
            found[key] = (f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir()
                          else path.read_bytes())
    return found


def usage_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one message of an exit 2, without a traceback."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0].removeprefix("upgrade-gate: error: ")


@pytest.fixture
def surroundings(tmp_path: Path) -> tuple[Path, Path]:
    """A team's folder inside a parent that holds a folder of someone else's, with a file in it."""
    team = tmp_path / "a" / "b" / "c" / "d" / "team"
    team.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("not upgrade-gate's\n")
    return team, outside


# -- names --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "shown"), [
    ("../../../../../outside", "'../../../../../outside'"),
    ("..", "'..'"),
    ("/tmp/absolute", "'/tmp/absolute'"),
    ("../escape", "'../escape'"),
    ("", "''"),
    ("x" * 300, repr("x" * 300)),
    ("two words", "'two words'"),
    (".hidden", "'.hidden'"),
])
def test_a_model_name_that_is_no_folder_name_exits_2_and_touches_nothing(surroundings, name, shown):
    team, outside = surroundings
    (team / "my_model.py").write_text("def build(): ...\n")
    env = user_project(team, f'[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\n{json.dumps(name)} = '
                             '"my_model:build"\n')
    cache_dir = team.parent / "cache"
    before = listing(team.parents[4])
    result = nox("-s", "compare", "--", "--out", str(team / "report"),
                 env={**env, layout.CACHE_ENV_VAR: str(cache_dir)}, timeout=300)
    message = usage_error(result)
    assert message.endswith(f"{shown} is not a name upgrade-gate can use as a folder: 1 to 64 letters, digits, '-', "
                            f"'_' or '.', starting with a letter or digit; e.g. "
                            f"{layout.name_problem(name).rsplit('e.g. ', 1)[1]}; rename the entry"), message
    assert message.startswith(f"{team / 'pyproject.toml'}: tool.upgrade-gate.models."), message
    assert listing(team.parents[4]) == before


def test_the_suggested_name_has_the_allowed_shape():
    for name in ("../../../../../outside", "..", "/tmp/absolute", "", "x" * 300, "two words", "-lead", "é"):
        suggestion = layout.name_problem(name).rsplit("e.g. ", 1)[1].strip("'")
        assert layout.name_problem(suggestion) is None, (name, suggestion)
    assert layout.name_problem("vit-ti16") is None and layout.name_problem("a.b_c-9") is None


def test_every_built_in_model_stack_variant_and_release_has_a_name_of_the_allowed_shape():
    from upgrade_gate.config.catalog import QUANTIZED_VARIANTS, load_catalog
    from upgrade_gate.releases._table import load_table

    names = [*load_catalog(), *(p.stem for p in (TOOL_ROOT / "envs").glob("*.toml")), *QUANTIZED_VARIANTS,
             *(release.name for release in load_table().releases)]
    assert names and [n for n in names if layout.name_problem(n)] == [] and layout.same_folder(names) is None


def test_a_stack_spec_whose_file_name_is_no_folder_name_exits_2(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    (tmp_path / "envs" / "candidate.toml").rename(tmp_path / "envs" / "my candidate.toml")
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"), env=env, timeout=300)
    assert usage_error(result) == (
        f"{tmp_path / 'envs' / 'my candidate.toml'}: a stack's name is its spec's file name, and 'my candidate' is "
        "not a name upgrade-gate can use as a folder: 1 to 64 letters, digits, '-', '_' or '.', starting with a letter "
        "or digit; e.g. 'my-candidate'; rename the file")
    assert not (tmp_path / "report").exists()


def test_a_variant_left_empty_exits_2(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"), "--models", "vit-smoke@", env=env,
                 timeout=300)
    assert usage_error(result) == ("--models: 'vit-smoke@' names no variant after '@'; write 'vit-smoke' for the model "
                                   "and its variants, or e.g. 'vit-smoke@fp32'")
    assert not (tmp_path / "report").exists()


# Names a hostile or careless model may give its methods (issue 61: N11, N12), and what each must be refused for.
METHOD_NAMES = ["../../../../victim_m/escaped", "../escaped", "a/b", "/abs", "", ".", "..", "a.b", "program",
                "x" * 65, "two words", "-lead", "é", "forward\x00", "prefill\n"]


def test_a_methods_name_has_one_shape_and_the_suggestion_keeps_it():
    for name in METHOD_NAMES:
        problem = layout.method_problem(name)
        assert problem is not None and problem.startswith(f"{name!r} is not a name upgrade-gate can use for a "
                                                          "method's files and records: "), name
        suggestion = problem.rsplit("e.g. ", 1)[1].strip("'")
        assert layout.method_problem(suggestion) is None, (name, suggestion)
    assert [n for n in ("forward", "prefill", "decode", "vision_encoder", "lm-head", "x" * 64)
            if layout.method_problem(n)] == []
    assert layout.method_problem("a/b").endswith("and not 'program'; e.g. 'a-b'")
    assert layout.method_problem("program").endswith("e.g. 'program-method'")


def _common():
    """compat/common.py as the worker loads it, with the standard library only."""
    return compat_module("names_compat", "common")


class _Case:
    """What refuse_bad_method_names reads of a ModelCase: its methods by name."""

    def __init__(self, *names: object) -> None:
        self.names = names

    def entry_points(self) -> dict[object, None]:
        return dict.fromkeys(self.names)


def test_the_worker_refuses_exactly_the_method_names_the_parent_refuses():
    """The worker's check is the parent's rule, sent in the job the runner writes (compat/ cannot import it)."""
    from upgrade_gate.config.catalog import load_catalog
    from upgrade_gate.run.phases import model_job

    common = _common()
    job = model_job(load_catalog()["vit-smoke"])
    assert job["method_names"] == {"shape": layout.METHOD_SHAPE.pattern, "reserved": ["program"]}
    assert layout.RESERVED_METHODS == (common.PROGRAM,)  # the multi-method artifact's stem, named on both sides
    for name in [*METHOD_NAMES, "forward", "prefill", "lm-head", "x" * 64]:
        try:
            common.refuse_bad_method_names(_Case("forward", name), job)
            refused = None
        except common.MethodNameRefused as error:
            refused = error.method
        assert (refused is not None) == (layout.method_problem(name) is not None), name
        assert refused in (None, name), name
    with pytest.raises(TypeError, match=r"^a ModelCase's methods are named by strings; one is 0 \(int\)$"):
        common.refuse_bad_method_names(_Case(0), job)


def test_a_refused_method_reaches_the_parent_as_the_models_configuration_error(tmp_path):
    """The worker's record of the refusal (its build stage) is what the runner stops the run on: exit 2 naming the
    entry, the method and the rule — never a stage of the stack that failed."""
    from upgrade_gate.config.plan import load_plan
    from upgrade_gate.run.phases import refused_method

    phases = compat_module("names_compat", "phases")
    common = sys.modules["names_compat.common"]
    job = {"stack": "candidate", "model": "victim", "fixtures_dir": None, "assets_dir": None}
    log = phases.PhaseLog(tmp_path / "export.json", job, "export")

    def build():
        raise common.MethodNameRefused("../../victim_m/escaped")

    log.stage("build", (), build)
    assert refused_method(tmp_path / "export.json") == "../../victim_m/escaped"
    assert refused_method(tmp_path / "missing.json") is None
    (tmp_path / "pyproject.toml").write_text('[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\n'
                                             'victim = "victim:build"\n')
    entry = load_plan([], invoked_from=tmp_path, config_path=tmp_path / "pyproject.toml").models[0]
    from upgrade_gate.config.catalog import method_refused

    assert str(method_refused(entry, "../../victim_m/escaped")) == (
        f"{tmp_path / 'pyproject.toml'}: tool.upgrade-gate.models.victim: factory 'victim:build' returns a ModelCase "
        "whose method '../../victim_m/escaped' is not a name upgrade-gate can use for a method's files and records: 1 "
        "to 64 letters, digits, '-' or '_', starting with a letter or digit, and not 'program'; e.g. 'victim_m-escaped'"
        "; rename the method (a key of its ModelCase's methods)")


def test_a_worker_writes_a_methods_file_only_in_the_models_folder(tmp_path):
    common = _common()
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (folder / "planted.pte").symlink_to(tmp_path / "outside" / "planted.pte")
    assert common.own_file(folder, "forward.pte") == folder / "forward.pte"
    for name in ("../escaped.pte", "a/b.pte", "/abs.pte", "..", "planted.pte"):
        with pytest.raises(ValueError, match="upgrade-gate writes a method's files in the model's folder only"):
            common.own_file(folder, name)


def test_a_path_the_parent_builds_from_a_name_is_one_entry_of_its_folder(tmp_path):
    out = tmp_path / "report"
    assert layout.model_dir(out, "legacy", "vit-ti16@int8") == out / "stacks" / "legacy" / "models" / "vit-ti16@int8"
    for build in (lambda name: layout.model_dir(out, "legacy", name), lambda name: layout.model_dir(out, name, "m"),
                  lambda name: layout.measurement_dir(out, name), lambda name: layout.release_dir(out, name),
                  lambda name: layout.project_dir(out, name), lambda name: layout.fixtures_dir(out, "x/" + name, "")):
        for name in ("..", "../escaped", "a/b", ""):
            with pytest.raises(layout.NotAnEntry, match="upgrade-gate writes only in its report folder and its "
                                                        "result cache: a name there is one folder or file"):
                build(name)


def test_names_that_differ_only_in_case_are_refused_as_one_folder(project):
    from upgrade_gate.config.plan import load_plan
    from upgrade_gate.config.settings import load_settings
    from upgrade_gate.errors import ConfigError

    config = project / "pyproject.toml"
    config.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n[tool.upgrade-gate.models]\nMine = "m:build"\n'
                      'mine = "m:build"\n')
    with pytest.raises(ConfigError) as caught:
        load_plan([], invoked_from=project, config_path=config)
    assert str(caught.value) == (f"{config}: tool.upgrade-gate.models.mine: 'Mine' and 'mine' differ only in case: on "
                                 "a file system that ignores case (macOS's) they would be one folder; rename one")
    config.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n[tool.upgrade-gate.models]\nVit-Smoke = "m:build"\n')
    with pytest.raises(ConfigError, match=r"models.Vit-Smoke: 'vit-smoke' and 'Vit-Smoke' differ only in case"):
        load_plan([], invoked_from=project, config_path=config)
    config.write_text('[tool.upgrade-gate.targets]\npi5 = "ssh://pi5.lab"\nPi5 = "ssh://pi5.lab"\n')
    with pytest.raises(ConfigError, match=r"targets.Pi5: 'pi5' and 'Pi5' differ only in case"):
        load_settings(config)
    config.write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    (project / "envs" / "Candidate.toml").write_text((project / "envs" / "candidate.toml").read_text())
    with pytest.raises(ConfigError) as caught:
        load_plan([], invoked_from=project, config_path=config)
    assert str(caught.value) == (
        f"{project / 'envs' / 'Candidate.toml'}: a stack's name is its spec's file name, and 'candidate' and "
        "'Candidate' differ only in case: on a file system that ignores case (macOS's) they would be one folder; "
        "rename one")


# A team's model whose method's name climbs out of the model's folder to the folder beside the team's (N11);
# ``refused`` says where: at the factories' check before any export, or — the factory naming its methods otherwise
# when the check calls it — at the export's own build.
VICTIM = """
import sys

import torch
from upgrade_gate_models.case import Method, ModelCase

ESCAPING = "../" * 10 + "outside/escaped"


def build():
    model = torch.nn.Linear(4, 2)
    name = "forward" if {checked} and "check" in sys.argv else ESCAPING
    return ModelCase(module=model, methods={{name: Method(model, (torch.randn(1, 4),))}})
"""


@pytest.mark.integration
@pytest.mark.shares_machine
@pytest.mark.parametrize("refused", ["check", "export"])
def test_a_method_named_out_of_its_folder_is_the_models_usage_error_and_writes_nothing_outside(surroundings, refused):
    team, outside = surroundings
    (team / "victim.py").write_text(VICTIM.format(checked=refused == "export"))
    env = user_project(team, f'[tool.upgrade-gate]\nsuite = "none"\n{QUICK}[tool.upgrade-gate.models]\n'
                             'victim = { factory = "victim:build", variants = [] }\n')
    out, cache_dir = team / "report", team / "cache"
    before = listing(team.parents[4])
    result = nox("-s", "compare", "--", "--out", str(out), env={**env, layout.CACHE_ENV_VAR: str(cache_dir)},
                 timeout=1800)
    assert usage_error(result) == (
        f"{team / 'pyproject.toml'}: tool.upgrade-gate.models.victim: factory 'victim:build' returns a ModelCase whose "
        f"method {'../' * 10 + 'outside/escaped'!r} is not a name upgrade-gate can use for a method's files and "
        "records: 1 to 64 letters, digits, '-' or '_', starting with a letter or digit, and not 'program'; e.g. "
        "'outside-escaped'; rename the method (a key of its ModelCase's methods)")
    after = listing(team.parents[4])
    made = ("a/b/c/d/team/report", "a/b/c/d/team/cache")
    assert {k: v for k, v in after.items() if not k.startswith(made)} == before
    assert not (out / "verdict.json").exists()  # never judged: nothing is charged to a stack
    assert not layout.stack_dir(out, "candidate").exists()  # the run stopped at the first stack
    export = layout.model_dir(out, "legacy", "victim") / "export.json"
    if refused == "check":
        assert not export.exists()  # before any export
    else:
        build = json.loads(export.read_text())["stages"][0]
        assert (build["stage"], build["status"], build["error"]["refused_method"]) == (
            "build", "failed", "../" * 10 + "outside/escaped")
        assert not any(cache_dir.rglob("export.json"))  # not stored: the next run builds it again


# -- links planted in the report folder and the cache ------------------------------------


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(surroundings):
    team, outside = surroundings
    env = user_project(team, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    out = team / "report"
    out.mkdir()
    (out / ".upgrade-gate.lock").symlink_to(outside / "precious.txt")
    before = listing(team.parents[4])
    result = nox("-s", "compare", "--", "--out", str(out), env={**env, layout.CACHE_ENV_VAR: str(team / "cache")},
                 timeout=300)
    assert usage_error(result) == (
        f"{out / '.upgrade-gate.lock'} is a symbolic link (to {outside / 'precious.txt'}); upgrade-gate never writes "
        "through a link in its report folder: remove the link, or choose another folder with --out DIR")
    after = listing(team.parents[4])
    assert (outside / "precious.txt").read_text() == "not upgrade-gate's\n"
    # The result cache this run would have used is made (checked writable) before the lock; nothing else.
    assert {k: v for k, v in after.items() if "/cache" not in f"/{k}"} == before


def test_a_model_folder_planted_as_a_link_is_refused_before_anything_is_removed(surroundings):
    team, outside = surroundings
    env = user_project(team, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    out = team / "report"
    models = out / "stacks" / "legacy" / "models"
    models.mkdir(parents=True)
    (models / "vit-smoke").symlink_to(outside, target_is_directory=True)
    cache_dir = team / "cache"
    cache_dir.mkdir()
    before = listing(team.parents[4])
    result = nox("-s", "compare", "--", "--out", str(out), env={**env, layout.CACHE_ENV_VAR: str(cache_dir)},
                 timeout=300)
    message = usage_error(result)
    assert message == (f"{models / 'vit-smoke'} is a symbolic link (to {outside}); upgrade-gate writes and deletes "
                       f"only real files in its report folder {out}, and never follows a link there: remove the "
                       "link, or choose another folder")
    after = listing(team.parents[4])
    assert {k: v for k, v in after.items() if not k.endswith(".upgrade-gate.lock") and
            not k.endswith(cache_folder.CACHE_LOCK)} == before


def test_a_link_planted_in_the_result_cache_is_refused(tmp_path):
    env = user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    cache_dir = tmp_path / "cache"
    entry = cache_dir / "results" / "legacy" / "vit-smoke" / "export"
    entry.mkdir(parents=True)
    (entry / "0123").symlink_to(tmp_path, target_is_directory=True)
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"),
                 env={**env, layout.CACHE_ENV_VAR: str(cache_dir)}, timeout=120)
    assert usage_error(result).startswith(f"{entry / '0123'} is a symbolic link (to {tmp_path}); upgrade-gate writes "
                                          f"and deletes only real files in its result cache {cache_dir / 'results'}")


def test_the_scan_finds_links_at_any_depth_but_in_the_release_venvs(tmp_path):
    (tmp_path / "stacks" / "s" / "models" / "m").mkdir(parents=True)
    (tmp_path / "stacks" / "s" / "models" / "m" / "export.json").symlink_to("/etc/hostname")
    (tmp_path / "report.html").symlink_to("/etc/hostname")
    (tmp_path / ".venvs" / "candidate" / "bin").mkdir(parents=True)
    (tmp_path / ".venvs" / "candidate" / "bin" / "python").symlink_to(sys.executable)
    assert planted_links(tmp_path) == [tmp_path / "report.html", tmp_path / "stacks/s/models/m/export.json"]


def test_a_removal_unlinks_a_link_and_refuses_what_resolves_outside(tmp_path):
    own, outside = tmp_path / "own", tmp_path / "outside"
    (own / "models").mkdir(parents=True)
    outside.mkdir()
    (outside / "kept.txt").write_text("kept")
    (own / "models" / "m").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutsideOwnFolder, match="lies outside"):
        remove_file(own / "models" / "m" / "kept.txt", within=own)  # through the link: refused
    remove_tree(own / "models" / "m", within=own)  # the link itself: unlinked, its target untouched
    assert not (own / "models" / "m").exists() and (outside / "kept.txt").read_text() == "kept"
    with pytest.raises(OutsideOwnFolder):
        remove_tree(own / ".." / "outside", within=own)
    with pytest.raises(OutsideOwnFolder):
        remove_tree(own, within=own)
    assert (outside / "kept.txt").is_file() and own.is_dir()


# -- a refusal leaves nothing behind ------------------------------------------------------


def test_an_unwritable_cache_leaves_no_report_folder_behind(tmp_path):
    env = user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    (tmp_path / "taken").write_text("a file where the cache should go\n")
    out = tmp_path / "new" / "report"
    result = nox("-s", "compare", "--", "--out", str(out),
                 env={**env, layout.CACHE_ENV_VAR: str(tmp_path / "taken")}, timeout=300)
    assert usage_error(result).startswith(f"{tmp_path / 'taken' / 'results'}: result cache is not writable")
    assert not (tmp_path / "new").exists()


def test_a_merge_into_a_new_folder_that_is_refused_leaves_no_folder_behind(tmp_path):
    env = user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    out = tmp_path / "merged"
    result = nox("-s", "report", "--", "--out", str(out), str(tmp_path / "no-such-shard"), env=env, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert not out.exists()


# -- a prune never pulls files from under a live run --------------------------------------


def test_prune_cache_refuses_while_another_run_uses_the_cache(tmp_path):
    env = user_project(tmp_path, '[tool.upgrade-gate]\nsuite = "smoke"\n')
    cache_dir = tmp_path / "cache"
    out = tmp_path / "report"
    fixtures = cache_dir / "results" / layout.FIXTURES / "vit-smoke-000000000000"
    fixtures.mkdir(parents=True)
    (fixtures / "inputs.npz").write_bytes(b"in use")
    record = layout.key_record_file(layout.model_dir(out, "legacy", "other"), "export")
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"key": "k", "stored": True}))
    # Another run: a process holding the cache as every session does (pipeline.take_folders_or_exit).
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from upgrade_gate.run import cache_folder; cache_folder.use_cache(Path(sys.argv[1])); "
                               "print('holding', flush=True); time.sleep(120)", str(cache_dir / "results")],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(TOOL_ROOT / "src")})
    try:
        assert holder.stdout.readline().strip() == "holding"
        env = {**env, layout.CACHE_ENV_VAR: str(cache_dir)}
        result = nox("-s", "prune-cache", "--", "--out", str(out), env=env, timeout=300)
        assert usage_error(result) == (
            f"{cache_dir / 'results'}: another upgrade-gate run is using this result cache; pruning now would "
            f"remove what it is reading: run `nox -s prune-cache -- --out {out}` again when it has finished")
        assert (fixtures / "inputs.npz").read_bytes() == b"in use"
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    result = nox("-s", "prune-cache", "--", "--out", str(out), env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not fixtures.exists()  # no run holds it now: the unused fixtures go


def _phases_module():
    """compat/phases.py as the worker loads it (a package of compat/'s own), with the standard library only."""
    return compat_module("vanished_compat", "phases")


def test_a_provided_file_that_vanished_under_a_stage_is_unfinished_and_a_models_own_missing_file_a_failure(tmp_path):
    phases = _phases_module()
    fixtures, project = tmp_path / "fixtures", tmp_path / "project"
    fixtures.mkdir()  # the fixtures were there when the phase started
    log = phases.PhaseLog(tmp_path / "runtime.json", {"stack": "candidate", "model": "m",
                                                      "fixtures_dir": str(fixtures), "assets_dir": None}, "runtime")

    def read(path: Path):
        return lambda: (path.read_bytes(), None)

    log.stage("inputs", (), read(fixtures / "inputs.npz"))
    log.stage("build", (), read(project / "weights.bin"))
    stages = {s["stage"]: s for s in json.loads((tmp_path / "runtime.json").read_text())["stages"]}
    assert stages["inputs"]["status"] == "vanished" and stages["build"]["status"] == "failed"
    # Fixtures never made (the export failed before it wrote them): the stage failed, nothing vanished.
    never = phases.PhaseLog(tmp_path / "never.json", {"stack": "candidate", "model": "m",
                                                      "fixtures_dir": str(tmp_path / "none"), "assets_dir": None},
                            "runtime")
    never.stage("inputs", (), read(tmp_path / "none" / "inputs.npz"))
    assert json.loads((tmp_path / "never.json").read_text())["stages"][0]["status"] == "failed"

    from upgrade_gate.schema.records import Stage
    from upgrade_gate.stages import UNFINISHED_STATUSES

    assert "vanished" in UNFINISHED_STATUSES
    stage = Stage.from_reader(__import__("upgrade_gate.schema.records", fromlist=["Reader"]).Reader(
        stages["inputs"], where="stages[0]"))
    assert stage.unfinished
    assert stage.explain().startswith("inputs did not finish: [Errno 2] No such file or directory: ")
    assert stage.explain().endswith("a file the tool provided was removed from outside while the run used it; run "
                                    "the same command again")



def test_a_cache_copied_with_hard_links_has_a_lock_of_its_own(tmp_path):
    """A copy made with hard links (cp -al; the workflow rehearsal's link_tree, as two CI shards restore one
    cache) shares the original's lock file: a run holding one must not hold the other (found on a loaded
    machine, where the rehearsal's prune-cache was refused while the other shard's compare ran)."""
    original, copy = tmp_path / "a" / "results", tmp_path / "b" / "results"
    original.mkdir(parents=True)
    copy.mkdir(parents=True)
    (original / cache_folder.CACHE_LOCK).touch()
    os.link(original / cache_folder.CACHE_LOCK, copy / cache_folder.CACHE_LOCK)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from upgrade_gate.run import cache_folder; cache_folder.use_cache(Path(sys.argv[1])); "
                               "print('holding', flush=True); time.sleep(120)", str(original)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(TOOL_ROOT / "src")})
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert cache_folder.alone_in_cache(copy)  # its own lock now: the other run is not in it
        assert os.stat(copy / cache_folder.CACHE_LOCK).st_nlink == 1
        assert not cache_folder.alone_in_cache(original)  # the run that holds the original still does
    finally:
        holder.kill()
        holder.wait()
        for root in (original, copy):
            os.close(cache_folder.USING.pop(root.resolve()))
