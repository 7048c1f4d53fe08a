"""compat/scan.py: our migration rules and TorchFix's checks over source snippets and the sample project."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers.sample_project import PLANTED, SAMPLE_PROJECT, where_planted

REPO = Path(__file__).resolve().parents[1]
SCAN_PY = REPO / "compat" / "scan.py"


def _load_scan() -> ModuleType:
    # compat/ is not importable from the tests (its package is the stacks' worker side).
    spec = importlib.util.spec_from_file_location("upgrade_gate_compat_scan", SCAN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


scan = _load_scan()
RULES = {rule.code: rule for rule in scan.load_rules().rules}


def ours(findings: list[dict[str, Any]]) -> list[tuple[int, int, str, str]]:
    return [(f["line"], f["column"], f["code"], f["name"]) for f in findings if f["source"] == "upgrade-gate"]


# (source, our findings as (line, column, code, qualified name))
RULE_CASES = {
    "trace": ("import torch\ntraced = torch.jit.trace(model, example)\n",
              [(2, 10, "UG101", "torch.jit.trace")]),
    "trace through a module alias": ("import torch.jit as J\nJ.trace(model, example)\n",
                                     [(2, 1, "UG101", "torch.jit.trace")]),
    "trace_module": ("from torch import jit\njit.trace_module(model, {'forward': example})\n",
                     [(2, 1, "UG101", "torch.jit.trace_module")]),
    "script as a bare decorator": ("import torch\n\n@torch.jit.script\ndef f(x):\n    return x\n",
                                   [(3, 2, "UG101", "torch.jit.script")]),
    "optimize_for_mobile under another name": (
        "from torch.utils.mobile_optimizer import optimize_for_mobile as ofm\nofm(m)\n",
        [(2, 1, "UG102", "torch.utils.mobile_optimizer.optimize_for_mobile")]),
    "_save_for_lite_interpreter on any object": (
        "def save(scripted, path):\n    scripted._save_for_lite_interpreter(path)\n",
        [(2, 5, "UG103", "_save_for_lite_interpreter")]),
    "_load_for_lite_interpreter": (
        "from torch.jit.mobile import _load_for_lite_interpreter\nmodule = _load_for_lite_interpreter('m.ptl')\n",
        [(2, 10, "UG104", "torch.jit.mobile._load_for_lite_interpreter")]),
    "prepare_fx": ("from torch.ao.quantization.quantize_fx import prepare_fx\nprepare_fx(m, mapping, example)\n",
                   [(2, 1, "UG105", "torch.ao.quantization.quantize_fx.prepare_fx")]),
    "torch.quantization alias package": ("import torch\nq = torch.quantization.quantize_dynamic(m)\n",
                                         [(2, 5, "UG105", "torch.quantization.quantize_dynamic")]),
    "2.2 PT2E import and call": (
        "from torch.ao.quantization.quantizer.xnnpack_quantizer import XNNPACKQuantizer\nq = XNNPACKQuantizer()\n",
        [(1, 63, "UG106", "torch.ao.quantization.quantizer.xnnpack_quantizer.XNNPACKQuantizer"),
         (2, 5, "UG106", "torch.ao.quantization.quantizer.xnnpack_quantizer.XNNPACKQuantizer")]),
    "2.2 PT2E module alias": (
        "import torch.ao.quantization.quantize_pt2e as qp\nqp.prepare_pt2e(graph, quantizer)\n",
        [(1, 8, "UG106", "torch.ao.quantization.quantize_pt2e"),
         (2, 1, "UG106", "torch.ao.quantization.quantize_pt2e.prepare_pt2e")]),
    "capture_pre_autograd_graph": (
        "import torch._export\ngraph = torch._export.capture_pre_autograd_graph(m, example)\n",
        [(2, 9, "UG107", "torch._export.capture_pre_autograd_graph")]),
    "cuda autocast as a context manager": ("import torch\nwith torch.cuda.amp.autocast():\n    pass\n",
                                           [(2, 6, "UG108", "torch.cuda.amp.autocast")]),
    "GradScaler imported and called": ("from torch.cuda.amp import GradScaler\nscaler = GradScaler()\n",
                                       [(1, 28, "UG108", "torch.cuda.amp.GradScaler"),
                                        (2, 10, "UG108", "torch.cuda.amp.GradScaler")]),
    "impl_abstract": ("import torch\n\n@torch.library.impl_abstract('edge::op')\ndef fake(x):\n    return x\n",
                      [(3, 2, "UG109", "torch.library.impl_abstract")]),
    "dynamic_dim": ("from torch.export import dynamic_dim\nc = dynamic_dim(x, 0)\n",
                    [(1, 26, "UG110", "torch.export.dynamic_dim"), (2, 5, "UG110", "torch.export.dynamic_dim")]),
    "private TorchScript API as a decorator, a call, an import": (
        "import torch\nfrom torch.jit import _overload\n\n@torch.jit._overload\ndef f(x: int) -> int: ...\n"
        "g = torch.jit._script_if_tracing(f)\n",
        [(2, 23, "UG111", "torch.jit._overload"), (4, 2, "UG111", "torch.jit._overload"),
         (6, 5, "UG111", "torch.jit._script_if_tracing")]),
    "private TorchScript module, imported and used": (
        "import torch.jit._state\ntorch.jit._state.disable()\n",
        [(1, 8, "UG111", "torch.jit._state"), (2, 1, "UG111", "torch.jit._state.disable")]),
    "one chain, three steps": (
        "import torch\nfrom torch.utils.mobile_optimizer import optimize_for_mobile\n"
        "optimize_for_mobile(torch.jit.trace(m, x))._save_for_lite_interpreter(p)\n",
        [(3, 1, "UG102", "torch.utils.mobile_optimizer.optimize_for_mobile"),
         (3, 1, "UG103", "_save_for_lite_interpreter"),
         (3, 21, "UG101", "torch.jit.trace")]),
}


@pytest.mark.parametrize(("source", "expected"), RULE_CASES.values(), ids=RULE_CASES.keys())
def test_rule_findings(source: str, expected: list[tuple[int, int, str, str]]) -> None:
    findings = scan.scan_source(source, "edge.py")
    assert ours(findings) == expected
    for finding in findings:
        rule = RULES[finding["code"]]
        assert finding["file"] == "edge.py"
        assert (finding["summary"], finding["why"], finding["replacement"]) == (
            rule.summary, rule.why, rule.replacement)


# Uses that are not calls (issue 18): each found once, with the statement that holds it as its "call".
# (source, our findings as (line, column, code, qualified name, call))
REFERENCE_CASES = {
    "functools.partial of the qualified name": (
        "import functools\nimport torch\nfp16 = functools.partial(torch.cuda.amp.autocast, dtype=torch.float16)\n",
        [(3, 26, "UG108", "torch.cuda.amp.autocast",
          "fp16 = functools.partial(torch.cuda.amp.autocast, dtype=torch.float16)")]),
    "functools.partial of an imported name": (
        "from functools import partial\nfrom torch.cuda.amp import autocast\nfp16 = partial(autocast, dtype=None)\n",
        [(2, 28, "UG108", "torch.cuda.amp.autocast", "from torch.cuda.amp import autocast"),
         (3, 16, "UG108", "torch.cuda.amp.autocast", "fp16 = partial(autocast, dtype=None)")]),
    "bound to a name": ("import torch\nctx = torch.cuda.amp.autocast\n",
                        [(2, 7, "UG108", "torch.cuda.amp.autocast", "ctx = torch.cuda.amp.autocast")]),
    "merely imported": ("from torch.cuda.amp import autocast\n",
                        [(1, 28, "UG108", "torch.cuda.amp.autocast", "from torch.cuda.amp import autocast")]),
    "through a module alias": ("import torch.cuda.amp as amp\nctx = amp.autocast\n",
                               [(2, 7, "UG108", "torch.cuda.amp.autocast", "ctx = amp.autocast")]),
    "called through a module alias: one finding, the call": (
        "import torch.cuda.amp as amp\nwith amp.autocast():\n    pass\n",
        [(2, 6, "UG108", "torch.cuda.amp.autocast", "amp.autocast()")]),
    "an attribute of it, in a compound statement's header": (
        "import torch\nif hook is torch.cuda.amp.autocast.__enter__:\n    pass\n",
        [(2, 12, "UG108", "torch.cuda.amp.autocast", "torch.cuda.amp.autocast.__enter__")]),
    "a private TorchScript function bound to a name": (
        "import torch\nscript_if_tracing = torch.jit._script_if_tracing\n",
        [(2, 21, "UG111", "torch.jit._script_if_tracing", "script_if_tracing = torch.jit._script_if_tracing")]),
}


@pytest.mark.parametrize(("source", "expected"), REFERENCE_CASES.values(), ids=REFERENCE_CASES.keys())
def test_references_and_imports_are_found_once(source: str, expected: list[tuple[int, int, str, str, str]]) -> None:
    findings = scan.scan_source(source)
    assert [(f["line"], f["column"], f["code"], f["name"], f["call"]) for f in findings] == expected


def test_private_torchscript_api_says_why() -> None:
    (finding,) = scan.scan_source("import torch\ntorch.jit._script_if_tracing(f)\n")
    assert finding["summary"] == "private TorchScript API"
    assert finding["why"].startswith("Private API: may change or vanish without deprecation.")


def test_a_finding_shows_its_call_on_one_line() -> None:
    source = "import torch\ntraced = torch.jit.trace(\n    model,\n    example,\n)\n"
    (finding,) = scan.scan_source(source)
    assert finding["call"] == "torch.jit.trace( model, example, )"
    long = "import torch\ntorch.jit.trace(model, " + "x" * 200 + ")\n"
    (finding,) = scan.scan_source(long)
    assert len(finding["call"]) == 120 and finding["call"].endswith("…")


NOTHING_CASES = {
    "names in strings and comments": (
        'import torch\n"""torch.jit.trace(model, x) and torch.load(p)"""\n'
        's = "optimize_for_mobile(m)"  # torch.jit.trace(m, x); m._save_for_lite_interpreter(p)\n'),
    "torch.load with weights_only": "import torch\nstate = torch.load(p, weights_only=True)\n",
    "a local function of the same name": "def trace(m, x):\n    return m\n\ntrace(1, 2)\n",
    "the candidate stack's own calls": (
        "import torch\nfrom torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e\n"
        "ep = torch.export.export(model, example)\nprepare_pt2e(ep.module(), quantizer)\n"
        "with torch.amp.autocast('cpu'):\n    pass\n"),
    "another package's autocast": (
        "from functools import partial\nfrom apex.amp import autocast\nimport other.cuda.amp as amp\n"
        "fp16 = partial(autocast)\nctx = amp.autocast\nwith autocast():\n    pass\n"),
    "a local autocast shadowing nothing of torch's": (
        "import torch\n\ndef autocast(enabled=True):\n    return torch.amp.autocast('cpu', enabled=enabled)\n\n"
        "ctx = autocast\n"),
    "public torch.jit names": "import torch\nf = torch.jit.script_if_tracing(g)\nw = torch.jit.wait\n",
}


@pytest.mark.parametrize("source", NOTHING_CASES.values(), ids=NOTHING_CASES.keys())
def test_no_findings(source: str) -> None:
    assert scan.scan_source(source) == []


def test_a_method_of_a_calls_result_is_not_taken_for_the_call() -> None:
    # libcst names `torch.jit.trace(m, x).save` "torch.jit.trace.save": only the inner call counts.
    source = "import torch\ntorch.jit.trace(m, x).save(p)\n"
    assert ours(scan.scan_source(source)) == [(2, 1, "UG101", "torch.jit.trace")]


def test_torch_load_without_weights_only_is_torchfix_tor102_with_our_why() -> None:
    (finding,) = scan.scan_source("import torch\nstate = torch.load(p)\n", "ckpt.py")
    advice = scan.load_rules().torchfix["TOR102"]
    assert finding == {
        "file": "ckpt.py", "line": 2, "column": 9, "code": "TOR102", "source": "torchfix",
        "name": "torch.load", "call": "torch.load(p)",
        "summary": finding["summary"], "why": advice.why,
        "replacement": "torch.load(p, weights_only=True)",  # TorchFix's own fix
        "rewritten": True,  # and the file's rewrite (migrate/project.diff) writes it
    }
    assert "weights_only" in finding["summary"]
    assert "Weights only load failed" in advice.why


def test_torchfix_without_a_fix_gives_our_replacement_hint() -> None:
    # TorchFix does not add weights_only=True when a pickle_module is passed.
    (finding,) = scan.scan_source("import pickle, torch\ntorch.load(p, pickle_module=pickle)\n")
    assert finding["code"] == "TOR102"
    assert finding["replacement"] == scan.load_rules().torchfix["TOR102"].replacement


def test_torchfix_default_selection_runs_its_other_checks() -> None:
    (finding,) = scan.scan_source("import torch\ntorch.solve(a, b)\n")
    assert (finding["code"], finding["source"], finding["name"]) == ("TOR001", "torchfix", "torch.solve")


RULES_WITH_OVERLAP = """
[UG901]
names = ["torch.ao.quantization.*"]
summary = "anything from torch.ao.quantization"
why = "broad"
replacement = "broad fix"

