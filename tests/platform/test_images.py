"""Server-side image aliases and the pull policy through the SDK: the operator serves
`python:3.11-slim` from a local image (the answers keep the name asked for), and an image
that cannot be had is IMAGE_PULL_FAILED (the SDK's SandboxImagePullError), never a 500."""

from __future__ import annotations

import pytest
from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient, SandboxImagePullError

from sandgym.platform.testing import serve_in_thread

from .conftest import IMAGE, backend

pytestmark = pytest.mark.skipif(backend() != "docker", reason="images are the docker provider's")


def _client(url: str) -> SandboxClient:
    api = APIClient(api_key="img")
    api.base_url = url
    return SandboxClient(api)


def test_alias_and_pull_never(isolated_home: str) -> None:
    with serve_in_thread(["img"], "docker", image_pull="never",
                         provider_options={"image_aliases": {"python:3.11-slim": IMAGE}}) as srv:
        c = _client(srv.url)
        sb = c.create(CreateSandboxRequest(name="alias", docker_image="python:3.11-slim", memory_gb=0.5, disk_size_gb=0.25))
        try:
            c.wait_for_creation(sb.id)
            assert c.get(sb.id).docker_image == "python:3.11-slim"
            assert c.execute_command(sb.id, "python3 -c 'print(6*7)'").stdout == "42\n"
        finally:
            c.delete(sb.id)
        bad = c.create(CreateSandboxRequest(name="never", docker_image="sandgym-test/absent-i12:0", memory_gb=0.5, disk_size_gb=0.25))
        try:
            with pytest.raises(SandboxImagePullError):
                c.wait_for_creation(bad.id)
            got = c.get(bad.id)
            assert got.status == "ERROR" and got.error_type == "IMAGE_PULL_FAILED" and "absent-i12" in (got.error_message or "")
        finally:
            c.delete(bad.id)
