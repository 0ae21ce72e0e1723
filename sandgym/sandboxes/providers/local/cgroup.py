"""Per-sandbox cgroups (v1, or v2 where controllers can be delegated): memory (OOM-killed at the limit, like docker), pids
(fork bombs stop at the limit), cpu (CFS quota for fractional cores).

Every process of a sandbox joins all of its groups before it execs (see exec.py), so
`procs()` is the complete list of what the sandbox runs, whatever it did to escape its
process group, and `kill_all()` can end it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Iterable

CFS_PERIOD_US = 100_000


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def is_v2(cgroup_dir: str) -> bool:
    return os.path.exists(os.path.join(cgroup_dir, "cgroup.controllers"))


def enable_v2_controllers(cgroup_dir: str, ctrls: list[str]) -> None:
    """Let children of `cgroup_dir` use `ctrls` (cgroup v2 subtree_control)."""
    have = _read(os.path.join(cgroup_dir, "cgroup.subtree_control")).split()
    missing = [c for c in ctrls if c not in have]
    if missing:
        _write(os.path.join(cgroup_dir, "cgroup.subtree_control"), " ".join("+" + c for c in missing))


class CgroupSet:
    """The sandbox's group per controller: `paths[controller] = directory`. With cgroup v1
    each controller has its own directory; with v2 they all name the same one."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = dict(paths)

    @property
    def dirs(self) -> list[str]:
        return list(dict.fromkeys(self.paths.values()))

    @classmethod
    def create(
        cls, parents: dict[str, str], name: str, *, memory_mb: int, pids: int, cpu: float
    ) -> CgroupSet:
        made: dict[str, str] = {}
        try:
            for parent in dict.fromkeys(parents.values()):
                ctrls = [c for c, p in parents.items() if p == parent]
                path = os.path.join(parent, name)
                for _ in range(20):
                    # The parent may be going away under a concurrent destroy(): recreate.
                    os.makedirs(parent, 0o755, exist_ok=True)
                    v2 = is_v2(parent)
                    try:
                        if v2:
                            enable_v2_controllers(parent, ctrls)
                        os.mkdir(path, 0o755)
                        break
                    except FileNotFoundError:
                        if os.path.isdir(parent):
                            raise  # e.g. a controller the parent does not have
                        continue
                else:
                    raise OSError(errno.ENOENT, "cgroup parent keeps disappearing", parent)
                for c in ctrls:
                    made[c] = path
                _set_limits(path, ctrls, v2, memory_mb=memory_mb, pids=pids, cpu=cpu)
        except OSError:
            cls(made).destroy()
            raise
        return cls(made)

    def procs_files(self) -> list[str]:
        """Files a new process writes "0" to, to join (written in preexec, before exec)."""
        return [f"{p}/cgroup.procs" for p in self.dirs]

    def procs(self) -> set[int]:
        pids: set[int] = set()
        for p in self.dirs:
            try:
                pids.update(int(x) for x in _read(f"{p}/cgroup.procs").split())
            except OSError:
                pass
        return pids

    def oom_kills(self) -> int | None:
        """The memory group's OOM-kill counter (None without the memory controller)."""
        p = self.paths.get("memory")
        if p is None:
            return None
        name = "memory.events" if is_v2(p) else "memory.oom_control"
        try:
            for line in _read(f"{p}/{name}").splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            return None
        return None

    @property
    def has_memory(self) -> bool:
        return "memory" in self.paths

    @property
    def has_pids(self) -> bool:
        return "pids" in self.paths

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every member until none is left; True when empty."""
        for p in self.dirs:  # v2 (5.14+): one write kills the whole group, forks included
            with contextlib.suppress(OSError):
                _write(f"{p}/cgroup.kill", "1")
        return kill_until_gone(self.procs, timeout)

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill members and remove the groups. Idempotent."""
        self.kill_all(timeout)
        deadline = time.monotonic() + timeout
        for p in self.dirs:
            while True:
                try:
                    os.rmdir(p)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    # EBUSY: a killed member has not left the group yet.
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
            # Drop the shared parent once the last sandbox is gone, so nothing of ours is left
            # inside a cgroup that belongs to whoever started us (EBUSY: others still live).
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(p))


def _set_limits(path: str, ctrls: list[str], v2: bool, *, memory_mb: int, pids: int, cpu: float) -> None:
    quota = max(1000, int(cpu * CFS_PERIOD_US))
    limit = str(memory_mb << 20)
    if v2:
        if "memory" in ctrls:
            _write(f"{path}/memory.max", limit)
            with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                _write(f"{path}/memory.swap.max", "0")
        if "pids" in ctrls:
            _write(f"{path}/pids.max", str(pids))
        if "cpu" in ctrls:
            _write(f"{path}/cpu.max", f"{quota} {CFS_PERIOD_US}")
        return
    if "memory" in ctrls:
        _write(f"{path}/memory.limit_in_bytes", limit)
        # Swap counted in the limit (memory+swap == memory), as docker does.
        with contextlib.suppress(OSError):
            _write(f"{path}/memory.memsw.limit_in_bytes", limit)
        with contextlib.suppress(OSError):
            _write(f"{path}/memory.swappiness", "0")
    if "pids" in ctrls:
        _write(f"{path}/pids.max", str(pids))
    if "cpu" in ctrls:
        _write(f"{path}/cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(f"{path}/cpu.cfs_quota_us", str(quota))


def kill_until_gone(list_pids: Callable[[], Iterable[int]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        pids = {p for p in list_pids() if p != os.getpid() and not _is_zombie(p)}
        if not pids:
            return True
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _is_zombie(pid: int) -> bool:
    try:
        stat = _read(f"/proc/{pid}/stat")
    except OSError:
        return True  # gone
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def pids_of_uid(uid: int) -> set[int]:
    """Live processes whose real uid is `uid` (a sandbox's private host uid)."""
    out: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            out.add(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return out


def pids_with_env(name: str, value: str) -> set[int]:
    """Live processes whose environment holds name=value (the sandbox id every sandbox
    process starts with): the last resort where neither cgroups nor a private uid can
    tell which processes are the sandbox's. Misses what cleared its environment."""
    needle = f"{name}={value}".encode()
    out: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.add(int(pid))
        except OSError:
            continue
    return out