[UG902]
names = ["torch.ao.quantization.prepare"]
kind = "name"
imports = true
summary = "prepare"
why = "exact"
replacement = "exact fix"
"""


def test_a_node_two_rules_match_is_reported_once_by_the_most_specific(tmp_path: Path) -> None:
    (tmp_path / "rules.toml").write_text(RULES_WITH_OVERLAP)
    rule_set = scan.load_rules(tmp_path / "rules.toml")
    source = "from torch.ao.quantization import prepare, convert\nprepare(m)\nconvert(m)\n"
    assert ours(scan.scan_source(source, rule_set=rule_set)) == [
        (1, 35, "UG902", "torch.ao.quantization.prepare"),
        (2, 1, "UG902", "torch.ao.quantization.prepare"),
        (3, 1, "UG901", "torch.ao.quantization.convert"),
    ]


BAD_RULES = {
    "unknown kind": ('[UG1]\nnames = ["a.b"]\nkind = "method"\nsummary = ""\nwhy = ""\nreplacement = ""\n',
                     "Unknown kind 'method' in 'UG1.kind' (expected one of ['name', 'attribute-call'])"),
    "no names": ('[UG1]\nnames = []\nsummary = ""\nwhy = ""\nreplacement = ""\n',
                 "'UG1.names' must be a non-empty list of names"),
    "why not text": ('[UG1]\nnames = ["a.b"]\nsummary = ""\nwhy = 3\nreplacement = ""\n',
                     "Unexpected type int (expected str) in 'UG1.why'"),
    "misspelt key": ('[UG1]\nname = ["a.b"]\n', "Unknown key 'name' in 'UG1' (expected one of "
                     "['imports', 'kind', 'names', 'replacement', 'summary', 'why'])"),
}


@pytest.mark.parametrize(("text", "message"), BAD_RULES.values(), ids=BAD_RULES.keys())
def test_bad_rules_are_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "rules.toml").write_text(text)
    with pytest.raises(scan.RulesError) as raised:
        scan.load_rules(tmp_path / "rules.toml")
    assert str(raised.value) == message


def test_shipped_rules_cover_every_code_once() -> None:
    assert sorted(RULES) == [f"UG{n}" for n in range(101, 112)]
    assert all(rule.summary and rule.why and rule.replacement for rule in RULES.values())


def test_scan_records_a_file_that_does_not_parse_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def f(:\n    pass\n")
    (tmp_path / "good.py").write_text("import torch\ntorch.jit.script(m)\n")
    record = scan.scan(tmp_path, ["bad.py", "good.py"])
    assert record["errors"] == [{"file": "bad.py", "error": "syntax error at line 1, column 7: invalid syntax"}]
    assert [(f["file"], f["code"]) for f in record["findings"]] == [("good.py", "UG101")]
    assert record["files_scanned"] == 2


def test_scan_takes_each_file_once(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "a.py").write_text("import torch\ntorch.jit.trace(m, x)\n")
    record = scan.scan(tmp_path, ["app/a.py", "./app/a.py"])
    assert record["files_scanned"] == 1 and record["files"] == ["app/a.py"]


@pytest.mark.parametrize(("path", "message"), [
    ("missing.py", "file 'missing.py' does not exist under --root '{root}'"),
    ("../x.py", "file '../x.py' is outside --root '{root}'"),
    # Which files are the team's is the parent's to say (upgrade_gate/project/source.py), not the scanner's.
    ("app", "'app' is not a file; name the files to scan (upgrade-gate chooses them: upgrade_gate/project/source.py)"),
])
def test_scan_names_a_bad_path(tmp_path: Path, path: str, message: str) -> None:
    (tmp_path / "root" / "app").mkdir(parents=True)
    (tmp_path / "x.py").write_text("")
    with pytest.raises(scan.ScanPathError) as raised:
        scan.scan(tmp_path / "root", [path])
    assert str(raised.value) == message.format(root=(tmp_path / "root").resolve())


def sample_files(*paths: str) -> list[str]:
    """The sample project's source as the parent chooses it for the scanner."""
    from upgrade_gate.project.source import project_files

    return [p.as_posix() for p in project_files(SAMPLE_PROJECT, paths or (".",), suffix=".py")]


