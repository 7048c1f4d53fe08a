"""Errors the user can fix. Each names the file and key, and suggests the fix."""

from __future__ import annotations

# As tools CI systems already know (pytest, ruff): "the thing checked is bad" and
# "the checker could not check" never share a code.
EXIT_GO = 0  # GO or GO-WITH-CONDITIONS
EXIT_NO_GO = 1  # the candidate is not fit
EXIT_USAGE = 2  # a bad configuration or command line
EXIT_INCOMPLETE = 3  # the tool or the machine could not gather the evidence


class ConfigError(ValueError):
    """Bad configuration, stack spec or command line: exits 2 with one message."""

    def __init__(self, message: str, *, path: object = None, key: str | None = None) -> None:
        self.path = path
        self.key = key
        where = str(path) if path is not None else ""
        if key:
            where = f"{where}: {key}" if where else key
        super().__init__(f"{where}: {message}" if where else message)


class RunIncomplete(RuntimeError):
    """The evidence could not be gathered, by no fault of the candidate (a model's code changed under the run):
    exits 3 with this message, what finished kept."""


class RecordError(ValueError):
    """A record file that does not have the shape this version writes."""
