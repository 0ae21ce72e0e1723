"""What isolation this host can give the `local` provider, probed once per process.

Each probe actually tries the mechanism (runs bwrap, creates a cgroup, mounts a tmpfs)
because "the binary exists" says nothing in containers, VMs and locked-down kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# System directories the sandbox sees read-only (when they exist on the host).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

# cgroup controllers we use: memory (OOM kill at the limit), pids (fork bombs),
# cpu (CFS quota for fractional cores).
CGROUP_CONTROLLERS = ("memory", "pids", "cpu")
CGROUP_LEAF = "sandgym-local"

MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2


@dataclass(frozen=True)
class LocalCapabilities:
    """What works here. `None`/empty means unavailable; `*_error` says why."""

    root: bool
    bwrap: str | None = None
    bwrap_error: str | None = None
    # controller -> the directory under which per-sandbox cgroups are made
    cgroups: dict[str, str] = field(default_factory=dict)
    cgroup_error: str | None = None
    tmpfs: bool = False
    tmpfs_error: str | None = None
    prlimit: str | None = None
    nsenter: str | None = None  # for persistent sandboxes: exec enters a held namespace
    nsenter_error: str | None = None
    bwrap_size: bool = False  # bwrap knows --size (0.6+): size-limited tmpfs mounts
    setpriv: str | None = None

    def summary(self) -> str:
        parts = [
            f"bwrap={'yes' if self.bwrap else 'no (' + str(self.bwrap_error) + ')'}",
            f"cgroups={','.join(sorted(self.cgroups)) or 'none (' + str(self.cgroup_error) + ')'}",
            f"persistent={'yes' if self.nsenter else 'no (' + str(self.nsenter_error) + ')'}",
            f"tmpfs={'yes' if self.tmpfs else 'no'}",
            f"root={self.root}",
        ]
        return " ".join(parts)


def system_binds() -> list[str]:
    """bwrap arguments exposing the host's system directories read-only; merged-/usr
    symlinks (/bin -> usr/bin) stay symlinks."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def _drop_to(uid: int | None) -> Callable[[], None] | None:
    if uid is None:
        return None

    def pre() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return pre


def bwrap_child_pid(info: bytes) -> int | None:
    """bwrap's pid 1, as a host pid, from what it wrote to its --info-fd; None when it wrote
    nothing usable (it failed before, or not bwrap's JSON)."""
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def read_until(fd: int, end: bytes | None, timeout: float) -> bytes:
    """Read `fd` until EOF (or until `end` arrives), at most `timeout` seconds."""
    data = b""
    deadline = time.monotonic() + timeout
    poller = select.poll()  # not select(): that fails for fds >= 1024
    poller.register(fd, select.POLLIN)
    while (left := deadline - time.monotonic()) > 0:
        if not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        if end is not None and end in data:
            break
    return data


def dev_args(size_bytes: int | None) -> list[str]:
    """A minimal /dev. Not bwrap's --dev: that mounts devpts, for which bwrap nests a
    second user namespace that nsenter could not enter the others from (no ptys here).
    /dev/shm lives in it, so its size is bounded where bwrap has --size."""
    args = (["--size", str(size_bytes)] if size_bytes else []) + ["--tmpfs", "/dev"]
    for d in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists(f"/dev/{d}"):
            args += ["--dev-bind", f"/dev/{d}", f"/dev/{d}"]
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        args += ["--symlink", f"/proc/self/fd/{i}", f"/dev/{name}"]
    return args + ["--symlink", "/proc/self/fd", "/dev/fd", "--dir", "/dev/shm"]


def nsenter_argv(nsenter: str, init_pid: int, network: bool) -> list[str]:
    """Enter every namespace of a held sandbox (as whoever we are; our uid maps to the
    sandbox user), at its root; the caller appends `--` and the command."""
    ns = ["-U", "-m", "-p", "-i", "-u"] + ([] if network else ["-n"])
    return [nsenter, "-t", str(init_pid), *ns, "--preserve-credentials", "-r", "-w"]


