"""Egress allow/deny entries: parsing, validation and matching.

Standard library only, Python >= 3.9: the squid external-ACL helper (acl_helper.py) loads
this very file by path, so the rules the spec validates are the rules the proxy enforces.

Entries (case-insensitive):
- `*`                     any public destination, any port
- `pypi.org`              that host, on ports 80 and 443 (the web; Prime's contract)
- `*.pythonhosted.org`    any subdomain (the leftmost label only; not the apex), 80/443
- `host:8443`, `host:8000-8100`   a host on those ports instead
- `203.0.113.7`, `203.0.113.0/24` an IPv4 address or network (any port; `:port`, `:lo-hi`)
                          matched against the addresses the name resolves to
- `host.sandgym.internal` (optionally `:PORT`) the engine host's loopback services, on the
                          ports the operator exposed (`egress_host_ports`) only

Host-internal addresses (loopback, link-local, private ranges) are never reachable whatever
the lists say: the proxy refuses them on its own resolution (no DNS rebinding). A
destination is allowed when an allow entry matches and no deny entry does.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

ALIAS = "host.sandgym.internal"
WEB_PORTS = (80, 443)
MAX_ENTRIES = 1024

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_IPV4ISH = re.compile(r"^[0-9./]+$")


class Rule(NamedTuple):
    kind: str  # "any" | "host" | "wild" | "net" | "alias"
    value: Union[str, ipaddress.IPv4Network, None]  # host name, wildcard suffix (".x.org"), IPv4Network
    lo: Optional[int]  # port range; None = the kind's default
    hi: Optional[int]
    text: str  # the normalised entry


def _ports(entry: str, spec: str) -> Tuple[int, int]:
    lo_s, sep, hi_s = spec.partition("-")
    if not lo_s.isdigit() or (sep and not hi_s.isdigit()):
        raise ValueError(f"egress entry {entry!r}: port must be N or LO-HI, got {spec!r}")
    lo, hi = int(lo_s), int(hi_s or lo_s)
    if not (1 <= lo <= hi <= 65535):
        raise ValueError(f"egress entry {entry!r}: ports must be within 1-65535 and LO <= HI")
    return lo, hi


def parse_entry(entry: str) -> Rule:
    """One entry as a Rule; ValueError naming the entry when it is not one."""
    if not isinstance(entry, str):
        raise ValueError(f"egress entry {entry!r} must be a string")
    e = entry.strip().lower()
    if e == "*":
        return Rule("any", None, None, None, "*")
    if not e or any(c in e for c in "@?#\\ \t") or "://" in e:
        raise ValueError(
            f"egress entry {entry!r} is not a host, host:port, IPv4 address or CIDR "
            "(no schemes, paths, user info or spaces)"
        )
    if e.count(":") > 1 or e.startswith("["):
        raise ValueError(f"egress entry {entry!r}: IPv6 destinations are not supported")
    host, sep, port_spec = e.partition(":")
    lo = hi = None
    if sep:
        lo, hi = _ports(entry, port_spec)
    host = host.rstrip(".")
    if _IPV4ISH.match(host):
        try:
            net = ipaddress.IPv4Network(host, strict=False)
        except ValueError as exc:
            raise ValueError(f"egress entry {entry!r} is not a valid IPv4 address or CIDR: {exc}") from None
        return Rule("net", net, lo, hi, e)
    if "/" in host:
        raise ValueError(f"egress entry {entry!r}: only IPv4 networks take a /prefix")
    wild = host.startswith("*.")
    name = host[2:] if wild else host
    labels = name.split(".")
    if "*" in name or not all(_LABEL.match(lb) for lb in labels) or len(name) > 253:
        raise ValueError(
            f"egress entry {entry!r} is not a valid host name "
            "(letters, digits, '-', dots; '*.' only as the whole leftmost label)"
        )
    if wild and len(labels) < 2:
        raise ValueError(f"egress entry {entry!r}: a wildcard needs a domain under it (e.g. *.example.org)")
    if name == ALIAS and not wild:
        return Rule("alias", name, lo, hi, e)
    return Rule("wild" if wild else "host", "." + name if wild else name, lo, hi, e)


def parse_entries(entries: Sequence[str], field: str = "allow") -> List[Rule]:
    if isinstance(entries, str):
        raise ValueError(f"{field} must be a list of entries, not one string")
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"{field} has {len(entries)} entries; allowed range: [0, {MAX_ENTRIES}]")
    return [parse_entry(e) for e in entries]


def _port_ok(rule: Rule, port: int, default: Optional[Tuple[int, ...]]) -> bool:
    if rule.lo is not None and rule.hi is not None:
        return rule.lo <= port <= rule.hi
    return default is None or port in default


def matches(rule: Rule, host: str, port: int, addrs: Callable[[], List[ipaddress.IPv4Address]]) -> bool:
    """Whether `rule` covers host:port. `addrs` resolves the host lazily (CIDR rules only)."""
    if rule.kind == "any":
        return True
    if rule.kind == "alias":
        return host == ALIAS and _port_ok(rule, port, None)
    if rule.kind == "net":
        net = rule.value
        return isinstance(net, ipaddress.IPv4Network) and _port_ok(rule, port, None) and any(a in net for a in addrs())
    if not _port_ok(rule, port, WEB_PORTS):
        return False
    if rule.kind == "wild":
        return host.endswith(str(rule.value))
    return host == rule.value


def resolver(host: str) -> Callable[[], List[ipaddress.IPv4Address]]:
    """A lazy, memoised resolution of `host` to its IPv4 addresses ([] when it fails)."""
    cache: List[List[ipaddress.IPv4Address]] = []

    def get() -> List[ipaddress.IPv4Address]:
        if not cache:
            try:
                cache.append([ipaddress.IPv4Address(host)])
            except ValueError:
                import socket

                try:
                    infos = socket.getaddrinfo(host, None, socket.AF_INET)
                    cache.append(sorted({ipaddress.IPv4Address(i[4][0]) for i in infos}))
                except OSError:
                    cache.append([])
        return cache[0]

    return get


def decide(
    allow: Sequence[Rule],
    deny: Sequence[Rule],
    host: str,
    port: int,
    host_ports: Sequence[int] = (),
    addrs: Optional[Callable[[], List[ipaddress.IPv4Address]]] = None,
) -> Tuple[bool, str]:
    """(allowed, reason). `host_ports`: the engine host's loopback ports the operator exposes
    as host.sandgym.internal."""
    host = host.lower().rstrip(".")
    get = addrs or resolver(host)
    if host == ALIAS:
        if port not in host_ports:
            return False, f"host port {port} is not exposed to sandboxes (egress_host_ports)"
        # "*" does not open host services: they must be named.
        listed = any(r.kind == "alias" and matches(r, host, port, get) for r in allow)
        if not listed:
            return False, f"{ALIAS}:{port} is not on the allow-list of this sandbox"
    elif not any(matches(r, host, port, get) for r in allow):
        return False, f"{host}:{port} is not on the allow-list of this sandbox"
    if any(matches(r, host, port, get) for r in deny):
        return False, f"{host}:{port} is on the deny-list of this sandbox"
    return True, "allowed"
