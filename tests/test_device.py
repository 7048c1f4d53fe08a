"""A device's results file (compat/run-on-device.sh, compat/device_runner.py) read back: whole, untouched and of
one machine, or one message naming the line; the real bundle, run and read in end to end, is
tests/test_integration.py's."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmarks.gate_errors import exact_gate_errors
from helpers.stack_records import REFERENCE, write_stack_model

from upgrade_gate import layout, stats
from upgrade_gate.config.plan import load_plan
from upgrade_gate.config.settings import Settings, load_settings
from upgrade_gate.errors import ConfigError, RecordError
from upgrade_gate.judge._device_rounds import device_gate_intervals, device_runs, judged_targets
from upgrade_gate.judge.gather import gather
from upgrade_gate.judge.policy import evaluate
from upgrade_gate.schema.device import RESULTS_FORMAT, UnfinishedResults, read_device_results
from upgrade_gate.schema.records import runtime_key
from upgrade_gate.schema.verdict import GateStatus

REPO = Path(__file__).resolve().parents[1]
TARGET = {"record": "target", "name": "device:Pixel 8", "cpu": "Tensor G3", "architecture": "aarch64", "cores": 9,
          "isa": ["asimd", "asimddp", "i8mm"], "runner": "adb"}


def round_line(stack: str, number: int, samples: list[float]) -> dict:
    return {"record": "round", "model": "vit", "stack": stack, "threads": 1, "round": number, "calls": len(samples),
            "verified": True if stack == "candidate" else None, "samples_ms": {"forward": samples}}


def results_file(path: Path, lines: list[dict], *, end: bool = True) -> Path:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if end:  # as run-on-device.sh ends a whole run: the digest of every line before
        text += json.dumps({"record": "end", "sha256": hashlib.sha256(text.encode()).hexdigest()}) + "\n"
    path.write_text(text)
    return path


def whole_run() -> list[dict]:
    return [{"record": "bundle", "manifest_sha256": "ab" * 32, "format": RESULTS_FORMAT, "rounds": 2}, TARGET,
            round_line("legacy", 1, [2.0, 2.2]), round_line("candidate", 1, [1.0, 1.1]),
            round_line("candidate", 2, [1.2, 1.0]),
            {"record": "failed", "model": "vit", "stack": "legacy", "threads": 1, "round": 2, "error": "Killed"}]


def test_a_whole_results_file_reads_as_the_device_wrote_it(tmp_path):
    run = read_device_results(results_file(tmp_path / "r.jsonl", whole_run()))
    assert (run.manifest_sha256, run.planned_rounds) == ("ab" * 32, 2)
    assert run.target.name == "device:Pixel 8" and run.target.isa == ("asimd", "asimddp", "i8mm")
    assert not run.target.x86  # an Arm phone: its kernels are the ones the team ships on
    assert [(r.stack, r.round, r.samples_ms["forward"]) for r in run.rounds] == [
        ("legacy", 1, (2.0, 2.2)), ("candidate", 1, (1.0, 1.1)), ("candidate", 2, (1.2, 1.0))]
    assert [(f.stack, f.round, f.error) for f in run.failures] == [("legacy", 2, "Killed")]


def test_a_results_file_changed_or_cut_short_does_not_read(tmp_path):
    whole = results_file(tmp_path / "r.jsonl", whole_run())
    edited = tmp_path / "edited.jsonl"
    edited.write_text(whole.read_text().replace("[1.0, 1.1]", "[0.5, 0.6]"))
    with pytest.raises(RecordError, match=r"edited.jsonl: changed since run-on-device.sh wrote it"):
        read_device_results(edited)
    with pytest.raises(UnfinishedResults, match=r"no end line: run-on-device.sh was stopped"):
        read_device_results(results_file(tmp_path / "stopped.jsonl", whole_run(), end=False))


@pytest.mark.parametrize(("change", "message"), [
    (lambda lines: lines[1:], r"line 1: the first line names the bundle"),
    (lambda lines: [lines[0], *lines[2:]], r"0 target lines; a results file is of one machine"),
    (lambda lines: [*lines, {**TARGET, "name": "device:other"}], r"2 target lines"),
    (lambda lines: [*lines[:2], {**lines[2], "threads": "1"}], r"Unexpected type str \(expected int\) in 'r.jsonl line 3.threads'"),
    (lambda lines: [*lines[:2], {**lines[2], "samples_ms": {"forward": []}}], r"line 3: a round without samples"),
    (lambda lines: [{**lines[0], "format": RESULTS_FORMAT + 1}, *lines[1:]], r"line 1: format 2; this upgrade-gate reads format 1"),
    (lambda lines: [*lines, {"record": "reboot"}], r"line 7: unknown record 'reboot'"),
])
def test_a_results_file_that_is_not_one_device_s_rounds_names_its_line(tmp_path, change, message):
    with pytest.raises(RecordError, match=message):
        read_device_results(results_file(tmp_path / "r.jsonl", change(whole_run())))


def test_a_device_s_name_never_makes_a_path_outside_the_report(tmp_path):
    for name in ("device:../../etc/passwd", "device:/root", "device:Pixel 8", ":", "device:" + "x" * 200):
        kept = layout.device_results_file(tmp_path, name)
        assert kept.parent == tmp_path / "device" and kept.name.endswith(".jsonl") and len(kept.name) <= 70, kept
        assert ".." not in kept.name and "/" not in kept.name.removesuffix(".jsonl")


def test_targets_whose_names_differ_in_a_dot_keep_files_of_their_own(tmp_path):
    """Issue 61, N6: ``pi.5`` and ``pi-5`` both became device/pi-5.*: one target vanished from the report, and a
    failing one removed the other's kept rounds as its own stale ones. Distinct names, distinct files."""
    names = ["pi.5", "pi-5", "pi_5", "Pi-5", "device:Pixel 8", "device:Pixel-8", "device-Pixel-8", "", ":"]
    results = [layout.device_results_file(tmp_path, name) for name in names]
    for files in (results, [layout.device_manifest_file(f) for f in results],
                  [layout.device_failed_file(tmp_path, name) for name in names]):
        assert len(set(files)) == len(names) and {f.parent for f in files} == {tmp_path / "device"}, files
    assert [f.name for f in results[:4]] == ["pi.5.jsonl", "pi-5.jsonl", "pi_5.jsonl", "Pi-5.jsonl"]
    for file in results:
        file.parent.mkdir(exist_ok=True)
        file.touch()
        layout.device_failed_file(tmp_path, names[results.index(file)]).touch()
    assert layout.device_results_files(tmp_path) == sorted(results)  # read back, each its own
    assert len(layout.device_failed_files(tmp_path)) == len(names)


