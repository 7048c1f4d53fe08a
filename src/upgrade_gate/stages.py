"""The worker's stages in pipeline order, each under its own deadline (``[tool.upgrade-gate.timeouts]``), and
what a stage's status says."""

from __future__ import annotations

# compat/worker.py's phases: export, then runtime (docs/architecture.md).
EXPORT_STAGES = ("build", "eager", "eager-task", "quantize", "export", "localize", "save", "backends")
RUNTIME_STAGES = ("inputs", "load", "run", "task", "profile")
# The measurement server's steps (upgrade_gate.measure.rounds): start → load and first
# inference → warm-up, then one round at a time.
MEASURE_STAGES = ("warm-up", "round")
# Stages that explain a result rather than produce one: their failure is no failure of the artifact.
DIAGNOSTIC_STAGES = ("profile", "localize", "backends")
STAGE_STATUSES = ("ok", "failed", "skipped", "running", "timeout", "crashed", "out-of-memory", "interrupted",
                  "killed", "not-run", "vanished")
# A stage that did not finish for a reason that is not the model's: the run was stopped, its worker killed from
# outside (process_group.killed_from_outside), nothing recorded its end, its phase never started, or a file the
# tool gave it was removed from outside while it ran (compat/phases.py). A re-run resumes them.
UNFINISHED_STATUSES = ("interrupted", "killed", "running", "not-run", "vanished")
