"""Which uses of torch in a project's source change on the candidate stack: an API-migration scan.

    python compat/scan.py --root PROJECT_DIR --out OUT.json [--files-from LIST] [--progress FILE]
                          [--torch VERSION ...] [FILE ...]

Runs TorchFix's own checks (its default selection) and our rules
(compat/migration_rules.toml: TorchScript capture, Lite Interpreter artifacts, FX
quantization, ... with why each matters on torch 2.8 + ExecuTorch 0.7) over the FILEs (relative
to PROJECT_DIR; LIST holds more, one a line), and writes one JSON record of findings. Which files
are the team's source is the parent's to say (upgrade_gate/project/source.py: no venv, no report
folder, no cache), so that the files scanned are the files that key a cached scan.

It reads source only and never imports torch, so it runs in its own small venv (TorchFix 0.7,
which brings libcst and PyYAML), not inside a stack. Names resolve through imports and aliases
with libcst's QualifiedNameProvider, as TorchFix's own visitors do: `import torch.jit as J;
J.trace(m, x)` is torch.jit.trace, and a name that only appears in a string or a comment is
nothing. A use is a call, a bare decorator or any other reference (`ctx =
torch.cuda.amp.autocast`, `partial(autocast, ...)` after `from torch.cuda.amp import autocast`),
each reported once: a call is not also reported as the reference it calls.

The record: schema_version, scanner (versions, number of our rules), root, files (those
scanned), files_scanned, torch (the candidates' releases), findings, set_aside (findings a
candidate never meets, each with ``set_aside``: why; compat/scan_guards.py) and errors (files
that could not be read or parsed) and rewrites (per file whose findings have one: {file, sha256 of the file
as scanned, text: its source with them written for the candidate}; compat/scan_rewrites.py). While it
runs, --progress FILE holds {"done", "total", "file"}: how far it is. A finding is
{file (relative to root, POSIX), line, column (both 1-based; an import's is its name's),
code (UGnnn ours, TORnnn TorchFix's), source ("upgrade-gate" | "torchfix"), name (the
qualified name matched; the method name for attribute-call rules), call (the source, one
line: the call or import; for another reference, the statement holding it), summary, why,
replacement, and rewritten: true where the file's rewrite writes it}. Findings are sorted by file, line, column
and code.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import tokenize
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import libcst as cst
from torchfix.torchfix import get_visitors_with_error_codes, process_error_code_str


def _beside(name: str) -> ModuleType:
    """A module of the scan's beside this file: the scan runs as a script, with -P, so its folder is not on
    sys.path (the parent keys a cached scan by these files: upgrade_gate.project.session.SCANNER_FILES)."""
    spec = importlib.util.spec_from_file_location(f"{__name__}_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:  # mypy reads compat/ as a package
    from .scan_guards import SetAsides
    from .scan_rewrites import has_rewrite, rewrite
    from .scan_visitor import EveryQualifiedName, MigrationVisitor, Rule, one_line, torchfix_name
else:
    SetAsides = _beside("scan_guards").SetAsides
    _rewrites = _beside("scan_rewrites")
    has_rewrite, rewrite = _rewrites.has_rewrite, _rewrites.rewrite
    _visitor = _beside("scan_visitor")
    EveryQualifiedName, MigrationVisitor, Rule = _visitor.EveryQualifiedName, _visitor.MigrationVisitor, _visitor.Rule
    one_line, torchfix_name = _visitor.one_line, _visitor.torchfix_name

SCHEMA_VERSION = "1.0"
RULES_PATH = Path(__file__).with_name("migration_rules.toml")
RULE_KINDS = ("name", "attribute-call")
SORT_FIELDS = ("file", "line", "column", "code", "name")
RULE_KEYS = {"names", "kind", "imports", "summary", "why", "replacement"}
ADVICE_KEYS = {"why", "replacement"}


class RulesError(ValueError):
    """migration_rules.toml is not what scan.py reads."""


class ScanPathError(ValueError):
    """--root or a FILE that cannot be scanned."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Advice:
    """Our why and replacement hint for one TorchFix code."""

    why: str
    replacement: str


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    torchfix: dict[str, Advice]


