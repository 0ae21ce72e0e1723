"""Client tools that cannot share the test environment (the `prime` CLI 0.18 would downgrade
typer; verifiers 0.4.0 pulls ~20 packages), each in its own virtual environment, made once
and cached under ~/.cache/sandgym/venvs (of the real user, whatever HOME a test sets;
SANDGYM_TEST_VENVS moves it). A test that needs one skips, saying why, when PyPI cannot be
reached (also under CI=true: CI may be offline)."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lacking, pypi_reachable

CACHE = Path(os.environ.get("SANDGYM_TEST_VENVS") or Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "sandgym" / "venvs")


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
        why = pypi_reachable(requirements[0].split("=")[0].split("[")[0].strip("<>!~ "))
        if why is not None:
            lacking(f"cannot install {' '.join(requirements)}: {why}", ci_has_it=False)
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
