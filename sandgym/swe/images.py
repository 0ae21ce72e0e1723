"""Task images, built offline and cached by content.

Two layers, both FROM `recipe.base_image` (default sandgym/python:latest, no registry):

- env image `sandgym-swe/env:<hash>`: a venv at /opt/task/venv with the recipe's pip
  packages; shared by every task with the same (python, base image, pip) recipe.
- instance image `sandgym-swe/<repo>:<hash>`: the repository at `base_commit` (a depth-1
  fetch from the local repository or mirror into the build context: no future commits, no
  remote) at /testbed, the recipe's install commands run there, then a pristine copy kept
  at /opt/task/repo.

Sandboxes mount a fresh tmpfs at /testbed (their workdir), so `setup_commands()` copies
/opt/task/repo into it; the copy sits at the same path the install commands saw, so
editable installs stay valid. Build steps use host networking; containers never get a
network. The hash covers the recipe, the repository's tree at base_commit and the commit
id, and is kept in the tag and in labels: a second run finds the image and reuses it.

Hosts that reach PyPI through a TLS-intercepting proxy need its CA inside the build: the
host's CA bundle (PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE or the system default) is
copied into the env image and given to build steps only (as build ARGs, not runtime ENV).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shlex
import ssl
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from .tasks import TESTBED, Recipe, SWETask

log = logging.getLogger(__name__)

# Bump when the Dockerfiles below change meaningfully: old images are then not reused.
RECIPE_VERSION = "2"
VENV = "/opt/task/venv"
PRISTINE = "/opt/task/repo"
CA_PATH = "/opt/task/host-ca.pem"
LABEL_KIND = "sandgym.swe.kind"
LABEL_HASH = "sandgym.swe.hash"
LABEL_REPO = "sandgym.swe.repo"
LABEL_COMMIT = "sandgym.swe.base_commit"
LABEL_TREE = "sandgym.swe.tree"
TAIL_LINES = 40
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

Log = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """A build failed: `step` names the Dockerfile step, `log_tail` holds its last lines."""

    def __init__(self, image: str, step: str, log_tail: list[str], detail: str) -> None:
        self.image = image
        self.step = step
        self.log_tail = log_tail
        self.detail = detail
        tail = "\n".join(f"    {line}" for line in log_tail)
        super().__init__(f"building {image} failed at step `{step}`: {detail}\n  log tail:\n{tail}")


class RepoError(RuntimeError):
    """The task's repository or base_commit cannot be read."""


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    env_tag: str
    reused: bool
    build_s: float


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _slug(repo: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", repo.lower().replace("/", "__")).strip("-._")
    return s or "repo"


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RepoError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def host_ca_bundle() -> Path | None:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        v = os.environ.get(var)
        if v and Path(v).is_file():
            return Path(v)
    cafile = ssl.get_default_verify_paths().cafile
    return Path(cafile) if cafile and Path(cafile).is_file() else None


def env_dockerfile(recipe: Recipe, *, with_ca: bool) -> str:
    check = (
        "import sys; v='.'.join(map(str, sys.version_info[:3])); w=%r; "
        "sys.exit(0 if (v + '.').startswith(w + '.') else 'python ' + v + ' in the base image, recipe wants ' + w)"
    ) % recipe.python
    lines = [
        f"FROM {recipe.base_image}",
        "USER root",
    ]
    if with_ca:
        lines += [f"COPY host-ca.pem {CA_PATH}", f"ARG PIP_CERT={CA_PATH}", f"ARG REQUESTS_CA_BUNDLE={CA_PATH}"]
    lines += [
        "ARG PIP_NO_CACHE_DIR=1",
        "ARG PIP_DISABLE_PIP_VERSION_CHECK=1",
        f"RUN python3 -c {shlex.quote(check)}",
        # The sandbox user owns nothing in the image; git must still accept the copied repo.
        "RUN git config --system --add safe.directory '*'",
        f"RUN python3 -m venv {VENV}",
    ]
    if recipe.pip:
        lines.append(f"RUN {VENV}/bin/pip install " + " ".join(shlex.quote(p) for p in recipe.pip))
    lines += [
        f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "USER sandbox",
    ]
    return "\n".join(lines) + "\n"


def instance_dockerfile(task: SWETask, env_tag: str, *, with_ca: bool) -> str:
    lines = [f"FROM {env_tag}", "USER root"]
    if with_ca:
        lines += [f"ARG PIP_CERT={CA_PATH}", f"ARG REQUESTS_CA_BUNDLE={CA_PATH}"]
    lines += ["ARG PIP_NO_CACHE_DIR=1", "ARG PIP_DISABLE_PIP_VERSION_CHECK=1"]
    for k, v in task.recipe.env.items():
        lines.append(f"ENV {k}={json.dumps(v)}")
    lines += [f"COPY repo {TESTBED}", f"WORKDIR {TESTBED}"]
    for cmd in task.recipe.install:
        # One RUN per command, so a failure names the very command.
        lines.append("RUN " + cmd.replace("\n", " \\\n  "))
    if task.recipe.install:
        # What the install left untracked (egg-info, build outputs) is part of the baseline,
        # not of a step's diff: hide it from git in this repository only.
        lines.append("RUN git ls-files --others --exclude-standard --directory >> .git/info/exclude")
    lines += [
        f"RUN mkdir -p /opt/task && cp -a {TESTBED} {PRISTINE} && chmod -R a+rX {PRISTINE}",
        "USER sandbox",
    ]
    return "\n".join(lines) + "\n"


def setup_commands(workdir: str = TESTBED) -> str:
    """Shell run in a fresh task sandbox: copy the pristine repository into the workdir."""
    return f"cp -a {PRISTINE}/. {shlex.quote(workdir)}/ && git -C {shlex.quote(workdir)} rev-parse HEAD"


class TaskImageBuilder:
    """Builds (or finds) the image of each task. Safe to share between concurrent tasks:
    one build per tag at a time, later callers wait and reuse it."""

    def __init__(self, *, mirrors: str | os.PathLike[str] | None = None, log: Log | None = None,
                 ca_bundle: str | os.PathLike[str] | None | bool = True) -> None:
        self.mirrors = mirrors
        self.log = log or (lambda line: None)
        if ca_bundle is True:
            self.ca_bundle = host_ca_bundle()
        elif ca_bundle:
            self.ca_bundle = Path(ca_bundle)  # type: ignore[arg-type]
        else:
            self.ca_bundle = None
        self._locks: dict[str, anyio.Lock] = {}
        self._client = None

    @property
    def client(self):  # type: ignore[no-untyped-def]
        if self._client is None:
            import docker

            # Builds can be silent for minutes (pip resolving); the default 60 s would cut them.
            self._client = docker.from_env(timeout=3600)
        return self._client

    # ---- naming ----------------------------------------------------------------------

    def env_tag(self, recipe: Recipe) -> tuple[str, str]:
        h = _sha({"v": RECIPE_VERSION, "kind": "env", **recipe.env_hash_material()})
        py = re.sub(r"[^0-9.]", "", recipe.python) or "x"
        return f"sandgym-swe/env:py{py}-{h[:16]}", h

    def instance_tag(self, task: SWETask) -> tuple[str, str, dict[str, str]]:
        """(tag, hash, repo facts) for the task's image. Reads the local repository."""
        repo = task.find_repo(self.mirrors)
        commit = _git(repo, "rev-parse", "--verify", f"{task.base_commit}^{{commit}}")
        tree = _git(repo, "rev-parse", f"{commit}^{{tree}}")
        _, env_hash = self.env_tag(task.recipe)
        h = _sha({
            "v": RECIPE_VERSION, "kind": "instance", "env": env_hash, "commit": commit, "tree": tree,
            "install": list(task.recipe.install), "envvars": task.recipe.env,
        })
        return f"sandgym-swe/{_slug(task.repo)}:{h[:16]}", h, {"path": str(repo), "commit": commit, "tree": tree}

    # ---- building --------------------------------------------------------------------

    async def ensure(self, task: SWETask) -> BuiltImage:
        """The task's image, built when missing (reused when present with the same hash)."""
        env_tag, env_hash = self.env_tag(task.recipe)
        tag, h, facts = await anyio.to_thread.run_sync(self.instance_tag, task)
        t0 = time.perf_counter()
        async with self._lock(tag):
            if await anyio.to_thread.run_sync(self._present, tag, h):
                return BuiltImage(tag, env_tag, True, time.perf_counter() - t0)
            async with self._lock(env_tag):
                if not await anyio.to_thread.run_sync(self._present, env_tag, env_hash):
                    await anyio.to_thread.run_sync(self._build_env, task.recipe, env_tag, env_hash)
            await anyio.to_thread.run_sync(self._build_instance, task, env_tag, tag, h, facts)
        return BuiltImage(tag, env_tag, False, time.perf_counter() - t0)

    def _lock(self, key: str) -> anyio.Lock:
        if key not in self._locks:
            self._locks[key] = anyio.Lock()
        return self._locks[key]

    def _present(self, tag: str, h: str) -> bool:
        import docker.errors

        try:
            img = self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return False
        return (img.labels or {}).get(LABEL_HASH) == h

    def _build_env(self, recipe: Recipe, tag: str, h: str) -> None:
        files = {"Dockerfile": env_dockerfile(recipe, with_ca=self.ca_bundle is not None).encode()}
        if self.ca_bundle is not None:
            files["host-ca.pem"] = self.ca_bundle.read_bytes()
        self._build(tag, _tar(files), {LABEL_KIND: "env", LABEL_HASH: h})

    def _build_instance(self, task: SWETask, env_tag: str, tag: str, h: str, facts: dict[str, str]) -> None:
        with tempfile.TemporaryDirectory(prefix="sandgym-swe-") as tmp:
            checkout = Path(tmp) / "repo"
            _shallow_checkout(Path(facts["path"]), facts["commit"], checkout)
            files = {"Dockerfile": instance_dockerfile(task, env_tag, with_ca=self.ca_bundle is not None).encode()}
            ctx = _tar(files, dirs={"repo": checkout})
        labels = {LABEL_KIND: "instance", LABEL_HASH: h, LABEL_REPO: task.repo[:200],
                  LABEL_COMMIT: facts["commit"], LABEL_TREE: facts["tree"]}
        self._build(tag, ctx, labels)

    def _build(self, tag: str, context: bytes, labels: dict[str, str]) -> None:
        self.log(f"building {tag}")
        step = "(before the first step)"
        tail: list[str] = []
        stream = self.client.api.build(
            fileobj=io.BytesIO(context), custom_context=True, tag=tag, network_mode="host",
            rm=True, forcerm=True, pull=False, labels=labels, decode=True,
        )
        for chunk in stream:
            err = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message")
            if err:
                raise ImageBuildError(tag, step, tail[-TAIL_LINES:], err.strip())
            text = chunk.get("stream") or chunk.get("status") or ""
            for line in text.splitlines():
                line = _ANSI.sub("", line).rstrip()
                if not line:
                    continue
                m = re.match(r"^Step \d+/\d+ : (.*)$", line)
                if m:
                    step = m.group(1)
                    tail = []
                tail = (tail + [line])[-TAIL_LINES:]
                self.log(line)
        self.log(f"built {tag}")


def _shallow_checkout(src: Path, commit: str, dest: Path) -> None:
    """`dest` = a git repository whose only history is `commit` (depth 1), checked out."""
    dest.mkdir(parents=True)
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    for args in (["init", "-q"], ["fetch", "-q", "--depth", "1", f"file://{src.resolve()}", commit],
                 ["checkout", "-q", "--detach", "FETCH_HEAD"]):
        proc = subprocess.run(["git", "-C", str(dest), *args], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RepoError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    (dest / ".git" / "FETCH_HEAD").unlink(missing_ok=True)


def _tar(files: dict[str, bytes], dirs: dict[str, Path] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, path in (dirs or {}).items():
            tar.add(path, arcname=name)
    return buf.getvalue()
