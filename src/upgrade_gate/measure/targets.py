"""``[tool.upgrade-gate.targets]``: latency measured on other machines, over ssh (docs/device.md, config/targets.py).

For each target, after the measure session: the report's device bundle (measure/device.py; written again only
when the report's artifacts are not the ones it holds) is copied to ``~/.cache/upgrade-gate-targets/<manifest
digest>/`` there, unless a whole copy is there already (its SHA256SUMS check); ``run-on-device.sh --install
--stacks-only`` builds each stack there with uv from its spec; then the rounds are timed from here as the host's
are (measure/target_rounds.py: a runner per stack over ssh, the same order, stop rule and contention check, the
cold start and memory). They are written as the target's results file and read in, judged by the
``device-latency`` gate.

ssh's failures — an unreachable host, a refused key, a connection dropped mid-round — and a target that cannot run
the bundle (no uv there) are the target's, never the candidate's: the target's gates are incomplete with ssh's
words (``device/<target>.failed.json``), and what the other targets measured stays. The same command tries again.
Host keys are trusted on first use and kept in the result cache's ``known_hosts``; a changed one is refused.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import sha256_file, write_json_atomic, write_text_atomic
from upgrade_gate._confined import remove_file
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.targets import RemoteTarget
from upgrade_gate.measure import _wheels, device, target_rounds
from upgrade_gate.run.cache_folder import tree_bytes
from upgrade_gate.schema.device import RESULTS_FORMAT, results_text
from upgrade_gate.schema.records import runtime_key
from upgrade_gate.text import size

# Where a target keeps bundles and the stacks' venvs, relative to the remote user's home.
REMOTE_ROOT = ".cache/upgrade-gate-targets"
# A target that says nothing for this long is gone (ServerAliveInterval × ServerAliveCountMax).
ALIVE_S, ALIVE_COUNT = 15, 4


class TargetFailed(Exception):
    """Why a target gave no rounds: ssh's words, or the target's."""


def measure_targets(plan: Plan, log: Callable[[str], Any] = print) -> None:
    """Every target of the settings, in turn; each one's rounds read in, or why there are none kept."""
    if not plan.settings.targets:
        return
    out = plan.settings.out_dir
    bundle = current_bundle(plan, log)
    if bundle is None:  # the host's gates say why no model ran in both stacks; no target has anything to time
        log("targets: skipped: no model both stacks ran, so nothing to time on a target")
        return
    for target in plan.settings.targets:
        log(f"targets: {target.name} ({target.address}) …")
        try:
            results = run_on(target, plan, bundle, log)
            run = device.checked_results(out, results)
        except (TargetFailed, device.ResultsRefused) as error:
            log(f"targets: {target.name}: no rounds: {error}")
            stale = layout.device_results_file(out, target.name)
            for file in (stale, layout.device_manifest_file(stale)):
                if file.exists():
                    remove_file(file, within=out)
            write_json_atomic(layout.device_failed_file(out, target.name),
                              {"target": target.name, "address": target.address, "error": str(error)})
            continue
        device.keep(out, results, run)
        remove_file(results, within=out)
        log(f"targets: {target.name}: {len(run.rounds)} rounds read in ({run.target.described})")


def current_bundle(plan: Plan, log: Callable[[str], Any]) -> Path | None:
    """The report's bundle: as it is when it holds this run's models and their artifacts, else written again."""
    out = plan.settings.out_dir
    folder = layout.bundle_dir(out)
    manifest = layout.bundle_manifest_file(out)
    if manifest.is_file():
        held = device.read_manifest(out)
        if held["requested"] == [m.name for m in plan.models] and all(
                entry.get("runtime_key") == runtime_key(out, stack, model)
                for model, bundled in held["models"].items() for stack, entry in bundled["stacks"].items()):
            log(f"targets: the bundle in {folder} holds this run's artifacts")
            return folder
    return device.write_bundle(plan, log)


