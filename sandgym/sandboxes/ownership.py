"""Who owns a sandbox, and whether that owner is still alive (crash-safe cleanup).

Every sandbox carries `sandgym.owner` (the manager's run id), `sandgym.pid` (the driving
process), `sandgym.pid_start` (that process's start time, so a recycled pid is not mistaken
for the original) and `sandgym.host`. `prune` removes sandboxes whose owner process on this
host is gone.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from .base import Provider
from .result import SandboxInfo
from .spec import LABEL_HOST, LABEL_OWNER, LABEL_PID

LABEL_PID_START = "sandgym.pid_start"


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


def owner_labels(run_id: str) -> dict[str, str]:
    pid = os.getpid()
    labels = {LABEL_OWNER: run_id, LABEL_PID: str(pid), LABEL_HOST: socket.gethostname()}
    start = process_start_time(pid)
    if start is not None:
        labels[LABEL_PID_START] = start
    return labels


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def owner_alive(labels: dict[str, str]) -> bool:
    """True when the process that made the sandbox still runs (or lives on another host,
    which we cannot check and must not touch)."""
    host = labels.get(LABEL_HOST)
    if host and host != socket.gethostname():
        return True
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


@dataclass
class PruneReport:
    removed: list[str]
    kept: list[str]
    failed: dict[str, str]


async def prune(provider: Provider, *, everything: bool = False) -> PruneReport:
    """Remove sandboxes whose owner process is dead (or all sandgym sandboxes if `everything`)."""
    removed: list[str] = []
    kept: list[str] = []
    failed: dict[str, str] = {}
    infos: list[SandboxInfo] = await provider.list()
    for info in infos:
        if not everything and owner_alive(info.labels):
            kept.append(info.id)
            continue
        try:
            await provider.remove(info.id)
            removed.append(info.id)
        except Exception as exc:  # keep going; report what could not be removed
            failed[info.id] = repr(exc)
    return PruneReport(removed=removed, kept=kept, failed=failed)
