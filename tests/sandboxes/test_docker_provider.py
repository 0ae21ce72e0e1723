"""The docker provider against the real engine and the real sandgym/python image.

Each test creates its own containers (or uses the module's shared one) carrying a run label,
and the module removes everything with that label at the end, whatever happened. Sandboxes
run execd (the in-sandbox exec daemon) by default; the hardening, timeout, cancel and OOM
tests also run against a `docker exec` sandbox (`execd=False`), and one image without
python3 checks the automatic fallback.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from sandgym.sandboxes.base import ExecJob
from sandgym.sandboxes.errors import ImagePullError, SandboxFileNotFound, SandboxGoneError, SpecError
from sandgym.sandboxes.providers.docker import DockerProvider, DockerSandbox
from sandgym.sandboxes.providers.docker import provider as docker_provider
from sandgym.sandboxes.providers.docker.exec import DockerExecTransport
from sandgym.sandboxes.providers.docker.execd import DockerExecdTransport
from sandgym.sandboxes.providers.docker.transport import Transport
from sandgym.sandboxes.spec import LABEL_OWNER, SandboxSpec

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker")]

RUN = uuid.uuid4().hex[:12]
LABELS = {LABEL_OWNER: "test-docker-provider", "sandgym.run": RUN}
SPEC = SandboxSpec(memory_mb=512, disk_mb=32, pids=128, ttl_s=900, exec_timeout_s=60)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def provider() -> AsyncIterator[DockerProvider]:
    p = DockerProvider()
    try:
        yield p
    finally:
        for info in await p.list({"sandgym.run": RUN}):  # whatever a failing test left
            await p.remove(info.id)
        assert await p.list({"sandgym.run": RUN}) == []
        await p.aclose()


@pytest.fixture(scope="module")
async def exec_provider() -> AsyncIterator[DockerProvider]:
    """The same engine without execd: every command is a `docker exec`."""
    p = DockerProvider(execd=False)
    try:
        yield p
    finally:
        for info in await p.list({"sandgym.run": RUN}):
            await p.remove(info.id)
        await p.aclose()


@pytest.fixture(scope="module")
async def sb(provider: DockerProvider) -> AsyncIterator[DockerSandbox]:
    """One sandbox shared by the tests that leave it as they found it."""
    box = await provider.create(SPEC, LABELS)
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture(scope="module")
async def exec_sb(exec_provider: DockerProvider) -> AsyncIterator[DockerSandbox]:
    box = await exec_provider.create(SPEC, LABELS)
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture(params=["execd", "docker-exec"])
def any_sb(request: pytest.FixtureRequest) -> DockerSandbox:
    """The shared sandbox of either transport."""
    return request.getfixturevalue("sb" if request.param == "execd" else "exec_sb")


@pytest.fixture(params=["execd", "docker-exec"])
def any_provider(request: pytest.FixtureRequest) -> DockerProvider:
    return request.getfixturevalue("provider" if request.param == "execd" else "exec_provider")


@pytest.fixture
async def fresh(provider: DockerProvider) -> AsyncIterator[list[DockerSandbox]]:
    """Sandboxes a single test creates; closed after it."""
    made: list[DockerSandbox] = []
    try:
        yield made
    finally:
        for box in made:
            await box.close()


async def _new(
    provider: DockerProvider, made: list[DockerSandbox], **update: object
) -> DockerSandbox:
    box = await provider.create(SPEC.model_copy(update=update), LABELS)
    made.append(box)
    return box


async def _procs(box: DockerSandbox, pattern: str) -> list[str]:
    """Command lines of processes matching `pattern` (excluding the ps/grep themselves)."""
    r = await box.exec(["ps", "-eo", "args="])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    return [line for line in lines if pattern in line and not line.startswith("ps ")]


# -- spec checks ---------------------------------------------------------------------------


async def test_check_rejects_unknown_image(provider: DockerProvider) -> None:
    spec = SPEC.model_copy(update={"image": "sandgym/does-not-exist:latest", "image_pull": "never"})
    with pytest.raises(SpecError, match=r"image.*not present locally.*image_pull='never'.*sandgym images build"):
        provider.check(spec)
    with pytest.raises(SpecError, match="image"):
        await provider.create(spec, LABELS)
    # Allowed to pull: check passes, the pull fails (no registry is reachable for this name)
    # with the engine's reason, not retried, and nothing is left behind.
    pulled = spec.model_copy(update={"image_pull": "missing"})
    provider.check(pulled)
    with pytest.raises(ImagePullError, match=r"image: 'sandgym/does-not-exist:latest' is not present locally and pulling it failed: .+"):
        await provider.create(pulled, LABELS)
    assert await provider.list({"sandgym.run": RUN}) == []


async def test_check_rejects_memory_beyond_host(provider: DockerProvider) -> None:
    with pytest.raises(SpecError, match=r"memory_mb=1048576.*allowed range: \[16, \d+\]"):
        provider.check(SPEC.model_copy(update={"memory_mb": 1024 * 1024}))


async def test_check_rejects_gpus_without_runtime(provider: DockerProvider) -> None:
    if provider._has_gpu_runtime(provider.api.info()):
        pytest.skip("this engine has a GPU runtime")
    with pytest.raises(SpecError, match=r"gpus=1.*no GPU runtime"):
        provider.check(SPEC.model_copy(update={"gpus": 1}))


# -- hardening -----------------------------------------------------------------------------


async def test_container_is_hardened(provider: DockerProvider, any_sb: DockerSandbox) -> None:
    sb = any_sb
    cfg = provider.api.inspect_container(sb.id)
    host = cfg["HostConfig"]
    assert host["NetworkMode"] == "none" and cfg["Config"]["NetworkDisabled"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True
    # Not --rm: Docker before 24.0.8 removes --rm containers when it restarts (moby#46308);
    # the provider removes its containers when they end (test_container_ends_itself_after_ttl).
    assert host["AutoRemove"] is False
    assert host["PidsLimit"] == SPEC.pids
    assert host["Memory"] == host["MemorySwap"] == SPEC.memory_mb << 20
    assert host["NanoCpus"] == int(SPEC.cpu * 1e9)
    # execd is its own init (it starts its serving half again when that is killed); the
    # docker-exec transport's `sh`/`sleep` run under docker-init.
    assert host.get("Init") is (None if isinstance(sb.transport, DockerExecdTransport) else True)
    writable = {SPEC.workdir, "/tmp"}
    loop = provider.plan(SPEC).disk == "loop"
    if loop:  # one per-sandbox ext4 disk holds both; its wrapper runtime cleans it up
        assert host["Runtime"] == "runc-sandgym" and not host.get("Tmpfs")
        disk = f"/var/lib/sandgym/sandboxes/{cfg['Name'].lstrip('/')}/disk/"
        binds = {m["Destination"]: m for m in cfg["Mounts"] if m["Destination"] in writable}
        assert {d: (m["Source"], m["RW"]) for d, m in binds.items()} == {
            SPEC.workdir: (disk + "w", True), "/tmp": (disk + "tmp", True)}
    else:
        assert set(host["Tmpfs"]) == writable
        assert f"size={SPEC.disk_mb}m" in host["Tmpfs"][SPEC.workdir]
    assert cfg["Config"]["User"] == "1000:1000"
    assert cfg["Config"]["Labels"]["sandgym.run"] == RUN
    assert "HOME=/tmp" in cfg["Config"]["Env"]
    if isinstance(sb.transport, DockerExecdTransport):
        assert cfg["Config"]["Entrypoint"] == ["python3"]
        # TTL, then the owner's lifeline: execd ends once this process is gone.
        assert cfg["Config"]["Cmd"][-6:] == [
            "--ttl", "900.0", "--owner-fifo", "/run/sandgym/lifeline", "--owner-grace", "0.0",
        ]  # fmt: skip
        assert cfg["Config"]["Labels"]["sandgym.transport"] == "execd"
        # execd's code is mounted read-only; only the socket directory is writable.
        mounts = {m["Destination"]: m for m in cfg["Mounts"]}
        assert mounts["/opt/sandgym-execd"]["RW"] is False
        assert mounts["/run/sandgym"]["RW"] is True
        assert mounts["/etc/hosts"]["RW"] is False  # the engine writes none without a network
        assert set(mounts) == {"/opt/sandgym-execd", "/run/sandgym", "/etc/hosts"} | (writable if loop else set())
    else:
        # A sh that ends at the TTL or once the owner's lifeline FIFO has no writer left.
        assert cfg["Config"]["Entrypoint"] == ["/bin/sh"]
        assert cfg["Config"]["Cmd"][-4:] == ["sandgym-main", "/run/sandgym/lifeline", "0", "900"]
        assert cfg["Config"]["Labels"]["sandgym.transport"] == "docker-exec"
        # Only the folder holding the lifeline is mounted read-only (and the loop disk's mounts).
        got = {m["Destination"]: m["RW"] for m in cfg["Mounts"]}
        assert got.pop("/run/sandgym") is False and got.pop("/etc/hosts") is False
        assert set(got) == (writable if loop else set())
    labels = cfg["Config"]["Labels"]
    assert labels["sandgym.pid"] == str(os.getpid()) and labels["sandgym.owner_kind"] == "process"


async def test_runs_as_non_root_without_capabilities(any_sb: DockerSandbox) -> None:
    sb = any_sb
    r = await sb.exec("id -u; grep CapEff /proc/self/status")
    uid, caps = r.stdout.splitlines()
    assert uid == "1000"
    assert caps.split()[1] == "0000000000000000"


async def test_numeric_user_owns_the_workdir(
    provider: DockerProvider, fresh: list[DockerSandbox]
) -> None:
    box = await _new(provider, fresh, user="2000:2001")
    await box.write_file("f.txt", "x")
    r = await box.exec("id -u; id -g; stat -c '%u:%g' . f.txt")
    assert r.stdout.split() == ["2000", "2001", "2000:2001", "2000:2001"], r.stderr


async def test_root_is_read_only_but_workdir_and_tmp_are_writable(sb: DockerSandbox) -> None:
    for path in ("/x", "/etc/x", "/usr/x", "/home/sandbox/x"):
        r = await sb.exec(f"echo no > {path}")
        assert r.exit_code != 0, path
        assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr, r.stderr
    r = await sb.exec("echo yes > /workspace/ok && echo yes > /tmp/ok && cat /workspace/ok /tmp/ok")
    assert r.stdout == "yes\nyes\n", r.stderr
    await sb.exec("rm -f /workspace/ok /tmp/ok")


async def test_no_network(sb: DockerSandbox) -> None:
    probe = (
        "import socket, sys\n"
        "for host, port in (('127.0.0.1', 80), ('1.1.1.1', 53)):\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n"
        "        s.connect((host, port)); print(host, 'CONNECTED')\n"
        "    except OSError as e:\n"
        "        print(host, 'failed', type(e).__name__)\n"
    )
    r = await sb.exec(["python3", "-c", probe])
    assert r.exit_code == 0, r.stderr
    assert "CONNECTED" not in r.stdout
    assert r.stdout.count("failed") == 2, r.stdout
    ifaces = (await sb.exec("ls /sys/class/net")).stdout.split()
    assert ifaces == ["lo"]


async def test_disk_is_limited(sb: DockerSandbox) -> None:
    for d in ("/workspace", "/tmp"):
        r = await sb.exec(f"dd if=/dev/zero of={d}/fill bs=1M count={SPEC.disk_mb * 2}")
        assert r.exit_code != 0
        assert "No space left on device" in r.stderr, r.stderr
        r = await sb.exec(f"rm -f {d}/fill && echo gone")
        assert r.stdout == "gone\n"


@pytest.mark.parametrize("counters", ["host", "in-sandbox"])
async def test_memory_bomb_is_oom_killed(
    provider: DockerProvider,
    fresh: list[DockerSandbox],
    counters: str,
    monkeypatch: pytest.MonkeyPatch,
    any_provider: DockerProvider,
) -> None:
    if counters == "in-sandbox":  # as for a driver that is not on the engine's host
        monkeypatch.setattr(docker_provider, "_HOST_OOM_FILES", ())
    box = await _new(any_provider, fresh, memory_mb=64)
    r = await box.exec(["python3", "-c", "x = bytearray(2**29)"])
    assert r.exit_code == 137 and r.oom_killed and not r.timed_out, r
    # The sandbox survives, and a later ordinary kill -9 is not blamed on the OOM killer.
    assert (await box.exec("echo alive")).stdout == "alive\n"
    r = await box.exec("kill -9 $$")
    assert r.exit_code == 137 and not r.oom_killed


async def test_fork_bomb_is_contained(
    any_provider: DockerProvider, fresh: list[DockerSandbox]
) -> None:
    box = await _new(any_provider, fresh, pids=64)
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    r = await box.exec(["python3", "-c", bomb], timeout=5)
    assert r.timed_out and r.exit_code == 124
    # The pids cgroup refused forks (the limit was reached), the bomb is gone, the box answers.
    events = await box.exec(
        "cat /sys/fs/cgroup/pids/pids.events /sys/fs/cgroup/pids.events 2>/dev/null"
    )
    assert int(events.stdout.split()[1]) > 0, events.stdout
    assert (await box.exec("echo alive")).stdout == "alive\n"
    assert await _procs(box, "python3 -c") == []
    # The classic shell bomb: its first shell returns at once and leaves the bomb running in
    # the background (or, when its own second fork loses the race for a pid, bash retries
    # until the deadline kills it, bomb and all: its process group). The pids limit holds a
    # bomb left running once it has taken every pid. (Once, in CI through `docker exec`, the
    # bomb was down to 5 pids for the whole 30 s wait: a bomb whose shells give up their fork
    # retries can die out on its own. Then nothing holds a pid, and a command must run.)
    r = await box.exec(":(){ :|:& };:", timeout=10)
    assert r.exit_code == 0 or r.timed_out, r
    died_out = False
    if not r.timed_out and _host_pids_current(box.id) is not None:
        for _ in range(120):
            current = _host_pids_current(box.id)
            assert current is not None and current <= 64, current
            if current == 64:
                break
            await anyio.sleep(0.25)
        died_out = current < 32  # far from the limit after 30 s: not a bomb racing for pids
    # While the bomb holds every pid a command runs (when a retrying bash gives one up) or is
    # refused with the fork's own error: no hang, and the sandbox stays in the caller's hands.
    # Through `docker exec` the refused fork may be runc's own (its init cannot start the
    # process in the full cgroup: "unable to start container process ... read init-p").
    r = await box.exec(["echo", "alive"], timeout=10)
    refused = ("Resource temporarily unavailable", "unable to start container process")
    if died_out:
        assert r.stdout == "alive\n", r
    else:
        assert r.stdout == "alive\n" or (r.exit_code in (125, 126) and any(m in r.stderr for m in refused)), r
    if isinstance(box.transport, DockerExecdTransport):
        # A reset ends the bomb (builtins only), leaves init and execd, and commands run again.
        assert await box.reset() is True
        assert (await box.exec(["echo", "alive"])).stdout == "alive\n"
        ps = await box.exec(["ps", "-eo", "args="])
        assert [a for a in ps.stdout.splitlines() if not a.startswith("ps ")] != []
        assert all("python3" in a for a in ps.stdout.splitlines()
                   if not a.startswith("ps ")), ps.stdout
    else:
        # Without execd there is no reset: the sandbox can still be removed, bomb and all.
        await any_provider.remove(box.id)
        assert box.id not in {i.id for i in await any_provider.list({"sandgym.run": RUN})}


def _host_pids_current(container_id: str) -> int | None:
    for path in (f"/sys/fs/cgroup/pids/docker/{container_id}/pids.current",
                 f"/sys/fs/cgroup/docker/{container_id}/pids.current",
                 f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/pids.current"):
        try:
            return int(Path(path).read_text())
        except OSError:
            continue
    return None


async def test_timeout_kills_the_command_and_all_its_children(any_sb: DockerSandbox) -> None:
    sb = any_sb
    t0 = time.monotonic()
    r = await sb.exec("sleep 100 & setsid sleep 101 & sleep 102; echo never", timeout=2)
    elapsed = time.monotonic() - t0
    print(f"sleep 100 with timeout 2 came back after {elapsed:.2f} s")
    assert r.timed_out and r.exit_code == 124
    assert "never" not in r.stdout
    assert elapsed < 100  # it did not wait for the command to end on its own
    # Children in the process group, and the one that left it with setsid, are all gone.
    assert await _procs(sb, "sleep 10") == []


async def test_host_deadline_without_the_timeout_binary(exec_sb: DockerSandbox) -> None:
    # A PATH without coreutils' `timeout`: that call runs unwrapped, and the host deadline
    # plus the kill sweep end it and its children all the same.
    sb = exec_sb
    assert isinstance(sb.transport, DockerExecTransport)
    r = await sb.exec(["/bin/sh", "-c", "/bin/sleep 103 & /bin/sleep 104"], timeout=2,
                      env={"PATH": "/nowhere"})
    assert r.timed_out and r.exit_code == 124
    assert await _procs(sb, "sleep 10") == []
    assert sb.transport.use_timeout_wrapper  # one call's PATH does not change the image's
    ok = await sb.exec(["/bin/echo", "hi"], env={"PATH": "/nowhere"})
    assert ok.exit_code == 0 and ok.stdout == "hi\n"


async def test_background_child_does_not_hold_exec_open(sb: DockerSandbox) -> None:
    r = await sb.exec("sleep 30 & echo started", timeout=20)
    assert r.exit_code == 0 and not r.timed_out and r.stdout == "started\n"
    assert await _procs(sb, "sleep 30") != []  # background work keeps running, as in a shell
    await sb.exec("pkill -f 'sleep 30'")


async def test_cancelled_exec_kills_its_processes(any_sb: DockerSandbox) -> None:
    sb = any_sb
    with anyio.move_on_after(1.5) as scope:
        await sb.exec("setsid sleep 56 & sleep 55", timeout=60)
    assert scope.cancelled_caught
    # The worker thread sweeps the command's processes shortly after the cancel.
    for _ in range(50):
        if not await _procs(sb, "sleep 55"):
            break
        await anyio.sleep(0.1)
    assert await _procs(sb, "sleep 55") == []
    assert await _procs(sb, "sleep 56") == []


async def test_output_is_capped_without_buffering_it_all(sb: DockerSandbox) -> None:
    r = await sb.exec("head -c 10000000 /dev/zero; head -c 3000000 /dev/zero >&2; echo done >&2")
    assert r.exit_code == 0 and r.truncated
    assert r.output_limit == SPEC.output_limit_bytes
    assert len(r.stdout_bytes) == len(r.stderr_bytes) == SPEC.output_limit_bytes
    # 50 MB through the driver: peak Python memory stays near the caps, not the volume.
    tracemalloc.start()
    try:
        r = await sb.exec("head -c 50000000 /dev/zero")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.truncated and len(r.stdout_bytes) == SPEC.output_limit_bytes
    assert peak < 8 * SPEC.output_limit_bytes, f"peak {peak} bytes for 50 MB of output"
    small = await sb.exec("echo short")
    assert not small.truncated and small.stdout == "short\n"


async def test_binary_output_survives(sb: DockerSandbox) -> None:
    r = await sb.exec("head -c 4096 /dev/urandom")
    assert r.exit_code == 0 and len(r.stdout_bytes) == 4096
    blob = os.urandom(1 << 16) + b"\x00\xff\xfe\x80"
    await sb.write_file("rand.bin", blob)
    again = await sb.exec(["cat", "rand.bin"])
    assert again.stdout_bytes == blob
    assert await sb.read_file("rand.bin") == blob
    await sb.exec("rm rand.bin")


async def test_stdin(sb: DockerSandbox) -> None:
    assert (await sb.exec("tr a-z A-Z", stdin="hello\n")).stdout == "HELLO\n"
    big = os.urandom(3 << 20)
    r = await sb.exec("sha256sum | cut -d' ' -f1", stdin=big)
    import hashlib

    assert r.stdout.strip() == hashlib.sha256(big).hexdigest()
    # Reading and writing at once (cat echoes 3 MiB back while we still send).
    r = await sb.exec("cat", stdin=big)
    assert r.truncated and r.stdout_bytes == big[: SPEC.output_limit_bytes]
    # No stdin means end of file at once, not a hang.
    assert (await sb.exec("cat; echo eof", timeout=10)).stdout == "eof\n"


async def test_env_and_cwd(provider: DockerProvider, fresh: list[DockerSandbox]) -> None:
    box = await _new(provider, fresh, env={"FROM_SPEC": "s"})
    await box.exec("mkdir -p sub/deeper")
    r = await box.exec('echo "$FROM_SPEC $FROM_CALL"; pwd', env={"FROM_CALL": "c"}, cwd="sub")
    assert r.stdout == "s c\n/workspace/sub\n"
    assert (await box.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    r = await box.exec("pwd", cwd="no/such/dir")
    assert r.exit_code == 126 and "no such file" in r.stderr.lower() and r.stdout == ""
    r = await box.exec(["no-such-program"])
    assert r.exit_code == 127


async def test_files_are_owned_by_the_sandbox_user(sb: DockerSandbox) -> None:
    await sb.write_file("own/dir/f.txt", "one\n", mode=0o600)
    r = await sb.exec(
        "stat -c '%u %a' own/dir/f.txt own/dir; echo two >> own/dir/f.txt; cat own/dir/f.txt"
    )
    assert r.stdout.splitlines() == ["1000 600", "1000 755", "one", "two"], r.stderr
    await sb.write_file("/tmp/abs.txt", b"abs")
    assert await sb.read_file("/tmp/abs.txt") == b"abs"
    await sb.exec("rm -rf own /tmp/abs.txt")


async def test_read_missing_file(sb: DockerSandbox) -> None:
    with pytest.raises(SandboxFileNotFound):
        await sb.read_file("nope/missing.txt")
    with pytest.raises(SandboxFileNotFound):
        await sb.get_archive("/tmp/missing")


async def test_directory_round_trip(sb: DockerSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 41\n")
    (src / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(50_000))
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    await sb.upload(src, "proj")
    r = await sb.exec(
        "cd proj && ./run.sh && python3 -c 'import pkg.mod as m; print(m.X + 1)'"
        " && stat -c %u pkg/mod.py"
    )
    assert r.stdout.split() == ["ran", "42", "1000"], r.stderr
    await sb.exec("echo inside > proj/pkg/new.txt")
    back = await sb.download("proj", tmp_path / "back")
    assert (back / "pkg" / "mod.py").read_text() == "X = 41\n"
    data = "pkg/sub/data.bin"
    assert (back / data).read_bytes() == (src / data).read_bytes()
    assert (back / "pkg" / "new.txt").read_text() == "inside\n"
    assert os.access(back / "run.sh", os.X_OK)
    # A raw archive into /tmp (tmpfs under a read-only root) works too.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("t.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"tmp"))
    await sb.put_archive("/tmp/arch", buf.getvalue())
    assert await sb.read_file("/tmp/arch/t.txt") == b"tmp"
    await sb.exec("rm -rf proj /tmp/arch")


async def test_concurrent_execs(sb: DockerSandbox) -> None:
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        results[i] = (await sb.exec(f"sleep 0.2; echo {i}")).stdout

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert results == {i: f"{i}\n" for i in range(8)}


async def test_list_remove_close(provider: DockerProvider) -> None:
    box = await provider.create(SPEC, {**LABELS, "case": "list"})
    try:
        assert isinstance(box.transport, Transport)
        found = await provider.list({"case": "list", "sandgym.run": RUN})
        assert [i.id for i in found] == [box.id]
        assert found[0].status == "running" and found[0].labels["case"] == "list"
        assert found[0].owner == "test-docker-provider" and found[0].image == SPEC.image
        assert box.id in {i.id for i in await provider.list()}
    finally:
        await box.close()
    await box.close()
    await provider.remove(box.id)  # already gone: fine
    assert await provider.list({"case": "list", "sandgym.run": RUN}) == []
    with pytest.raises(SandboxGoneError):
        await box.exec("true")


async def test_gone_container_raises(provider: DockerProvider) -> None:
    box = await provider.create(SPEC, LABELS)
    await provider.remove(box.id)  # e.g. reaped behind the sandbox's back
    with pytest.raises(SandboxGoneError):
        await box.exec("true")
    await box.close()


async def test_container_ends_itself_after_ttl(provider: DockerProvider) -> None:
    box = await provider.create(SPEC.model_copy(update={"ttl_s": 5}), {**LABELS, "case": "ttl"})
    try:
        assert (await box.exec("echo up")).stdout == "up\n"
        for _ in range(300):  # no driver action: the main process ends, the provider's watcher removes it
            if not await provider.list({"case": "ttl", "sandgym.run": RUN}):
                break
            await anyio.sleep(0.2)
        assert await provider.list({"case": "ttl", "sandgym.run": RUN}) == []
    finally:
        await box.close()


# -- execd, the in-sandbox exec daemon ----------------------------------------------------

NOPY_IMAGE = "sandgym-test/nopython:latest"


@pytest.fixture(scope="module")
def nopython_image(provider: DockerProvider) -> str:
    """sandgym/base without python3 (built locally from it, no network)."""
    import docker

    client = provider.client
    client.images.build(
        fileobj=io.BytesIO(
            b"FROM sandgym/base:latest\nUSER root\n"
            b"RUN rm -f /usr/bin/python3* /usr/local/bin/python3* && ! command -v python3\n"
        ),
        tag=NOPY_IMAGE, rm=True, network_mode="none", labels={"sandgym.test": "nopython"},
    )
    try:
        yield NOPY_IMAGE
    finally:
        try:
            client.images.remove(NOPY_IMAGE, force=True)
        except docker.errors.APIError:
            pass


async def test_agent_is_the_default_transport(sb: DockerSandbox) -> None:
    assert isinstance(sb.transport, DockerExecdTransport)
    assert sb.transport.execd_pid is not None
    r = await sb.exec("echo $HOME; cat /proc/1/cmdline | tr '\\0' ' '")
    assert r.stdout.splitlines()[0] == "/tmp"
    # execd's own init is PID 1 (it reaps orphans and starts execd again if it is killed)
    assert "/opt/sandgym-execd/server.py" in r.stdout.splitlines()[1]
    assert (await sb.transport.client.ping())["pid"] not in (1, None)


async def test_execd_starts_from_the_hosts_bytecode(sb: DockerSandbox) -> None:
    """A sandbox's execd (server.py, a stub) imports daemon.py from the .pyc the host wrote,
    not compiled at each start, when the sandbox's python3 has the host's version."""
    import importlib.util
    import sys

    from sandgym.sandboxes.execd import EXECD_DIR

    source = EXECD_DIR / "daemon.py"
    pyc = Path(importlib.util.cache_from_source(str(source)))
    assert pyc.stat().st_mtime >= source.stat().st_mtime
    probe = "import sys; sys.path.insert(0, '/opt/sandgym-execd'); import daemon; print(sys.version_info[:2])"
    r = await sb.exec(["python3", "-I", "-S", "-v", "-c", probe])
    assert r.exit_code == 0, r.stderr
    if r.stdout.strip() != str(tuple(sys.version_info[:2])):
        return  # another version: it compiled daemon.py in memory (the import above worked)
    assert f"code object from '/opt/sandgym-execd/__pycache__/{pyc.name}'" in r.stderr, r.stderr[-2000:]


async def test_image_without_python_falls_back_to_docker_exec(
    provider: DockerProvider, fresh: list[DockerSandbox], nopython_image: str
) -> None:
    box = await _new(provider, fresh, image=nopython_image)
    assert isinstance(box.transport, DockerExecTransport)
    assert provider.wants_execd(box.spec) is False  # remembered for the image
    r = await box.exec("echo fallback; command -v python3 || echo none")
    assert r.stdout == "fallback\nnone\n", r.stderr
    since = f"{time.time():.9f}"  # the engine takes fractions: the first box's creates are before it
    again = await _new(provider, fresh, image=nopython_image)
    assert isinstance(again.transport, DockerExecTransport)
    # The second went straight to docker exec: one container made of the image, not an
    # execd attempt first (counted from the engine's events, this module's label: other
    # tests share the engine, its socket root and this image).
    events = provider.api.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"type": "container", "event": "create", "image": nopython_image, "label": f"sandgym.run={RUN}"},
    )  # fmt: skip
    assert [e["id"] for e in events] == [again.id]
    # Each has a socket directory holding only the owner's lifeline (no execd socket).
    for b in (box, again):
        cfg = provider.api.inspect_container(b.id)
        sock_dir = Path(cfg["Config"]["Labels"]["sandgym.socket_dir"])
        assert sock_dir.name == cfg["Name"].lstrip("/")
        assert os.listdir(sock_dir) == ["lifeline"]


async def test_spec_home_wins(provider: DockerProvider, fresh: list[DockerSandbox]) -> None:
    box = await _new(provider, fresh, env={"HOME": "/workspace"})
    assert (await box.exec("echo $HOME")).stdout == "/workspace\n"
    # The default HOME (/tmp) is writable, so tools that keep state there work.
    other = await _new(provider, fresh)
    r = await other.exec("git config --global user.name sandgym && git config --global user.name")
    assert r.exit_code == 0 and r.stdout == "sandgym\n", r.stderr


async def test_socket_dir_is_sealed_and_removed(provider: DockerProvider) -> None:
    box = await provider.create(SPEC, {**LABELS, "case": "sock"})
    try:
        label = provider.api.inspect_container(box.id)["Config"]["Labels"]["sandgym.socket_dir"]
        sock_dir = Path(label)
        assert sock_dir.parent == provider.sockets.root and (sock_dir / "execd.sock").exists()
        # Code in the sandbox cannot replace the socket with one of its own.
        r = await box.exec("rm -f /run/sandgym/execd.sock; touch /run/sandgym/x")
        assert r.exit_code != 0 and "Permission denied" in r.stderr, r.stderr
        assert (await box.exec("echo still")).stdout == "still\n"
    finally:
        await box.close()
    assert not sock_dir.exists()


async def test_remove_by_id_and_prune_clean_socket_dirs(provider: DockerProvider) -> None:
    box = await provider.create(SPEC, {**LABELS, "case": "orphan"})
    sock_dir = Path(provider.api.inspect_container(box.id)["Config"]["Labels"]["sandgym.socket_dir"])
    # Another provider object (a later `sandgym sandbox prune`) removes it by id alone.
    other = DockerProvider()
    try:
        await other.remove(box.id)
        assert not sock_dir.exists()
        # A directory whose container vanished (its TTL ended) goes with a full listing.
        stale = other.sockets.root / other.sockets.new_name()
        stale.mkdir()
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
        young = other.sockets.root / other.sockets.new_name()
        young.mkdir()  # may be a container being created right now: kept
        await other.list()
        assert not stale.exists() and young.exists()
        young.rmdir()
    finally:
        await other.aclose()
        await box.close()


async def test_exec_many_one_round_trip(sb: DockerSandbox) -> None:
    jobs = [ExecJob(["python3", "-c", f"print({i} * {i})"]) for i in range(12)]
    jobs.append(ExecJob("sleep 30; echo never", timeout=1))
    jobs.append(ExecJob("cat; exit 3", stdin="in\n"))
    jobs.append(ExecJob("pwd", cwd="/tmp", env={"X": "1"}))
    results = await sb.exec_many(jobs)
    assert [r.stdout for r in results[:12]] == [f"{i * i}\n" for i in range(12)]
    assert results[12].timed_out and results[12].exit_code == 124 and "never" not in results[12].stdout
    assert (results[13].exit_code, results[13].stdout) == (3, "in\n")
    assert results[14].stdout == "/tmp\n"
    assert await _procs(sb, "sleep 30") == []
    assert await sb.exec_many([]) == []


async def test_exec_many_without_execd(exec_sb: DockerSandbox) -> None:
    results = await exec_sb.exec_many([ExecJob(f"echo {i}") for i in range(4)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]


async def test_reset_gives_a_clean_sandbox(provider: DockerProvider, fresh: list[DockerSandbox]) -> None:
    box = await _new(provider, fresh)
    await box.exec(
        "mkdir -p a/b && echo x > a/b/c && chmod 000 a && echo y > /tmp/y && echo z > /dev/shm/z;"
        " (sleep 301 &) ; setsid sleep 302 & nohup sleep 303 >/dev/null 2>&1 &"
    )
    assert len(await _procs(box, "sleep 30")) == 3
    assert await box.reset() is True
    r = await box.exec("ls -A /workspace /tmp /dev/shm; stat -c %a /workspace")
    assert r.stdout.split() == ["/dev/shm:", "/tmp:", "/workspace:", "755"], r.stdout
    ps = await box.exec(["ps", "-eo", "pid=,args="])
    pids = [line.split()[0] for line in ps.stdout.splitlines() if not line.split()[1] == "ps"]
    assert sorted(pids, key=int) == ["1", str(box.transport.execd_pid)], ps.stdout  # type: ignore[attr-defined]
    assert (await box.exec("echo again > f && cat f")).stdout == "again\n"


async def test_reset_is_refused_without_execd(exec_sb: DockerSandbox) -> None:
    assert await exec_sb.reset() is False
