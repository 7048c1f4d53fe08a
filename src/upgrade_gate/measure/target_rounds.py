"""A target's rounds timed as the host's are: one server per stack and model over its own ssh connection
(compat/device_runner.py ``serve --measure``), driven by the host's round loop (measure/round_loop.py ``run_rounds``).

The same alternating order, the same stop rule (the sequential looks, ``stop-early``), the same contention check —
the target's CPU accounting read by the runner around each timed part, judged by measure/_contention.py's rule, a
disturbed round repeated and left out — and each server's cold start (load, first call) and memory (resident with
the runtime alone, after the first call, at its peak). What comes back is written as a device results file
(schema/device.py), the lines run-on-device.sh writes and those only this path has (``server``, ``rounds``), and is
read in as any device's is.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from upgrade_gate import layout
from upgrade_gate.config.plan import Plan
from upgrade_gate.judge._device_rounds import device_gate_intervals, device_runs
from upgrade_gate.measure import _contention
from upgrade_gate.measure.round_loop import Watch, ratio_to_decide, run_rounds, stop_rule
from upgrade_gate.run.measure_server import ServerFailed
from upgrade_gate.schema.measurement import RoundsDesign

# ssh's own exit status for a connection that failed or dropped (a remote command's are its own).
SSH_FAILED = 255


class ConnectionLost(Exception):
    """ssh itself ended (exit status 255): the target's fault, not a stack's; what ssh said last."""


class RemoteServer:
    """A ``device_runner.py serve --measure`` on a target, over one ssh connection: a measure/round_loop.py RoundServer.
    Its stderr goes to ``log``; a request without an answer within its stage's deadline is a timeout."""

    def __init__(self, argv: list[str], log: IO[bytes], deadline_s: Callable[[str], float]) -> None:
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                        start_new_session=True)
        self.deadline_s = deadline_s
        self.log_name = getattr(log, "name", "its log")
        self.last: dict[str, Any] = {}

    def _answer(self, stage: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = self.deadline_s(stage)
        ready, _, _ = select.select([self.process.stdout], [], [], deadline)
        if not ready:
            raise ServerFailed("timeout", stage, f"no answer within {deadline:g} s (timeouts.{stage})")
        line = self.process.stdout.readline()
        if not line:
            if self.process.wait() == SSH_FAILED:
                raise ConnectionLost(f"the connection was lost at the {stage} ({_last_line(self.log_name)})")
            raise ServerFailed("crashed", stage, f"the runner or its connection ended (ssh exit status "
                                                 f"{self.process.returncode}; {_last_line(self.log_name)})")
        data = json.loads(line)
        if data.get("record") == "failed":
            raise ServerFailed("failed", stage, str(data.get("error")), list(data.get("traceback_tail") or []))
        self.last = data
        return data

    def _say(self, text: str, stage: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(text.encode() + b"\n")
            self.process.stdin.flush()
        except OSError as error:
            if self.process.wait() == SSH_FAILED:
                raise ConnectionLost(f"the connection was lost at the {stage} ({_last_line(self.log_name)})") from error
            raise ServerFailed("crashed", stage, f"the runner or its connection ended ({error})") from error

    def ready(self) -> dict[str, Any]:
        return self._answer("load")

    def request(self, command: dict[str, Any] | None, until: str) -> dict[str, Any]:
        assert command is not None
        self._say(f"round {command['round']}", until)
        return self._answer(until)

    def close(self) -> dict[str, Any] | None:
        """Ask it to end; its ``exit`` line (the peak memory), or None when it gave none."""
        try:
            self._say("exit", "exit")
            goodbye = self._answer("exit")
        except ServerFailed:
            goodbye = None
        self.stop()
        return goodbye

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.process.wait()


def _last_line(log_name: str) -> str:
    try:
        lines = [line for line in Path(log_name).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return f"last said: {lines[-1].strip()[:300]}" if lines else "nothing said"


def remote_watch(servers: dict[str, RemoteServer], threads: int, cores: int) -> Watch:
    """The contention check of a target's part of a round: the counters its runner read around the part (on the
    target), judged by the host's rule (_contention.load_between, Load.disturbed)."""
    by_pid = {server.process.pid: server for server in servers.values()}

    def watch(_ours: list[int], timed: int) -> Callable[[], _contention.Load | None]:
        def done() -> _contention.Load | None:
            read = by_pid[timed].last.get("counters") or {}
            if not read.get("before") or not read.get("after"):
                return None  # no /proc there (macOS): nothing judged disturbed, as on such a host
            return _contention.load_between(_contention.Snapshot(**read["before"]),
                                            _contention.Snapshot(**read["after"]), threads, cores)
        return done
    return watch


def time_on_target(plan: Plan, ssh: list[str], remote_bundle: str, pythons: dict[str, str],
                   cannot_run: dict[str, str], target_line: dict[str, Any], logs: Path,
                   log: Callable[[str], Any]) -> list[dict[str, Any]]:
    """Every model of the bundle at every thread count, its stacks timed on the target; the results file's lines
    between its ``target`` line and its ``end`` line."""
    settings, out = plan.settings, plan.settings.out_dir
    manifest = json.loads(layout.bundle_manifest_file(out).read_text(encoding="utf-8"))
    served = [line.split("\t") for line in (layout.bundle_dir(out) / "plan.tsv").read_text().splitlines() if line]
    gate = settings.gates["latency"]
    cores = int(target_line.get("cores") or 1)
    candidates = [spec.name for spec in plan.candidates]
    runs = device_runs(plan)  # the devices read in already: the gate judges them beside this target
    lines: list[dict[str, Any]] = []
    for threads in settings.threads:
        for model, held in manifest["models"].items():
            # One gate over every target it judges: each interval's share is of all of them.
            design = RoundsDesign.of(planned=settings.rounds, most_rounds=settings.most_rounds,
                                     stop_early=settings.stop_early, intervals=device_gate_intervals(
                                         plan, model, len(settings.threads), len(held["methods"]), runs))
            rows = [row for row in served if row[0] == model]
            servers: dict[str, RemoteServer] = {}
            try:
                stacks = _start_servers(plan, ssh, remote_bundle, pythons, cannot_run, manifest, rows, threads, logs,
                                        servers, lines)
                if not ratio_to_decide(plan.baseline.name, candidates, servers):
                    continue  # the baseline, or every candidate, cannot run here: its line says why; no ratio
                design, clear = stop_rule(plan.baseline.name, candidates, stacks, servers, design=design,
                                          threshold=gate.threshold, min_delta_ms=gate["min-delta-ms"])
                log(f"targets: {target_line['name']}: {model}, {threads} thread(s): {'up to ' if clear else ''}"
                    f"{design.planned} rounds"
                    f"{f' ({design.most} while an interval straddles)' if design.most > design.planned else ''}")
                # A candidate whose runner ends there ends alone; the others go on to their decision.
                tried, ended = run_rounds(servers, stacks, design, threads, None, clear,
                                          watch=remote_watch(servers, threads, cores), baseline=plan.baseline.name)
                goodbyes = {name: server.close() for name, server in servers.items()}
                servers.clear()
            finally:
                for server in servers.values():
                    server.stop()
            lines += _round_lines(model, threads, stacks, tried)
            lines += [_server_line(model, name, threads, record["ready"], goodbyes.get(name))
                      for name, record in stacks.items()]
            lines.append({"record": "rounds", "model": model, "threads": threads, "ended": ended.value,
                          "stop_early": settings.stop_early, "most": design.most, "tried": len(tried),
                          "counted": sum(1 for entry in tried if not entry["disturbed"]),
                          "intervals": design.intervals})
    return lines


def _start_servers(plan: Plan, ssh: list[str], remote_bundle: str, pythons: dict[str, str],
                   cannot_run: dict[str, str], manifest: dict[str, Any], rows: list[list[str]], threads: int,
                   logs: Path, servers: dict[str, RemoteServer], lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One server per stack of a model (its plan.tsv ``rows``), one after the other, each ready (loaded, verified,
    warmed up) before the next starts, into ``servers``; each stack's record so far. A stack that cannot run there
    gets its ``failed`` line in ``lines``."""
    settings = plan.settings
    stacks: dict[str, dict[str, Any]] = {}
    for model, stack, runtime, artifact, methods in rows:
        where = {"model": model, "stack": stack, "threads": threads}
        if stack in cannot_run or not pythons.get(stack):
            lines.append({"record": "failed", **where, "round": 1,
                          "error": cannot_run.get(stack) or f"no Python for {stack} there"})
            continue
        argv = [*ssh, f"cd {shlex.quote(remote_bundle)} && exec {shlex.quote(pythons[stack])} "
                      "device_runner.py serve --measure " + shlex.join([
                          "--runtime", runtime, "--artifact", f"{model}/{stack}/{artifact}",
                          "--inputs", f"{model}/inputs.npz", "--methods", methods, "--model", model,
                          "--stack", stack, "--threads", str(threads), "--warmup", str(settings.warmup),
                          "--iterations", str(settings.iterations), "--rounds", str(settings.rounds),
                          "--time-budget", str(settings.time_budget_s),
                          "--shortest-part", str(_contention.SHORTEST_PART_S),
                          "--rtol", str(manifest["rounds"]["rtol"]), "--atol", str(manifest["rounds"]["atol"])])]
        with open(logs / f"{model}.{stack}.threads-{threads}.log", "ab") as log_file:
            server = RemoteServer(argv, log_file, settings.timeout_s)
        try:
            ready = server.ready()
        except ServerFailed as failure:
            server.stop()
            lines.append({"record": "failed", **where, "round": 1, "error": f"{failure.stage}: {failure.message}"})
            continue
        servers[stack], stacks[stack] = server, {"status": "ok", "rounds": [], "ready": ready}
    return stacks


def _server_line(model: str, stack: str, threads: int, ready: dict[str, Any],
                 goodbye: dict[str, Any] | None) -> dict[str, Any]:
    """A server's cold start and memory (schema/device.py DeviceServer): its ready line's, and its exit's peak."""
    return {"record": "server", "model": model, "stack": stack, "threads": threads,
            "load_ms": ready["cold"]["load_ms"], "first_ms": ready["cold"]["first_ms"],
            "idle_rss_bytes": ready["idle"]["rss_bytes"],
            "after_first_run_rss_bytes": ready["after_first_run"]["rss_bytes"],
            "peak_rss_bytes": ((goodbye or {}).get("memory") or {}).get("peak_rss_bytes"),
            "runs_per_round": ready["runs_per_round"]}


def _round_lines(model: str, threads: int, stacks: dict[str, dict[str, Any]],
                 tried: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each stack's part of each round tried, with whether the round was disturbed and the part's load; a
    stack's failure as its ``failed`` line."""
    disturbed = {entry["round"]: entry["disturbed"] for entry in tried}
    loads = {entry["round"]: entry["load"] for entry in tried}
    lines = []
    for name, record in stacks.items():
        where = {"model": model, "stack": name, "threads": threads}
        for part in record["rounds"]:
            number = part["round"]
            lines.append({"record": "round", **where, "round": number, "calls": part["calls"],
                          "verified": record["ready"].get("verified"), "samples_ms": part["samples_ms"],
                          "disturbed": disturbed.get(number, False), "load": (loads.get(number) or {}).get(name)})
        if record["status"] != "ok":
            error = record.get("error") or {}
            lines.append({"record": "failed", **where, "round": len(record["rounds"]) + 1,
                          "error": f"{error.get('stage')}: {error.get('message')}"})
    return lines
