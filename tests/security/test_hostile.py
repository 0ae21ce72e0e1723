"""Every hostile program of the corpus through every provider that claims isolation.

For each (provider, program): run it in a fresh sandbox with small limits, assert its
contained outcome, close the sandbox, then assert that the host is unaffected (its marker
process alive, its loopback listeners unreached and still serving, its secret file intact),
that the sandbox is gone (from the provider's list, and for docker-backed ones from the
engine) with no process of it left on the host, and that the next sandbox starts clean: the
next program's sandbox, which looks for every earlier one's traces before it runs anything
(files are run whole by one worker: `--dist loadfile`), or for the last program of a provider
in the run a sandbox of its own.

Providers: docker (the engine, profile strict), docker-vm (profile vm: root with a writable
root under gVisor; programs whose outcome differs there say so in `Hostile.vm`), local (only
where bubblewrap works: plain mode claims no isolation), prime (our `sandgym serve` on
127.0.0.1 in front of docker).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from sandgym.sandboxes import Provider, SandboxSpec, get_provider
from sandgym.sandboxes.errors import SandboxGoneError, SandboxInterruptedError
from sandgym.sandboxes.ownership import owner_labels
from tests.conftest import require

from .conftest import HostWitness, host_pids_with
from .corpus import CORPUS, DISK_MB, MEMORY_MB, OUTPUT_LIMIT, PIDS, Hostile

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

SPEC = SandboxSpec(
    memory_mb=MEMORY_MB, disk_mb=DISK_MB, pids=PIDS, cpu=1.0, exec_timeout_s=30, output_limit_bytes=OUTPUT_LIMIT
)
VM_SPEC = SPEC.model_copy(update={"profile": "vm"})
PROVIDERS = ("docker", "docker-vm", "local", "prime")
# Per provider, the sandboxes closed so far in this process and the programs they ran: a new
# sandbox must see none of their traces.
CLOSED: dict[str, list[tuple[str, str]]] = {}


@pytest.fixture(scope="module")
def prime_server() -> Iterator[Any]:
    require("docker")  # prime here runs in front of docker
    from sandgym.platform.testing import serve_in_thread

    token = "sec-" + secrets.token_hex(8)
    with serve_in_thread([token], "docker", max_sandboxes=4, quota=4) as srv:
        srv.token = token  # type: ignore[attr-defined]
        yield srv


@pytest.fixture
async def iso_provider(request: pytest.FixtureRequest) -> AsyncIterator[Provider]:
    name = request.param
    if name == "docker":
        require("docker")
        p: Provider = get_provider("docker")
    elif name == "docker-vm":
        require("docker", "vm")
        p = get_provider("docker")
        p.variant = "docker-vm"  # type: ignore[attr-defined]
    elif name == "local":
        from sandgym.sandboxes.providers.local import LocalProvider

        require("bwrap")  # without it the local provider claims no isolation
        p = LocalProvider()
    else:
        from sandgym.sandboxes.providers.prime import PrimeProvider

        srv = request.getfixturevalue("prime_server")
        state = str(request.getfixturevalue("tmp_path"))
        p = PrimeProvider(endpoints=[srv.url], api_key=srv.token, state_dir=state)
    try:
        yield p
    finally:
        await p.aclose()


def _engine_ids(label: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        # The low-level call: containers.list() inspects each one and races its removal.
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]
    finally:
        client.close()


async def _eventually(pred: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        ok = await pred() if callable(pred) else pred
        if ok:
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.2)


async def _gone(provider: Provider, sandbox_id: str, labels: dict[str, str]) -> bool:
    if any(i.id == sandbox_id for i in await provider.list(labels)):
        return False
    if provider.name == "docker":
        return not await anyio.to_thread.run_sync(_engine_ids, f"sandgym.owner={labels['sandgym.owner']}")
    if provider.name == "prime":  # the platform's container behind it
        return not await anyio.to_thread.run_sync(_engine_ids, f"platform.id={sandbox_id}")
    return True


def _check_outcome(prog: Hostile, provider: str, res: Any, values: dict[str, str]) -> None:
    vm = provider == "docker-vm"
    provider = "docker" if vm else provider
    out = res.stdout + "\n" + res.stderr
    for f in prog.forbidden:
        f = f.replace("{SECRET}", values["SECRET"])
        assert f not in out, f"{provider}/{prog.name}: {f!r} in output:\n{out[-3000:]}"
    for r in prog.required:
        assert r in res.stdout, f"{provider}/{prog.name}: {r!r} missing from stdout:\n{out[-3000:]}"
    if prog.outcome == "timed_out":
        assert res.timed_out and res.exit_code == 124, (res, out[-2000:])
    elif prog.outcome == "oom_or_failed":
        assert res.exit_code != 0 and not res.timed_out, (res, out[-2000:])
        if vm:  # gVisor's kernel refuses the memory itself (MemoryError, bash's own error) or
            return  # the whole sandbox is OOM-killed (SandboxGoneError, checked by the caller)
        if provider == "docker" or res.exit_code == 137:  # the memory cgroup's verdict is reported
            # (prime: the SDK's wire format has no OOM flag, so only the 137 comes through)
            assert res.exit_code == 137 and (res.oom_killed or provider == "prime"), res
    elif prog.outcome == "truncated":
        assert res.truncated, res
        assert len(res.stdout_bytes) <= OUTPUT_LIMIT and len(res.stderr_bytes) <= OUTPUT_LIMIT, res
    elif prog.outcome == "ok":
        assert res.exit_code == 0, (res, out[-2000:])


async def _assert_clean(sb: Any, spec: SandboxSpec, name: str) -> None:
    """`sb`, new, sees nothing of the sandboxes of `name` closed before it."""
    res = await sb.exec(f"ls -A {spec.workdir} /tmp; ps -eo args 2>/dev/null || ls /proc")
    assert res.exit_code == 0, res
    seen = [prog for sbx, prog in CLOSED.get(name, []) if sbx in res.stdout]
    assert not seen, f"{name}: a new sandbox sees the traces that {seen} left:\n{res.stdout}"


def _checked_later(request: pytest.FixtureRequest, name: str) -> bool:
    """Whether a later test of this module, in this process, opens a sandbox of `name`
    (whose first step is `_assert_clean`)."""
    items = [i for i in request.session.items if i.module is request.node.module]
    later = items[items.index(request.node) + 1 :]
    return any(getattr(i, "callspec", None) is not None and i.callspec.params.get("iso_provider") == name for i in later)


def _base(provider: str) -> str:
    """The provider a PROVIDERS entry is (docker-vm is docker with the vm profile)."""
    return "docker" if provider == "docker-vm" else provider


# Each program on the providers it is written for.
@pytest.mark.parametrize(
    "iso_provider,prog",
    [pytest.param(n, p, id=f"{n}-{p.name}") for n in PROVIDERS for p in CORPUS if _base(n) in p.providers],
    indirect=["iso_provider"],
)
async def test_hostile_program_is_contained(
    iso_provider: Provider, prog: Hostile, host_witness: HostWitness, request: pytest.FixtureRequest
) -> None:
    name = getattr(iso_provider, "variant", iso_provider.name)
    spec = VM_SPEC if name == "docker-vm" else SPEC
    if name == "docker-vm":
        prog = prog.for_vm()
    if name in prog.known_gaps:
        request.applymarker(pytest.mark.xfail(reason=prog.known_gaps[name], strict=True))
    sbx = "sbx" + secrets.token_hex(6)
    values = {
        "SBX": sbx,
        "SBX_SHORT": sbx[-6:],
        "HOSTMARK_A": host_witness.marker[:10],
        "HOSTMARK_B": host_witness.marker[10:],
        "SECRET_PATH": str(host_witness.secret_path),
        "SECRET": host_witness.secret,
        "TCP_PORT": str(host_witness.tcp_port),
        "UDP_PORT": str(host_witness.udp_port),
    }
    assert not spec.network  # the corpus's one non-loopback connect() relies on this
    labels = owner_labels("sec-" + sbx)
    sb = await iso_provider.create(spec, labels)
    try:
        await _assert_clean(sb, spec, name)
        # A trace the next sandbox must not see.
        seed = await sb.exec(f"echo {sbx} > {spec.workdir}/.trace-{sbx} && echo {sbx} > /tmp/.trace-{sbx}")
        assert seed.exit_code == 0, seed
        script = prog.render(**values)
        try:
            res = await sb.exec(script, timeout=prog.timeout)
        except SandboxGoneError as exc:
            oom_kill = name == "docker-vm" and prog.outcome == "oom_or_failed" and exc.reason == "OOM_KILLED"
            assert prog.gone_ok or oom_kill, f"{name}/{prog.name}: the sandbox died ({exc.reason}): {exc}"
        except SandboxInterruptedError as exc:  # it killed its execd, which was started again
            assert prog.gone_ok, f"{name}/{prog.name}: {exc}"
            after = await sb.exec("echo alive", timeout=30)
            assert after.exit_code == 0 and after.stdout.strip() == "alive", after
        else:
            _check_outcome(prog, name, res, values)
            if prog.gone_ok:  # still there or reported gone; never a hang or another error
                try:
                    after = await sb.exec("echo alive", timeout=10)
                except SandboxGoneError:
                    pass
                else:  # a dead sandbox must say so (SandboxGoneError), not fail oddly
                    assert after.exit_code == 0 and after.stdout.strip() == "alive", after
            elif prog.name not in ("fork_bomb",):  # the box keeps working after the attack
                again = await sb.exec("echo alive", timeout=30)
                assert again.stdout.strip() == "alive", (name, prog.name, again)
    finally:
        with anyio.CancelScope(shield=True):
            await sb.close()
        CLOSED.setdefault(name, []).append((sbx, prog.name))

    # The sandbox is gone, nothing of it runs on the host, the host is unaffected.
    assert await _eventually(lambda: _gone(iso_provider, sb.id, labels)), f"{name}: {sb.id} still exists after close"

    async def no_leftovers() -> bool:
        return not host_pids_with(sbx)

    assert await _eventually(no_leftovers), f"{name}/{prog.name}: processes left on the host: {host_pids_with(sbx)}"
    host_witness.assert_unaffected()

    # The next sandbox starts clean: the next program's, or this one.
    if _checked_later(request, name):
        return
    nxt = await iso_provider.create(spec, labels)
    try:
        await _assert_clean(nxt, spec, name)
    finally:
        with anyio.CancelScope(shield=True):
            await nxt.close()
    assert await _eventually(lambda: _gone(iso_provider, nxt.id, labels))


def test_corpus_is_well_formed() -> None:
    names = [p.name for p in CORPUS]
    assert len(names) == len(set(names))
    for p in CORPUS:
        # Programs that leave processes must mark them, or the leftover check sees nothing.
        assert not p.leaves_processes or "{SBX}" in p.script, p.name
        assert p.forbidden or p.outcome != "any" or p.gone_ok or p.required, f"{p.name} asserts nothing"
