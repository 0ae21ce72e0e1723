"""The `prime` provider: sandboxes through the real prime-sandboxes SDK, on Prime's hosted
service or on our own `sandgym serve` (one or several endpoints).

Endpoints: `endpoints=[...]`, else `$SANDGYM_PRIME_ENDPOINTS` (comma-separated), else
`$PRIME_API_BASE_URL`, else the SDK's default (Prime's hosted API). With several, each new
sandbox goes to the endpoint holding the fewest live sandboxes made by this provider (ties:
round robin); every later call for that sandbox goes to the endpoint that made it.

Commands run over the gateway's Connect `Start` RPC built from the SDK's own pieces
(`rpc_command_session`, the client's gateway auth cache) rather than `execute_command`, which
decodes output with errors="replace": binary output must come back byte for byte. Files go
through the SDK's upload and download calls; directories travel as tar archives.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shlex
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from ..base import Command, Sandbox, as_bytes, shell_argv
from ..errors import (
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGoneError,
    SandboxInterruptedError,
    SpecError,
)
from ..execd.capped import CappedBuffer
from ..result import TIMEOUT_EXIT, ExecResult, SandboxInfo
from ..spec import EgressPolicy, SandboxSpec

_DEADLINE_GRACE_MS = 5000
_LABEL_SEP = "="
_PAGE = 100


def default_endpoints() -> list[str]:
    raw = os.environ.get("SANDGYM_PRIME_ENDPOINTS") or os.environ.get("PRIME_API_BASE_URL") or ""
    return [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]


def _labels_to_prime(labels: Mapping[str, str]) -> list[str]:
    return [f"{k}{_LABEL_SEP}{v}" for k, v in sorted(labels.items())]


def _labels_from_prime(labels: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in labels:
        k, sep, v = item.partition(_LABEL_SEP)
        out[k] = v if sep else ""
    return out


def _script(cmd: Command) -> str:
    """The bash script for a command (the gateway runs `/bin/bash -c SCRIPT`): a string as
    is, an argv quoted and exec'd (no second shell), `bash -c S` as S itself."""
    if isinstance(cmd, str):
        return cmd
    argv = shell_argv(cmd)
    if len(argv) == 3 and argv[0] in ("/bin/bash", "bash") and argv[1] == "-c":
        return argv[2]
    return "exec " + shlex.join(argv)


def _is_not_found(exc: BaseException) -> bool:
    return "HTTP 404" in str(exc) or "not found" in str(exc).lower()


class _Endpoint:
    def __init__(self, url: str | None, api_key: str | None, state_dir: str | None = None) -> None:
        from pathlib import Path

        from prime_sandboxes import AsyncSandboxClient

        self.client = AsyncSandboxClient(api_key=api_key)
        if state_dir:
            # The SDK persists gateway tokens in ~/.prime/sandbox_auth_cache.json; tests and
            # throwaway runs keep theirs elsewhere.
            self.client._auth_cache._cache_file = Path(state_dir) / "sandbox_auth_cache.json"
        if url:
            # The SDK takes its base URL only from env/config; the attribute is public.
            self.client.client.base_url = url.rstrip("/").removesuffix("/api/v1")
        self.url = self.client.client.base_url
        self.live: set[str] = set()


