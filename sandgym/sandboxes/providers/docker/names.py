"""Per-container host folders (execd's socket dir, the loop disk) are named after the container
(`sandgym-` + 16 hex digits); both are swept the same way once their container is gone."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

NAME = re.compile(r"^sandgym-[0-9a-f]{16}$")
# A folder younger than this may belong to a container another process is creating now.
SWEEP_MIN_AGE_S = 120.0


def stale_entries(root: Path, live_names: set[str]) -> list[os.DirEntry[str]]:
    """Entries of `root` named like a container that is not in `live_names` and old enough
    not to be one being created now."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    now = time.time()
    out = []
    for e in entries:
        if not NAME.match(e.name) or e.name in live_names:
            continue
        try:
            if now - e.stat(follow_symlinks=False).st_mtime < SWEEP_MIN_AGE_S:
                continue
        except OSError:
            continue
        out.append(e)
    return out