def ssh_command(target: RemoteTarget, plan: Plan) -> list[str]:
    """ssh's options, then ``--`` and the host, as ssh reads them: a remote command goes after it. The user is
    ``-l``'s (an IPv6 host then needs no brackets); ``--`` ends the options, so that nothing after it is one,
    whatever config/targets.py let through (issue 61, N2)."""
    command = ["ssh", "-p", str(target.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
               "-o", f"UserKnownHostsFile={plan.settings.cache_dir / 'known_hosts'}", "-o", "ConnectTimeout=20",
               "-o", f"ServerAliveInterval={ALIVE_S}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}"]
    if target.identity is not None:
        command += ["-i", str(target.identity), "-o", "IdentitiesOnly=yes"]
    if target.user is not None:
        command += ["-l", target.user]
    return [*command, "--", target.host.removeprefix("[").removesuffix("]")]


def _ssh(target: RemoteTarget, plan: Plan, remote: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """One remote command; ssh's own failure raised as the target's."""
    done = subprocess.run([*ssh_command(target, plan), remote], capture_output=True, **kwargs)
    if done.returncode == target_rounds.SSH_FAILED:
        raise TargetFailed(f"ssh {target.address}: {_last_words(done, 'the connection failed')}")
    return done


def run_on(target: RemoteTarget, plan: Plan, bundle: Path, log: Callable[[str], Any]) -> Path:
    """The bundle run on the target; the results file fetched into the report folder."""
    digest = sha256_file(layout.bundle_manifest_file(plan.settings.out_dir))
    remote = f"{REMOTE_ROOT}/{digest[:16]}"
    there = shlex.quote(f"{remote}/bundle")
    whole = _ssh(target, plan, f"cd {there} 2>/dev/null && (sha256sum --quiet -c SHA256SUMS || "
                               "shasum -a 256 --quiet -c SHA256SUMS) >/dev/null 2>&1")
    if whole.returncode != 0:
        log(f"targets: {target.name}: copying the bundle ({size(tree_bytes(bundle))})")
        with tempfile.TemporaryFile() as archive:
            subprocess.run(["tar", "-C", str(bundle.parent), "-cf", "-", bundle.name], stdout=archive, check=True)
            archive.seek(0)
            put = _ssh(target, plan, f"rm -rf {shlex.quote(remote)} && mkdir -p {shlex.quote(remote)} && "
                                     f"tar -C {shlex.quote(remote)} -xf -", stdin=archive)
        if put.returncode != 0:
            raise TargetFailed(f"the bundle could not be written there: {_last_words(put)}")
    log(f"targets: {target.name}: the stacks built there with uv")
    venvs = shlex.quote(f"{REMOTE_ROOT}/venvs")
    built = _ssh(target, plan, f"{there}/run-on-device.sh --install {venvs} --stacks-only")
    if built.returncode != 0:
        raise TargetFailed(f"run-on-device.sh ended with status {built.returncode}: {_last_words(built)}")
    pythons, cannot_run = {}, {}
    for line in built.stdout.decode(errors="replace").splitlines():
        stack, python, why = (line.split("\t") + ["", ""])[:3]
        if why or not python:
            cannot_run[stack] = why or f"no Python for {stack} there"
            log(f"targets: {target.name}: {cannot_run[stack]}")
        else:
            pythons[stack] = python
    described = _ssh(target, plan, f"cd {there} && {shlex.quote(next(iter(pythons.values()), 'python3'))} "
                                   f"device_runner.py target {shlex.quote(target.name)}")
    try:
        target_line = json.loads(described.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError) as error:
        raise TargetFailed(f"device_runner.py could not describe the machine: {_last_words(described)}") from error
    for stack in list(cannot_run):  # uv's resolver error there, said as which pin lacks a wheel and which has one
        spec = next(spec for spec in plan.stacks if spec.name == stack)
        missing = _wheels.missing_wheels(spec, str(target_line.get("system", "")),
                                         str(target_line.get("architecture", "")))
        if missing:
            cannot_run[stack] = f"{'; '.join(missing)} (uv's words: {venvs}/{stack}.install.log there)"
            log(f"targets: {target.name}: {stack}: {cannot_run[stack]}")
    log(f"targets: {target.name}: the rounds, timed from here ({target_line.get('cpu')}, "
        f"{target_line.get('cores')} cores)")
    logs = layout.device_results_file(plan.settings.out_dir, target.name).with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    lines = [{"record": "bundle", "manifest_sha256": digest, "format": RESULTS_FORMAT,
              "rounds": plan.settings.rounds}, target_line]
    try:
        lines += target_rounds.time_on_target(plan, ssh_command(target, plan), f"{remote}/bundle", pythons,
                                              cannot_run, target_line, logs, log)
    except target_rounds.ConnectionLost as lost:
        raise TargetFailed(f"ssh {target.address}: {lost}") from lost
    incoming = layout.device_results_file(plan.settings.out_dir, target.name).with_suffix(".incoming")
    write_text_atomic(incoming, results_text(lines))
    return incoming


def _last_words(done: subprocess.CompletedProcess[bytes], silent: str = "nothing said") -> str:
    """The last line a remote command (or ssh itself) wrote to stderr; ``silent`` where it wrote none."""
    lines = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else silent