def test_a_damaged_bundle_manifest_is_the_tools_file_named_with_what_writes_it_again(project, capsys):
    """Issue 61, N8: a bundle/manifest.json that does not read was "a fault of the tool, please report it"."""
    from upgrade_gate.config.plan import load_plan
    from upgrade_gate.errors import RunIncomplete
    from upgrade_gate.measure import device, targets
    from upgrade_gate.run import guard

    plan = load_plan(["--out", "out"], invoked_from=project, config_path=project / "pyproject.toml")
    out = plan.settings.out_dir
    manifest = layout.bundle_manifest_file(out)
    manifest.parent.mkdir(parents=True)
    again = f"write the bundle again with `nox -s bundle -- --out {out}`, then run the same command again"
    manifest.write_text('{"models": ')
    with pytest.raises(RunIncomplete) as caught:
        targets.current_bundle(plan, print)
    assert str(caught.value) == (f"{manifest} is damaged: it is not the JSON upgrade-gate wrote (Expecting value: "
                                 f"line 1 column 12 (char 11)); {again}")
    manifest.write_text('{"requested": ["vit-smoke"], "models": ["vit-smoke"]}')
    with pytest.raises(RunIncomplete) as caught:
        device.checked_results(out, results_file(out / "r.jsonl", whole_run()))
    said = (f"{manifest} is damaged: it does not say what the bundle holds as upgrade-gate wrote it; {again}")
    assert str(caught.value) == said

    @guard.guarded
    def session() -> None:
        targets.current_bundle(plan, print)

    with pytest.raises(SystemExit) as ended:
        session()
    assert ended.value.code == 3 and capsys.readouterr().err == f"upgrade-gate: incomplete: {said}\n"


