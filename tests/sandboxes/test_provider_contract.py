"""One behavioural suite that every provider (docker, local, prime) must pass."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandgym.sandboxes import Provider, SandboxFileNotFound, SandboxSpec
from sandgym.sandboxes.ownership import new_run_id, owner_labels

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(memory_mb=512, disk_mb=256, output_limit_bytes=64 * 1024, exec_timeout_s=30)


async def _sandbox(provider: Provider, spec: SandboxSpec = SPEC):
    return await provider.create(spec, owner_labels(new_run_id()))


async def test_exec_stdout_stderr_exit_code(provider: Provider) -> None:
    sb = await _sandbox(provider)
    try:
        r = await sb.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        assert not r.timed_out and not r.truncated and r.duration_s >= 0
        argv = await sb.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"])
        assert argv.stdout.strip() == "['a b', 'c']"
    finally:
        await sb.close()


async def test_env_cwd_and_stdin(provider: Provider) -> None:
    sb = await _sandbox(provider, SPEC.model_copy(update={"env": {"FROM_SPEC": "s"}}))
    try:
        await sb.exec("mkdir -p sub")
        r = await sb.exec('echo "$FROM_SPEC $FROM_CALL"; pwd', env={"FROM_CALL": "c"}, cwd="sub")
        lines = r.stdout.splitlines()
        assert lines[0] == "s c"
        assert lines[1].endswith("/sub")
        r = await sb.exec("tr a-z A-Z", stdin="hello sandbox\n")
        assert r.stdout == "HELLO SANDBOX\n"
    finally:
        await sb.close()


async def test_timeout_kills_children(provider: Provider) -> None:
    sb = await _sandbox(provider)
    try:
        t0 = time.monotonic()
        r = await sb.exec("sleep 100 & sleep 100; echo never", timeout=2)
        elapsed = time.monotonic() - t0
        assert r.timed_out and r.exit_code == 124
        assert "never" not in r.stdout
        assert elapsed < 10, f"a 2 s timeout took {elapsed:.1f} s to come back"
        left = await sb.exec("ps -eo args | grep -c '^sleep 100' || true")
        assert left.stdout.strip() == "0", "a child of the timed-out command survived"
    finally:
        await sb.close()


async def test_output_is_capped_and_binary_survives(provider: Provider) -> None:
    sb = await _sandbox(provider)
    try:
        r = await sb.exec("head -c 10000000 /dev/zero | tr '\\0' x")
        assert r.truncated and r.exit_code == 0
        assert len(r.stdout_bytes) == SPEC.output_limit_bytes
        blob = bytes(range(256)) * 16 + b"\xff\xfe\x00\x80"
        await sb.write_file("blob.bin", blob)
        r = await sb.exec("cat blob.bin")
        assert r.stdout_bytes == blob
        assert isinstance(r.stdout, str)  # lenient text view never raises
        assert await sb.read_file("blob.bin") == blob
    finally:
        await sb.close()


async def test_files_and_directories(provider: Provider, tmp_path: Path) -> None:
    sb = await _sandbox(provider)
    try:
        await sb.write_file("a/b/c.txt", "hello\n")
        assert (await sb.exec("cat a/b/c.txt")).stdout == "hello\n"
        assert await sb.read_file(f"{SPEC.workdir}/a/b/c.txt") == b"hello\n"
        await sb.exec("echo changed > a/b/c.txt")  # the sandbox user owns written files
        assert await sb.read_file("a/b/c.txt") == b"changed\n"
        with pytest.raises(SandboxFileNotFound):
            await sb.read_file("does/not/exist")

        src = tmp_path / "src"
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "mod.py").write_text("X = 1\n")
        (src / "top.bin").write_bytes(os.urandom(1000))
        await sb.upload(src, "proj")
        r = await sb.exec("cd proj && python3 -c 'import pkg.mod as m; print(m.X)'")
        assert r.stdout.strip() == "1", r.stderr
        await sb.exec("echo new > proj/made_inside.txt")
        out = await sb.download("proj", tmp_path / "back")
        assert (out / "pkg" / "mod.py").read_text() == "X = 1\n"
        assert (out / "top.bin").read_bytes() == (src / "top.bin").read_bytes()
        assert (out / "made_inside.txt").read_text() == "new\n"
    finally:
        await sb.close()


async def test_not_root_and_listed_with_labels(provider: Provider) -> None:
    labels = owner_labels(new_run_id())
    sb = await provider.create(SPEC, labels)
    try:
        uid = (await sb.exec("id -u")).stdout.strip()
        assert uid.isdigit() and uid != "0"
        mine = [i for i in await provider.list() if i.id == sb.id]
        assert mine and mine[0].labels["sandgym.owner"] == labels["sandgym.owner"]
        assert mine[0].pid == os.getpid()
    finally:
        await sb.close()
    await sb.close()  # idempotent
    assert sb.id not in {i.id for i in await provider.list()}
    await provider.remove(sb.id)  # removing what is gone is fine
