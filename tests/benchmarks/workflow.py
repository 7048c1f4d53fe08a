"""``workflow`` (benchmark.py says what it measures): one run of the sample CI workflow on this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.errors import EXIT_USAGE
from upgrade_gate.run import cache_folder, guard

SAMPLE_WORKFLOW = layout.TOOL_ROOT / "docs" / "ci" / "upgrade-gate.yml"


def workflow_commands() -> tuple[list[int], list[str], str]:
    """The sample workflow's shards, its shard job's upgrade-gate commands in order, and the report job's."""
    lines = [line.strip() for line in SAMPLE_WORKFLOW.read_text().splitlines()]
    shards = next(json.loads(line.split(":", 1)[1]) for line in lines if line.startswith("shard: ["))
    commands = [line.split("run: ", 1)[1] for line in lines if line.startswith("run: upgrade-gate ")]
    shard_job = [c for c in commands if "${{ matrix.shard }}" in c]
    merge = next(c for c in commands if c.startswith("upgrade-gate report "))
    return shards, shard_job, merge


def workflow(out: Path, carried: Path, log: Any) -> int:
    shards, shard_job, merge = workflow_commands()
    run = out / time.strftime("run-%Y%m%d-%H%M%S")
    (run / "shards").mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    for k in shards:
        job = run / f"shard-job-{k}"
        job.mkdir()
        results, saved = job / "upgrade-gate-cache", carried / f"shard{k}"
        if saved.is_dir():
            link_tree(saved, results)
        seconds: dict[str, float] = {}
        for command in shard_job:
            command = command.replace("${{ matrix.shard }}", str(k))
            start = time.monotonic()
            done = run_workflow_command(command, job, {"UPGRADE_GATE_CACHE": str(results)})
            seconds[command.split(" -- ")[0]] = time.monotonic() - start
            (job / f"step-{len(seconds)}.log").write_text(done.stdout + done.stderr)
            log(f"shard {k}: {command}: exit {done.returncode} in {seconds[command.split(' -- ')[0]]:.0f} s")
            if done.returncode == EXIT_USAGE:  # configured wrong: nothing of the run is worth timing
                refusal = next((line for line in reversed((done.stdout + done.stderr).splitlines())
                                if line.startswith("upgrade-gate: error:")), "see its log")
                guard.fail_usage(f"the workflow's `{command}` was refused ({job / f'step-{len(seconds)}.log'}): "
                                 + refusal.removeprefix("upgrade-gate: error: "))
        shutil.rmtree(saved, ignore_errors=True)
        if results.is_dir():  # a job that stored nothing saves nothing
            link_tree(results, saved)
        folder = job / f"shard-{k}"
        folder.rename(run / "shards" / folder.name)
        rows.append({"shard": k, "seconds": seconds, "cache_bytes": cache_folder.tree_bytes(saved),
                     "folder_bytes": cache_folder.tree_bytes(run / "shards" / folder.name)})
    start = time.monotonic()
    merged = run_workflow_command(merge, run, {})
    report = {"seconds": time.monotonic() - start, "exit": merged.returncode,
              "folder_bytes": cache_folder.tree_bytes(run / "report")}
    write_json_atomic(run / "workflow.json", {"benchmark": "workflow", "jobs": rows, "report": report})
    lines = [f"# workflow run {run.name}: report job exit {merged.returncode} in {report['seconds']:.0f} s, "
             f"merged folder {report['folder_bytes'] / 2**30:.2f} GiB", "",
             "| shard job | " + " | ".join(rows[0]["seconds"]) + " | saved cache | shard folder |",
             "|---|" + "---|" * (len(rows[0]["seconds"]) + 2)]
    lines += [f"| {r['shard']} | " + " | ".join(f"{v:.0f} s" for v in r["seconds"].values())
              + f" | {r['cache_bytes'] / 2**30:.2f} GiB | {r['folder_bytes'] / 2**30:.2f} GiB |" for r in rows]
    write_text_atomic(run / "workflow.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


def run_workflow_command(command: str, cwd: Path, env: dict[str, str], envdir: Path | None = None,
                         timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """A workflow's ``upgrade-gate`` command as the job's shell runs it, with this checkout's package (the
    installed command is tests/test_installed.py's); its venvs in ``envdir`` (default: the job's .nox/)."""
    sessions, _, arguments = command.partition(" -- ")
    here = sessions.replace("upgrade-gate ", f"{sys.executable} -m upgrade_gate ", 1)
    venvs = f" --envdir {envdir}" if envdir else ""
    return subprocess.run(["bash", "-c", f"{here} --no-color{venvs} -- {arguments}"], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(layout.PACKAGE_DIR.parent), **env})


def link_tree(source: Path, target: Path) -> None:
    """A copy of a cache folder, as actions/cache makes one, in hard links where the disk allows: entries are
    written whole under a new name, never changed in place, so the copies cannot reach each other."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)
