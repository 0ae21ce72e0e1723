"""The one way a provider's contract test asserts a check: it passes, or -- only where the
sandbox runs as root (the vm profile), which the check reports -- it does not apply."""

from __future__ import annotations

from sandgym.sandboxes import Provider, SandboxSpec
from sandgym.sandboxes.contract import Check, run_check, run_contract


def runs_as_root(spec: SandboxSpec) -> bool:
    return spec.profile == "vm" and spec.user in (None, "root")


async def assert_passes(check: Check, provider: Provider, spec: SandboxSpec) -> None:
    result = await run_check(check, provider, spec)
    assert result.ok, f"{check.name}: {result.message}"
    if not result.applicable:
        assert runs_as_root(spec) and "root" in result.message, f"{check.name} did not apply: {result.message}"


async def assert_contract(provider: Provider, spec: SandboxSpec, concurrency: int = 6) -> None:
    """Every check, several at once (each has sandboxes of its own): one test per provider
    keeps the suite's time down; the failures are listed by name with their messages."""
    report = await run_contract(provider, spec, concurrency=concurrency)
    failed = [f"{r.name}: {r.message}" for r in report.results if not r.ok]
    assert not failed, "\n".join(failed)
    for r in report.not_applicable:
        assert runs_as_root(spec) and "root" in r.message, f"{r.name} did not apply: {r.message}"
    print(report.summary())
