"""Per-stack adapters and the worker that runs inside each stack's venv.

A stack spec's ``adapter`` key (``envs/*.toml``) names one of the adapters here
(``torchscript_mobile``, ``executorch_xnnpack``) or a file of the team's own; what
an adapter provides is the contract in ``contract.py``. The rest runs for every
stack: ``worker.py`` (the entry point) with ``phases.py``, ``measure_server.py``,
``probe.py`` and ``common.py``; ``localize.py`` (where an export breaks) with
``export_errors.py`` (what its errors say); the diagnose phases, each its own entry
(``diagnose_phase.py`` with ``culprit.py``, ``precision_phase.py`` with ``precision.py``,
``export_remedy_phase.py``, ``latency_phase.py``). ``quoting.py``: how a text the tool did not write goes
into a file it generates (Python, Markdown). What an adapter builds on: ``torchscript_diagnose.py``;
``executorch_runtime.py``, ``executorch_precision.py``, ``executorch_diagnose.py``,
``executorch_profile.py`` and ``executorch_backends.py``; ``reproducers.py``, the reproducers' scripts as text.
Imports run one way: an adapter imports what it re-exports, never the reverse. ``scan.py`` (with its rules,
``migration_rules.toml``) runs in the scan venv of `nox -s scan` (TorchFix, libcst) over
the team's source.
Nothing in this package is imported by the parent process.
"""
