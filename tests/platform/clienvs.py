"""Client tools that cannot share the test environment (the `prime` CLI 0.18 would downgrade
typer; verifiers 0.4.0 pulls ~20 packages), each in its own virtual environment, made once
and cached under ~/.cache/sandgym/venvs (of the real user, whatever HOME a test sets;
SANDGYM_TEST_VENVS moves it). A test that needs one skips, saying why, when the package
index cannot be reached."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("SANDGYM_TEST_VENVS") or Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "sandgym" / "venvs")


def _index_reachable(package: str) -> str | None:
    """None when pip can see `package` on its index, else why not."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", package],
            capture_output=True, text=True, timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "pip index timed out after 60 s"
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or ["pip index failed"])[-1]
    return None


def cached_venv(name: str, requirements: list[str]) -> Path:
    """The `bin` directory of a venv with `requirements` installed, made when missing (under
    a lock, so parallel sessions make it once). Skips the test when the index is unreachable."""
    CACHE.mkdir(parents=True, exist_ok=True)
    root = CACHE / name
    stamp = root / "sandgym-ready"
    wanted = "\n".join(requirements)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == wanted:
            return root / "bin"
        why = _index_reachable(requirements[0].split("=")[0].split("[")[0].strip("<>!~ "))
        if why is not None:
            pytest.skip(f"package index unreachable, cannot install {' '.join(requirements)}: {why}")
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True)
        out = subprocess.run(
            [str(root / "bin" / "python"), "-m", "pip", "install", "-q", *requirements],
            capture_output=True, text=True, timeout=900,
        )
        if out.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            pytest.fail(f"pip install {' '.join(requirements)} failed:\n{out.stderr[-3000:]}")
        stamp.write_text(wanted)
    return root / "bin"
