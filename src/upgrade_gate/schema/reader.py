"""Typed access to JSON, with a context path on error: ``Unexpected type str (expected float) in
'stacks/candidate/models/vit-ti16/runtime.json: stages[3].duration_s'``."""

from __future__ import annotations

from typing import Any

from upgrade_gate.errors import RecordError

# How JSON, which has no such numbers, carries them: as these strings.
NON_FINITE = ("inf", "-inf", "nan")


class Reader:
    """Typed access to one JSON object, remembering where it came from: the one way records are read, the
    workers' and the report's (through schema/codec.py) alike."""

    def __init__(self, data: Any, where: str) -> None:
        self.data = data
        self.where = where

    def _get(self, key: str, kind: type | tuple[type, ...], *, required: bool) -> Any:
        if not isinstance(self.data, dict):
            raise RecordError(f"Unexpected type {type(self.data).__name__} (expected object) in {self.where!r}")
        if key not in self.data:
            if required:
                raise RecordError(f"Missing key {key!r} in {self.where!r}")
            return None
        value = self.data[key]
        if value is None and not required:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise RecordError(f"Unexpected type {type(value).__name__} (expected {expected}) in '{self.where}.{key}'")
        return value

    def text(self, key: str) -> str:
        return self._get(key, str, required=True)

    def opt_text(self, key: str) -> str | None:
        return self._get(key, str, required=False)

    def number(self, key: str) -> float:
        value = self._number(key, required=True)
        assert value is not None
        return value

    def _number(self, key: str, *, required: bool) -> float | None:
        # JSON has no infinity: non-finite floats are written "inf", "-inf", "nan" (atomic.to_json).
        if isinstance(self.data, dict) and self.data.get(key) in NON_FINITE:
            return float(self.data[key])
        value = self._get(key, (int, float), required=required)
        return None if value is None else float(value)

    def opt_integer(self, key: str) -> int | None:
        value = self._get(key, int, required=False)
        return None if value is None else int(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._get(key, bool, required=False)
        return default if value is None else value

    def opt_dict(self, key: str) -> dict[str, Any]:
        return self._get(key, dict, required=False) or {}

    def child(self, key: str) -> Reader | None:
        value = self._get(key, dict, required=False)
        return None if value is None else Reader(value, f"{self.where}.{key}")

    def required_child(self, key: str) -> Reader:
        return Reader(self._get(key, dict, required=True), f"{self.where}.{key}")

    def children(self, key: str) -> list[Reader]:
        return [Reader(item, f"{self.where}.{key}[{i}]") for i, item in enumerate(self._get(key, list, required=True))]

    def opt_children(self, key: str) -> list[Reader] | None:
        """The list's items, or None when the key is absent or null."""
        if self._get(key, list, required=False) is None:
            return None
        return self.children(key)
