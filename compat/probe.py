"""What is really installed in a stack, whether its adapter keeps the contract,
and whether a project's model factories give models the tool can run."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from .common import RECORDS_VERSION, MethodNameRefused, build_case, cpu_and_isa, error_record
from .contract import capabilities, missing


def probe(distributions: list[str], adapter: Any) -> dict[str, Any]:
    """What is really installed in this stack, for the report's provenance, and what its
    adapter module (or the error that loading it raised) offers."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import torch

    cpu, isa = cpu_and_isa()
    return {
        "schema_version": RECORDS_VERSION,
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "isa": isa,  # what XNNPACK and the kernels dispatch on: the figures measured here are of this machine
        "torch_version": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "distributions": versions,
        "adapter": _adapter(adapter),
    }


def _adapter(adapter: Any) -> dict[str, Any]:
    """The contract's members the adapter lacks (compat/contract.py), and its capabilities."""
    if isinstance(adapter, BaseException):
        return {"error": f"{type(adapter).__name__}: {adapter}"}
    return {"missing": missing(adapter), "capabilities": capabilities(adapter)}


def check_factory(job: dict[str, Any]) -> dict[str, Any]:
    """Import and call a user's factory: does it give a model the tool can run?"""
    try:
        case = build_case(job)
        return {"ok": True, "methods": list(case.entry_points()), "task": case.task.kind}
    except MethodNameRefused as refused:  # the parent words it, with its rule
        return {"ok": False, "refused_method": refused.method, "error": str(refused)}
    except Exception as error:  # noqa: BLE001 - reported to the user as a config error
        return {"ok": False, "error": f"{type(error).__name__}: {error}",
                "traceback_tail": error_record(error)["traceback_tail"]}
