"""The `docker` provider: one hardened container per sandbox on the local Docker engine.

Two profiles (SandboxSpec.profile); every container has no network interface but
loopback, all capabilities dropped but a profile's few, no-new-privileges, memory = swap
limit, a CPU quota, and is removed once its main process ends (by the provider that made it
or, when that process is gone, by the next host reaper: sandboxes/ownership.py).

- strict (default, for scoring untrusted code): a non-root user (uid 1000 unless the spec
  names one), a read-only root, the workdir and /tmp on a per-sandbox ext4 disk of disk_mb
  (disk.py; ENOSPC at the quota, not charged to memory). Where loop disks cannot be made
  (not root, no sandgym runtimes) they are tmpfs of disk_mb each, charged to memory, and
  check() refuses a disk_mb the memory limit cannot hold. HOME is /tmp.
- vm (what Prime/E2B users expect): root by default with CHOWN, DAC_OVERRIDE, FOWNER,
  FSETID, SETUID, SETGID, KILL; a writable root whose writes land on the per-sandbox disk
  (an overlay the runtime wrapper mounts); /work and /app made for the user. It runs under
  gVisor (runtime `runsc`: runtime/), which enforces the process limit itself (RLIMIT_NPROC;
  the host pids cgroup only backstops it); without gVisor it is refused unless the operator
  opts out (allow_vm_without_gvisor / SANDGYM_ALLOW_VM_WITHOUT_GVISOR=1).

Egress (SandboxSpec.egress) goes through execd's relay, the host forwarder and one squid
per provider (sandgym/sandboxes/egress/): HTTP(S)_PROXY inside, the policy decided outside.
Images are pulled as image_pull says (pull.py), after the operator's aliases; sandgym's own
images are built instead when missing (images.py, `build_images`). Why a
container died comes from the engine's events (events.py).

Commands and files go through a `Transport` (transport.py). When the image has python3,
the container's main process is execd, the in-sandbox exec daemon (sandboxes/execd/daemon.py,
mounted read-only from this package), listening on a unix socket in a per-container host
directory (execd.py): a few ms per command instead of tens for `docker exec`. Images without
python3 (execd's start fails with "executable file not found") are remembered per image
id and get a `sh` that sleeps out the TTL as main process and `DockerExecTransport` (and no
egress). Either way the main process runs under the engine's init, so a driver that dies leaks
nothing past the TTL: the container goes, and the runtime wrapper deletes its disk. Sandboxes
owned by a process (ownership.py) end sooner: the owner holds a FIFO in the container's socket
directory open, and the main process (execd, or that `sh`) ends when it has no writer left.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any, TypeVar

import anyio
import docker
import docker.errors
import requests
from anyio import to_thread
from docker.types import DeviceRequest, Ulimit

from ...base import Command, ExecJob, Sandbox, as_bytes, live_argv, shell_argv
from ...egress.forwarder import EgressForwarder
from ...egress.proxy import EgressProxy, squid_binary
from ...errors import SandboxCreateError, SandboxError, SandboxGoneError, SpecError
from ...execd import CONTAINER_SOCKET_DIR, EGRESS_PORT, EGRESS_SOCKET_NAME, LIFELINE_NAME, BatchJob, execd_command
from ...execd.client import ExecdRequestError
from ...execd.live import ExecdLiveProcess
from ...live import LiveHandle, LiveProcess
from ...ownership import Lifeline, lifeline_grace_s, stamp_owner
from ...result import EgressLogEntry, ExecResult, SandboxInfo
from ...spec import LABEL_OWNER, EgressPolicy, SandboxSpec
from .disk import RESERVE_MB, LoopDisks
from .events import ExitWatcher
from .exec import KILLED_EXIT, DockerExecTransport
from .execd import DockerExecdTransport, SocketDirs, execd_volumes
from .images import build_missing
from .pull import Puller, PullProgress
from .runtime import (
    GVISOR,
    PRELOAD_FILE,
    RUNC_SANDGYM,
    SHIM_IN_SANDBOX,
    SHIM_SO,
    WANTED_VERSION,
    RuntimeStatus,
)
from .runtime import status as runtime_status
from .transport import Transport

log = logging.getLogger(__name__)

T = TypeVar("T")

SANDBOX_UID = 1000  # the images' non-root `sandbox` user
DEFAULT_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
DEFAULT_OWNER = "sandgym"
# /etc/hosts for every sandbox (what Docker writes for network "none"): see network_disabled.
HOSTS_FILE = Path(__file__).resolve().parent / "hosts"
_MIB = 1 << 20
_REMOVAL_WAIT_S = 30.0  # a removal another process has under way: how long to wait for its end
# Where the container sees its own memory cgroup counters (v1, then v2).
_OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
# The same counters seen from the engine host (cgroupfs / systemd drivers, v1 / v2), for a
# driver on that host: readable even when the box is so full that no process can start.
_HOST_OOM_FILES = (
    "/sys/fs/cgroup/memory/docker/{id}/memory.oom_control",
    "/sys/fs/cgroup/memory/system.slice/docker-{id}.scope/memory.oom_control",
    "/sys/fs/cgroup/docker/{id}/memory.events",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.events",
)
_OOM_KILL = re.compile(rb"^oom_kill (\d+)$", re.M)
LABEL_TRANSPORT = "sandgym.transport"
LABEL_SOCKET_DIR = "sandgym.socket_dir"
LABEL_PROFILE = "sandgym.profile"
LABEL_RUNTIME = "sandgym.runtime"
EXECD_READY_TIMEOUT_S = 60.0
# Root in a vm sandbox may own files, change modes and users, and signal its processes; it
# may not load modules, mount, trace, change the clock, or use raw sockets.
VM_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL")
GVISOR_MIN_MEMORY_MB = 64
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_IN_SANDBOX = "/run/sandgym-ca.crt"
# Main process without execd: ends at the TTL ($3), or $2 seconds after the owner's
# lifeline FIFO ($1) has no writer left. Runs as PID 1 when the engine has no init, hence
# the trap (PID 1 ignores signals it has no handler for).
_WATCH_SH = r"""trap 'exit 0' TERM
(sleep "$3"; kill -TERM $$) &
(while read -r _; do :; done <"$1" && sleep "$2" && kill -TERM $$) 2>/dev/null &
wait"""


class _NoExecd(Exception):
    """The image cannot run execd (no python3): use docker exec for it."""


@dataclass(frozen=True)
class Plan:
    """How a spec becomes a container on this engine (decided in `check`)."""

    image: str  # what the engine runs: the spec's image after aliases
    runtime: str | None  # None: the engine's default (runc); "runsc"; "runc-sandgym"
    gvisor: bool
    disk: str  # "loop" (a per-sandbox ext4) or "tmpfs"
    writable_root: bool  # profile vm
    user: str
    uid: int
    gid: int


@dataclass
class _Box:
    """Host-side resources of one container, released by `remove`."""

    name: str
    plan: Plan | None  # None: a container found only to be removed (not made by this object)
    sock_dir: Path | None = None  # execd's socket and/or the owner's lifeline FIFO
    execd: bool = False  # the main process is execd (its socket in sock_dir)
    lifeline: Lifeline | None = None  # our end of the owner's lifeline, held until removal
    disk: bool = False
    egress_src: str | None = None
    created_at: float = field(default_factory=time.time)


class DockerSandbox(Sandbox):
    """A running container. Policy lives here; bytes move through `transport`."""

    provider = "docker"

    def __init__(
        self,
        owner: DockerProvider,
        container_id: str,
        spec: SandboxSpec,
        transport: Transport,
        box: _Box | None = None,
    ) -> None:
        self.id = container_id
        self.spec = spec
        self.transport = transport
        self.box = box
        self._owner = owner
        self._closed = False
        self._oom_seen = 0  # the container's oom_kill counter when we last looked
        self._oom_lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, image={self.spec.image!r})"

    async def _gone(self, exc: SandboxGoneError) -> SandboxGoneError:
        """Fill in why the container went away (the engine's events), when known."""
        if exc.reason is None and not self._closed:
            info = await self._owner.inspect(self.id, wait_s=2.0)
            if info is not None and info.status != "running":
                exc.reason = info.error_type or "LOST"
                if info.error_message:
                    exc.args = (f"{exc.args[0] if exc.args else exc} ({info.error_type}: {info.error_message})",)
        return exc

    async def set_egress(self, policy: EgressPolicy | None) -> None:
        """New connections follow `policy` at once (None: nowhere). Only for sandboxes
        created with an egress policy (`EgressPolicy.nothing()` to start closed)."""
        self._raise_if_closed()
        await self._owner._set_egress(self, policy)

    async def egress_log(self) -> list[EgressLogEntry]:
        if self.box is None or self.box.egress_src is None:
            return []
        return await self._owner._egress_log(self)

    async def info(self) -> SandboxInfo:
        if self._closed:
            return SandboxInfo(id=self.id, provider=self.provider, image=self.spec.image, status="gone",
                               error_message="closed by its owner")
        got = await self._owner.inspect(self.id)
        if got is None:
            return SandboxInfo(id=self.id, provider=self.provider, image=self.spec.image, status="gone",
                               error_type="LOST", error_message="the engine does not know it")
        return got

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
        try:
            res = await self.transport.exec(
                shell_argv(cmd),
                timeout=timeout if timeout is not None else self.spec.exec_timeout_s,
                limit=self.spec.output_limit_bytes,
                env=env,
                cwd=self.resolve(cwd) if cwd else None,
                stdin=as_bytes(stdin) if stdin is not None else None,
            )
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None
        return await self._attribute_oom(res)

    async def exec_python(
        self,
        source: bytes | str,
        *,
        cpu_limit_s: int | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """With execd: forked from its warm interpreter (execd/warm_python.py)."""
        self._raise_if_closed()
        if not isinstance(self.transport, DockerExecdTransport):
            return await super().exec_python(source, cpu_limit_s=cpu_limit_s, timeout=timeout, env=env, cwd=cwd)
        try:
            res = await self.transport.exec_python(
                as_bytes(source),
                cpu_limit_s=cpu_limit_s,
                timeout=timeout if timeout is not None else self.spec.exec_timeout_s,
                limit=self.spec.output_limit_bytes,
                env=env,
                cwd=self.resolve(cwd) if cwd else None,
            )
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None
        return await self._attribute_oom(res)

    async def _attribute_oom(self, res: ExecResult) -> ExecResult:
        # A SIGKILL exit is either us, someone's kill -9, or the memory cgroup's OOM killer;
        # only the cgroup's counter tells them apart, so look only then (no cost otherwise).
        # (execd reports its own per-command verdict; the counter keeps ours in step.)
        if res.exit_code == KILLED_EXIT and not res.timed_out:
            fresh = await self._new_oom_kill()
            if fresh and not res.oom_killed:
                res = res.model_copy(update={"oom_killed": True})
        return res

    async def exec_many(
        self, jobs: Sequence[ExecJob], *, parallel: int | None = None
    ) -> list[ExecResult]:
        """With execd: all jobs in one round trip, run inside the sandbox on up to
        `parallel` (default: its CPU quota) at once. Otherwise concurrent execs."""
        self._raise_if_closed()
        if not isinstance(self.transport, DockerExecdTransport):
            return await super().exec_many(jobs, parallel=parallel)
        limit = self.spec.output_limit_bytes
        batch = [
            BatchJob(
                argv=shell_argv(j.cmd),
                timeout=j.timeout if j.timeout is not None else self.spec.exec_timeout_s,
                stdin=as_bytes(j.stdin) if j.stdin is not None else None,
                env=j.env,
                cwd=self.resolve(j.cwd) if j.cwd else None,
                output_limit=limit,
            )
            for j in jobs
        ]
        if not batch:
            return []
        try:
            results = await self.transport.batch_exec(batch, parallel=parallel)
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None
        if any(r.exit_code == KILLED_EXIT and not r.timed_out for r in results):
            await self._new_oom_kill()  # per-job verdicts are execd's; keep the counter current
        return results

    async def start_live(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        """A live process (sandboxes/live.py): execd runs it on a connection of its own
        (execd/live.py: as fast as an exec); a sandbox without execd, or whose execd predates
        live processes (adopted across an upgrade), gets the exec-built one."""
        self._raise_if_closed()
        where = self.resolve(cwd) if cwd else None
        try:
            if isinstance(self.transport, DockerExecdTransport):
                proc = ExecdLiveProcess(self.transport.client, live_argv(argv))
                try:
                    await proc.start(env, where)
                    return proc
                except ExecdRequestError as exc:
                    if exc.code != "bad_request" or "unknown op" not in str(exc):
                        raise
            return await super().start_live(argv, env=env, cwd=cwd)
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None

    async def attach_live(self, handle: LiveHandle, argv: Sequence[str]) -> LiveProcess:
        self._raise_if_closed()
        if handle.kind != ExecdLiveProcess.KIND:
            return await super().attach_live(handle, argv)
        if not isinstance(self.transport, DockerExecdTransport):
            raise RuntimeError(f"live process {handle.pid} ran under execd, and sandbox {self.id[:12]} has none")
        try:
            proc = ExecdLiveProcess(self.transport.client, live_argv(argv), handle)
            await proc.attach()
            return proc
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None

    async def reset(self) -> bool:
        """execd sandboxes only: kill every process but init and execd, empty the
        workdir, /tmp and /dev/shm. False when it could not (then destroy, do not reuse)."""
        if self._closed or not isinstance(self.transport, DockerExecdTransport):
            return False
        if self.box is not None and self.box.plan is not None and self.box.plan.writable_root:
            return False  # a writable root cannot be made like new: never hand it to another user
        try:
            res = await self.transport.reset(self.spec.workdir)
        except SandboxError as exc:
            log.warning("reset of %s failed: %r", self.id[:12], exc)
            return False
        if not res.ok:
            log.warning("reset of %s failed (%s): %s", self.id[:12], res.exit_code, res.stderr.strip())
        return res.ok

    def _host_oom_counters(self) -> bytes:
        for template in _HOST_OOM_FILES:
            try:
                with open(template.format(id=self.id), "rb") as f:
                    return f.read()
            except OSError:
                continue
        return b""

    async def _new_oom_kill(self) -> bool:
        async with self._oom_lock:
            text = self._host_oom_counters()  # a sysfs read: no exec, cannot block
            if not text:
                probe = await self.transport.exec(
                    ["cat", *_OOM_FILES], timeout=10, limit=4096, env=None, cwd="/", stdin=None
                )
                text = probe.stdout_bytes
            counts = [int(n) for n in _OOM_KILL.findall(text)]
            if not counts:
                return False
            now = max(counts)
            fresh = now > self._oom_seen
            self._oom_seen = now
            return fresh

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._raise_if_closed()
        try:
            await self.transport.write_file(self.resolve(path), as_bytes(data), mode)
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None

    async def read_file(self, path: str) -> bytes:
        self._raise_if_closed()
        try:
            return await self.transport.read_file(self.resolve(path))
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        self._raise_if_closed()
        try:
            await self.transport.put_archive(self.resolve(dest_dir), tar_bytes)
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None

    async def get_archive(self, path: str) -> bytes:
        self._raise_if_closed()
        try:
            return await self.transport.get_archive(self.resolve(path))
        except SandboxGoneError as exc:
            raise await self._gone(exc) from None

    async def detach(self) -> None:
        """Close our connection and leave the container running (`DockerProvider.adopt`)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self.transport.aclose()
            await self._owner._run(self._owner._forget_blocking, self.id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):  # a cancelled caller must not leak the container
            try:
                await self.transport.aclose()
            finally:
                await self._owner.remove(self.id)


class DockerProvider:
    """Sandboxes as containers on the local Docker engine (`docker.from_env()`)."""

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        max_concurrency: int = 64,
        timeout_s: float = 120.0,
        execd: bool = True,
        socket_root: str | os.PathLike[str] | None = None,
        image_aliases: Mapping[str, str] | None = None,
        allow_vm_without_gvisor: bool | None = None,
        egress_host_ports: Sequence[int] = (),
        ca_bundle: str | None = "auto",
        pull_progress: Callable[[PullProgress], None] | None = None,
        state_root: str | os.PathLike[str] | None = None,
        disk: str = "auto",
        runtime: str = "auto",
        build_images: bool = True,
    ) -> None:
        """`execd=False` always uses `docker exec` (main process `sleep`); `socket_root` is
        where per-container execd socket directories go (default /run/sandgym-sockets as
        root, else a folder in the temp dir).

        `image_aliases`: image names mapped to other (local) images before any lookup or
        pull, e.g. {"python:3.11-slim": "sandgym/python:latest"}.
        `allow_vm_without_gvisor`: run `profile="vm"` (root, writable root) under plain runc
        when gVisor is missing -- weaker isolation, logged loudly; None reads
        SANDGYM_ALLOW_VM_WITHOUT_GVISOR=1.
        `egress_host_ports`: the engine host's loopback ports sandboxes may reach as
        host.sandgym.internal:PORT when their egress policy names that host.
        `ca_bundle`: a CA bundle mounted read-only into sandboxes with egress (SSL_CERT_FILE,
        PIP_CERT, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE point at it); "auto" = the host's
        /etc/ssl/certs/ca-certificates.crt when present; None = none.
        `pull_progress`: called with each pull progress event (default: log lines).
        `state_root`: where the egress proxy keeps its state (default /var/lib/sandgym as
        root, else a folder in the temp dir). Per-sandbox disks always live under
        /var/lib/sandgym/sandboxes, where the runtime wrapper looks.
        `disk`: "auto" (a per-sandbox ext4 file system where we are root and the engine has
        the sandgym runtimes, else tmpfs), "loop" (required) or "tmpfs" (strict only).
        `runtime`: "auto" (strict: runc, vm: gVisor), "runsc" (gVisor for both profiles) or
        "runc" (no gVisor; vm then needs `allow_vm_without_gvisor`).
        `build_images`: sandgym's own images (sandgym/base, sandgym/python[:X.Y], sandgym/bfcl,
        sandgym/math) are built here when a sandbox first needs them (image_pull='missing'),
        with each build step logged; False: they are pulled like any other image.
        """
        if disk not in ("auto", "loop", "tmpfs"):
            raise ValueError(f"disk={disk!r}; allowed: auto, loop, tmpfs")
        if runtime not in ("auto", "runsc", "runc"):
            raise ValueError(f"runtime={runtime!r}; allowed: auto, runsc, runc")
        self.use_execd = execd
        self.sockets = SocketDirs(socket_root)
        self.disks = LoopDisks()
        self.image_aliases = dict(image_aliases or {})
        if allow_vm_without_gvisor is None:
            allow_vm_without_gvisor = os.environ.get("SANDGYM_ALLOW_VM_WITHOUT_GVISOR", "") == "1"
        self.allow_vm_without_gvisor = allow_vm_without_gvisor
        self.egress_host_ports = tuple(int(p) for p in egress_host_ports)
        for p in self.egress_host_ports:
            if not 1 <= p <= 65535:
                raise ValueError(f"egress_host_ports: {p} is not a port; allowed range: [1, 65535]")
        if ca_bundle == "auto":
            ca_bundle = HOST_CA_BUNDLE if Path(HOST_CA_BUNDLE).is_file() else None
        self.ca_bundle = ca_bundle
        self.state_root = Path(state_root) if state_root is not None else default_state_root()
        self.disk = disk
        self.runtime = runtime
        # image id -> False once the image turned out unable to run execd
        self._execd_images: dict[str, bool] = {}
        self._image_ids: dict[str, str] = {}
        self._boxes: dict[str, _Box] = {}  # container id -> its host-side resources
        self._client = client
        self._own_client = client is None
        self._client_lock = threading.Lock()
        self._max_concurrency = max_concurrency
        self._timeout_s = timeout_s
        self._info: dict[str, Any] | None = None
        self._rt: RuntimeStatus | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self.puller = Puller(lambda: self.api, pull_progress,
                             build=(lambda image: build_missing(image, self.client)) if build_images else None)
        self._watcher = ExitWatcher(self._events_client, self._ended)
        self._egress_lock = threading.Lock()
        self._proxy: EgressProxy | None = None
        self._forwarder: EgressForwarder | None = None
        self._warned_vm = False

    # -- plumbing -----------------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        with self._client_lock:
            if self._client is None:
                try:
                    # One pooled connection per concurrent worker thread, no discards.
                    self._client = docker.from_env(
                        timeout=int(self._timeout_s), max_pool_size=self._max_concurrency
                    )
                except docker.errors.DockerException as e:
                    raise SandboxCreateError(f"Docker engine unreachable: {e}") from e
            return self._client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    def _events_client(self) -> docker.APIClient:
        # Its own client when we made ours (the event stream holds a connection for good);
        # a client given to us is shared (we cannot copy its settings).
        if self._own_client:
            return docker.from_env(timeout=int(self._timeout_s)).api
        return self.api

    def _engine_info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self.api.info()
        return self._info

    def runtimes(self) -> RuntimeStatus:
        """gVisor and the sandgym runtimes on this engine (cached)."""
        if self._rt is None:
            self._rt = runtime_status(self._engine_info())
        return self._rt

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # Our own limiter: long execs must not starve anyio's default thread pool (40).
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._max_concurrency)
        return await to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- Provider -----------------------------------------------------------------------

    def resolve_image(self, image: str) -> str:
        """The image the engine runs for `image` (after the operator's aliases)."""
        return self.image_aliases.get(image, image)

    def check(self, spec: SandboxSpec) -> None:
        """Refuse, naming the field and the allowed range, what this engine cannot honour.
        A missing image is fine unless image_pull='never' (it is pulled at create). An
        engine that does not answer (restarting, down) is SandboxCreateError."""
        try:
            self._check(spec)
        except requests.exceptions.RequestException as exc:
            raise SandboxCreateError(f"the Docker engine does not answer: {exc}") from exc

    def _check(self, spec: SandboxSpec) -> None:
        image = self.resolve_image(spec.image)
        found = self.puller.present(image) if spec.image_pull != "never" else self.puller.ensure(image, "never", spec.image)
        if found is not None:
            self._image_ids[image] = found
        info = self._engine_info()
        host_mb = int(info.get("MemTotal", 0)) // _MIB
        if host_mb and spec.memory_mb > host_mb:
            raise SpecError(
                f"memory_mb={spec.memory_mb} is more than the engine host has; "
                f"allowed range: [16, {host_mb}]"
            )
        ncpu = int(info.get("NCPU", 0))
        if ncpu and spec.cpu > ncpu:
            raise SpecError(
                f"cpu={spec.cpu} is more than the engine host has; allowed range: (0, {ncpu}]"
            )
        if spec.gpus > 0 and not self._has_gpu_runtime(info):
            raise SpecError(
                f"gpus={spec.gpus} but the Docker engine has no GPU runtime "
                "(nvidia-container-toolkit); allowed range here: [0, 0]"
            )
        plan = self.plan(spec)
        if plan.gvisor and spec.memory_mb < GVISOR_MIN_MEMORY_MB:
            raise SpecError(
                f"memory_mb={spec.memory_mb} is too little for a gVisor sandbox (its kernel needs "
                f"some); allowed range: [{GVISOR_MIN_MEMORY_MB}, {host_mb or 1024 * 1024}]"
            )
        if plan.disk == "loop":
            cap = self.disks.capacity_mb()
            if spec.disk_mb > cap:
                raise SpecError(
                    f"disk_mb={spec.disk_mb} is more than this host can still promise "
                    f"(free space less other sandboxes' quotas and a {RESERVE_MB} MiB reserve); "
                    f"allowed range: [1, {cap}]"
                )
        elif 2 * spec.disk_mb > spec.memory_mb:
            raise SpecError(
                f"disk_mb={spec.disk_mb}: without per-sandbox disks here ({self._loop_unavailable()}) "
                f"the workdir and /tmp are tmpfs of disk_mb each, charged to memory_mb={spec.memory_mb}; "
                f"allowed range: [1, {spec.memory_mb // 2}]"
            )
        if spec.egress is not None:
            if squid_binary() is None:
                raise SpecError("egress: needs squid on the engine host (apt-get install squid); it is not installed")
            if not self.use_execd or self._execd_images.get(self._image_ids.get(image, image)) is False:
                raise SpecError(
                    f"egress: image {spec.image!r} cannot run execd (no python3), whose relay carries "
                    "egress; use an image with python3 or egress=None"
                )

    def _loop_unavailable(self) -> str | None:
        why = self.disks.unavailable()
        if why is None and not self.runtimes().runc_sandgym:
            why = ("the engine lacks the sandgym runtimes (run scripts/bootstrap.sh, or "
                   "`python3 -m sandgym.sandboxes.providers.docker.runtime install`)")
        return why

    def plan(self, spec: SandboxSpec) -> Plan:
        """Runtime, disk and user for `spec` here; SpecError when it cannot be honoured."""
        rt = self.runtimes()
        image = self.resolve_image(spec.image)
        loop_why = self._loop_unavailable()
        vm = spec.profile == "vm"
        runtime: str | None
        if vm:
            default_user = "0:0"
            if self.runtime != "runc" and rt.gvisor:
                runtime, gvisor = GVISOR, True
            elif self.allow_vm_without_gvisor and rt.runc_sandgym:
                runtime, gvisor = RUNC_SANDGYM, False
                if not self._warned_vm:
                    self._warned_vm = True
                    log.warning(
                        "SANDGYM_ALLOW_VM_WITHOUT_GVISOR: profile='vm' sandboxes run as ROOT with a "
                        "writable root under plain runc, WITHOUT gVisor: a kernel bug is a host escape"
                    )
            else:
                why = "runtime=runc was chosen" if self.runtime == "runc" else (
                    "this engine has no gVisor runtime" if not rt.gvisor else "")
                raise SpecError(
                    f"profile='vm' runs root with a writable root file system and needs gVisor "
                    f"(runtime runsc): {why or 'unavailable'} ({_rt_detail(rt)}). Run scripts/bootstrap.sh, or "
                    "accept weaker isolation explicitly: SANDGYM_ALLOW_VM_WITHOUT_GVISOR=1"
                )
            if loop_why is not None:
                raise SpecError(f"profile='vm' needs a per-sandbox disk for its writable root: {loop_why}")
            disk = "loop"
        else:
            default_user = DEFAULT_USER
            if self.disk == "loop" and loop_why is not None:
                raise SpecError(f"disk_mb: per-sandbox disks were required (disk='loop') but {loop_why}")
            disk = "loop" if self.disk != "tmpfs" and loop_why is None else "tmpfs"
            if self.runtime == "runsc":
                if not rt.gvisor:
                    raise SpecError(f"runtime='runsc' was asked for but gVisor is unavailable ({_rt_detail(rt)})")
                runtime, gvisor = GVISOR, True
            else:
                # runc-sandgym: its wrapper deletes the disk when the container ends, even
                # if we are gone by then.
                runtime, gvisor = (RUNC_SANDGYM if disk == "loop" else None), False
        user = spec.user or default_user
        uid, gid = _owner_ids(user, vm)
        return Plan(image=image, runtime=runtime, gvisor=gvisor, disk=disk, writable_root=vm,
                    user=user, uid=uid, gid=gid)

    @staticmethod
    def _has_gpu_runtime(info: Mapping[str, Any]) -> bool:
        runtimes = info.get("Runtimes") or {}
        return (
            "nvidia" in runtimes
            or info.get("DefaultRuntime") == "nvidia"
            or bool(info.get("CDISpecDirs"))
            or shutil.which("nvidia-container-runtime-hook") is not None
        )

    def container_config(
        self,
        spec: SandboxSpec,
        labels: Mapping[str, str],
        socket_dir: str | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        plan: Plan | None = None,
        execd: bool = True,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(create_container kwargs, host_config kwargs) for `spec`: the hardened defaults.
        With `socket_dir` the main process is execd, its socket in that host folder (with
        `execd=False`: a `sh`, the folder holding only the owner's lifeline)."""
        plan = plan or self.plan(spec)
        all_labels = {**spec.labels, **{k: str(v) for k, v in labels.items()}}
        all_labels.setdefault(LABEL_OWNER, DEFAULT_OWNER)
        all_labels = stamp_owner(all_labels)  # pid, host, ...: what the reaper judges by
        execd = execd and socket_dir is not None
        all_labels[LABEL_TRANSPORT] = "execd" if execd else "docker-exec"
        all_labels[LABEL_PROFILE] = spec.profile
        all_labels[LABEL_RUNTIME] = plan.runtime or "runc"
        if socket_dir:
            all_labels[LABEL_SOCKET_DIR] = str(socket_dir)
        grace = lifeline_grace_s(all_labels) if socket_dir else None
        fifo = f"{CONTAINER_SOCKET_DIR}/{LIFELINE_NAME}"
        ttl = "infinity" if spec.ttl_s is None else str(math.ceil(spec.ttl_s))
        egress = spec.egress is not None and execd
        host: dict[str, Any] = dict(
            # No auto_remove: Docker before 24.0.8 removes --rm containers when it restarts,
            # live-restore or not (moby/moby#46308). The provider's event watcher removes its
            # containers when they end; the host reaper, those of a dead owner.
            network_mode="none",  # egress, when allowed, goes through execd's relay
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=spec.memory_mb * _MIB,
            memswap_limit=spec.memory_mb * _MIB,  # equal: no swap beyond memory
            nano_cpus=int(spec.cpu * 1e9),
            read_only=not plan.writable_root,
            # execd is its own init (it starts its serving half again when that is killed);
            # docker-init stands in for `sh` and `sleep`, reaping their orphans.
            init=None if execd else (bool(self._engine_info().get("InitBinary")) or None),
        )
        if plan.runtime:
            host["runtime"] = plan.runtime
        if plan.gvisor:
            # The host pids cgroup counts gVisor's own threads and never shrinks; at its limit
            # the whole sandbox dies. gVisor enforces RLIMIT_NPROC per uid inside instead.
            host["pids_limit"] = max(4096, 8 * spec.pids + 256)
            host["ulimits"] = [Ulimit(name="nproc", soft=spec.pids, hard=spec.pids)]
        else:
            host["pids_limit"] = spec.pids
        if plan.writable_root:
            host["cap_add"] = list(VM_CAPS)
        binds: dict[str, dict[str, str]] = {}
        if not plan.writable_root:  # a writable root gets its own copy (_seed_root)
            binds[str(HOSTS_FILE)] = {"bind": "/etc/hosts", "mode": "ro"}
        if plan.disk == "loop":
            assert name is not None, "a loop disk needs the sandbox's name"
            d = self.disks.path(name) / "disk"
            binds[str(d / "tmp")] = {"bind": "/tmp", "mode": "rw"}
            if not plan.writable_root:
                binds[str(d / "w")] = {"bind": spec.workdir, "mode": "rw"}
        else:
            # Docker mounts tmpfs noexec by default; a code sandbox must run what it builds.
            size = f"{spec.disk_mb}m"
            host["tmpfs"] = {
                spec.workdir: f"size={size},uid={plan.uid},gid={plan.gid},mode=0755,exec",
                "/tmp": f"size={size},mode=1777,exec",
            }
        if spec.gpus:
            host["device_requests"] = [DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
        if plan.gvisor and self.runtimes().shim:
            binds[str(SHIM_SO)] = {"bind": SHIM_IN_SANDBOX, "mode": "ro"}
            binds[str(PRELOAD_FILE)] = {"bind": "/etc/ld.so.preload", "mode": "ro"}
        if plan.writable_root:
            # root's home, whatever HOME the image sets for its own user; others keep the image's.
            env: dict[str, str] = {"HOME": "/root"} if plan.uid == 0 else {}
        else:
            env = {"HOME": "/tmp"}
        if egress:
            env.update(proxy_env())
            if self.ca_bundle:
                binds[str(self.ca_bundle)] = {"bind": CA_IN_SANDBOX, "mode": "ro"}
                env.update(ca_env())
        if execd and socket_dir is not None:
            binds.update(execd_volumes(socket_dir))  # socket dir rw, execd's code ro
            # execd ends itself after ttl_s (or once its owner is gone), and the container with it.
            main = execd_command(
                spec.ttl_s,
                egress=egress,
                owner_fifo=fifo if grace is not None else None,
                owner_grace_s=grace or 0.0,
            )
        elif grace is not None:
            binds[str(socket_dir)] = {"bind": CONTAINER_SOCKET_DIR, "mode": "ro"}
            main = ["/bin/sh", "-c", _WATCH_SH, "sandgym-main", fifo, str(math.ceil(grace)), ttl]
        else:
            main = ["sleep", ttl]  # lives ttl_s
        if binds:
            host["binds"] = binds
        create: dict[str, Any] = dict(
            image=plan.image,
            entrypoint=main[:1],
            command=main[1:],
            user=plan.user,
            # strict: the image's home is on the read-only root; git config, pip caches need one.
            environment={**env, **spec.env},
            working_dir=spec.workdir,
            labels=all_labels,
            detach=True,
            # No network at all (network_mode "none" alone still has the engine set up an
            # empty network namespace through two re-executions of dockerd per container,
            # ~60 ms of CPU each, half of a create's cost): the runtime gives the container a
            # namespace of its own with only loopback all the same. Docker then writes no
            # /etc/hosts, so `localhost` resolves through HOSTS_FILE.
            network_disabled=True,
        )
        if name:
            create["hostname"] = name  # the runtime wrapper finds the sandbox's disk by it
        return create, host

    def wants_execd(self, spec: SandboxSpec) -> bool:
        """Whether a new sandbox of `spec` gets execd (not known to lack python3)."""
        image = self.resolve_image(spec.image)
        image_id = self._image_ids.get(image, image)
        return self.use_execd and self._execd_images.get(image_id, True)

    def _create_blocking(self, spec: SandboxSpec, labels: Mapping[str, str], execd: bool) -> tuple[str, _Box]:
        image = self.resolve_image(spec.image)
        self._image_ids[image] = self.puller.ensure(image, spec.image_pull, spec.image)
        self.check(spec)
        plan = self.plan(spec)
        if not (execd and self.wants_execd(spec)):
            if spec.egress is not None:
                raise SpecError(f"egress: image {spec.image!r} cannot run execd (no python3); use egress=None")
            return self._create_start(spec, labels, plan, execd=False)
        try:
            return self._create_start(spec, labels, plan, execd=True)
        except _NoExecd as e:
            image_id = self._image_ids.get(image, image)
            log.info("image %s cannot run execd (%s); using docker exec for it", spec.image, e)
            self._execd_images[image_id] = False
            if spec.egress is not None:
                raise SandboxCreateError(
                    f"egress: image {spec.image!r} cannot run execd (no python3 in it), whose relay "
                    "carries egress; use an image with python3 or egress=None"
                ) from None
            return self._create_start(spec, labels, plan, execd=False)

    def _create_start(self, spec: SandboxSpec, labels: Mapping[str, str], plan: Plan, *, execd: bool) -> tuple[str, _Box]:
        """Make the host-side resources, then create and start the container; on any
        failure undo all of it (nothing half-made is left behind)."""
        name = self.sockets.new_name()
        box = _Box(name=name, plan=plan, execd=execd)
        want_lifeline = lifeline_grace_s(stamp_owner(labels)) is not None
        cid: str | None = None
        try:
            if execd or want_lifeline:
                box.sock_dir = self.sockets.make(name, plan.uid, plan.gid)
                if want_lifeline:  # before the container starts, so its watcher finds a writer
                    box.lifeline = Lifeline.fifo(box.sock_dir / LIFELINE_NAME)
                if not execd:
                    self.sockets.seal(box.sock_dir)  # nothing in the box writes there
            if plan.disk == "loop":
                self.disks.make(name, spec.disk_mb, writable_root=plan.writable_root, uid=plan.uid, gid=plan.gid)
                box.disk = True
                if plan.writable_root:
                    self._seed_root(name, spec, plan)
            if spec.egress is not None and execd and box.sock_dir is not None:
                proxy, fwd = self._egress()
                box.egress_src = proxy.lease(name, spec.egress)
                fwd.listen(box.sock_dir / EGRESS_SOCKET_NAME, box.egress_src)
            create, host = self.container_config(spec, labels, box.sock_dir, name=name, plan=plan, execd=execd)
            try:
                cid = self.api.create_container(
                    host_config=self.api.create_host_config(**host), name=name, **create
                )["Id"]
            except docker.errors.APIError as e:
                raise SandboxCreateError(f"docker create failed: {e.explanation or e}") from e
            self._watcher.expect(cid, spec.ttl_s)
            try:
                self.api.start(cid)
            except docker.errors.APIError as e:
                text = str(e.explanation or e)
                if execd and (
                    "executable file not found" in text or "no such file or directory" in text
                ):
                    raise _NoExecd(text) from e
                raise SandboxCreateError(f"docker start failed: {text}") from e
            if plan.writable_root and not os.path.ismount(self.disks.path(name) / "root"):
                raise SandboxCreateError(
                    f"the runtime wrapper did not mount the writable root of {name}: is "
                    f"{plan.runtime!r} the current sandgym wrapper? ({_rt_detail(self.runtimes())})"
                )
        except BaseException:
            if cid is not None:
                self._watcher.removing(cid)
                try:
                    self._remove_container(cid)
                except Exception as exc:
                    log.warning("removing half-made container %s failed: %r", cid[:12], exc)
            self._release(box)
            raise
        self._boxes[cid] = box
        return cid, box

    def _seed_root(self, name: str, spec: SandboxSpec, plan: Plan) -> None:
        """/work, /app and the workdir, owned by the sandbox's user, and /etc/hosts on the writable root.
        Top-level ones are made in the overlay's upper layer (no parent to shadow)."""
        upper = self.disks.path(name) / "disk" / "upper"
        (upper / "etc").mkdir(mode=0o755, exist_ok=True)  # merged with the image's /etc
        shutil.copyfile(HOSTS_FILE, upper / "etc" / "hosts")
        for d in {"/work", "/app", spec.workdir}:
            parts = [p for p in d.split("/") if p]
            if len(parts) != 1:
                continue  # nested: docker makes the workdir (root-owned) from the image's parents
            p = upper / parts[0]
            p.mkdir(mode=0o755, exist_ok=True)
            os.chown(p, plan.uid, plan.gid)

    def _release(self, box: _Box) -> None:
        """Undo `box`'s host-side resources. Idempotent, never raises."""
        for step in (self._release_egress, self._release_lifeline, self._release_sock, self._release_disk):
            try:
                step(box)
            except Exception as exc:
                log.warning("releasing %s: %s failed: %r", box.name, step.__name__, exc)

    def _release_egress(self, box: _Box) -> None:
        if box.egress_src is not None:
            if self._forwarder is not None and box.sock_dir is not None:
                self._forwarder.close(box.sock_dir / EGRESS_SOCKET_NAME)
            if self._proxy is not None:
                self._proxy.release(box.egress_src)

    def _release_lifeline(self, box: _Box) -> None:
        if box.lifeline is not None:
            box.lifeline.close()
            box.lifeline = None

    def _release_sock(self, box: _Box) -> None:
        if box.sock_dir is not None:
            self.sockets.discard(box.sock_dir)

    def _release_disk(self, box: _Box) -> None:
        if box.disk:
            self.disks.discard(box.name)

    # -- egress ---------------------------------------------------------------------------

    def _egress(self) -> tuple[EgressProxy, EgressForwarder]:
        with self._egress_lock:
            if self._proxy is None:
                sweep_state(self.state_root / "egress")
                self._proxy = EgressProxy(
                    self.state_root / "egress" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}", self.egress_host_ports
                )
            if self._forwarder is None:
                self._forwarder = EgressForwarder(self._proxy.ensure)
        self._proxy.start()
        return self._proxy, self._forwarder

    async def _set_egress(self, sb: DockerSandbox, policy: EgressPolicy | None) -> None:
        box = sb.box
        if box is None or box.egress_src is None or self._proxy is None:
            raise SandboxError(
                f"sandbox {sb.id[:12]} was created without egress, so it has no way out to open; "
                "create it with egress=EgressPolicy.nothing() to change its egress later"
            )
        await self._run(self._proxy.set_policy, box.egress_src, box.name, policy)

    async def _egress_log(self, sb: DockerSandbox) -> list[EgressLogEntry]:
        box = sb.box
        if box is None or box.egress_src is None or self._proxy is None:
            return []
        entries = await self._run(self._proxy.log_for, box.name, box.egress_src, box.created_at - 1)
        return [e.model_copy(update={"sandbox": sb.id}) for e in entries]

    # -- transports and readiness ---------------------------------------------------------

    def make_transport(self, container_id: str, spec: SandboxSpec) -> Transport:
        """The one place that picks how bytes reach a container: execd's socket when
        the container runs it, else docker exec."""
        box = self._boxes.get(container_id)
        sock_dir = box.sock_dir if box is not None and box.execd else None
        if sock_dir is None:
            return DockerExecTransport(self.api, container_id, limiter=self._limiter)

        async def running() -> bool:
            return await self._run(self._is_running, container_id)

        return DockerExecdTransport(sock_dir / "execd.sock", container_running=running)

    def _is_running(self, container_id: str) -> bool:
        try:
            return bool(self.api.inspect_container(container_id)["State"]["Running"])
        except docker.errors.NotFound:
            return False

    async def _execd_ready(self, cid: str, transport: DockerExecdTransport) -> bool:
        """Wait for execd's first answer; False when the container ended first."""
        sock = Path(transport.client.socket_path)
        deadline = time.monotonic() + EXECD_READY_TIMEOUT_S
        next_check = time.monotonic() + 0.5
        interval = 0.002
        while time.monotonic() < deadline:
            if sock.exists():  # appears only once execd accepts
                await transport.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
                return True
            if time.monotonic() >= next_check:
                if not await self._run(self._is_running, cid):
                    return False
                next_check = time.monotonic() + 0.5
            await anyio.sleep(interval)
            interval = min(interval * 1.5, 0.05)
        raise SandboxCreateError(f"execd in {cid[:12]} not ready after {EXECD_READY_TIMEOUT_S}s")

    async def _note_execd_failure(self, spec: SandboxSpec, transport: Transport) -> None:
        """execd's container ended at start (removed, exit code lost). Ask the
        fallback sandbox whether the image has python3: if not, remember that for the image
        so later sandboxes go straight to docker exec; otherwise it was this sandbox's
        trouble (e.g. too little memory for execd)."""
        try:
            probe = await transport.exec(
                ["sh", "-c", "command -v python3 || echo no-python3"], timeout=10, limit=4096, env=None, cwd="/",
                stdin=None,
            )
        except Exception as exc:  # the engine in trouble (a restart): it says nothing of the image
            log.warning("execd for image %s ended at start, and the image could not be probed: %r", spec.image, exc)
            return
        # Only the probe's own answer marks the image: a failed `docker exec` (an engine
        # restart, this sandbox gone) is no evidence, and the mark lasts as long as the provider.
        if probe.exit_code == 0 and probe.stdout.strip() == "no-python3":
            image = self.resolve_image(spec.image)
            self._execd_images[self._image_ids.get(image, image)] = False
            log.info("image %s has no python3; its sandboxes use docker exec", spec.image)
        else:
            log.warning("execd for image %s ended at start; this sandbox uses docker exec", spec.image)

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> DockerSandbox:
        await self._run(self._watcher.start)
        cid, box = await self._run(self._create_blocking, spec, labels, True)
        transport = self.make_transport(cid, spec)
        if isinstance(transport, DockerExecdTransport):
            try:
                ready = await self._execd_ready(cid, transport)
                if ready and box.sock_dir is not None:
                    self.sockets.seal(box.sock_dir)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await transport.aclose()
                    await self.remove(cid)
                raise
            if not ready:  # execd ended at once: no python3 (init's exec failed), ...
                await transport.aclose()
                await self.remove(cid)
                if spec.egress is not None:
                    raise SandboxCreateError(
                        f"egress: image {spec.image!r} cannot run execd (no python3 in it, or too little "
                        "memory), whose relay carries egress; use an image with python3 or egress=None"
                    )
                cid, box = await self._run(self._create_blocking, spec, labels, False)
                transport = self.make_transport(cid, spec)
                await self._note_execd_failure(spec, transport)
        return DockerSandbox(self, cid, spec, transport, box)

    # -- status ---------------------------------------------------------------------------

    async def inspect(self, sandbox_id: str, wait_s: float = 0.0) -> SandboxInfo | None:
        """A sandbox's status, also after it is gone (why it died, when this provider saw
        it: OOM_KILLED, TIMEOUT, EXITED, REMOVED); None when it never knew the id.
        `wait_s`: how long to wait for the engine's `die` event of a container that is
        no longer running."""
        return await self._run(self._inspect_blocking, sandbox_id, wait_s)

    def _inspect_blocking(self, cid: str, wait_s: float) -> SandboxInfo | None:
        try:
            c = self.api.inspect_container(cid)
        except docker.errors.NotFound:
            c = None
        box = self._boxes.get(cid)
        if c is not None and c["State"].get("Running"):
            info = SandboxInfo(
                id=c["Id"], provider=self.name, image=c["Config"].get("Image", ""), status="running",
                labels=c["Config"].get("Labels") or {},
            )
            if box is not None and box.disk:
                usage = self.disks.usage_mb(box.name)
                if usage is not None:
                    used, total = usage
                    info = info.model_copy(update={"disk_used_mb": round(used, 1), "disk_mb": round(total, 1)})
                    # Full: a write of 1 MiB (dd's, pip's) already fails with ENOSPC when about
                    # 1 MiB is left (the file's own metadata needs blocks too).
                    if total - used < 2.0:
                        info = info.model_copy(update={
                            "error_type": "DISK_FULL",
                            "error_message": f"its disk is full ({used:.0f} of {total:.0f} MiB); writes fail with ENOSPC",
                        })
            return info
        v = self._watcher.verdict(cid, wait_s)
        if v is None and c is None and box is None:
            return None
        if v is not None:
            return SandboxInfo(id=cid, provider=self.name, image=(c or {}).get("Config", {}).get("Image", ""),
                               status="gone" if c is None else str(c["State"].get("Status", "exited")),
                               error_type=v.error_type, error_message=v.message, exit_code=v.exit_code)
        if c is not None:
            st = c["State"]
            etype = "OOM_KILLED" if st.get("OOMKilled") else "EXITED"
            return SandboxInfo(id=cid, provider=self.name, image=c["Config"].get("Image", ""),
                               status=str(st.get("Status", "exited")), error_type=etype,
                               error_message=f"exited with code {st.get('ExitCode')}",
                               exit_code=st.get("ExitCode"))
        why = "gone, and the engine's events did not say why"
        if box is not None and self._watcher.engine_went_away_since(box.created_at):
            why = ("gone after the Docker engine went away and came back (a restart; an engine without "
                   "live-restore stops its containers, and scripts/bootstrap.sh turns live-restore on)")
        return SandboxInfo(id=cid, provider=self.name, status="gone", error_type="LOST", error_message=why)

    async def adopt(self, container_id: str, spec: SandboxSpec) -> DockerSandbox:
        """A running container made earlier from `spec` (by this or another process, e.g.
        before a server restart) as a sandbox again: its socket dir and disk from its labels
        and name, a fresh egress lease and forwarder when it has egress (re-apply a changed
        policy with `set_egress`). Raises SandboxGoneError when it is not running."""
        await self._run(self._watcher.start)
        cid, box = await self._run(self._adopt_blocking, container_id, spec)
        transport = self.make_transport(cid, spec)
        if isinstance(transport, DockerExecdTransport):
            try:
                await transport.wait_ready(timeout=10.0)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await transport.aclose()
                    await self._run(self._forget_blocking, cid)
                raise
        return DockerSandbox(self, cid, spec, transport, box)

    def _adopt_blocking(self, container_id: str, spec: SandboxSpec) -> tuple[str, _Box]:
        try:
            found = self.api.inspect_container(container_id)
        except docker.errors.NotFound:
            raise SandboxGoneError(f"container {container_id[:12]} is gone", reason="LOST") from None
        state = found["State"]
        if not state.get("Running"):
            raise SandboxGoneError(f"container {container_id[:12]} is {state.get('Status')}", reason="EXITED")
        cid = found["Id"]
        labels = found["Config"].get("Labels") or {}
        name = str(found.get("Name", "")).lstrip("/")
        box = _Box(name=name, plan=self.plan(spec))
        if labels.get(LABEL_TRANSPORT) == "execd" and labels.get(LABEL_SOCKET_DIR):
            box.sock_dir = Path(labels[LABEL_SOCKET_DIR])
            box.execd = True
        box.disk = bool(name) and self.disks.path(name).exists()
        if spec.ttl_s is not None:
            self._watcher.expect(cid, max(0.0, spec.ttl_s - _age_s(state.get("StartedAt", ""))))
        else:
            self._watcher.expect(cid, None)
        if spec.egress is not None and box.sock_dir is not None:
            proxy, fwd = self._egress()
            box.egress_src = proxy.lease(name, spec.egress)
            fwd.listen(box.sock_dir / EGRESS_SOCKET_NAME, box.egress_src)
        self._boxes[cid] = box
        return cid, box

    def _ended(self, container_id: str) -> None:
        """One of our containers ended by itself (TTL, owner gone, OOM, a kill): remove it, as
        `--rm` would; its host-side resources go when the sandbox is closed."""
        try:
            self._remove_container(container_id)
        except Exception as exc:  # the next `remove` or reaper tries again
            log.warning("removing ended container %s failed: %r", container_id[:12], exc)

    def _forget_blocking(self, container_id: str) -> None:
        """Stop tracking a container we no longer own (detached): it keeps running, with its
        disk and socket dir, for whoever adopts it next; only its egress lease goes."""
        self._watcher.forget(container_id)
        box = self._boxes.pop(container_id, None)
        if box is not None:
            try:
                self._release_egress(box)
            except Exception as exc:
                log.warning("releasing the egress lease of %s failed: %r", box.name, exc)

    def _list_blocking(self, labels: Mapping[str, str] | None) -> list[SandboxInfo]:
        wanted = [LABEL_OWNER, *(f"{k}={v}" for k, v in (labels or {}).items())]
        rows = self.api.containers(all=True, filters={"label": wanted})
        if not labels:  # a full listing (what prune does): drop leftovers of gone containers
            names = {n.lstrip("/") for row in rows for n in (row.get("Names") or ())}
            self.sockets.sweep(names)
            self.disks.sweep(names)
        out = []
        for row in rows:
            info = SandboxInfo(
                id=row["Id"],
                provider=self.name,
                image=row.get("Image", ""),
                status=row.get("State", "unknown"),
                labels=row.get("Labels") or {},
                created_at=float(row["Created"]) if row.get("Created") else None,
            )
            if info.status != "running":
                v = self._watcher.verdict(row["Id"])
                if v is not None:
                    info = info.model_copy(update={"error_type": v.error_type, "error_message": v.message,
                                                   "exit_code": v.exit_code})
            out.append(info)
        return out

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await self._run(self._list_blocking, labels)

    # -- removal --------------------------------------------------------------------------

    def _remove_blocking(self, sandbox_id: str) -> None:
        box = self._boxes.pop(sandbox_id, None)
        if box is None:  # not made by this provider object (e.g. prune): ask the engine
            try:
                found = self.api.inspect_container(sandbox_id)
                lab = found["Config"]["Labels"] or {}
                name = str(found.get("Name", "")).lstrip("/")
                box = _Box(name=name, plan=None)
                box.sock_dir = Path(lab[LABEL_SOCKET_DIR]) if LABEL_SOCKET_DIR in lab else None
                box.disk = self.disks.path(name).exists() if name else False
            except docker.errors.APIError:
                box = None
        self._watcher.removing(sandbox_id)
        try:
            self._remove_container(sandbox_id)
        finally:
            if box is not None:
                self._release(box)

    def _remove_container(self, sandbox_id: str) -> None:
        try:
            self.api.remove_container(sandbox_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            # our event watcher, or another sandgym process's reaper, may already be removing
            # it; that ends the same way, once it has ended: "removed" means gone.
            if e.status_code != 409:
                raise
            deadline = time.monotonic() + _REMOVAL_WAIT_S
            while time.monotonic() < deadline:
                try:
                    self.api.inspect_container(sandbox_id)
                except docker.errors.NotFound:
                    return
                time.sleep(0.1)
            raise SandboxError(f"container {sandbox_id[:12]} is still being removed after {_REMOVAL_WAIT_S:g}s") from e

    async def remove(self, sandbox_id: str) -> None:
        await self._run(self._remove_blocking, sandbox_id)

    async def drain_egress(self, timeout_s: float) -> int:
        """Before leaving its sandboxes to another process: stop taking their new egress
        connections (their relays wait for the next listener) and let transfers in progress
        finish, up to `timeout_s`. Returns how many were still busy."""
        fwd = self._forwarder
        if fwd is None:
            return 0
        return await self._run(fwd.drain, timeout_s)

    async def aclose(self) -> None:
        self._watcher.close()
        with self._egress_lock:
            fwd, proxy = self._forwarder, self._proxy
            self._forwarder = self._proxy = None
        if fwd is not None:
            fwd.shutdown()
        if proxy is not None:
            await self._run(proxy.stop)
            shutil.rmtree(proxy.dir, ignore_errors=True)
        self._watcher = ExitWatcher(self._events_client, self._ended)  # usable again after aclose
        if self._client is not None:
            self._client.close()
            self._client = None


def _age_s(started_at: str) -> float:
    """Seconds since the engine's `State.StartedAt` (RFC 3339 with nanoseconds); 0 if unknown."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?", started_at)
    if not m:
        return 0.0
    from datetime import datetime

    t = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    return max(0.0, time.time() - t - float(f"0.{m[2] or 0}"))


def _owner_ids(user: str, vm: bool) -> tuple[int, int]:
    # The workdir belongs to whoever runs in the box: a numeric user gets it; root is 0; a
    # user name (not resolvable without the image's passwd) gets the sandbox uid.
    ids = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    if ids:
        return int(ids[1]), int(ids[2] or ids[1])
    if user == "root":
        return 0, 0
    return SANDBOX_UID, SANDBOX_UID


def _rt_detail(rt: RuntimeStatus) -> str:
    return (f"runsc binary: {rt.runsc_binary or 'missing'}, wrapper v{rt.wrapper_version} "
            f"(want v{WANTED_VERSION}), engine runtimes: {', '.join(rt.engine_runtimes) or 'none'}")


def proxy_env() -> dict[str, str]:
    """What points programs in a sandbox at its egress relay."""
    url = f"http://127.0.0.1:{EGRESS_PORT}"
    no = "localhost,127.0.0.1,::1"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "NO_PROXY": no, "no_proxy": no, "NODE_USE_ENV_PROXY": "1"}


def ca_env() -> dict[str, str]:
    return {k: CA_IN_SANDBOX for k in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                                      "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")}


def default_state_root() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/sandgym")
    return Path(tempfile.gettempdir()) / f"sandgym-state-{os.geteuid()}"


def sweep_state(egress_root: Path) -> None:
    """Remove egress state of provider processes that are gone (`<pid>-<hex>`)."""
    try:
        entries = list(os.scandir(egress_root))
    except OSError:
        return
    for e in entries:
        pid_s = e.name.split("-", 1)[0]
        if not pid_s.isdigit():
            continue
        try:
            os.kill(int(pid_s), 0)
            continue
        except ProcessLookupError:
            shutil.rmtree(e.path, ignore_errors=True)
        except PermissionError:
            continue
