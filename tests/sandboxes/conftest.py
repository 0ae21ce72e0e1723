"""Fixtures shared by the sandbox tests."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from tests.conftest import lacking


@pytest.fixture
def fds_past_1024() -> Iterator[None]:
    """Every descriptor number below ~1100 taken, so the next ones opened land above 1024,
    where select() cannot watch them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        if hard != resource.RLIM_INFINITY and hard < 2048:
            lacking(f"RLIMIT_NOFILE hard limit {hard} < 2048, and raising it needs root")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    held: list[int] = []
    try:
        while len(held) < 1100:
            fd = os.open(os.devnull, os.O_RDONLY)
            held.append(fd)
            if fd >= 1100:
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
