"""Task images, built offline and cached by content.

Two layers, FROM the recipe's base image (sandgym/python:<X.Y> for its Python version,
built from Debian with `sandgym images build --python X.Y`; no registry):

- env image `sandgym-swe/env:<hash>`: the build tools SWE-bench's base image has (a C
  compiler, `BUILD_PACKAGES`), a venv at /opt/task/venv (pip and wheel, as a conda env
  has them) with the recipe's pip
  packages and requirements (under its constraints); shared by every task with the same
  (python, base image, pip, requirements, constraints).
- instance image `sandgym-swe/<repo>:<hash>`: the repository at `base_commit` at /testbed,
  with its history and tags up to that commit (`history="full"`: fetched from the local
  mirror into a bare repository at /opt/task/history.git, no later commits, no remote;
  setuptools_scm and `git describe` work), or that commit alone (`history="shallow"`);
  the row's setup patch applied and committed (SWE-smith's bug), the recipe's pre_install
  and install commands run there, then a pristine copy kept at /opt/task/repo.

Sandboxes mount a fresh tmpfs at /testbed (their workdir), so `setup_commands()` copies
/opt/task/repo into it; the copy sits at the same path the install commands saw, so
editable installs stay valid. Build steps use host networking; containers never get a
network. The hash covers the recipe, the repository's tree at base_commit and the commit
id, and is kept in the tag and in labels: a second run finds the image and reuses it.

Tests run the way SWE-bench's harness runs them. A spec whose test command is `tox
--current-env -e<env>` (sphinx) gets `/testbed/.tox/<env>` made at build as an alias of the
venv: tox-current-env links `.tox/<env>/bin/python` to the venv's python, and Python finds a
venv by the `pyvenv.cfg` next to the path it was started as, not by where the link leads (the
venv's python is itself a link to the base image's), so without the alias the tests would start
outside the venv (`sys.prefix=/usr`, no pytest). SWE-bench's conda env has a real interpreter
in its prefix, where following the links ends; the alias (the venv's `pyvenv.cfg` and `lib`)
gives the same result.

What a sandbox must do differently for an image is its `ImageLayout` (`BUILT_LAYOUT` here;
SWE-bench's prebuilt images have theirs in sandgym.swe.prebuilt).

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
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .tasks import TESTBED, Recipe, SWETask

if TYPE_CHECKING:  # imported when a build needs it
    import docker

log = logging.getLogger(__name__)

# Bump when the Dockerfiles below change meaningfully: old images are then not reused.
RECIPE_VERSION = "4"
VENV = "/opt/task/venv"
PRISTINE = "/opt/task/repo"
HISTORY = "/opt/task/history.git"
CA_PATH = "/opt/task/host-ca.pem"
CONSTRAINTS_PATH = "/opt/task/constraints.txt"
# The venv's own pip: Debian bullseye's (20.3) cannot install PEP 660 editables; 24.0 is
# the pip of early 2024, when SWE-bench's harness images were built.
VENV_PIP = "pip==24.0"
# A conda env (SWE-bench's) comes with setuptools and wheel; pip's legacy `--no-use-pep517`
# installs (scikit-learn's spec) refuse to run without wheel. 0.43.0: the wheel of early 2024.
VENV_WHEEL = "wheel==0.43.0"
# What SWE-bench's base image installs besides Python (swebench 4.1's `_DOCKERFILE_BASE_PY`:
# build-essential, libffi-dev, libtiff-dev, jq, curl, wget, tzdata, ...), and the headers its
# conda Python has (python3-dev here): install steps compile C extensions (astropy,
# scikit-learn; django's requirements build pywatchman from source).
# One layer per base image, shared by every env image built FROM it.
BUILD_PACKAGES = ("build-essential", "python3-dev", "libffi-dev", "libtiff-dev", "jq", "curl", "wget", "tzdata")
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


class BaseImageError(RuntimeError):
    """The Python base image a recipe needs is missing and cannot be built here."""


class ImageSourceError(RuntimeError):
    """The chosen image source cannot provide the task's image (e.g. a SWE-smith row has no
    SWE-bench instance image; a prebuilt image could not be pulled)."""


@dataclass(frozen=True)
class ImageLayout:
    """What differs between a task image built here and SWE-bench's prebuilt instance image;
    everything else (the debug step, the test patch, the tests, the grading) is one code path.

    `profile`/`user`: the sandbox profile and user (built: `strict`, whose /testbed is a fresh
    per-sandbox disk filled from the pristine copy; prebuilt: `vm`, root on a writable root,
    since the repository is the image's own root-owned /testbed). `env`: variables every
    command sees (prebuilt: PATH with the conda env first). `setup`: shell, run in /, that
    readies /testbed and prints its HEAD commit last. `activate`: lines the eval script runs
    before the recipe's eval commands (prebuilt: the harness's conda activation)."""

    source: str  # build | prebuilt
    profile: str = "strict"
    user: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    setup: str = ""
    activate: tuple[str, ...] = ()


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
        f"FROM {recipe.image()}",
        "USER root",
    ]
    if with_ca:
        lines += [f"COPY host-ca.pem {CA_PATH}", f"ARG PIP_CERT={CA_PATH}", f"ARG REQUESTS_CA_BUNDLE={CA_PATH}"]
    lines += [
        "ARG PIP_NO_CACHE_DIR=1",
        "ARG PIP_DISABLE_PIP_VERSION_CHECK=1",
        f"RUN python3 -c {shlex.quote(check)}",
        ("RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
         + " ".join(BUILD_PACKAGES) + " && rm -rf /var/lib/apt/lists/*"),
    ]
    if recipe.apt:
        # Recommends too, as the specs' own `apt-get install -y` gets them (ghostscript with ImageMagick).
        lines.append("RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                     + " ".join(shlex.quote(p) for p in recipe.apt) + " && rm -rf /var/lib/apt/lists/*")
    lines += [
        # The sandbox user owns nothing in the image; git must still accept the copied repo.
        "RUN git config --system --add safe.directory '*'",
        f"RUN python3 -m venv {VENV} && {VENV}/bin/python -m pip install -q {shlex.quote(VENV_PIP)} {shlex.quote(VENV_WHEEL)}",
        f"COPY constraints.txt {CONSTRAINTS_PATH}",
        f"ARG PIP_CONSTRAINT={CONSTRAINTS_PATH}",
    ]
    if recipe.requirements.strip():
        lines += ["COPY requirements.txt /opt/task/requirements.txt",
                  f"RUN {VENV}/bin/pip install -r /opt/task/requirements.txt"]
    if recipe.pip:
        lines.append(f"RUN {VENV}/bin/pip install " + " ".join(shlex.quote(p) for p in recipe.pip))
    lines += [
        f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "USER sandbox",
    ]
    return "\n".join(lines) + "\n"


_GIT_ID = "-c user.name=sandgym -c user.email=sandgym@localhost"


def instance_dockerfile(task: SWETask, env_tag: str, *, with_ca: bool) -> str:
    recipe = task.require_recipe()
    lines = [f"FROM {env_tag}", "USER root"]
    if with_ca:
        lines += [f"ARG PIP_CERT={CA_PATH}", f"ARG REQUESTS_CA_BUNDLE={CA_PATH}"]
    lines += ["ARG PIP_NO_CACHE_DIR=1", "ARG PIP_DISABLE_PIP_VERSION_CHECK=1", f"ARG PIP_CONSTRAINT={CONSTRAINTS_PATH}"]
    for k, v in recipe.env.items():
        lines.append(f"ENV {k}={json.dumps(v)}")
    if recipe.history == "full":
        # A clone that borrows the history's objects (alternates): a sandbox copies the
        # small .git, not the whole history. Tags come along; the remote is removed.
        lines += [f"COPY history.git {HISTORY}",
                  (f"RUN chmod -R a+rX {HISTORY} && git clone -q --shared {HISTORY} {TESTBED} "
                   f"&& git -C {TESTBED} remote remove origin")]
    else:
        lines += [f"COPY repo {TESTBED}"]
        if task.version and "SETUPTOOLS_SCM_PRETEND_VERSION" not in recipe.env:
            # No tags at depth 1: setuptools_scm would say 0.1.dev1; use the row's version.
            lines.append(f"ENV SETUPTOOLS_SCM_PRETEND_VERSION={json.dumps(task.version)}")
    lines.append(f"WORKDIR {TESTBED}")
    if task.setup_patch.strip():
        lines += ["COPY setup.diff /opt/task/setup.diff",
                  f"RUN git apply --whitespace=nowarn /opt/task/setup.diff && git add -A && git {_GIT_ID} commit -qm 'sandgym: task state'"]
    for cmd in (*recipe.pre_install, *recipe.install):
        # One RUN per command, so a failure names the very command.
        lines.append("RUN " + cmd.replace("\n", " \\\n  "))
    tox_env = tox_current_env(recipe.test_cmd)
    if tox_env:
        lines.append("RUN " + tox_env_alias(tox_env))
    if recipe.pre_install or recipe.install or tox_env:
        # What the install left untracked (egg-info, build outputs) is part of the baseline,
        # not of a step's diff: hide it from git in this repository only.
        lines.append("RUN git ls-files --others --exclude-standard --directory >> .git/info/exclude")
    lines += [
        f"RUN mkdir -p /opt/task && cp -a {TESTBED} {PRISTINE} && chmod -R a+rX {PRISTINE}",
        "USER sandbox",
    ]
    return "\n".join(lines) + "\n"


_TOX_CURRENT_ENV = re.compile(r"\btox\b.*--current-env\b.*?(?:-e\s*|--envlist[= ]\s*)([A-Za-z0-9_.-]+)")


def tox_current_env(test_cmd: str) -> str | None:
    """The tox env a `tox --current-env -e<env>` test command runs in (None for other commands)."""
    m = _TOX_CURRENT_ENV.search(test_cmd)
    return m.group(1) if m else None


def tox_env_alias(env: str, workdir: str = TESTBED) -> str:
    """Shell that makes `<workdir>/.tox/<env>` an alias of the venv (see the module's doc)."""
    d = shlex.quote(f"{workdir}/.tox/{env}")
    links = " && ".join(f"ln -sfn {VENV}/bin/python {d}/bin/{n}" for n in ("python", "python3", "python3.$minor"))
    return (f"minor=$({VENV}/bin/python -c 'import sys; print(sys.version_info[1])') && mkdir -p {d}/bin && {links} "
            f"&& cp {VENV}/pyvenv.cfg {d}/pyvenv.cfg && ln -sfn {VENV}/lib {d}/lib")


def setup_commands(workdir: str = TESTBED) -> str:
    """Shell run in a fresh task sandbox: copy the pristine repository into the workdir."""
    return f"cp -a {PRISTINE}/. {shlex.quote(workdir)}/ && git -C {shlex.quote(workdir)} rev-parse HEAD"


# Images built here: /testbed is the sandbox's own fresh disk, filled from the pristine copy.
BUILT_LAYOUT = ImageLayout(source="build", setup=setup_commands(TESTBED))


class TaskImageBuilder:
    """Builds (or finds) the image of each task. Safe to share between concurrent tasks:
    one build per tag at a time, later callers wait and reuse it. Rows without a recipe
    get theirs here (`resolve`: recipes file, then swebench's specs)."""

    def __init__(self, *, mirrors: str | os.PathLike[str] | None = None, log: Log | None = None,
                 ca_bundle: str | os.PathLike[str] | None | bool = True,
                 recipes: Any = None, build_bases: bool = True) -> None:
        from .specs import RecipeResolver

        self.mirrors = mirrors
        self.log = log or (lambda line: None)
        if ca_bundle is True:
            self.ca_bundle = host_ca_bundle()
        elif ca_bundle:
            self.ca_bundle = Path(ca_bundle)
        else:
            self.ca_bundle = None
        self.resolver = RecipeResolver(mirrors=mirrors, recipes=recipes)
        self.build_bases = build_bases
        self._locks: dict[str, anyio.Lock] = {}
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            import docker

            # Builds can be silent for minutes (pip resolving); the default 60 s would cut them.
            self._client = docker.from_env(timeout=3600)
        return self._client

    def resolve(self, task: SWETask, *, prebuilt: bool = False) -> SWETask:
        """The task with its recipe (or `recipe_error` saying why there is none); `prebuilt`:
        only the test side, for a SWE-bench prebuilt image."""
        return self.resolver.resolve(task, prebuilt=prebuilt)

    def resolve_all(self, tasks: Any) -> list[SWETask]:
        return self.resolver.resolve_all(tasks)

    # ---- naming ----------------------------------------------------------------------

    def env_tag(self, recipe: Recipe) -> tuple[str, str]:
        h = _sha({"v": RECIPE_VERSION, "kind": "env", "pip_self": VENV_PIP, "wheel": VENV_WHEEL,
                  "build_packages": list(BUILD_PACKAGES), **recipe.env_hash_material()})
        py = re.sub(r"[^0-9.]", "", recipe.python) or "x"
        return f"sandgym-swe/env:py{py}-{h[:16]}", h

    def instance_tag(self, task: SWETask) -> tuple[str, str, dict[str, Any]]:
        """(tag, hash, repo facts) for the task's image. Reads the local repository."""
        recipe = task.require_recipe()
        repo = task.find_repo(self.mirrors)
        commit = _git(repo, "rev-parse", "--verify", f"{task.base_commit}^{{commit}}")
        tree = _git(repo, "rev-parse", f"{commit}^{{tree}}")
        tags = _git(repo, "tag", "--merged", commit).split() if recipe.history == "full" else []
        _, env_hash = self.env_tag(recipe)
        h = _sha({
            "v": RECIPE_VERSION, "kind": "instance", "env": env_hash, "commit": commit, "tree": tree,
            "pre_install": list(recipe.pre_install), "install": list(recipe.install), "envvars": recipe.env,
            "history": recipe.history, "tags": tags, "setup_patch": task.setup_patch,
            # Only where it applies, so that other images keep their hash.
            **({"tox_env": tox_current_env(recipe.test_cmd)} if tox_current_env(recipe.test_cmd) else {}),
        })
        facts = {"path": str(repo), "commit": commit, "tree": tree, "tags": tags}
        return f"sandgym-swe/{_slug(task.repo)}:{h[:16]}", h, facts

    # ---- building --------------------------------------------------------------------

    async def ensure(self, task: SWETask) -> BuiltImage:
        """The task's image, built when missing (reused when present with the same hash)."""
        task = self.resolve(task)
        recipe = task.require_recipe()
        env_tag, env_hash = self.env_tag(recipe)
        tag, h, facts = await anyio.to_thread.run_sync(self.instance_tag, task)
        t0 = time.perf_counter()
        async with self._lock(tag):
            if await anyio.to_thread.run_sync(self._present, tag, h):
                return BuiltImage(tag, env_tag, True, time.perf_counter() - t0)
            async with self._lock(env_tag):
                if not await anyio.to_thread.run_sync(self._present, env_tag, env_hash):
                    async with self._lock("base:" + recipe.image()):
                        await anyio.to_thread.run_sync(self._ensure_base, recipe)
                    await anyio.to_thread.run_sync(self._build_env, recipe, env_tag, env_hash)
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

    def _ensure_base(self, recipe: Recipe) -> None:
        """The recipe's base image, built from Debian when it is one of ours and missing."""
        import docker.errors

        from sandgym.sandboxes.providers.docker import images as base_images

        image = recipe.image()
        try:
            self.client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        known = ", ".join(base_images.PYTHON_SUITES)
        if recipe.base_image:
            raise BaseImageError(f"base image {image} is missing (the recipe names it; build or load it first)")
        if recipe.python not in base_images.PYTHON_SUITES:
            raise BaseImageError(f"the recipe wants Python {recipe.python}, and no Debian release here ships it "
                                 f"(images: {known}); set `python` for this repo/version in a recipes file (--recipes)")
        if not self.build_bases:
            raise BaseImageError(f"base image {image} is missing: sandgym images build --python {recipe.python}")
        self.log(f"building {image} (sandgym images build --python {recipe.python})")
        try:
            base_images.build(python=recipe.python, log=self.log)
        except Exception as exc:
            raise BaseImageError(f"base image {image} is missing and building it failed: {exc}; "
                                 f"run `sandgym images build --python {recipe.python}`") from exc

    def _build_env(self, recipe: Recipe, tag: str, h: str) -> None:
        files = {"Dockerfile": env_dockerfile(recipe, with_ca=self.ca_bundle is not None).encode(),
                 "constraints.txt": "".join(c + "\n" for c in recipe.constraints).encode()}
        if recipe.requirements.strip():
            files["requirements.txt"] = recipe.requirements.encode()
        if self.ca_bundle is not None:
            files["host-ca.pem"] = self.ca_bundle.read_bytes()
        with tempfile.TemporaryFile(prefix="sandgym-swe-ctx-") as ctx:
            _tar(ctx, files)
            self._build(tag, ctx, {LABEL_KIND: "env", LABEL_HASH: h})

    def _build_instance(self, task: SWETask, env_tag: str, tag: str, h: str, facts: dict[str, Any]) -> None:
        recipe = task.require_recipe()
        files = {"Dockerfile": instance_dockerfile(task, env_tag, with_ca=self.ca_bundle is not None).encode()}
        if task.setup_patch.strip():
            files["setup.diff"] = (task.setup_patch if task.setup_patch.endswith("\n") else task.setup_patch + "\n").encode()
        with tempfile.TemporaryDirectory(prefix="sandgym-swe-") as tmp, tempfile.TemporaryFile(prefix="sandgym-swe-ctx-") as ctx:
            t0 = time.perf_counter()
            if recipe.history == "full":
                src = Path(tmp) / "history.git"
                history = _history(Path(facts["path"]), facts["commit"], facts["tags"], src)
                if history == "partial":
                    self.log(f"{task.repo}: the mirror lacks some old objects; history without old file contents")
                dirs = {"history.git": src}
            else:
                src = Path(tmp) / "repo"
                _shallow_checkout(Path(facts["path"]), facts["commit"], src)
                dirs = {"repo": src}
            _tar(ctx, files, dirs)
            self.log(f"repository context for {tag}: {ctx.tell() >> 20} MiB in {time.perf_counter() - t0:.1f}s")
            labels = {LABEL_KIND: "instance", LABEL_HASH: h, LABEL_REPO: task.repo[:200],
                      LABEL_COMMIT: facts["commit"], LABEL_TREE: facts["tree"]}
            self._build(tag, ctx, labels)

    def _build(self, tag: str, context: Any, labels: dict[str, str]) -> None:
        self.log(f"building {tag}")
        context.seek(0)
        step = "(before the first step)"
        tail: list[str] = []
        stream = self.client.api.build(
            fileobj=context, custom_context=True, tag=tag, network_mode="host",
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


def _run_git(args: list[str], *, input: str | None = None) -> None:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    proc = subprocess.run(["git", *args], capture_output=True, text=True, env=env, input=input)
    if proc.returncode != 0:
        raise RepoError(f"git {' '.join(args[:4])} failed: {proc.stderr.strip()[-500:]}")


def _history(src: Path, commit: str, tags: list[str], dest: Path) -> str:
    """`dest` = a bare repository holding `commit` (as branch main) with its whole history
    and the tags merged into it: nothing later, no remote. Fetched (not copied) from the
    mirror, so objects of later commits never come along. A mirror that lacks some old
    objects (big files left out of a snapshot) cannot be fetched whole: then the history
    comes without file contents (a blob-less partial fetch), plus every file of `commit`'s
    tree; log, describe and tags still work. Returns "full" or "partial"."""
    url = f"file://{src.resolve()}"
    refspecs = [f"{commit}:refs/heads/main", *(f"refs/tags/{t}:refs/tags/{t}" for t in tags)]
    _run_git(["init", "-q", "--bare", str(dest)])
    try:
        _run_git(["-C", str(dest), "fetch", "-q", "--no-tags", "--stdin", url], input="\n".join(refspecs) + "\n")
        mode = "full"
    except RepoError as exc:
        if not re.search(r"unable to read|corrupt|missing|did not send all necessary objects", str(exc)):
            raise
        shutil.rmtree(dest)
        _run_git(["init", "-q", "--bare", str(dest)])
        g = ["-C", str(dest)]
        for k, v in (("gc.auto", "0"), ("core.repositoryformatversion", "1"), ("extensions.partialClone", "mirror")):
            _run_git([*g, "config", k, v])
        _run_git([*g, "remote", "add", "mirror", url])
        _run_git([*g, "config", "remote.mirror.promisor", "true"])
        _run_git([*g, "config", "remote.mirror.uploadpack",
                  "git -c uploadpack.allowFilter=true -c uploadpack.allowAnySHA1InWant=true upload-pack"])
        _run_git([*g, "fetch", "-q", "--no-tags", "--filter=blob:none", "--stdin", "mirror"], input="\n".join(refspecs) + "\n")
        proc = subprocess.run(["git", *g, "rev-list", "--objects", "--missing=print", f"{commit}^{{tree}}"],
                              capture_output=True, text=True)
        blobs = [line[1:] for line in proc.stdout.splitlines() if line.startswith("?")]
        if blobs:
            _run_git([*g, "fetch", "-q", "--no-tags", "--no-write-fetch-head", "--stdin", "mirror"], input="\n".join(blobs) + "\n")
        # No promisor left behind: a missing old blob is an error, never a fetch.
        _run_git([*g, "remote", "remove", "mirror"])
        _run_git([*g, "config", "--unset", "extensions.partialClone"])
        mode = "partial"
    _run_git(["-C", str(dest), "symbolic-ref", "HEAD", "refs/heads/main"])
    return mode


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


def _tar(out: Any, files: dict[str, bytes], dirs: dict[str, Path] | None = None) -> None:
    """A build context written to the file object `out` (big histories stay out of memory)."""
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, path in (dirs or {}).items():
            tar.add(path, arcname=name)
