"""SWE-bench's prebuilt instance images, pulled from a real registry on 127.0.0.1.

No public registry is reachable here, so the registry is Debian's docker-registry and the
instance image is emulated: built from sandgym/python with what SWE-bench's images have and
sandgym relies on (the repository at /testbed, root-owned, at its base commit and installed
into the env; the env at /opt/miniconda3/envs/testbed, here a venv; an
/opt/miniconda3/bin/activate that makes `conda activate testbed` work), pushed as
`127.0.0.1:PORT/swebench/sweb.eval.x86_64.<id with __ as _1776_>:latest` and removed
locally, so the run must pull it. The row carries no repository: a prebuilt run needs none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes.manager import SandboxManager
from sandgym.swe.bundled import init_repo
from sandgym.swe.debug import InstanceResult, SWEDebugRunner
from sandgym.swe.prebuilt import PrebuiltImages, instance_image_key, parse_registry
from sandgym.swe.tasks import SWETask
from tests.registry import free_port, local_registry

RUN = uuid.uuid4().hex[:8]
IID = f"SGTest__Calc-{RUN}"  # upper case and `__`: the image name is lowercased, `__` spelled `_1776_`
KEY = f"swebench/sweb.eval.x86_64.sgtest_1776_calc-{RUN}:latest"
F2P = ["tests.test_calc.TestCalc.test_clamp_high"]
P2P = ["tests.test_calc.TestCalc.test_add", "tests.test_calc.TestEnv.test_conda_env"]

CALC = "def add(a, b):\n    return a + b\n\n\ndef clamp(x, lo, hi):\n    return max(lo, x)\n"
CALC_FIXED = "def add(a, b):\n    return a + b\n\n\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"
TESTS = '''import os
import sys
import unittest

import calc


class TestCalc(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)


class TestEnv(unittest.TestCase):
    def test_conda_env(self):
        # What SWE-bench's images give the tests: the env's Python, activated, and the
        # repository installed into it.
        self.assertEqual(sys.prefix, "/opt/miniconda3/envs/testbed")
        self.assertEqual(os.environ.get("CONDA_DEFAULT_ENV"), "testbed")
        self.assertTrue(calc.__file__.startswith("/testbed/"), calc.__file__)
'''
NEW_TEST = '''

class TestClamp(unittest.TestCase):
    pass
'''
# conda's activate, emulated: `source activate` then `conda activate ENV` (bash, set -u).
ACTIVATE = '''export CONDA_PREFIX=/opt/miniconda3 CONDA_DEFAULT_ENV=base
conda() {
  if [ "${1:-}" = activate ] && [ -d "/opt/miniconda3/envs/${2:-}" ]; then
    export CONDA_PREFIX="/opt/miniconda3/envs/$2" CONDA_DEFAULT_ENV="$2" PATH="/opt/miniconda3/envs/$2/bin:$PATH"
  else
    echo "conda (emulated): cannot $*" >&2
    return 1
  fi
}
'''
DOCKERFILE = '''FROM sandgym/python:latest
USER root
COPY testbed /testbed
COPY activate /opt/miniconda3/bin/activate
RUN python3 -m venv --without-pip /opt/miniconda3/envs/testbed \\
 && echo /testbed > "$(/opt/miniconda3/envs/testbed/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/testbed.pth" \\
 && git config --system --add safe.directory /testbed
ENV PATH=/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /testbed
'''


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _diff(repo: Path, edits: dict[str, str]) -> str:
    """The patch that makes `edits` (path -> new text) to the repository, which is left as it was."""
    for path, text in edits.items():
        (repo / path).write_text(text)
    patch = _git(repo, "diff")
    _git(repo, "checkout", "--", ".")
    return patch


def emulated_row(tmp: Path) -> tuple[dict[str, Any], Path]:
    """The row (no repository: the image holds it) and the repository for the image."""
    src = tmp / "src"
    (src / "calc").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "calc" / "__init__.py").write_text(CALC)
    (src / "tests" / "__init__.py").write_text("")
    (src / "tests" / "test_calc.py").write_text(TESTS)
    repo = tmp / "testbed"
    commit = init_repo(src, repo, "calc: base")
    test_patch = _diff(repo, {"tests/test_calc.py": TESTS.replace(
        "        self.assertEqual(calc.add(2, 3), 5)\n",
        "        self.assertEqual(calc.add(2, 3), 5)\n\n    def test_clamp_high(self):\n"
        "        self.assertEqual(calc.clamp(7, 0, 5), 5)\n")})
    gold = _diff(repo, {"calc/__init__.py": CALC_FIXED})
    row = {"instance_id": IID, "repo": "sandgym-test/calc", "base_commit": commit, "version": "0.1",
           "patch": gold, "test_patch": test_patch, "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P,
           "recipe": {"pip": [], "test_cmd": "python -m unittest -v {tests}", "test_framework": "unittest"}}
    return row, repo


# ---- naming (no engine needed) ---------------------------------------------------------


def test_image_names_are_swebench_s() -> None:
    from swebench.harness.test_spec.test_spec import TestSpec

    def theirs(iid: str, namespace: str | None) -> str:
        spec = TestSpec(instance_id=iid, repo="x/y", version="1", repo_script_list=[], eval_script_list=[],
                        env_script_list=[], arch="x86_64", FAIL_TO_PASS=[], PASS_TO_PASS=[], language="py",
                        docker_specs={}, namespace=namespace)
        return spec.instance_image_key

    for iid in ("astropy__astropy-12907", "django__django-11099", "sympy__sympy-13031", IID, "pydicom__pydicom-1256"):
        for ns in ("swebench", None):
            assert instance_image_key(iid, ns) == theirs(iid, ns), (iid, ns)
    task = SWETask(instance_id="astropy__astropy-12907", repo="astropy/astropy", base_commit="d16bfe05a7")
    assert PrebuiltImages().image(task) == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"  # mini-swe-agent's, less docker.io/
    assert (PrebuiltImages(registry="mirror.example.com:5000/hub/").image(task)
            == "mirror.example.com:5000/hub/swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest")
    assert PrebuiltImages(namespace=None).image(task) == "sweb.eval.x86_64.astropy__astropy-12907:latest"


def test_bad_registries_and_smith_rows_are_refused_clearly() -> None:
    from sandgym.swe.images import ImageSourceError

    assert parse_registry("127.0.0.1:5000") == "127.0.0.1:5000"
    assert parse_registry("localhost/mirror") == "localhost/mirror"
    for bad, why in (("https://reg.example.com", "without a scheme"), ("myregistry", "Docker Hub namespace"),
                     ("reg.example.com/Upper", "lowercase"), ("bad host:1", "not a registry host")):
        with pytest.raises(ValueError, match=why):
            parse_registry(bad)
    with pytest.raises(ValueError, match="image namespace"):
        PrebuiltImages(namespace="Swe Bench")
    smith = SWETask.model_validate({"instance_id": "o__r.abc123.lm_modify__x", "repo": "swesmith/o__r.abc1234",
                                    "base_commit": "abc1234", "patch": "diff --git a/x b/x\n"})
    with pytest.raises(ImageSourceError, match="SWE-smith"):
        PrebuiltImages().image(smith)


# ---- pulled and run ---------------------------------------------------------------------

# The engine with sandgym's images, and docker-registry.
needs_engine = pytest.mark.requires("docker", "registry")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_registry(tmp_path_factory.mktemp("swe-registry")) as host:
        yield host


@pytest.fixture(scope="module")
def pushed(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The emulated instance image in the registry (not present locally); yields its row.
    Afterwards the image (pulled by the runs) is removed."""
    import docker

    client = docker.from_env()
    tmp = tmp_path_factory.mktemp("swe-prebuilt")
    row, repo = emulated_row(tmp)
    ref = f"{registry}/{KEY}"
    ctx = tmp / "ctx.tar"
    with tarfile.open(ctx, "w") as tar:
        for name, text in (("Dockerfile", DOCKERFILE), ("activate", ACTIVATE)):
            (tmp / name).write_text(text)
            tar.add(tmp / name, arcname=name)
        tar.add(repo, arcname="testbed")
    try:
        with open(ctx, "rb") as f:
            client.images.build(fileobj=f, custom_context=True, tag=ref, rm=True, forcerm=True, network_mode="none")
        repo_name, tag = ref.rsplit(":", 1)
        for line in client.api.push(repo_name, tag=tag, stream=True, decode=True):
            assert "error" not in line, line
        client.images.remove(ref, force=True)
        yield row
    finally:
        try:
            client.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass


