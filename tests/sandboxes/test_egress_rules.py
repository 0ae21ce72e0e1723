"""Egress entries: what the spec accepts, and what the proxy's helper decides (no Docker)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandgym.sandboxes.egress import rules
from sandgym.sandboxes.egress.proxy import _parse
from sandgym.sandboxes.spec import EgressPolicy, SandboxSpec

HELPER = Path(rules.__file__).with_name("acl_helper.py")


def _addrs(*ips: str):  # type: ignore[no-untyped-def]
    return lambda: [ipaddress.IPv4Address(i) for i in ips]


@pytest.mark.parametrize(
    "entry",
    ["*", "pypi.org", "PyPI.org.", "*.pythonhosted.org", "files.pythonhosted.org:8443", "h:8000-8100",
     "203.0.113.7", "203.0.113.0/24", "203.0.113.0/24:22", "host.sandgym.internal", "host.sandgym.internal:8765"],
)
def test_good_entries(entry: str) -> None:
    assert EgressPolicy(allow=[entry]).allow == (rules.parse_entry(entry).text,)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("http://pypi.org", "no schemes"),
        ("user@pypi.org", "no schemes"),
        ("pypi.org/simple", "only IPv4 networks take a /prefix"),
        ("a*.b.org", "not a valid host name"),
        ("*.org", "a wildcard needs a domain"),
        ("*.*.org", "not a valid host name"),
        ("::1", "IPv6"),
        ("[::1]:80", "IPv6"),
        ("pypi.org:0", "ports must be within 1-65535"),
        ("pypi.org:9-1", "LO <= HI"),
        ("pypi.org:http", "port must be N or LO-HI"),
        ("300.1.2.3", "not a valid IPv4"),
        ("", "not a host"),
        ("-bad-.org", "not a valid host name"),
    ],
)
def test_bad_entries_name_the_entry(entry: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as exc:
        EgressPolicy(allow=[entry])
    assert repr(entry) in str(exc.value)
    with pytest.raises(ValueError):
        EgressPolicy(allow=["*"], deny=[entry])


def test_too_many_entries() -> None:
    with pytest.raises(ValidationError, match=r"allow has 1025 entries; allowed range: \[0, 1024\]"):
        EgressPolicy(allow=[f"h{i}.org" for i in range(1025)])
    with pytest.raises(ValidationError, match="not one string"):
        EgressPolicy(allow="pypi.org")  # type: ignore[arg-type]


def test_network_is_shorthand_for_egress() -> None:
    assert SandboxSpec().egress is None and SandboxSpec().network is False
    assert SandboxSpec(network=True).egress == EgressPolicy.anything()
    s = SandboxSpec(egress={"allow": ["pypi.org"]})
    assert s.network is True and s.egress == EgressPolicy(allow=("pypi.org",))
    with pytest.raises(ValidationError, match="network=False contradicts"):
        SandboxSpec(network=False, egress=EgressPolicy.nothing())
    assert SandboxSpec(egress=EgressPolicy.nothing()).network is True  # plumbed, nothing allowed


def _decide(allow: list[str], deny: list[str], host: str, port: int, addrs=None, host_ports=()):  # type: ignore[no-untyped-def]
    return rules.decide(rules.parse_entries(allow), rules.parse_entries(deny), host, port, host_ports,
                        addrs or _addrs("203.0.113.9"))


def test_decisions() -> None:
    assert _decide(["pypi.org"], [], "pypi.org", 443)[0]
    assert _decide(["pypi.org"], [], "PYPI.org.", 80)[0]
    assert not _decide(["pypi.org"], [], "pypi.org", 22)[0]  # names mean the web ports
    assert _decide(["pypi.org:22"], [], "pypi.org", 22)[0]
    assert not _decide(["pypi.org"], [], "evil-pypi.org", 443)[0]
    assert _decide(["*.pythonhosted.org"], [], "files.pythonhosted.org", 443)[0]
    assert not _decide(["*.pythonhosted.org"], [], "pythonhosted.org", 443)[0]  # not the apex
    assert _decide(["203.0.113.0/24"], [], "example.org", 5432)[0]  # by resolved address
    assert not _decide(["203.0.113.0/24:80"], [], "example.org", 5432)[0]
    assert not _decide(["198.51.100.0/24"], [], "example.org", 443)[0]
    ok, why = _decide(["*"], ["*.evil.org"], "x.evil.org", 443)
    assert not ok and "deny-list" in why
    assert _decide(["*"], ["*.evil.org"], "good.org", 8080)[0]
    ok, why = _decide([], [], "pypi.org", 443)
    assert not ok and "not on the allow-list of this sandbox" in why


def test_host_services_only_by_name_and_exposed_port() -> None:
    alias = rules.ALIAS
    assert _decide([alias], [], alias, 8765, host_ports=(8765,))[0]
    assert _decide([f"{alias}:8765"], [], alias, 8765, host_ports=(8765, 9000))[0]
    assert not _decide([f"{alias}:8765"], [], alias, 9000, host_ports=(8765, 9000))[0]
    ok, why = _decide([alias], [], alias, 5432, host_ports=(8765,))
    assert not ok and "not exposed" in why
    ok, why = _decide(["*"], [], alias, 8765, host_ports=(8765,))  # "*" does not open host services
    assert not ok and "allow-list" in why


def test_helper_speaks_squids_protocol(tmp_path: Path) -> None:
    (tmp_path / "127.77.0.5.json").write_text(json.dumps(
        {"sandbox": "sb1", "allow": ["pypi.org", rules.ALIAS], "deny": []}))
    lines = "\n".join([
        "0 127.77.0.5 pypi.org 443 CONNECT",
        "1 127.77.0.5 deb.debian.org 443 CONNECT",
        "2 127.77.0.9 pypi.org 443 CONNECT",  # no policy for this address
        f"3 127.77.0.5 {rules.ALIAS} 8765 GET",
        "4 garbage",
        "",
    ])
    out = subprocess.run([sys.executable, "-I", "-S", str(HELPER), str(tmp_path), "8765"], input=lines,
                         capture_output=True, text=True, timeout=30).stdout.splitlines()
    assert out[0] == "0 OK tag=sb1"
    assert out[1].startswith("1 ERR tag=sb1 message=deb.debian.org%3A443%20is%20not")
    assert out[2].startswith("2 ERR message=this%20client%20has%20no%20egress%20policy")
    assert out[3] == "3 OK tag=sb1"
    assert out[4].startswith("4 BH message=")
    # a policy change is read on the next request (no reload)
    (tmp_path / "127.77.0.5.json").write_text(json.dumps({"sandbox": "sb1", "allow": ["deb.debian.org"]}))
    out = subprocess.run([sys.executable, "-I", "-S", str(HELPER), str(tmp_path), "-"],
                         input="7 127.77.0.5 deb.debian.org 443 CONNECT\n", capture_output=True, text=True).stdout
    assert out == "7 OK tag=sb1\n"


def test_access_log_lines_parse() -> None:
    e = _parse("1795467652.031 127.77.0.1 TCP_DENIED/403 370 CONNECT deb.debian.org 443 tag=sb1 "
               "ext=deb.debian.org%3A443%20is%20not%20on%20this%20sandbox%27s%20allow-list\n")
    assert e is not None and e["tag"] == "sb1" and not e["allowed"] and e["status"] == 403
    assert e["host"] == "deb.debian.org" and e["port"] == 443 and "allow-list" in e["reason"]
    e = _parse("1795467652.036 127.77.0.1 TCP_DENIED/403 454 GET 10.1.2.3 80 tag=- ext=-\n")
    assert e is not None and e["reason"] == "10.1.2.3 is a host-internal address"
    assert _parse("short line\n") is None