def test_scan_of_the_sample_project_finds_every_planted_call_and_nothing_else() -> None:
    record = scan.scan(SAMPLE_PROJECT, sample_files())
    assert record["errors"] == []
    found = [(f["file"], f["line"], f["column"], f["code"]) for f in record["findings"]]
    planted = [(file, *where_planted(file, call), code) for file, call, code in PLANTED]
    assert found == sorted(planted)


def test_cli_writes_the_record(tmp_path: Path) -> None:
    out = tmp_path / "out" / "scan.json"
    listing, progress = tmp_path / "files.txt", tmp_path / "progress.json"
    files = sample_files("edge_app")
    listing.write_text("".join(f"{f}\n" for f in files[1:]))
    done = subprocess.run([sys.executable, str(SCAN_PY), "--root", str(SAMPLE_PROJECT), "--out", str(out),
                           "--files-from", str(listing), "--progress", str(progress), files[0]],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    record = json.loads(out.read_text())
    assert record["schema_version"] == "1.0"
    assert record["scanner"]["torchfix"] == "0.7.0" and record["scanner"]["rules"] == len(RULES)
    assert (record["root"], record["files"], record["files_scanned"]) == (str(SAMPLE_PROJECT), files, 6)
    assert len(record["findings"]) == len(PLANTED)
    assert list(out.parent.iterdir()) == [out]  # no temporary file left beside it
    # How far it was, before the last file.
    assert json.loads(progress.read_text()) == {"done": 5, "total": 6, "file": files[-1]}


def test_cli_bad_root_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    done = subprocess.run([sys.executable, str(SCAN_PY), "--root", str(missing), "--out", str(tmp_path / "o.json")],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"scan: error: --root {str(missing)!r} is not a directory\n")
    assert not (tmp_path / "o.json").exists()


# timm/layers/patch_embed.py (issue 26): `vmap` is torch's or functorch's, whichever imports. libcst gives the
# call both qualified names, as a set; TorchFix took the first in set order, so its TOR101 for functorch.vmap
# came and went with PYTHONHASHSEED.
EITHER_VMAP = """\
try:
    from torch import vmap
except ImportError:
    from functorch import vmap


def resample_all(kernels, resample_kernel):
    v_resample_kernel = vmap(vmap(resample_kernel, 0, 0), 1, 1)
    return v_resample_kernel(kernels)
"""


def test_a_call_with_two_qualified_names_is_judged_under_each() -> None:
    torchfix = [(f["line"], f["column"], f["code"], f["name"]) for f in scan.scan_source(EITHER_VMAP)
                if f["source"] == "torchfix"]
    # The import is TorchFix's TOR103 whatever the order; each call is TOR101 under its functorch name.
    assert torchfix == [(4, 5, "TOR103", "functorch"),
                        (8, 25, "TOR101", "functorch.vmap"), (8, 30, "TOR101", "functorch.vmap")]


def test_the_scan_does_not_depend_on_hash_order(tmp_path: Path) -> None:
    (tmp_path / "patch_embed.py").write_text(EITHER_VMAP)
    shutil.copytree(SAMPLE_PROJECT / "edge_app", tmp_path / "edge_app")
    records = {}
    for seed in range(2):  # 0 found TOR101 here before the fix, 1 did not
        out = tmp_path / f"scan-{seed}.json"
        done = subprocess.run([sys.executable, str(SCAN_PY), "--root", str(tmp_path), "--out", str(out),
                               "patch_embed.py", *(f"edge_app/{f.name}" for f in sorted((tmp_path / "edge_app").glob("*.py")))],
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)})
        assert (done.returncode, done.stderr) == (0, "")
        records[seed] = json.loads(out.read_text())["findings"]
    assert {code for finding in records[0] for code in [finding["code"]]} >= {"TOR101", "UG101", "TOR102"}
    assert all(findings == records[0] for findings in records.values())


