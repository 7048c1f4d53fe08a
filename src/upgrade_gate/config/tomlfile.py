"""Reading TOML with tomlkit, and typed getters that name the key on error."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

import tomlkit
import tomlkit.exceptions

from upgrade_gate.errors import ConfigError

T = TypeVar("T")


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file into plain Python values; ConfigError names file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", path=path) from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8 text (byte {error.object[error.start]:#04x} at line {line}); TOML files are "
                          "UTF-8: save it as UTF-8", path=path) from None
    except OSError as error:
        raise ConfigError(f"cannot read: {error.strerror}", path=path) from None
    try:
        return tomlkit.parse(text).unwrap()
    except tomlkit.exceptions.ParseError as error:
        reason = error.args[0].split(" at line")[0]
        if "'\\x00'" in reason:  # tomlkit's way of saying the file ended early
            reason = "unexpected end of file"
        raise ConfigError(f"invalid TOML at line {error.line}, column {error.col}: {reason}", path=path) from None
    except tomlkit.exceptions.KeyAlreadyPresent as error:
        # tomlkit names the key but not the line; the standard library's parser has the line.
        try:
            tomllib.loads(text)
            where = ""
        except tomllib.TOMLDecodeError as located:
            where = " " + str(located).rpartition("(")[2].rstrip(")")
        key = str(error).split('"')[1] if '"' in str(error) else str(error)
        raise ConfigError(f"invalid TOML{where}: key {key!r} is set twice; keep one", path=path) from None


class Table:
    """A TOML table with its file and dotted key, for messages like
    ``pyproject.toml: tool.upgrade-gate.threads: expected an integer, got 'two'``."""

    def __init__(self, data: dict[str, Any], *, path: Path | None, key: str) -> None:
        self.data = data
        self.path = path
        self.key = key

    def child_key(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def error(self, name: str, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, key=self.child_key(name))

    def reject_unknown(self, known: set[str]) -> None:
        for name in self.data:
            if name not in known:
                raise self.error(name, f"unknown key; expected one of: {', '.join(sorted(known))}")

    def get(self, name: str, kind: type[T], default: T) -> T:
        value = self.data.get(name, default)
        # bool is an int in Python; a TOML `true` is not a thread count.
        if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)  # type: ignore[return-value]
            raise self.error(name, f"expected {_kind_name(kind)}, got {value!r}")
        return value

    def get_str_list(self, name: str, default: list[str]) -> list[str]:
        value = self.get(name, list, default)
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise self.error(f"{name}[{index}]", f"expected a string, got {item!r}")
        return list(value)

    def get_table(self, name: str) -> Table:
        value = self.get(name, dict, {})
        return Table(value, path=self.path, key=self.child_key(name))

    def positive(self, name: str, kind: type[T], default: T, minimum: float = 0) -> T:
        value = self.get(name, kind, default)
        if value < minimum or (minimum == 0 and value <= 0):  # type: ignore[operator]
            bound = f"at least {minimum}" if minimum else "greater than 0"
            raise self.error(name, f"must be {bound}, got {value!r}")
        return value


    def non_negative(self, name: str, kind: type[T], default: T) -> T:
        """A number where 0 means off."""
        value = self.get(name, kind, default)
        if value < 0:  # type: ignore[operator]
            raise self.error(name, f"must be 0 (off) or more, got {value!r}")
        return value


def _kind_name(kind: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "an array",
        dict: "a table",
    }.get(kind, kind.__name__)
