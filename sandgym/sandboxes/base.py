"""The one sandbox interface and the one provider protocol every backend implements.

Where a sandbox runs (Docker engine, Prime, a local process) is the provider's business;
how commands reach it (docker exec, execd -- the in-sandbox exec daemon -- over a unix
socket, Prime's gateway) is the sandbox's. Callers only see `Sandbox` and `ExecResult`.
"""

from __future__ import annotations

import io
import os
import tarfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .errors import SandboxError, SandboxGoneError
from .live import LiveHandle, LiveProcess, ShellLiveProcess
from .result import EgressLogEntry, ExecResult, SandboxInfo
from .spec import EgressPolicy, SandboxSpec

Command = str | Sequence[str]


def shell_argv(cmd: Command) -> list[str]:
    """A string runs under bash -c (like a terminal); a list runs as-is."""
    if isinstance(cmd, str):
        return ["/bin/bash", "-c", cmd]
    argv = list(cmd)
    if not argv:
        raise ValueError("empty command")
    return argv


def python_argv(cpu_limit_s: int | None = None) -> list[str]:
    """`python3 -` (the program on stdin), under `ulimit -t` when a CPU limit is given."""
    if not cpu_limit_s:
        return ["python3", "-"]
    return ["sh", "-c", f"ulimit -t {int(cpu_limit_s)} && exec python3 -"]


def live_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str) or not argv:
        raise ValueError("a live process needs a non-empty argv list")
    return list(argv)


def as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


@dataclass(frozen=True)
class ExecJob:
    """One command of `Sandbox.exec_many`; each has its own timeout and result."""

    cmd: Command
    timeout: float | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    stdin: bytes | str | None = None


