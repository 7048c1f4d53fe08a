"""The command a person typed, so that every message tells them to type the same one: ``upgrade-gate compare``
or ``nox -s compare`` (upgrade_gate.cli sets ``$UPGRADE_GATE_COMMAND`` before it runs nox in its own process).
"""

from __future__ import annotations

import os

COMMAND_ENV_VAR = "UPGRADE_GATE_COMMAND"
CLI = "upgrade-gate"


def command(session: str, args: str = "") -> str:
    """``session`` (and ``args``, its options after ``--``) as the user would type it now."""
    name = f'"{session}"' if "(" in session else session
    text = f"{CLI} {name}" if os.environ.get(COMMAND_ENV_VAR) == CLI else f"nox -s {name}"
    return f"{text} -- {args}" if args else text