def test_every_torchfix_code_in_a_legend_says_something_of_its_own() -> None:
    # Issue 37: TorchFix names the function in each TOR101 message, so its findings shared no summary, and the
    # report's legend said "TOR101 (2): (no explanation)". Our note explains the code; each row keeps its name.
    from upgrade_gate.report._project_section import scan_blocks
    from upgrade_gate.report.render import to_markdown
    from upgrade_gate.schema.project import ProjectResults, ScanResults
    from upgrade_gate.schema.reader import Reader

    source = "import functorch, torch\nfunctorch.vmap(f)(x)\nfunctorch.grad(g)(x)\ntorch.solve(a, b)\ntorch.lstsq(a, b)\n"
    findings = scan.scan_source(source, "timm/layers.py")
    assert sorted(f["code"] for f in findings) == ["TOR001", "TOR001", "TOR101", "TOR101"]
    record = {"schema_version": "1.0", "scanner": {"torchfix": "0.7.0", "rules": 11}, "files_scanned": 1,
              "findings": findings, "errors": []}
    project = ProjectResults(root="/team", install=(".",), test=("pytest",), allow={}, stacks={}, diffs={},
                             scan=ScanResults.from_reader(Reader(record, "scan.json")))
    text = to_markdown(scan_blocks(project))
    advice = scan.load_rules().torchfix
    for code in ("TOR001", "TOR101"):
        legend = next(line for line in text.splitlines() if line.startswith(f"- **{code}** (2): "))
        assert legend.startswith(f"- **{code}** (2): {advice[code].why}")  # the replacement: where shared
    assert "no explanation" not in text
    # TorchFix renders vmap's fix: the row says the file's rewrite writes it (✎).
    assert "| timm/layers.py:2 | TOR101 ✎ | `functorch.vmap(f)` | Use of deprecated function functorch.vmap |" in text


