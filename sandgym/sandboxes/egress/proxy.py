"""The egress proxy: one squid per provider, policies per sandbox, the egress log.

Why squid (docs/design-notes.md has the comparison): it does the HTTP parsing, CONNECT,
keep-alive, DNS and logging, and with an external ACL helper keyed by the client's source
address one process serves every sandbox and a policy change is a file write: no reload.
tinyproxy cannot express CIDRs or per-host ports; a per-sandbox `squid -k reconfigure`
took 8-13 s with 300 sandboxes.

squid runs as a child of a small watchdog that ends it when this process goes away (its
stdin pipe closes), so a crashed driver leaves no proxy behind. It listens on a free port
on 127.0.0.1 and refuses every host-internal destination itself (loopback, link-local,
private ranges, on its own DNS answers) except the operator's exposed host ports under
the name host.sandgym.internal; everything else is the helper's per-sandbox decision.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import pwd
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote

from ..errors import SandboxCreateError
from ..result import EgressLogEntry
from ..spec import EgressPolicy
from .rules import ALIAS

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SQUID_ERRORS = Path("/usr/share/squid/errors/templates")
# Loopback addresses leased to sandboxes, one each: squid tells them apart by source.
_POOL = ipaddress.IPv4Network("127.77.0.0/16")
_START_TIMEOUT_S = 20.0
# Never reachable through the proxy (squid resolves names itself, so no DNS rebinding).
# Not ::ffff:0:0/96 or 240/4: squid folds those into "all of IPv4" and would refuse everything.
_INTERNAL = (
    "127.0.0.0/8 0.0.0.0/8 169.254.0.0/16 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 "
    "100.64.0.0/10 224.0.0.0/4 ::1 fe80::/10 fc00::/7"
)

# The watchdog: runs squid, and ends it when our end of its stdin closes (we exited).
_WATCHDOG = r"""
import os, signal, subprocess, sys, threading, time
p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
def stop():
    if p.poll() is None:
        p.terminate()
        for _ in range(30):
            if p.poll() is not None:
                return
            time.sleep(0.1)
        p.kill()
def watch():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop()
threading.Thread(target=watch, daemon=True).start()
signal.signal(signal.SIGTERM, lambda *a: (stop(), os._exit(0)))
sys.exit(p.wait())
"""

ERR_DENIED = "sandgym egress: %o\n"
ERR_INTERNAL = (
    "sandgym egress: %H is a host-internal address; sandboxes may reach host services only "
    f"as {ALIAS}:PORT on the ports the operator exposes\n"
)


def squid_binary() -> str | None:
    return shutil.which("squid") or ("/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EgressProxy:
    """One squid for one provider. Thread-safe; `start` is lazy and idempotent."""

    def __init__(self, state_dir: str | os.PathLike[str], host_ports: tuple[int, ...] = ()) -> None:
        self.dir = Path(state_dir)
        self.host_ports = tuple(host_ports)
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._next = 1
        self._leased: dict[str, str] = {}  # source address -> sandbox id

    # -- the process ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _config(self, port: int) -> str:
        d = self.dir
        helper = (
            f"/usr/bin/python3 -I -S {d}/helper/acl_helper.py {d}/policies "
            f"{','.join(map(str, self.host_ports)) or '-'}"
        )
        user = ""
        if os.geteuid() == 0:
            user = "cache_effective_user proxy\n" if _has_user("proxy") else "cache_effective_user nobody\n"
        return f"""# sandgym egress proxy (generated; see sandgym/sandboxes/egress/proxy.py)
