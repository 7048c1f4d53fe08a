"""compat/ as the parent sees it: which modules are adapters, which code keys every result (read from
the worker's imports with ast, not from the lists under test), and the adapter contract — its
Protocols, and the worker's records of an adapter that does not keep it (run with this Python:
nothing here needs torch)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers.compat_package import compat_module
from helpers.imports import circles

from upgrade_gate.config.specs import ADAPTER_HELPERS, NOT_ADAPTERS, WORKER_MODULES, WORKER_WINGS, load_spec
from upgrade_gate.errors import ConfigError
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.project import session
from upgrade_gate.run import cache

COMPAT = TOOL_ROOT / "compat"
ADAPTERS = sorted(p.stem for p in COMPAT.glob("*.py") if p.stem not in NOT_ADAPTERS)


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


@pytest.fixture(scope="module")
def contract():
    """compat/contract.py: standard library only, so the parent's Python can read it too."""
    spec = importlib.util.spec_from_file_location("contract_under_test", COMPAT / "contract.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# -- adapters and the rest ----------------------------------------------------------


def spec_naming(tmp_path: Path, adapter: str) -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(f'python = "3.11"\nrequirements = ["torch==2.8.0"]\nadapter = "{adapter}"\n')
    return path


@pytest.mark.parametrize("stem", sorted(p.stem for p in COMPAT.glob("*.py")))
def test_every_compat_module_is_a_working_adapter_or_named_as_not_one(stem, tmp_path, contract):
    spec = spec_naming(tmp_path, stem)
    if stem in NOT_ADAPTERS:
        with pytest.raises(ConfigError, match=f"adapter: no adapter '{stem}' in "):
            load_spec(spec, adapters_dir=COMPAT, is_baseline=True)
        return
    assert load_spec(spec, adapters_dir=COMPAT, is_baseline=True).adapter == stem
    lacking = set(contract.members(contract.Adapter)) - top_level_names(COMPAT / f"{stem}.py")
    assert not lacking, f"{stem}.py is neither a whole adapter (lacks {sorted(lacking)}) nor in NOT_ADAPTERS"


def test_not_adapters_names_modules_that_exist():
    assert len(set(NOT_ADAPTERS)) == len(NOT_ADAPTERS)
    assert set(NOT_ADAPTERS) <= {p.stem for p in COMPAT.glob("*.py")}


def test_mypy_checks_every_adapter_against_the_contract():
    """contract.py ends with one typed assignment per adapter and Protocol it keeps (mypy, tests/test_lint.py)."""
    checked = set()
    for node in ast.walk(ast.parse((COMPAT / "contract.py").read_text())):
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Name):
            checked.add((node.value.id, ast.unparse(node.annotation)))
    assert {module for module, protocol in checked if protocol == "Adapter"} == set(ADAPTERS)


def test_each_adapter_offers_what_the_stacks_do(contract):
    def offered(name: str) -> set[str]:
        names = top_level_names(COMPAT / f"{name}.py")
        return {capability for capability, protocol in contract.CAPABILITIES.items()
                if set(contract.members(protocol)) <= names}

    assert offered("torchscript_mobile") == {"quantize", "profile", "diagnose", "export-lines"}
    assert offered("executorch_xnnpack") == {"quantize", "program", "profile", "backends", "diagnose", "keep-float",
                                                    "re-export", "migrate", "quantize-repro", "re-capture"}


