"""Deciding: the workers' records gathered into results (gather), outputs compared (numerics, agreement),
and every gate and the verdict (policy: the rule; the _*_gates modules: each gate)."""
