"""The `docker` provider: one hardened container per sandbox on the local Docker engine.

Every container is created for untrusted code: no network, all capabilities dropped,
no-new-privileges, a non-root user, pids/memory/CPU limits with no swap beyond memory, a
read-only root, and size-limited tmpfs mounts for the workdir and /tmp (overlay2 on extfs
cannot limit a container's writable layer, so tmpfs is how disk is bounded; its pages count
against the memory limit too). The main process is `sleep <ttl_s>` under the engine's init,
and the container is auto-removed when it ends, so a driver that dies leaks nothing past the
TTL. Commands and files go through a `Transport` (docker_transport.py); today that is
`DockerExecTransport`, later the in-sandbox agent.
"""

from __future__ import annotations

import math
import re
import shutil
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
import docker
import docker.errors
from anyio import to_thread
from docker.types import DeviceRequest

from ..base import Command, Sandbox, as_bytes, shell_argv
from ..errors import SandboxCreateError, SandboxGoneError, SpecError
from ..result import ExecResult, SandboxInfo
from ..spec import LABEL_OWNER, SandboxSpec
from .docker_exec import KILLED_EXIT, DockerExecTransport
from .docker_transport import Transport

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
        # A SIGKILL exit is either us, someone's kill -9, or the memory cgroup's OOM killer;
        # only the cgroup's counter tells them apart, so look only then (no cost otherwise).
        if res.exit_code == KILLED_EXIT and not res.timed_out and await self._new_oom_kill():
            res = res.model_copy(update={"oom_killed": True})
        return res

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
    ) -> None:
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
            self.api.inspect_image(spec.image)
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

    def container_config(
        self, spec: SandboxSpec, labels: Mapping[str, str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(create_container kwargs, host_config kwargs) for `spec`: the hardened defaults."""
        all_labels = {**spec.labels, **{k: str(v) for k, v in labels.items()}}
        all_labels.setdefault(LABEL_OWNER, DEFAULT_OWNER)
        ttl = "infinity" if spec.ttl_s is None else str(math.ceil(spec.ttl_s))
        size = f"{spec.disk_mb}m"
        # The workdir belongs to whoever runs in the box: a numeric spec.user gets it, a
        # user name (not resolvable without the image's passwd) gets the sandbox uid.
        ids = re.fullmatch(r"(\d+)(?::(\d+))?", spec.user or "")
        uid, gid = (ids[1], ids[2] or ids[1]) if ids else (SANDBOX_UID, SANDBOX_UID)
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
        create: dict[str, Any] = dict(
            image=spec.image,
            entrypoint=["sleep"],  # lives ttl_s, then the container removes itself
            command=[ttl],
            user=spec.user or DEFAULT_USER,
            environment=dict(spec.env),
            working_dir=spec.workdir,
            labels=all_labels,
            detach=True,
        )
        return create, host

    def _create_blocking(self, spec: SandboxSpec, labels: Mapping[str, str]) -> str:
        self.check(spec)
        create, host = self.container_config(spec, labels)
        try:
            cid = self.api.create_container(
                host_config=self.api.create_host_config(**host), **create
            )["Id"]
        except docker.errors.APIError as e:
            raise SandboxCreateError(f"docker create failed: {e.explanation or e}") from e
        try:
            self.api.start(cid)
        except docker.errors.APIError as e:
            self._remove_blocking(cid)  # never started, so auto_remove will not fire
            raise SandboxCreateError(f"docker start failed: {e.explanation or e}") from e
        return cid

    def make_transport(self, container_id: str, spec: SandboxSpec) -> Transport:
        """The one place that picks how bytes reach a container (the agent plugs in here,
        keeping docker exec as its fallback)."""
        return DockerExecTransport(self.api, container_id, limiter=self._limiter)

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> DockerSandbox:
        cid = await self._run(self._create_blocking, spec, labels)
        return DockerSandbox(self, cid, spec, self.make_transport(cid, spec))

    def _list_blocking(self, labels: Mapping[str, str] | None) -> list[SandboxInfo]:
        wanted = [LABEL_OWNER, *(f"{k}={v}" for k, v in (labels or {}).items())]
        rows = self.api.containers(all=True, filters={"label": wanted})
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
