"""The candidate's runtime binding: ExecuTorch's compiled module, chosen once for everything that loads a
.pte (executorch_xnnpack.py, executorch_diagnose.py, executorch_profile.py).

It is imported directly: the public wrapper (executorch.extension.pybindings.portable_lib) only
re-exports it, after importing executorch.exir for a warning class, which costs ~20 s per process
here. A phone app has no exir either.
"""

from __future__ import annotations

import torch  # noqa: F401 - first: the extension links against torch's libraries

# isort: split
# `import a.b as c`, not `from a import b`: only the first raises ModuleNotFoundError for a missing module.
try:
    import executorch.extension.pybindings._portable_lib as binding
except ModuleNotFoundError:  # executorch 1.5 renamed the compiled module _C
    import executorch.extension.pybindings._C as binding

__all__ = ["binding"]
