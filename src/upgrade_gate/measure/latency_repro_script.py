"""A latency finding's reproducer, copied into a report as ``repro.py`` (latency_reproducer.py beside it writes it,
with ``repro.json``, both stacks' artifacts of one method, the inputs and device_runner.py): the method as the
baseline ships it and as the candidate does, timed in alternating rounds on this machine, each stack in its own
Python (device_runner.py serves each, loaded once). Standard library only: a team hands the folder on as it is.

    python3 repro.py [--baseline-python PATH] [--candidate-python PATH] [--rounds N]

Exit 1: the candidate's time, the median of the rounds' ratios, is over the latency gate's threshold times the
baseline's (the slowdown found); 0: it is not, on this machine; 3: a stack could not load or run the method (no
answer); 2: the command is wrong. A busy machine answers either way: run it where nothing else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIDES = ("baseline", "candidate")  # the order of a round's parts, turned about every other round
EXIT_SLOWER, EXIT_NOT_SLOWER, EXIT_NO_ANSWER = 1, 0, 3


def main(argv: list[str] | None = None) -> int:
    settings = json.loads((HERE / "repro.json").read_text(encoding="utf-8"))
    parser = argparse.ArgumentParser(prog="python3 repro.py", description=__doc__.split("\n\n")[0])
    for side in SIDES:
        parser.add_argument(f"--{side}-python", default=settings[side]["python"],
                            help=f"a Python with the {settings[side]['stack']} stack (default: the report's run's)")
    parser.add_argument("--rounds", type=int, default=settings["rounds"])
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds takes a whole number of at least 1")
    method, servers = settings["method"], {}
    medians: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for side in SIDES:  # both load before any round: neither times the other's import
            servers[side] = serve(settings, side, getattr(args, f"{side}_python"))
        for number in range(args.rounds):
            for side in SIDES if number % 2 == 0 else SIDES[::-1]:
                medians[side].append(statistics.median(timed_round(servers[side], number, method)))
    except (OSError, RuntimeError, ValueError, KeyError) as error:
        print(f"could not run: {error}", flush=True)
        return EXIT_NO_ANSWER
    except KeyboardInterrupt:  # Ctrl-C: no answer, and no traceback; the servers are stopped below
        print("interrupted before every round ran: no answer", flush=True)
        return EXIT_NO_ANSWER
    finally:
        for server in servers.values():
            stop(server)
    ratios = [candidate / baseline for baseline, candidate in zip(medians["baseline"], medians["candidate"])]
    for number, ratio in enumerate(ratios):
        print(f"round {number}: {settings['baseline']['stack']} {medians['baseline'][number]:.3f} ms, "
              f"{settings['candidate']['stack']} {medians['candidate'][number]:.3f} ms: x{ratio:.3f}")
    ratio, threshold = statistics.median(ratios), settings["threshold"]
    slower = ratio > threshold
    print(f"{settings['model']} ({method}, {settings['threads']} thread(s)): the candidate takes x{ratio:.3f} the "
          f"baseline's time (median of {len(ratios)} rounds; the latency gate allows x{threshold:g}): "
          + ("slower, as found" if slower else "not slower here"), flush=True)
    return EXIT_SLOWER if slower else EXIT_NOT_SLOWER


def serve(settings: dict[str, Any], side: str, python: str) -> subprocess.Popen:
    """One side's device_runner.py, loading its artifact and warming up; it times a round per request."""
    own = settings[side]
    command = [python, str(HERE / "device_runner.py"), "serve", "--runtime", own["runtime"],
               "--artifact", str(HERE / own["artifact"]), "--inputs", str(HERE / "inputs.npz"),
               "--methods", settings["method"], "--model", settings["model"], "--stack", own["stack"],
               "--threads", str(settings["threads"]), "--warmup", str(settings["warmup"]),
               "--calls", str(own["calls"]), "--rtol", "0", "--atol", "0"]
    # ExecuTorch finds its tools on PATH (its venv's bin/), as the stack's own runs do.
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")])}
    log = (HERE / f"{side}.log").open("w", encoding="utf-8")
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env)


def timed_round(server: subprocess.Popen, number: int, method: str) -> list[float]:
    """One round's part of a side: its calls' times in ms, or RuntimeError with why it has none."""
    assert server.stdin is not None and server.stdout is not None
    program = server.args[0] if isinstance(server.args, list) else server.args
    server.stdin.write(f"round {number}\n")
    server.stdin.flush()
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"{program!s} ended before round {number} (its log: {HERE.name}/*.log)")
    answer = json.loads(line)
    if answer.get("record") != "round":
        raise RuntimeError(f"{answer.get('stack')}: {answer.get('error')}")
    return list(answer["samples_ms"][method])


def stop(server: subprocess.Popen) -> None:
    try:
        if server.stdin is not None:
            server.stdin.write("end\n")
            server.stdin.close()
        server.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        server.kill()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
