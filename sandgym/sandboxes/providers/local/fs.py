"""File access into a local sandbox without trusting anything the sandbox wrote.

We may be root while the sandbox is not, so a naive `open(host_dir + path)` would let a
sandboxed process plant a symlink (`/workspace/x -> /etc/shadow`) and read or overwrite
host files through us. Every path is therefore walked one component at a time with
`openat(..., O_NOFOLLOW)` from a directory fd we opened ourselves; symlinks met on the
way are resolved by us, chroot-style, against the sandbox's own view of its paths
(`/workspace/...`, `/tmp/...`), and anything that leaves the sandbox's writable
directories (through `..` or a symlink) is refused. Because each step is relative to an
fd we already hold, swapping a directory for a symlink mid-walk cannot redirect us.

Mapping: `mounts` is a list of (sandbox path prefix, host directory). With bwrap the
sandbox sees spec.workdir (e.g. /workspace), /tmp and /home/sandbox; those prefixes map
onto <sandbox dir>/fs/{work,tmp,home}. Without bwrap the sandbox's processes see host
paths, so the host directories themselves are also accepted, and spec.workdir still
maps to fs/work for callers. Other paths (/usr, /etc, ...) are refused.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import os
import posixpath
import stat
import tarfile
from typing import IO

from ...errors import SandboxError, SandboxFileNotFound

_MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A fake destination for tarfile's 'data' filter: its checks are then purely lexical and
# never touch the sandbox's (untrusted) file system.
_FILTER_DEST = "/nonexistent-sandgym-dest"


class SandboxFS:
    def __init__(self, mounts: list[tuple[str, str]], uid: int | None, gid: int | None) -> None:
        # Longest prefix first, so nested mounts win.
        self.mounts = sorted(mounts, key=lambda m: len(m[0]), reverse=True)
        self.uid = uid
        self.gid = gid

    # ---- path resolution -------------------------------------------------------------

    def _split(self, path: str) -> tuple[str, str, list[str]]:
        """(sandbox prefix, host dir, components below it) for a normalized absolute path."""
        for prefix, host in self.mounts:
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                rest = path[len(prefix) :].strip("/")
                return prefix, host, [c for c in rest.split("/") if c]
        raise SandboxError(
            f"path {path!r} is outside the sandbox's writable directories "
            f"({', '.join(sorted({m[0] for m in self.mounts}))})"
        )

    def _chown(self, name: str, dir_fd: int) -> None:
        if self.uid is not None and self.uid != os.geteuid():
            os.chown(name, self.uid, self.gid or self.uid, dir_fd=dir_fd, follow_symlinks=False)

    def _walk(self, path: str, *, create: bool, follow_final: bool) -> tuple[int, str | None, str]:
        """Resolve `path` to (parent dir fd, final name, sandbox path of the result).
        For a mount root, the fd is the root itself and the name is None. The caller
        closes the fd."""
        if not path.startswith("/") or "\x00" in path:
            raise SandboxError(f"not an absolute path: {path!r}")
        path = posixpath.normpath(path)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        for _ in range(_MAX_SYMLINKS):
            prefix, host, comps = self._split(path)
            fd = os.open(host, _DIR_FLAGS)
            cur = prefix
            redirect: str | None = None
            try:
                for i, c in enumerate(comps):
                    last = i == len(comps) - 1
                    if last and not follow_final:
                        return fd, c, posixpath.join(cur, c)
                    try:
                        target = os.readlink(c, dir_fd=fd)
                    except OSError as e:
                        if e.errno == errno.EINVAL:  # exists, not a symlink
                            target = None
                        elif e.errno == errno.ENOENT:
                            if last:
                                return fd, c, posixpath.join(cur, c)
                            if not create:
                                raise SandboxFileNotFound(f"no such file or directory: {path}") from None
                            with contextlib.suppress(FileExistsError):
                                os.mkdir(c, 0o755, dir_fd=fd)
                                self._chown(c, fd)
                            target = None
                        elif e.errno == errno.ENOTDIR:
                            raise SandboxError(f"not a directory on the way to {path}") from None
                        else:
                            raise
                    if target is not None:
                        base = target if target.startswith("/") else posixpath.join(cur, target)
                        redirect = posixpath.normpath(posixpath.join(base, *comps[i + 1 :]))
                        break
                    if last:
                        return fd, c, posixpath.join(cur, c)
                    try:
                        nfd = os.open(c, _DIR_FLAGS, dir_fd=fd)
                    except OSError as e:
                        if e.errno in (errno.ENOTDIR, errno.ELOOP):
                            raise SandboxError(f"not a directory on the way to {path}") from None
                        if e.errno == errno.ENOENT:
                            raise SandboxFileNotFound(f"no such file or directory: {path}") from None
                        raise
                    os.close(fd)
                    fd = nfd
                    cur = posixpath.join(cur, c)
                if redirect is None:  # a mount root
                    return fd, None, prefix
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            path = redirect
        raise SandboxError(f"too many levels of symbolic links: {path}")

    def open_dir(self, path: str, *, create: bool = False) -> tuple[int, str]:
        """An fd of directory `path` (symlinks inside the sandbox followed)."""
        fd, name, where = self._walk(path, create=create, follow_final=True)
        if name is None:
            return fd, where
        try:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise SandboxFileNotFound(f"no such directory: {path}") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    self._chown(name, fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", path) from None
                raise
        finally:
            os.close(fd)
        return nfd, where

    # ---- single files ----------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        fd, name, _ = self._walk(path, create=False, follow_final=True)
        try:
            if name is None:
                raise SandboxError(f"{path} is a directory")
            try:
                ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                raise SandboxFileNotFound(f"no such file: {path}") from None
        finally:
            os.close(fd)
        with os.fdopen(ffd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise SandboxError(f"{path} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise SandboxError(f"{path} is not a regular file")
            if not self._may_read(st):
                raise SandboxError(f"{path}: permission denied (mode {stat.S_IMODE(st.st_mode):o})")
            return f.read()

    def _may_read(self, st: os.stat_result) -> bool:
        """Whether the sandbox's user may read a file (we may be root, reading for it)."""
        if self.uid is None or self.uid == os.geteuid():
            return True  # the open itself was made as that user
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IRUSR)
        if st.st_gid == (self.gid or self.uid):
            return bool(st.st_mode & stat.S_IRGRP)
        return bool(st.st_mode & stat.S_IROTH)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        fd, name, _ = self._walk(path, create=True, follow_final=True)
        try:
            if name is None:
                raise SandboxError(f"{path} is a directory")
            self._write_at(fd, name, io.BytesIO(data), mode & 0o777, replace=False)
        finally:
            os.close(fd)

    def _write_at(self, dir_fd: int, name: str, src: IO[bytes], mode: int, *, replace: bool,
                  mtime: float | None = None) -> None:  # fmt: skip
        if replace:  # tar semantics: a symlink or file in the way is replaced, not followed
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            ffd = os.open(name, flags, mode, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.EISDIR:
                raise SandboxError(f"{name} is a directory") from None
            if e.errno == errno.ELOOP:
                raise SandboxError(f"{name} changed into a symlink while writing") from None
            raise
        with os.fdopen(ffd, "wb") as f:
            while chunk := src.read(1 << 20):
                f.write(chunk)
            os.fchmod(ffd, mode)
            if self.uid is not None and self.uid != os.geteuid():
                os.fchown(ffd, self.uid, self.gid or self.uid)
            if mtime is not None:
                os.utime(ffd, (mtime, mtime))

    # ---- archives --------------------------------------------------------------------

    def put_archive(self, dest: str, tar_bytes: bytes) -> None:
        """Extract after checking every member with tarfile's 'data' filter (no absolute
        names, nothing outside `dest`, no device files, no setuid bits)."""
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            members: list[tarfile.TarInfo] = []
            for m in tar.getmembers():
                f = _data_filter(m)
                if f is not None:
                    members.append(f)
            dfd, _ = self.open_dir(dest, create=True)
            os.close(dfd)
            for m in members:
                target = posixpath.normpath(posixpath.join(dest, m.name))
                if m.isdir():
                    fd, _ = self.open_dir(target, create=True)
                    os.close(fd)
                    continue
                fd, name, _ = self._walk(target, create=True, follow_final=False)
                try:
                    if name is None:
                        raise SandboxError(f"archive member {m.name!r} would replace a mount root")
                    if m.issym():
                        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                            os.unlink(name, dir_fd=fd)
                        os.symlink(m.linkname, name, dir_fd=fd)
                        self._chown(name, fd)
                    elif m.isreg() or m.islnk():
                        # Hard links are written as copies: the linked data comes from the
                        # archive, so nothing outside it can be linked in.
                        src = tar.extractfile(m)
                        if src is None:
                            raise SandboxError(f"archive member {m.name!r} has no data")
                        mode = (m.mode if m.mode is not None else 0o644) & 0o777
                        self._write_at(fd, name, src, mode, replace=True, mtime=m.mtime)
                finally:
                    os.close(fd)

    def get_archive(self, path: str) -> bytes:
        """A tar of `path` (file or directory), its basename at the top. Symlinks inside
        are stored as symlinks; fifos, sockets and devices are skipped."""
        arc = posixpath.basename(posixpath.normpath(path)) or "root"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            try:
                dfd, _ = self.open_dir(path)
            except NotADirectoryError:
                fd, name, _ = self._walk(path, create=False, follow_final=True)
                try:
                    assert name is not None
                    self._add_file(tar, fd, name, arc)
                finally:
                    os.close(fd)
            else:
                try:
                    self._add_tree(tar, dfd, arc)
                finally:
                    os.close(dfd)
        return buf.getvalue()

    def _add_tree(self, tar: tarfile.TarFile, dfd: int, arc: str) -> None:
        st = os.fstat(dfd)
        tar.addfile(_info(arc, st, tarfile.DIRTYPE))
        # fwalk never follows symlinks and works from dir fds: safe against swaps.
        for root, dirs, files, rfd in os.fwalk(".", dir_fd=dfd):
            rel = posixpath.normpath(posixpath.join(arc, root))
            for name in sorted(dirs + files):
                try:
                    st = os.stat(name, dir_fd=rfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                member = posixpath.join(rel, name)
                if stat.S_ISDIR(st.st_mode):
                    tar.addfile(_info(member, st, tarfile.DIRTYPE))
                elif stat.S_ISLNK(st.st_mode):
                    ti = _info(member, st, tarfile.SYMTYPE)
                    ti.linkname = os.readlink(name, dir_fd=rfd)
                    tar.addfile(ti)
                elif stat.S_ISREG(st.st_mode):
                    self._add_file(tar, rfd, name, member)

    def _add_file(self, tar: tarfile.TarFile, dir_fd: int, name: str, arc: str) -> None:
        try:
            ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise SandboxFileNotFound(f"no such file: {arc}") from None
        with os.fdopen(ffd, "rb") as f:
            st = os.fstat(ffd)
            if not stat.S_ISREG(st.st_mode):
                return
            # Read what is there now, so a file growing under us cannot break the archive.
            data = f.read()
        ti = _info(arc, st, tarfile.REGTYPE)
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))


