"""compat/ loaded as the worker loads it — a package of its own, under a name of the caller's — in the test's
Python, where only its standard-library imports can run (no torch)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from upgrade_gate.layout import TOOL_ROOT


def compat_module(alias: str, module: str) -> ModuleType:
    """compat/``module``.py, with compat/ registered as the package ``alias``."""
    package = importlib.util.spec_from_file_location(alias, TOOL_ROOT / "compat" / "__init__.py",
                                                     submodule_search_locations=[str(TOOL_ROOT / "compat")])
    assert package is not None and package.loader is not None
    loaded = importlib.util.module_from_spec(package)
    sys.modules[package.name] = loaded
    package.loader.exec_module(loaded)
    return importlib.import_module(f"{alias}.{module}")