class PrimeSandbox(Sandbox):
    provider = "prime"

    def __init__(self, owner: PrimeProvider, endpoint: _Endpoint, sandbox_id: str, spec: SandboxSpec) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.endpoint = endpoint
        self._owner = owner
        self._closed = False

    def __repr__(self) -> str:
        return f"PrimeSandbox({self.id}, {self.endpoint.url})"

    async def set_egress(self, policy: EgressPolicy | None) -> None:
        """Prime's egress policy endpoint (set_network)."""
        self._raise_if_closed()
        net = prime_network(policy)
        allow, deny = net["network_allowlist"], net["network_denylist"]
        if allow is not None and not allow:  # nothing: Prime's "deny everything"
            allow, deny = None, ["*"]
        elif deny is not None and not deny:  # anything
            allow, deny = ["*"], None
        try:
            await self.endpoint.client.set_network(self.id, allow=allow, deny=deny)
        except Exception as exc:
            raise SandboxError(f"set_network on {self.id} failed: {exc}") from exc

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
        timeout = self.spec.exec_timeout_s if timeout is None else timeout
        script = _script(cmd)
        stdin_path = None
        if stdin is not None:
            # The command RPC has no stdin for plain commands: stage it as a file.
            stdin_path = f"/tmp/.sandgym-stdin-{uuid.uuid4().hex[:12]}"
            await self.write_file(stdin_path, as_bytes(stdin), 0o600)
            script = f"exec < {stdin_path}; rm -f {stdin_path}; {script}"
        workdir = self.resolve(cwd) if cwd else self.spec.workdir
        t0 = time.monotonic()
        out, err, code, timed_out, cut = await self._run(script, {**self.spec.env, **(env or {})}, workdir, timeout)
        limit = self.spec.output_limit_bytes
        so, se = CappedBuffer(limit), CappedBuffer(limit)
        so.write(out)
        se.write(err)
        return ExecResult(
            exit_code=TIMEOUT_EXIT if timed_out else code,
            stdout_bytes=so.getvalue(),
            stderr_bytes=se.getvalue(),
            duration_s=time.monotonic() - t0,
            timed_out=timed_out,
            truncated=cut or so.truncated or se.truncated,
            output_limit=limit,
        )

    async def _run(self, script: str, env: dict[str, str], cwd: str, timeout: float) -> tuple[bytes, bytes, int, bool, bool]:
        from connectrpc.client import ConnectClient
        from connectrpc.code import Code
        from connectrpc.errors import ConnectError
        from prime_sandboxes._connectrpc import GOOGLE_PROTOBUF_BINARY_CODEC
        from prime_sandboxes.rpc_command_session import (
            COMMAND_SESSION_START_RPC_METHOD,
            build_command_session_start_request,
            collect_command_session_start_event,
        )

        client = self.endpoint.client
        request = build_command_session_start_request(command=script, working_dir=cwd, env=env)
        reauthed = False
        while True:
            auth = await client._auth_cache.get_or_refresh(self.id)
            base = f"{auth['gateway_url'].rstrip('/')}/{auth['user_ns']}/{auth['job_id']}"
            rpc = ConnectClient(base, codec=GOOGLE_PROTOBUF_BINARY_CODEC, send_compression=None)
            out, err = bytearray(), bytearray()
            code: int | None = None
            truncated = False
            try:
                ms = max(1, math.ceil(timeout * 1000))
                stream = rpc.execute_server_stream(
                    request=request,
                    method=COMMAND_SESSION_START_RPC_METHOD,
                    # `sandgym serve` kills the command at the exec timeout and answers
                    # deadline_exceeded once it is gone; the Connect deadline is later, so
                    # that answer (not our own timer) ends the call. Other servers ignore
                    # the header and allow the command the grace too.
                    headers={
                        "Authorization": f"Bearer {auth['token']}",
                        "x-sandgym-exec-timeout-ms": str(ms),
                        "x-sandgym-truncation": "status",
                    },
                    timeout_ms=ms + _DEADLINE_GRACE_MS,
                )
                async for event in stream:
                    c = collect_command_session_start_event(event, out, err)
                    if c is not None:
                        code = c
                        # `sandgym serve` says in the end event when it cut the output.
                        truncated = "output truncated" in event.event.end.status  # type: ignore[attr-defined]  # prime-sandboxes types the stream as protobuf's base Message
            except ConnectError as e:
                if e.code == Code.UNAUTHENTICATED and not reauthed:
                    reauthed = True
                    await client._auth_cache.invalidate(self.id)
                    continue
                if e.code == Code.DEADLINE_EXCEEDED:
                    return bytes(out), bytes(err), TIMEOUT_EXIT, True, False
                if e.code == Code.NOT_FOUND:
                    raise SandboxGoneError(f"sandbox {self.id} is gone: {e.message}") from e
                if e.code == Code.UNAVAILABLE:  # cut short; the sandbox lives on (sandgym serve: execd restarted)
                    raise SandboxInterruptedError(f"exec in {self.id} was cut short: {e.message}") from e
                raise SandboxError(f"exec in {self.id} failed ({e.code.value}): {e.message}") from e
            finally:
                await rpc.close()
            if code is None:
                raise SandboxError(f"exec in {self.id}: command stream ended without an exit code")
            return bytes(out), bytes(err), code, False, truncated

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._raise_if_closed()
        target = self.resolve(path)
        await self._gateway(self.endpoint.client.upload_bytes(self.id, target, as_bytes(data), os.path.basename(target) or "file"))
        if mode != 0o644:
            await self._check(await self.exec(["chmod", format(mode, "o"), target]), f"chmod {target}")

    async def read_file(self, path: str) -> bytes:
        self._raise_if_closed()
        target = self.resolve(path)
        with tempfile.TemporaryDirectory(prefix="sandgym-prime-") as tmp:
            local = os.path.join(tmp, "f")
            try:
                await self.endpoint.client.download_file(self.id, target, local)
            except Exception as exc:
                if "HTTP 404" in str(exc):
                    raise SandboxFileNotFound(target) from exc
                raise self._translate(exc) from exc
            return await anyio.Path(local).read_bytes()

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        dest = self.resolve(dest_dir)
        tmp = f"/tmp/.sandgym-put-{uuid.uuid4().hex[:12]}.tar"
        await self.write_file(tmp, tar_bytes)
        r = await self.exec(f"mkdir -p {shlex.quote(dest)} && tar -xf {tmp} -C {shlex.quote(dest)}; s=$?; rm -f {tmp}; exit $s")
        await self._check(r, f"extract into {dest}")

    async def get_archive(self, path: str) -> bytes:
        target = self.resolve(path).rstrip("/") or "/"
        parent, name = os.path.split(target)
        tmp = f"/tmp/.sandgym-get-{uuid.uuid4().hex[:12]}.tar"
        r = await self.exec(
            f"test -e {shlex.quote(target)} || exit 3; tar -cf {tmp} -C {shlex.quote(parent or '/')} {shlex.quote(name or '.')}"
        )
        if r.exit_code == 3:
            raise SandboxFileNotFound(target)
        await self._check(r, f"archive {target}")
        try:
            return await self.read_file(tmp)
        finally:
            with contextlib.suppress(Exception):
                await self.exec(["rm", "-f", tmp])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._owner.remove(self.id)

    async def _gateway(self, call: Any) -> Any:
        try:
            return await call
        except Exception as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: BaseException) -> SandboxError:
        from prime_sandboxes import SandboxNotRunningError

        if isinstance(exc, SandboxNotRunningError):
            return SandboxGoneError(str(exc))
        return SandboxError(f"{type(exc).__name__}: {exc}")

    @staticmethod
    async def _check(r: ExecResult, what: str) -> None:
        if r.exit_code != 0:
            raise SandboxError(f"{what} failed (exit {r.exit_code}): {r.stderr.strip()[:500]}")


