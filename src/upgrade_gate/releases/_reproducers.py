"""Compare's reproducers, run in each release's stack before its venv is removed: whether a newer release fixes a
finding, asked the way a team would ask it — `python repro.py` with that release's Python (docs/releases.md).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from upgrade_gate.errors import ConfigError
from upgrade_gate.run.workers import venv_env
from upgrade_gate.schema import codec
from upgrade_gate.schema.results import Results

# A one-operator lowering takes seconds; a whole method's, minutes: what a reproducer may take at most.
TIMEOUT_S = 900
# Its verdict, by exit status: the script's contract (compat/executorch_diagnose.py REPRODUCER); 3 and anything
# else (a crash: a negative status) is no answer. An exit 1 counts only with the error it measured printed: a
# reproducer written before exit 3 existed exits 1 on an uncaught exception too.
ANSWERS = {0: "fixed", 1: "reproduces"}
# What a reproducer prints when it answers: the error it measured, or the lowering's failure as found.
MEASURED = ("relative L2 error", "fails as found")
# What a whole-method reproducer prints where the release's torch could not load the program.pt2 it was found
# with and it ran the method rebuilt from program.py (compat/executorch_diagnose.py METHOD_REPRODUCER).
REBUILT = "rebuilt from program.py"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReproducerRun(codec.Record):
    """One of compare's reproducers run with a release's Python."""

    model: str
    method: str
    script: str  # relative to the report folder
    exit_code: int | None  # None: it did not finish (timed out, or would not start)
    said: str  # its last line of output: the error it measured, or why it stopped

    @classmethod
    def from_json(cls, data: dict) -> ReproducerRun:
        code = data.get("exit_code")
        return cls(model=str(data["model"]), method=str(data["method"]), script=str(data["script"]),
                   exit_code=None if code is None else int(code), said=str(data.get("said", "")))

    @property
    def rebuilt(self) -> bool:
        """It ran the method rebuilt from program.py: this release's torch could not load program.pt2."""
        return REBUILT in self.said

    @property
    def answer(self) -> str:
        """fixed, reproduces, could not run (it failed or crashed before measuring), or did not finish."""
        if self.exit_code is None:
            return "did not finish"
        if self.exit_code == 1 and not any(answer in self.said for answer in MEASURED):
            return "could not run"
        return ANSWERS.get(self.exit_code, "could not run")


def compare_reproducers(out: Path, models: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(model, method, script relative to ``out``) for each reproducer a compare run left in ``out`` for a
    candidate stack (the baseline's are not an ExecuTorch release's to fix), for the models in ``models``."""
    if not (out / "results.json").is_file():
        return []  # no compare run in this folder
    try:
        results = Results.load(out)
    except ConfigError:
        return []  # not one that reads: compare's own report says so; nothing here to run
    found = []
    for model in results.models:
        if model.name not in models:
            continue
        for stack, own in model.stacks.items():
            if results.stacks[stack].is_baseline or own.diagnosis is None or own.diagnosis.keeps_float:
                continue
            for method in own.diagnosis.findings:
                script = f"{own.diagnosis.record_dir}/{method.reproducer}/repro.py" if method.reproducer else None
                if script and (out / script).is_file():
                    found.append((model.name, method.method, script))
    return found


def run_reproducer(python: Path, out: Path, model: str, method: str, script: str) -> ReproducerRun:
    """``python script``, as its docstring says to run it: the release venv's own bin/ first on PATH."""
    try:
        done = subprocess.run([str(python), str(out / script)], capture_output=True, text=True,
                              env=venv_env(python.parent), timeout=TIMEOUT_S, cwd=out)
    except subprocess.TimeoutExpired:
        return ReproducerRun(model=model, method=method, script=script, exit_code=None,
                             said=f"did not finish in {TIMEOUT_S} s")
    except OSError as error:
        return ReproducerRun(model=model, method=method, script=script, exit_code=None, said=str(error))
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return ReproducerRun(model=model, method=method, script=script, exit_code=done.returncode,
                         said=lines[-1][:500] if lines else "")
