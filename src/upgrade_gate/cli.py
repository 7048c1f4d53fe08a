"""``upgrade-gate``: the nox sessions of an installed upgrade-gate, in a team's repository.

    upgrade-gate compare [-- --out DIR …]         nox -s compare, with upgrade-gate's own noxfile
    upgrade-gate compat                           the team's tests in every stack, and the API scan
    upgrade-gate report -- SHARD_DIR …            merge shard folders and decide
    upgrade-gate diff -- OLD NEW                  what changed between two reports
    upgrade-gate -l                               every session

Words before the first option are sessions; everything from it on goes to nox as written. The
configuration is the nearest pyproject.toml from the current folder up ($UPGRADE_GATE_CONFIG
overrides); the venvs go to .nox/ beside it and the report to its ``out`` (report/). Nox runs in
this process: its exit status (0 GO, 1 NO-GO, 2 usage, 3 INCOMPLETE) is the command's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from upgrade_gate import __version__
from upgrade_gate.errors import EXIT_USAGE
from upgrade_gate.layout import NOXFILE
from upgrade_gate.settings import CONFIG_ENV_VAR


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml from ``start`` up, as pytest and ruff find theirs."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


def nox_arguments(argv: list[str], config: Path) -> list[str]:
    """``compare report -- --out X`` → nox's own command line, with upgrade-gate's noxfile."""
    sessions = []
    rest = list(argv)
    while rest and not rest[0].startswith("-"):
        sessions.append(rest.pop(0))
    # Given first, so that a user's own --envdir (nox takes the last) still wins.
    return ["--noxfile", str(NOXFILE), "--envdir", str(config.parent / ".nox"),
            *(["--sessions", *sessions] if sessions else []), *rest]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["--version"], ["-V"]):
        print(f"upgrade-gate {__version__}")
        return
    if os.environ.get(CONFIG_ENV_VAR):
        config = Path(os.environ[CONFIG_ENV_VAR]).resolve()
    else:
        found = find_config(Path.cwd())
        if found is None:
            print(f"upgrade-gate: error: no pyproject.toml in {Path.cwd()} or any folder above it; run from your "
                  "repository, or create one (a [tool.upgrade-gate] table in it is optional: see the README)",
                  file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        config = found
    # Nox changes into the noxfile's folder (inside the package): the sessions read this instead.
    os.environ[CONFIG_ENV_VAR] = str(config)
    from nox.__main__ import main as nox_main

    sys.argv = ["upgrade-gate", *nox_arguments(argv, config)]
    nox_main()


if __name__ == "__main__":
    main()
