"""The hostile-program corpus: one table entry per program with its contained outcome.

Every program is a bash script run as model-written code would be (`sandbox.exec(script)`).
Placeholders, filled per run by `Hostile.render`:

  {SBX}        a unique marker for this run; programs that leave processes behind put it
               in their argv so the host can look for survivors after close()
  {HOSTMARK_A} {HOSTMARK_B}
               two halves of the argv marker of a host process the test keeps running
               (split so the script's own command line does not contain the whole marker)
  {SECRET_PATH} {SECRET}
               a file on the host (in a test tmp dir) holding a random secret
  {TCP_PORT} {UDP_PORT}
               host listeners on 127.0.0.1 that must never hear from a sandbox

Outcomes are asserted on the ExecResult: `forbidden` strings must not appear in stdout or
stderr (a program prints ESCAPED only when the attack worked), `required` strings must, and
`outcome` names what the sandbox layer must report. `gone_ok` programs may take the sandbox
down (killing every process of its user); then exec may raise SandboxGoneError, or, where
the sandbox survived its exec daemon being killed, SandboxInterruptedError (and the sandbox
must then answer), never anything that reaches the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

Outcome = Literal["any", "timed_out", "oom_or_failed", "truncated", "ok"]

MEMORY_MB = 256  # the corpus spec's limits (small, so bombs hit them fast)
DISK_MB = 32
PIDS = 64
OUTPUT_LIMIT = 64 * 1024
ESCAPED = "ESCAPED"


@dataclass(frozen=True)
class Hostile:
    name: str
    script: str
    outcome: Outcome = "any"
    timeout: float = 20.0
    forbidden: tuple[str, ...] = (ESCAPED,)
    required: tuple[str, ...] = ()
    gone_ok: bool = False  # the program may legitimately end the sandbox itself
    leaves_processes: bool = False  # starts processes carrying {SBX} meant to outlive it
    providers: frozenset[str] = field(default_factory=lambda: frozenset({"docker", "local", "prime"}))
    # provider -> why it is not contained there (documented in docs/security.md); the test
    # is a strict xfail, so closing the gap makes it fail until this entry is removed
    known_gaps: dict[str, str] = field(default_factory=dict)
    # Under profile vm (root, writable root, gVisor) some checks mean something else (root
    # may read the image's /etc/shadow, holds a few capabilities): field -> value to use
    # there, each with its reason in a comment where it is set.
    vm: dict[str, Any] = field(default_factory=dict)

    def for_vm(self) -> Hostile:
        return replace(self, **self.vm) if self.vm else self

    def render(self, **values: str) -> str:
        out = self.script
        for k, v in values.items():
            out = out.replace("{" + k + "}", v)
        return out


_PY_NET = r"""
import errno, socket, struct, sys
def attempt(name, fn):
    try:
        fn()
    except OSError as e:
        print(name, "blocked", errno.errorcode.get(e.errno, e.errno))
    else:
        print("ESCAPED", name)

def tcp_host_listener():
    s = socket.create_connection(("127.0.0.1", {TCP_PORT}), timeout=2)
    s.sendall(b"hello from {SBX}")
def tcp_ipv6_loopback():
    s = socket.socket(socket.AF_INET6); s.settimeout(2); s.connect(("::1", {TCP_PORT}))
def udp_host_listener():
    # sendto on loopback "succeeds" even with nobody listening; the host listener is the
    # judge (the test asserts it heard nothing), so this never prints ESCAPED by itself.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"udp from {SBX}", ("127.0.0.1", {UDP_PORT}))
    s.settimeout(1)
    s.recv(16)  # nothing can answer: a timeout (OSError) is the contained outcome
def dns_lookup():
    socket.getaddrinfo("example.com", 80)
def non_loopback_connect():
    # TEST-NET-1 (RFC 5737, never routed). With no network there is no route, so connect()
    # fails at once and no packet leaves; this is the only non-loopback target anywhere.
    s = socket.socket(); s.settimeout(1); s.connect(("192.0.2.1", 80))
def raw_socket():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
def packet_socket():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
def netlink_add_link():
    # RTM_NEWLINK for a dummy interface; the kernel's ack carries the verdict.
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
    def attr(t, payload):
        ln = 4 + len(payload)
        return struct.pack("HH", ln, t) + payload + b"\0" * ((4 - ln % 4) % 4)
    kind = attr(18, attr(1, b"dummy\0"))  # IFLA_LINKINFO { IFLA_INFO_KIND }
    body = struct.pack("BxHiII", 0, 0, 0, 0, 0) + attr(3, b"sbx{SBX_SHORT}\0") + kind
    flags = 0x1 | 0x4 | 0x200 | 0x400  # REQUEST | ACK | EXCL | CREATE
    s.sendto(struct.pack("IHHII", 16 + len(body), 16, flags, 1, 0) + body, (0, 0))
    err = struct.unpack("i", s.recv(65536)[16:20])[0]
    if err:
        raise OSError(-err, "netlink")
