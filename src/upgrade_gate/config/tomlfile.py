"""Reading TOML with tomlkit, and typed getters that name the key on error."""

from __future__ import annotations

import re
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
    duplicate = _duplicate_key(text)
    if duplicate:
        raise ConfigError(f"invalid TOML at {duplicate[0]}: key {duplicate[1]!r} is set twice; keep one",
                          path=path) from None
    try:
        return tomlkit.parse(text).unwrap()
    except tomlkit.exceptions.TOMLKitError as error:  # ParseError, and KeyAlreadyPresent where tomllib saw none
        row, column = getattr(error, "line", None), getattr(error, "col", None)
        reason = str(error.args[0] if error.args else error).split(" at line")[0]
        if "'\\x00'" in reason:  # tomlkit's way of saying the file ended early
            reason = "unexpected end of file"
        where = f" at line {row}, column {column}" if row is not None else ""
        raise ConfigError(f"invalid TOML{where}: {reason}", path=path) from None


# The standard library's parser words a key set twice in these ways (Python 3.11 to 3.14). tomlkit's own way has
# changed between releases (KeyAlreadyPresent up to 0.13, a ParseError "Key ... already exists." from 0.15), so a
# duplicate is found by tomllib, whose messages move with the Python, not with a dependency's release.
_SET_TWICE = re.compile(r"^(?:Cannot overwrite a value|Cannot declare \((?P<table>.*)\) twice|"
                        r"Duplicate inline table key '(?P<inline>[^']*)')")
_AT = re.compile(r"\(at (line \d+, column \d+)\)$")
_KEY_OF_LINE = re.compile(r"^\s*(?P<key>[^=\[\]#]+?)\s*=")


def _duplicate_key(text: str) -> tuple[str, str] | None:
    """Where a key is set twice, and the key (dotted as written), or None if the text sets none twice."""
    try:
        tomllib.loads(text)
        return None
    except tomllib.TOMLDecodeError as error:
        message = str(error.args[0] if error.args else error)
        matched, at = _SET_TWICE.match(message), _AT.search(message)
        if not matched or not at:
            return None
    if matched["inline"] is not None:
        return at[1], matched["inline"]
    if matched["table"] is not None:
        return at[1], ".".join(part.strip().strip("'\"") for part in matched["table"].split(",") if part.strip())
    line_number = int(at[1].split()[1].rstrip(","))
    line = text.splitlines()[line_number - 1] if line_number <= len(text.splitlines()) else ""
    key = _KEY_OF_LINE.match(line)
    return at[1], key["key"].strip().strip("'\"") if key else line.strip()


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


def _kind_name(kind: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "an array",
        dict: "a table",
    }.get(kind, kind.__name__)
