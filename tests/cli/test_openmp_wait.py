"""The CLI sets torch's OpenMP threads to wait passively (before torch loads), unless the user
chose a policy: on a busy machine spinning threads burn the cores their peers need
(benchmarks/RESULTS.md)."""

from __future__ import annotations

import os

import pytest

from sandgym.cli import main


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