# -- the code that keys every result ----------------------------------------------------


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def nodes_run(tree: ast.AST):
    """Every node of a module but what only a type checker reads (``if TYPE_CHECKING:``)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            pending += child.orelse if _type_checking_only(child) else [child]


def string_constants_of(path: Path) -> dict[str, str]:
    """A module's top-level ``NAME = "text"``."""
    return {target.id: node.value.value for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def string_constants() -> dict[str, str]:
    """Module-level ``NAME = "text"`` of compat/: the private package names the worker loads under."""
    found: dict[str, str] = {}
    for path in COMPAT.glob("*.py"):
        found |= string_constants_of(path)
    return found


def _name(node: ast.AST) -> str | None:
    """``NAME`` or ``module.NAME``: the name a constant is read by."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


class Imports:
    """What a module of the worker imports, read with ast: relative imports, ``import_module`` of a
    private package name and a constant module (``f"{MODELS_PACKAGE}.case"``), calls of a function that
    does that with its argument (``ours("phases")``), and the packages it registers (their __init__.py)."""

    def __init__(self) -> None:
        self.constants = string_constants()
        self.folders: dict[str, Path] = {}  # private package name → its folder
        self.loaders: dict[str, str] = {}  # function name → the package it imports its argument from
        worker = ast.parse((COMPAT / "worker.py").read_text())
        for node in ast.walk(worker):
            if isinstance(node, ast.Call) and _name(node.func) == "_register_package":
                alias, folder = node.args
                self.folders[self.constants[_name(alias)]] = TOOL_ROOT / folder.right.value  # TOOL_ROOT / "models"
        for node in worker.body:
            if isinstance(node, ast.FunctionDef) and node.args.args:
                for call in ast.walk(node):
                    package, rest = self._import_module(call)
                    if package and [ast.unparse(value) for value in rest] == ["'.'", f"{{{node.args.args[0].arg}}}"]:
                        self.loaders[node.name] = package

    def _import_module(self, node: ast.AST) -> tuple[str | None, list[ast.expr]]:
        """``import_module(f"{PACKAGE}…")``: the package's name, and the parts of the f-string after it."""
        if isinstance(node, ast.Call) and _name(node.func) == "import_module" and node.args:
            text = node.args[0]
            if isinstance(text, ast.JoinedStr) and isinstance(head := text.values[0], ast.FormattedValue):
                if _name(head.value) in self.constants:
                    return self.constants[_name(head.value)], text.values[1:]
        return None, []

    def module_files(self, package: str, module: str) -> set[Path]:
        """What importing ``package.module`` runs: the __init__.py of each folder on the way, and the module."""
        folder, parts = self.folders.get(package), module.split(".") if module else []
        if folder is None:
            return set()
        bases = [folder.joinpath(*parts[:depth]) for depth in range(1, len(parts) + 1)]
        return {c for base in bases for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()}

    def of(self, path: Path) -> set[Path]:
        package, folder = next((alias, folder) for alias, folder in self.folders.items() if path.is_relative_to(folder))
        here = path.parent.relative_to(folder).parts  # the folder of the package it is in
        found = set()
        for node in nodes_run(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                prefix = [*here[: len(here) - node.level + 1], *(node.module.split(".") if node.module else [])]
                for name in ["", *(alias.name for alias in node.names)]:  # `from . import blocks` imports a module
                    found |= self.module_files(package, ".".join([*prefix, name] if name else prefix))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                dotted = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                found |= {file for name in dotted if "." in name for file in self.module_files(*name.split(".", 1))}
            elif (imported := self._import_module(node))[0]:
                package_name, rest = imported
                if len(rest) == 1 and isinstance(rest[0], ast.Constant) and rest[0].value.startswith("."):
                    found |= self.module_files(package_name, rest[0].value[1:])  # f"{MODELS_PACKAGE}.case"
            elif isinstance(node, ast.Call) and _name(node.func) in self.loaders and isinstance(node.args[0], ast.Constant):
                found |= self.module_files(self.loaders[_name(node.func)], node.args[0].value)
        return found

    def closure(self, start: list[Path]) -> set[Path]:
        reached, pending = set(), list(start)
        while pending:
            path = pending.pop()
            if path not in reached:
                reached.add(path)
                pending += sorted(self.of(path))
        return reached


@pytest.fixture(scope="module")
def imports():
    return Imports()


def test_the_worker_files_are_the_code_the_worker_runs_for_every_stack(imports):
    """A change to any module the worker runs whatever the adapter must change every key, and nothing else
    is in that list (an adapter and what only it imports are keyed per stack: the next test)."""
    registered = [folder / "__init__.py" for folder in imports.folders.values()]
    assert {p.relative_to(TOOL_ROOT) for p in registered} == {Path("compat/__init__.py"), Path("models/__init__.py")}
    reached = imports.closure([COMPAT / "worker.py", *registered])
    assert TOOL_ROOT / "models" / "case.py" in reached and COMPAT / "phases.py" in reached  # the reader reads
    assert {p.relative_to(TOOL_ROOT).as_posix() for p in reached} == set(cache.WORKER_FILES)


def test_each_adapter_is_keyed_by_every_compat_module_it_imports(imports, tmp_path):
    # The worker's own files (models/case.py, which compat/common.py loads) key every result anyway.
    keyed_anyway = {TOOL_ROOT / name for name in cache.WORKER_FILES}
    for adapter in ADAPTERS:
        reached = imports.closure([COMPAT / f"{adapter}.py"])
        assert reached - keyed_anyway <= set(cache.adapter_files(adapter)), adapter
    helpers = set().union(*(imports.closure([COMPAT / f"{a}.py"]) for a in ADAPTERS))
    assert {COMPAT / f"{name}.py" for name in ADAPTER_HELPERS} <= helpers  # none is stale
    # What it builds on beside the worker's own modules (which key every result anyway).
    worker = keyed_anyway
    built_on = set().union(*(cache.adapter_files(a) for a in ADAPTERS))
    assert {COMPAT / f"{name}.py" for name in ADAPTER_HELPERS} == built_on - {COMPAT / f"{a}.py" for a in ADAPTERS} - worker
    own = tmp_path / "own.py"
    own.write_text("from upgrade_gate_compat.executorch_xnnpack import SUFFIX, load, lower, run, save, set_threads\n")
    assert set(cache.adapter_files(str(own))) == {own, *cache.adapter_files("executorch_xnnpack")}


def test_the_worker_key_holds_every_file_of_its_wings_and_compat_holds_no_file_unkeyed():
    """compat/'s wings are keyed by glob (a file added to one changes every key), and every module of
    compat/ is keyed: the worker's, an adapter's, or the project's (the scan and the pytest plugin, in venvs of
    their own)."""
    wings = {path for wing in WORKER_WINGS for path in (COMPAT / wing).rglob("*.py")}
    keyed = {TOOL_ROOT / name for name in cache.WORKER_FILES}
    assert wings and {path.parent.name for path in wings} == set(WORKER_WINGS)
    assert keyed & set(COMPAT.rglob("*.py")) == wings | {COMPAT / f"{name}.py" for name in WORKER_MODULES}
    adapters = set().union(*(cache.adapter_files(a) for a in ADAPTERS))
    project = {*(p for p in session.SCANNER_FILES if p.suffix == ".py"), *(COMPAT / "pytest_plugin").rglob("*.py")}
    assert set(COMPAT.rglob("*.py")) == keyed & set(COMPAT.rglob("*.py")) | adapters | project


def test_circles_finds_a_loop_of_imports_and_only_a_loop():
    a, b, c, d = (Path(f"{name}.py") for name in "abcd")
    assert circles({a: {b}, b: {c}, c: {a, d}, d: set()}) == [[a, b, c]]
    assert circles({a: {b, c}, b: {d}, c: {d}, d: set()}) == []  # two ways down to one file: no loop
    assert circles({a: {a}}) == [[a]]


def test_compat_imports_run_one_way(imports):
    """No module of compat/ imports one that imports it back, at any depth and however late (inside a
    function): a module that re-exports names imports the module that defines them, never the reverse
    (issue 38). The adapters are where the lines end: what they build on does not import them."""
    graph = {path: imports.of(path) for path in sorted(COMPAT.rglob("*.py")) if "pytest_plugin" not in path.parts}
    assert circles(graph) == []
    adapters = {COMPAT / f"{name}.py" for name in ADAPTERS}
    assert not {path.name for path, imported in graph.items() if imported & adapters}
    # The wings import the worker's modules above them and the searches beside them: never an adapter or what
    # only adapters build on, and a search nothing of the diagnose phases.
    above = {COMPAT / f"{name}.py" for name in WORKER_MODULES}
    for wing in WORKER_WINGS:
        for path in (COMPAT / wing).rglob("*.py"):
            assert {p for p in graph[path] if p.parent == COMPAT} <= above, path
    diagnose = set((COMPAT / "diagnose").rglob("*.py"))
    assert not {path.name for path in (COMPAT / "search").rglob("*.py") if graph[path] & diagnose}


def test_each_diagnose_search_runs_the_phase_that_records_it():
    """The worker picks a diagnose job's phase by its search (upgrade_gate.run.diagnosis writes it); the
    phase it picks records that search on its build stage (``SEARCH``), which the parent reads back."""
    picked = {}
    for node in ast.walk(ast.parse((COMPAT / "worker.py").read_text())):
        if isinstance(node, ast.If) and "search" in ast.unparse(node.test):
            assert isinstance(node.test, ast.Compare) and isinstance(node.test.comparators[0], ast.Constant)
            call = node.body[0].value.value  # return ours("diagnose.precision_phase").run_precision_phase
            picked[node.test.comparators[0].value] = call.args[0].value
    assert picked == {"keep-float": "diagnose.precision_phase",
                      "quantized-lowering": "diagnose.quantized_lowering_phase",
                      "export": "diagnose.export_remedy_phase", "latency": "diagnose.latency_phase",
                      "load": "diagnose.load_phase", "quantize": "diagnose.quantize_remedy_phase"}
    for search, module in picked.items():
        assert search == string_constants_of(COMPAT.joinpath(*module.split(".")).with_suffix(".py"))["SEARCH"], module


def test_a_change_to_what_an_adapter_builds_on_changes_its_key_and_not_its_folder(tmp_path, monkeypatch):
    own = tmp_path / "a" / "own.py"
    own.parent.mkdir()
    own.write_text("from upgrade_gate_compat import executorch_xnnpack\n")
    moved = tmp_path / "b" / "own.py"
    moved.parent.mkdir()
    moved.write_text(own.read_text())
    assert cache.worker_code_digest(str(own)) == cache.worker_code_digest(str(moved))
    before = cache.worker_code_digest(str(own))
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file",
                        lambda path: "edited" if Path(path).name == "executorch_profile.py" else real(path))
    assert cache.worker_code_digest(str(own)) != before
    assert cache.worker_code_digest("torchscript_mobile") == cache.worker_code_digest("torchscript_mobile")


# -- the contract ---------------------------------------------------------------------


def module(**members) -> types.ModuleType:
    found = types.ModuleType("own")
    for name, value in members.items():
        setattr(found, name, value)
    return found


def test_a_module_missing_part_of_the_contract_is_named(contract):
    partial = module(SUFFIX=".x", load=print, run=print)
    assert contract.missing(partial) == ["lower", "save", "set_threads"]
    assert not isinstance(partial, contract.Adapter) and contract.capabilities(partial) == []
    with pytest.raises(contract.ContractError) as raised:
        contract.require(partial, "/envs/own.py")
    # The same words as the parent's exit-2 message after the probe (upgrade_gate.pipeline).
    assert str(raised.value) == ("adapter '/envs/own.py' lacks lower, save, set_threads; an adapter provides SUFFIX, "
                                 "set_threads, lower, save, load and run (compat/contract.py)")
    assert isinstance(raised.value, TypeError)
    contract.require(module(SUFFIX=".x", set_threads=print, lower=print, save=print, load=print, run=print), "own")


@pytest.mark.parametrize(("members", "protocol", "message"), [
    ({"QUANTIZATIONS": {"int8": "mine"}, "quantise": print}, "Quantizes",
     "adapter 'own.py' has QUANTIZATIONS but lacks quantize; a capability is all of its members or none "
     "(quantization recipes: QUANTIZATIONS and quantize; compat/contract.py)"),
    ({"save_program": print}, "MultiMethod",
     "adapter 'own.py' has save_program but lacks run_method; a capability is all of its members or none "
     "(the multi-method program: save_program and run_method; compat/contract.py)"),
    ({"OTHER_BACKENDS": ("vulkan",), "export_only": print}, "OtherBackends",
     "adapter 'own.py' has OTHER_BACKENDS and export_only but lacks backend_unavailable; a capability is all of "
     "its members or none (other backends: OTHER_BACKENDS, backend_unavailable and export_only; "
     "compat/contract.py)"),
])
def test_a_capability_offered_in_part_is_named(contract, members, protocol, message):
    adapter = module(**members)
    assert contract.claims(adapter, getattr(contract, protocol))
    with pytest.raises(contract.ContractError) as raised:
        contract.require_whole(adapter, getattr(contract, protocol), "own.py")
    assert str(raised.value) == message


def test_a_capability_is_all_of_its_members_or_none(contract):
    none = module()
    for protocol in contract.CAPABILITIES.values():
        assert not contract.claims(none, protocol)
        contract.require_whole(none, protocol, "own.py")  # not offered: no error
    # profiler_missing is optional beside profile: a profiler without it lacks nothing.
    profiler = module(profile=print)
    assert isinstance(profiler, contract.Profiles) and not isinstance(profiler, contract.ProfilerCheck)
    assert contract.capabilities(profiler) == ["profile"]
    contract.require_whole(profiler, contract.Profiles, "own.py")


def test_the_contract_is_declared_in_the_order_its_docs_give(contract):
    assert contract.declared(contract.Adapter) == ["SUFFIX", "set_threads", "lower", "save", "load", "run"]
    assert {name: contract.declared(p) for name, p in contract.CAPABILITIES.items()} == {
        "quantize": ["QUANTIZATIONS", "quantize"], "program": ["save_program", "run_method"], "profile": ["profile"],
        "backends": ["OTHER_BACKENDS", "backend_unavailable", "export_only"],
        "diagnose": ["REMEDY_NAME", "lowering_parts", "lower_keeping_out", "lower_with_remedy", "run_lowered",
                     "remedy_options", "reproducer_source", "method_reproducer"],
        "keep-float": ["quantizable_layers", "precision_start", "quantize_with_remedy", "keep_float_code"],
        "re-export": ["EXPORT_REMEDIES", "export_with", "export_reproducer"], "migrate": ["export_script", "method_signature"],
        "export-lines": ["export_lines"], "quantize-repro": ["quantize_reproducer", "precision_reproducer"],
        "re-capture": ["CAPTURE_REMEDIES", "quantize_with_capture"]}
    assert contract.declared(contract.ProfilerCheck) == ["profiler_missing"]
    for protocol in (contract.Adapter, contract.ProfilerCheck, *contract.CAPABILITIES.values()):
        for name in contract.declared(protocol):  # the Protocols' docstrings are the contract's documentation
            assert getattr(protocol, name).__doc__, f"{protocol.__name__}.{name}"


# -- the worker's records of an adapter that does not keep the contract -----------------------------

# No torch: this Python can load it (the worker's measure and runtime commands import torch only to run).
NO_SET_THREADS = '''\
"""An adapter without set_threads(): the contract (compat/contract.py) is not kept."""
SUFFIX = ".x"


def lower(module, inputs):
    return module, {}


def save(lowered, path):
    path.write_bytes(b"x")


def load(path):
    return path


def run(program, inputs):
    return inputs
'''


def worker(tmp_path: Path, command: str, job: dict, env: dict[str, str] | None = None,
           **kwargs) -> subprocess.CompletedProcess[str]:
    """compat/worker.py as the parent starts it (nothing of ours on sys.path), with this Python."""
    job_file = tmp_path / f"{command}-job.json"
    job_file.write_text(json.dumps(job))
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (env or {})
    return subprocess.run([sys.executable, "-P", str(COMPAT / "worker.py"), command, str(job_file)],
                          env=environment, capture_output=True, text=True, timeout=60, check=False, **kwargs)


@pytest.fixture
def no_set_threads(tmp_path):
    path = tmp_path / "envs" / "own.py"
    path.parent.mkdir()
    path.write_text(NO_SET_THREADS)
    return path


def test_a_runtime_phase_records_an_adapter_that_does_not_keep_the_contract_on_its_load_stage(tmp_path,
                                                                                                no_set_threads):
    model_dir = tmp_path / "models" / "vit-smoke"
    result = worker(tmp_path, "runtime", {"stack": "own", "model": "vit-smoke", "adapter": str(no_set_threads),
                                          "model_dir": str(model_dir), "fixtures_dir": str(tmp_path / "fixtures"),
                                          "threads": 1, "profile_runs": 1})
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((model_dir / "runtime.json").read_text())
    stages = {stage["stage"]: stage for stage in record["stages"]}
    assert stages["load"]["status"] == "failed"
    assert stages["load"]["error"]["type"] == "upgrade_gate_compat.contract.ContractError"
    assert stages["load"]["error"]["message"] == (
        f"adapter {str(no_set_threads)!r} lacks set_threads; an adapter provides SUFFIX, set_threads, lower, save, "
        "load and run (compat/contract.py)")
    assert stages["run"]["status"] == "skipped" and "load" in stages["run"]["reason"]
    assert record["complete"] is True


def test_a_measurement_server_sends_an_adapter_that_does_not_keep_the_contract_as_its_error(tmp_path,
                                                                                            no_set_threads):
    requests_read, requests_write = os.pipe()
    events_read, events_write = os.pipe()
    os.close(requests_write)  # no request: the server must fail before it reads one
    try:
        result = worker(tmp_path, "measure", {"stack": "own", "model": "vit-smoke", "adapter": str(no_set_threads),
                                              "model_dir": str(tmp_path), "fixtures_dir": str(tmp_path),
                                              "methods": ["forward"], "threads": 1},
                        pass_fds=(requests_read, events_write),
                        env={"UPGRADE_GATE_CONTROL_FDS": f"{requests_read},{events_write}"})
    finally:
        os.close(requests_read)
        os.close(events_write)
    with os.fdopen(events_read, encoding="utf-8") as events:
        sent = [json.loads(line) for line in events]
    assert result.returncode == 1, result.stderr[-3000:]
    assert [(e["event"], e["type"], e["message"]) for e in sent] == [(
        "error", "upgrade_gate_compat.contract.ContractError",
        f"adapter {str(no_set_threads)!r} lacks set_threads; an adapter provides SUFFIX, set_threads, lower, save, "
        "load and run (compat/contract.py)")]


def test_no_worker_file_is_long():
    long = {p.name: n for p in COMPAT.glob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_a_backend_try_that_fails_in_a_tool_says_what_the_tool_wrote(capfd):
    # Issue 37: ExecuTorch runs flatc with check=True and no capture, so an export-only try that failed there
    # said "returned non-zero exit status 1" and flatc's reason was only in the worker's log.
    backends = compat_module("backends_under_test", "executorch_backends")  # no torch until a backend is tried
    flatc = ["sh", "-c", "echo 'lowering…' >&2; echo 'error: program.json:3: unknown field: delegate_data' >&2; "
                         "exit 1", "flatc"]
    kept: list[str] = []
    with pytest.raises(RuntimeError) as raised, backends.stderr_kept(kept):
        try:
            subprocess.run(flatc, check=True)
        except subprocess.CalledProcessError as error:  # as ExecuTorch's serializer lets it out, wrapped
            raise RuntimeError("failed to serialize the program") from error
    assert backends.failure_message(raised.value, "".join(kept)) == (
        "RuntimeError: sh said: lowering… | error: program.json:3: unknown field: delegate_data (failed to "
        "serialize the program)")
    # Still in the worker's log, where it went before.
    assert "unknown field: delegate_data" in capfd.readouterr().err
    # Anything else keeps its own message, whatever was on stderr.
    assert backends.failure_message(IndexError("list index out of range"), "a warning\n") == (
        "IndexError: list index out of range")
