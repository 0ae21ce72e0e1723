"""Images from a real registry on 127.0.0.1 (Debian's docker-registry, distribution 2.8),
open and behind htpasswd: pull when missing, `never` refuses, `always` pulls again,
credentials from the Docker client config, progress reported, aliases, clear failures."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandgym.sandboxes.errors import ImagePullError, SpecError
from sandgym.sandboxes.ownership import owner_labels
from sandgym.sandboxes.providers.docker import DockerProvider
from sandgym.sandboxes.providers.docker.pull import PullProgress
from sandgym.sandboxes.spec import SandboxSpec
from tests.conftest import require
from tests.registry import free_port, local_registry

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker", "registry")]

RUN = uuid.uuid4().hex[:12]
LABELS = {**owner_labels("test-registry"), "sandgym.run": RUN}
USER, PASSWORD = "sguser", "sgpass-" + RUN


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    auth: bool

    def ref(self, name: str) -> str:
        return f"{self.host}/sandgym-test/{name}:{RUN}"


def _bcrypt_htpasswd(path: Path) -> None:
    require("htpasswd")
    out = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
    path.write_text(out)


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One storage for both registries: an image pushed through one is served by the other
    (pushing means compressing every layer of it)."""
    return tmp_path_factory.mktemp("registry-storage")