def probe_bwrap(run_as: int | None) -> tuple[str | None, str | None, str | None]:
    """Start a sandbox the way the provider does (every namespace, held by a long-lived
    command) and, when nsenter exists, enter it once. Returns (bwrap path or None, why
    bwrap is unusable, why persistent sandboxes are unusable)."""
    path = shutil.which("bwrap")
    if path is None:
        return None, "bwrap not found on PATH", "no bwrap"
    argv = [
        path, "--unshare-user", "--uid", "1000", "--gid", "1000", "--unshare-pid",
        "--unshare-net", "--unshare-ipc", "--unshare-uts", "--new-session",
        *system_binds(), "--proc", "/proc", *dev_args(None), "--tmpfs", "/tmp",
    ]  # fmt: skip
    info_r, info_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [*argv, "--info-fd", str(info_w), "--", "/bin/sh", "-c", 'test "$(id -u)" = 1000 && echo ready; exec sleep 60'],
            stdin=subprocess.DEVNULL, stdout=ready_w, stderr=subprocess.PIPE, pass_fds=(info_w,),
            preexec_fn=_drop_to(run_as), env={"PATH": "/usr/bin:/bin"}, cwd="/", start_new_session=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        for fd in (info_r, info_w, ready_r, ready_w):
            os.close(fd)
        return None, f"bwrap failed to start: {e}", "no bwrap"
    os.close(info_w)
    os.close(ready_w)
    try:
        info = read_until(info_r, None, 30.0)
        ready = read_until(ready_r, b"\n", 30.0)
        init_pid = bwrap_child_pid(info)
        if ready != b"ready\n" or init_pid is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
            why = err.decode(errors="replace").strip() or f"exit {proc.returncode}"
            return None, f"bwrap does not work here: {why}", "no bwrap"
        nsenter = shutil.which("nsenter")
        ns_error: str | None = "nsenter not found on PATH"
        if nsenter:
            try:
                r = subprocess.run(
                    [*nsenter_argv(nsenter, init_pid, False), "--", "/bin/sh", "-c", 'test "$(id -u)" = 1000'],
                    capture_output=True, timeout=30, preexec_fn=_drop_to(run_as), env={"PATH": "/usr/bin:/bin"},
                    cwd="/",
                )  # fmt: skip
                ns_error = None if r.returncode == 0 else (
                    f"nsenter cannot enter the sandbox: {r.stderr.decode(errors='replace').strip()}"
                )
            except (OSError, subprocess.SubprocessError) as e:
                ns_error = f"nsenter failed: {e}"
        with contextlib.suppress(ProcessLookupError):
            os.kill(init_pid, signal.SIGKILL)  # pid 1 of the namespace: takes the rest along
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=30)
        return path, None, ns_error
    finally:
        os.close(info_r)
        os.close(ready_r)


def _own_cgroup_v1() -> dict[str, str]:
    """controller -> this process's cgroup path (relative to the controller's mount)."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, rel = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(","):
                if c:
                    out[c] = rel
    return out


def probe_cgroups() -> tuple[dict[str, str], str | None]:
    """Controllers where we can create per-sandbox cgroups: controller -> parent dir.
    Sandbox cgroups nest under this process's own cgroup, so whatever limits the caller
    lives under still apply to its sandboxes."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return _probe_v2()
    try:
        own = _own_cgroup_v1()
    except OSError as e:
        return {}, f"cannot read /proc/self/cgroup: {e}"
    found: dict[str, str] = {}
    errors: list[str] = []
    for c in CGROUP_CONTROLLERS:
        mount = f"/sys/fs/cgroup/{c}"
        if c not in own or not os.path.isdir(mount):
            errors.append(f"{c}: not mounted at {mount}")
            continue
        parent = os.path.join(mount + own[c].rstrip("/"), CGROUP_LEAF)
        err = _probe_parent(parent, [])
        if err:
            errors.append(f"{c}: {err}")
        else:
            found[c] = parent
    return found, ("; ".join(errors) or None)


