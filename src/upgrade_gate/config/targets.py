"""``[tool.upgrade-gate.targets]``: the machines besides this one where latency is measured (docs/device.md), each
reached over ssh and running the report's device bundle:

    [tool.upgrade-gate.targets]
    pi5 = "ssh://ci@pi5.lab:22"
    phone-lab = { address = "ssh://ci@10.0.0.7", identity = "keys/ci_ed25519" }

A name is a target's in the report (and a file name); ``local``, the machine that runs the tool, is not one to give.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate.config.tomlfile import Table
from upgrade_gate.layout import name_problem, same_folder, same_folder_problem

SCHEME = "ssh"
EXAMPLE = '"ssh://ci@pi5.lab:22"'
# A user name as a login takes it, and a host name's labels (RFC 1123: letters, digits and '-', neither first nor
# last), which an IPv4 address is too; neither begins with '-', which ssh would read as an option (issue 61, N2).
USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")
LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class AddressError(ValueError):
    """An address that is not ssh://[user@]host[:port]: what is wrong with it."""


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
        try:
            user, host, port = parse_address(address)
        except AddressError as error:
            raise table.error(name, f"{error}; write ssh://[user@]host[:port], e.g. {EXAMPLE}") from None
        found.append(RemoteTarget(name=name, user=user, host=host, port=port, identity=identity))
    if twins := same_folder(table.data):
        raise table.error(twins[1], same_folder_problem(*twins))
    return tuple(found)


def parse_address(address: str) -> tuple[str | None, str, int]:
    """``ssh://[user@]host[:port][/]`` read part by part — the user, the host (a name, an IPv4 address, or an IPv6 one
    in brackets, kept with them) and the port (22 where none) — each checked for what it may be; AddressError says
    which part is not."""
    scheme, separator, rest = address.partition("://")
    if not separator:
        raise AddressError(f"not an address {address!r}: no ssh:// before it")
    if scheme != SCHEME:
        raise AddressError(f"unknown scheme {scheme!r}: targets are reached over ssh")
    rest = rest.removesuffix("/")
    user, at, where = rest.rpartition("@")
    if at and not USER.fullmatch(user):
        raise AddressError(f"not an address {address!r}: the user {user!r} " + (
            "begins with '-', which ssh would read as an option" if user.startswith("-") else
            "is not a login name (letters, digits, '.', '_' and '-')"))
    if where.startswith("["):
        inner, closed, after = where[1:].partition("]")
        if not closed or not _ipv6(inner):
            raise AddressError(f"not an address {address!r}: {where!r} holds no IPv6 address in brackets")
        host = f"[{inner}]"
    else:
        host, colon, port_text = where.partition(":")
        after = colon + port_text
        if not host or not all(LABEL.fullmatch(label) for label in host.split(".")):
            raise AddressError(f"not an address {address!r}: " + (
                "no host" if not host else f"the host {host!r} begins with '-', which ssh would read as an option"
                if host.startswith("-") else f"{host!r} is no host name (letters, digits, '-' and '.')"))
    return (user if at else None), host, _port(address, after)


def _ipv6(text: str) -> bool:
    """An IPv6 address without a zone (``%eth0``: any text, which this one place would have to check again)."""
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return "%" not in text


def _port(address: str, after: str) -> int:
    """The port of ``:<digits>`` after the host (22 where nothing follows it)."""
    if not after:
        return 22
    if not (after.startswith(":") and after[1:].isascii() and after[1:].isdigit()):
        raise AddressError(f"not an address {address!r}: {after!r} after the host is no :port")
    port = int(after[1:])
    if not 0 < port < 65536:
        raise AddressError(f"port {port} is not a port (1 to 65535)")
    return port
