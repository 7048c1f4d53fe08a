"""The candidate's runtime binding: ExecuTorch's compiled module, chosen once for everything that loads a
.pte (executorch_xnnpack.py, executorch_diagnose.py, executorch_profile.py).

It is imported directly: the public wrapper (executorch.extension.pybindings.portable_lib) only
re-exports it, after importing executorch.exir for a warning class, which costs ~20 s per process
here. A phone app has no exir either. The import itself is the device bundle's runner's (device_runner.py),
which runs where nothing of upgrade-gate is installed.
"""

from __future__ import annotations

from .device_runner import executorch_binding

binding = executorch_binding()

__all__ = ["binding"]
