"""The provider contract: what every sandbox provider promises, as checks a provider runs on
itself (docker, local and prime pass them in tests/sandboxes/test_provider_contract.py).

A third-party provider (any object with the `Provider` protocol of base.py) checks itself:

    import anyio
    from sandgym.sandboxes.contract import run_contract

    async def main() -> None:
        provider = MyProvider(...)
        try:
            report = await run_contract(provider)  # or run_contract(provider, spec, only=[...])
        finally:
            await provider.aclose()
        print(report.table())
        assert report.ok, report.failures

    anyio.run(main)

or, in its own pytest suite, one test per check:

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
    async def test_contract(check: Check) -> None:
        result = await run_check(check, MyProvider(), DEFAULT_SPEC)
        assert result.ok, result.message

A provider registered in registry.py runs it from the command line:
`sandgym sandbox check --provider NAME` (exit status 1 when a check fails).

Each check creates its own sandboxes from `spec` (with owner labels of a fresh run id),
closes them whatever happens, and either passes or fails with a message saying what was
expected and what came back. A check that raises (the provider crashed, create failed)
fails with the exception. Checks run one after another; a failure does not stop the run.
The sandbox image must have bash, python3 and coreutils (sandgym/python does).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from .base import Provider, Sandbox
from .errors import SandboxFileNotFound
from .live import LiveProcess
from .ownership import new_run_id, owner_labels
from .result import TIMEOUT_EXIT
from .spec import LABEL_OWNER, SandboxSpec

DEFAULT_SPEC = SandboxSpec(memory_mb=512, disk_mb=256, output_limit_bytes=64 * 1024, exec_timeout_s=30)


class ContractViolation(Exception):
    """A provider did not do what the contract says."""


def expect(condition: object, message: str) -> None:
    """Fail the running check with `message` unless `condition` holds (not `assert`: the
    checks must fail under `python -O` too)."""
    if not condition:
        raise ContractViolation(message)


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    run: Callable[[Provider, SandboxSpec], Awaitable[None]]


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str
    duration_s: float


@dataclass
class ContractReport:
    provider: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def table(self) -> str:
        """A plain-text table, one row per check."""
        width = max([len(r.name) for r in self.results] + [5])
        lines = [f"{'check':<{width}}  result  time      message"]
        for r in self.results:
            lines.append(f"{r.name:<{width}}  {'pass' if r.ok else 'FAIL':<6}  {r.duration_s:6.2f}s  {r.message}")
        passed = sum(r.ok for r in self.results)
        lines.append(f"{self.provider}: {passed}/{len(self.results)} checks passed")
        return "\n".join(lines)


@asynccontextmanager
async def _sandbox(provider: Provider, spec: SandboxSpec) -> AsyncIterator[Sandbox]:
    sb = await provider.create(spec, owner_labels(new_run_id()))
    try:
        yield sb
    finally:
        with anyio.CancelScope(shield=True):
            await sb.close()


# ---- the checks --------------------------------------------------------------------------


async def exec_stdout_stderr_exit_code(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec("echo out; echo err >&2; exit 3")
        got = (r.exit_code, r.stdout, r.stderr)
        expect(got == (3, "out\n", "err\n"), f"(exit, stdout, stderr) = {got!r}, expected (3, 'out\\n', 'err\\n')")
        expect(not r.timed_out and not r.truncated and r.duration_s >= 0,
               f"timed_out={r.timed_out} truncated={r.truncated} duration_s={r.duration_s} for a quick command")
        argv = await sb.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"])
        expect(argv.stdout.strip() == "['a b', 'c']",
               f"an argv list reached the program as {argv.stdout.strip()!r}, expected ['a b', 'c'] ({argv.stderr.strip()})")


async def env_cwd_and_stdin(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec.model_copy(update={"env": {**spec.env, "FROM_SPEC": "s"}})) as sb:
        await sb.exec("mkdir -p sub")
        r = await sb.exec('echo "$FROM_SPEC $FROM_CALL"; pwd', env={"FROM_CALL": "c"}, cwd="sub")
        lines = r.stdout.splitlines()
        expect(len(lines) == 2, f"expected two lines, got {r.stdout!r} (stderr {r.stderr.strip()!r})")
        expect(lines[0] == "s c", f"spec env + call env gave {lines[0]!r}, expected 's c'")
        expect(lines[1].endswith("/sub"), f"cwd='sub' ran in {lines[1]!r}, expected the workdir's sub/")
        r = await sb.exec("tr a-z A-Z", stdin="hello sandbox\n")
        expect(r.stdout == "HELLO SANDBOX\n", f"stdin round trip gave {r.stdout!r}")


async def timeout_kills_children(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        t0 = time.monotonic()
        r = await sb.exec("sleep 100 & sleep 100; echo never", timeout=2)
        elapsed = time.monotonic() - t0
        expect(r.timed_out and r.exit_code == TIMEOUT_EXIT,
               f"timed_out={r.timed_out} exit_code={r.exit_code}, expected True and {TIMEOUT_EXIT}")
        expect("never" not in r.stdout, "the command went on past its timeout")
        expect(elapsed < 10, f"a 2 s timeout took {elapsed:.1f} s to come back")
        left = await sb.exec("ps -eo args | grep -c '^sleep 100' || true")
        expect(left.stdout.strip() == "0", f"{left.stdout.strip()} children of the timed-out command survived")


async def output_is_capped_and_binary_survives(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        limit = spec.output_limit_bytes
        r = await sb.exec(f"head -c {max(10_000_000, 2 * limit)} /dev/zero | tr '\\0' x")
        expect(r.truncated and r.exit_code == 0, f"truncated={r.truncated} exit_code={r.exit_code}, expected True and 0")
        expect(len(r.stdout_bytes) == limit, f"kept {len(r.stdout_bytes)} bytes of stdout, expected the limit {limit}")
        blob = bytes(range(256)) * 16 + b"\xff\xfe\x00\x80"
        await sb.write_file("blob.bin", blob)
        r = await sb.exec("cat blob.bin")
        expect(r.stdout_bytes == blob, f"binary stdout changed on the way ({len(r.stdout_bytes)} of {len(blob)} bytes)")
        expect(isinstance(r.stdout, str), "the text view of binary output must be a str")  # lenient, never raises
        expect(await sb.read_file("blob.bin") == blob, "read_file changed binary content")


async def files_and_directories(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("a/b/c.txt", "hello\n")
        cat = (await sb.exec("cat a/b/c.txt")).stdout
        expect(cat == "hello\n", f"a written file reads back as {cat!r} inside")
        got = await sb.read_file(f"{spec.workdir}/a/b/c.txt")
        expect(got == b"hello\n", f"read_file by absolute path gave {got!r}")
        await sb.exec("echo changed > a/b/c.txt")  # the sandbox user owns written files
        got = await sb.read_file("a/b/c.txt")
        expect(got == b"changed\n", f"the sandbox user could not overwrite a written file (read {got!r})")
        try:
            await sb.read_file("does/not/exist")
        except SandboxFileNotFound:
            pass
        else:
            raise ContractViolation("read_file of a missing file did not raise SandboxFileNotFound")

        with tempfile.TemporaryDirectory(prefix="sandgym-contract-") as tmp:
            src = Path(tmp) / "src"
            (src / "pkg").mkdir(parents=True)
            (src / "pkg" / "mod.py").write_text("X = 1\n")
            (src / "top.bin").write_bytes(os.urandom(1000))
            await sb.upload(src, "proj")
            r = await sb.exec("cd proj && python3 -c 'import pkg.mod as m; print(m.X)'")
            expect(r.stdout.strip() == "1", f"an uploaded package did not import: {r.stderr.strip()}")
            await sb.exec("echo new > proj/made_inside.txt")
            out = await sb.download("proj", Path(tmp) / "back")
            expect((out / "pkg" / "mod.py").read_text() == "X = 1\n", "a downloaded text file changed")
            expect((out / "top.bin").read_bytes() == (src / "top.bin").read_bytes(), "a downloaded binary file changed")
            expect((out / "made_inside.txt").read_text() == "new\n", "a file made inside did not download")


async def not_root_and_listed_with_labels(provider: Provider, spec: SandboxSpec) -> None:
    labels = owner_labels(new_run_id())
    sb = await provider.create(spec, labels)
    try:
        uid = (await sb.exec("id -u")).stdout.strip()
        expect(uid.isdigit() and uid != "0", f"commands run as uid {uid!r}, expected a non-root uid")
        mine = [i for i in await provider.list() if i.id == sb.id]
        expect(mine, f"list() does not show sandbox {sb.id}")
        expect(mine[0].labels.get(LABEL_OWNER) == labels[LABEL_OWNER],
               f"list() shows owner {mine[0].labels.get(LABEL_OWNER)!r}, expected {labels[LABEL_OWNER]!r}")
        expect(mine[0].pid == os.getpid(), f"list() shows owner pid {mine[0].pid}, expected {os.getpid()}")
    finally:
        with anyio.CancelScope(shield=True):
            await sb.close()
    await sb.close()  # idempotent
    expect(sb.id not in {i.id for i in await provider.list()}, f"sandbox {sb.id} is still listed after close()")
    await provider.remove(sb.id)  # removing what is gone is fine


async def live_process(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        proc: LiveProcess = await sb.start_live(
            ["/bin/bash", "-c", 'echo "ready $X"; read l; echo "got:$l"; echo to-err >&2; exit 3'],
            env={"X": "x"},
        )
        try:
            expect(proc.pid > 0, f"a started live process has pid {proc.pid}")
            await proc.write_stdin(b"line\n")
            out, err, code = b"", b"", None
            with anyio.fail_after(60):
                async for kind, value in proc.events():
                    if kind == "exit":
                        code = value
                        break
                    if not isinstance(value, bytes):
                        raise ContractViolation(f"a {kind} event carries bytes, got {value!r}")
                    if kind == "stdout":
                        out += value
                    else:
                        err += value
            expect((out, err, code) == (b"ready x\ngot:line\n", b"to-err\n", 3),
                   f"(stdout, stderr, exit) = {(out, err, code)!r}, expected (b'ready x\\ngot:line\\n', b'to-err\\n', 3)")
        finally:
            with anyio.CancelScope(shield=True):
                await proc.cleanup()


CHECKS: tuple[Check, ...] = (
    Check("exec_stdout_stderr_exit_code", "stdout, stderr and exit code come back apart; argv lists stay intact",
          exec_stdout_stderr_exit_code),
    Check("env_cwd_and_stdin", "spec and call env merge; cwd is relative to the workdir; stdin reaches the command",
          env_cwd_and_stdin),
    Check("timeout_kills_children", "a timeout reports 124 promptly and kills the command's children",
          timeout_kills_children),
    Check("output_is_capped_and_binary_survives", "output is capped at the spec's limit; binary bytes survive",
          output_is_capped_and_binary_survives),
    Check("files_and_directories", "write/read files, missing files, upload and download of directories",
          files_and_directories),
    Check("not_root_and_listed_with_labels", "not root; list() shows the owner labels; close() is idempotent",
          not_root_and_listed_with_labels),
    Check("live_process", "start_live: output as it comes, stdin, exit code", live_process),
)


async def run_check(check: Check, provider: Provider, spec: SandboxSpec = DEFAULT_SPEC) -> CheckResult:
    t0 = time.monotonic()
    try:
        await check.run(provider, spec)
    except ContractViolation as exc:
        return CheckResult(check.name, False, str(exc), time.monotonic() - t0)
    except Exception as exc:
        return CheckResult(check.name, False, f"raised {type(exc).__name__}: {exc}", time.monotonic() - t0)
    return CheckResult(check.name, True, "", time.monotonic() - t0)


async def run_contract(
    provider: Provider, spec: SandboxSpec = DEFAULT_SPEC, *, only: Sequence[str] | None = None
) -> ContractReport:
    """Run the checks (all, or those named in `only`) against `provider`, one after another."""
    known = {c.name: c for c in CHECKS}
    unknown = [n for n in only or () if n not in known]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; known: {', '.join(known)}")
    report = ContractReport(provider=getattr(provider, "name", type(provider).__name__))
    for check in CHECKS:
        if only is None or check.name in only:
            report.results.append(await run_check(check, provider, spec))
    return report