@pytest.fixture(scope="module", params=["open", "htpasswd"])
def registry(request: pytest.FixtureRequest, storage: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    d = tmp_path_factory.mktemp(f"registry-{request.param}")
    auth = request.param == "htpasswd"
    if auth:
        _bcrypt_htpasswd(d / "htpasswd")
    with local_registry(d, htpasswd=d / "htpasswd" if auth else None, storage=storage) as host:
        yield Registry(host, auth)


@pytest.fixture(scope="module")
def docker_config(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """DOCKER_CONFIG with the registry's credentials (as `docker login` writes them)."""
    d = tmp_path_factory.mktemp("dockercfg")
    auths = {}
    if registry.auth:
        auths[registry.host] = {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
    (d / "config.json").write_text(json.dumps({"auths": auths}))
    old = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(d)
    try:
        yield d
    finally:
        if old is None:
            os.environ.pop("DOCKER_CONFIG", None)
        else:
            os.environ["DOCKER_CONFIG"] = old


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def provider(docker_config: Path) -> AsyncIterator[DockerProvider]:
    p = DockerProvider()
    try:
        yield p
    finally:
        for info in await p.list({"sandgym.run": RUN}):
            await p.remove(info.id)
        await p.aclose()


@pytest.fixture(scope="module")
def pushed(provider: DockerProvider, registry: Registry, storage: Path) -> Iterator[str]:
    """A unique image, built locally, in the registry's storage (pushed through the first
    registry that needs it), then removed locally."""
    ref = registry.ref("pulled")
    client = provider.client
    repo, tag = ref.rsplit(":", 1)
    if not (storage / "docker/registry/v2/repositories" / repo.split("/", 1)[1] / "_manifests/tags" / tag).is_dir():
        client.images.build(
            # sandgym/base: the smallest image with python3 (execd). 3 MB of random bytes: a
            # layer big enough for the engine to report its download.
            fileobj=io.BytesIO(f"FROM sandgym/base:latest\nRUN mkdir -p /home/sandbox && echo {RUN} > /home/sandbox/marker && "
                               "head -c 3000000 /dev/urandom > /home/sandbox/blob\n".encode()),
            tag=ref, rm=True, network_mode="none",
        )
        auth = {"username": USER, "password": PASSWORD} if registry.auth else None
        for line in client.api.push(repo, tag=tag, stream=True, decode=True, auth_config=auth):
            assert "error" not in line, line
    if _present(provider, ref):
        client.images.remove(ref, force=True)
    try:
        yield ref
    finally:
        try:
            client.images.remove(ref, force=True)
        except Exception:
            pass


def _present(provider: DockerProvider, ref: str) -> bool:
    return provider.puller.present(ref) is not None


async def test_missing_image_is_pulled_with_progress(provider: DockerProvider, pushed: str) -> None:
    assert not _present(provider, pushed)
    events: list[PullProgress] = []
    provider.puller.progress = events.append
    try:
        spec = SandboxSpec(image=pushed, memory_mb=256, disk_mb=32)
        provider.check(spec)  # missing is fine: it is pulled at create
        sb = await provider.create(spec, LABELS)
    finally:
        provider.puller.progress = None
    try:
        assert (await sb.exec("cat /home/sandbox/marker")).stdout.strip() == RUN
    finally:
        await sb.close()
    assert _present(provider, pushed)
    statuses = [e.status for e in events]
    assert any(s.startswith("Pulling from") for s in statuses), statuses
    assert any(s.startswith("Status: Downloaded newer image") for s in statuses), statuses
    assert any(e.status == "Pull complete" and e.layer for e in events), statuses
    assert events[-1].total_bytes >= 3_000_000 and events[-1].done_bytes == events[-1].total_bytes, events[-1]


async def test_never_refuses_and_always_pulls_again(provider: DockerProvider, pushed: str) -> None:
    provider.client.images.remove(pushed, force=True) if _present(provider, pushed) else None
    with pytest.raises(SpecError, match=r"image: .* is not present locally and image_pull='never'"):
        provider.check(SandboxSpec(image=pushed, image_pull="never"))
    events: list[PullProgress] = []
    provider.puller.progress = events.append
    try:
        for _ in range(2):  # the second time it is present and still asked of the registry
            sb = await provider.create(SandboxSpec(image=pushed, image_pull="always", memory_mb=256, disk_mb=32), LABELS)
            await sb.close()
    finally:
        provider.puller.progress = None
    done = [e.status for e in events if e.status.startswith("Status:")]
    assert len(done) == 2 and "Image is up to date" in done[1], done
    # present now: `never` is content
    provider.check(SandboxSpec(image=pushed, image_pull="never"))


async def test_aliases_map_a_public_name_to_a_local_image(provider: DockerProvider) -> None:
    p = DockerProvider(image_aliases={"python:3.11-slim": "sandgym/python:latest"})
    try:
        spec = SandboxSpec(image="python:3.11-slim", image_pull="never", memory_mb=256, disk_mb=32)
        p.check(spec)  # resolved before lookup: Docker Hub is never asked
        sb = await p.create(spec, LABELS)
        try:
            assert (await sb.exec("python3 -c 'print(1+1)'")).stdout == "2\n"
            assert p.api.inspect_container(sb.id)["Config"]["Image"] == "sandgym/python:latest"
        finally:
            await sb.close()
    finally:
        await p.aclose()


async def test_pull_failures_are_clear_and_not_retried(provider: DockerProvider, registry: Registry) -> None:
    missing = registry.ref("nope")
    with pytest.raises(ImagePullError, match=r"is not present locally and pulling it failed: .*(manifest unknown|not found)"):
        await provider.create(SandboxSpec(image=missing, memory_mb=256, disk_mb=32), LABELS)
    down = f"127.0.0.1:{free_port()}/sandgym-test/x:1"
    with pytest.raises(ImagePullError, match="connection refused"):
        await provider.create(SandboxSpec(image=down, memory_mb=256, disk_mb=32), LABELS)
    assert await provider.list({"sandgym.run": RUN}) == []


@pytest.mark.parametrize("registry", ["htpasswd"], indirect=True)  # the open one takes no credentials
async def test_wrong_credentials_are_refused(provider: DockerProvider, registry: Registry, pushed: str, docker_config: Path) -> None:
    good = (docker_config / "config.json").read_text()
    bad = {"auths": {registry.host: {"auth": base64.b64encode(f"{USER}:wrong".encode()).decode()}}}
    (docker_config / "config.json").write_text(json.dumps(bad))  # read again before each pull
    try:
        with pytest.raises(ImagePullError, match="unauthorized|authentication required|no basic auth"):
            await provider.create(SandboxSpec(image=pushed, image_pull="always", memory_mb=256, disk_mb=32), LABELS)
    finally:
        (docker_config / "config.json").write_text(good)
