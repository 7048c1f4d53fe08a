"""The parent package's imports run one way: bottom to top, each layer imports only the layers below it
(and its own package), never one above, never a package beside it, and no modules import each other in a
circle. Every import counts — at the top of a module or inside a function — except those under
``if TYPE_CHECKING:``, which run only for the type checker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers.imports import circles

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "upgrade_gate"

# Bottom to top: upgrade_gate's top-level modules and subpackages by layer. Packages side by side in a layer
# never import each other (judge and report: the judge decides, the records keep its decisions and the report
# only renders them; measure and project); the foundation's and the entry points' modules are each one piece
# and import each other freely (without a circle).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "text", "layout", "_atomic", "_confined", "invocation", "stages", "stats"),
    ("config",),
    ("schema",),
    ("judge", "report"),
    ("run",),
    ("measure", "project"),
    ("migrate",),
    ("pipeline",),
    ("releases",),
    ("cli", "sessions", "__main__"),
)
ONE_PIECE = (LAYERS[0], LAYERS[-1])

# Imports that must run upward, each inside a function with a comment saying why: (importing module,
# imported module) → why. A new one fails the test until it is added here, knowingly.
UPWARD_ON_PURPOSE: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it sits inside a function, skipping ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _under_type_checking(child):
                for other in child.orelse:
                    visit_one(other, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, in_function))
        visit(node, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


def imports(root: Path) -> list[tuple[str, Path, int, str, bool]]:
    """Every import of a module of the package under ``root`` (the folder that holds it): (importing module,
    its file, line, imported module, inside a function). ``from pkg import name`` imports the module
    ``pkg.name`` where there is one, else ``pkg``."""
    modules = {module_name(path, root): path for path in (root / PACKAGE).rglob("*.py")}
    found = []
    for importer, path in sorted(modules.items()):
        is_package = path.name == "__init__.py"
        for node, in_function in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parent = importer.split(".")[: len(importer.split(".")) - node.level + is_package]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            found += [(importer, path, node.lineno, target, in_function) for target in dict.fromkeys(targets)
                      if target == PACKAGE or target.startswith(PACKAGE + ".")]
    return found


def piece(module: str) -> str:
    """The top-level module or subpackage of upgrade_gate a module belongs to (``__init__``: the package's own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(module: str) -> int:
    name = piece(module)
    for index, names in enumerate(LAYERS):
        if name in names:
            return index
    raise AssertionError(f"{module} is in no layer: add {name!r} to test_layers.LAYERS")


def wrong_way(importer: str, imported: str) -> bool:
    """Whether this import runs upward, or sideways between packages side by side in a layer."""
    if piece(importer) == piece(imported):
        return False
    here, there = layer(importer), layer(imported)
    return there > here or (there == here and LAYERS[here] not in ONE_PIECE)


def upward(root: Path) -> list[str]:
    """Every import that runs the wrong way, as file:line: importer -> imported, but those on purpose."""
    problems = []
    for importer, path, line, imported, in_function in imports(root):
        if not wrong_way(importer, imported):
            continue
        where = f"{path.relative_to(root.parent).as_posix()}:{line}: {importer} imports {imported}"
        if (importer, imported) not in UPWARD_ON_PURPOSE:
            how = "side by side with" if layer(importer) == layer(imported) else "below"
            problems.append(f"{where} ({piece(importer)} is {how} {piece(imported)})")
        elif not in_function:
            problems.append(f"{where}: an import that runs upward on purpose belongs inside the function that "
                            "needs it")
    return problems


def loops(root: Path) -> list[str]:
    """Every loop of imports between modules, as the modules along it."""
    graph: dict[str, set[str]] = {}
    for importer, _, _, imported, _ in imports(root):
        graph.setdefault(importer, set()).add(imported)
    return [" -> ".join([*loop, loop[0]]) for loop in circles(graph)]


pytestmark = pytest.mark.lint


def test_every_import_runs_down_the_layers():
    problems = upward(REPO / "src")
    assert not problems, "imports that run upward or sideways:\n" + "\n".join(problems)


def test_no_modules_import_each_other_in_a_circle():
    found = loops(REPO / "src")
    assert not found, "modules that import each other in a circle:\n" + "\n".join(found)


def test_every_upward_import_on_purpose_is_still_there():
    there = {(importer, imported) for importer, _, _, imported, _ in imports(REPO / "src")}
    assert not set(UPWARD_ON_PURPOSE) - there, "listed in UPWARD_ON_PURPOSE but no longer imported"


def test_every_module_is_in_a_layer():
    for path in (REPO / "src" / PACKAGE).rglob("*.py"):
        layer(module_name(path, REPO / "src"))


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_check_finds_an_upward_a_sideways_and_a_circular_import(tmp_path, monkeypatch):
    """The check itself, on a package of its own: what runs upward or sideways is named with its file and
    line, wherever the import sits; an import for the type checker alone is not one; a circle is found."""
    root = write(tmp_path / "src", {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/errors.py": "",
        f"{PACKAGE}/config/__init__.py": "",
        f"{PACKAGE}/config/settings.py": "from upgrade_gate.errors import x\nfrom ..judge import runner\n",
        f"{PACKAGE}/judge/__init__.py": "",
        f"{PACKAGE}/judge/runner.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from upgrade_gate.report import write\n"
                                     "def f():\n    from upgrade_gate.report import write\n"
                                     "from . import cache\n"),
        f"{PACKAGE}/judge/cache.py": "import upgrade_gate.judge.runner\n",
        f"{PACKAGE}/report/__init__.py": "",
        f"{PACKAGE}/report/write.py": "from upgrade_gate import errors\n",
    })
    assert upward(root) == [
        "src/upgrade_gate/config/settings.py:2: upgrade_gate.config.settings imports upgrade_gate.judge.runner "
        "(config is below judge)",
        "src/upgrade_gate/judge/runner.py:5: upgrade_gate.judge.runner imports upgrade_gate.report.write "
        "(judge is side by side with report)",
    ]
    assert loops(root) == ["upgrade_gate.judge.runner -> upgrade_gate.judge.cache -> upgrade_gate.judge.runner"]
    # On purpose: inside a function, as listed; at a module's top, still named.
    monkeypatch.setitem(UPWARD_ON_PURPOSE, ("upgrade_gate.judge.runner", "upgrade_gate.report.write"), "why")
    monkeypatch.setitem(UPWARD_ON_PURPOSE, ("upgrade_gate.config.settings", "upgrade_gate.judge.runner"), "why")
    assert upward(root) == [
        "src/upgrade_gate/config/settings.py:2: upgrade_gate.config.settings imports upgrade_gate.judge.runner: an "
        "import that runs upward on purpose belongs inside the function that needs it",
    ]
