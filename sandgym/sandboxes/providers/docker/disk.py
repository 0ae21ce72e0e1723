"""Per-sandbox disks: a sparse ext4 image, loop-mounted, as the sandbox's writable space.

Why this and not the alternatives (docs/design-notes.md has the measurements): overlay2's
`--storage-opt size` needs xfs project quotas and this kind of kernel has no quota support at
all; tmpfs is charged to the memory limit; gVisor's own file-backed overlay kills the whole
sandbox when its file fills. A loop-mounted ext4 gives the writer ENOSPC at the quota, keeps
the sandbox up, charges only reclaimable page cache, and works under runc and gVisor alike.

Layout, one directory per sandbox, named like its container (`sandgym-<16 hex>`):

    DISK_ROOT/<name>/disk.img    the sparse image (apparent size = the quota)
    DISK_ROOT/<name>/disk/       its mount point, holding either
        tmp/                     /tmp (a bind mount), and either
        upper/ work/             a writable root (the runtime wrapper mounts the overlay at
                                 root/ on `create` and points the container at it), or
        w/                       the workdir of a read-only root (a bind mount)

The runtime wrapper (runtime/sandgym-runtime.sh) unmounts and deletes all of it when the
runtime deletes the container's task (its main process has ended, removed or not); `discard` and `sweep` do the same from here, so a
crash of either side leaves nothing behind for long.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from ...errors import SandboxCreateError
from .names import NAME, stale_entries
from .runtime import DISK_ROOT

log = logging.getLogger(__name__)

_MIB = 1 << 20
# Keep this much of the host file system free whatever the quotas say: a host disk that
# fills turns into I/O errors inside every sandbox's file system.
RESERVE_MB = 1024
# -T default: 4 KiB blocks and one inode per 16 KiB at every size (small images would get
# 1 KiB blocks and 4x the inodes, ~8% of the space); no journal (a sandbox's disk dies with
# it), no room reserved for root, lazy init: creating one takes tens of ms.
_MKFS = ["-q", "-F", "-m", "0", "-T", "default", "-O", "^has_journal,^resize_inode",
         "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0"]


def image_mb(disk_mb: int) -> int:
    """The image size that leaves at least `disk_mb` usable (ext4 metadata takes ~1.5%)."""
    return disk_mb + disk_mb // 50 + 1


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SandboxCreateError(f"{argv[0]} failed: {(r.stderr or r.stdout).strip()[:300]}")


class LoopDisks:
    """Per-sandbox ext4 disks under one root."""

    def __init__(self, root: str | os.PathLike[str] = DISK_ROOT) -> None:
        self.root = Path(root)

    def unavailable(self) -> str | None:
        """Why loop disks cannot be made here, or None when they can."""
        if os.geteuid() != 0:
            return "not root (mounting a loop device needs root)"
        if shutil.which("mkfs.ext4") is None:
            return "mkfs.ext4 is missing (apt-get install e2fsprogs)"
        if not (Path("/dev/loop-control").exists() or Path("/dev/loop0").exists()):
            return "no loop devices (/dev/loop-control)"
        return None

    def path(self, name: str) -> Path:
        return self.root / name

    # -- admission ------------------------------------------------------------------------

    def capacity_mb(self) -> int:
        """MiB a new disk may still promise: the free space of the host file system, less
        what live disks may still grow into, less RESERVE_MB."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        promised = 0
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            entries = []
        for e in entries:
            if not NAME.match(e.name):
                continue
            try:
                img = os.stat(os.path.join(e.path, "disk.img"))
            except OSError:
                continue
            promised += max(0, img.st_size - img.st_blocks * 512)
        return max(0, (free - promised) // _MIB - RESERVE_MB)

    # -- lifecycle ------------------------------------------------------------------------

    def make(self, name: str, size_mb: int, *, writable_root: bool, uid: int, gid: int) -> Path:
        """Create, format and mount `name`'s disk; returns its mount point. Cleans up after
        itself when anything fails."""
        if not NAME.match(name):
            raise ValueError(f"bad sandbox name {name!r}")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        d = self.path(name)
        d.mkdir(mode=0o700)
        try:
            img = d / "disk.img"
            with open(img, "wb") as f:
                f.truncate(image_mb(size_mb) * _MIB)
            _run(["mkfs.ext4", *_MKFS, str(img)])
            mnt = d / "disk"
            mnt.mkdir()
            _run(["mount", "-o", "loop,noatime,nodev,nosuid", str(img), str(mnt)])
            shutil.rmtree(mnt / "lost+found", ignore_errors=True)
            # /tmp is its own directory on the disk in both layouts: gVisor would otherwise
            # put a tmpfs (memory) there.
            tmp = mnt / "tmp"
            tmp.mkdir()
            tmp.chmod(0o1777)
            if writable_root:
                (mnt / "upper").mkdir(mode=0o755)
                (mnt / "work").mkdir(mode=0o700)
            else:
                w = mnt / "w"
                w.mkdir(mode=0o755)
                os.chown(w, uid, gid)
            return mnt
        except BaseException:
            self.discard(name)
            raise

    def discard(self, name: str) -> None:
        """Unmount and delete `name`'s disk. Idempotent; quiet about what is already gone."""
        if not NAME.match(name):
            return
        d = self.path(name)
        for mp in (d / "root", d / "disk"):
            if os.path.ismount(mp):
                r = subprocess.run(["umount", str(mp)], capture_output=True, text=True)
                if r.returncode != 0 and os.path.ismount(mp):
                    # Still in use (a container holding it): detach it; the kernel frees it
                    # when the last user goes.
                    subprocess.run(["umount", "-l", str(mp)], capture_output=True)
        if os.path.ismount(d / "disk"):
            log.warning("disk of %s is still mounted; leaving it for the sweep", name)
            return
        try:
            (d / "disk.img").unlink(missing_ok=True)
        except OSError as e:
            log.warning("cannot delete the disk image of %s: %r", name, e)
        for p in (d / "root", d / "disk", d):
            try:
                p.rmdir()
            except OSError:
                pass

    def usage_mb(self, name: str) -> tuple[float, float] | None:
        """(used, size) in MiB of a mounted disk, or None."""
        mnt = self.path(name) / "disk"
        if not os.path.ismount(mnt):
            return None
        st = os.statvfs(mnt)
        total = st.f_blocks * st.f_frsize / _MIB
        return total - st.f_bavail * st.f_frsize / _MIB, total

    def sweep(self, live_names: set[str]) -> list[str]:
        """Discard disks of containers that no longer exist (old enough not to be one being
        created now) and the wrapper's stale id records. Returns the names removed."""
        removed: list[str] = []
        for e in stale_entries(self.root, live_names):
            self.discard(e.name)
            removed.append(e.name)
        ids = self.root / ".ids"
        try:
            for rec in os.scandir(ids):
                try:
                    name = Path(rec.path).read_text().strip()
                except OSError:
                    continue
                if name not in live_names and not self.path(name).exists():
                    Path(rec.path).unlink(missing_ok=True)
        except OSError:
            pass
        return removed
