"""What the CLI sets for its process before any command runs (benchmarks/RESULTS.md): torch's
OpenMP threads wait passively (before torch loads), unless the user chose a policy, since on
a busy machine spinning threads burn the cores their peers need; the garbage collector's
thresholds are raised."""

from __future__ import annotations

import gc
import os

import pytest

from sandgym.cli import GC_THRESHOLDS, main


def test_the_cli_makes_openmp_wait_passively_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_cli_raises_the_collectors_thresholds() -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's own (tests/conftest.py raised them for this process)
    try:
        with pytest.raises(SystemExit):
            main(["--help"])
        assert gc.get_threshold() == GC_THRESHOLDS != (700, 10, 10)
    finally:
        gc.set_threshold(*before)
