"""A real OpenSSH server for the tests of [tool.upgrade-gate.targets]: on 127.0.0.1 at a free port, with a host key
and a user key generated for it, root logging in with the key only. The sessions get the test's PATH and its CA
settings (SetEnv), as a board's administrator would give its users uv and the registry's certificates."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")  # Debian's openssh-server (the README's test command installs it)
PASSED_ON = ("PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Sshd:
    """``start()``, ``stop()`` (the listener and every session it started: connections drop mid-command) and
    ``start()`` again on the same port with the same host key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host_key, self.user_key, self.other_key = (folder / name for name in ("host", "user", "other"))
        for key in (self.host_key, self.user_key, self.other_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (folder / "authorized_keys").write_text(self.user_key.with_suffix(".pub").read_text())
        passed = " ".join(f"{name}={os.environ[name]}" for name in PASSED_ON if os.environ.get(name))
        self.config = folder / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\nPidFile {folder / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPermitRootLogin prohibit-password\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            f"SetEnv {passed}\n")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    def start(self) -> None:
        assert SSHD.is_file(), f"{SSHD} is missing: the README's test command installs Debian's openssh-server"
        Path("/run/sshd").mkdir(exist_ok=True)  # its privilege separation folder
        # A session of its own: stop() takes the listener and every connection's process with it.
        self.process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(self.config)], start_new_session=True,
                                        stderr=(self.folder / "sshd.log").open("ab"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.process.poll() is None, (self.folder / "sshd.log").read_text()
                time.sleep(0.1)
        raise AssertionError(f"sshd did not listen on {self.port}: {(self.folder / 'sshd.log').read_text()}")

    def stop(self) -> None:
        """The listener and its sessions, killed: a connection in use drops as a network's would."""
        if self.process is None:
            return
        for pid in [self.process.pid, *_descendants(self.process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        self.process = None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a session's sshd forks, and the command it runs)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