async def _run(rows: list[dict[str, Any]], step: str, prebuilt: PrebuiltImages, **kw: Any) -> list[InstanceResult]:
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        runner = SWEDebugRunner(mgr, step=step, image_source="prebuilt", prebuilt=prebuilt, **kw)
        results = await runner.run([SWETask.model_validate(r) for r in rows], concurrency=1)
        assert mgr.live == 0
    return results


@needs_engine
@pytest.mark.anyio
async def test_prebuilt_image_is_pulled_and_graded_like_a_built_one(registry: str, pushed: dict[str, Any]) -> None:
    import docker

    prebuilt = PrebuiltImages(registry=registry)
    (gold,) = await _run([pushed], "gold_patch", prebuilt)
    assert gold.status == "resolved", (gold.error, gold.logs)
    assert gold.image == f"{registry}/{KEY}" and gold.image_source == "prebuilt" and gold.image_reused is None
    assert docker.from_env().images.get(gold.image)  # pulled by the provider
    assert gold.fail_to_pass == dict.fromkeys(F2P, "passed")
    assert gold.pass_to_pass == dict.fromkeys(P2P, "passed")  # the env's python, activated, the repo installed
    assert "max(lo, min(x, hi))" in gold.applied_diff and gold.step_exit_code == 0
    # An agent's commands see the env first on PATH, as root, in the image's /testbed.
    (cmd,) = await _run([pushed], "command", prebuilt,
                        command="python -c 'import os, sys; print(sys.prefix, os.getuid(), os.getcwd())'")
    assert cmd.status == "unresolved", (cmd.error, cmd.logs)
    assert "/opt/miniconda3/envs/testbed 0 /testbed" in cmd.logs["step"]
    assert cmd.fail_to_pass == dict.fromkeys(F2P, "failed") and cmd.failing_tests == F2P
    assert cmd.timings["sandbox_s"] > 0 and cmd.image_fallback is None


