"""Errors the user can fix. Each names the file and key, and suggests the fix."""

from __future__ import annotations

EXIT_GO = 0
EXIT_NO_GO = 1
EXIT_USAGE = 2


class ConfigError(ValueError):
    """Bad configuration, stack spec or command line: exits 2 with one message."""

    def __init__(self, message: str, *, path: object = None, key: str | None = None) -> None:
        self.path = path
        self.key = key
        where = str(path) if path is not None else ""
        if key:
            where = f"{where}: {key}" if where else key
        super().__init__(f"{where}: {message}" if where else message)


class RecordError(ValueError):
    """A record file that does not have the shape this version writes."""