def test_the_runner_describes_a_phone_from_its_cpuinfo(tmp_path):
    """The Android path: /proc/cpuinfo as adb read it, described the way the tool describes this machine."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp "
                       "cpuid asimdrdm lrcpc dcpop asimddp i8mm bf16\nHardware\t: Tensor G3\n")
    printed = subprocess.run([sys.executable, str(REPO / "compat" / "device_runner.py"), "target", "device:Pixel 8",
                              "--cpuinfo", str(cpuinfo), "--machine", "aarch64", "--cores", "9", "--runner", "adb"],
                             capture_output=True, text=True, check=True).stdout
    described = json.loads(printed)
    # Of the Features line, the extensions XNNPACK dispatches on; the rest (aes, crc32, …) is no kernel choice.
    assert set(described.pop("isa")) == {"asimd", "fphp", "asimdhp", "asimddp", "i8mm", "bf16"}
    assert described == {"record": "target", "name": "device:Pixel 8", "cpu": "Tensor G3", "architecture": "aarch64",
                         "cores": 9, "runner": "adb", "system": "android"}


@pytest.mark.parametrize(("entry", "message"), [
    ('pi5 = "ftp://ci@pi5.lab"', "tool.upgrade-gate.targets.pi5: unknown scheme 'ftp': targets are reached over ssh; "
                                 'write ssh://[user@]host[:port], e.g. "ssh://ci@pi5.lab:22"'),
    ('pi5 = "ssh://ci@"', "tool.upgrade-gate.targets.pi5: not an address 'ssh://ci@'"),
    ('pi5 = "ssh://ci@pi5.lab:70000"', "tool.upgrade-gate.targets.pi5: port 70000 is not a port (1 to 65535)"),
    ('pi5 = "pi5.lab"', "tool.upgrade-gate.targets.pi5: not an address 'pi5.lab'"),
    ("pi5 = 22", "tool.upgrade-gate.targets.pi5: expected an address"),
    ('pi5 = { address = "ssh://pi5.lab", key = "k" }', "tool.upgrade-gate.targets.pi5.key: unknown key"),
    ('local = "ssh://pi5.lab"', "tool.upgrade-gate.targets.local: 'local' is this machine, measured anyway; give "
                                "another target a name of its own"),
    ('"../up" = "ssh://pi5.lab"', "tool.upgrade-gate.targets.../up: '../up' is not a name upgrade-gate can use as a "
                                  "folder: 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit; "
                                  "e.g. 'up'; rename the target"),
])
def test_a_target_that_is_not_an_ssh_address_names_its_key(tmp_path, entry, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.upgrade-gate.targets]\n{entry}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(tmp_path / "pyproject.toml")


FIX = '; write ssh://[user@]host[:port], e.g. "ssh://ci@pi5.lab:22"'


@pytest.mark.parametrize(("address", "message"), [
    # Issue 61, N2: a host or user that begins with '-' is an ssh option to ssh; each was accepted as an address.
    ("ssh://-Evictim-sshlog:22", "not an address 'ssh://-Evictim-sshlog:22': the host '-Evictim-sshlog' begins with "
                                 "'-', which ssh would read as an option"),
    ("ssh://-Evictim-userlog@127.0.0.1:1", "not an address 'ssh://-Evictim-userlog@127.0.0.1:1': the user "
                                           "'-Evictim-userlog' begins with '-', which ssh would read as an option"),
    ("ssh://-F.:22", "not an address 'ssh://-F.:22': the host '-F.' begins with '-', which ssh would read as an option"),
    ("ssh://-oProxyCommand=touch%20x", "not an address 'ssh://-oProxyCommand=touch%20x': the host "
                                       "'-oProxyCommand=touch%20x' begins with '-', which ssh would read as an option"),
    ("ssh://ci@pi5.lab:22 -oProxyCommand=x", "not an address 'ssh://ci@pi5.lab:22 -oProxyCommand=x': "
                                             "':22 -oProxyCommand=x' after the host is no :port"),
    ("ssh://ci@pi5-.lab", "not an address 'ssh://ci@pi5-.lab': 'pi5-.lab' is no host name (letters, digits, '-' and "
                          "'.')"),
    ("ssh://c i@pi5.lab", "not an address 'ssh://c i@pi5.lab': the user 'c i' is not a login name (letters, digits, "
                          "'.', '_' and '-')"),
    ("ssh://a@b@pi5.lab", "not an address 'ssh://a@b@pi5.lab': the user 'a@b' is not a login name (letters, digits, "
                          "'.', '_' and '-')"),
    ("ssh://pi5.lab/home", "not an address 'ssh://pi5.lab/home': 'pi5.lab/home' is no host name"),
    ("ssh://[fe80::1%-oX]:22", "not an address 'ssh://[fe80::1%-oX]:22': '[fe80::1%-oX]:22' holds no IPv6 address "
                               "in brackets"),
    ("ssh://[fe80::1", "not an address 'ssh://[fe80::1': '[fe80::1' holds no IPv6 address in brackets"),
    ("ssh://fe80::1", "not an address 'ssh://fe80::1': '::1' after the host is no :port"),
    ("ssh://pi5.lab:", "not an address 'ssh://pi5.lab:': ':' after the host is no :port"),
    ("ssh://pi5.lab:0", "port 0 is not a port (1 to 65535)"),
    ("ssh://", "not an address 'ssh://': no host"),
    ("pi5.lab", "not an address 'pi5.lab': no ssh:// before it"),
    ("SSH://pi5.lab", "unknown scheme 'SSH': targets are reached over ssh"),
])
def test_an_address_is_read_part_by_part_and_a_bad_part_is_named(tmp_path, address, message):
    """Exit 2 (a ConfigError) naming the target's key, what is wrong and the fix."""
    (tmp_path / "pyproject.toml").write_text(f'[tool.upgrade-gate.targets]\npi5 = "{address}"\n')
    with pytest.raises(ConfigError) as raised:
        load_settings(tmp_path / "pyproject.toml")
    assert str(raised.value).startswith(f"{tmp_path / 'pyproject.toml'}: tool.upgrade-gate.targets.pi5: {message}")
    assert str(raised.value).endswith(FIX)


@pytest.mark.parametrize(("address", "read"), [
    ("ssh://ci@pi5.lab:2222", ("ci", "pi5.lab", 2222)), ("ssh://pi5.lab", (None, "pi5.lab", 22)),
    ("ssh://ci.user_1@10.0.0.7/", ("ci.user_1", "10.0.0.7", 22)), ("ssh://[::1]:2200", (None, "[::1]", 2200)),
    ("ssh://_ci@[fe80::1]", ("_ci", "[fe80::1]", 22)), ("ssh://a-b.c-d.lab:65535", (None, "a-b.c-d.lab", 65535)),
])
def test_an_address_reads_as_its_user_host_and_port(address, read):
    from upgrade_gate.config.targets import parse_address

    assert parse_address(address) == read


def _ssh_line(address: str, tmp_path: Path, identity: Path | None = None) -> list[str]:
    from types import SimpleNamespace

    from upgrade_gate.config.targets import RemoteTarget, parse_address
    from upgrade_gate.measure.targets import ssh_command

    user, host, port = parse_address(address)
    target = RemoteTarget(name="pi5", user=user, host=host, port=port, identity=identity)
    return ssh_command(target, SimpleNamespace(settings=SimpleNamespace(cache_dir=tmp_path)))


@pytest.mark.parametrize(("address", "user", "host", "port"), [
    ("ssh://ci@pi5.lab:2222", "ci", "pi5.lab", "2222"), ("ssh://[fe80::1]", None, "fe80::1", "22"),
    ("ssh://ci@[::1]:2200", "ci", "::1", "2200")])
