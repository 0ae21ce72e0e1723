"""The `local` provider: sandboxes without a daemon, as subprocesses in a temp directory.

Each sandbox is a directory `<root>/<id>/` (root: $SANDGYM_LOCAL_ROOT or
`$TMPDIR/sandgym-local`) holding `meta.json` (labels: owner, pid, host, ...; how it was
made) and `fs/`, which holds `work/` (spec.workdir), `tmp/` (/tmp) and `home/`
(/home/sandbox, $HOME). `list()` reads the meta files, so `prune` finds sandboxes of
dead processes, and `remove(id)` can end them from any process. spec.image is ignored.

Isolation, strongest first: bubblewrap namespaces (one held namespace per sandbox that
every exec enters with nsenter, or a fresh bwrap per exec), then as root a private host
uid, cgroups and a tmpfs, and rlimits always; without bwrap, "plain" subprocesses (warned
loudly). `LocalProvider(isolation="auto")` takes what works; probe results are in
`LocalProvider.capabilities`. What each mechanism does, and what this provider does NOT
stop, is in docs/security.md ("The `local` provider").

A persistent namespace's holder ends, and the kernel takes every process of the sandbox
with it, at the spec's TTL or once the owning process is gone (ownership.py): it reads a
pipe whose write end only the owner holds, and end-of-file means the owner died. Its
directory (and tmpfs, cgroups) stays until a `prune` or a sandgym process's reaper. A
command that ends the namespace itself (`kill -KILL -1` takes the holder), and any exec after
it, raises SandboxGoneError, as for a sandbox that is gone.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
import os
import posixpath
import re
import resource
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

import anyio
from pydantic import BaseModel, Field

from ...base import Command, Sandbox, as_bytes, shell_argv
from ...errors import SandboxCreateError, SandboxError, SandboxGoneError, SpecError
from ...ownership import Lifeline, lifeline_grace_s, process_start_time, stamp_owner
from ...result import ExecResult, SandboxInfo
from ...spec import EgressPolicy, SandboxSpec, host_cpus
from .cgroup import CgroupSet, kill_until_gone, pids_of_uid, pids_with_env
from .exec import Launch, namespace_ended, run_process
from .fs import SandboxFS
from .probe import (
    LocalCapabilities,
    bwrap_child_pid,
    capabilities,
    dev_args,
    is_mountpoint,
    mount_tmpfs,
    nsenter_argv,
    read_until,
    system_binds,
    umount,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

Isolation = Literal["auto", "bwrap", "none"]

SANDBOX_ID_ENV = "SANDGYM_SANDBOX_ID"  # in every sandbox process: lets remove() find them
SANDBOX_UID = 1000  # the sandbox user inside bwrap (like the images' `sandbox` user)
HOME = "/home/sandbox"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_UID_BASE = 1_610_000_000  # far above any real or subuid range
DEFAULT_UID_COUNT = 1_000_000
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# How long a per-exec command's result waits for its pid namespace to finish ending (bwrap's
# pid 1 killing and reaping the command's background jobs): milliseconds, bounded anyway.
_NAMESPACE_END_S = 5.0
# Sandbox working dirs must be creatable mount points, not inside a read-only host dir.
_SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/dev")
# The namespace holder: says ready, then lives until the TTL ($3) or, when $1 is set, $2
# seconds after the owner's lifeline (the pipe on its stdin; fd 3 from then on, as dash
# takes single-digit fds only and gives background jobs /dev/null as stdin) reads
# end-of-file. Then it kills every process of the namespace (bwrap's pid 1 waits for all
# of them, not just for the holder) and bwrap's pid 1, left alone, exits.
_HOLDER_SH = r"""exec 3<&0 </dev/null
echo ready
(sleep "$3"; kill -9 -1) &
[ -n "$1" ] && (while read -r _; do :; done <&3 && sleep "$2" && kill -9 -1) 2>/dev/null &
wait"""

WEAK_ISOLATION_MESSAGE = (
    "sandgym local provider: bubblewrap is not usable here ({why}); sandboxes run as PLAIN "
    "SUBPROCESSES with rlimits only: NO filesystem isolation and NO network isolation. "
    "Do not run untrusted code this way; install bubblewrap or use the docker provider."
)
_warned = False


class WeakIsolationWarning(RuntimeWarning):
    """The local provider is running commands without namespaces."""


def _warn_weak(why: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    msg = WEAK_ISOLATION_MESSAGE.format(why=why)
    log.warning(msg)
    warnings.warn(msg, WeakIsolationWarning, stacklevel=3)


class LocalMeta(BaseModel):
    """meta.json: everything needed to find, list and remove the sandbox later."""

    id: str
    created_at: float
    labels: dict[str, str] = Field(default_factory=dict)
    image: str = ""
    mode: Literal["bwrap", "plain"]
    uid: int | None = None  # private host uid (root only)
    cgroups: dict[str, str] = Field(default_factory=dict)
    mounted: bool = False
    spec: dict = Field(default_factory=dict)
    # Persistent sandboxes: a held bwrap whose namespaces every exec enters.
    init_pid: int | None = None  # pid 1 of the sandbox's pid namespace, as the host sees it
    init_start: str | None = None  # its start time, so a recycled pid is never killed


def default_root() -> str:
    return os.environ.get("SANDGYM_LOCAL_ROOT") or os.path.join(tempfile.gettempdir(), "sandgym-local")


class LocalProvider:
    """Sandboxes as local subprocesses; docs/security.md says what is isolated."""

    name = "local"

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        isolation: Isolation = "auto",
        uid_base: int = DEFAULT_UID_BASE,
        uid_count: int = DEFAULT_UID_COUNT,
        persistent: bool = True,
    ) -> None:
        if isolation not in ("auto", "bwrap", "none"):
            raise ValueError(f"isolation must be auto, bwrap or none, got {isolation!r}")
        self.root = Path(root or default_root())
        self.isolation: Isolation = isolation
        self.uid_base = uid_base
        self.uid_count = uid_count
        self.persistent = persistent
        self._lifelines: dict[str, Lifeline] = {}  # sandbox id -> our end of its lifeline

    # ---- capabilities ----------------------------------------------------------------

    @property
    def capabilities(self) -> LocalCapabilities:
        # Probe bwrap as the kind of uid sandboxes will use (a private one when root).
        return capabilities(self.uid_base - 1 if os.geteuid() == 0 else None)

    @property
    def mode(self) -> Literal["bwrap", "plain"]:
        if self.isolation == "none":
            return "plain"
        caps = self.capabilities
        if caps.bwrap:
            return "bwrap"
        if self.isolation == "bwrap":
            raise SandboxCreateError(f"isolation='bwrap' was asked for but {caps.bwrap_error}")
        return "plain"

    def check(self, spec: SandboxSpec) -> None:
        if spec.gpus > 0:
            raise SpecError(f"gpus={spec.gpus}: GPUs are not supported by the local provider (use docker)")
        wd = spec.workdir
        if wd == "/" or any(wd == p or wd.startswith(p + "/") for p in _SYSTEM_PREFIXES):
            raise SpecError(f"workdir={wd!r}: the local provider needs a workdir outside / and the system dirs")
        if spec.user not in (None, "sandbox", str(SANDBOX_UID), "root", "0"):
            raise SpecError(f"user={spec.user!r}: the local provider runs as 'sandbox' (uid 1000) or 'root'")
        if spec.user in ("root", "0") and self.mode == "plain":
            raise SpecError("user='root': cannot run as root without bubblewrap (plain mode)")
        if spec.profile != "strict":
            raise SpecError(f"profile={spec.profile!r}: the local provider has only 'strict' (use docker for 'vm')")
        if spec.egress is not None and spec.egress != EgressPolicy.anything():
            raise SpecError(
                "egress: the local provider cannot enforce allow/deny lists (it can only share the "
                "host's network, egress=['*'] / network=True); use the docker provider"
            )

    # ---- lifecycle -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> LocalSandbox:
        self.check(spec)
        mode = self.mode
        if mode == "plain":
            why = "isolation='none'" if self.isolation == "none" else str(self.capabilities.bwrap_error)
            _warn_weak(why)
        all_labels = stamp_owner({**spec.labels, **labels})
        return await anyio.to_thread.run_sync(self._create_sync, spec, all_labels, mode)

    def _create_sync(self, spec: SandboxSpec, labels: dict[str, str], mode: str) -> LocalSandbox:
        caps = self.capabilities
        self.root.mkdir(parents=True, exist_ok=True)
        if caps.root:
            os.chmod(self.root, 0o711)  # private uids must traverse it to reach their fs/
            _check_traversable(self.root)
        (self.root / ".uids").mkdir(mode=0o700, exist_ok=True)
        sid = "local-" + secrets.token_hex(8)
        d = self.root / sid
        d.mkdir(mode=0o711)
        meta = LocalMeta(
            id=sid, created_at=time.time(), labels=labels, image=spec.image, mode=mode,
            spec=spec.model_dump(mode="json"),
        )  # fmt: skip
        try:
            self._write_meta(d, meta)  # at each step, so a failure below leaves it removable
            if caps.root:
                meta.uid = self._claim_uid(sid)
                self._write_meta(d, meta)
            if caps.cgroups:
                cg = CgroupSet.create(
                    caps.cgroups, sid, memory_mb=spec.memory_mb, pids=spec.pids, cpu=spec.cpu
                )  # fmt: skip
                meta.cgroups = cg.paths
                self._write_meta(d, meta)
            fs = d / "fs"
            fs.mkdir(mode=0o711)
            if caps.tmpfs:
                self._write_meta(d, meta.model_copy(update={"mounted": True}))
                mount_tmpfs(str(fs), spec.disk_mb << 20)
                meta.mounted = True
            for sub in ("work", "tmp", "home"):
                p = fs / sub
                p.mkdir(mode=0o755)
                if meta.uid is not None:
                    os.chown(p, meta.uid, meta.uid)
            (d / "etc").mkdir(mode=0o755)
            (d / "etc" / "passwd").write_text(
                "root:x:0:0:root:/root:/bin/bash\n"
                f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{HOME}:/bin/bash\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            )
            (d / "etc" / "group").write_text(
                f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"
            )
            self._write_meta(d, meta)
        except BaseException as e:
            self._remove_sync(sid)
            if isinstance(e, OSError):
                raise SandboxCreateError(f"local sandbox setup failed: {e}") from e
            raise
        sb = LocalSandbox(self, spec, meta, d, caps)
        if sb.persistent:
            lifeline: Lifeline | None = None
            try:
                lifeline = sb._start_holder()
                if lifeline is not None:
                    self._lifelines[sid] = lifeline
                self._write_meta(d, meta)
            except BaseException:
                self._remove_sync(sid)
                if lifeline is not None:
                    lifeline.close()
                sb._reap_holder()
                raise
        return sb

    def _write_meta(self, d: Path, meta: LocalMeta) -> None:
        tmp = d / "meta.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(meta.model_dump_json())
        os.replace(tmp, d / "meta.json")

    def _claim_uid(self, sid: str) -> int:
        """A host uid no other live sandbox holds (lock files under <root>/.uids)."""
        for _ in range(1000):
            uid = self.uid_base + secrets.randbelow(self.uid_count)
            try:
                fd = os.open(self.root / ".uids" / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(sid)
            return uid
        raise SandboxCreateError("no free private uid for a local sandbox")

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await anyio.to_thread.run_sync(self._list_sync, dict(labels or {}))

    def _list_sync(self, want: dict[str, str]) -> builtins.list[SandboxInfo]:  # `list`: the method above
        out: builtins.list[SandboxInfo] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if not _ID.match(d.name) or not d.is_dir():
                continue
            meta = _read_meta(d)
            if meta is None:
                continue
            if any(meta.labels.get(k) != v for k, v in want.items()):
                continue
            out.append(
                SandboxInfo(
                    id=meta.id, provider=self.name, image=meta.image,
                    status="exited" if meta.init_pid and not _holder_alive(meta) else "running",
                    labels=meta.labels, created_at=meta.created_at,
                )  # fmt: skip
            )
        return out

    async def remove(self, sandbox_id: str) -> None:
        if not _ID.match(sandbox_id):
            raise SandboxError(f"invalid local sandbox id {sandbox_id!r}")
        await anyio.to_thread.run_sync(self._remove_sync, sandbox_id)

    def _remove_sync(self, sid: str) -> None:
        """Kill every process of the sandbox, drop its cgroups and tmpfs, delete it."""
        d = self.root / sid
        if not d.exists():
            return
        meta = _read_meta(d)
        cg = CgroupSet(meta.cgroups if meta else {})
        uid = meta.uid if meta else None
        if meta and meta.init_pid and process_start_time(meta.init_pid) == meta.init_start:
            # pid 1 of the sandbox's pid namespace: the kernel takes every process in it along.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(meta.init_pid, signal.SIGKILL)
        def members() -> set[int]:
            found = cg.procs() | pids_with_env(SANDBOX_ID_ENV, sid)
            return found | pids_of_uid(uid) if uid is not None else found

        kill_until_gone(members, 10.0)
        cg.destroy()
        fs = str(d / "fs")
        if (meta is None or meta.mounted) and is_mountpoint(fs):
            with contextlib.suppress(OSError):
                umount(fs)
        shutil.rmtree(d, ignore_errors=True)  # fd-based on Linux: safe against symlink games
        if uid is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / ".uids" / str(uid))
        lifeline = self._lifelines.pop(sid, None)
        if lifeline is not None:
            lifeline.close()

    async def aclose(self) -> None:
        return None


def _check_traversable(root: Path) -> None:
    """bwrap runs as the sandbox's unprivileged uid and must reach <root>/<id>/fs."""
    for p in [root, *root.parents]:
        if not os.stat(p).st_mode & 0o001:
            raise SandboxCreateError(
                f"local sandbox root {root} is not reachable by unprivileged uids: {p} lacks o+x; "
                "pick another root (SANDGYM_LOCAL_ROOT) or chmod o+x it"
            )


