"""The team's tests' outcomes, read from the JUnit XML their command wrote: the one place that reads it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("passed", "failed", "error", "skipped")
NOT_PASSING = ("failed", "error")
# Enough of a failure to see why, not the whole traceback (that is in the log).
MESSAGE_LINES = 12
MESSAGE_CHARS = 2000
# Terminal colours in an exception's text (torch's UnpicklingError has them), raw or as pytest
# escapes them for XML ("#x1B[1m").
_ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseOutcome:
    test_id: str
    outcome: str  # one of OUTCOMES
    message: str = ""  # the failure's, error's or skip's message and the start of its details
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test_id, "outcome": self.outcome, "message": self.message, "duration_s": self.duration_s}


def read_junit(path: Path) -> dict[str, CaseOutcome]:
    """Every test case in a JUnit XML file, by test id; ValueError if it is not JUnit XML."""
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        raise ValueError(f"{path}: not XML ({error})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"{path}: not JUnit XML (root element <{root.tag}>)")
    tests = {}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = _message(child.get("message", ""), child.text or "")
                break
        test_id = case_id(case.get("classname", ""), case.get("name", ""), case.get("file"))
        tests[test_id] = CaseOutcome(test_id=test_id, outcome=outcome, message=message,
                                     duration_s=float(case.get("time") or 0.0))
    return tests


def case_id(classname: str, name: str, file: str | None) -> str:
    """pytest's node id ("tests/test_io.py::TestLoad::test_old") where the XML names
    the file (junit_family=xunit1), else "classname::name"."""
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".").replace("\\", ".")
        if classname == module or classname.startswith(module + "."):
            inner = classname[len(module) + 1:]
            return "::".join([file.replace("\\", "/"), *(inner.split(".") if inner else []), name])
    return f"{classname}::{name}" if classname else name


def _message(summary: str, details: str) -> str:
    """What went wrong, cut to MESSAGE_CHARS: pytest's "E" lines (the exception, whole) where the
    details have them, else the message and — when they add to it — the end of the details."""
    summary, details = _ANSI.sub("", summary).strip(), _ANSI.sub("", details)
    lines = [line for line in details.strip().splitlines() if line.strip()]
    raised = [line[1:].strip() for line in lines if line.startswith("E ")]
    if raised:
        text = "\n".join(raised)
    elif not lines:
        text = summary
    else:
        tail = "\n".join(lines[-MESSAGE_LINES:])
        text = summary if summary and summary in tail else f"{summary}\n{tail}".strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…"


def counts(tests: dict[str, CaseOutcome]) -> dict[str, int]:
    return {outcome: sum(t.outcome == outcome for t in tests.values()) for outcome in OUTCOMES}
