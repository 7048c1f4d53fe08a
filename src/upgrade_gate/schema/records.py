"""Reading what the workers wrote: typed records (schema/reader.py: each error names its path)."""

from __future__ import annotations

import errno
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from packaging.version import Version

from upgrade_gate import layout
from upgrade_gate.errors import RecordError
from upgrade_gate.schema.reader import Reader
from upgrade_gate.stages import DIAGNOSTIC_STAGES, STAGE_STATUSES, UNFINISHED_STATUSES

# The workers' records (compat/worker.py writes the same version: it cannot import this package).
RECORDS_VERSION = Version("1.0")


def check_schema(reader: Reader) -> None:
    """Reject another major schema version; a newer minor is read as far as known."""
    found = Version(reader.text("schema_version"))
    if found.major != RECORDS_VERSION.major:
        raise RecordError(f"schema_version {found} in {reader.where!r}; this tool reads {RECORDS_VERSION.major}.x")


@dataclass(frozen=True, kw_only=True, slots=True)
class StageError:
    type: str
    message: str
    traceback_tail: tuple[str, ...]
    errno: int | None = None  # an OSError's
    source: str | None = None  # the model's line it was raised under (compat/common.py error_record)


# A stage that failed on these is the machine's failure, not the model's: the disk is full.
MACHINE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    stage: str
    status: str
    duration_s: float
    reason: str | None = None
    error: StageError | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def unfinished(self) -> bool:
        """Stopped by the run or the machine, not by the model: its outcome is unknown."""
        return self.status in UNFINISHED_STATUSES or (self.error is not None and self.error.errno in MACHINE_ERRNOS)

    def explain(self) -> str:
        """One line: why this stage did not succeed."""
        if self.status == "vanished":
            missing = self.error.message.splitlines()[0] if self.error and self.error.message else "a file"
            return (f"{self.stage} did not finish: {missing} — a file the tool provided was removed from outside "
                    "while the run used it; run the same command again")
        if self.error:
            first_line = self.error.message.splitlines()[0] if self.error.message else ""
            # A worker killed by the runner carries its status as the error type: say it once.
            kind = "" if self.error.type == self.status else f"{self.error.type}: "
            return f"{self.stage} {self.status}: {kind}{first_line}" + (
                f" (at {self.error.source})" if self.error.source else "")
        if self.reason:
            return f"{self.stage} {self.status}: {self.reason}"
        return f"{self.stage} {self.status}"

    @classmethod
    def from_reader(cls, r: Reader) -> Stage:
        status = r.text("status")
        if status not in STAGE_STATUSES:
            raise RecordError(f"Unknown status {status!r} in '{r.where}.status'")
        err = r.child("error")
        return cls(
            stage=r.text("stage"),
            status=status,
            duration_s=r.number("duration_s"),
            reason=r.opt_text("reason"),
            error=None if err is None else StageError(
                type=err.text("type"),
                message=err.text("message"),
                traceback_tail=tuple(str(line) for line in err.data.get("traceback_tail") or ()),
                errno=err.opt_integer("errno"),
                source=err.opt_text("source"),
            ),
            details=r.opt_dict("details"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "status": self.status,
            "duration_s": self.duration_s,
            "reason": self.reason,
            "error": None if self.error is None else {
                "type": self.error.type, "message": self.error.message,
                "traceback_tail": list(self.error.traceback_tail), "errno": self.error.errno},
            "details": self.details,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskResult:
    prompts: list[str]
    tokens: list[list[int]]
    text: list[str]
    step_logits: np.ndarray  # [prompts, steps, vocab]


def read_task_result(stage: Stage | None, path: Path) -> TaskResult | None:
    """A task stage's loop (compat/phases.py run_task): its tokens and text, and the logits in ``path``; None
    where the stage did not finish."""
    if stage is None or not stage.ok:
        return None
    logits = read_arrays(path).get("step_logits")
    if logits is None:
        raise DamagedFile(path, "no step_logits in it")
    return TaskResult(
        prompts=[str(t) for t in stage.details.get("prompts", [])],
        tokens=[[int(t) for t in seq] for seq in stage.details.get("tokens", [])],
        text=[str(t) for t in stage.details.get("text", [])],
        step_logits=logits,
    )


class StagesOf:
    """What a stack's stages for a model say, for the record read from disk and the results made of it alike."""

    __slots__ = ()
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.stage == name), None)

    def first_problem(self) -> Stage | None:
        """The first stage on the way from model to running artifact that did not succeed."""
        return next((s for s in self.stages if not s.ok and s.stage not in DIAGNOSTIC_STAGES), None)

    @property
    def all_ok(self) -> bool:
        return bool(self.stages) and self.first_problem() is None

    def details_of(self, stage: str) -> dict[str, Any]:
        """What the stage recorded where it succeeded; empty where it failed or did not run."""
        found = self.stage(stage)
        return found.details if found is not None and found.ok else {}

    @property
    def artifact(self) -> dict[str, Any] | None:
        """The save stage's record of the files written: bytes, and each method's file."""
        return self.details_of("save") or None

    @property
    def saved_files(self) -> dict[str, dict[str, Any]]:
        """Each artifact file the save stage recorded, once (a multi-method program is every method's):
        file name → its record (``file``, ``bytes``, ``sha256``)."""
        methods = (self.artifact or {}).get("methods") or {}
        return {str(m["file"]): m for m in methods.values() if m.get("file")}


# Each kind of outputs (``<kind>.npz`` in a model's record folder) and the stage that writes it.
OUTPUTS_STAGE = {"eager": "eager", "quantized": "quantize", "artifact": "run"}