def _holder_alive(meta: LocalMeta) -> bool:
    pid = meta.init_pid
    if pid is None or process_start_time(pid) != meta.init_start:
        return False
    # A holder killed from inside (kill -9 -1), or ended at its TTL, lingers as a zombie
    # until its parent reaps it: its /proc entry stays, its namespaces are gone. While it is
    # still exiting it is not yet a zombie but its namespaces may already be gone (what
    # nsenter would enter), so those are checked too.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[-1].split()[:1] == [b"Z"]:
                return False
        os.readlink(f"/proc/{pid}/ns/ipc")
    except OSError:
        return False
    return True


def _read_meta(d: Path) -> LocalMeta | None:
    try:
        return LocalMeta.model_validate_json((d / "meta.json").read_text())
    except (OSError, ValueError):
        return None


class LocalSandbox(Sandbox):
    """One local sandbox. Paths: spec.workdir, /tmp and /home/sandbox (bwrap) map onto
    <dir>/fs/{work,tmp,home}; see fs.py for the rules."""

    provider = "local"

    def __init__(
        self, owner: LocalProvider, spec: SandboxSpec, meta: LocalMeta, path: Path, caps: LocalCapabilities
    ) -> None:
        self.id = meta.id
        self.spec = spec
        self.meta = meta
        self.path = path
        self.mode = meta.mode
        self._owner = owner
        self._closed = False
        self._cg = CgroupSet(meta.cgroups)
        fs = path / "fs"
        self.host_dirs = {"work": str(fs / "work"), "tmp": str(fs / "tmp"), "home": str(fs / "home")}
        wd = spec.workdir
        if self.mode == "bwrap":
            mounts = [(wd, self.host_dirs["work"])]
            if wd != "/tmp":
                mounts.append(("/tmp", self.host_dirs["tmp"]))
            if wd != HOME:
                mounts.append((HOME, self.host_dirs["home"]))
            self._home, self._tmp = HOME if wd != HOME else wd, "/tmp"
        else:
            mounts = [(wd, self.host_dirs["work"])] + [(h, h) for h in self.host_dirs.values()]
            self._home, self._tmp = self.host_dirs["home"], self.host_dirs["tmp"]
        self.mounts = mounts
        self._fs = SandboxFS(mounts, meta.uid, meta.uid)
        self._nproc_wrap: list[str] = []
        self._root_drop: list[str] = []
        self._holder: subprocess.Popen[bytes] | None = None
        self._running: set[int] = set()  # process groups of execs in flight, for close()
        self._launch, self._prefix = self._plan(caps)
        self.persistent = self.mode == "bwrap" and owner.persistent and caps.nsenter is not None
        self._nsenter = caps.nsenter

    def _plan(self, caps: LocalCapabilities) -> tuple[Launch, list[str]]:
        spec, uid = self.spec, self.meta.uid
        rl: list[tuple[int, int, int]] = [(resource.RLIMIT_CORE, 0, 0)]
        if not self.meta.mounted:  # a tmpfs of disk_mb bounds the total; else per file only
            fsize = spec.disk_mb << 20
            rl.append((resource.RLIMIT_FSIZE, fsize, fsize))
        if not self._cg.has_memory:
            mem = spec.memory_mb << 20
            rl.append((resource.RLIMIT_DATA, mem, mem))
        nproc_inside = False
        if uid is not None:  # a private uid: RLIMIT_NPROC counts exactly this sandbox
            rl.append((resource.RLIMIT_NPROC, spec.pids, spec.pids))
        elif self.mode == "bwrap" and caps.prlimit and not self._cg.has_pids:
            nproc_inside = True  # inside the user namespace it counts only the sandbox
        launch = Launch(tuple(self._cg.procs_files()), tuple(rl), uid, uid)
        if self.mode != "bwrap":
            return launch, []
        assert caps.bwrap is not None
        inner_uid = "0" if spec.user in ("root", "0") else str(SANDBOX_UID)
        p = [
            caps.bwrap, "--unshare-user", "--uid", inner_uid, "--gid", inner_uid,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        ]  # fmt: skip
        if not spec.network:
            p.append("--unshare-net")
        p += ["--hostname", "sandbox", "--new-session", *system_binds()]
        etc = self.path / "etc"
        p += ["--ro-bind", str(etc / "passwd"), "/etc/passwd", "--ro-bind", str(etc / "group"), "/etc/group"]
        p += ["--proc", "/proc", *dev_args(spec.disk_mb << 20 if caps.bwrap_size else None)]
        # Parents before children, so a workdir under /tmp lands inside the /tmp bind.
        for view, host in sorted(self.mounts, key=lambda m: m[0].count("/")):
            p += ["--bind", host, view]
        p += ["--dir", "/var", "--symlink", "../tmp", "/var/tmp", "--remount-ro", "/"]
        if nproc_inside and caps.prlimit is not None:
            self._nproc_wrap = [caps.prlimit, f"--nproc={spec.pids}:{spec.pids}", "--"]
        if spec.user in ("root", "0") and caps.setpriv:
            # Entering the user namespace (persistent mode) grants its root every capability
            # in it; bwrap drops them, so drop them too (an empty bounding set empties
            # root's capabilities at exec). A non-root uid loses them at exec anyway.
            self._root_drop = [caps.setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]
        return launch, p

    # ---- persistent namespace ---------------------------------------------------------

    def _start_holder(self) -> Lifeline | None:
        """Start the bwrap that holds the sandbox's namespaces (_HOLDER_SH under bwrap's
        reaping pid 1); learn its pid 1 from --info-fd and wait for the command's "ready"
        line, since bwrap reports the pid before the mounts are in place. Not
        --die-with-parent (that fires when the creating *thread* ends): the holder ends at
        the TTL or, for a `process`-owned sandbox, once the owner is gone (the returned
        lifeline's write end, which the caller keeps until it removes the sandbox)."""
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        grace = lifeline_grace_s(self.meta.labels)
        lifeline, life_r = Lifeline.pipe() if grace is not None else (None, -1)
        ttl = "infinity" if self.spec.ttl_s is None else str(math.ceil(self.spec.ttl_s))
        log_path = self.path / "holder.log"
        try:
            with open(log_path, "wb") as log_f:
                self._holder = subprocess.Popen(
                    [*self._prefix, "--info-fd", str(info_w), "--chdir", "/", "--",
                     "/bin/sh", "-c", _HOLDER_SH, "sandgym-holder",
                     "1" if life_r >= 0 else "", str(math.ceil(grace or 0)), ttl],
                    stdin=life_r if life_r >= 0 else subprocess.DEVNULL, stdout=ready_w, stderr=log_f,
                    env=self._env(None), cwd="/", pass_fds=(info_w,), start_new_session=True,
                    preexec_fn=self._launch.preexec(10**9),
                )  # fmt: skip
            os.close(info_w)
            os.close(ready_w)
            info_w = ready_w = -1
            info = read_until(info_r, None, 30.0)
            ready = read_until(ready_r, b"\n", 30.0)
        except BaseException:
            if lifeline is not None:
                lifeline.close()
            raise
        finally:
            for fd in (info_r, ready_r, info_w, ready_w, life_r):
                if fd >= 0:
                    os.close(fd)
        init_pid = bwrap_child_pid(info)
        if init_pid is None or ready != b"ready\n":
            err = ""
            with contextlib.suppress(OSError):
                err = log_path.read_text(errors="replace").strip()
            if lifeline is not None:
                lifeline.close()
            raise SandboxCreateError(f"bwrap did not start the sandbox: {err or 'no answer from bwrap'}")
        self.meta.init_pid = init_pid
        self.meta.init_start = process_start_time(init_pid)
        return lifeline

    def _reap_holder(self) -> None:
        if self._holder is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._holder.wait(timeout=5)

    def _init_alive(self) -> bool:
        return _holder_alive(self.meta)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        user = "root" if self.spec.user in ("root", "0") else "sandbox"
        base = {
            "PATH": PATH, "HOME": self._home, "USER": user, "LOGNAME": user,
            "LANG": "C.UTF-8", "SHELL": "/bin/bash", "TMPDIR": self._tmp,
            SANDBOX_ID_ENV: self.id,
        }  # fmt: skip
        return {**base, **self.spec.env, **(env or {})}

    def _host_path(self, view: str) -> str | None:
        """Plain mode: where a sandbox path is on the host (lexical; the process resolving
        it runs as the sandbox uid, so no safety walk is needed)."""
        for prefix, host in sorted(self.mounts, key=lambda m: len(m[0]), reverse=True):
            if view == prefix or view.startswith(prefix.rstrip("/") + "/"):
                return host + view[len(prefix) :]
        return None

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        self._raise_if_closed()
        argv = shell_argv(cmd)
        timeout = float(timeout if timeout is not None else self.spec.exec_timeout_s)
        where = posixpath.normpath(self.resolve(cwd)) if cwd else self.spec.workdir
        full_env = self._env(env)
        info_r = info_w = -1
        if self.persistent:
            if not self._init_alive():
                raise SandboxGoneError(f"sandbox {self.id}: its namespace holder has died")
            assert self._nsenter is not None and self.meta.init_pid is not None
            full_argv = [
                *nsenter_argv(self._nsenter, self.meta.init_pid, self.spec.network),
                "--", "/usr/bin/env", f"--chdir={where}", "--", *self._root_drop, *self._nproc_wrap, *argv,
            ]  # fmt: skip
            host_cwd = "/"
        elif self.mode == "bwrap":
            info_r, info_w = os.pipe()  # bwrap's pid 1, to wait for the namespace's end
            full_argv = [
                *self._prefix, "--die-with-parent", "--info-fd", str(info_w), "--chdir", where, "--",
                *self._nproc_wrap, *argv,
            ]  # fmt: skip
            host_cwd = "/"
        else:
            full_argv = argv
            host_cwd = self._host_path(where) or where
            full_env["PWD"] = host_cwd
            if not os.path.isdir(host_cwd):
                msg = f"cannot change directory to {where}: no such directory\n".encode()
                return ExecResult(exit_code=1, stderr_bytes=msg, output_limit=self.spec.output_limit_bytes)
        try:
            result = await run_process(
                full_argv,
                env=full_env,
                cwd=host_cwd,
                stdin=as_bytes(stdin) if stdin is not None else None,
                timeout=timeout,
                limit=self.spec.output_limit_bytes,
                launch=self._launch,
                cpu_limit_s=int(math.ceil(timeout * host_cpus())) + 5,
                oom_counter=self._cg.oom_kills if self._cg.has_memory else None,
                running=self._running,
                pass_fds=() if info_w < 0 else (info_w,),
            )
            if info_r >= 0:
                # Per-exec: the namespace ends with the command, its background jobs too,
                # before the result is returned.
                await namespace_ended(info_r, _NAMESPACE_END_S)
        finally:
            for fd in (info_r, info_w):
                if fd >= 0:
                    os.close(fd)
        if self._closed and not result.timed_out:
            raise SandboxGoneError(f"sandbox {self.id} was closed while the command ran")
        if self.persistent and result.exit_code != 0 and not self._init_alive():
            # The holder died between the check above and nsenter (or during the command):
            # nsenter's own "cannot open /proc/<pid>/ns/..." is not the command's failure.
            raise SandboxGoneError(f"sandbox {self.id}: its namespace holder has died")
        return result

    # ---- files -----------------------------------------------------------------------

    async def _fs_call(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except SandboxError:
            raise
        except OSError as e:  # ENOSPC, EACCES, ...: the sandbox's trouble, said as such
            raise SandboxError(f"{e.strerror or e} ({args[0]})") from e

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._raise_if_closed()
        await self._fs_call(self._fs.write_file, self.resolve(path), as_bytes(data), mode)

    async def read_file(self, path: str) -> bytes:
        self._raise_if_closed()
        return await self._fs_call(self._fs.read_file, self.resolve(path))

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        self._raise_if_closed()
        await self._fs_call(self._fs.put_archive, self.resolve(dest_dir), tar_bytes)

    async def get_archive(self, path: str) -> bytes:
        self._raise_if_closed()
        return await self._fs_call(self._fs.get_archive, self.resolve(path))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in list(self._running):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        await anyio.to_thread.run_sync(self._owner._remove_sync, self.id)
        await anyio.to_thread.run_sync(self._reap_holder)