def _probe_parent(parent: str, v2_ctrls: list[str]) -> str | None:
    """Can we make children under `parent`? Leaves nothing behind (sandboxes recreate
    the parent; if others live in it, rmdir fails with EBUSY and it stays)."""
    from .cgroup import enable_v2_controllers

    try:
        os.makedirs(parent, exist_ok=True)
        if v2_ctrls:
            enable_v2_controllers(parent, v2_ctrls)
        probe = tempfile.mkdtemp(prefix="probe-", dir=parent)
        os.rmdir(probe)
    except OSError as e:
        return f"{e.strerror} ({parent})"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(parent)
    return None


def _probe_v2() -> tuple[dict[str, str], str | None]:
    """cgroup v2: our own cgroup must be able to hand memory/pids/cpu to children. That
    holds at the root cgroup, or where controllers are already delegated to us; a
    non-root cgroup that holds processes (ours) cannot enable them ("no internal
    processes"), and we do not move the caller's processes to make room."""
    from .cgroup import enable_v2_controllers

    try:
        rel = next(
            line.rstrip("\n").split(":", 2)[2] for line in open("/proc/self/cgroup") if line.startswith("0::")
        )
    except (OSError, StopIteration):
        return {}, "cgroup v2: cannot find our own cgroup in /proc/self/cgroup"
    base = "/sys/fs/cgroup" + rel.rstrip("/")
    try:
        with open(os.path.join(base, "cgroup.controllers")) as f:
            avail = f.read().split()
    except OSError as e:
        return {}, f"cgroup v2: {e}"
    want = [c for c in CGROUP_CONTROLLERS if c in avail]
    if not want:
        return {}, f"cgroup v2: none of {', '.join(CGROUP_CONTROLLERS)} available in {base}"
    try:
        enable_v2_controllers(base, want)
    except OSError as e:
        return {}, f"cgroup v2: cannot delegate {', '.join(want)} below {base}: {e.strerror}"
    parent = os.path.join(base, CGROUP_LEAF)
    err = _probe_parent(parent, want)
    if err:
        return {}, f"cgroup v2: {err}"
    missing = [c for c in CGROUP_CONTROLLERS if c not in want]
    return {c: parent for c in want}, (f"cgroup v2: {', '.join(missing)} unavailable" if missing else None)


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(target: str, size_bytes: int, mode: int = 0o711) -> None:
    opts = f"size={size_bytes},mode={mode:o},uid=0,gid=0".encode()
    flags = MS_NOSUID | MS_NODEV
    if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def umount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def is_mountpoint(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == path for line in f)
    except OSError:
        return os.path.ismount(path)


def probe_tmpfs() -> tuple[bool, str | None]:
    if os.geteuid() != 0:
        return False, "not root: cannot mount a size-limited tmpfs per sandbox"
    d = tempfile.mkdtemp(prefix="sandgym-probe-")
    try:
        mount_tmpfs(d, 1 << 20)
        umount(d)
        return True, None
    except OSError as e:
        return False, f"mount tmpfs failed: {e.strerror}"
    finally:
        os.rmdir(d)


@functools.cache
def capabilities(probe_uid: int | None) -> LocalCapabilities:
    """Probe once per process. `probe_uid`: the host uid sandboxes will run bwrap as
    (None = ours), since unprivileged user namespaces may be allowed for some and not
    for others."""
    root = os.geteuid() == 0
    bwrap, bwrap_error, nsenter_error = probe_bwrap(probe_uid)
    cgroups, cgroup_error = probe_cgroups() if root else ({}, "not root")
    tmpfs, tmpfs_error = probe_tmpfs()
    bwrap_size = False
    if bwrap:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10)
            bwrap_size = b"--size" in out.stdout + out.stderr
    return LocalCapabilities(
        root=root, bwrap=bwrap, bwrap_error=bwrap_error, cgroups=cgroups,
        cgroup_error=cgroup_error, tmpfs=tmpfs, tmpfs_error=tmpfs_error, bwrap_size=bwrap_size,
        prlimit=shutil.which("prlimit"), nsenter=None if nsenter_error else shutil.which("nsenter"),
        nsenter_error=nsenter_error, setpriv=shutil.which("setpriv"),
    )  # fmt: skip