def test_ssh_gets_its_options_then_dash_dash_then_the_host(tmp_path, address, user, host, port):
    """ssh [options] -- host [command]: the user as -l's (an IPv6 host then without brackets), and OpenSSH's own
    reading of the line (``ssh -G``: the configuration it would connect with) is the address's."""
    import shutil

    line = _ssh_line(address, tmp_path, identity=tmp_path / "key")
    assert line[0] == "ssh" and line[-2:] == ["--", host] and line.count("--") == 1
    assert ("-l" in line) is (user is not None) and line[line.index("-i") + 1] == str(tmp_path / "key")
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client here to read the line (Debian's openssh-client; the README's test command installs "
                    "openssh-server, which brings it)")
    read = subprocess.run(["ssh", "-G", *line[1:], "-V"], capture_output=True, text=True, check=True).stdout
    said = dict(entry.split(" ", 1) for entry in read.splitlines() if " " in entry)
    assert (said["hostname"], said["port"], said.get("user") if user else user) == (host, port, user)


def test_a_remote_command_after_the_host_is_never_an_option_of_ssh(tmp_path):
    """With a real sshd on 127.0.0.1: a remote command that looks like an option (``-V``) goes there (the remote
    shell refuses it), where without ``--`` OpenSSH reads options after the host too: it prints its version and
    connects nowhere."""
    from types import SimpleNamespace

    from helpers.sshd import SSHD, Sshd

    from upgrade_gate.config.targets import RemoteTarget, parse_address
    from upgrade_gate.measure.targets import _ssh

    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: the README's test command installs Debian's openssh-server")
    server = Sshd(tmp_path / "sshd")
    server.start()
    try:
        user, host, port = parse_address(server.address)
        target = RemoteTarget(name="local-sshd", user=user, host=host, port=port, identity=server.user_key)
        plan = SimpleNamespace(settings=SimpleNamespace(cache_dir=tmp_path))
        assert _ssh(target, plan, "echo reached").stdout == b"reached\n"
        ran = _ssh(target, plan, "-V")
        assert ran.returncode not in (0, 255) and b"OpenSSH_" not in ran.stderr, ran
        line = _ssh_line(server.address, tmp_path, identity=server.user_key)
        unguarded = subprocess.run([*line[:-2], line[-1], "-V"], capture_output=True, timeout=60)
        assert unguarded.returncode == 0 and unguarded.stderr.startswith(b"OpenSSH_"), unguarded
    finally:
        server.stop()


def test_targets_read_as_written_and_back(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.upgrade-gate.targets]\npi5 = "ssh://ci@pi5.lab:2222"\nlab = { address = "ssh://[fe80::1]", '
        'identity = "keys/ci" }\nbare = "ssh://board"\n')
    settings = load_settings(tmp_path / "pyproject.toml")
    assert [(t.name, t.user, t.host, t.port, t.identity) for t in settings.targets] == [
        ("pi5", "ci", "pi5.lab", 2222, None), ("lab", None, "[fe80::1]", 22, (tmp_path / "keys" / "ci").resolve()),
        ("bare", None, "board", 22, None)]
    again = Settings.from_dict(settings.to_dict(), path=tmp_path / "pyproject.toml")
    assert again.targets == settings.targets


def test_a_targets_counters_are_judged_by_the_hosts_contention_rule():
    """Issue 41, item 2: the runner on a target reads the counters the host's contention check reads (field for
    field: a real reading makes a Snapshot), and a part during which the target's other processes kept its cores
    busy while the timed thread waited is disturbed, as it would be here."""
    from compat import device_runner
    from upgrade_gate.measure import _contention
    from upgrade_gate.measure.target_rounds import remote_watch

    assert isinstance(_contention.Snapshot(**device_runner.counters()), _contention.Snapshot)

    class Server:  # what remote_watch reads of a RemoteServer: its pid and its last answer
        def __init__(self, after: dict) -> None:
            self.process = type("P", (), {"pid": 7})()
            before = {"wall_s": 100.0, "busy_ticks": 0, "steal_ticks": 0, "total_ticks": 0, "ours_ticks": 0,
                      "runnable": 1, "waited_ns": 0}
            self.last = {"counters": {"before": before, "after": {**before, **after}}}

    ticks = os.sysconf("SC_CLK_TCK")
    # One second: the runner itself used one core (its own ticks); the target's others used the second core too.
    busy = Server({"wall_s": 101.0, "busy_ticks": 2 * ticks, "total_ticks": 2 * ticks, "ours_ticks": ticks,
                   "runnable": 3, "waited_ns": 300_000_000})
    quiet = Server({"wall_s": 101.0, "busy_ticks": ticks, "total_ticks": 2 * ticks, "ours_ticks": ticks,
                    "waited_ns": 1_000_000})
    for server, disturbed in ((busy, False), (quiet, False)):  # one thread of two cores: the second is free to use
        load = remote_watch({"s": server}, threads=1, cores=2)([7], 7)()
        assert load is not None and load.disturbed is disturbed
    load = remote_watch({"s": busy}, threads=2, cores=2)([7], 7)()  # two threads: the others took one of them
    assert load is not None and load.disturbed and load.others_cores == pytest.approx(1.0)
    assert remote_watch({"s": quiet}, threads=2, cores=2)([7], 7)().disturbed is False


