"""Sandboxes of a process that died are cleaned up without anyone running `prune`
(ownership.py has the contract), on the docker and local providers:

- an `sandgym eval` SIGKILLed mid-run, its sandboxes told to outlive it (a long
  SANDGYM_ORPHAN_GRACE_S, so only a reaper can end them): the next sandgym command on the
  host removes them all within 60 s, and leaves the sandboxes of a live owner alone;
- with no sandgym process left on the host, a dead owner's sandbox stops by itself within
  the bound its grace sets (grace + TEARDOWN_S), never before the grace is over (the
  container stops; the next reaper removes it), also when
  a forked child of the owner lives on; on docker both for execd images and for images
  without python3 (a `sh` watches the lifeline there);
- `platform` sandboxes (`sandgym serve`'s) outlive their creating process: no lifeline
  ends them and no reaper removes them;
- several sandgym processes reaping at once all succeed (removal is idempotent).

The live owner and the dead eval never reap (`reap_orphans=False` / killed), so what
removes the orphans is the command under test.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgym.sandboxes.ownership import LABEL_OWNER_KIND
from sandgym.sandboxes.providers.local.cgroup import pids_with_env
from sandgym.sandboxes.providers.local.provider import SANDBOX_ID_ENV, LocalProvider, _holder_alive, _read_meta
from sandgym.sandboxes.spec import LABEL_PID
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 5  # the self-stop grace these tests configure (the default is 0)
TEARDOWN_S = 10.0  # allowance past the grace for the box to stop (and docker to remove it)
REAP_BOUND_S = 60.0  # what the issue asks: no dead owner's sandbox left after this
NOPY_IMAGE = "sandgym-test/nopython-orphans:latest"

pytestmark = pytest.mark.anyio

# A process that owns sandboxes and stays alive: prints their ids, then on "check" runs a
# command in each and answers OK. It does not reap, so it cannot be what removes orphans.
LIVE_OWNER = textwrap.dedent("""
    import sys, anyio
    from sandgym.sandboxes import SandboxManager, SandboxSpec
    async def main():
        async with SandboxManager(sys.argv[1], reap_orphans=False, max_sandboxes=2) as mgr:
            boxes = [await mgr.acquire(SandboxSpec(memory_mb=128, disk_mb=16)) for _ in range(2)]
            print("READY", *[b.id for b in boxes], flush=True)
            for line in sys.stdin:
                rs = [await b.exec("echo ok") for b in boxes]
                print("OK" if all(r.stdout == "ok\\n" for r in rs) else "BAD", flush=True)
    anyio.run(main)
""")

# A process that makes sandboxes (one per image in argv[3:]) with the given owner kind,
# starts a background process in each, forks a child that outlives it (holding nothing of
# ours), prints the child's pid and the ids, and waits to be killed.
DYING_OWNER = textwrap.dedent("""
    import os, sys, time, anyio
    from sandgym.sandboxes import SandboxManager, SandboxSpec
    async def main():
        provider, kind, images = sys.argv[1], sys.argv[2], sys.argv[3:]
        async with SandboxManager(provider, owner_kind=kind, reap_orphans=False, max_sandboxes=4) as mgr:
            if os.environ.get("FOREIGN_HOST"):  # no reaper on this host may remove them
                mgr.labels["sandgym.host"] = os.environ["FOREIGN_HOST"]
            boxes = [await mgr.acquire(SandboxSpec(image=i, memory_mb=128, disk_mb=16)) for i in images]
            for b in boxes:
                assert (await b.exec("sleep 1000 >/dev/null 2>&1 &")).exit_code == 0
            child = os.fork()
            if child == 0:  # a forked child must not keep our sandboxes alive
                time.sleep(120)
                os._exit(0)
            print("READY", child, *[b.id for b in boxes], flush=True)
            await anyio.sleep(600)
    anyio.run(main)
