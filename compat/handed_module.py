"""A module handed on whole, for a reproducer of a failure that comes before any program exists (torch.export
raising): torch.save pickles its classes by reference, so the files of the modules that define them, where no
installed package has them (the suite's or a team's own model code), are copied beside it under their import
names, with the modules of the same package that are loaded (their relative imports). The reproducer puts its
folder first on sys.path; the installed packages (torch, transformers, timm …) come from the venv that runs it."""

from __future__ import annotations

import shutil
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any

MODULE = "module.pt"


def save_module(module: Any, folder: Path) -> list[str]:
    """``module`` pickled as module.pt in ``folder``, and its own code beside it: the files copied, relative."""
    import torch

    try:
        torch.save(module, folder / MODULE)
    except Exception as failure:  # said where the reproducer would be: the localization stands
        (folder / MODULE).unlink(missing_ok=True)
        raise ValueError(f"{type(module).__name__} does not pickle whole (torch.save: {type(failure).__name__}: "
                         f"{failure})") from failure
    copied = []
    for name, file in own_code(module).items():
        parts = name.split(".")
        target = folder.joinpath(*parts, "__init__.py") if file.name == "__init__.py" else \
            folder.joinpath(*parts[:-1], f"{parts[-1]}.py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
        copied.append(target.relative_to(folder).as_posix())
    return sorted(copied)


def own_code(module: Any) -> dict[str, Path]:
    """Import name → source file of every loaded module in a top-level package that defines a class of
    ``module``'s tree and is not installed (outside the interpreter's and its venv's library folders)."""
    paths = sysconfig.get_paths()
    libraries = {Path(p).resolve() for p in (*(paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
                                             *site.getsitepackages())}

    def installed(file: str) -> bool:
        return any(Path(file).resolve().is_relative_to(root) for root in libraries)

    packages = set()
    for sub in module.modules():
        name = type(sub).__module__
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and not installed(file):
            packages.add(name.partition(".")[0])
    files = {name: str(getattr(loaded, "__file__", None) or "") for name, loaded in sorted(sys.modules.items())
             if name.partition(".")[0] in packages}
    return {name: Path(file) for name, file in files.items() if file.endswith(".py")}
