"""The sandgym container runtimes: gVisor (`runsc`) and `runc-sandgym`, and their installer.

Both are one shell wrapper (sandgym-runtime.sh, read its header) registered with the Docker
engine in /etc/docker/daemon.json. It gives gVisor the flags this host needs and turns a
per-sandbox directory under DISK_ROOT into a writable root with a disk quota. The statx
shim (statx_shim.c) works around a gVisor 2022 bug that breaks `ls`/`stat`; it is mounted
into gVisor sandboxes with a glibc `/etc/ld.so.preload`.

    python3 -m sandgym.sandboxes.providers.docker.runtime install   # idempotent, as root
    python3 -m sandgym.sandboxes.providers.docker.runtime status

`install` never restarts dockerd: it merges the `runtimes` key into daemon.json (keeping
every other key) and sends dockerd SIGHUP, which reloads runtimes; a dockerd started later
reads the file itself. It also turns on `live-restore` unless daemon.json says otherwise:
containers keep running while dockerd restarts, and a sandbox's commands and files go
through execd's socket, not dockerd, so a restart of the engine loses no sandbox.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WRAPPER_SRC = HERE / "sandgym-runtime.sh"
SHIM_SRC = HERE / "statx_shim.c"
WRAPPER_PATH = Path("/usr/local/bin/runsc-sandgym")
RUNC_LINK = Path("/usr/local/bin/runc-sandgym")
LIB_DIR = Path("/usr/local/lib/sandgym")
SHIM_SO = LIB_DIR / "statx_shim.so"
PRELOAD_FILE = LIB_DIR / "ld.so.preload"
DAEMON_JSON = Path("/etc/docker/daemon.json")
# Fixed: the wrapper runs under containerd, not in our process, and looks here.
DISK_ROOT = Path("/var/lib/sandgym/sandboxes")
# Where the shim is seen inside a sandbox.
SHIM_IN_SANDBOX = "/opt/sandgym-shim/statx_shim.so"

GVISOR = "runsc"
RUNC_SANDGYM = "runc-sandgym"
RUNTIMES: dict[str, dict[str, str]] = {
    GVISOR: {"path": str(WRAPPER_PATH)},
    RUNC_SANDGYM: {"path": str(RUNC_LINK)},
}

# Engine settings, added to daemon.json when it does not set them (an operator's value wins).
ENGINE_SETTINGS: dict[str, Any] = {"live-restore": True}

_VERSION = re.compile(rb"^# sandgym-runtime-wrapper (\d+)$", re.M)

Log = Callable[[str], None]


def wrapper_version(path: Path) -> int | None:
    try:
        m = _VERSION.search(path.read_bytes()[:512])
    except OSError:
        return None
    return int(m[1]) if m else None


WANTED_VERSION = wrapper_version(WRAPPER_SRC)


@dataclass(frozen=True)
class RuntimeStatus:
    """What this host has, as `doctor` and the provider need to know it."""

    runsc_binary: str | None
    runsc_version: str | None
    wrapper_version: int | None
    wrapper_current: bool
    engine_runtimes: tuple[str, ...]
    shim: bool

    @property
    def gvisor(self) -> bool:
        """gVisor sandboxes can be made: the engine knows `runsc` through a current wrapper."""
        return GVISOR in self.engine_runtimes and self.wrapper_current and self.runsc_binary is not None

    @property
    def runc_sandgym(self) -> bool:
        return RUNC_SANDGYM in self.engine_runtimes and self.wrapper_current


def _runsc_version(binary: str) -> str | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"runsc version (\S+)", out)
    lines = out.strip().splitlines()
    return m[1] if m else (lines[0] if lines else None)


def status(engine_info: Mapping[str, Any] | None) -> RuntimeStatus:
    runsc = shutil.which("runsc") or ("/usr/bin/runsc" if Path("/usr/bin/runsc").exists() else None)
    installed = wrapper_version(WRAPPER_PATH)
    runtimes = tuple(sorted((engine_info or {}).get("Runtimes") or {}))
    return RuntimeStatus(
        runsc_binary=runsc,
        runsc_version=_runsc_version(runsc) if runsc else None,
        wrapper_version=installed,
        wrapper_current=installed is not None and installed == WANTED_VERSION and RUNC_LINK.exists(),
        engine_runtimes=runtimes,
        shim=SHIM_SO.exists() and PRELOAD_FILE.exists(),
    )


def _same(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def _install_file(src: Path, dst: Path, mode: int, log: Log) -> None:
    data = src.read_bytes()
    if _same(dst, data) and (dst.stat().st_mode & 0o777) == mode:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".sandgym-tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, dst)
    log(f"installed {dst}")


def _build_shim(log: Log) -> None:
    """Compile the statx shim (needs gcc); rebuilt when the source is newer."""
    LIB_DIR.mkdir(parents=True, exist_ok=True)
    if not (SHIM_SO.exists() and SHIM_SO.stat().st_mtime >= SHIM_SRC.stat().st_mtime):
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            log("no C compiler: the statx shim is not built (apt-get install gcc); `ls` fails under gVisor")
        else:
            tmp = SHIM_SO.with_name("statx_shim.so.tmp")
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-nostartfiles", "-o", str(tmp), str(SHIM_SRC)], check=True)
            tmp.chmod(0o644)
            os.replace(tmp, SHIM_SO)
            log(f"built {SHIM_SO}")
    want = (SHIM_IN_SANDBOX + "\n").encode()
    if not _same(PRELOAD_FILE, want):
        PRELOAD_FILE.write_bytes(want)
        PRELOAD_FILE.chmod(0o644)
        log(f"wrote {PRELOAD_FILE}")


def merge_daemon_json(path: Path = DAEMON_JSON) -> bool:
    """Add our runtimes and ENGINE_SETTINGS to daemon.json, keeping every other key (and an
    operator's own value of a setting). True when it changed. Refuses (ValueError) to touch a
    file that is not valid JSON."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = ""
    try:
        conf = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix it by hand, then run install again") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{path} must hold a JSON object")
    runtimes = conf.setdefault("runtimes", {})
    if all(runtimes.get(k) == v for k, v in RUNTIMES.items()) and all(k in conf for k in ENGINE_SETTINGS):
        return False
    runtimes.update(RUNTIMES)
    for k, v in ENGINE_SETTINGS.items():
        conf.setdefault(k, v)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".sandgym-tmp")
    tmp.write_text(json.dumps(conf, indent=2) + "\n")
    json.loads(tmp.read_text())  # validate what we wrote before it replaces the old file
    os.replace(tmp, path)
    return True