def test_a_round_is_sized_to_last_the_shortest_part_the_contention_check_can_judge():
    """The measure servers' warm-up (compat/device_runner.py, used by compat/measure_server.py too): one begun on a
    busy machine (its first calls 20 ms, then 0.5 ms) still sizes a part that lasts at least the shortest part the
    contention check judges once the calls are fast. Sized at the warm-up's mean, it lasted a tenth of that, and
    one stray clock tick read as a third of a core busy (a flake of the busy-machine test, tests/test_failures.py)."""
    import time

    from compat.device_runner import runs_per_round, warm_up
    from upgrade_gate.measure._contention import SHORTEST_PART_S

    slow_calls = [3]

    def time_calls(count: int) -> list[float]:
        found = []
        for _ in range(count):
            start = time.perf_counter()
            time.sleep(0.02 if slow_calls[0] > 0 else 0.0005)
            slow_calls[0] -= 1
            found.append((time.perf_counter() - start) * 1000.0)
        return found

    warm = []

    def warm_calls(count: int) -> list[float]:  # the warm-up's calls, kept to be read
        warm.extend(time_calls(count))
        return warm[-count:]

    means, sized = warm_up({"forward": warm_calls}, 3, rounds=6, iterations=6, time_budget_s=0.0,
                           shortest_part_s=SHORTEST_PART_S)
    assert sum(warm) >= SHORTEST_PART_S * 1000.0 and len(warm) > 3
    assert means["forward"] == pytest.approx(sum(warm) / len(warm))
    runs = sized["forward"]
    part_ms = sum(time_calls(runs))
    assert part_ms >= SHORTEST_PART_S * 1000.0 * 0.95, (runs, part_ms)  # 5 %: sleep's own jitter under the fastest
    # Sized at the mean of the warm-up's first six calls (the old sizing), the part had a tenth of those calls.
    old_mean = sum(warm[:6]) / 6
    assert runs_per_round(6, 6, 0.0, SHORTEST_PART_S, [old_mean], old_mean) < runs / 5


@pytest.mark.shares_machine
@pytest.mark.integration  # asks the package index, as uv does when it builds a stack
def test_a_stack_without_a_wheel_for_a_targets_platform_names_the_pin_and_the_first_release_that_has_one():
    """Issue 41, item 2: executorch 0.7.0 has wheels for Linux x86-64 and macOS arm64, none for Linux aarch64 (those
    start at 1.0.0: checked with pip download --platform, docs/ci.md). torch 2.8.0 has all three."""
    from packaging.requirements import Requirement

    from upgrade_gate.config.specs import StackSpec
    from upgrade_gate.measure._wheels import missing_wheels

    spec = StackSpec(name="candidate", path=Path("candidate.toml"), description="", python="3.11",
                     requirements=(Requirement("torch==2.8.0"), Requirement("executorch==0.7.0")),
                     adapter="executorch_xnnpack", exporter="", runtime="", is_baseline=False)
    assert missing_wheels(spec, "Linux", "aarch64") == [
        "executorch 0.7.0: no wheel for linux aarch64; 1.0.0 is the first"]
    assert missing_wheels(spec, "Darwin", "arm64") == [] and missing_wheels(spec, "linux", "x86_64") == []
    assert missing_wheels(spec, "linux", "riscv64") == []  # a platform uv has no name for: nothing claimed


def test_a_part_stops_once_it_has_lasted_far_longer_than_its_calls_took_warm():
    """On a crowded machine a 2-thread call can be a thousand times slower than warm: a part sized at the warm
    calls then lasted seconds (the busy-machine test once took 532 s for 60). The server's part stops after
    PART_LIMIT_FACTOR times its warm time (at least PART_LIMIT_MIN_S), with the calls it made."""
    import time

    from compat.device_runner import PART_LIMIT_FACTOR, PART_LIMIT_MIN_S, part_limit_s
    from compat.measure_server import time_runs

    # The defaults' part (2 s over 9 rounds) and the shortest part: its limit, whatever a crowded warm-up's mean.
    defaults = {"rounds": 9, "iterations": 50, "time_budget_s": 2.0, "shortest_part_s": 0.2}
    assert part_limit_s({"forward": 0.03}, **defaults) == pytest.approx(PART_LIMIT_FACTOR * 2.0 / 9)
    assert part_limit_s({"forward": 20.0}, **defaults) == pytest.approx(PART_LIMIT_FACTOR * 2.0 / 9)
    # Six methods, each its share; a method of 1 s calls, its six iterations a round; never under the minimum.
    assert part_limit_s(dict.fromkeys("abcdef", 0.03), **defaults) == pytest.approx(PART_LIMIT_FACTOR * 6 * 2.0 / 9)
    assert part_limit_s({"forward": 1000.0}, **defaults) == pytest.approx(PART_LIMIT_FACTOR * 6.0)
    assert part_limit_s({"forward": 0.03}, **{**defaults, "time_budget_s": 0.0, "shortest_part_s": 0.05}) == \
        PART_LIMIT_MIN_S
    slow = lambda program, inputs: time.sleep(0.01)  # noqa: E731 - a call 10 ms long
    start = time.perf_counter_ns()
    made = time_runs(slow, None, None, 1000, deadline_ns=start + 50_000_000)
    assert 3 <= len(made) <= 6 and all(ms >= 9.0 for ms in made), made  # stopped after about 50 ms, not 10 s
    assert len(time_runs(slow, None, None, 3)) == 3  # no deadline: every call


