"""Which uses of torch in a project's source change on the candidate stack: an API-migration scan.

    python compat/scan.py --root PROJECT_DIR --out OUT.json [--files-from LIST] [--progress FILE] [FILE ...]

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
scanned), files_scanned, findings and errors (files that could not be read or parsed). While it
runs, --progress FILE holds {"done", "total", "file"}: how far it is. A finding is
{file (relative to root, POSIX), line, column (both 1-based; an import's is its name's),
code (UGnnn ours, TORnnn TorchFix's), source ("upgrade-gate" | "torchfix"), name (the
qualified name matched; the method name for attribute-call rules), call (the source, one
line: the call or import; for another reference, the statement holding it), summary, why,
replacement}. Findings are sorted by file, line, column and code.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import sys
import tempfile
import tokenize
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import ParentNodeProvider, QualifiedNameProvider, WhitespaceInclusivePositionProvider
from torchfix.common import TorchError, TorchVisitor
from torchfix.torchfix import get_visitors_with_error_codes, process_error_code_str

SCHEMA_VERSION = "1.0"
RULES_PATH = Path(__file__).with_name("migration_rules.toml")
CALL_TEXT_LIMIT = 120
RULE_KINDS = ("name", "attribute-call")
SORT_FIELDS = ("file", "line", "column", "code", "name")
RULE_KEYS = {"names", "kind", "imports", "summary", "why", "replacement"}
ADVICE_KEYS = {"why", "replacement"}


class RulesError(ValueError):
    """migration_rules.toml is not what scan.py reads."""


class ScanPathError(ValueError):
    """--root or a FILE that cannot be scanned."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One table of migration_rules.toml."""

    code: str
    names: tuple[str, ...]
    kind: str
    imports: bool
    summary: str
    why: str
    replacement: str

    def specificity(self, name: str) -> tuple[int, int] | None:
        """How closely one of the rule's names matches `name` (higher is closer), or None."""
        best: tuple[int, int] | None = None
        for pattern in self.names:
            if pattern.endswith("*"):
                prefix = pattern[:-1]  # "pkg.mod." also matches pkg.mod itself; "pkg._" does not match pkg
                matches = name.startswith(prefix) or (prefix.endswith(".") and name == prefix[:-1])
                score = (0, len(prefix)) if matches else None
            else:
                score = (1, len(pattern)) if name == pattern else None
            if score is not None and (best is None or score > best):
                best = score
        return best


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


def _one_line(node: cst.CSTNode) -> str:
    """The node's source on one line, cut to CALL_TEXT_LIMIT characters."""
    text = " ".join(line.strip() for line in cst.Module([]).code_for_node(node).splitlines()).strip()
    return text if len(text) <= CALL_TEXT_LIMIT else text[: CALL_TEXT_LIMIT - 1] + "…"


def _calls_through_a_call(func: cst.BaseExpression) -> bool:
    """True for `f(a).g`-style callees, whose qualified name libcst would report as `f.g`."""
    while isinstance(func, cst.Attribute):
        func = func.value
    return isinstance(func, cst.Call)


