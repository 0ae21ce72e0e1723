"""Fault-injection tests. `faults`-marked tests disturb shared infrastructure (the Docker
engine itself) and run only when asked: SANDGYM_FAULTS_DOCKERD=1."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: disturbs shared infrastructure (restarts dockerd); opt-in")