def test_a_targets_part_stops_too_and_says_so_for_its_round_to_be_disturbed(monkeypatch):
    """The runner a target's rounds run in over ssh (device_runner.py serve --measure) sizes its parts as the host's
    servers do, so a crowded phone would stretch them the same way: it stops a part at part_limit_s as well, and its
    round line says after how long (``cut_after_s``), which measure/rounds.py reads as a disturbed round. Without
    --measure (run-on-device.sh's fixed --calls) every call asked for is made."""
    import io
    import json
    import time

    from compat import device_runner

    warm = [True]

    def call() -> None:  # 1 ms warm; 30 ms once the rounds start, as beside busy neighbours
        time.sleep(0.001 if warm[0] else 0.03)

    def loaded(args, methods):
        return {"forward": call}, {"load_ms": 1.0, "verified": None, "first_ms": {"forward": 1.0},
                                   "idle": device_runner.memory_status()}

    monkeypatch.setattr(device_runner, "lite_calls", loaded)
    monkeypatch.setattr(device_runner, "counters", lambda: None)
    common = ["serve", "--runtime", "lite-interpreter", "--artifact", ".", "--inputs", "x.npz", "--methods",
              "forward", "--model", "m", "--stack", "legacy", "--threads", "1", "--warmup", "3", "--rtol", "0",
              "--atol", "0"]

    class Requests(io.StringIO):  # the first round asked for once the warm-up is done
        def __iter__(self):
            warm[0] = False
            return super().__iter__()

    answers = io.StringIO()
    parsed = device_runner.parse(common + ["--measure", "--rounds", "9", "--iterations", "9", "--time-budget",
                                           "1.8", "--shortest-part", "0.05"])
    started = time.monotonic()
    assert device_runner.serve(parsed, Requests("round 1\nexit\n"), answers) == 0
    lines = [json.loads(line) for line in answers.getvalue().splitlines()]
    ready, first = lines[0], lines[1]
    limit = device_runner.part_limit_s(ready["warm_mean_ms"], rounds=9, iterations=9, time_budget_s=1.8,
                                       shortest_part_s=0.05)
    assert limit == pytest.approx(device_runner.PART_LIMIT_FACTOR * 0.2)  # 0.2 s planned (1.8 s over 9 rounds)
    assert first["cut_after_s"] == limit and len(first["samples_ms"]["forward"]) < ready["runs_per_round"]["forward"]
    assert limit <= time.monotonic() - started < limit + 1.5  # stopped at the limit, not after about 200 calls of 30 ms

    warm[0], answers = True, io.StringIO()
    parsed = device_runner.parse(common + ["--calls", "5"])
    assert device_runner.serve(parsed, Requests("round 1\nexit\n"), answers) == 0
    (only,) = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert len(only["samples_ms"]["forward"]) == 5 and "cut_after_s" not in only


def spin(seconds: float) -> None:
    """A call of known length, in real time: the CPU kept busy as a model's call keeps it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_part_shorter_than_the_contention_check_can_judge_is_resized_and_timed_again():
    """Issue 61, D4: a part is sized before the rounds, from the warm-up; nothing checked its length as it ran, and a
    part of 0.0225 s read one clock tick as 0.44 of a core. The server's part (compat/measure_server.py's own calls,
    of 0.5 ms each here) that lasts less than SHORTEST_PART_S is not given back: re-sized to fill the floor at the
    calls just timed, and timed again; the samples are that try's, and it lasted the floor."""
    from compat.device_runner import timed_part
    from compat.measure_server import untimed_then_timed
    from upgrade_gate.measure._contention import SHORTEST_PART_S

    made: list[tuple[float, float]] = []  # each call's start and end

    def call(program, inputs) -> None:
        start = time.perf_counter()
        spin(0.0005)
        made.append((start, time.perf_counter()))

    part = {"forward": functools.partial(untimed_then_timed, call, None, None)}
    samples, runs, short = timed_part(part, {"forward": 5}, shortest_part_s=SHORTEST_PART_S, limit_s=None)
    # Each try is its untimed call, then its timed ones: the first 5 (about 3 ms), the last as many as it gave back.
    first, last = made[:1 + 5], made[-(1 + runs["forward"]):]
    assert short >= 1 and len(samples["forward"]) == runs["forward"] > 5, (short, runs)  # more on a busy machine
    span = [calls[-1][1] - calls[0][0] for calls in (first, last)]
    assert span[0] < SHORTEST_PART_S <= span[1], span  # the short try was not given back; the one that was lasted
    # The samples are the last try's calls, each timed around the call (a little more than the call's own span).
    assert all(ms >= (end - start) * 1000.0 for ms, (start, end) in zip(samples["forward"], last[1:], strict=True))
    # Sized to last it: the next round's part, at its runs, is not short. A busy machine (pass 2 of the README's
    # command) can slow the calls a part is sized at and then let them run faster: such a pair of parts is
    # measured again, up to twice; re-sizing that does not fill the floor fails all three.
    sized = [(runs, timed_part(part, runs, shortest_part_s=SHORTEST_PART_S, limit_s=None))]
    while sized[-1][1][2] and len(sized) < 3:
        runs = timed_part(part, {"forward": 5}, shortest_part_s=SHORTEST_PART_S, limit_s=None)[1]
        sized.append((runs, timed_part(part, runs, shortest_part_s=SHORTEST_PART_S, limit_s=None)))
    runs, (again, same, short) = sized[-1]
    assert (short, same, len(again["forward"])) == (0, runs, runs["forward"]), sized
    # Without a floor (run-on-device.sh's fixed --calls) every part is as asked.
    assert timed_part(part, {"forward": 5}, shortest_part_s=0.0, limit_s=None)[1:] == ({"forward": 5}, 0)