# Version guards as teams write them (issue 63: ultralytics' `if TORCH_2_4: … else: torch.cuda.amp.GradScaler`), each
# with the lines of its findings the candidate's torch 2.8.0 never runs: (source, lines set aside, lines counted).
GUARD_CASES = {
    "a release flag's else": (
        "import torch\nif TORCH_2_4:\n    s = torch.amp.GradScaler('cuda')\nelse:\n    s = torch.cuda.amp.GradScaler()\n",
        [5], []),
    "a flag of a later release": ("import torch\nif TORCH_2_9:\n    pass\nelse:\n    s = torch.cuda.amp.GradScaler()\n",
                                  [], [5]),
    "a flag negated, through an attribute": (
        "import torch\nfrom ultralytics import utils\nif not utils.TORCH_1_13:\n    torch.jit.trace(m, x)\n", [4], []),
    "torch.__version__ against a string": (
        "import torch\nif torch.__version__ < '2.4':\n    torch.jit.trace(m, x)\nelse:\n    torch.jit.script(m)\n",
        [3], [5]),
    "version.parse on both sides, the literal on the left": (
        "import torch\nfrom packaging import version\nif version.parse('2.10') <= version.parse(torch.__version__):\n"
        "    pass\nelif True:\n    torch.jit.trace(m, x)\n", [], [6]),
    "a module's TORCH_VERSION against a tuple": (
        "import torch\nif TORCH_VERSION >= (2, 0):\n    pass\nelse:\n    torch.jit.trace(m, x)\n", [5], []),
    "an elif chain after a guard that holds": (
        "import torch\nif TORCH_2_0:\n    pass\nelif x:\n    torch.jit.trace(m, x)\nelse:\n    torch.jit.script(m)\n",
        [5, 7], []),
    "a guard and a condition it cannot read": (
        "import torch\nif TORCH_2_4 and use_amp:\n    pass\nelse:\n    torch.jit.trace(m, x)\n", [], [5]),
    "a guard that cannot hold, and-ed with one it cannot read": (
        "import torch\nif not TORCH_2_0 and use_amp:\n    torch.jit.trace(m, x)\n", [3], []),
    "hasattr, which needs the candidate's torch to read": (
        "import torch\nif hasattr(torch, 'compile'):\n    pass\nelse:\n    torch.jit.trace(m, x)\n", [], [5]),
}


