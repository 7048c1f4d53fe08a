"""Per-stack adapters and the worker that runs inside each stack's venv.

A stack spec's ``adapter`` key (``envs/*.toml``) names one of the adapters here
(``torchscript_mobile``, ``executorch_xnnpack``) or a file of the team's own; what
an adapter provides is the contract in ``contract.py``. The rest at the top runs for every
stack: ``worker.py`` (the entry point) with ``phases.py``, ``export_phase.py``, ``runtime_phase.py``,
``measure_server.py``, ``bundle_phase.py``, ``device_runner.py``, ``fork_server.py``, ``probe.py`` and
``common.py``. Two wings, which the worker runs whole: ``diagnose/``, the diagnose phases, each its own
entry; ``search/``, what they share with the adapters (the culprit search, where an export breaks, a
reproducer's texts). What an adapter builds on: ``torchscript_diagnose.py``; ``executorch_runtime.py``,
``executorch_precision.py``, ``executorch_diagnose.py``, ``executorch_profile.py`` and
``executorch_backends.py``; ``reproducers.py``, the reproducers' scripts as text.
Imports run one way: the top imports the wings, ``diagnose/`` imports ``search/``, a wing imports no
adapter, and an adapter imports what it re-exports, never the reverse. ``scan.py`` (with ``scan_visitor.py``
and its rules, ``migration_rules.toml``) runs in the scan venv of `nox -s scan` (TorchFix, libcst) over
the team's source.
Nothing in this package is imported by the parent process.
"""
