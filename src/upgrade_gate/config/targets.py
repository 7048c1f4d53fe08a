"""``[tool.upgrade-gate.targets]``: the machines besides this one where latency is measured (docs/device.md), each
reached over ssh and running the report's device bundle:

    [tool.upgrade-gate.targets]
    pi5 = "ssh://ci@pi5.lab:22"
    phone-lab = { address = "ssh://ci@10.0.0.7", identity = "keys/ci_ed25519" }

A name is a target's in the report (and a file name); ``local``, the machine that runs the tool, is not one to give.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate.config.tomlfile import Table
from upgrade_gate.layout import name_problem, same_folder, same_folder_problem

SCHEME = "ssh"
# ssh://[user@]host[:port]: a host name, an IPv4 address or an IPv6 one in brackets.
ADDRESS = re.compile(r"ssh://(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(?::(?P<port>\d+))?/?")
EXAMPLE = '"ssh://ci@pi5.lab:22"'


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteTarget:
    name: str
    user: str | None
    host: str
    port: int
    identity: Path | None = None

    @property
    def address(self) -> str:
        return f"{SCHEME}://{self.user + '@' if self.user else ''}{self.host}:{self.port}"

    def to_toml(self) -> Any:
        return {"address": self.address, "identity": str(self.identity)} if self.identity else self.address


def load_targets(table: Table, base: Path) -> tuple[RemoteTarget, ...]:
    found = []
    for name, value in table.data.items():
        if problem := name_problem(name):
            raise table.error(name, f"{problem}; rename the target")
        if name == "local":
            raise table.error(name, "'local' is this machine, measured anyway; give another target a name of its own")
        identity = None
        if isinstance(value, dict):
            entry = Table(value, path=table.path, key=table.child_key(name))
            entry.reject_unknown({"address", "identity"})
            address = entry.get("address", str, "")
            if "identity" in value:
                identity = (base / entry.get("identity", str, "")).resolve()
        elif isinstance(value, str):
            address = value
        else:
            raise table.error(name, f"expected an address ({EXAMPLE}) or a table with address and identity, got "
                                    f"{value!r}")
        matched = ADDRESS.fullmatch(address)
        if not matched:
            scheme = address.partition("://")[0] if "://" in address else ""
            why = (f"unknown scheme {scheme!r}: targets are reached over ssh" if scheme and scheme != SCHEME
                   else f"not an address {address!r}")
            raise table.error(name, f"{why}; write ssh://[user@]host[:port], e.g. {EXAMPLE}")
        port = int(matched["port"] or 22)
        if not 0 < port < 65536:
            raise table.error(name, f"port {port} is not a port (1 to 65535)")
        found.append(RemoteTarget(name=name, user=matched["user"], host=matched["host"], port=port,
                                  identity=identity))
    if twins := same_folder(table.data):
        raise table.error(twins[1], same_folder_problem(*twins))
    return tuple(found)
