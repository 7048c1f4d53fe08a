"""Running the stages: the stacks' venvs (venvs), the worker processes and their supervision (runner,
workers, supervisor), the result cache (cache), shards, progress, and how a session ends (guard). The
pipeline that runs them, with measure, judge and report, is upgrade_gate/pipeline.py."""
