"""Prime's network fields <-> one egress policy.

Prime speaks two mutually exclusive lists: `allowlist` (only these; `[]` = no network) and
`denylist` (everything but these; `[]` = unrestricted). Entries follow prime-sandboxes'
`_validate_egress_entry` (mirrored here, so a raw HTTP client gets the same 422 the SDK gives
client-side): an exact host, a leftmost `*.` wildcard, an IPv4 address or IPv4 CIDR, each
optionally `:port` or `:low-high` (domains only on 80/443).

`WirePolicy` is what the wire shows and what a record keeps; `to_spec_policy` turns it into
the sandbox layer's `EgressPolicy` (allow-list with "*" meaning everything).
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict

from sandgym.sandboxes.spec import EgressPolicy

MAX_ENTRIES = 1024
DOMAIN_PORTS = (80, 443)
_PORTS = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")


def _is_network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def check_entry(entry: str) -> str:
    """The canonical form of one entry (stripped, lowercase host), or ValueError saying why."""
    value = entry.strip()
    if not value:
        raise ValueError("empty entry")
    if len(value) > 300:
        raise ValueError(f"{entry[:40]!r}...: longer than 300 characters")
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        address = None
    if address is not None:
        if address.version != 4:
            raise ValueError(f"{entry!r}: IPv6 is not supported")
        return value
    host, sep, ports = value.rpartition(":")
    if sep and "://" not in value and not _is_network(value):
        m = _PORTS.fullmatch(ports)
        low, high = (int(m[1]), int(m[2] or m[1])) if m else (0, 0)
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"{entry!r}: port must be a number from 1 to 65535 or a low-high range")
        canon = check_entry(host)
        if not _is_network(host) and (low != high or low not in DOMAIN_PORTS):
            raise ValueError(f"{entry!r}: domain entries support only ports 80 and 443; use an IP or CIDR entry for other ports")
        return f"{canon}:{ports}"
    if "/" in value:
        try:
            net = ipaddress.ip_network(value, strict=False)
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not a valid IPv4 CIDR") from exc
        if net.version != 4:
            raise ValueError(f"{entry!r}: IPv6 is not supported")
        return str(net)
    for bad, why in (("://", "schemes are not supported"), ("@", "credentials are not supported"), ("?", "query strings are not supported")):
        if bad in value:
            raise ValueError(f"{entry!r}: {why}")
    domain = (value[2:] if value.startswith("*.") else value).rstrip(".")
    if not domain:
        raise ValueError(f"{entry!r}: domain is empty")
    if "*" in domain:
        raise ValueError(f"{entry!r}: wildcard is only supported as the leftmost label")
    if any(not label for label in domain.split(".")):
        raise ValueError(f"{entry!r} contains an empty label")
    if not re.fullmatch(r"[A-Za-z0-9.-]+", domain):
        raise ValueError(f"{entry!r}: a host name has only letters, digits, '-' and '.'")
    return ("*." if value.startswith("*.") else "") + domain.lower()


def check_list(name: str, entries: list[str] | None) -> list[str] | None:
    """Canonical entries (duplicates dropped), or ValueError naming the list."""
    if entries is None:
        return None
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"{name} supports at most {MAX_ENTRIES} entries, got {len(entries)}")
    out: list[str] = []
    for entry in entries:
        try:
            canon = check_entry(entry)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        if canon not in out:
            out.append(canon)
    return out


class WirePolicy(BaseModel):
    """`SandboxEgressPolicy` on the wire: at most one list is non-null."""

    model_config = ConfigDict(frozen=True)

    allowlist: list[str] | None = None
    denylist: list[str] | None = None

    @classmethod
    def blocked(cls) -> WirePolicy:
        return cls(allowlist=[])

    @classmethod
    def unrestricted(cls) -> WirePolicy:
        return cls(denylist=[])

    @classmethod
    def parse(cls, allowlist: list[str] | None, denylist: list[str] | None, *, where: str = "") -> WirePolicy:
        """Validated and canonical; ValueError (with the field name) otherwise. `["*"]` (what
        the SDK's `set_network(allow=["*"])` would mean) is accepted as "everything"."""
        if allowlist is not None and denylist is not None:
            raise ValueError(f"{where}allowlist and {where}denylist are mutually exclusive; give at most one")
        if allowlist is not None and [a.strip() for a in allowlist] == ["*"]:
            return cls.unrestricted()
        if denylist is not None and [d.strip() for d in denylist] == ["*"]:
            return cls.blocked()
        return cls(allowlist=check_list(f"{where}allowlist", allowlist), denylist=check_list(f"{where}denylist", denylist))

    @property
    def is_blocked(self) -> bool:
        return self.allowlist == [] or (self.allowlist is None and self.denylist is None)

    def to_spec_policy(self) -> EgressPolicy:
        """The sandbox layer's EgressPolicy ("blocked" keeps the plumbing: allow nothing)."""
        if self.allowlist is not None:
            return EgressPolicy(allow=tuple(self.allowlist))
        return EgressPolicy(allow=("*",), deny=tuple(self.denylist or ()))

    def describe(self) -> str:
        if self.allowlist is not None:
            return "limited to " + ", ".join(self.allowlist) if self.allowlist else "blocked"
        if self.denylist:
            return "unrestricted except " + ", ".join(self.denylist)
        return "unrestricted" if self.denylist is not None else "blocked"