class PrimeProvider:
    """Sandboxes on one or more prime-sandboxes endpoints (hosted Prime or `sandgym serve`)."""

    name = "prime"

    def __init__(
        self,
        endpoints: Sequence[str] | str | None = None,
        api_key: str | None = None,
        *,
        create_attempts: int = 60,
        state_dir: str | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [u for u in endpoints.split(",") if u.strip()]
        urls: list[str | None] = list(endpoints or default_endpoints()) or [None]
        self.endpoints = [_Endpoint(u, api_key, state_dir) for u in urls]
        self.create_attempts = create_attempts
        self._rr = itertools.count()
        self._where: dict[str, _Endpoint] = {}

    def check(self, spec: SandboxSpec) -> None:
        # The endpoint validates image, resources and GPUs itself (422 / ERROR) at create.
        prime_network(spec.egress)

    def _pick(self) -> _Endpoint:
        n = len(self.endpoints)
        start = next(self._rr) % n
        order = self.endpoints[start:] + self.endpoints[:start]
        return min(order, key=lambda e: len(e.live))

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> PrimeSandbox:
        from prime_sandboxes import CreateSandboxRequest

        ep = self._pick()
        all_labels = {**spec.labels, **labels}
        req = CreateSandboxRequest(
            name=f"sandgym-{uuid.uuid4().hex[:8]}",
            docker_image=spec.image,
            cpu_cores=spec.cpu,
            memory_gb=spec.memory_mb / 1024,
            disk_size_gb=spec.disk_mb / 1024,
            gpu_count=spec.gpus,
            gpu_type="any" if spec.gpus else None,
            timeout_minutes=max(1, math.ceil(spec.ttl_s / 60)) if spec.ttl_s else -1,
            environment_vars=dict(spec.env) or None,
            labels=_labels_to_prime(all_labels),
            # egress=None sends no network fields: the endpoint's default applies, which is
            # no network on `sandgym serve` (an operator may set another default there).
            **(prime_network(spec.egress) if spec.egress is not None else {}),
        )
        try:
            made = await ep.client.create(req)
        except Exception as exc:
            raise SandboxCreateError(f"create on {ep.url} failed: {exc}") from exc
        ep.live.add(made.id)
        self._where[made.id] = ep
        sb = PrimeSandbox(self, ep, made.id, spec)
        try:
            await ep.client.wait_for_creation(made.id, max_attempts=self.create_attempts)
            r = await sb.exec(["mkdir", "-p", spec.workdir], cwd="/")
            if r.exit_code != 0:
                raise SandboxCreateError(f"workdir {spec.workdir}: {r.stderr.strip()}")
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self.remove(made.id)
            if isinstance(exc, SandboxCreateError) or not isinstance(exc, Exception):
                raise
            raise SandboxCreateError(f"sandbox {made.id} on {ep.url} did not start: {exc}") from exc
        return sb

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        out: list[SandboxInfo] = []
        want = _labels_to_prime(labels or {})
        for ep in self.endpoints:
            page = 1
            while True:
                resp = await ep.client.list(labels=want or None, page=page, per_page=_PAGE, exclude_terminated=True)
                for s in resp.sandboxes:
                    lab = _labels_from_prime(s.labels)
                    if "sandgym.owner" not in lab or s.status in ("TERMINATED", "ERROR", "TIMEOUT"):
                        continue
                    out.append(
                        SandboxInfo(
                            id=s.id,
                            provider=self.name,
                            image=s.docker_image,
                            status=s.status.lower(),
                            labels=lab,
                            created_at=s.created_at.timestamp(),
                        )
                    )
                if not resp.has_next:
                    break
                page += 1
        return out

    async def remove(self, sandbox_id: str) -> None:
        ep = self._where.get(sandbox_id)
        targets = [ep] if ep is not None else self.endpoints
        for e in targets:
            try:
                await e.client.delete(sandbox_id)
            except Exception as exc:
                if not _is_not_found(exc):
                    raise SandboxError(f"delete {sandbox_id} on {e.url} failed: {exc}") from exc
            finally:
                e.live.discard(sandbox_id)
        self._where.pop(sandbox_id, None)

    async def aclose(self) -> None:
        for ep in self.endpoints:
            with contextlib.suppress(Exception):
                await ep.client.aclose()

    def load(self) -> dict[str, int]:
        """Live sandboxes this provider made, per endpoint."""
        return {e.url: len(e.live) for e in self.endpoints}



def prime_network(policy: EgressPolicy | None) -> dict[str, list[str] | None]:
    """An EgressPolicy as Prime's create fields: exactly one of an allow-list (nothing: [])
    or a deny-list (anything but these; [] = unrestricted). SpecError when it needs both."""
    if policy is None:
        return {"network_allowlist": [], "network_denylist": None}
    anything = "*" in policy.allow
    if anything:
        return {"network_allowlist": None, "network_denylist": list(policy.deny)}
    if policy.deny:
        raise SpecError(
            "egress: Prime takes an allow-list or a deny-list, not both; use allow=['*'] with a deny-list, "
            "or an allow-list alone"
        )
    return {"network_allowlist": list(policy.allow), "network_denylist": None}
