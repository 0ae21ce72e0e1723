"""Who owns a sandbox, whether that owner is still alive, and what ends a sandbox whose
owner is gone (crash-safe cleanup without anyone running `prune`).

Labels every sandbox carries (providers stamp the missing ones from the creating process):

- `sandgym.owner`: the manager's run id; `sandgym.host`: the creating host's name;
  `sandgym.pid`, `sandgym.pid_start`: the creating process and its start time (so a
  recycled pid is never mistaken for the original).
- `sandgym.owner_kind`: `process` (the default) or `platform`.
- `sandgym.orphan_grace_s`: `process` sandboxes only; see the lifeline below.

The contract, by owner kind:

- **process** (eval, train, swe, `sandbox run`, any `SandboxManager`, a bare provider): the
  sandbox lives only as long as the process that made it. Two mechanisms end it when that
  process dies, however it dies (SIGKILL, OOM kill, a crash):
  1. The **host reaper**: every sandgym process that opens a `SandboxManager` runs `prune`
     on its provider in the background, at start and then every minute, and
     `sandgym sandbox ls` / `prune` do it once. It removes exactly the sandboxes that
     `orphaned()` says are gone: made on THIS host (`sandgym.host`), owner kind `process`,
     and a `sandgym.pid` that no longer runs or now runs another process (`pid_start`).
     Removal is idempotent, so several sandgym processes reaping at once do no harm.
  2. The **owner lifeline**, for when no sandgym process is left on the host: the creating
     process holds one end of a pipe whose other end a watcher inside the sandbox reads
     (docker: a FIFO in the per-container socket directory, read by execd or, for images
     without python3, by the `sh` main process; local: a pipe into the bwrap namespace's
     holder). The kernel closes the owner's end when the owner dies, so the watcher sees
     end-of-file at once and, `sandgym.orphan_grace_s` seconds later (default 0,
     `SANDGYM_ORPHAN_GRACE_S` or `SandboxManager(orphan_grace_s=...)`), ends the sandbox's
     main process: the container stops (its disk is released; the stopped container waits
     for the next reaper, as it is not `--rm`: docker/events.py says why); the local
     namespace dies with all its processes (its directory waits for the next reaper). Nothing is renewed, so a
     late renewal cannot kill a live owner's sandbox: a suspended laptop, an overloaded
     machine, a stopped (SIGSTOP) or debugged owner, a blocked event loop all keep the
     sandbox, and no exec pays anything for it. The end is held only by the owner: it is
     close-on-exec and closed in `os.fork()` children, so no child keeps a dead owner's
     sandbox alive. The TTL (`spec.ttl_s`) still bounds every sandbox on its own.
  Bound: a sandbox of a dead owner stops within `orphan_grace_s` plus about a second.
  Exceptions, each bounded by the TTL and by the next host reaper: an owner that died
  while the container was being created (before its watcher opened the FIFO); a runtime
  that cannot open host FIFOs (gVisor without `--host-fifo=open`: execd says so on
  stderr); code inside the sandbox that re-opens its watcher's pipe for writing; the
  local provider without a persistent bwrap namespace (no holder to watch).
- **platform** (`sandgym serve`: sandboxes outlive the client that asked for them by
  design, and the server's own restarts): set with `SandboxManager(owner_kind="platform")`.
  Such a sandbox gets no lifeline (only its TTL ends it), the host reaper never removes
  it, and neither does `prune`; only `prune --all`, `sandgym sandbox rm`, or its creator.

Any `sandgym.owner_kind` other than `process` is treated like `platform`. Sandboxes of
another host, and sandboxes without a pid label, are never reaped (we cannot tell).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio

from .base import Provider
from .result import SandboxInfo
from .spec import LABEL_HOST, LABEL_OWNER, LABEL_PID

LABEL_PID_START = "sandgym.pid_start"
LABEL_OWNER_KIND = "sandgym.owner_kind"
LABEL_ORPHAN_GRACE = "sandgym.orphan_grace_s"
OWNER_PROCESS = "process"
OWNER_PLATFORM = "platform"
GRACE_ENV = "SANDGYM_ORPHAN_GRACE_S"
DEFAULT_ORPHAN_GRACE_S = 0.0
_REMOVE_CONCURRENCY = 8


def process_start_time(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parens: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def default_orphan_grace_s() -> float:
    raw = os.environ.get(GRACE_ENV, "")
    if not raw:
        return DEFAULT_ORPHAN_GRACE_S
    try:
        grace = float(raw)
    except ValueError:
        raise ValueError(f"{GRACE_ENV}={raw!r}: expected seconds (a number >= 0)") from None
    if not (grace >= 0 and math.isfinite(grace)):
        raise ValueError(f"{GRACE_ENV}={raw!r}: expected seconds (a number >= 0)")
    return grace


def owner_labels(
    run_id: str, *, owner_kind: str = OWNER_PROCESS, orphan_grace_s: float | None = None
) -> dict[str, str]:
    """The labels a manager stamps on what it creates (this process owns them)."""
    pid = os.getpid()
    labels = {LABEL_OWNER: run_id, LABEL_PID: str(pid), LABEL_HOST: socket.gethostname()}
    start = process_start_time(pid)
    if start is not None:
        labels[LABEL_PID_START] = start
    labels[LABEL_OWNER_KIND] = owner_kind
    if owner_kind == OWNER_PROCESS:
        grace = default_orphan_grace_s() if orphan_grace_s is None else orphan_grace_s
        if not (grace >= 0 and math.isfinite(grace)):
            raise ValueError(f"orphan_grace_s must be >= 0 seconds, got {grace}")
        labels[LABEL_ORPHAN_GRACE] = f"{grace:g}"
    return labels


def stamp_owner(labels: Mapping[str, str]) -> dict[str, str]:
    """`labels` completed with this process as owner where they say nothing (a provider
    used without a manager): every sandbox can then be judged by `orphaned()`."""
    out = dict(labels)
    kind = out.get(LABEL_OWNER_KIND, OWNER_PROCESS)
    for k, v in owner_labels(out.get(LABEL_OWNER, "sandgym"), owner_kind=kind).items():
        out.setdefault(k, v)
    return out


def lifeline_grace_s(labels: Mapping[str, str]) -> float | None:
    """Seconds a sandbox waits after its owner died before stopping itself; None when it
    gets no lifeline (owner kind other than `process`)."""
    if labels.get(LABEL_OWNER_KIND, OWNER_PROCESS) != OWNER_PROCESS:
        return None
    try:
        grace = float(labels.get(LABEL_ORPHAN_GRACE, DEFAULT_ORPHAN_GRACE_S))
    except ValueError:
        return DEFAULT_ORPHAN_GRACE_S
    return grace if grace >= 0 and math.isfinite(grace) else DEFAULT_ORPHAN_GRACE_S


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _pid_alive(labels: Mapping[str, str]) -> bool:
    pid_s = labels.get(LABEL_PID, "")
    if not pid_s.isdigit():
        return False
    pid = int(pid_s)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    start = labels.get(LABEL_PID_START)
    return start is None or process_start_time(pid) == start


def owner_alive(labels: Mapping[str, str]) -> bool:
    """True when the process that made the sandbox still runs (or lives on another host,
    which we cannot check and must not touch)."""
    host = labels.get(LABEL_HOST)
    if host and host != socket.gethostname():
        return True
    return _pid_alive(labels)


def orphaned(labels: Mapping[str, str]) -> bool:
    """True only when we can tell the owner is gone: a `process` sandbox made on this host
    whose pid no longer runs (or runs another process). What the reaper and `prune` remove."""
    if labels.get(LABEL_OWNER_KIND, OWNER_PROCESS) != OWNER_PROCESS:
        return False
    if labels.get(LABEL_HOST) != socket.gethostname() or not labels.get(LABEL_PID, "").isdigit():
        return False
    return not _pid_alive(labels)


@dataclass
class PruneReport:
    removed: list[str]
    kept: list[str]
    failed: dict[str, str]


async def prune(provider: Provider, *, everything: bool = False) -> PruneReport:
    """Remove sandboxes whose owner is gone (`orphaned`), or every sandgym sandbox if
    `everything`. Removals run a few at a time; one that fails is reported, not raised."""
    removed: list[str] = []
    kept: list[str] = []
    failed: dict[str, str] = {}
    infos: list[SandboxInfo] = await provider.list()
    limit = anyio.CapacityLimiter(_REMOVE_CONCURRENCY)

    async def remove(sid: str) -> None:
        async with limit:
            try:
                await provider.remove(sid)
                removed.append(sid)
            except Exception as exc:  # keep going; report what could not be removed
                failed[sid] = repr(exc)

    async with anyio.create_task_group() as tg:
        for info in infos:
            if everything or orphaned(info.labels):
                tg.start_soon(remove, info.id)
            else:
                kept.append(info.id)
    return PruneReport(removed=removed, kept=kept, failed=failed)


# ---- the owner's end of lifelines ----------------------------------------------------------


class Lifeline:
    """The owner's end of one sandbox's lifeline: an fd that only this process holds. While
    it is open the sandbox's watcher sees no end-of-file; `close()` (or this process dying)
    ends it. Close-on-exec, and closed in the child of every `os.fork()`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        with _held_lock:
            _held[fd] = self

    @classmethod
    def fifo(cls, path: str | os.PathLike[str]) -> Lifeline:
        """Make a FIFO at `path` (readable by the sandbox's uid, writable only by us) and
        hold it open read-write: open never blocks, and its watcher sees EOF only once we
        are gone (no writer left)."""
        p = Path(path)
        os.mkfifo(p, 0o600)
        os.chmod(p, 0o644)  # the sandbox user reads; only we may write (umask-proof)
        return cls(os.open(p, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))

    @classmethod
    def pipe(cls) -> tuple[Lifeline, int]:
        """A pipe: (our write end, the read end to hand to the sandbox's watcher; the caller
        closes it once passed on)."""
        r, w = os.pipe()  # both close-on-exec
        return cls(w), r

    def close(self) -> None:
        """Idempotent (a closed fd number may already be another lifeline's)."""
        with _held_lock:
            if _held.get(self.fd) is not self:
                return
            del _held[self.fd]
        try:
            os.close(self.fd)
        except OSError:
            pass


_held: dict[int, Lifeline] = {}
_held_lock = threading.Lock()


def _close_all_in_child() -> None:
    # A forked child is not the owner: were it to outlive us it would keep our sandboxes.
    global _held_lock
    _held_lock = threading.Lock()  # the parent may have held it while forking
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_all_in_child)