for n, f in list(globals().items()):
    if callable(f) and n not in ("attempt",) and not n.startswith("_") and f.__module__ == "__main__":
        attempt(n, f)
print("net-done")
"""

CORPUS: tuple[Hostile, ...] = (
    Hostile(
        "fork_bomb",
        # Every copy's argv carries the marker, so survivors on the host are findable.
        "bomb_{SBX}(){ bomb_{SBX} | bomb_{SBX} & }; bomb_{SBX}; sleep 30 # {SBX}",
        outcome="timed_out",
        timeout=4,
        forbidden=(),
        leaves_processes=True,
    ),
    Hostile(
        "memory_bomb",
        "python3 -c 'x = bytearray(4 << 30); x[::4096] = b\"a\" * len(x[::4096]); print(\"ESCAPED\", len(x))'",
        outcome="oom_or_failed",
    ),
    Hostile(
        "memory_bomb_shell",
        # Grows a bash string until the limit stops it (no single huge allocation).
        "s=x; while :; do s=$s$s; done",
        outcome="oom_or_failed",
        timeout=30,
    ),
    Hostile(
        "disk_fill_workdir",
        f"head -c {4 * DISK_MB}M /dev/zero > fill 2>/dev/null; echo size=$(stat -c %s fill); "
        f"[ $(stat -c %s fill) -gt $(({DISK_MB} * 1048576)) ] && echo ESCAPED; rm -f fill; echo still-usable",
        required=("still-usable",),
    ),
    Hostile(
        "disk_fill_tmp",
        f"head -c {4 * DISK_MB}M /dev/zero > /tmp/fill 2>/dev/null; echo size=$(stat -c %s /tmp/fill); "
        f"[ $(stat -c %s /tmp/fill) -gt $(({DISK_MB} * 1048576)) ] && echo ESCAPED; rm -f /tmp/fill; echo still-usable",
        required=("still-usable",),
    ),
    Hostile(
        "disk_fill_many_files",
        # Inodes rather than bytes: a tmpfs has an inode budget too (or memory binds first).
        "mkdir -p d; i=0; while [ $i -lt 200000 ] && : > d/f$i 2>/dev/null; do i=$((i+1)); done; "
        "echo files=$i; rm -rf d; echo still-usable",
        required=("still-usable",),
        timeout=60,
    ),
    Hostile("huge_output", "yes 'model output line' | head -c 50M", outcome="truncated"),
    Hostile("binary_output", "head -c 5M /dev/urandom; head -c 5M /dev/urandom >&2", outcome="truncated"),
    Hostile("infinite_loop", "while :; do :; done", outcome="timed_out", timeout=2),
    Hostile(
        "infinite_loop_ignoring_signals",
        "trap '' TERM INT HUP; python3 -c 'import signal; [signal.signal(s, signal.SIG_IGN) for s in (1,2,15)]; exec(\"while True: pass\")'",
        outcome="timed_out",
        timeout=2,
    ),
    Hostile(
        "read_host_files",
        "cat {SECRET_PATH} 2>/dev/null; cat /proc/1/root{SECRET_PATH} 2>/dev/null; "
        "cat /etc/shadow 2>/dev/null | grep -q '^root:' && echo ESCAPED shadow; "
        "grep -l \"{HOSTMARK_A}\"\"{HOSTMARK_B}\" /proc/[0-9]*/cmdline 2>/dev/null && echo ESCAPED host-procs-visible; "
        "ls /root 2>/dev/null | head -1 | grep -q . && echo ESCAPED root-home; echo scanned",
        forbidden=(ESCAPED, "{SECRET}"),
        required=("scanned",),
        # vm: root reads the image's own /etc/shadow (its file, not the host's); the rest holds.
        vm={"script": "cat {SECRET_PATH} 2>/dev/null; cat /proc/1/root{SECRET_PATH} 2>/dev/null; "
            "grep -l \"{HOSTMARK_A}\"\"{HOSTMARK_B}\" /proc/[0-9]*/cmdline 2>/dev/null && echo ESCAPED host-procs-visible; "
            "ls /root 2>/dev/null | head -1 | grep -q . && echo ESCAPED root-home; echo scanned"},
    ),
    Hostile(
        "docker_socket",
        "for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock; do "
        "[ -e $s ] && echo ESCAPED exists $s; done; "
        "python3 -c \"import socket\nfor p in ('/var/run/docker.sock', '/run/docker.sock'):\n"
        "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(p); s.sendall(b'GET /_ping HTTP/1.0\\r\\n\\r\\n'); print('ESCAPED', p, s.recv(64))\n"
        "    except OSError as e:\n        print(p, 'unreachable', e.errno)\"",
        required=("unreachable",),
    ),
    Hostile(
        "privilege_escalation",
        "su root -c 'echo ESCAPED su' </dev/null 2>/dev/null; "
        "sudo -n sh -c 'echo ESCAPED sudo' 2>/dev/null; "
        "setpriv --reuid=0 --regid=0 --clear-groups sh -c 'echo ESCAPED setpriv' 2>/dev/null; "
        "python3 -c 'import os; os.setuid(0); print(\"ESCAPED setuid\")' 2>/dev/null; "
        "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m 2>/dev/null && echo ESCAPED mount; "
        "chroot / true 2>/dev/null && echo ESCAPED chroot; "
        "capsh --gid=0 --uid=0 -- -c 'echo ESCAPED capsh' 2>/dev/null; "
        # every setuid binary in the box, run as `id -u`-printing probe where it takes -c
        "for b in $(find / -xdev -perm -4000 -type f 2>/dev/null); do $b --version >/dev/null 2>&1; done; "
        "[ \"$(id -u)\" = 0 ] && [ -w /etc ] && echo ESCAPED root-writes-etc; "
        "grep -E '^(CapEff|CapPrm|CapAmb)' /proc/self/status",
        required=("CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapAmb:\t0000000000000000"),
        # vm: the user is root on purpose, holding only CHOWN DAC_OVERRIDE FOWNER FSETID KILL
        # SETGID SETUID (0xfb; gVisor's /proc has no CapAmb line). What root must still not do: mount, chroot, make devices,
        # write kernel settings, load modules, raw sockets, ptrace-attach.
        vm={"script": "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m 2>/dev/null && echo ESCAPED mount; "
            "chroot / true 2>/dev/null && echo ESCAPED chroot; "
            "mknod /tmp/sda b 8 0 2>/dev/null && echo ESCAPED mknod; "
            "(echo x > /proc/sys/kernel/hostname) 2>/dev/null && echo ESCAPED sysctl; "
            "(echo 1 > /proc/sysrq-trigger) 2>/dev/null && echo ESCAPED sysrq; "
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); print(\"ESCAPED raw\")' 2>/dev/null; "
            "python3 -c 'import ctypes; l=ctypes.CDLL(None); print(\"ESCAPED ptrace\") if l.ptrace(16, 1, 0, 0) == 0 else None' 2>/dev/null; "
            "grep -E '^(CapEff|CapPrm|CapAmb)' /proc/self/status",
            "required": ("CapEff:\t00000000000000fb", "CapPrm:\t00000000000000fb")},
    ),
    Hostile(
        "user_namespace_root",
        # An unprivileged user namespace gives "root" over a fresh namespace: not the host's,
        # but a classic kernel attack surface. Docker's seccomp profile forbids it.
        "unshare -r sh -c 'echo ESCAPED unshare-r' 2>/dev/null; "
        "unshare -Urm sh -c 'mount -t tmpfs none /tmp && echo ESCAPED userns-mount' 2>/dev/null; echo tried",
        required=("tried",),
        # vm: gVisor implements user namespaces in its own kernel (the sentry): creating one
        # reaches no host kernel code, which is the attack surface this guards. Docker's seccomp
        # profile, which forbids it under runc, cannot be applied inside this gVisor build
        # (with --oci-seccomp threads fail to start). So it may succeed there, harmlessly.
        vm={"forbidden": ()},
        known_gaps={
            "local": "bwrap is started without --disable-userns: execs enter with nsenter as "
            "the sandbox uid, and with a nested user namespace nsenter can no longer join the "
            "sandbox's ipc/uts/net namespaces (they belong to the outer one)"
        },
    ),
    Hostile(
        "kill_pid_1",
        "kill -9 1; kill -KILL -1; sleep 1; echo survived",
        gone_ok=True,
        forbidden=(),
    ),
    Hostile(
        "sleeping_children",
        # Children that outlive the command: plain background, nohup, setsid, double fork.
        "nohup bash -c 'exec -a {SBX}-nohup sleep 1000' >/dev/null 2>&1 & "
        "setsid bash -c 'exec -a {SBX}-setsid sleep 1000' >/dev/null 2>&1 < /dev/null & "
        "( ( exec -a {SBX}-orphan sleep 1000 ) & ) ; "
        "setsid env -i bash -c 'exec -a {SBX}-envi sleep 1000' >/dev/null 2>&1 < /dev/null & "
        "sleep 0.2; echo started",
        outcome="ok",  # the command is over when its main process is, holders or not
        required=("started",),
        leaves_processes=True,
    ),
    Hostile(
        "network",
        "python3 - <<'EOF'\n" + _PY_NET + "EOF\n"
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{TCP_PORT} && echo ESCAPED bash-tcp' 2>/dev/null; "
        "ip link add sbx{SBX_SHORT} type dummy 2>/dev/null && echo ESCAPED ip-link; echo done",
        required=("tcp_host_listener blocked", "dns_lookup blocked", "raw_socket blocked", "net-done", "done"),
    ),
)
