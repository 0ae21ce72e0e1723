#!/usr/bin/python3 -I
"""squid external ACL helper: the per-sandbox egress decision.

Standard library only: squid runs it as `/usr/bin/python3 -I -S acl_helper.py POLICY_DIR
HOST_PORTS` (comma-separated, "-" for none), from a copy next to rules.py (which it loads by path). squid identifies the
sandbox by the connection's source address: the host forwarder connects from a loopback
address leased to that sandbox alone (127.77.x.y).

Input lines (squid 5, concurrency=N): "<channel> <src> <dst-host> <port> <method>",
URL-quoted. Replies: "<channel> OK tag=<sandbox>" or "<channel> ERR tag=<sandbox>
message=<why> log=<why>" (the message fills the ERR_SANDGYM_DENIED page, the log goes to
the access log). "BH" on an internal error; the helper never dies on a bad line.

POLICY_DIR/<src>.json: {"sandbox": "<id>", "allow": [...], "deny": [...]}, re-read when its
mtime changes, so a policy change applies to the next request with no reload.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

if TYPE_CHECKING:  # the same file, loaded by path below (squid runs us without sandgym)
    from sandgym.sandboxes.egress import rules
    from sandgym.sandboxes.egress.rules import Rule

    Policy = tuple[str, list[Rule], list[Rule]]  # (sandbox, allow rules, deny rules)
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location("sandgym_egress_rules", os.path.join(_here, "rules.py"))
    if _spec is None or _spec.loader is None:
        raise ImportError(f"cannot load rules.py next to {__file__}")
    rules = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(rules)

_cache: dict[str, tuple[int, int, Policy]] = {}  # path -> (mtime_ns, size, policy)


def load(policy_dir: str, src: str) -> Policy | None:
    if "/" in src or src.startswith("."):
        return None
    path = os.path.join(policy_dir, src + ".json")
    try:
        st = os.stat(path)
    except OSError:
        return None
    hit = _cache.get(path)
    if hit and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
        return hit[2]
    with open(path) as f:
        pol = json.load(f)
    parsed = (
        str(pol.get("sandbox") or "?"),
        rules.parse_entries(pol.get("allow") or [], "allow"),
        rules.parse_entries(pol.get("deny") or [], "deny"),
    )
    _cache[path] = (st.st_mtime_ns, st.st_size, parsed)
    return parsed


def answer(policy_dir: str, host_ports: list[int], line: str) -> str | None:
    parts = line.split()
    if not parts:
        return None
    chan = parts[0]
    try:
        src, host, port, _method = [unquote(p) for p in parts[1:5]]
        pol = load(policy_dir, src)
        if pol is None:
            why = "this client has no egress policy (the sandbox is gone or has no egress)"
            return "%s ERR message=%s log=%s" % (chan, quote(why), quote(why))
        sandbox, allow, deny = pol
        ok, why = rules.decide(allow, deny, host, int(port), host_ports)
        tag = "tag=%s" % quote(sandbox)
        if ok:
            return "%s OK %s" % (chan, tag)
        return "%s ERR %s message=%s log=%s" % (chan, tag, quote(why), quote(why))
    except Exception as exc:  # never die: squid would stall every request
        return "%s BH message=%s" % (chan, quote(repr(exc)))


def main() -> None:
    policy_dir = sys.argv[1]
    ports = sys.argv[2] if len(sys.argv) > 2 else "-"
    host_ports = [int(p) for p in ports.split(",") if p.isdigit()]
    for line in sys.stdin:
        reply = answer(policy_dir, host_ports, line)
        if reply is not None:
            sys.stdout.write(reply + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
