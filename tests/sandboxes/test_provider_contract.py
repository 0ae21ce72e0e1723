"""The provider contract (sandgym.sandboxes.contract) on the local provider, and the checks
themselves: they fail a broken provider, and a check that raises is a failure. docker (strict
and vm), prime and ray run the same checks in test_contract_<provider>.py, one module each so
that workers share them out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from sandgym.sandboxes import ExecResult, Provider, Sandbox, SandboxInfo, SandboxSpec
from sandgym.sandboxes.contract import CHECKS, DEFAULT_SPEC, Check, run_contract
from sandgym.sandboxes.providers.local import LocalProvider
from tests.sandboxes.contract_cases import assert_passes

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def local() -> AsyncIterator[LocalProvider]:
    p = LocalProvider()
    try:
        yield p
    finally:
        await p.aclose()


def test_the_contract_is_broad() -> None:
    assert len(CHECKS) >= 35


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
async def test_local(local: LocalProvider, check: Check) -> None:
    await assert_passes(check, local, DEFAULT_SPEC)


# ---- the checks can fail -------------------------------------------------------------------


class _Careless(Sandbox):
    """A real local sandbox whose exec drops stderr, as a buggy transport might."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner, self.id, self.spec, self.provider = inner, inner.id, inner.spec, "careless"

    async def exec(self, cmd, **kw) -> ExecResult:  # type: ignore[no-untyped-def, override]
        res = await self.inner.exec(cmd, **kw)
        return res.model_copy(update={"stderr_bytes": b""})

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        await self.inner.write_file(path, data, mode)

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        await self.inner.put_archive(dest_dir, tar_bytes)

    async def get_archive(self, path: str) -> bytes:
        return await self.inner.get_archive(path)

    async def close(self) -> None:
        await self.inner.close()


class _CarelessProvider:
    """The local provider with two bugs: stderr lost, and `list()` that sees nothing."""

    name = "careless"

    def __init__(self, inner: LocalProvider) -> None:
        self.inner = inner

    def check(self, spec: SandboxSpec) -> None:
        self.inner.check(spec)

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> Sandbox:
        return _Careless(await self.inner.create(spec, labels))

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return []

    async def remove(self, sandbox_id: str) -> None:
        await self.inner.remove(sandbox_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_broken_provider_fails_the_checks_it_breaks() -> None:
    provider = _CarelessProvider(LocalProvider())
    assert isinstance(provider, Provider)
    report = await run_contract(provider)
    failed = {r.name: r.message for r in report.failures}
    # (the shell live process still sees stderr: its poll reads the stderr file over stdout)
    lost_stderr = {"exec_stdout_stderr_exit_code", "stderr_is_capped_too", "concurrent_execs", "exec_python_runs_like_python3"}
    blind_list = {"not_root_and_listed_with_labels", "list_filters_by_labels"}
    assert set(failed) == lost_stderr | blind_list, report.table()
    assert "'err\\n'" in failed["exec_stdout_stderr_exit_code"]
    assert "stderr kept 0" in failed["stderr_is_capped_too"]
    assert "does not show sandbox" in failed["not_root_and_listed_with_labels"]
    assert "list(its label) gave []" in failed["list_filters_by_labels"]
    assert not report.ok and len(report.results) == len(CHECKS)
    assert "expected (7, \"['-'] True c True True\\n\", 'err\\n')" in failed["exec_python_runs_like_python3"]
    assert f"careless: {len(CHECKS) - 6}/{len(CHECKS)} checks passed" in report.table()


async def test_a_check_that_raises_is_a_failure_not_a_crash() -> None:
    class Unreachable:
        name = "unreachable"

        def check(self, spec: SandboxSpec) -> None: ...

        async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> Sandbox:
            raise ConnectionRefusedError("no engine at 127.0.0.1:9")

        async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
            return []

        async def remove(self, sandbox_id: str) -> None: ...

        async def aclose(self) -> None: ...

    report = await run_contract(Unreachable(), only=["exec_stdout_stderr_exit_code", "live_process"])
    assert [r.name for r in report.results] == ["exec_stdout_stderr_exit_code", "live_process"]
    assert all(not r.ok and r.message == "raised ConnectionRefusedError: no engine at 127.0.0.1:9" for r in report.results)
    with pytest.raises(ValueError, match="unknown check"):
        await run_contract(Unreachable(), only=["no_such_check"])


def test_checks_have_unique_names() -> None:
    names: Sequence[str] = [c.name for c in CHECKS]
    assert len(set(names)) == len(names), names