@pytest.mark.parametrize(("source", "aside", "counted"), GUARD_CASES.values(), ids=GUARD_CASES.keys())
def test_a_call_a_version_guard_keeps_from_the_candidates_torch_is_set_aside(
        source: str, aside: list[int], counted: list[int]) -> None:
    found = scan.scan_source(source, torch_versions=["2.8.0+cu128"])
    assert [f["line"] for f in found if f.get("set_aside")] == aside
    assert [f["line"] for f in found if not f.get("set_aside")] == counted
    assert all(f["set_aside"].endswith("on the candidate's torch 2.8.0: this branch never runs there")
               for f in found if f.get("set_aside"))
    # Without the candidate's release, no guard is read: every finding counts.
    assert [f["line"] for f in scan.scan_source(source)] == sorted(aside + counted)


def test_a_guard_the_candidates_releases_read_differently_sets_nothing_aside() -> None:
    source = "import torch\nif TORCH_2_4:\n    pass\nelse:\n    torch.jit.trace(m, x)\n"
    assert [f.get("set_aside") for f in scan.scan_source(source, torch_versions=["2.2.2", "2.8.0"])] == [None]
    assert scan.scan_source(source, torch_versions=["2.8.0", "2.9.1"])[0]["set_aside"].startswith(
        "`TORCH_2_4` is True on the candidate's torch 2.8.0, 2.9.1")


