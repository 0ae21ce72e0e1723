"""Task images on the real Docker engine: built offline from a local repository, reused by
content on the second request, and a failed build names its step with the log tail."""

from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from sandgym.swe.bundled import init_repo
from sandgym.swe.images import LABEL_COMMIT, LABEL_HASH, BaseImageError, ImageBuildError, RepoError, TaskImageBuilder
from sandgym.swe.tasks import Recipe, SWETask
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def test_image_is_built_once_then_reused(bundled: dict[str, SWETask]) -> None:
    require("docker")
    task = bundled["slugger__collapse-runs"]
    builder = TaskImageBuilder()
    first = await builder.ensure(task)
    second = await TaskImageBuilder().ensure(task)  # a fresh builder: found by content, not memory
    assert second.reused and second.tag == first.tag
    img = docker.from_env().images.get(second.tag)
    assert img.labels[LABEL_COMMIT] == task.base_commit
    assert img.labels[LABEL_HASH].startswith(second.tag.rsplit(":", 1)[1])
    # Same recipe, same env layer, for tasks of other repositories.
    other = await builder.ensure(bundled["statskit__median-even"])
    assert other.env_tag == first.env_tag and other.tag != first.tag
    # The image holds the repository at base_commit with no remote and no later history.
    out = _in_image(second.tag, "cd /opt/task/repo && git rev-parse HEAD && git remote | wc -l && git rev-list --count HEAD").split()
    assert out == [task.base_commit, "0", "1"]


async def test_failed_build_names_step_and_tail(tmp_path: Path) -> None:
    require("docker")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello\n")
    commit = init_repo(tmp_path / "src", tmp_path / "repo")
    task = SWETask(instance_id="broken__install", repo="local/broken-install", base_commit=commit,
                   repo_path=str(tmp_path / "repo"),
                   recipe={"pip": ["pytest==8.3.4"], "install": ["echo installing-step-one", "echo the-tail-line >&2; exit 3"]})
    with pytest.raises(ImageBuildError) as info:
        await TaskImageBuilder().ensure(task)
    err = info.value
    assert err.step == "RUN echo the-tail-line >&2; exit 3"
    assert any("the-tail-line" in line for line in err.log_tail)
    assert "returned a non-zero code: 3" in err.detail
    assert "step `RUN echo the-tail-line" in str(err)


async def test_python_version_mismatch_fails_at_its_step(tmp_path: Path) -> None:
    require("docker")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x\n")
    commit = init_repo(tmp_path / "src", tmp_path / "repo")
    # A base image that is not the version the recipe wants: the env build stops at the check.
    task = SWETask(instance_id="py__mismatch", repo="local/py", base_commit=commit, repo_path=str(tmp_path / "repo"),
                   recipe={"python": "3.7", "pip": [], "base_image": "sandgym/python:latest", "history": "shallow"})
    with pytest.raises(ImageBuildError) as info:
        await TaskImageBuilder().ensure(task)
    assert info.value.step.startswith("RUN python3 -c")
    assert any("recipe wants 3.7" in line for line in info.value.log_tail)
    # A version no Debian release here ships: said before anything is built.
    task = task.model_copy(update={"recipe": task.recipe.model_copy(update={"base_image": None})})  # type: ignore[union-attr]
    with pytest.raises(BaseImageError, match="Python 3.7, and no Debian release here ships it"):
        await TaskImageBuilder().ensure(task)


