"""``python -m upgrade_gate`` is the ``upgrade-gate`` command."""

from upgrade_gate.cli import main

main()
