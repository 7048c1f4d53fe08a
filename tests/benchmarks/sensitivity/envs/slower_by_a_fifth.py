"""The legacy adapter, 20% slower: after each call it keeps the core busy for a
fifth of the call's time, as a model variant doing extra work would."""

from __future__ import annotations

import time
from typing import Any

from upgrade_gate_compat import torchscript_mobile
from upgrade_gate_compat.torchscript_mobile import SUFFIX, load, lower, save, set_threads  # noqa: F401

SLOWDOWN = 1.2


def run(program: Any, inputs: Any) -> Any:
    start = time.perf_counter()
    outputs = torchscript_mobile.run(program, inputs)
    end = start + (time.perf_counter() - start) * SLOWDOWN
    while time.perf_counter() < end:
        pass
    return outputs
