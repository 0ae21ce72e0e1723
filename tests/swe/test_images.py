"""Task images on the real Docker engine: built offline from a local repository, reused by
content on the second request, and a failed build names its step with the log tail."""

from __future__ import annotations

import subprocess
from pathlib import Path

import docker
import pytest

from sandgym.swe.bundled import init_repo
from sandgym.swe.images import LABEL_COMMIT, LABEL_HASH, ImageBuildError, RepoError, TaskImageBuilder
from sandgym.swe.tasks import SWETask
from tests.conftest import require_docker

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def test_image_is_built_once_then_reused(bundled: dict[str, SWETask]) -> None:
    require_docker()
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
    out = docker.from_env().containers.run(
        second.tag, ["bash", "-c", "cd /opt/task/repo && git rev-parse HEAD && git remote | wc -l && git rev-list --count HEAD"],
        remove=True, network_mode="none",
    ).decode().split()
    assert out == [task.base_commit, "0", "1"]


async def test_failed_build_names_step_and_tail(tmp_path: Path) -> None:
    require_docker()
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
    require_docker()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x\n")
    commit = init_repo(tmp_path / "src", tmp_path / "repo")
    task = SWETask(instance_id="py__mismatch", repo="local/py", base_commit=commit, repo_path=str(tmp_path / "repo"),
                   recipe={"python": "3.7", "pip": []})
    with pytest.raises(ImageBuildError) as info:
        await TaskImageBuilder().ensure(task)
    assert info.value.step.startswith("RUN python3 -c")
    assert any("recipe wants 3.7" in line for line in info.value.log_tail)


async def test_unknown_commit_is_a_repo_error(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x\n")
    init_repo(tmp_path / "src", tmp_path / "repo")
    task = SWETask(instance_id="x", repo="local/x", base_commit="0" * 40, repo_path=str(tmp_path / "repo"))
    with pytest.raises(RepoError, match="rev-parse"):
        await TaskImageBuilder().ensure(task)
    assert subprocess.run(["git", "-C", str(tmp_path / "repo"), "status"], capture_output=True).returncode == 0
