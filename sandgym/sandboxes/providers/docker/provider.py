"""The `docker` provider: one hardened container per sandbox on the local Docker engine.

Every container is created for untrusted code: no network, all capabilities dropped,
no-new-privileges, a non-root user, pids/memory/CPU limits with no swap beyond memory, a
read-only root, and size-limited tmpfs mounts for the workdir and /tmp (overlay2 on extfs
cannot limit a container's writable layer, so tmpfs is how disk is bounded; its pages count
against the memory limit too). HOME is /tmp unless the spec sets it (the image's home is on
the read-only root).

Commands and files go through a `Transport` (transport.py). When the image has python3,
the container's main process is execd, the in-sandbox exec daemon (sandboxes/execd/server.py,
mounted read-only from this package), listening on a unix socket in a per-container host
directory (execd.py): a few ms per command instead of tens for `docker exec`. Images without
python3 (execd's start fails with "executable file not found") are remembered per image
id and get a `sh` that sleeps out the TTL as main process and `DockerExecTransport`. Either
way the main process runs under the engine's init and the container is auto-removed when it
ends, at its TTL or, for sandboxes owned by a process (ownership.py), once that process is
gone: it holds a FIFO in the container's socket directory open, and the main process (execd,
or that `sh`) ends when the FIFO has no writer left.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import docker
import docker.errors
from anyio import to_thread
from docker.types import DeviceRequest

from ...base import Command, ExecJob, Sandbox, as_bytes, live_argv, shell_argv
from ...errors import SandboxCreateError, SandboxError, SandboxGoneError, SpecError
from ...execd import CONTAINER_SOCKET_DIR, LIFELINE_NAME, BatchJob, execd_command
from ...live import LiveProcess
from ...ownership import Lifeline, lifeline_grace_s, stamp_owner
from ...result import ExecResult, SandboxInfo
from ...spec import LABEL_OWNER, SandboxSpec
from .exec import KILLED_EXIT, DockerExecTransport
from .execd import DockerExecdTransport, SocketDirs, execd_volumes
from .live import DockerLiveProcess
from .transport import Transport

log = logging.getLogger(__name__)

T = TypeVar("T")

SANDBOX_UID = 1000  # the images' non-root `sandbox` user
DEFAULT_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
DEFAULT_OWNER = "sandgym"
_MIB = 1 << 20
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
EXECD_READY_TIMEOUT_S = 60.0
# Main process without execd: ends at the TTL ($3), or $2 seconds after the owner's
# lifeline FIFO ($1) has no writer left. Runs as PID 1 when the engine has no init, hence
# the trap (PID 1 ignores signals it has no handler for).
_WATCH_SH = r"""trap 'exit 0' TERM
(sleep "$3"; kill -TERM $$) &
(while read -r _; do :; done <"$1" && sleep "$2" && kill -TERM $$) 2>/dev/null &
wait"""


class _NoExecd(Exception):
    """The image cannot run execd (no python3): use docker exec for it."""


class DockerSandbox(Sandbox):
    """A running container. Policy lives here; bytes move through `transport`."""

    provider = "docker"

    def __init__(
        self,
        owner: DockerProvider,
        container_id: str,
        spec: SandboxSpec,
        transport: Transport,
    ) -> None:
        self.id = container_id
        self.spec = spec
        self.transport = transport
        self._owner = owner
        self._closed = False
        self._oom_seen = 0  # the container's oom_kill counter when we last looked
        self._oom_lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, image={self.spec.image!r})"

    def _live(self) -> None:
        if self._closed:
            raise SandboxGoneError(f"sandbox {self.id[:12]} is closed")

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        self._live()
        res = await self.transport.exec(
            shell_argv(cmd),
            timeout=timeout if timeout is not None else self.spec.exec_timeout_s,
            limit=self.spec.output_limit_bytes,
            env=env,
            cwd=self.resolve(cwd) if cwd else None,
            stdin=as_bytes(stdin) if stdin is not None else None,
        )
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
        self._live()
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
        results = await self.transport.batch_exec(batch, parallel=parallel)
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
        """A live process streamed through the Docker exec API (live.py), whichever
        transport runs this sandbox's plain commands."""
        self._live()
        proc = DockerLiveProcess(self._owner.api, self.id, live_argv(argv))
        await proc.start(env, self.resolve(cwd) if cwd else None)
        return proc

    async def reset(self) -> bool:
        """execd sandboxes only: kill every process but init and execd, empty the
        workdir, /tmp and /dev/shm. False when it could not (then destroy, do not reuse)."""
        if self._closed or not isinstance(self.transport, DockerExecdTransport):
            return False
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
        self._live()
        await self.transport.write_file(self.resolve(path), as_bytes(data), mode)

    async def read_file(self, path: str) -> bytes:
        self._live()
        return await self.transport.read_file(self.resolve(path))

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        self._live()
        await self.transport.put_archive(self.resolve(dest_dir), tar_bytes)

    async def get_archive(self, path: str) -> bytes:
        self._live()
        return await self.transport.get_archive(self.resolve(path))

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
    ) -> None:
        """`execd=False` always uses `docker exec` (main process `sleep`); `socket_root` is
        where per-container execd socket directories go (default /run/sandgym-sockets as
        root, else a folder in the temp dir)."""
        self.use_execd = execd
        self.sockets = SocketDirs(socket_root)
        # image id -> False once the image turned out unable to run execd
        self._execd_images: dict[str, bool] = {}
        self._image_ids: dict[str, str] = {}
        self._socket_dirs: dict[str, Path] = {}  # container id -> its socket dir
        self._execd_ids: set[str] = set()  # containers whose main process is execd
        self._lifelines: dict[str, Lifeline] = {}  # container id -> our end of its lifeline
        self._client = client
        self._client_lock = threading.Lock()
        self._max_concurrency = max_concurrency
        self._timeout_s = timeout_s
        self._info: dict[str, Any] | None = None
        self._limiter: anyio.CapacityLimiter | None = None

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

    def _engine_info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self.api.info()
        return self._info

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # Our own limiter: long execs must not starve anyio's default thread pool (40).
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._max_concurrency)
        return await to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- Provider -----------------------------------------------------------------------

    def check(self, spec: SandboxSpec) -> None:
        try:
            self._image_ids[spec.image] = self.api.inspect_image(spec.image)["Id"]
        except docker.errors.ImageNotFound:
            raise SpecError(
                f"image: {spec.image!r} not found locally; run `sandgym images build` "
                "(images are never pulled: there is no registry)"
            ) from None
        except docker.errors.APIError as e:
            raise SpecError(f"image: {spec.image!r} cannot be inspected: {e.explanation}") from e
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
        if spec.network:
            self._network_mode(spec)

    @staticmethod
    def _has_gpu_runtime(info: Mapping[str, Any]) -> bool:
        runtimes = info.get("Runtimes") or {}
        return (
            "nvidia" in runtimes
            or info.get("DefaultRuntime") == "nvidia"
            or bool(info.get("CDISpecDirs"))
            or shutil.which("nvidia-container-runtime-hook") is not None
        )

    def _network_mode(self, spec: SandboxSpec) -> str:
        if not spec.network:
            return "none"
        try:
            self.api.inspect_network("bridge")
        except docker.errors.NotFound:
            raise SpecError(
                "network=True needs the engine's default `bridge` network, but this engine "
                "runs with --bridge=none (no container networking by design); use network=False"
            ) from None
        return "bridge"

    @staticmethod
    def _owner_ids(spec: SandboxSpec) -> tuple[int, int]:
        # The workdir belongs to whoever runs in the box: a numeric spec.user gets it, a
        # user name (not resolvable without the image's passwd) gets the sandbox uid.
        ids = re.fullmatch(r"(\d+)(?::(\d+))?", spec.user or "")
        return (int(ids[1]), int(ids[2] or ids[1])) if ids else (SANDBOX_UID, SANDBOX_UID)

    def container_config(
        self,
        spec: SandboxSpec,
        labels: Mapping[str, str],
        socket_dir: str | os.PathLike[str] | None = None,
        *,
        execd: bool = True,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(create_container kwargs, host_config kwargs) for `spec`: the hardened defaults.
        With `socket_dir` the main process is execd, its socket in that host folder (with
        `execd=False`: a `sh`, the folder holding only the owner's lifeline)."""
        all_labels = {**spec.labels, **{k: str(v) for k, v in labels.items()}}
        all_labels.setdefault(LABEL_OWNER, DEFAULT_OWNER)
        all_labels = stamp_owner(all_labels)  # pid, host, ...: what the reaper judges by
        execd = execd and socket_dir is not None
        all_labels[LABEL_TRANSPORT] = "execd" if execd else "docker-exec"
        if socket_dir:
            all_labels[LABEL_SOCKET_DIR] = str(socket_dir)
        grace = lifeline_grace_s(all_labels) if socket_dir else None
        fifo = f"{CONTAINER_SOCKET_DIR}/{LIFELINE_NAME}"
        ttl = "infinity" if spec.ttl_s is None else str(math.ceil(spec.ttl_s))
        size = f"{spec.disk_mb}m"
        uid, gid = self._owner_ids(spec)
        host: dict[str, Any] = dict(
            auto_remove=True,
            network_mode=self._network_mode(spec),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=spec.pids,
            mem_limit=spec.memory_mb * _MIB,
            memswap_limit=spec.memory_mb * _MIB,  # equal: no swap beyond memory
            nano_cpus=int(spec.cpu * 1e9),
            read_only=True,
            # Docker mounts tmpfs noexec by default; a code sandbox must run what it builds.
            tmpfs={
                spec.workdir: f"size={size},uid={uid},gid={gid},mode=0755,exec",
                "/tmp": f"size={size},mode=1777,exec",
            },
            init=bool(self._engine_info().get("InitBinary")) or None,
        )
        if spec.gpus:
            host["device_requests"] = [DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
        if execd:
            host["binds"] = execd_volumes(socket_dir)  # socket dir rw, execd's code ro
            # execd ends itself after ttl_s (or once its owner is gone), then the container
            # removes itself.
            main = execd_command(spec.ttl_s, owner_fifo=fifo if grace is not None else None, owner_grace_s=grace or 0.0)
        elif grace is not None:
            host["binds"] = {str(socket_dir): {"bind": CONTAINER_SOCKET_DIR, "mode": "ro"}}
            main = ["/bin/sh", "-c", _WATCH_SH, "sandgym-main", fifo, str(math.ceil(grace)), ttl]
        else:
            main = ["sleep", ttl]  # lives ttl_s, then the container removes itself
        create: dict[str, Any] = dict(
            image=spec.image,
            entrypoint=main[:1],
            command=main[1:],
            user=spec.user or DEFAULT_USER,
            # The image's home is on the read-only root: git config, pip caches need a HOME.
            environment={"HOME": "/tmp", **spec.env},
            working_dir=spec.workdir,
            labels=all_labels,
            detach=True,
        )
        return create, host

    def wants_execd(self, spec: SandboxSpec) -> bool:
        """Whether a new sandbox of `spec` gets execd (not known to lack python3)."""
        image_id = self._image_ids.get(spec.image, spec.image)
        return self.use_execd and self._execd_images.get(image_id, True)

    def _create_blocking(self, spec: SandboxSpec, labels: Mapping[str, str], execd: bool) -> str:
        self.check(spec)
        if execd and self.wants_execd(spec):
            try:
                return self._create_with_dir(spec, labels, execd=True)
            except _NoExecd as e:
                image_id = self._image_ids.get(spec.image, spec.image)
                log.info("image %s cannot run execd (%s); using docker exec for it", spec.image, e)
                self._execd_images[image_id] = False
        return self._create_with_dir(spec, labels, execd=False)

    def _create_with_dir(self, spec: SandboxSpec, labels: Mapping[str, str], *, execd: bool) -> str:
        """A container with its socket directory: execd's socket and/or the owner's lifeline
        FIFO, which this process holds open until the container is removed."""
        want_lifeline = lifeline_grace_s(stamp_owner(labels)) is not None
        if not (execd or want_lifeline):
            return self._create_start(spec, labels, None)
        name = self.sockets.new_name()
        sock_dir = self.sockets.make(name, *self._owner_ids(spec))
        lifeline: Lifeline | None = None
        try:
            if want_lifeline:  # before the container starts, so its watcher finds a writer
                lifeline = Lifeline.fifo(sock_dir / LIFELINE_NAME)
            if not execd:
                self.sockets.seal(sock_dir)  # nothing in the box writes there
            cid = self._create_start(spec, labels, sock_dir, name, execd=execd)
        except BaseException:
            if lifeline is not None:
                lifeline.close()
            self.sockets.discard(sock_dir)
            raise
        self._socket_dirs[cid] = sock_dir
        if execd:
            self._execd_ids.add(cid)
        if lifeline is not None:
            self._lifelines[cid] = lifeline
        return cid

    def _create_start(
        self,
        spec: SandboxSpec,
        labels: Mapping[str, str],
        sock_dir: Path | None,
        name: str | None = None,
        *,
        execd: bool = True,
    ) -> str:
        create, host = self.container_config(spec, labels, sock_dir, execd=execd)
        try:
            cid = self.api.create_container(
                host_config=self.api.create_host_config(**host), name=name, **create
            )["Id"]
        except docker.errors.APIError as e:
            raise SandboxCreateError(f"docker create failed: {e.explanation or e}") from e
        try:
            self.api.start(cid)
        except docker.errors.APIError as e:
            self._remove_container(cid)  # never started, so auto_remove will not fire
            text = str(e.explanation or e)
            if sock_dir is not None and execd and (
                "executable file not found" in text or "no such file or directory" in text
            ):
                raise _NoExecd(text) from e
            raise SandboxCreateError(f"docker start failed: {text}") from e
        return cid

    def make_transport(self, container_id: str, spec: SandboxSpec) -> Transport:
        """The one place that picks how bytes reach a container: execd's socket when
        the container runs it, else docker exec."""
        sock_dir = self._socket_dirs.get(container_id)
        if sock_dir is None or container_id not in self._execd_ids:
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
        """execd's container ended at start (auto-removed, exit code lost). Ask the
        fallback sandbox whether the image has python3: if not, remember that for the image
        so later sandboxes go straight to docker exec; otherwise it was this sandbox's
        trouble (e.g. too little memory for execd)."""
        probe = await transport.exec(
            ["sh", "-c", "command -v python3"], timeout=10, limit=4096, env=None, cwd="/", stdin=None
        )
        if probe.exit_code != 0:
            image_id = self._image_ids.get(spec.image, spec.image)
            self._execd_images[image_id] = False
            log.info("image %s has no python3; its sandboxes use docker exec", spec.image)
        else:
            log.warning("execd for image %s ended at start; this sandbox uses docker exec", spec.image)

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> DockerSandbox:
        cid = await self._run(self._create_blocking, spec, labels, True)
        transport = self.make_transport(cid, spec)
        if isinstance(transport, DockerExecdTransport):
            try:
                ready = await self._execd_ready(cid, transport)
                if ready:
                    self.sockets.seal(self._socket_dirs[cid])
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await transport.aclose()
                    await self.remove(cid)
                raise
            if not ready:  # execd ended at once: no python3 (init's exec failed), ...
                await transport.aclose()
                await self.remove(cid)
                cid = await self._run(self._create_blocking, spec, labels, False)
                transport = self.make_transport(cid, spec)
                await self._note_execd_failure(spec, transport)
        return DockerSandbox(self, cid, spec, transport)

    def _list_blocking(self, labels: Mapping[str, str] | None) -> list[SandboxInfo]:
        wanted = [LABEL_OWNER, *(f"{k}={v}" for k, v in (labels or {}).items())]
        rows = self.api.containers(all=True, filters={"label": wanted})
        if not labels:  # a full listing (what prune does): drop socket dirs of gone containers
            names = {n.lstrip("/") for row in rows for n in (row.get("Names") or ())}
            self.sockets.sweep(names)
        return [
            SandboxInfo(
                id=row["Id"],
                provider=self.name,
                image=row.get("Image", ""),
                status=row.get("State", "unknown"),
                labels=row.get("Labels") or {},
                created_at=float(row["Created"]) if row.get("Created") else None,
            )
            for row in rows
        ]

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await self._run(self._list_blocking, labels)

    def _remove_blocking(self, sandbox_id: str) -> None:
        sock_dir = self._socket_dirs.pop(sandbox_id, None)
        if sock_dir is None:  # not made by this provider object (e.g. prune): ask the engine
            try:
                found = self.api.inspect_container(sandbox_id)["Config"]["Labels"] or {}
                sock_dir = Path(found[LABEL_SOCKET_DIR]) if LABEL_SOCKET_DIR in found else None
            except docker.errors.APIError:
                sock_dir = None
        try:
            self._remove_container(sandbox_id)
        finally:
            self._execd_ids.discard(sandbox_id)
            lifeline = self._lifelines.pop(sandbox_id, None)
            if lifeline is not None:
                lifeline.close()
            if sock_dir is not None:
                self.sockets.discard(sock_dir)

    def _remove_container(self, sandbox_id: str) -> None:
        try:
            self.api.remove_container(sandbox_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            # auto_remove may already be removing it; that ends the same way.
            if e.status_code != 409:
                raise

    async def remove(self, sandbox_id: str) -> None:
        await self._run(self._remove_blocking, sandbox_id)

    async def aclose(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
