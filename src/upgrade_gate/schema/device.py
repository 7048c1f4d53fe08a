"""A device's results file: what a bundle's ``run-on-device.sh`` wrote (compat/device_runner.py writes its lines),
one JSON object per line, read back with the file and line in every error: the bundle it ran, the machine, one line
per stack, model, thread count and round, and (on targets timed over ssh) servers and why rounds ended. The last line
is the SHA-256 of those before it: a file edited since does not read, and one without it is of rounds stopped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate.errors import RecordError
from upgrade_gate.schema import codec
from upgrade_gate.schema.measured import Target
from upgrade_gate.schema.reader import Reader

# compat/device_runner.py RESULTS_FORMAT: the runner writes what this reads (it cannot import this package).
RESULTS_FORMAT = 1


class UnfinishedResults(RecordError):
    """A results file without its end line: run-on-device.sh was stopped before every round ran."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleLine(codec.Record):
    manifest_sha256: str
    format: int
    rounds: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRound(codec.Record):
    """One stack's part of one round: each method's timed calls, in ms."""

    model: str
    stack: str
    threads: int
    round: int
    samples_ms: dict[str, tuple[float, ...]]
    verified: bool | None = None  # ExecuTorch's bundled verification passed (None: the runtime has none)
    disturbed: bool = False  # the target's other processes held it back (measure/_contention.py's rule)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceServer(codec.Record):
    """One stack's server for one model and thread count on a target: its cold start and memory."""

    model: str
    stack: str
    threads: int
    load_ms: float
    first_ms: dict[str, float]  # each method's first call after the load
    idle_rss_bytes: int  # resident with the runtime started, nothing loaded
    after_first_run_rss_bytes: int
    peak_rss_bytes: int | None = None  # at its end (None: it gave no end)

    @property
    def runtime_memory_bytes(self) -> int | None:
        """What loading and running the model took: the peak less the started runtime, as on the host."""
        return None if self.peak_rss_bytes is None else max(0, self.peak_rss_bytes - self.idle_rss_bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRoundsEnded(codec.Record):
    """Why one model's rounds at one thread count ended (schema.measured.RoundsEnded's values)."""

    model: str
    threads: int
    ended: str
    stop_early: bool
    tried: int
    most: int = 0  # the rounds they could go on to while an interval straddled (most-rounds); 0: none
    counted: int
    # The intervals the stop rule's looks were designed for (the device gate's: every target × thread count ×
    # method, stats.gate_intervals); 0: a file from before, designed for one target's thread counts × methods.
    intervals: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceFailure(codec.Record):
    """A round that gave no samples, and what the runner said."""

    model: str
    stack: str
    threads: int
    round: int
    error: str


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRun:
    """A whole results file."""

    manifest_sha256: str
    planned_rounds: int
    target: Target
    rounds: tuple[DeviceRound, ...]
    failures: tuple[DeviceFailure, ...]
    servers: tuple[DeviceServer, ...] = ()
    ended: tuple[DeviceRoundsEnded, ...] = ()  # empty: run-on-device.sh's fixed rounds, no contention check

    def ended_of(self, model: str, threads: int) -> DeviceRoundsEnded | None:
        return next((e for e in self.ended if (e.model, e.threads) == (model, threads)), None)


def read_device_results(path: Path, name: str | None = None) -> DeviceRun:
    """The file, whole; RecordError naming the line and what is wrong with it."""
    name = name or path.name
    try:
        raw = path.read_bytes()
        lines = raw.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"{name}: cannot be read ({error})") from error
    _check_end(raw, name)
    lines = lines[:-1]
    parsed = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except ValueError as error:
            raise RecordError(f"{name} line {number}: not a JSON object ({error.args[0]})") from error
        parsed.append((number, Reader(data, f"{name} line {number}")))
    if not parsed:
        raise RecordError(f"{name}: empty (run-on-device.sh writes a line per round)")
    kinds = [reader.text("record") for _, reader in parsed]
    if kinds[0] != "bundle":
        raise RecordError(f"{name} line {parsed[0][0]}: the first line names the bundle (record \"bundle\"), "
                          f"this one is {kinds[0]!r}")
    bundle = BundleLine.from_reader(parsed[0][1])
    if bundle.format != RESULTS_FORMAT:
        raise RecordError(f"{name} line {parsed[0][0]}: format {bundle.format}; this upgrade-gate reads format "
                          f"{RESULTS_FORMAT}")
    targets = [reader for (_, reader), kind in zip(parsed, kinds) if kind == "target"]
    if len(targets) != 1:
        raise RecordError(f"{name}: {len(targets)} target lines; a results file is of one machine")
    target = targets[0]
    rounds, failures, servers, ended = [], [], [], []
    for (number, reader), kind in zip(parsed[1:], kinds[1:]):
        if kind == "round":
            found = DeviceRound.from_reader(reader)
            if not found.samples_ms or not all(found.samples_ms.values()):
                raise RecordError(f"{name} line {number}: a round without samples")
            rounds.append(found)
        elif kind == "failed":
            failures.append(DeviceFailure.from_reader(reader))
        elif kind == "server":
            servers.append(DeviceServer.from_reader(reader))
        elif kind == "rounds":
            ended.append(DeviceRoundsEnded.from_reader(reader))
        elif kind != "target":
            raise RecordError(f"{name} line {number}: unknown record {kind!r}")
    return DeviceRun(
        manifest_sha256=bundle.manifest_sha256, planned_rounds=bundle.rounds,
        target=Target.from_reader(target),
        rounds=tuple(rounds), failures=tuple(failures), servers=tuple(servers), ended=tuple(ended))


def results_text(lines: list[dict[str, Any]]) -> str:
    """Lines as a results file is written (run-on-device.sh writes the same in bash): one JSON object each, then
    the end line with the digest of them all, which _check_end checks."""
    text = "".join(json.dumps(line) + "\n" for line in lines)
    return text + json.dumps({"record": "end", "sha256": hashlib.sha256(text.encode()).hexdigest()}) + "\n"


def _check_end(raw: bytes, name: str) -> None:
    """The end line is there and is the digest of every byte before it."""
    kept = raw.splitlines(keepends=True)
    while kept and not kept[-1].strip():
        kept.pop()
    try:
        end = json.loads(kept[-1]) if kept else None
    except ValueError:
        end = None
    if not isinstance(end, dict) or end.get("record") != "end":
        raise UnfinishedResults(f"{name}: no end line: run-on-device.sh was stopped before every round ran")
    if end.get("sha256") != hashlib.sha256(b"".join(kept[:-1])).hexdigest():
        raise RecordError(f"{name}: changed since run-on-device.sh wrote it (its lines do not match the SHA-256 on "
                          f"its last line)")