def _dockerd_pids() -> list[int]:
    pids: list[int] = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "dockerd":
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def _engine_info() -> dict[str, Any] | None:
    try:
        import docker

        return dict(docker.from_env(timeout=10).info())
    except Exception:
        return None


def _engine_current(info: dict[str, Any], path: Path = DAEMON_JSON) -> bool:
    """Whether the running engine has our runtimes and daemon.json's live-restore."""
    try:
        wanted = bool(json.loads(path.read_text()).get("live-restore", False))
    except (OSError, ValueError):
        wanted = False
    return set(RUNTIMES) <= set(info.get("Runtimes") or {}) and bool(info.get("LiveRestoreEnabled")) == wanted


def install(log: Log = print) -> None:
    """Install the wrapper, the shim and the engine registration. Idempotent. Root only."""
    if os.geteuid() != 0:
        raise PermissionError("installing the sandgym runtimes needs root")
    if shutil.which("runsc") is None and not Path("/usr/bin/runsc").exists():
        log("runsc is not installed (apt-get install runsc): gVisor will be unavailable")
    _install_file(WRAPPER_SRC, WRAPPER_PATH, 0o755, log)
    if not (RUNC_LINK.is_symlink() and os.readlink(RUNC_LINK) == str(WRAPPER_PATH)):
        tmp = RUNC_LINK.with_name(RUNC_LINK.name + ".sandgym-tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(WRAPPER_PATH)
        os.replace(tmp, RUNC_LINK)
        log(f"linked {RUNC_LINK} -> {WRAPPER_PATH}")
    _build_shim(log)
    DISK_ROOT.mkdir(parents=True, exist_ok=True, mode=0o711)
    changed = merge_daemon_json()
    if changed:
        log(f"registered runtimes {', '.join(RUNTIMES)} and {ENGINE_SETTINGS} in {DAEMON_JSON}")
    info = _engine_info()
    if info is None:
        log("dockerd is not answering; it reads the runtimes from daemon.json when it starts")
        return
    if _engine_current(info):
        return
    pids = _dockerd_pids()
    if not pids:
        log("the engine is not a local dockerd; register the runtimes on its host")
        return
    for pid in pids:  # SIGHUP reloads daemon.json's runtimes and live-restore; never a restart
        os.kill(pid, signal.SIGHUP)
    for _ in range(50):
        info = _engine_info() or {}
        if _engine_current(info):
            log(f"dockerd reloaded: runtimes {', '.join(sorted(info.get('Runtimes') or {}))}, "
                f"live-restore {info.get('LiveRestoreEnabled')}")
            return
        time.sleep(0.2)
    raise RuntimeError(f"dockerd did not pick up daemon.json after SIGHUP; check its log ({info.get('Runtimes')}, "
                       f"live-restore {info.get('LiveRestoreEnabled')})")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["install"]:
        install()
        return 0
    if args[:1] == ["status"]:
        try:
            import docker

            info = docker.from_env(timeout=10).info()
        except Exception:
            info = None
        print(json.dumps(status(info).__dict__, indent=2))
        return 0
    print("usage: python3 -m sandgym.sandboxes.providers.docker.runtime install|status", file=sys.stderr)
    return 2