async def test_unknown_commit_is_a_repo_error(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x\n")
    init_repo(tmp_path / "src", tmp_path / "repo")
    task = SWETask(instance_id="x", repo="local/x", base_commit="0" * 40, repo_path=str(tmp_path / "repo"), recipe={})
    with pytest.raises(RepoError, match="rev-parse"):
        await TaskImageBuilder().ensure(task)
    assert subprocess.run(["git", "-C", str(tmp_path / "repo"), "status"], capture_output=True).returncode == 0


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x",
           "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _history_repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository: v1.0 (with a big file), v1.1 (file removed), base, then a later
    commit tagged v2.0 that a task at base must not see. Returns (repo, base, big blob id)."""
    repo = tmp_path / "hist"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "setup.py").write_text("print('x')\n")
    (repo / "big.bin").write_bytes(bytes(range(256)) * 64)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    _git(repo, "tag", "-a", "v1.0", "-m", "v1.0")
    blob = _git(repo, "rev-parse", "HEAD:big.bin")
    (repo / "big.bin").unlink()
    _git(repo, "commit", "-qam", "two")
    _git(repo, "tag", "v1.1")
    (repo / "a.py").write_text("A = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("A = 2  # the future\n")
    _git(repo, "commit", "-qam", "later")
    _git(repo, "tag", "v2.0")
    return repo, base, blob


@pytest.fixture
def built_tags() -> Iterator[list[str]]:
    """Tags the test built from a repository made for it (new commit ids each run): removed
    afterwards, or every run would leave an image behind."""
    tags: list[str] = []
    yield tags
    client = docker.from_env()
    for tag in tags:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(tag, force=True)
    client.close()


def _in_image(tag: str, script: str) -> str:
    """The script's output, read from a file in the stopped container rather than its log:
    on a loaded engine the log copier may be cut off when the container exits (CI lost all
    but the first line once), while the container's own filesystem keeps every byte."""
    client = docker.from_env()
    ctr = client.containers.create(tag, ["bash", "-c", f"( {script} ) >/tmp/out 2>&1"], network_mode="none")
    try:
        ctr.start()
        rc = ctr.wait()["StatusCode"]
        chunks, _ = ctr.get_archive("/tmp/out")
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.extractfile("out")
            assert member is not None
            out = member.read().decode()
        assert rc == 0, out
        return out
    finally:
        ctr.remove(force=True)
        client.close()


async def test_full_history_with_tags_and_nothing_later(tmp_path: Path, built_tags: list[str]) -> None:
    """setuptools_scm and `git describe` need tags: the image has the history up to
    base_commit with its tags (v1.0, v1.1), not the later commit or its tag (v2.0), no
    remote; the checkout borrows the history's objects, so a sandbox copies a small .git."""
    require("docker")
    repo, base, _ = _history_repo(tmp_path)
    task = SWETask(instance_id="hist__full", repo="local/hist", base_commit=base, repo_path=str(repo),
                   version="1.1", recipe={"pip": []})
    built = await TaskImageBuilder().ensure(task)
    built_tags.append(built.tag)
    out = _in_image(built.tag, "cd /opt/task/repo && git describe --tags && git tag | tr '\\n' ' ' && echo && "
                               "git rev-list --count --all && git remote | wc -l && git rev-parse HEAD && "
                               "cat .git/objects/info/alternates && git status --porcelain | wc -l").split("\n")
    assert out[0] == "v1.1-1-g" + base[:7]
    assert out[1].split() == ["v1.0", "v1.1"]
    assert out[2:6] == ["3", "0", base, "/opt/task/history.git/objects"]
    assert out[6] == "0"


async def test_mirror_missing_old_objects_still_builds(tmp_path: Path, built_tags: list[str]) -> None:
    """A mirror whose snapshot left out an old big file: the history comes without old
    file contents (a blob-less fetch plus every file of base_commit); tags still work."""
    require("docker")
    repo, base, blob = _history_repo(tmp_path)
    _git(repo, "gc", "-q")  # pack, then drop the old blob from the pack: an incomplete mirror
    mirror = tmp_path / "mirror.git"
    _git(tmp_path, "clone", "-q", "--mirror", "--no-local", str(repo), str(mirror))
    _git(mirror, "repack", "-adq")
    keep = _git(mirror, "rev-list", "--objects", "--all").split("\n")
    objs = [line.split()[0] for line in keep if line.split()[0] != blob]
    new = subprocess.run(["git", "pack-objects", "-q", str(mirror / "objects" / "pack" / "x")], cwd=mirror,
                         input="\n".join(objs) + "\n", capture_output=True, text=True, check=True).stdout.strip()
    for p in (mirror / "objects" / "pack").glob("pack-*"):
        p.unlink()
    assert new
    assert subprocess.run(["git", "-C", str(mirror), "cat-file", "-e", blob]).returncode != 0
    task = SWETask(instance_id="hist__partial", repo="local/hist", base_commit=base, repo_path=str(mirror), recipe={"pip": []})
    lines: list[str] = []
    built = await TaskImageBuilder(log=lines.append).ensure(task)
    built_tags.append(built.tag)
    assert any("history without old file contents" in line for line in lines)
    out = _in_image(built.tag, "cd /opt/task/repo && git describe --tags && cat a.py && git cat-file -e "
                               f"{blob} 2>/dev/null; echo $?").split("\n")
    assert out[:3] == ["v1.1-1-g" + base[:7], "A = 1", "1"]


async def test_python_39_from_debian_bullseye(bundled: dict[str, SWETask]) -> None:
    """A recipe for Python 3.9 builds FROM sandgym/python:3.9 (Debian bullseye; built
    on demand when missing, as `sandgym images build --python 3.9` does)."""
    require("docker")
    task = bundled["slugger__collapse-runs"]
    task = task.model_copy(update={"recipe": task.recipe.model_copy(update={"python": "3.9"})})  # type: ignore[union-attr]
    built = await TaskImageBuilder().ensure(task)
    out = _in_image(built.tag, "python --version && . /etc/os-release && echo $VERSION_CODENAME && python -m pytest --version")
    assert out.startswith("Python 3.9.") and "\nbullseye\n" in out and "pytest" in out


def test_python_versions_come_from_debian_releases() -> None:
    from sandgym.sandboxes.providers.docker import images as base_images

    assert base_images.PYTHON_SUITES == {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
    base, py = base_images.python_recipes("3.9")
    assert (base.tag, base.suite, py.tag, py.base_tag) == ("sandgym/base:bullseye", "bullseye", "sandgym/python:3.9", "sandgym/base:bullseye")
    base, py = base_images.python_recipes("3.11")  # bookworm is the default images' release: same base
    assert base.tag == "sandgym/base:latest" and py.base_tag == "sandgym/base:latest"
    with pytest.raises(ValueError, match="no Debian release here ships Python 3.10"):
        base_images.python_recipes("3.10")
    # What a SWE recipe builds FROM, by its Python version.
    assert Recipe(python="3.9").image() == "sandgym/python:3.9"
    assert Recipe(python="3.11").image() == "sandgym/python:latest"
    assert Recipe(python="3.9", base_image="x/y:z").image() == "x/y:z"
