"""Fixtures for the SWE tests: the bundled tasks materialized as git repositories."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.swe.bundled import load_bundled
from sandgym.swe.tasks import SWETask


@pytest.fixture(scope="session")
def bundled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("swe-bundled")
    load_bundled(d)
    return d


@pytest.fixture
def bundled(bundled_dir: Path) -> dict[str, SWETask]:
    from sandgym.swe.tasks import load_tasks

    return {t.instance_id: t for t in load_tasks(bundled_dir / "tasks.jsonl")}
