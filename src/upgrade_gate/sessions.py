"""upgrade-gate's nox sessions in a team's own noxfile.py — one line:

    import upgrade_gate.sessions  # noqa: F401  (nox -s compare, compat, report, diff, …)

The sessions are upgrade-gate's noxfile (upgrade_gate.layout.NOXFILE), loaded here under a name
that keeps the team's nox defaults (``nox.options.sessions`` …) its own. Run from the team's
folder, they read its pyproject.toml ($UPGRADE_GATE_CONFIG overrides), as ``upgrade-gate`` does.
"""

from __future__ import annotations

import importlib.util
import sys

from upgrade_gate.layout import NOXFILE, NOXFILE_IN_TEAM_NOXFILE

if NOXFILE_IN_TEAM_NOXFILE not in sys.modules:  # nox registers a session once
    _spec = importlib.util.spec_from_file_location(NOXFILE_IN_TEAM_NOXFILE, NOXFILE)
    assert _spec is not None and _spec.loader is not None
    _noxfile = importlib.util.module_from_spec(_spec)
    sys.modules[NOXFILE_IN_TEAM_NOXFILE] = _noxfile
    _spec.loader.exec_module(_noxfile)
