"""The provider contract: what every sandbox provider promises, as checks a provider runs on
itself (docker, local, prime and ray pass them in tests/sandboxes/test_contract_*.py and
test_provider_contract.py).

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

Any provider the registry finds -- a built-in name, an installed entry point, or a class by
dotted path -- runs it from the command line (exit status 1 when a check fails):
`sandgym sandbox check --provider mypkg.sandboxes:MyProvider`.

The checks are narrow, one behaviour each, in the spirit of inspect_ai's sandbox self-check:
exit codes (127 for a missing program, 126, 128+N for a signal, 124 for a timeout; none of
them a raise), output caps on stdout and stderr, large and binary stdin, unicode, argv
quoting, env and cwd, concurrency, files (directories, missing parents, permissions, modes,
odd names, 8 MB), archives, and the lifecycle (after close, after remove, list by labels).
The errors they expect are those base.Sandbox documents. A check that cannot apply to a
sandbox (reading what one may not, where it runs as root under the vm profile) reports
"n/a" with the reason (`CheckResult.applicable`), counted apart, never silently.

Each check creates its own sandboxes from `spec` (with owner labels of a fresh run id),
closes them whatever happens, and either passes or fails with a message saying what was
expected and what came back. A check that raises (the provider crashed, create failed)
fails with the exception. Checks run one after another; a failure does not stop the run.
The sandbox image must have bash, python3 and coreutils (sandgym/python does).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from .base import ExecJob, Provider, Sandbox
from .errors import SandboxError, SandboxFileNotFound, SandboxGoneError
from .live import LiveProcess
from .ownership import new_run_id, owner_labels
from .result import TIMEOUT_EXIT, ExecResult
from .spec import LABEL_OWNER, SandboxSpec

DEFAULT_SPEC = SandboxSpec(memory_mb=512, disk_mb=256, output_limit_bytes=64 * 1024, exec_timeout_s=30)


class ContractViolation(Exception):
    """A provider did not do what the contract says."""


class NotApplicable(Exception):
    """The check does not apply to this sandbox, for the reason given (e.g. it runs as root
    under the vm profile, so nothing is out of its reach). Reported, never silent."""


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
    applicable: bool = True  # False: ok, and `message` says why the check does not apply


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

    @property
    def not_applicable(self) -> list[CheckResult]:
        return [r for r in self.results if not r.applicable]

    def summary(self) -> str:
        """`docker: 40/40 checks passed`, with those that did not apply counted apart."""
        passed = sum(r.ok and r.applicable for r in self.results)
        applicable = sum(r.applicable for r in self.results)
        na = f" ({len(self.not_applicable)} not applicable)" if self.not_applicable else ""
        return f"{self.provider}: {passed}/{applicable} checks passed{na}"

    def table(self) -> str:
        """A plain-text table, one row per check."""
        width = max([len(r.name) for r in self.results] + [5])
        lines = [f"{'check':<{width}}  result  time      message"]
        for r in self.results:
            verdict = "n/a" if not r.applicable else "pass" if r.ok else "FAIL"
            lines.append(f"{r.name:<{width}}  {verdict:<6}  {r.duration_s:6.2f}s  {r.message}")
        lines.append(self.summary())
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


async def exec_python_runs_like_python3(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.exec("mkdir -p sub")
        prog = (
            "import os, sys\n"
            "print(sys.argv, sys.path[0] == '', os.environ.get('FROM_CALL'), os.getcwd().endswith('/sub'), sys.stdin.read() == '')\n"
            "print('err', file=sys.stderr)\n"
            "sys.exit(7)\n"
        )
        r = await sb.exec_python(prog, env={"FROM_CALL": "c"}, cwd="sub", cpu_limit_s=5)
        got = (r.exit_code, r.stdout, r.stderr)
        want = (7, "['-'] True c True True\n", "err\n")
        expect(got == want, f"exec_python gave (exit, stdout, stderr) = {got!r}, expected {want!r} (as `python3 -` would)")
        # Without cwd it runs where exec does (the workdir), so it imports the files there.
        await sb.write_file("contract_mod.py", "VALUE = 'workdir'\n")
        pwd = (await sb.exec("pwd")).stdout.strip()
        r = await sb.exec_python("import os, contract_mod\nprint(os.getcwd(), contract_mod.VALUE)\n")
        expect((r.exit_code, r.stdout) == (0, f"{pwd} workdir\n"),
               f"exec_python without cwd gave exit {r.exit_code}, {r.stdout!r} (stderr {r.stderr.strip()[-200:]!r}), "
               f"expected to run in exec's {pwd!r} and import its contract_mod.py")
        r = await sb.exec_python("def f():\n    raise ValueError('boom')\nf()\n")
        lines = r.stderr.splitlines()
        expect(r.exit_code == 1 and lines[:1] == ["Traceback (most recent call last):"] and lines[-1:] == ["ValueError: boom"]
               and '  File "<stdin>", line 3, in <module>' in lines,
               f"an uncaught exception gave exit {r.exit_code} and stderr {r.stderr!r}, expected 1 and python3's traceback of <stdin>")


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
        if spec.profile == "vm" and spec.user in (None, "root"):  # what Prime/E2B users expect
            expect(uid == "0", f"commands run as uid {uid!r}; the vm profile runs as root")
        else:
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



# ---- narrow checks: one behaviour each -----------------------------------------------------


async def _raises(what: str, call: Awaitable[object], *errors: type[BaseException]) -> BaseException:
    """Await `call`, which must raise one of `errors`; return the exception."""
    try:
        await call
    except errors as exc:
        return exc
    except Exception as exc:
        raise ContractViolation(
            f"{what} raised {type(exc).__name__}: {exc}, expected {' or '.join(e.__name__ for e in errors)}"
        ) from None
    raise ContractViolation(f"{what} did not raise {' or '.join(e.__name__ for e in errors)}")


def _result(r: ExecResult) -> str:
    return f"exit {r.exit_code}, stdout {r.stdout[:200]!r}, stderr {r.stderr[:200]!r}, timed_out={r.timed_out}"


async def exit_codes_are_kept(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        for code in (0, 1, 2, 42, 255):
            r = await sb.exec(f"exit {code}")
            expect(r.exit_code == code, f"`exit {code}` came back as {_result(r)}")


async def missing_executable_is_exit_127(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec(["no-such-program-sandgym"])
        expect(r.exit_code == 127 and not r.timed_out, f"a missing program (argv) gave {_result(r)}, expected exit 127")
        r = await sb.exec("no-such-program-sandgym --flag")
        expect(r.exit_code == 127, f"a missing program (shell) gave {_result(r)}, expected exit 127")


async def not_executable_is_exit_126(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("plain.sh", "#!/bin/sh\necho ran\n", mode=0o644)
        r = await sb.exec("./plain.sh")
        expect(r.exit_code == 126 and "ran" not in r.stdout, f"running a file without x gave {_result(r)}, expected 126")


async def death_by_signal_is_not_a_timeout(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], timeout=30)
        expect(r.exit_code == 128 + 9 and not r.timed_out,
               f"a process killed by SIGKILL gave {_result(r)}, expected exit 137 and timed_out=False")
        r = await sb.exec("kill -TERM $$", timeout=30)
        expect(r.exit_code == 128 + 15 and not r.timed_out, f"SIGTERM gave {_result(r)}, expected exit 143")


async def timeout_leaves_the_sandbox_usable(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec(["sleep", "60"], timeout=1)
        expect(r.timed_out and r.exit_code == TIMEOUT_EXIT, f"an argv command past its timeout gave {_result(r)}")
        r = await sb.exec("echo after")
        expect(r.stdout == "after\n" and r.exit_code == 0, f"the next command after a timeout gave {_result(r)}")


async def stderr_is_capped_too(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        limit = spec.output_limit_bytes
        r = await sb.exec(f"head -c {4 * limit} /dev/zero | tr '\\0' e >&2; echo fine")
        expect(r.truncated and len(r.stderr_bytes) == limit,
               f"{4 * limit} bytes of stderr kept {len(r.stderr_bytes)} (truncated={r.truncated}), expected {limit}")
        expect(r.stdout == "fine\n" and r.exit_code == 0, f"stdout beside a capped stderr: {_result(r)}")


async def output_below_the_cap_is_whole(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        n = spec.output_limit_bytes - 1
        r = await sb.exec(f"head -c {n} /dev/zero | tr '\\0' o")
        expect(len(r.stdout_bytes) == n and not r.truncated,
               f"{n} bytes of stdout came back as {len(r.stdout_bytes)} (truncated={r.truncated})")
        r = await sb.exec("printf 'no newline'")
        expect(r.stdout == "no newline", f"output without a final newline came back as {r.stdout!r}")


async def large_stdin(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        data = os.urandom(3_000_000)
        r = await sb.exec("sha256sum | cut -c1-64", stdin=data, timeout=60)
        want = hashlib.sha256(data).hexdigest()
        expect(r.stdout.strip() == want, f"3 MB of stdin hashed to {r.stdout.strip()!r} inside, expected {want} ({r.stderr.strip()})")


async def binary_stdin_round_trip(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        data = bytes(range(256)) * 4 + b"\x00\r\n\x1b"
        r = await sb.exec(["cat"], stdin=data)
        expect(r.stdout_bytes == data, f"binary stdin came back changed ({len(r.stdout_bytes)} of {len(data)} bytes)")


async def no_stdin_is_end_of_file(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec("cat; echo done", timeout=20)
        expect(r.stdout == "done\n" and not r.timed_out, f"`cat` without stdin gave {_result(r)}, expected EOF at once")


async def unicode_output_argv_and_env(provider: Provider, spec: SandboxSpec) -> None:
    text = "héllo ✓ 日本語 🙂"
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec(f"echo '{text}'")
        expect(r.stdout == text + "\n", f"unicode stdout came back as {r.stdout!r}")
        r = await sb.exec(["python3", "-c", "import sys; sys.stdout.buffer.write(sys.argv[1].encode())", text])
        expect(r.stdout == text, f"a unicode argv came back as {r.stdout!r}")
        r = await sb.exec('printf %s "$U"', env={"U": text})
        expect(r.stdout == text, f"a unicode env value came back as {r.stdout!r}")
        r = await sb.exec("cat", stdin=text)
        expect(r.stdout == text, f"unicode stdin came back as {r.stdout!r}")


async def argv_is_not_shell_parsed(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        tricky = ["$HOME", "; echo injected", "'quoted'", '"dq"', "*", "a\nb", ""]
        r = await sb.exec(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *tricky])
        expect(r.stdout.strip() == json.dumps(tricky), f"argv {tricky!r} arrived as {r.stdout.strip()!r}")


async def env_values_are_literal(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec.model_copy(update={"env": {**spec.env, "K": "from-spec"}})) as sb:
        odd = "a b 'c' \"d\" $HOME `id` \\ x=y"
        r = await sb.exec(["python3", "-c", "import os; print(repr(os.environ['V']), os.environ['K'])"],
                          env={"V": odd, "K": "from-call"})
        expect(r.stdout.strip() == f"{odd!r} from-call",
               f"env V={odd!r} K=from-call (over the spec's K) arrived as {r.stdout.strip()!r}")
        r = await sb.exec('echo "$K"')
        expect(r.stdout == "from-spec\n", f"the spec's env after a call that overrode it: {r.stdout!r}")


async def cwd_default_absolute_and_missing(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec("pwd")
        expect(r.stdout.strip() == spec.workdir, f"the default cwd is {r.stdout.strip()!r}, expected {spec.workdir}")
        r = await sb.exec("pwd", cwd="/tmp")
        expect(r.stdout.strip() == "/tmp", f"cwd='/tmp' ran in {r.stdout.strip()!r}")
        try:
            r = await sb.exec("echo ran", cwd="no/such/dir")
        except SandboxError:
            return  # refused: fine
        expect(r.exit_code != 0 and "ran" not in r.stdout,
               f"a missing cwd gave {_result(r)}; expected SandboxError or a non-zero exit without running")


async def background_child_does_not_hold_exec(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec("(sleep 60 >/dev/null 2>&1 &); echo started", timeout=20)
        expect(r.stdout == "started\n" and r.exit_code == 0 and not r.timed_out,
               f"a command leaving a detached child gave {_result(r)}, expected to return at once")


async def concurrent_execs(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        results: dict[int, ExecResult] = {}

        async def one(i: int) -> None:
            results[i] = await sb.exec(f"sleep 0.5; echo {i}; echo e{i} >&2; exit {i}")

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        for i, r in results.items():
            expect((r.stdout, r.stderr, r.exit_code) == (f"{i}\n", f"e{i}\n", i), f"concurrent exec {i} gave {_result(r)}")


async def exec_many_keeps_order(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        jobs = [ExecJob(f"sleep 0.{3 - i}; echo {i}") for i in range(3)]
        jobs.append(ExecJob("sleep 60", timeout=1))
        jobs.append(ExecJob("cat", stdin="in"))
        rs = await sb.exec_many(jobs)
        got = [r.stdout for r in rs[:3]]
        expect(got == ["0\n", "1\n", "2\n"], f"exec_many results out of order: {got!r}")
        expect(rs[3].timed_out and not any(r.timed_out for r in rs[:3]), "exec_many's per-job timeout")
        expect(rs[4].stdout == "in", f"exec_many's stdin gave {rs[4].stdout!r}")


async def empty_argv_is_refused(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await _raises("exec([])", sb.exec([]), ValueError)


async def read_directory_raises(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.exec("mkdir -p adir")
        await _raises("read_file of a directory", sb.read_file("adir"), SandboxError)


async def read_missing_in_missing_dir_raises(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        exc = await _raises("read_file('/tmp/no/such/dir/f')", sb.read_file("/tmp/no/such/dir/f"), SandboxFileNotFound)
        expect("/tmp/no/such/dir/f" in str(exc), f"the error does not name the path: {exc}")


async def read_unreadable_raises(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        if (await sb.exec("id -u")).stdout.strip() == "0":
            raise NotApplicable("the sandbox runs as root, who may read anything")
        await sb.write_file("secret.txt", "s")
        await sb.exec("chmod 000 secret.txt")
        await _raises("read_file of a mode-000 file", sb.read_file("secret.txt"), SandboxError)


async def write_where_not_permitted_raises(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        if (await sb.exec("id -u")).stdout.strip() == "0":
            raise NotApplicable("the sandbox runs as root, who may write anything")
        await _raises("write_file('/etc/sandgym-contract')", sb.write_file("/etc/sandgym-contract", "x"),
                      SandboxError)
        r = await sb.exec("test -e /etc/sandgym-contract && echo exists || echo absent")
        expect(r.stdout == "absent\n", "a refused write left a file behind")


async def write_into_missing_parents(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("/tmp/deep/er/still/f.txt", "deep")
        r = await sb.exec("cat /tmp/deep/er/still/f.txt")
        expect(r.stdout == "deep", f"a file written into missing parents reads {_result(r)}")


async def write_onto_directory_raises(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.exec("mkdir -p adir && touch adir/keep")
        await _raises("write_file onto a directory", sb.write_file("adir", "x"), SandboxError)
        r = await sb.exec("test -f adir/keep && echo kept")
        expect(r.stdout == "kept\n", "writing onto a directory destroyed it")


async def write_under_a_file_raises(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("afile", "x")
        await _raises("write_file('afile/child')", sb.write_file("afile/child", "y"),
                      SandboxError)
        expect(await sb.read_file("afile") == b"x", "a failed write under a file changed the file")


async def empty_files(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("empty", b"")
        expect(await sb.read_file("empty") == b"", "an empty file did not read back empty")
        r = await sb.exec("stat -c %s empty")
        expect(r.stdout.strip() == "0", f"an empty written file has size {r.stdout.strip()!r} inside")


async def overwrite_truncates(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("f", "a long first version\n")
        await sb.write_file("f", "short")
        got = await sb.read_file("f")
        expect(got == b"short", f"overwriting with a shorter text left {got!r}")


async def file_mode_is_applied(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
        r = await sb.exec("stat -c %a run.sh; ./run.sh")
        expect(r.stdout == "755\nran\n", f"a file written with mode 0o755: {_result(r)}")
        await sb.write_file("ro.txt", "r", mode=0o600)
        r = await sb.exec("stat -c %a ro.txt")
        expect(r.stdout.strip() == "600", f"a file written with mode 0o600 has mode {r.stdout.strip()!r}")


async def odd_file_names(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        for name in ("with space/a file.txt", "ünïcödé/日本.txt", "dots/../dotted.txt", "-leading-dash"):
            await sb.write_file(name, name)
            got = await sb.read_file(name)
            expect(got == name.encode(), f"file {name!r} read back as {got!r}")
        r = await sb.exec(["cat", "--", "with space/a file.txt", "dotted.txt"])
        expect(r.stdout == "with space/a file.txtdots/../dotted.txt", f"odd names seen inside: {_result(r)}")


async def large_file_round_trip(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        data = os.urandom(8_000_000)
        await sb.write_file("big.bin", data)
        r = await sb.exec("sha256sum big.bin | cut -c1-64")
        expect(r.stdout.strip() == hashlib.sha256(data).hexdigest(), "an 8 MB file hashes differently inside")
        got = await sb.read_file("big.bin")
        expect(got == data, f"an 8 MB file read back as {len(got)} bytes (read_file has no output cap)")


async def file_made_inside_reads_back(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.exec("mkdir -p /tmp/in && printf 'made\\x00inside' > /tmp/in/x")
        got = await sb.read_file("/tmp/in/x")
        expect(got == b"made\x00inside", f"a file made inside read back as {got!r}")


async def archives_of_missing_paths_raise(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await _raises("get_archive of a missing path", sb.get_archive(f"{spec.workdir}/nope"), SandboxFileNotFound)
        with tempfile.TemporaryDirectory(prefix="sandgym-contract-") as tmp:
            await _raises("download of a missing path", sb.download("nope", tmp), SandboxFileNotFound)


async def one_file_downloads(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as sb:
        await sb.write_file("one.txt", "single\n")
        with tempfile.TemporaryDirectory(prefix="sandgym-contract-") as tmp:
            out = await sb.download("one.txt", tmp)
            expect(out == Path(tmp) / "one.txt" and out.read_text() == "single\n", f"downloading one file gave {out}")
            (Path(tmp) / "up.txt").write_text("up\n")
            await sb.upload(Path(tmp) / "up.txt", "/tmp/updir")
            expect(await sb.read_file("/tmp/updir/up.txt") == b"up\n", "an uploaded single file is not at its place")


async def closed_sandbox_refuses_everything(provider: Provider, spec: SandboxSpec) -> None:
    sb = await provider.create(spec, owner_labels(new_run_id()))
    await sb.close()
    await _raises("exec after close", sb.exec("true"), SandboxGoneError)
    await _raises("read_file after close", sb.read_file("x"), SandboxGoneError)
    await _raises("write_file after close", sb.write_file("x", "y"), SandboxGoneError)
    await _raises("get_archive after close", sb.get_archive(spec.workdir), SandboxGoneError)
    await _raises("put_archive after close", sb.put_archive(spec.workdir, _empty_tar()), SandboxGoneError)
    expect(not await sb.alive(), "a closed sandbox says it is alive")


async def removed_sandbox_is_gone(provider: Provider, spec: SandboxSpec) -> None:
    sb = await provider.create(spec, owner_labels(new_run_id()))
    try:
        await provider.remove(sb.id)
        await _raises("exec on a sandbox removed by id", sb.exec("true"), SandboxGoneError)
        expect(sb.id not in {i.id for i in await provider.list()}, "a removed sandbox is still listed")
    finally:
        with anyio.CancelScope(shield=True):
            await sb.close()


async def list_filters_by_labels(provider: Provider, spec: SandboxSpec) -> None:
    run = new_run_id()
    labels = {**owner_labels(run), "sandgym.contract": run}
    sb = await provider.create(spec, labels)
    try:
        mine = await provider.list({"sandgym.contract": run})
        expect([i.id for i in mine] == [sb.id], f"list(its label) gave {[i.id for i in mine]}, expected [{sb.id}]")
        expect(mine[0].labels.get("sandgym.contract") == run, f"its labels came back as {mine[0].labels}")
        other = await provider.list({"sandgym.contract": run + "-other"})
        expect(other == [], f"list(another label) shows {[i.id for i in other]}")
        info = await sb.info()
        expect(info.status == "running" and info.id == sb.id, f"info() of a running sandbox: {info}")
    finally:
        with anyio.CancelScope(shield=True):
            await sb.close()


async def sandboxes_are_apart(provider: Provider, spec: SandboxSpec) -> None:
    async with _sandbox(provider, spec) as a, _sandbox(provider, spec) as b:
        expect(a.id != b.id, "two sandboxes share an id")
        await a.write_file("only-in-a.txt", "a")
        await a.exec("echo a > /tmp/only-in-a")
        r = await b.exec("ls only-in-a.txt /tmp/only-in-a 2>&1 | grep -c 'No such file'")
        expect(r.stdout.strip() == "2", f"files of one sandbox are seen in another: {_result(r)}")
        await _raises("read_file of another sandbox's file", b.read_file("only-in-a.txt"), SandboxFileNotFound)


async def localhost_is_loopback(provider: Provider, spec: SandboxSpec) -> None:
    # Test suites start servers on loopback and reach them by name, network or not.
    prog = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "c = socket.create_connection(('localhost', s.getsockname()[1]), timeout=5)\n"
        "a, _ = s.accept(); c.sendall(b'ok'); print(a.recv(2).decode())\n"
    )
    async with _sandbox(provider, spec) as sb:
        r = await sb.exec(["python3", "-c", prog], timeout=20)
        expect(r.exit_code == 0 and r.stdout.strip() == "ok", f"a server on 127.0.0.1 is not reached at localhost: {_result(r)}")


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    return buf.getvalue()


CHECKS: tuple[Check, ...] = (
    Check("exec_stdout_stderr_exit_code", "stdout, stderr and exit code come back apart; argv lists stay intact",
          exec_stdout_stderr_exit_code),
    Check("env_cwd_and_stdin", "spec and call env merge; cwd is relative to the workdir; stdin reaches the command",
          env_cwd_and_stdin),
    Check("exec_python_runs_like_python3", "exec_python: exit code, stdout, stderr, argv, sys.path, env, cwd, stdin and tracebacks as `python3 -` has them",
          exec_python_runs_like_python3),
    Check("timeout_kills_children", "a timeout reports 124 promptly and kills the command's children",
          timeout_kills_children),
    Check("output_is_capped_and_binary_survives", "output is capped at the spec's limit; binary bytes survive",
          output_is_capped_and_binary_survives),
    Check("files_and_directories", "write/read files, missing files, upload and download of directories",
          files_and_directories),
    Check("not_root_and_listed_with_labels", "not root (root under the vm profile); list() shows the owner labels; close() is idempotent",
          not_root_and_listed_with_labels),
    Check("live_process", "start_live: output as it comes, stdin, exit code", live_process),
    Check("exit_codes_are_kept", "exit codes 0, 1, 2, 42 and 255 come back as they were", exit_codes_are_kept),
    Check("missing_executable_is_exit_127", "a program that does not exist is exit 127, not a raise (argv and shell)", missing_executable_is_exit_127),
    Check("not_executable_is_exit_126", "a file without the x bit is exit 126, not a raise", not_executable_is_exit_126),
    Check("death_by_signal_is_not_a_timeout", "SIGKILL / SIGTERM give 137 / 143 with timed_out=False", death_by_signal_is_not_a_timeout),
    Check("timeout_leaves_the_sandbox_usable", "an argv command past its timeout is 124; the next command runs", timeout_leaves_the_sandbox_usable),
    Check("stderr_is_capped_too", "stderr is capped at the spec's limit; stdout beside it is whole", stderr_is_capped_too),
    Check("output_below_the_cap_is_whole", "output just under the cap is whole and not marked truncated; no final newline kept", output_below_the_cap_is_whole),
    Check("large_stdin", "3 MB of stdin arrive whole", large_stdin),
    Check("binary_stdin_round_trip", "every byte value survives stdin -> stdout", binary_stdin_round_trip),
    Check("no_stdin_is_end_of_file", "a command given no stdin reads EOF at once", no_stdin_is_end_of_file),
    Check("unicode_output_argv_and_env", "unicode in output, argv, env values and stdin", unicode_output_argv_and_env),
    Check("argv_is_not_shell_parsed", "argv items with $, ;, quotes, *, newlines and empty strings arrive as given", argv_is_not_shell_parsed),
    Check("env_values_are_literal", "env values are not expanded; the call's env wins over the spec's for one call only", env_values_are_literal),
    Check("cwd_default_absolute_and_missing", "default cwd is the workdir; an absolute cwd; a missing cwd refuses or fails", cwd_default_absolute_and_missing),
    Check("background_child_does_not_hold_exec", "exec returns when the command ends, a detached child left running", background_child_does_not_hold_exec),
    Check("concurrent_execs", "8 concurrent execs each get their own output and exit code", concurrent_execs),
    Check("exec_many_keeps_order", "exec_many: results in job order, per-job timeout and stdin", exec_many_keeps_order),
    Check("empty_argv_is_refused", "exec([]) raises ValueError", empty_argv_is_refused),
    Check("read_directory_raises", "read_file of a directory raises SandboxError", read_directory_raises),
    Check("read_missing_in_missing_dir_raises", "read_file under a missing directory raises SandboxFileNotFound naming the path", read_missing_in_missing_dir_raises),
    Check("read_unreadable_raises", "read_file of a mode-000 file raises SandboxError (not applicable as root)", read_unreadable_raises),
    Check("write_where_not_permitted_raises", "write_file into /etc raises SandboxError and leaves nothing (not applicable as root)", write_where_not_permitted_raises),
    Check("write_into_missing_parents", "write_file creates missing parent directories", write_into_missing_parents),
    Check("write_onto_directory_raises", "write_file onto a directory raises SandboxError and keeps the directory", write_onto_directory_raises),
    Check("write_under_a_file_raises", "write_file below a regular file raises SandboxError", write_under_a_file_raises),
    Check("empty_files", "zero-length files write and read", empty_files),
    Check("overwrite_truncates", "overwriting with shorter content leaves only the new content", overwrite_truncates),
    Check("file_mode_is_applied", "write_file's mode is the file's mode (0o755 runs, 0o600)", file_mode_is_applied),
    Check("odd_file_names", "spaces, unicode, .. and a leading dash in file names", odd_file_names),
    Check("large_file_round_trip", "an 8 MB binary file writes and reads whole (no output cap on files)", large_file_round_trip),
    Check("file_made_inside_reads_back", "a file made by a command reads back byte for byte", file_made_inside_reads_back),
    Check("archives_of_missing_paths_raise", "get_archive / download of a missing path raise SandboxFileNotFound", archives_of_missing_paths_raise),
    Check("one_file_downloads", "download and upload of a single file", one_file_downloads),
    Check("closed_sandbox_refuses_everything", "after close, exec and file calls raise SandboxGoneError; alive() is False", closed_sandbox_refuses_everything),
    Check("removed_sandbox_is_gone", "after provider.remove(id), exec raises SandboxGoneError; not listed", removed_sandbox_is_gone),
    Check("list_filters_by_labels", "list(labels) shows exactly the matching sandboxes; info() says running", list_filters_by_labels),
    Check("sandboxes_are_apart", "two sandboxes do not see each other's files", sandboxes_are_apart),
    Check("localhost_is_loopback", "`localhost` resolves, and a server on 127.0.0.1 answers there", localhost_is_loopback),
)


async def run_check(check: Check, provider: Provider, spec: SandboxSpec = DEFAULT_SPEC) -> CheckResult:
    t0 = time.monotonic()
    try:
        await check.run(provider, spec)
    except ContractViolation as exc:
        return CheckResult(check.name, False, str(exc), time.monotonic() - t0)
    except NotApplicable as exc:
        return CheckResult(check.name, True, str(exc), time.monotonic() - t0, applicable=False)
    except Exception as exc:
        return CheckResult(check.name, False, f"raised {type(exc).__name__}: {exc}", time.monotonic() - t0)
    return CheckResult(check.name, True, "", time.monotonic() - t0)


async def run_contract(
    provider: Provider,
    spec: SandboxSpec = DEFAULT_SPEC,
    *,
    only: Sequence[str] | None = None,
    concurrency: int = 1,
) -> ContractReport:
    """Run the checks (all, or those named in `only`) against `provider`, `concurrency` at a
    time (each check has sandboxes of its own); the report keeps the checks' order."""
    known = {c.name: c for c in CHECKS}
    unknown = [n for n in only or () if n not in known]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; known: {', '.join(known)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    chosen = [c for c in CHECKS if only is None or c.name in only]
    results: list[CheckResult | None] = [None] * len(chosen)
    limit = anyio.CapacityLimiter(concurrency)

    async def one(i: int, check: Check) -> None:
        async with limit:
            results[i] = await run_check(check, provider, spec)

    async with anyio.create_task_group() as tg:
        for i, check in enumerate(chosen):
            tg.start_soon(one, i, check)
    report = ContractReport(provider=getattr(provider, "name", type(provider).__name__))
    report.results = [r for r in results if r is not None]
    return report