# torch.load whose weights_only comes through a mapping (issue 63: a wrapper that sets it in kwargs): TOR102 or not.
KWARGS_CASES = {
    "set by key before the call": ('def load(f, **kw):\n    kw["weights_only"] = False\n    return torch.load(f, **kw)\n',
                                   "weights_only is set in kw at line 3, before the call"),
    "setdefault": ('def load(f, **kw):\n    kw.setdefault("weights_only", True)\n    return torch.load(f, **kw)\n',
                   "weights_only is set in kw at line 3, before the call"),
    "a dict built with it": ('def load(f):\n    kw = dict(map_location="cpu", weights_only=True)\n'
                             '    return torch.load(f, **kw)\n', "weights_only is set in kw at line 3, before the call"),
    "a literal mapping": ('def load(f):\n    return torch.load(f, **{"weights_only": True})\n',
                          "weights_only is passed in the ** mapping"),
    "set after the call": ('def load(f, **kw):\n    m = torch.load(f, **kw)\n    kw["weights_only"] = True\n    return m\n',
                           None),
    "set in another function": ('def prepare(kw):\n    kw["weights_only"] = True\n\n'
                                'def load(f, **kw):\n    return torch.load(f, **kw)\n', None),
    "a mapping that never has it": ('def load(f, **kw):\n    kw["map_location"] = "cpu"\n    return torch.load(f, **kw)\n',
                                    None),
}


@pytest.mark.parametrize(("source", "why"), KWARGS_CASES.values(), ids=KWARGS_CASES.keys())
def test_torch_load_given_weights_only_through_its_kwargs_is_not_tor102(source: str, why: str | None) -> None:
    (finding,) = scan.scan_source("import torch\n" + source, torch_versions=["2.8.0"])
    assert (finding["code"], finding.get("set_aside")) == ("TOR102", why)


def test_cli_takes_the_candidates_torch_and_records_what_it_set_aside(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(GUARD_CASES["a release flag's else"][0])
    out = tmp_path / "scan.json"
    done = subprocess.run([sys.executable, str(SCAN_PY), "--root", str(tmp_path), "--out", str(out),
                           "--torch", "2.8.0", "train.py"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert (record["torch"], record["findings"]) == (["2.8.0"], [])
    assert [(f["file"], f["line"], f["code"]) for f in record["set_aside"]] == [("train.py", 5, "UG108")]