def _data_filter(m: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """tarfile's 'data' filter (Python >= 3.11.4), or the same rules by hand before it."""
    if hasattr(tarfile, "data_filter"):
        try:
            return tarfile.data_filter(m, _FILTER_DEST)
        except tarfile.FilterError as e:
            raise SandboxError(f"archive member refused: {e}") from None
    name = m.name.lstrip("/")
    parts = name.split("/")
    if ".." in parts:
        raise SandboxError(f"archive member refused: {m.name!r} leaves the destination")
    if m.issym() or m.islnk():
        link = m.linkname
        base = posixpath.dirname(name) if m.issym() else ""
        target = posixpath.normpath(posixpath.join("/dest", base, link))
        if link.startswith("/") or not (target + "/").startswith("/dest/"):
            raise SandboxError(f"archive member refused: link {m.name!r} -> {link!r} leaves the destination")
    elif not (m.isreg() or m.isdir()):
        raise SandboxError(f"archive member refused: {m.name!r} is a special file")
    mode = m.mode & 0o755
    if m.isreg() or m.islnk():
        mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
    f = copy.copy(m)  # TarInfo.replace() is 3.11.4+ too
    f.name = name
    f.mode = None if m.isdir() or m.issym() else mode  # type: ignore[assignment]  # None: extraction sets no mode (tarfile allows it; typeshed says int)
    return f


def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = stat.S_IMODE(st.st_mode)
    ti.mtime = int(st.st_mtime)
    ti.uid = ti.gid = 1000  # the sandbox user, whatever host uid backs it
    ti.uname = ti.gname = "sandbox"
    return ti
