"""What a run is asked to do: ``[tool.upgrade-gate]`` (settings), the stack specs (specs), the models by
name (catalog), and one run's plan (plan) — all checked before any venv is built."""