def _swe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandgym", "swe", *args], capture_output=True, text=True, timeout=900)


def _instances(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert proc.stdout.strip(), proc.stderr
    return {i["instance_id"]: i for i in json.loads(proc.stdout)["instances"]}


@needs_engine
def test_cli_prebuilt_empty_patch_auto_fallback_and_pull_failures(
    registry: str, pushed: dict[str, Any], bundled_dir: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(pushed) + "\n")
    # The empty patch: unresolved, graded; no error, no infra.
    proc = _swe("debug", str(rows), "--step", "none", "--image-source", "prebuilt", "--registry", registry,
                "--json", "-o", str(tmp_path / "empty"))
    assert proc.returncode == 0, proc.stderr
    inst = _instances(proc)[IID]
    assert inst["status"] == "unresolved" and inst["image_source"] == "prebuilt"
    assert inst["fail_to_pass"] == dict.fromkeys(F2P, "failed")
    assert json.loads((tmp_path / "empty" / "meta.json").read_text())["registry"] == registry

    # auto: the pushed row runs prebuilt; a bundled row the registry lacks is built here; a
    # row neither the registry nor a repository can give is an infra failure naming both.
    bundled = json.loads(next(line for line in (bundled_dir / "tasks.jsonl").read_text().splitlines()
                              if '"intervals__touching"' in line))
    orphan = {**pushed, "instance_id": f"SGTest__Orphan-{RUN}"}
    rows.write_text("".join(json.dumps(r) + "\n" for r in (pushed, bundled, orphan)))
    proc = _swe("debug", str(rows), "--image-source", "auto", "--registry", registry, "--json", "-o", str(tmp_path / "auto"))
    assert proc.returncode == 1, proc.stderr  # the orphan's infra failure
    got = _instances(proc)
    assert got[IID]["status"] == "resolved" and got[IID]["image_source"] == "prebuilt" and got[IID]["image_fallback"] is None
    fb = got["intervals__touching"]
    assert fb["status"] == "resolved" and fb["image_source"] == "build" and fb["image"].startswith("sandgym-swe/")
    assert "sweb.eval.x86_64.intervals_1776_touching" in fb["image_fallback"] and "pulling it failed" in fb["image_fallback"]
    assert "prebuilt image was unavailable" in proc.stderr
    orphan_res = got[orphan["instance_id"]]
    assert orphan_res["status"] == "infra" and orphan_res["infra_reason"] == "repository"
    assert "prebuilt image was unavailable" in orphan_res["error"]
    summ = json.loads(proc.stdout)
    assert summ["images_prebuilt"] == 1 and summ["prebuilt_fallbacks"] == 2
    assert (tmp_path / "auto" / "intervals__touching" / "prebuilt.log").exists()

    # prebuilt only: a registry that is down is an infra failure of the instance (no crash,
    # no build), with the engine's reason.
    rows.write_text(json.dumps(orphan) + "\n")
    proc = _swe("debug", str(rows), "--image-source", "prebuilt", "--registry", f"127.0.0.1:{free_port()}",
                "--json", "-o", str(tmp_path / "down"))
    assert proc.returncode == 1
    inst = _instances(proc)[orphan["instance_id"]]
    assert inst["status"] == "infra" and inst["infra_reason"] == "image_pull", inst
    assert "connection refused" in inst["error"] and inst["image_reused"] is None
    # A bad --registry is a one-line user error before anything runs.
    proc = _swe("debug", str(rows), "--image-source", "prebuilt", "--registry", "http://x", "-o", str(tmp_path / "bad"))
    assert proc.returncode == 2 and "without a scheme" in proc.stderr and not (tmp_path / "bad").exists()


@needs_engine
def test_cli_validate_on_prebuilt_images(registry: str, pushed: dict[str, Any], tmp_path: Path) -> None:
    """`sandgym swe validate --image-source prebuilt`: gold and empty twice each in the pulled
    image; no repository, no build."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(pushed) + "\n")
    proc = _swe("validate", str(rows), "--runs", "2", "--image-source", "prebuilt", "--registry", registry, "--json",
                "-o", str(tmp_path / "val"))
    assert proc.returncode == 0, proc.stderr
    summ = json.loads(proc.stdout)
    (inst,) = summ["instances"]
    assert summ["valid"] == 1 and inst["verdict"] == "valid", inst
    assert inst["gold_resolved"] == 2 and inst["empty_resolved"] == 0 and inst["cold_s"] is None  # nothing built
    run = json.loads((tmp_path / "val" / IID / "gold_patch-2" / "result.json").read_text())
    assert run["image_source"] == "prebuilt" and run["image"] == f"{registry}/{KEY}"
    assert json.loads((tmp_path / "val" / "meta.json").read_text())["image_source"] == "prebuilt"


@needs_engine
@pytest.mark.anyio
async def test_agentic_env_on_a_prebuilt_image(registry: str, pushed: dict[str, Any]) -> None:
    """swe_agent with `image_source="prebuilt"`: the oracle's editor calls land in the image's
    /testbed and the tests run in its activated env (1.0); `null` scores 0."""
    from sandgym.core.policies import get_policy
    from sandgym.envs.swe_agent import load_environment

    for policy, reward in (("oracle", 1.0), ("null", 0.0)):
        env = load_environment(tasks=[SWETask.model_validate(pushed)], image_source="prebuilt", registry=registry)
        async with env.sandbox_session("docker", max_sandboxes=1) as mgr:
            (state,) = await env.generate(get_policy(policy, env), policy, max_concurrent=1, split="eval")
        assert mgr.live == 0
        assert state.error is None, state.error
        assert state.reward == reward, state.info.get("swe")
        assert state.info["image_source"] == "prebuilt" and state.info["image"] == f"{registry}/{KEY}"
        assert state.metrics["pass_to_pass_rate"] == 1.0  # test_conda_env: the env's python, activated
