"""How numbers and messages are written in every report: one convention each (sizes binary, as the memory
settings are). Nothing here decides anything."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# A message longer than this is cut in tables and one-line summaries (the record keeps it whole).
LINE_CHARS = 160


def first_line(text: str, limit: int = LINE_CHARS) -> str:
    """The first non-blank line, cut to ``limit`` characters."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return short(line, limit)


def short(value: Any, limit: int = LINE_CHARS) -> str:
    """``value`` as text on one line, cut to ``limit`` characters."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain(value: Any) -> str:
    """A record's value as words, never Python's repr of a dict or list: a mapping as "key value, …" (a nested
    one in parentheses), a list's items joined by " / ", None as "—", a float to 6 significant digits."""
    if isinstance(value, Mapping):
        return ", ".join(f"{key} ({plain(item)})" if isinstance(item, Mapping) and item else f"{key} {plain(item)}"
                         for key, item in value.items()) or "—"
    if isinstance(value, (list, tuple)):
        return " / ".join(plain(item) for item in value) or "—"
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def num(value: float | None, fmt: str = "{:.2e}") -> str:
    """A number, "—" when there is none, ∞ for an infinite one."""
    if value is None:
        return "—"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    return fmt.format(value)


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} ms"


def speed_against(value_ms: float, reference_ms: float, reference: str) -> str:
    """How fast a latency is beside another, in words: "6.14× faster than fp32", "1.25× slower than fp32".
    A bare "6.14× fp32" read as six times fp32's time (issue 37)."""
    ratio = reference_ms / value_ms
    if f"{ratio:.2f}" == "1.00":
        return f"as fast as {reference}"
    return f"{ratio:.2f}× faster than {reference}" if ratio > 1 else f"{1 / ratio:.2f}× slower than {reference}"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def size(count: float | None) -> str:
    """A size in bytes: B, KiB, MiB or GiB; "—" when there is none."""
    if not count:
        return "—"
    for unit, step in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= step:
            return f"{count / step:.2f} {unit}" if unit == "GiB" else f"{count / step:.1f} {unit}"
    return f"{int(count)} B"


def exact_size(count: float) -> str:
    """A size with its exact bytes, for thresholds: "1.40 GiB (1,500,000,000 B)"."""
    return f"{size(count)} ({int(count):,} B)" if count >= 2**10 else f"{int(count)} B"