""")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


@pytest.fixture
def local_root() -> Iterator[str]:
    # A root of our own: no other process's reaper looks there. Not under tmp_path (0700):
    # sandboxes run as unprivileged uids.
    d = tempfile.mkdtemp(prefix="sandgym-orphans-")
    os.chmod(d, 0o711)
    yield d
    p = LocalProvider(d)
    for info in p._list_sync({}):
        p._remove_sync(info.id)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def nopython_image() -> Iterator[str]:
    """sandgym/base without python3 (built locally from it, no network): no execd."""
    require("docker")
    import docker

    client = docker.from_env()
    client.images.build(
        fileobj=io.BytesIO(
            b"FROM sandgym/base:latest\nUSER root\n"
            b"RUN rm -f /usr/bin/python3* /usr/local/bin/python3* && ! command -v python3\nUSER 1000\n"
        ),
        tag=NOPY_IMAGE, rm=True, network_mode="none", labels={"sandgym.test": "nopython"},
    )  # fmt: skip
    try:
        yield NOPY_IMAGE
    finally:
        try:
            client.images.remove(NOPY_IMAGE, force=True)
        except docker.errors.APIError:
            pass
        client.close()


def _sandboxes(provider: str, root: str | None, **labels: str) -> list[str]:
    """Ids of the sandboxes with these labels, as a fresh provider lists them."""
    if provider == "docker":
        import docker

        client = docker.from_env()
        try:
            wanted = [f"{k}={v}" for k, v in labels.items()]
            return [c["Id"] for c in client.api.containers(all=True, filters={"label": wanted})]
        finally:
            client.close()
    return [i.id for i in LocalProvider(root)._list_sync(dict(labels))]


def _running(provider: str, **labels: str) -> list[str]:
    """Ids of the running docker containers with these labels."""
    import docker

    client = docker.from_env()
    try:
        wanted = [f"{k}={v}" for k, v in labels.items()]
        return [c["Id"] for c in client.api.containers(filters={"label": wanted})]
    finally:
        client.close()


def _remove_all(provider: str, root: str | None, ids: list[str]) -> None:
    if provider == "docker":
        import docker

        client = docker.from_env()
        for cid in ids:
            try:
                client.api.remove_container(cid, force=True)
            except docker.errors.APIError:
                pass
        client.close()
    else:
        for sid in ids:
            LocalProvider(root)._remove_sync(sid)


def _settled(provider: str, root: str | None, pid: int) -> list[str]:
    # A create the engine was still serving when the owner died may finish (or fail and
    # be removed) a moment later: take the list once it stops changing.
    ids = _sandboxes(provider, root, **{LABEL_PID: str(pid)})
    for _ in range(20):
        time.sleep(0.25)
        now = _sandboxes(provider, root, **{LABEL_PID: str(pid)})
        if now == ids:
            break
        ids = now
    return ids


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---- the host reaper -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "provider,command",
    [
        ("docker", ["sandbox", "run", "--provider", "docker", "--", "true"]),  # opens a SandboxManager
        ("local", ["sandbox", "ls", "--provider", "local", "--json"]),
    ],
)
def test_killed_eval_orphans_are_reaped_by_the_next_command(
    provider: str, command: list[str], local_root: str, tmp_path: Path
) -> None:
    if provider == "docker":
        require("docker")
    root = local_root if provider == "local" else None
    env = _env(SANDGYM_LOCAL_ROOT=local_root)
    live = subprocess.Popen(
        [sys.executable, "-c", LIVE_OWNER, provider], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    run = tmp_path / "run"
    killed: subprocess.Popen[str] | None = None
    orphans: list[str] = []
    try:
        assert live.stdout is not None and live.stdin is not None
        ready = live.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        live_ids = ready[1:]

        # The orphans must outlive their owner on their own: only a reaper may end them.
        killed = subprocess.Popen(
            [sys.executable, "-m", "sandgym", "eval", "humaneval_tools", "--policy", "oracle", "-n", "60",
             "-c", "4", "--provider", provider, "-o", str(run)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**env, "SANDGYM_ORPHAN_GRACE_S": "3600"},
        )  # fmt: skip
        results = run / "results.jsonl"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and killed.poll() is None:
            if results.exists() and results.read_text().count("\n") >= 3:
                break
            time.sleep(0.05)
        at_kill = _sandboxes(provider, root, **{LABEL_PID: str(killed.pid)})
        _kill(killed)
        done = results.read_text().count("\n") if results.exists() else 0
        assert 3 <= done < 60, f"the kill should land mid-run ({done} rollouts recorded)"
        orphans = _settled(provider, root, killed.pid)
        # Any sandgym process on the host may reap them from now on (a manager left open by
        # an earlier test, a fleet agent): what must hold is that they existed, then go.
        assert at_kill or orphans, "the SIGKILLed eval had no sandboxes: the kill did not land mid-run"

        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "sandgym", *command], capture_output=True, text=True,
                             env=env, timeout=REAP_BOUND_S)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        left = orphans or at_kill
        while left and time.monotonic() - start < REAP_BOUND_S:
            left = _sandboxes(provider, root, **{LABEL_PID: str(killed.pid)})
            time.sleep(0.2)
        assert left == [], f"sandboxes of the dead eval still there after {REAP_BOUND_S}s: {left}"
        if "--json" in command:  # `ls` shows what it found, and that it removed it
            rows = {r["id"]: r for r in json.loads(out.stdout)}
            assert all(rows[i]["owner_alive"] is False and rows[i]["reaped"] for i in orphans if i in rows)
            assert all(rows[i]["owner_alive"] is True and not rows[i]["reaped"] for i in live_ids)

        # The live owner's sandboxes are untouched and still work.
        assert set(live_ids) <= set(_sandboxes(provider, root, **{LABEL_PID: str(live.pid)}))
        live.stdin.write("check\n")
        live.stdin.flush()
        assert live.stdout.readline().strip() == "OK"
    finally:
        if killed is not None:
            _kill(killed)
            _remove_all(provider, root, _sandboxes(provider, root, **{LABEL_PID: str(killed.pid)}))
        if live.stdin is not None:
            live.stdin.close()  # it leaves `async with` and removes its own sandboxes
        try:
            live.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _kill(live)
        _remove_all(provider, root, _sandboxes(provider, root, **{LABEL_PID: str(live.pid)}))


@pytest.mark.parametrize("provider", ["docker", "local"])
def test_concurrent_reapers_all_succeed(provider: str, local_root: str) -> None:
    if provider == "docker":
        require("docker")
    root = local_root if provider == "local" else None
    env = _env(SANDGYM_LOCAL_ROOT=local_root)
    images = ["sandgym/python:latest"] * 4
    owner = subprocess.Popen(
        [sys.executable, "-c", DYING_OWNER, provider, "process", *images], stdout=subprocess.PIPE, text=True,
        env={**env, "SANDGYM_ORPHAN_GRACE_S": "3600"}, start_new_session=True,
    )  # fmt: skip
    child = 0
    try:
        assert owner.stdout is not None
        ready = owner.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        child, ids = int(ready[1]), ready[2:]
        _kill(owner)
        # Any other sandgym process on the host (other tests' managers, in parallel) may reap
        # the orphans as soon as their owner is dead: what is left is some of ours, nothing else.
        assert set(_settled(provider, root, owner.pid)) <= set(ids)
        prunes = [
            subprocess.Popen([sys.executable, "-m", "sandgym", "sandbox", "prune", "--provider", provider, "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(3)
        ]  # fmt: skip
        reports = []
        for p in prunes:
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, stderr[-2000:]
            reports.append(json.loads(stdout.strip().splitlines()[-1]))
        assert all(r["failed"] == {} for r in reports), reports
        # Any other sandgym process on the host (other tests' managers) may reap them too:
        # none of the prunes may have judged one alive, and none may be left.
        assert not set(ids) & {i for r in reports for i in r["kept"]}, reports
        assert _sandboxes(provider, root, **{LABEL_PID: str(owner.pid)}) == []
    finally:
        _kill(owner)
        if child:
            _kill_pid(child)
        _remove_all(provider, root, _sandboxes(provider, root, **{LABEL_PID: str(owner.pid)}))


# ---- the lifeline: no sandgym process left ---------------------------------------------------


def _docker_events(ids: list[str], since: float) -> dict[str, list[tuple[str, float]]]:
    """(action, time) of each container's events since `since` (wall clock)."""
    import docker

    client = docker.from_env()
    try:
        out: dict[str, list[tuple[str, float]]] = {i: [] for i in ids}
        for ev in client.events(since=since - 1, until=time.time() + 0.5, decode=True,
                                filters={"type": "container"}):  # fmt: skip
            cid = ev.get("id") or ev.get("Actor", {}).get("ID")
            if cid in out:
                out[cid].append((ev.get("Action", ev.get("status", "")), ev["timeNano"] / 1e9))
        return out
    finally:
        client.close()