def _text(table: dict[str, Any], key: str, context: str, *, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise RulesError(f"Unexpected type {type(value).__name__} (expected str) in '{context}.{key}'")
    return value


def load_rules(path: Path = RULES_PATH) -> RuleSet:
    """Our rules and TorchFix advice from the toml, checked."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RulesError(f"cannot read rules {str(path)!r}: {error}") from None
    advice_tables = data.pop("torchfix", {})
    rules = []
    for code, table in data.items():
        if not isinstance(table, dict):
            raise RulesError(f"Unexpected type {type(table).__name__} (expected table) in '{code}'")
        unknown = sorted(set(table) - RULE_KEYS)
        if unknown:
            raise RulesError(f"Unknown key {unknown[0]!r} in '{code}' (expected one of {sorted(RULE_KEYS)})")
        names = table.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise RulesError(f"'{code}.names' must be a non-empty list of names")
        kind = _text(table, "kind", code, default="name")
        if kind not in RULE_KINDS:
            raise RulesError(f"Unknown kind {kind!r} in '{code}.kind' (expected one of {list(RULE_KINDS)})")
        imports = table.get("imports", False)
        if not isinstance(imports, bool):
            raise RulesError(f"Unexpected type {type(imports).__name__} (expected bool) in '{code}.imports'")
        rules.append(Rule(code=code, names=tuple(names), kind=kind, imports=imports,
                          summary=_text(table, "summary", code), why=_text(table, "why", code),
                          replacement=_text(table, "replacement", code)))
    advice = {}
    for code, table in advice_tables.items():
        context = f"torchfix.{code}"
        unknown = sorted(set(table) - ADVICE_KEYS)
        if unknown:
            raise RulesError(f"Unknown key {unknown[0]!r} in '{context}' (expected one of {sorted(ADVICE_KEYS)})")
        advice[code] = Advice(why=_text(table, "why", context, default=""),
                              replacement=_text(table, "replacement", context, default=""))
    return RuleSet(rules=tuple(rules), torchfix=advice)


@functools.cache
def _default_rules() -> RuleSet:
    return load_rules(RULES_PATH)


def _scan_text(text: str, filename: str, rule_set: RuleSet,
               torch_versions: Sequence[str] = ()) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Findings in one file's source, those set aside (each with why: compat/scan_guards.py) for the
    candidates' ``torch_versions``, and the source with the findings that have a rewrite written for the candidate
    (compat/scan_rewrites.py; each such finding says ``rewritten``); raises libcst.ParserSyntaxError when it does
    not parse."""
    wrapper = cst.MetadataWrapper(cst.parse_module(text))
    selected = process_error_code_str(None)  # TorchFix's default: all but TOR3, TOR4, TOR9
    # In a fixed order: TorchFix makes them from a set of classes.
    torchfix_visitors = [EveryQualifiedName(v) for v in sorted(get_visitors_with_error_codes(selected),
                                                                key=lambda v: type(v).__qualname__)]
    ours, guards = MigrationVisitor(rule_set.rules), SetAsides(torch_versions)
    wrapper.visit_batched([*(driven.visitor for driven in torchfix_visitors), ours, guards])

    findings: list[dict[str, Any]] = []
    for hit in ours.hits:
        findings.append({"file": filename, "line": hit.line, "column": hit.column, "code": hit.rule.code,
                         "source": "upgrade-gate", "name": hit.name, "call": one_line(hit.shown),
                         "summary": hit.rule.summary, "why": hit.rule.why, "replacement": hit.rule.replacement})
    nodes: list[cst.CSTNode | None] = [None] * len(findings)
    shown: list[cst.CSTNode | None] = [hit.shown for hit in ours.hits]  # the node a rewrite replaces
    fixes: dict[int, cst.CSTNode] = {}  # TorchFix's replacements, by id(node)
    violations = [(v, d.names_of.get(id(v))) for d in torchfix_visitors for v in d.visitor.violations]
    for violation, found_as in violations:
        if violation.error_code not in selected:
            continue  # a visitor may also report codes that are off by default
        advice = rule_set.torchfix.get(violation.error_code, Advice(why="", replacement=""))
        replacement = (cst.Module([]).code_for_node(violation.replacement)
                       if violation.replacement is not None else advice.replacement)
        findings.append({"file": filename, "line": violation.line, "column": violation.column + 1,
                         "code": violation.error_code, "source": "torchfix",
                         "name": found_as or torchfix_name(violation.node, ours.call_names),
                         "call": one_line(violation.node), "summary": violation.message, "why": advice.why,
                         "replacement": replacement})
        nodes.append(violation.node)
        shown.append(violation.node)
        if violation.replacement is not None:
            fixes[id(violation.node)] = violation.replacement
    whys = [guards.why_set_aside(f["code"], f["line"], node) for f, node in zip(findings, nodes, strict=True)]
    # What the candidate meets is rewritten; what a version guard keeps from it is not.
    counted = [(f, node) for f, node, why in zip(findings, shown, whys, strict=True) if not why]
    ours_found = {id(node): f["name"] for f, node in counted
                  if f["source"] == "upgrade-gate" and isinstance(node, cst.Call) and has_rewrite(f["name"])}
    theirs_found = {id(node): fixes[id(node)] for f, node in counted if f["source"] == "torchfix" and id(node) in fixes}
    needed = sorted({(item.module_name, item.obj_name) for driven in torchfix_visitors
                     for item in getattr(driven.visitor, "needed_imports", ())})
    rewritten, done = rewrite(wrapper.module, ours_found, theirs_found, needed)
    kept = [{**f, "rewritten": True} if id(node) in done else f for f, node in counted]
    return (_sorted_unique(kept),
            _sorted_unique([{**f, "set_aside": why} for f, why in zip(findings, whys) if why]), rewritten)


def _sorted_unique(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    unique = {json.dumps(finding, sort_keys=True): finding for finding in findings}  # sorted on every field, last
    return [unique[k] for k in sorted(unique, key=lambda k: (*(unique[k][f] for f in SORT_FIELDS), k))]


def scan_source(text: str, filename: str = "x.py", rule_set: RuleSet | None = None,
                torch_versions: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Findings in a piece of source, as scan() reports them, those set aside last.

    Raises libcst.ParserSyntaxError for source that does not parse (scan() records it instead)."""
    findings, set_aside, _ = _scan_text(text, filename, rule_set or _default_rules(), torch_versions)
    return findings + set_aside


def rewrite_source(text: str, filename: str = "x.py", rule_set: RuleSet | None = None,
                   torch_versions: Sequence[str] = ()) -> str:
    """The source with the findings that have a rewrite written for the candidate, as scan() records it."""
    return _scan_text(text, filename, rule_set or _default_rules(), torch_versions)[2]


def resolve_files(root: Path, files: Sequence[str]) -> list[Path]:
    """The files to scan (resolved), each once, in order; ScanPathError names one that is missing, not a
    file, or outside root."""
    found: dict[Path, None] = {}
    for given in files:
        target = (root / given).resolve()
        if not target.exists():
            raise ScanPathError(f"file {given!r} does not exist under --root {str(root)!r}")
        if not target.is_relative_to(root):
            raise ScanPathError(f"file {given!r} is outside --root {str(root)!r}")
        if not target.is_file():
            raise ScanPathError(f"{given!r} is not a file; name the files to scan (upgrade-gate chooses them: "
                                "upgrade_gate/project/source.py)")
        found[target] = None
    return list(found)


def _read_source(path: Path) -> str:
    with tokenize.open(path) as source:  # honours a PEP 263 coding line and a BOM
        return source.read()


def _syntax_error_text(text: str, filename: str, error: cst.ParserSyntaxError) -> str:
    # Python's own parser places the error where the code goes wrong; libcst's
    # position is often where it gave up, a line later.
    try:
        compile(text, filename, "exec", dont_inherit=True)
    except SyntaxError as python_error:
        return f"syntax error at line {python_error.lineno}, column {python_error.offset}: {python_error.msg}"
    except ValueError:
        pass  # e.g. a null byte, which compile() rejects without a position
    return f"libcst cannot parse it (line {error.editor_line}, column {error.editor_column}): {error.message}"


def scan(root: Path, files: Sequence[str], rule_set: RuleSet | None = None,
         progress: Path | None = None, torch_versions: Sequence[str] = ()) -> dict[str, Any]:
    """The scan record for FILEs (relative to root), as the module docstring describes it; how far it is
    written to ``progress`` before each file.

    Raises ScanPathError for a root that is not a folder and a FILE that is missing, a folder or outside it."""
    rule_set = rule_set or _default_rules()
    if not Path(root).is_dir():
        raise ScanPathError(f"--root {str(root)!r} is not a directory")
    root = Path(root).resolve()
    paths = resolve_files(root, files)
    findings: list[dict[str, Any]] = []
    set_aside: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    rewrites: list[dict[str, str]] = []
    for done, path in enumerate(paths):
        relative = path.relative_to(root).as_posix()
        if progress is not None:
            write_json({"done": done, "total": len(paths), "file": relative}, progress)
        text = ""
        try:
            text = _read_source(path)
            counted, aside, rewritten = _scan_text(text, relative, rule_set, torch_versions)
            findings += counted
            set_aside += aside
            if rewritten != text:
                rewrites.append({"file": relative, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                 "text": rewritten})
        except cst.ParserSyntaxError as error:
            errors.append({"file": relative, "error": _syntax_error_text(text, relative, error)})
        except Exception as error:  # noqa: BLE001 - one bad file is recorded, the scan goes on
            errors.append({"file": relative, "error": f"{type(error).__name__}: {error}"})
    return {
        "schema_version": SCHEMA_VERSION,
        "scanner": {"torchfix": importlib.metadata.version("torchfix"),
                    "libcst": importlib.metadata.version("libcst"),
                    "rules": len(rule_set.rules)},
        "root": str(root),
        "files": [path.relative_to(root).as_posix() for path in paths],
        "files_scanned": len(paths),
        "torch": list(torch_versions),
        "findings": _sorted_unique(findings),
        "set_aside": _sorted_unique(set_aside),
        "errors": errors,
        "rewrites": rewrites,
    }


def write_json(record: dict[str, Any], out: Path) -> None:
    """Write atomically: a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=out.parent, prefix=f".{out.name}.",
                                     suffix=".tmp", delete=False) as handle:
        try:
            json.dump(record, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
        except BaseException:
            handle.close()
            os.unlink(handle.name)
            raise
    os.replace(handle.name, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scan", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="project folder (default: .)")
    parser.add_argument("--out", type=Path, required=True, help="JSON record to write")
    parser.add_argument("--files-from", type=argparse.FileType("r", encoding="utf-8"), metavar="LIST",
                        help="more files to scan, one a line")
    parser.add_argument("--progress", type=Path, metavar="FILE", help="how far the scan is, rewritten per file")
    parser.add_argument("--torch", action="append", default=[], metavar="VERSION",
                        help="a candidate's torch release: calls its version guards keep from it are set aside")
    parser.add_argument("files", nargs="*", metavar="FILE", help="files relative to --root")
    args = parser.parse_args(argv)
    listed = args.files_from.read().splitlines() if args.files_from else []
    try:
        record = scan(args.root, [*args.files, *(line for line in listed if line)], progress=args.progress,
                      torch_versions=args.torch)
    except (ScanPathError, RulesError) as error:
        print(f"scan: error: {error}", file=sys.stderr)
        return 2
    write_json(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