def _chain(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`a.b.c`, `a.b`, `a`: the node and the references inside it, outermost first."""
    chain = [node]
    while isinstance(node, cst.Attribute):
        node = node.value
        chain.append(node)
    return chain


@dataclass(frozen=True, kw_only=True, slots=True)
class _Hit:
    line: int
    column: int
    shown: cst.CSTNode  # whose source text the finding shows
    rule: Rule
    name: str


class MigrationVisitor(TorchVisitor):
    """Our rules, as a TorchFix-style visitor (batched with TorchFix's own)."""

    METADATA_DEPENDENCIES = (*TorchVisitor.METADATA_DEPENDENCIES, ParentNodeProvider)
    ERRORS: list[TorchError] = []  # our codes come from the toml, not from TorchError entries

    def __init__(self, rules: Sequence[Rule]) -> None:
        super().__init__()
        self.name_rules = [rule for rule in rules if rule.kind == "name"]
        self.attribute_rules = [rule for rule in rules if rule.kind == "attribute-call"]
        self.import_rules = [rule for rule in self.name_rules if rule.imports]
        self.hits: list[_Hit] = []
        # Every call's qualified names by id(node), to name TorchFix's findings after the visit.
        self.call_names: dict[int, set[str]] = {}
        # References already reported, or part of one that was (by id): the visit goes from a
        # call to its callee and from `a.b.c` to `a.b`, and one use is one finding.
        self.seen_references: set[int] = set()

    @staticmethod
    def _best(rules: Sequence[Rule], names: set[str]) -> tuple[Rule, str] | None:
        # The most specific rule wins, so a node that two rules match is reported once.
        best: tuple[tuple[int, int], int, Rule, str] | None = None
        for order, rule in enumerate(rules):
            for name in sorted(names):
                score = rule.specificity(name)
                if score is not None and (best is None or (score, -order) > (best[0], best[1])):
                    best = (score, -order, rule, name)
        return None if best is None else (best[2], best[3])

    def _qualified_names(self, node: cst.CSTNode) -> set[str]:
        return {qualified.name for qualified in self.get_metadata(QualifiedNameProvider, node, set())}

    def _mark_seen(self, reference: cst.BaseExpression) -> None:
        self.seen_references.update(id(part) for part in _chain(reference))

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Call):
            self.call_names[id(node)] = self._qualified_names(node)
        if isinstance(node.func, cst.Attribute) and self.attribute_rules:
            match = self._best(self.attribute_rules, {node.func.attr.value})
            if match is not None:
                self._hit(node, node, *match)
                self._mark_seen(node.func)
                return
        if isinstance(node.func, cst.Call) or _calls_through_a_call(node.func):
            return
        match = self._best(self.name_rules, self.call_names[id(node)])
        if match is not None:
            self._hit(node, node, *match)
            self._mark_seen(node.func)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # `@torch.jit.script` with no parentheses calls it all the same.
        if isinstance(node.decorator, cst.Call) or _calls_through_a_call(node.decorator):
            return
        match = self._best(self.name_rules, self._qualified_names(node.decorator))
        if match is not None:
            self._hit(node.decorator, node, *match)
            self._mark_seen(node.decorator)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Attribute | cst.Name) -> None:
        """A use that is not a call: `ctx = torch.cuda.amp.autocast`, `partial(autocast, ...)`."""
        if id(node) in self.seen_references:
            return
        chain = _chain(node)
        self._mark_seen(node)
        if not isinstance(chain[-1], cst.Name):
            return  # `f(x).g`, `x[0].g`: libcst's name for them is not what they refer to
        # The outermost part a rule names: `torch.cuda.amp.autocast.__enter__` is autocast's use.
        for part in chain:
            match = self._best(self.name_rules, self._qualified_names(part))
            if match is not None:
                self._hit(node, self._statement(node), *match)
                return

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The small statement holding node (`ctx = autocast`), or node itself in a compound one's header."""
        parent: cst.CSTNode | None = node
        while parent is not None and not isinstance(parent, cst.BaseSmallStatement):
            if isinstance(parent, cst.BaseCompoundStatement | cst.Decorator):
                return node
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return parent or node

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._import_hit(node, alias, cst.helpers.get_full_name_for_node(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return  # the project's own modules
        module = cst.helpers.get_full_name_for_node(node.module)
        if isinstance(node.names, cst.ImportStar):
            self._import_hit(node, node, module)
            return
        for alias in node.names:
            self._import_hit(node, alias, f"{module}.{cst.helpers.get_full_name_for_node(alias.name)}")

    def _import_hit(self, statement: cst.CSTNode, where: cst.CSTNode, name: str | None) -> None:
        if name is None or not self.import_rules:
            return
        match = self._best(self.import_rules, {name})
        if match is not None:
            self._hit(where, statement, *match)

    def _hit(self, where: cst.CSTNode, shown: cst.CSTNode, rule: Rule, name: str) -> None:
        # Positions as TorchFix's add_violation takes them (metadata is gone after the visit).
        start = self.get_metadata(WhitespaceInclusivePositionProvider, where).start
        self.hits.append(_Hit(line=start.line, column=start.column + 1, shown=shown, rule=rule, name=name))


class _EveryQualifiedName:
    """Has a TorchFix visitor judge a call under each of its qualified names, sorted. libcst names `vmap(f)` both
    torch.vmap and functorch.vmap after `try: from torch import vmap / except ImportError: from functorch …`,
    as a set; TorchFix 0.7 judged only the first in set order, so its TOR101 came and went with
    PYTHONHASHSEED (issue 26). Elsewhere (misc's BinaryOperation check) the first name sorted is used."""

    def __init__(self, visitor: TorchVisitor) -> None:
        self.visitor = visitor
        self.forced: dict[int, str] = {}  # id(call) → the name it is judged under
        self.names_of: dict[int, str] = {}  # id(violation) → the name it was found under (the finding's name)
        # libcst's batched visit collects bound methods with inspect.getmembers: instance attributes count.
        visitor.get_qualified_name_for_call = self.get_qualified_name_for_call
        self.original_visit_call: Any = getattr(type(visitor), "visit_Call", None)
        if self.original_visit_call is not None:
            visitor.visit_Call = self.visit_Call

    def names(self, node: cst.Call) -> list[str]:
        if isinstance(node.func, cst.Call):
            return []  # `vmap(a)(b)`: the outer call's names are the inner's (TorchFix's own guard)
        return sorted({q.name for q in self.visitor.get_metadata(QualifiedNameProvider, node, set())})

    def get_qualified_name_for_call(self, node: cst.Call) -> str | None:
        return self.forced.get(id(node)) or next(iter(self.names(node)), None)

    def visit_Call(self, node: cst.Call) -> None:
        for name in self.names(node) or [""]:
            before, self.forced[id(node)] = len(self.visitor.violations), name
            try:
                self.original_visit_call(self.visitor, node)
            finally:
                del self.forced[id(node)]
            self.names_of.update((id(v), name) for v in self.visitor.violations[before:] if name)


def _torchfix_name(node: cst.CSTNode, call_names: dict[int, set[str]]) -> str:
    if isinstance(node, cst.Call):
        names = sorted(call_names.get(id(node), ()))
        return names[0] if names else cst.helpers.get_full_name_for_node(node.func) or ""
    if isinstance(node, cst.ImportFrom) and node.module is not None:
        return cst.helpers.get_full_name_for_node(node.module) or ""
    return cst.helpers.get_full_name_for_node(node) or ""


def _scan_text(text: str, filename: str, rule_set: RuleSet) -> list[dict[str, Any]]:
    """Findings in one file's source; raises libcst.ParserSyntaxError when it does not parse."""
    wrapper = cst.MetadataWrapper(cst.parse_module(text))
    selected = process_error_code_str(None)  # TorchFix's default: all but TOR3, TOR4, TOR9
    # In a fixed order: TorchFix makes them from a set of classes.
    torchfix_visitors = [_EveryQualifiedName(v) for v in sorted(get_visitors_with_error_codes(selected),
                                                                key=lambda v: type(v).__qualname__)]
    ours = MigrationVisitor(rule_set.rules)
    wrapper.visit_batched([*(driven.visitor for driven in torchfix_visitors), ours])

    findings = []
    for hit in ours.hits:
        findings.append({"file": filename, "line": hit.line, "column": hit.column, "code": hit.rule.code,
                         "source": "upgrade-gate", "name": hit.name, "call": _one_line(hit.shown),
                         "summary": hit.rule.summary, "why": hit.rule.why, "replacement": hit.rule.replacement})
    violations = [(v, d.names_of.get(id(v))) for d in torchfix_visitors for v in d.visitor.violations]
    for violation, found_as in violations:
        if violation.error_code not in selected:
            continue  # a visitor may also report codes that are off by default
        advice = rule_set.torchfix.get(violation.error_code, Advice(why="", replacement=""))
        replacement = (cst.Module([]).code_for_node(violation.replacement)
                       if violation.replacement is not None else advice.replacement)
        findings.append({"file": filename, "line": violation.line, "column": violation.column + 1,
                         "code": violation.error_code, "source": "torchfix",
                         "name": found_as or _torchfix_name(violation.node, ours.call_names),
                         "call": _one_line(violation.node), "summary": violation.message, "why": advice.why,
                         "replacement": replacement})
    return _sorted_unique(findings)


def _sorted_unique(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    unique = {json.dumps(finding, sort_keys=True): finding for finding in findings}  # sorted on every field, last
    return [unique[k] for k in sorted(unique, key=lambda k: (*(unique[k][f] for f in SORT_FIELDS), k))]


def scan_source(text: str, filename: str = "x.py", rule_set: RuleSet | None = None) -> list[dict[str, Any]]:
    """Findings in a piece of source, as scan() reports them.

    Raises libcst.ParserSyntaxError for source that does not parse (scan() records it instead)."""
    return _scan_text(text, filename, rule_set or _default_rules())


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
         progress: Path | None = None) -> dict[str, Any]:
    """The scan record for FILEs (relative to root), as the module docstring describes it; how far it is
    written to ``progress`` before each file.

    Raises ScanPathError for a root that is not a folder and a FILE that is missing, a folder or outside it."""
    rule_set = rule_set or _default_rules()
    if not Path(root).is_dir():
        raise ScanPathError(f"--root {str(root)!r} is not a directory")
    root = Path(root).resolve()
    paths = resolve_files(root, files)
    findings: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for done, path in enumerate(paths):
        relative = path.relative_to(root).as_posix()
        if progress is not None:
            write_json({"done": done, "total": len(paths), "file": relative}, progress)
        text = ""
        try:
            text = _read_source(path)
            findings.extend(_scan_text(text, relative, rule_set))
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
        "findings": _sorted_unique(findings),
        "errors": errors,
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
    parser.add_argument("files", nargs="*", metavar="FILE", help="files relative to --root")
    args = parser.parse_args(argv)
    listed = args.files_from.read().splitlines() if args.files_from else []
    try:
        record = scan(args.root, [*args.files, *(line for line in listed if line)], progress=args.progress)
    except (ScanPathError, RulesError) as error:
        print(f"scan: error: {error}", file=sys.stderr)
        return 2
    write_json(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