class Sandbox(ABC):
    """An isolated place to run commands. Always `close()` it (the manager does).

    What its methods raise (errors.py), the same for every provider (contract.py checks it):
    - SandboxGoneError: the sandbox is closed, removed, or died (`reason` says why when
      known); SandboxLostError, a kind of it, when the machine holding it was lost.
    - SandboxFileNotFound (also a FileNotFoundError): a file call named a missing path.
    - SandboxError: anything else the sandbox or its transport could not do (a directory
      read as a file, a write where the sandbox user may not write, a broken connection).
    - ValueError: the call itself is malformed (an empty argv).
    A command that fails is never a raise: it is an ExecResult (exit 127 for a missing
    program, 126 for one that cannot run, 128+N for death by signal N, 124 for a timeout).
    """

    id: str
    spec: SandboxSpec
    provider: str
    _closed: bool = False  # set by close(): from then on every operation raises

    def _raise_if_closed(self) -> None:
        """SandboxGoneError once the sandbox is closed: nothing runs on a sandbox its owner
        gave up. Implementations call it first in each operation."""
        if self._closed:
            raise SandboxGoneError(f"sandbox {self.id} is closed")

    @abstractmethod
    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run a command; past `timeout` (default spec.exec_timeout_s) it is killed with its
        children and reported with `timed_out=True` and exit 124. Never raises for a failing
        command (a missing program is exit 127; death by signal N is 128+N, not a timeout).
        stdout and stderr are each capped at spec.output_limit_bytes (`truncated`).

        Raises: SandboxGoneError (closed, removed or dead); SandboxError when the command
        could not be started or its result not fetched (transport); ValueError for an empty
        argv. A missing `cwd` either raises SandboxError or fails the command, never runs it
        elsewhere."""

    @abstractmethod
    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file (parents created, content truncated, `mode` applied);
        relative paths are under the workdir.

        Raises: SandboxError where the sandbox user may not write, onto a directory, or below
        a regular file; SandboxGoneError when the sandbox is gone."""

    @abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a whole file (no output cap: any size, any bytes).

        Raises: SandboxFileNotFound when missing; SandboxError for a directory or a file the
        sandbox user may not read; SandboxGoneError when the sandbox is gone."""

    @abstractmethod
    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        """Extract a tar archive into `dest_dir` (created when missing).

        Raises: SandboxError when it cannot be extracted there; SandboxGoneError."""

    @abstractmethod
    async def get_archive(self, path: str) -> bytes:
        """A tar archive of `path` (a file or a directory), its basename at the top.

        Raises: SandboxFileNotFound when `path` is missing; SandboxGoneError."""

    @abstractmethod
    async def close(self) -> None:
        """Destroy the sandbox. Idempotent; never raises for a sandbox already gone. Every
        later operation raises SandboxGoneError."""

    async def detach(self) -> None:  # noqa: B027 - a no-op unless the provider holds client resources
        """Let go of the sandbox without destroying it: release client resources only (a
        provider that is an `AdoptingProvider` can take it over again, e.g. after a server restart)."""

    async def exec_many(self, jobs: Sequence[ExecJob], *, parallel: int | None = None) -> list[ExecResult]:
        """Run many commands, results in job order (each as `exec` would return it). This
        default runs them as concurrent `exec` calls, at most `parallel` (default 8) at once;
        a provider may do it in one round trip (docker with execd)."""
        import anyio

        results: list[ExecResult | None] = [None] * len(jobs)
        limit = anyio.CapacityLimiter(max(1, parallel or 8))

        async def one(i: int, job: ExecJob) -> None:
            async with limit:
                results[i] = await self.exec(
                    job.cmd, timeout=job.timeout, env=job.env, cwd=job.cwd, stdin=job.stdin
                )

        async with anyio.create_task_group() as tg:
            for i, job in enumerate(jobs):
                tg.start_soon(one, i, job)
        return [r for r in results if r is not None]

    async def exec_python(
        self,
        source: bytes | str,
        *,
        cpu_limit_s: int | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run a Python program as `python3 -` with it on stdin would, its CPU time capped
        at `cpu_limit_s` seconds (RLIMIT_CPU: the program is killed there, exit 137); the
        result and what it raises as for `exec`. This default execs exactly that; docker's
        execd forks the program from a warm interpreter instead (a fork, not an interpreter
        start; where that would behave differently it starts a fresh one)."""
        return await self.exec(python_argv(cpu_limit_s), timeout=timeout, env=env, cwd=cwd, stdin=source)

    async def start_live(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        """Start `argv` as a live process (output as it appears, stdin, signals; see live.py)
        and return it once it runs, its `pid` set. Relative `cwd` is under the workdir. This
        default is built from `exec` alone, so every sandbox has it; a provider with a
        streaming API overrides it (docker, through execd)."""
        proc = ShellLiveProcess(self, live_argv(argv))
        await proc.start(env, self.resolve(cwd) if cwd else None)
        return proc

    async def attach_live(self, handle: LiveHandle, argv: Sequence[str]) -> LiveProcess:
        """Attach to a live process started earlier (by another driver of this sandbox) from
        its `handle()`; RuntimeError when it is gone. This default attaches to the exec-built
        kind; a provider whose `start_live` makes others attaches to those too (docker)."""
        if handle.kind != ShellLiveProcess.KIND:
            raise RuntimeError(f"this sandbox cannot attach to a {handle.kind} live process")
        proc = ShellLiveProcess(self, live_argv(argv), handle)
        await proc.attach()
        return proc

    async def reset(self) -> bool:
        """Make the sandbox like new for another user: no processes but its own, an empty
        workdir and /tmp. Returns False when this sandbox cannot (then do not reuse it)."""
        return False

    async def alive(self) -> bool:
        """Whether it answers a command now. Never raises."""
        try:
            return (await self.exec(["true"], timeout=10)).exit_code == 0
        except Exception:
            return False

    async def set_egress(self, policy: EgressPolicy | None) -> None:
        """Change where this running sandbox may connect (None: nowhere). Takes effect for
        new connections at once. Providers that cannot raise SandboxError (this default)."""
        raise SandboxError(f"the {self.provider} provider cannot change a running sandbox's egress")

    async def egress_log(self) -> list[EgressLogEntry]:
        """The connections this sandbox made (or tried) through its egress proxy, oldest
        first. Empty for a sandbox without egress; SandboxError where a provider keeps none.
        A request's line is written when the proxy has finished with it, which can be a
        moment after the program that made it has its answer."""
        if self.spec.egress is None:
            return []
        raise SandboxError(f"the {self.provider} provider keeps no egress log")

    async def info(self) -> SandboxInfo:
        """Its status now: "running", or not running with `error_type` (result.ErrorType)
        saying why when the provider knows. This default can only tell running from LOST."""
        if await self.alive():
            return SandboxInfo(id=self.id, provider=self.provider, image=self.spec.image)
        return SandboxInfo(id=self.id, provider=self.provider, image=self.spec.image, status="gone",
                           error_type="LOST", error_message="the sandbox does not answer")

    def resolve(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir}/{path}"

    async def upload(self, local: str | os.PathLike[str], remote_dir: str | None = None) -> None:
        """Copy a local file or directory (its contents) into `remote_dir` (default workdir)."""
        src = Path(local)
        if not src.exists():
            raise FileNotFoundError(src)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            if src.is_dir():
                for child in sorted(src.iterdir()):
                    tar.add(child, arcname=child.name)
            else:
                tar.add(src, arcname=src.name)
        await self.put_archive(self.resolve(remote_dir or self.spec.workdir), buf.getvalue())

    async def download(self, remote: str, local: str | os.PathLike[str]) -> Path:
        """Copy a remote file or directory to `local` (a directory, created); returns the
        local path of what was copied. Archive members escaping `local` are refused."""
        dest = Path(local)
        dest.mkdir(parents=True, exist_ok=True)
        data = await self.get_archive(self.resolve(remote))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:  # Python < 3.11.4: refuse escaping members ourselves
                root = dest.resolve()
                for m in tar.getmembers():
                    target = (dest / m.name).resolve()
                    if not target.is_relative_to(root) or m.issym() or m.islnk() or m.isdev():
                        raise ValueError(f"unsafe archive member {m.name!r}")
                tar.extractall(dest)
        return dest / Path(remote.rstrip("/")).name

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@runtime_checkable
class Provider(Protocol):
    """Creates, lists and removes sandboxes of one kind."""

    name: str

    def check(self, spec: SandboxSpec) -> None:
        """Raise SpecError (naming the field) when this provider cannot honour `spec`;
        e.g. an image that does not exist, or GPUs where there are none. Cheap; no side effects."""
        ...

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> Sandbox:
        """Create and start a sandbox carrying `labels` (owner, pid, ...), ready for exec.

        Raises: SpecError when the spec cannot be honoured (ImagePullError, also a
        SandboxCreateError, for an image that cannot be pulled); SandboxCreateError when
        the provider could not create or start it (retryable)."""
        ...

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        """Sandboxes made by sandgym on this provider (optionally filtered by labels)."""
        ...

    async def remove(self, sandbox_id: str) -> None:
        """Remove a sandbox by id, whoever made it. Idempotent: a missing id is no error.
        Its `Sandbox` object raises SandboxGoneError from then on."""
        ...

    async def aclose(self) -> None:
        """Release client resources (connections); does not remove sandboxes."""
        ...


@runtime_checkable
class AdoptingProvider(Provider, Protocol):
    """A provider that can take over a sandbox made earlier, by this or another process (a
    server restarted on the same state): an optional capability, asked for with
    `isinstance(provider, AdoptingProvider)`. docker has it."""

    async def adopt(self, sandbox_id: str, spec: SandboxSpec) -> Sandbox:
        """The running sandbox `sandbox_id`, made from `spec`, as a `Sandbox` again. Raises
        SandboxGoneError when it is not running."""
        ...
