"""The worker's stages in pipeline order, and what a stage's status says.

Each stage runs under its own deadline (``[tool.upgrade-gate.timeouts]``);
"start" is the time before the first stage (interpreter start, imports) and
"default" covers any stage without its own entry.
"""

from __future__ import annotations

# compat/worker.py's phases: export, then runtime (docs/architecture.md).
EXPORT_STAGES = ("build", "eager", "eager-task", "quantize", "export", "localize", "save", "backends")
RUNTIME_STAGES = ("inputs", "load", "run", "task", "profile")
# The measurement server's steps (upgrade_gate.measure.rounds): start → load and first
# inference → warm-up, then one round at a time.
MEASURE_STAGES = ("warm-up", "round")
# Stages that explain a result rather than produce one: a profiler that is not
# there, the search behind a failed export, or another backend's export-only
# try is no failure of the artifact.
DIAGNOSTIC_STAGES = ("profile", "localize", "backends")
STAGE_STATUSES = ("ok", "failed", "skipped", "running", "timeout", "crashed", "out-of-memory", "interrupted",
                  "killed", "not-run", "vanished")
# A stage that did not finish for a reason that is not the model's: the run was stopped
# (Ctrl-C, SIGTERM) while it ran ("interrupted"), its worker was killed from outside with no
# out-of-memory kill counted ("killed": someone's kill -9, process_group.killed_from_outside),
# nothing recorded its end ("running"), its phase never started for this report
# ("not-run"), or a file the tool gave it (a fixture, an asset) was removed from outside while it
# ran ("vanished", compat/phases.py). A re-run resumes them.
UNFINISHED_STATUSES = ("interrupted", "killed", "running", "not-run", "vanished")