http_port 127.0.0.1:{port}
{user}pid_filename {d}/squid.pid
cache_log {d}/logs/cache.log
logformat sandgym %ts.%03tu %>a %Ss/%03>Hs %<st %rm %>rd %>rP tag=%et ext=%ea
access_log stdio:{d}/logs/access.log sandgym
logfile_rotate 0
coredump_dir {d}
cache deny all
cache_mem 8 MB
shutdown_lifetime 1 seconds
visible_hostname sandgym-egress
forwarded_for delete
via off
httpd_suppress_version_string on
pinger_enable off
max_filedescriptors 8192
hosts_file {d}/hosts
error_directory {d}/errors
external_acl_type sandgym_egress ttl=0 negative_ttl=0 children-max=4 children-startup=1 concurrency=50 %>a %DST %PORT %METHOD {helper}
acl host_alias dstdomain -n {ALIAS}
acl internal_dst dst {_INTERNAL}
acl sandbox_ok external sandgym_egress
http_access deny internal_dst !host_alias
deny_info ERR_SANDGYM_INTERNAL host_alias
http_access deny !sandbox_ok
deny_info ERR_SANDGYM_DENIED sandbox_ok
http_access allow all
"""

    def _prepare(self, port: int) -> Path:
        d = self.dir
        for sub in ("", "policies", "logs", "helper", "errors"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        for f in ("acl_helper.py", "rules.py"):
            shutil.copyfile(HERE / f, d / "helper" / f)
        (d / "hosts").write_text(f"127.0.0.1 {ALIAS}\n")
        if SQUID_ERRORS.is_dir():
            for t in SQUID_ERRORS.iterdir():
                shutil.copyfile(t, d / "errors" / t.name)
        (d / "errors" / "ERR_SANDGYM_DENIED").write_text(ERR_DENIED)
        (d / "errors" / "ERR_SANDGYM_INTERNAL").write_text(ERR_INTERNAL)
        conf = d / "squid.conf"
        conf.write_text(self._config(port))
        if os.geteuid() == 0:  # squid drops to its own user: it must write logs, read policies
            uid = pwd.getpwnam("proxy" if _has_user("proxy") else "nobody").pw_uid
            for sub in ("logs",):
                os.chown(d / sub, uid, -1)
            (d / "policies").chmod(0o755)
        return conf

    def ensure(self) -> int:
        """Start squid when it is not running (again, if it died); its port."""
        self.start()
        assert self.port is not None
        return self.port

    def start(self) -> None:
        with self._lock:
            if self.running:
                return
            binary = squid_binary()
            if binary is None:
                raise SandboxCreateError("egress needs squid (apt-get install squid); it is not installed")
            last = ""
            if self._proc is not None:
                log.warning("the egress proxy (squid) died (%s); starting it again", self._failure(self._proc)[-500:])
            for _ in range(3):  # the free port may be taken between the probe and squid's bind
                port = _free_port()
                conf = self._prepare(port)
                proc = subprocess.Popen(
                    [sys.executable if not Path("/usr/bin/python3").exists() else "/usr/bin/python3",
                     "-I", "-S", "-c", _WATCHDOG, binary, "-f", str(conf), "-N", "-d0"],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                if self._wait_listening(port, proc):
                    self._proc, self.port = proc, port
                    log.info("egress proxy (squid) on 127.0.0.1:%d, state in %s", port, self.dir)
                    return
                last = self._failure(proc)
            raise SandboxCreateError(f"the egress proxy (squid) did not start: {last}")

    def _wait_listening(self, port: int, proc: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def _failure(self, proc: subprocess.Popen[bytes]) -> str:
        if proc.poll() is None:
            proc.kill()
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            err = b""
        text = (err or b"").decode(errors="replace").strip()
        try:
            text += "\n" + (self.dir / "logs" / "cache.log").read_text()[-1500:]
        except OSError:
            pass
        return text.strip()[-1500:] or "no output"

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # the watchdog ends squid
            proc.wait(timeout=10)
        except Exception:
            proc.kill()

    # -- policies -------------------------------------------------------------------------

    def lease(self, sandbox_id: str, policy: EgressPolicy) -> str:
        """A loopback source address for a new sandbox, its policy written. Addresses are
        handed out in order and not reused until the pool wraps (65k), so the log's
        addresses stay attributable."""
        with self._lock:
            for _ in range(_POOL.num_addresses):
                n = self._next
                self._next = self._next % (_POOL.num_addresses - 2) + 1
                src = str(_POOL[n])
                if src not in self._leased:
                    self._leased[src] = sandbox_id
                    break
            else:
                raise SandboxCreateError("no free egress source address (65k sandboxes with egress at once?)")
        self.set_policy(src, sandbox_id, policy)
        return src

    def set_policy(self, src: str, sandbox_id: str, policy: EgressPolicy | None) -> None:
        pol = policy or EgressPolicy.nothing()
        body = {"sandbox": sandbox_id, "allow": list(pol.allow), "deny": list(pol.deny)}
        path = self.dir / "policies" / f"{src}.json"
        tmp = path.with_name(f".{src}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(body))
        tmp.chmod(0o644)
        os.replace(tmp, path)  # atomic: the helper sees the old or the new policy, whole

    def release(self, src: str) -> None:
        (self.dir / "policies" / f"{src}.json").unlink(missing_ok=True)
        with self._lock:
            self._leased.pop(src, None)

    # -- the log --------------------------------------------------------------------------

    def log_for(self, sandbox_id: str, src: str, since: float = 0.0) -> list[EgressLogEntry]:
        """The sandbox's lines of the access log: tagged with its id, or (refused before the
        helper ran, e.g. a host-internal address) from its source address while leased."""
        path = self.dir / "logs" / "access.log"
        out: list[EgressLogEntry] = []
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError:
            return out
        with f:
            for line in f:
                e = _parse(line)
                if e is None or e["time"] < since:
                    continue
                tag = e["tag"]
                if tag == sandbox_id or (tag in ("-", "") and e["src"] == src):
                    out.append(EgressLogEntry(
                        time=e["time"], sandbox=sandbox_id, method=e["method"], host=e["host"],
                        port=e["port"], allowed=e["allowed"], status=e["status"], bytes=e["bytes"],
                        reason=e["reason"],
                    ))
        return out


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _parse(line: str) -> dict | None:
    # %ts.%03tu %>a %Ss/%03>Hs %<st %rm %>rd %>rP tag=%et ext=%ea
    parts = line.split()
    if len(parts) < 9:
        return None
    try:
        t = float(parts[0])
        code, _, status = parts[2].partition("/")
        port = int(parts[6]) if parts[6].isdigit() else 0
        nbytes = int(parts[3]) if parts[3].isdigit() else 0
    except ValueError:
        return None
    tag = unquote(parts[7].removeprefix("tag="))
    ext = unquote(parts[8].removeprefix("ext="))
    denied = "DENIED" in code
    host = parts[5]
    reason = "" if ext == "-" else ext
    if denied and not reason:
        reason = f"{host} is a host-internal address" if tag in ("-", "") else "refused"
    return {
        "time": t, "src": parts[1], "status": int(status) if status.isdigit() else 0,
        "bytes": nbytes, "method": parts[4], "host": host, "port": port,
        "tag": tag, "allowed": not denied, "reason": reason,
    }