@dataclass(frozen=True, kw_only=True, slots=True)
class StackModelRecord(StagesOf):
    """Everything one stack produced for one model (both phases)."""

    stack: str
    model: str
    directory: Path
    stages: tuple[Stage, ...]
    facts: dict[str, dict[str, Any]]  # phase → facts (peak RSS, threads, …)
    # phase → its cache record: key, and where its files were reused from (None: this run made them)
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)

    def reused_phases(self) -> list[str]:
        return [phase for phase, record in self.cache.items() if record.get("reused_from")]

    def outputs(self, which: str) -> dict[str, np.ndarray] | None:
        """``eager``, ``quantized`` (a variant's quantized model run eagerly) or ``artifact`` outputs, if the stage
        that writes them succeeded; DamagedFile if they do not read."""
        stage = self.stage(OUTPUTS_STAGE[which])
        path = self.directory / f"{which}.npz"
        if stage is None or not stage.ok or (which == "quantized" and not stage.details.get("outputs")):
            return None  # a quantized module that did not run eagerly says why in its stage
        return read_arrays(path)

    @property
    def task_kind(self) -> str:
        build = self.stage("build")
        return str(build.details.get("task", "generic")) if build and build.ok else "generic"

    @property
    def read_extents(self) -> dict[str, tuple[int, int]]:
        """Output name → (axis, count): the part a later call reads, where not all (models/case.py)."""
        build = self.stage("build")
        if build is None or not build.ok:
            return {}
        found = Reader(build.details, f"{self.directory}/export.json: build").opt_dict("read_extents")
        extents = {}
        for name, value in found.items():
            if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and v >= 0 for v in value)):
                raise RecordError(f"Expected [axis, count] in '{self.directory}/export.json: build.read_extents.{name}'"
                                  f", got {value!r}")
            extents[name] = (value[0], value[1])
        return extents

    def task_result(self, which: str) -> TaskResult | None:
        """The end-to-end loop's tokens, text and logits: ``eager`` or ``artifact``."""
        return read_task_result(self.stage("eager-task" if which == "eager" else "task"),
                                self.directory / f"{which}-task.npz")

    def peak_rss_bytes(self, phase: str) -> int | None:
        """The worker's own figure, or what the supervisor saw of it and its children (all there is after a kill)."""
        facts = self.facts.get(phase, {})
        values = [facts.get("peak_rss_bytes"), facts.get("supervisor", {}).get("peak_rss_bytes")]
        found = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
        return max(found) if found else None


class DamagedFile(RecordError):
    """A file of the report folder that its record says was written, and that does not read."""

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"{path} is damaged ({why})")


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """An .npz file's arrays, read whole; DamagedFile if it is missing, truncated or corrupt."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise DamagedFile(path, "missing") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise DamagedFile(path, f"{type(error).__name__}: {error}") from None


def load_stack_model(out: Path, stack: str, model: str) -> StackModelRecord:
    """Both phase files of one stack and model; a missing phase is a missing stage."""
    directory = layout.model_dir(out, stack, model)
    stages: list[Stage] = []
    facts: dict[str, dict[str, Any]] = {}
    for phase in layout.PHASES:
        path = directory / f"{phase}.json"
        if not path.is_file():
            stages.append(Stage(stage=phase, status="not-run", duration_s=0.0,
                                reason=f"the {phase} phase did not run for this report"))
            continue
        reader = _read_record(path, out)
        stages.extend(Stage.from_reader(r) for r in reader.children("stages"))
        facts[phase] = reader.opt_dict("facts")
    cache = {phase: found for phase in layout.PHASES if (found := read_key_record(directory, phase)) is not None}
    return StackModelRecord(stack=stack, model=model, directory=directory, stages=tuple(stages), facts=facts,
                            cache=cache)


def load_diagnosis(out: Path, stack: str, model: str) -> tuple[tuple[Stage, ...], dict[str, Any]] | None:
    """The diagnose phase's stages and cache record for one stack and model; None where it did not run."""
    directory = layout.diagnose_dir(out, stack, model)
    path = directory / f"{layout.DIAGNOSE}.json"
    if not path.is_file():
        return None
    stages = tuple(Stage.from_reader(r) for r in _read_record(path, out).children("stages"))
    return stages, read_key_record(directory, layout.DIAGNOSE) or {}


def _read_record(path: Path, out: Path) -> Reader:
    """A worker's or the measure session's JSON record, its schema checked, its errors naming it."""
    where = str(path.relative_to(out))
    try:
        reader = Reader(json.loads(path.read_text(encoding="utf-8")), where)
    except ValueError as error:
        raise RecordError(f"{where}: not valid JSON ({error})") from None
    check_schema(reader)
    return reader


def read_key_record(phase_dir: Path, phase: str) -> dict[str, Any] | None:
    """The runner's key record of a phase, written after it: an older or interrupted run has none."""
    try:
        return dict(json.loads(layout.key_record_file(phase_dir, phase).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def runtime_key(out: Path, stack: str, model: str) -> str | None:
    """What identifies the artifacts a stack's runtime phase ran (its cache key): a new export, a new key."""
    key = (read_key_record(layout.model_dir(out, stack, model), "runtime") or {}).get("key")
    return key if isinstance(key, str) else None


def phase_code(model_dir: Path, phase: str) -> str | None:
    """The digest of the model's code a phase ran with; None for a record written before it was kept."""
    code = (read_key_record(model_dir, phase) or {}).get("code")
    return code if isinstance(code, str) else None


RELEASED = "released"  # the key record's list of artifacts left in the result cache (run/artifacts.py)


def released(model_dir: Path) -> set[str]:
    """The artifacts of a model's folder left in the result cache (absent from the folder by design)."""
    return set((read_key_record(model_dir, "export") or {}).get(RELEASED) or ())


def load_stack_info(out: Path, stack: str) -> dict[str, Any] | None:
    path = layout.stack_file(out, stack)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