def test_a_part_at_the_call_cap_is_timed_again_until_the_tries_have_lasted_the_floor():
    """Issue 61, D4: calls so fast that MAX_RUNS_PER_ROUND of them last under the floor cannot be re-sized: the part
    is timed again, at the cap, until its tries together have lasted SHORTEST_PART_S — the span over which the parent
    reads the machine (its watch is around the whole request); the samples are the last try's."""
    from compat.device_runner import MAX_RUNS_PER_ROUND, _time, timed_part
    from upgrade_gate.measure._contention import SHORTEST_PART_S

    started = time.perf_counter()
    samples, runs, short = timed_part({"forward": functools.partial(_time, lambda: None, 1)},
                                      {"forward": MAX_RUNS_PER_ROUND}, shortest_part_s=SHORTEST_PART_S, limit_s=None)
    assert time.perf_counter() - started >= SHORTEST_PART_S
    assert runs == {"forward": MAX_RUNS_PER_ROUND} and len(samples["forward"]) == MAX_RUNS_PER_ROUND and short >= 1
    assert sum(samples["forward"]) < SHORTEST_PART_S * 1000.0  # one try alone is short: that is why it went on


def test_a_warm_up_slowed_throughout_sizes_a_short_part_that_the_target_times_again(monkeypatch):
    """Issue 61, D4: the audit's case on a target's runner (device_runner.py serve --measure): every warm-up call
    slowed tenfold (a busy machine throughout; 5 ms), the rounds' calls 0.5 ms, the defaults' budget. Sized at the
    warm-up, the part lasted about 0.02 s; the first round's part is timed again re-sized and lasts the floor, says so
    on stderr (the log), and the next round keeps that size."""
    import io

    from compat import device_runner
    from upgrade_gate.measure._contention import SHORTEST_PART_S

    slow = [True]

    def loaded(args, methods):
        return {"forward": lambda: spin(0.005 if slow[0] else 0.0005)}, {
            "load_ms": 1.0, "verified": None, "first_ms": {"forward": 1.0}, "idle": device_runner.memory_status()}

    class Requests(io.StringIO):  # the rounds asked for once the warm-up is done: the machine is quiet by then
        def __iter__(self):
            slow[0] = False
            return super().__iter__()

    monkeypatch.setattr(device_runner, "lite_calls", loaded)
    monkeypatch.setattr(device_runner, "counters", lambda: None)
    answers, log = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    parsed = device_runner.parse([
        "serve", "--runtime", "lite-interpreter", "--artifact", ".", "--inputs", "x.npz", "--methods", "forward",
        "--model", "m", "--stack", "legacy", "--threads", "1", "--warmup", "3", "--rtol", "0", "--atol", "0",
        "--measure", "--rounds", "9", "--iterations", "9", "--time-budget", "2.0", "--shortest-part",
        str(SHORTEST_PART_S)])
    assert device_runner.serve(parsed, Requests("round 1\nround 2\nexit\n"), answers) == 0
    ready, first, second = (json.loads(line) for line in answers.getvalue().splitlines()[:3])
    sized = ready["runs_per_round"]["forward"]
    assert sized * 0.0005 < SHORTEST_PART_S / 2, ready  # the warm-up's size: far under the floor at 0.5 ms
    assert second["calls"]["forward"] >= first["calls"]["forward"] > sized  # kept (or grown, were the calls slower)
    for answer in (first, second):
        assert sum(answer["samples_ms"]["forward"]) >= SHORTEST_PART_S * 1000.0, answer["calls"]
    said = log.getvalue().splitlines()[0]
    assert re.fullmatch(rf"round 1: a part shorter than {SHORTEST_PART_S} s timed again [1-9] time\(s\); its calls "
                        rf"now {{'forward': {first['calls']['forward']}}}", said), said


# -- the device gate's intervals share its 95% over every target (issue 61, D1) ----------------------------


def _device_read_in(out: Path, name: str, ratios: list[float], *, rounds_line: dict | None = None) -> None:
    """A device's rounds of vit-smoke kept in the report folder, as `device-results` (or a target over ssh) keeps
    them: the baseline 10 ms a call, the candidate ``ratios[i]`` times it in round i; ``rounds_line``: the line only a
    target timed over ssh writes (why its rounds ended, its stop rule's design)."""
    lines = [{"record": "bundle", "manifest_sha256": "ab" * 32, "format": RESULTS_FORMAT, "rounds": len(ratios)},
             {**TARGET, "name": name}]
    for number, ratio in enumerate(ratios, start=1):
        lines += [{"record": "round", "model": "vit-smoke", "stack": stack, "threads": 1, "round": number,
                   "samples_ms": {"forward": [ms] * 5}} for stack, ms in (("legacy", 10.0), ("candidate", 10.0 * ratio))]
    lines += [{"record": "rounds", "model": "vit-smoke", "threads": 1, **rounds_line}] if rounds_line else []
    kept = layout.device_results_file(out, name)
    kept.parent.mkdir(parents=True, exist_ok=True)
    layout.device_manifest_file(results_file(kept, lines)).write_text(_manifest(out))


def _manifest(out: Path) -> str:
    """The bundle's manifest of vit-smoke at 1 thread (measure/device.py writes it; kept beside each device's rounds)."""
    return json.dumps({"models": {"vit-smoke": {"methods": ["forward"], "threads": [1], "stacks": {
        stack: {"runtime_key": runtime_key(out, stack, "vit-smoke")} for stack in ("legacy", "candidate")}}}})


