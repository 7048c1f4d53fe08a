"""upgrade-gate: should a team move its models from one PyTorch stack to another?

The parent side: reads the configuration and stack specs, starts the workers in
each stack's venv, compares their records, applies the gates and writes the
report. It never imports torch.
"""

__version__ = "0.1.0"
