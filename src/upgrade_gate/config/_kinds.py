"""How each kind of setting is read from TOML and written back: the parsers settings.py declares its keys with."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate.config import catalog
from upgrade_gate.config.tomlfile import Table

# -- how values are read ---------------------------------------------------------------

SEVERITIES = ("hard", "soft", "off")


@dataclass(frozen=True, kw_only=True, slots=True)
class Kind:
    """How one setting's TOML value becomes the value the tool uses, and back."""

    read: Callable[[Table, str, Any, Path], Any]  # (table, key, raw value, the file's folder) → value
    write: Callable[[Any], Any] = lambda value: value


def raw_value(table: Table, key: str, default: Any) -> Any:
    return table.data.get(key, default)


def text_kind(choices: tuple[str, ...] = ()) -> Kind:
    def read(table: Table, key: str, raw: Any, base: Path) -> str:
        value = table.get(key, str, raw)
        if choices and value not in choices:
            raise table.error(key, f"expected one of {', '.join(choices)}; got {value!r}")
        return value
    return Kind(read=read)


def _folder(table: Table, key: str, raw: Any, base: Path) -> Path:
    text = table.get(key, str, raw)
    if not text.strip():
        raise table.error(key, "empty; give a folder")
    return (base / text).resolve()


FOLDER = Kind(read=_folder, write=str)


def _names(table: Table, key: str, raw: Any, base: Path) -> tuple[str, ...]:
    names = table.get_str_list(key, raw)
    if len(set(names)) != len(names):
        raise table.error(key, f"a name appears twice in {names!r}")
    return tuple(names)


NAMES = Kind(read=_names, write=list)


FLAG = Kind(read=lambda table, key, raw, base: table.get(key, bool, raw))


def integer_kind(minimum: int) -> Kind:
    def read(table: Table, key: str, raw: Any, base: Path) -> int:
        return table.positive(key, int, raw, minimum=minimum)
    return Kind(read=read)


def number_kind(*, zero_is_off: bool = False) -> Kind:
    """A finite number: greater than 0, or 0 and more where 0 turns a feature off."""
    def read(table: Table, key: str, raw: Any, base: Path) -> float:
        value = finite(table, key, raw)
        if zero_is_off and value < 0:
            raise table.error(key, f"must be 0 (off) or more, got {value!r}")
        if not zero_is_off and value <= 0:
            raise table.error(key, f"must be greater than 0, got {value!r}")
        return value
    return Kind(read=read)


def finite(table: Table, key: str, default: Any) -> float:
    """A number that is one: TOML's nan and inf are not a duration, a size or a threshold."""
    value = table.get(key, float, default)
    if not math.isfinite(value):
        raise table.error(key, f"must be a finite number, got {table.data.get(key, default)!r}")
    return float(value)


def _threads(table: Table, key: str, raw: Any, base: Path) -> tuple[int, ...]:
    """``threads = [1, 2]``, or one count; each once, in the order given (the first is the default)."""
    counts = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(counts, (list, tuple)) or not counts:
        raise table.error(key, f"expected a thread count or a list of them like [1, 2], got {raw!r}")
    for count in counts:
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise table.error(key, f"thread counts must be integers greater than 0, got {count!r}")
    if len(set(counts)) != len(counts):
        raise table.error(key, f"a thread count appears twice in {list(counts)!r}")
    return tuple(counts)


def total_memory_bytes() -> int:
    """The machine's memory (MemTotal), or 0 where /proc/meminfo is not there."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_memory_limit(table: Table, name: str, raw: Any, total: int) -> int:
    """``"85%"`` of the machine, ``"12 GiB"``, ``"12GB"`` or a number of bytes."""
    hint = 'expected a share of the machine like "85%", a size like "12 GiB", or bytes'
    if isinstance(raw, int) and not isinstance(raw, bool):
        limit = raw
    elif isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            share = float(raw.strip()[:-1])
        except ValueError:
            raise table.error(name, f"{hint}; got {raw!r}") from None
        if not 0 < share <= 100:
            raise table.error(name, f"a share must be in (0, 100]%, got {raw!r}")
        if not total:
            raise table.error(name, "this machine's memory is unknown (no /proc/meminfo); give a size like \"12 GiB\"")
        limit = int(total * share / 100)
    elif isinstance(raw, str):
        size = _SIZE.fullmatch(raw)
        if size is None or size.group(2).upper() not in _UNITS:
            raise table.error(name, f"{hint}; got {raw!r}")
        limit = int(float(size.group(1)) * _UNITS[size.group(2).upper()])
    else:
        raise table.error(name, f"{hint}; got {raw!r}")
    if limit <= 0:
        raise table.error(name, f"must be greater than 0, got {raw!r}")
    return limit


MEMORY = Kind(read=lambda table, key, raw, base: parse_memory_limit(table, key, raw, total_memory_bytes()))
VARIANTS = Kind(read=lambda table, key, raw, base: catalog.load_variants(table, key, tuple(raw)), write=list)
THREADS = Kind(read=_threads, write=list)


def severity(table: Table, name: str, default: str) -> str:
    """A gate's severity: hard, soft or off."""
    value = table.get(name, str, default)
    if value not in SEVERITIES:
        raise table.error(name, f"expected one of {', '.join(SEVERITIES)}, got {value!r}")
    return value