def _plan_with_targets(project: Path, targets: list[str]):
    (project / "pyproject.toml").write_text('[tool.upgrade-gate]\nsuite = "smoke"\nthreads = [1]\n'
                                            + ("[tool.upgrade-gate.targets]\n" if targets else "")
                                            + "".join(f'{name} = "ssh://ci@{name}.lab"\n' for name in targets))
    plan = load_plan(["--out", "out", "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    for stack in ("legacy", "candidate"):
        write_stack_model(plan.settings.out_dir, stack, "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE],
                          threads=(1,))
    return plan


ROUNDS_OF_A_DEVICE = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.01]


@pytest.mark.parametrize("targets", [2, 3])
@pytest.mark.parametrize("over_ssh", [False, True])
def test_a_device_gates_intervals_share_its_95_percent_over_every_target(project, targets, over_ssh):
    """One device-latency gate over every target it names, the worst deciding: with every true ratio at the
    threshold, it calls an interval clear (or fails) wrongly at most 5% of the time, counted exactly over every sign
    sequence of every target's rounds (independent: each target's rounds are a measurement of their own) at the
    coverage each row is judged at — run-on-device.sh's fixed 9 rounds, and a target over ssh whose rounds were
    designed for 9 with stop-early, up to 15 while one straddles. Each interval at 95% instead (its share over one
    target's thread counts × methods, as before): 2 targets were wrongly clear 7.66% / 9.23% of the time, 3 11.3% /
    13.5% (the audit's figures at (9, 15))."""
    names = [f"board{index}" for index in range(targets)]
    plan = _plan_with_targets(project, names if over_ssh else [])
    out = plan.settings.out_dir
    for name in names:
        design = None
        if over_ssh:  # designed as measure/target_rounds.py designs it, before the target's rounds ran
            design = {"ended": "planned", "stop_early": True, "most": 15, "tried": 9, "counted": 9,
                      "intervals": device_gate_intervals(plan, "vit-smoke", 1, 1, device_runs(plan))}
        _device_read_in(out, name, ROUNDS_OF_A_DEVICE, rounds_line=design)
    (model,) = gather(plan)
    rows = [row for row in model.device_latency if row.stack == "candidate"]
    assert sorted(row.target.name for row in rows) == names and all(row.estimate is not None for row in rows)
    confidence = {row.estimate.confidence for row in rows if row.estimate is not None}
    (each,) = confidence
    most = 15 if over_ssh else 0
    failed, clear = exact_gate_errors(targets, 1, 9, over_ssh, each, most)
    assert failed <= clear <= 0.05, (failed, clear)
    before = exact_gate_errors(targets, 1, 9, over_ssh, stats.interval_confidence(1), most)
    assert before[1] > 0.07  # the scenario tells the old share from the new
    device = next(g for g in evaluate(plan, [model]).gates if g.gate == "device-latency")
    assert device.status is GateStatus.PASSED and device.note.endswith(
        f"; the gate's {targets} intervals together: at least {stats.together([r.estimate.level for r in rows]):.1%}")


def test_the_targets_a_device_gate_shares_its_95_percent_over_are_counted_alike_where_designed_and_judged(project):
    """Where a target's rounds are designed (before any ran) and where they are judged, the gate's targets are the
    same: every configured target — its rounds kept, or why there are none — and every device read in beside them."""
    plan = _plan_with_targets(project, ["pi5", "lab"])
    out = plan.settings.out_dir
    _device_read_in(out, "device:Pixel 8", ROUNDS_OF_A_DEVICE)  # run-on-device.sh, read in before the compare
    designed = judged_targets(plan, "vit-smoke", device_runs(plan))
    assert designed == ["device:Pixel 8", "lab", "pi5"]
    _device_read_in(out, "pi5", ROUNDS_OF_A_DEVICE, rounds_line={
        "ended": "planned", "stop_early": True, "most": 15, "tried": 9, "counted": 9,
        "intervals": device_gate_intervals(plan, "vit-smoke", 1, 1, device_runs(plan))})
    layout.bundle_manifest_file(out).parent.mkdir(parents=True, exist_ok=True)
    layout.bundle_manifest_file(out).write_text(_manifest(out))  # the bundle the targets were given
    layout.device_failed_file(out, "lab").write_text(json.dumps({"target": "lab", "address": "ssh://ci@lab.lab",
                                                                 "error": "ssh: connection refused"}))
    assert judged_targets(plan, "vit-smoke", device_runs(plan)) == designed
    (model,) = gather(plan)
    rows = [row for row in model.device_latency if row.stack == "candidate"]
    assert sorted(row.target.name for row in rows) == designed
    assert {row.estimate.confidence for row in rows if row.estimate is not None} == {stats.interval_confidence(3)}


def test_a_device_gate_of_too_few_rounds_is_inconclusive_even_within_min_delta(project):
    """Three rounds of identical latency give an interval short of its coverage: however close the stacks are
    (within `min-delta-ms` at the interval's top), a top that is not yet a bound passes nothing (it passed, at 75%)."""
    plan = _plan_with_targets(project, [])
    _device_read_in(plan.settings.out_dir, "board", [1.0, 1.0, 1.0])
    (model,) = gather(plan)
    (row,) = [row for row in model.device_latency if row.stack == "candidate"]
    assert row.estimate is not None and not row.estimate.holds and row.estimate.high == 1.0
    device = next(g for g in evaluate(plan, [model]).gates if g.gate == "device-latency")
    assert device.status is GateStatus.INCONCLUSIVE, device
