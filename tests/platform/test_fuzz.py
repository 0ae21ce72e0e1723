"""Fuzz the OpenAPI schema with schemathesis: whatever it sends, the server never answers
500 (the gateway's documented `502 {"error": "sandbox_not_found"}` is the SDK's contract for an
unknown sandbox, not a crash). Runs on the local backend, so fuzzed creates stay cheap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import require

require("schemathesis")
import schemathesis
from hypothesis import HealthCheck, settings

from sandgym.platform.testing import serve_in_thread

TOKEN = "fuzz-token"


@pytest.fixture(scope="module")
def fuzz_schema(isolated_home: str) -> Iterator[object]:
    with serve_in_thread([TOKEN], "local", max_sandboxes=4, quota=4) as srv:
        yield schemathesis.openapi.from_url(f"{srv.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("fuzz_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: object) -> None:
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})  # type: ignore[attr-defined]
    if response.status_code == 502:
        assert response.json().get("error") == "sandbox_not_found", response.text
    else:
        assert response.status_code < 500, (case.method, case.path, response.status_code, response.text)  # type: ignore[attr-defined]
