"""Running the stages: the one pipeline (pipeline), the stacks' venvs (venvs), the worker processes and
their supervision (runner, supervisor), the result cache (cache), shards, progress, and how a session
ends (guard)."""