def test_docker_sandbox_of_a_dead_owner_stops_itself(nopython_image: str) -> None:
    """execd (sandgym/python) and the `sh` main process (an image without python3) both
    end the container once the owner is gone, after the grace and within the bound. They are
    labelled as another host's: every sandgym process on this host reaps dead owners' sandboxes
    (other tests' managers, in parallel), and what is tested here is that none is needed."""
    require("docker")
    env = _env(SANDGYM_ORPHAN_GRACE_S=str(GRACE_S), FOREIGN_HOST=f"elsewhere-{uuid.uuid4().hex[:8]}")
    owner = subprocess.Popen(
        [sys.executable, "-c", DYING_OWNER, "docker", "process", "sandgym/python:latest", nopython_image],
        stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    child = 0
    ids: list[str] = []
    try:
        assert owner.stdout is not None
        ready = owner.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        child, ids = int(ready[1]), ready[2:]
        transports = {_label(i, "sandgym.transport") for i in ids}
        assert transports == {"execd", "docker-exec"}  # both kinds of main process
        mine = {LABEL_PID: str(owner.pid)}
        killed_at = time.time()
        os.kill(owner.pid, signal.SIGKILL)  # the forked child lives on
        owner.wait()
        deadline = time.monotonic() + GRACE_S + TEARDOWN_S
        left = ids
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [i for i in ids if i in _running("docker", **mine)]
        assert left == [], f"still running {GRACE_S + TEARDOWN_S}s after the owner died: {left}"
        # Stopped, not removed: no reaper may touch another host's sandboxes, and the
        # containers are not --rm (so that an engine restart cannot remove them).
        assert sorted(_sandboxes("docker", None, **mine)) == sorted(ids)
        events = _docker_events(ids, killed_at)
        for cid in ids:
            actions = [a for a, _ in events[cid]]
            # It ended itself: its main process exited; nobody killed or removed it first.
            assert "die" in actions and "kill" not in actions, (cid[:12], events[cid])
            died = next(t for a, t in events[cid] if a == "die")
            assert died - killed_at >= GRACE_S - 0.5, f"{cid[:12]} stopped before its grace was over"
    finally:
        _kill(owner)
        if child:
            _kill_pid(child)
        _remove_all("docker", None, _sandboxes("docker", None, **{LABEL_PID: str(owner.pid)}))


def _label(cid: str, key: str) -> str:
    import docker

    client = docker.from_env()
    try:
        return str(client.api.inspect_container(cid)["Config"]["Labels"].get(key, ""))
    finally:
        client.close()


def test_local_sandbox_of_a_dead_owner_stops_itself(local_root: str) -> None:
    """The bwrap namespace's holder ends every process of the sandbox once the owner is
    gone; its directory stays for the next reaper (nobody reaps in this private root)."""
    require("bwrap", "nsenter")  # a persistent namespace with a holder
    p = LocalProvider(local_root)
    assert p.capabilities.nsenter is not None, p.capabilities.summary()
    owner = subprocess.Popen(
        [sys.executable, "-c", DYING_OWNER, "local", "process", "any"], stdout=subprocess.PIPE, text=True,
        env=_env(SANDGYM_LOCAL_ROOT=local_root, SANDGYM_ORPHAN_GRACE_S=str(GRACE_S)), start_new_session=True,
    )  # fmt: skip
    child = 0
    try:
        assert owner.stdout is not None
        ready = owner.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        child, (sid,) = int(ready[1]), ready[2:]
        meta = _read_meta(Path(local_root) / sid)
        assert meta is not None and meta.init_pid and _holder_alive(meta)
        assert pids_with_env(SANDBOX_ID_ENV, sid)  # the holder and the background `sleep`
        killed_at = time.monotonic()
        os.kill(owner.pid, signal.SIGKILL)  # the forked child lives on
        owner.wait()
        while _holder_alive(meta) and time.monotonic() - killed_at < GRACE_S + TEARDOWN_S:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed_at
        assert not _holder_alive(meta), f"still running {GRACE_S + TEARDOWN_S}s after the owner died"
        assert gone_after >= GRACE_S, f"stopped {gone_after:.2f}s after the owner died, before its grace"
        # Every process of it, the background one too. The holder counts as gone once its
        # namespaces are, which the kernel drops before it has finished killing the pid
        # namespace's other processes (a CI run found the background `sleep` a moment later).
        deadline = time.monotonic() + TEARDOWN_S
        while pids_with_env(SANDBOX_ID_ENV, sid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_with_env(SANDBOX_ID_ENV, sid) == set()
        (info,) = LocalProvider(local_root)._list_sync({})
        assert info.id == sid and info.status == "exited"  # stopped itself; nothing removed it
    finally:
        _kill(owner)
        if child:
            _kill_pid(child)


@pytest.mark.parametrize("provider", ["docker", "local"])
def test_platform_sandboxes_outlive_their_creator(provider: str, local_root: str) -> None:
    if provider == "docker":
        require("docker")
    root = local_root if provider == "local" else None
    env = _env(SANDGYM_LOCAL_ROOT=local_root)
    owner = subprocess.Popen(
        [sys.executable, "-c", DYING_OWNER, provider, "platform", "sandgym/python:latest"], stdout=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    child = 0
    ids: list[str] = []
    try:
        assert owner.stdout is not None
        ready = owner.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        child, ids = int(ready[1]), ready[2:]
        _kill(owner)
        time.sleep(2)  # a lifeline (there is none) would have ended it by now
        for cmd in (["sandbox", "ls", "--json"], ["sandbox", "prune", "--json"]):
            out = subprocess.run([sys.executable, "-m", "sandgym", *cmd, "--provider", provider],
                                 capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
        assert ids == _sandboxes(provider, root, **{LABEL_PID: str(owner.pid), LABEL_OWNER_KIND: "platform"})
        if provider == "docker":
            import docker

            client = docker.from_env()
            assert client.api.inspect_container(ids[0])["State"]["Running"] is True
            client.close()
        else:
            meta = _read_meta(Path(local_root) / ids[0])
            assert meta is not None and _holder_alive(meta)
    finally:
        _kill(owner)
        if child:
            _kill_pid(child)
        _remove_all(provider, root, ids)

