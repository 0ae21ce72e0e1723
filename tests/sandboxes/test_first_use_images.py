"""Images built on first use: which images sandgym knows how to build, a present one is left
alone, the puller builds a missing buildable image once for concurrent creates (instead of
pulling it) while `never` still refuses, and `sandgym images build --core` / `images ls`.

The environments' own images (sandgym/bfcl, sandgym/math) are not built by bootstrap: their
tests (tests/bfcl, tests/envs/test_math_python.py) build them through the provider on a
machine where they are missing, which is the path end to end."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import threading
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest

from sandgym.sandboxes.errors import ImagePullError, SpecError
from sandgym.sandboxes.providers.docker import images
from sandgym.sandboxes.providers.docker.pull import Puller
from tests.conftest import docker_ready

ROOT = Path(__file__).resolve().parents[2]


def test_sandgym_knows_how_to_build_its_own_images_only() -> None:
    assert images.core_names() == ["base", "python"]
    assert {r.name for r in images.RECIPES if r.first_use} == {"bfcl", "math"}
    assert images.known_build("sandgym/bfcl") == (["bfcl"], None)
    assert images.known_build("sandgym/math:latest") == (["math"], None)
    assert images.known_build("sandgym/python") == (["python"], None)
    assert images.known_build("sandgym/python:3.9") == (["python"], "3.9")
    assert images.known_build("sandgym/base:bullseye") == (["base"], "3.9")
    for other in ("python:3.11-slim", "sandgym/python:3.10", "sandgym/bfcl:v2", "127.0.0.1:5000/sandgym/math:latest"):
        assert images.known_build(other) is None, other
    assert images.build_missing("busybox:latest") is False  # not ours: the caller pulls it


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    if docker_ready():
        pytest.skip(docker_ready() or "")
    return docker.from_env()


def test_a_present_image_is_not_rebuilt(engine: docker.DockerClient) -> None:
    before = engine.images.get(images.PYTHON_TAG).id
    assert images.build_missing(images.PYTHON_TAG, engine) is True
    assert engine.images.get(images.PYTHON_TAG).id == before


def _tiny_build(engine: docker.DockerClient, tag: str) -> None:
    """A real (small) image build: sandgym/python plus a label."""
    dockerfile = f"FROM {images.PYTHON_TAG}\nLABEL sandgym.test.first-use={tag}\n".encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    engine.images.build(fileobj=io.BytesIO(buf.getvalue()), custom_context=True, tag=tag, rm=True)


def test_the_puller_builds_a_missing_buildable_image_once(engine: docker.DockerClient) -> None:
    tag = f"sandgym-test/first-use:{uuid.uuid4().hex[:12]}"
    other = f"sandgym-test/first-use-other:{uuid.uuid4().hex[:12]}"
    calls: list[str] = []

    def build(image: str) -> bool:
        if image != tag:
            return False  # not buildable here: pulled (and that fails: no registry has it)
        calls.append(image)
        _tiny_build(engine, image)
        return True

    puller = Puller(lambda: engine.api, build=build)
    try:
        with pytest.raises(SpecError, match="image_pull='never'"):
            puller.ensure(tag, "never")  # never still refuses: nothing is built
        assert calls == []
        ids: list[str] = []
        workers = [threading.Thread(target=lambda: ids.append(puller.ensure(tag, "missing"))) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(300)
        assert calls == [tag]  # four concurrent creates, one build
        assert len(ids) == 4 and set(ids) == {engine.images.get(tag).id}
        with pytest.raises(ImagePullError, match="pulling it failed"):
            puller.ensure(other, "missing")
    finally:
        try:
            engine.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_a_failed_build_is_a_clear_error(engine: docker.DockerClient) -> None:
    def build(image: str) -> bool:
        raise RuntimeError("building x failed: the recipe's apt-get exited 100")

    puller = Puller(lambda: engine.api, build=build)
    with pytest.raises(ImagePullError, match=r"not present locally and building it failed: building x failed"):
        puller.ensure(f"sandgym-test/first-use:{uuid.uuid4().hex[:12]}", "missing")


def _sandgym(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandgym", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


def test_images_build_core_and_ls(engine: docker.DockerClient) -> None:
    done = _sandgym("images", "build", "--core")  # bootstrap's step: the core images are present here
    assert done.returncode == 0 and "all images present" in done.stderr, done.stderr
    both = _sandgym("images", "build", "--core", "math")
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    ls = _sandgym("images", "ls")
    assert ls.returncode == 0, ls.stderr
    rows = {line.split()[0]: line for line in ls.stderr.splitlines() if line.startswith("sandgym/")}
    assert "present" in rows["sandgym/python:latest"]
    for tag in ("sandgym/bfcl:latest", "sandgym/math:latest"):  # present, or built on first use
        assert "present" in rows[tag] or "first use" in rows[tag], rows[tag]
