"""The page's figures (report.html only): each drawn by report/plots.py when the page is written,
so matplotlib is imported then and not before."""

from __future__ import annotations

from collections.abc import Callable

from upgrade_gate.report.render import Block, Figure
from upgrade_gate.schema.results import Results
from upgrade_gate.stats import CONFIDENCE


def plot_figures(results: Results) -> list[Block]:
    latency = [g.threshold.value for g in results.verdict.gates if g.gate == "latency" and g.threshold]
    threshold = max(latency) if latency else None
    return [
        Figure("plot-latency", "Latency: median per call of every method, per model and stack",
               drawing("latency", results)),
        Figure("plot-latency-ratio",
               f"Latency ratio candidate / baseline with its interval (at least {CONFIDENCE:.0%} coverage)"
               + (f" (the gate fails when the whole interval is above {threshold:g})" if threshold else ""),
               drawing("ratios", results)),
        Figure("plot-numerics", "Numerics: SNR and relative L2 error of each candidate artifact against the reference",
               drawing("numerics", results)),
        Figure("plot-stages", "Export success: every stage of every model in every stack", drawing("stages", results)),
        Figure("plot-size-memory", "Artifact size and runtime memory", drawing("size_memory", results)),
    ]


def drawing(name: str, *args: object) -> Callable[[], str | None]:
    def draw() -> str | None:
        from upgrade_gate.report import _plots

        figure: str | None = getattr(_plots, name)(*args)
        return figure
    return draw
