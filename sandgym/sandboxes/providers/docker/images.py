"""Building the sandbox images with no container registry.

`sandgym/base` comes from Debian's packages (images/build-base.sh: debootstrap minbase,
then `docker import`); `sandgym/python` is an ordinary Dockerfile FROM it, built with host
networking so apt can reach the package mirror. `--base IMAGE` replaces the debootstrap
step with a public image where a registry is reachable. Images FROM sandgym/python (e.g.
`sandgym/bfcl`) get it as the PYTHON_IMAGE build argument; those that install packages in a
build stage (with uv, installed there by pip: faster than pip) get the host's CA bundle in
their build context (`ca.pem`), so they trust what the host's pip trusts (an egress proxy's
CA included).

Other Python versions come from other Debian releases (`python_recipes`): the same two
steps from that release give `sandgym/python:<X.Y>` (SWE task images pick it by version).

`scripts/bootstrap.sh` builds the core images (base, python: what every default sandbox
runs); an environment's own image (`first_use`: sandgym/bfcl, sandgym/math) and the other
Python versions are built when a sandbox first needs them (`build_missing`, which the docker
provider calls for a missing image it knows; it logs each build step) or ahead of time by
`sandgym images build`. Builds take a lock per engine, so processes that need the same
image at once build it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

logger = logging.getLogger(__name__)

IMAGES_DIR = Path(__file__).resolve().parents[4] / "images"  # the repository's images/
BASE_TAG = "sandgym/base:latest"


@dataclass(frozen=True)
class ImageRecipe:
    name: str
    tag: str
    description: str
    dockerfile_dir: str | None = None  # None: the debootstrap base
    needs: str | None = None
    suite: str = "bookworm"  # the Debian release a debootstrap base comes from
    base_tag: str = BASE_TAG  # what a Dockerfile image builds FROM
    host_ca: bool = False  # the build context gets the host's CA bundle as ca.pem
    first_use: bool = False  # an environment's image: built when first needed, not by bootstrap


RECIPES: tuple[ImageRecipe, ...] = (
    ImageRecipe("base", BASE_TAG, "Debian bookworm minbase + python3 (debootstrap, docker import)"),
    ImageRecipe("python", "sandgym/python:latest", "python3, pip, venv, bash, git; user sandbox", "python", "base"),
    ImageRecipe("bfcl", "sandgym/bfcl:latest", "sandgym/python + bfcl-eval (BFCL v4 data, checkers, multi-turn backends)",
                "bfcl", "python", host_ca=True, first_use=True),
    ImageRecipe("math", "sandgym/math:latest", "sandgym/python + sympy, numpy, math-verify (math with a Python tool)",
                "math", "python", host_ca=True, first_use=True),
)
PYTHON_TAG = "sandgym/python:latest"

# Debian release -> its python3. bookworm is the default images' release (3.11).
PYTHON_SUITES: dict[str, str] = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}


def python_tag(version: str) -> str:
    return f"sandgym/python:{version}"


def python_recipes(version: str) -> list[ImageRecipe]:
    """The base + python images for a Python version, from the Debian release that ships it."""
    suite = PYTHON_SUITES.get(version)
    if suite is None:
        raise ValueError(f"no Debian release here ships Python {version}; known: {', '.join(PYTHON_SUITES)}")
    base_tag = BASE_TAG if suite == RECIPES[0].suite else f"sandgym/base:{suite}"
    return [
        ImageRecipe("base", base_tag, f"Debian {suite} minbase + python3 (debootstrap, docker import)", suite=suite),
        ImageRecipe("python", python_tag(version), f"python {version} (Debian {suite}), pip, venv, bash, git; user sandbox",
                    "python", "base", suite=suite, base_tag=base_tag),
    ]


Log = Callable[[str], None]


def core_names() -> list[str]:
    """The images every default sandbox needs (what bootstrap builds)."""
    return [r.name for r in RECIPES if not r.first_use]


def _full_tag(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    return image if ":" in name or "@" in name else f"{image}:latest"


def known_build(image: str) -> tuple[list[str], str | None] | None:
    """How `build` makes `image` here: (names, python version), or None when it is not one
    of sandgym's own images."""
    tag = _full_tag(image)
    for r in RECIPES:
        if r.tag == tag:
            return [r.name], None
    for version in PYTHON_SUITES:
        for r in python_recipes(version):
            if r.tag == tag:
                return [r.name], version
    return None


def recipes(names: list[str] | None = None) -> list[ImageRecipe]:
    if not names:
        return list(RECIPES)
    known = {r.name: r for r in RECIPES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown image(s) {unknown}; known: {', '.join(known)}")
    return [known[n] for n in names]


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def missing(client: docker.DockerClient) -> list[ImageRecipe]:
    return [r for r in RECIPES if not image_exists(client, r.tag)]


def _build_base(log: Log, tag: str = BASE_TAG, suite: str = "bookworm") -> None:
    script = IMAGES_DIR / "build-base.sh"
    if not script.exists():
        raise FileNotFoundError(f"{script} not found: image recipes ship with the source checkout")
    proc = subprocess.Popen(["bash", str(script), tag, suite], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        log(line)
    if proc.wait() != 0:
        raise RuntimeError(f"building {tag} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def host_ca_bundle() -> Path:
    """The CA bundle the host's pip and ssl use (PIP_CERT, SSL_CERT_FILE, the ssl default)."""
    candidates = [os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile,
                  "/etc/ssl/certs/ca-certificates.crt"]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    try:
        import certifi

        return Path(certifi.where())
    except ImportError:
        raise FileNotFoundError("no CA bundle found for the image build (set PIP_CERT or SSL_CERT_FILE)") from None


def _build_dockerfile(client: docker.DockerClient, recipe: ImageRecipe, base: str, log: Log) -> None:
    assert recipe.dockerfile_dir is not None
    path = IMAGES_DIR / recipe.dockerfile_dir
    buildargs = {"BASE": base, "PYTHON_IMAGE": PYTHON_TAG}
    if os.environ.get("PIP_INDEX_URL"):
        buildargs["PIP_INDEX_URL"] = os.environ["PIP_INDEX_URL"]
    with tempfile.TemporaryDirectory(prefix="sandgym-image-") as tmp:
        if recipe.host_ca:
            # A copy of the recipe plus the CA bundle: nothing is written into the source tree.
            ctx = Path(tmp) / "ctx"
            shutil.copytree(path, ctx)
            shutil.copyfile(host_ca_bundle(), ctx / "ca.pem")
            path = ctx
        tail: list[str] = []
        for chunk in client.api.build(path=str(path), tag=recipe.tag, network_mode="host", rm=True,
                                      forcerm=True, buildargs=buildargs, decode=True):
            if "error" in chunk:
                raise RuntimeError(f"building {recipe.tag} failed: {chunk['error']}\n" + "\n".join(tail))
            text = (chunk.get("stream") or chunk.get("status") or "").rstrip()
            if text:
                tail = (tail + [text])[-30:]
                log(text)


@contextlib.contextmanager
def _engine_lock(client: docker.DockerClient) -> Iterator[None]:
    """One build at a time per engine, across processes (a file lock in the temp dir)."""
    engine = str(client.api.info().get("ID") or client.api.base_url)  # base_url is the same for every unix socket
    path = Path(tempfile.gettempdir()) / f"sandgym-images-{hashlib.sha256(engine.encode()).hexdigest()[:12]}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_missing(image: str, client: docker.DockerClient | None = None) -> bool:
    """Build `image` (and what it builds FROM) when it is one of sandgym's own images and
    missing: a sandbox's first use of it. Says so and logs each build step (WARNING, so a
    CLI at its default level shows it). False when sandgym has no recipe for `image`."""
    how = known_build(image)
    if how is None:
        return False
    names, python = how
    client = client or docker.from_env()
    if image_exists(client, _full_tag(image)):
        return True
    ahead = f"sandgym images build {' '.join(names)}" + (f" --python {python}" if python else "")
    logger.warning("image %s is not built yet: building it now, on first use (this can take minutes; "
                "`%s` builds it ahead of time)", image, ahead)
    started = time.monotonic()
    last = [started]

    def line(text: str) -> None:
        # Docker's "Step N/M" lines, and at least one line every 15 s of a long step.
        now = time.monotonic()
        if text.startswith("Step ") or now - last[0] >= 15.0:
            last[0] = now
            logger.warning("building %s (%.0f s): %s", image, now - started, text[:160])
        else:
            logger.debug("building %s: %s", image, text)

    built = build(names, python=python, log=line, client=client,
                  step=lambda r: logger.warning("building %s: %s", r.tag, r.description))
    logger.warning("image %s ready after %.0f s (built: %s)", image, time.monotonic() - started,
                ", ".join(built) or "by another process meanwhile")
    return True


def build(names: list[str] | None = None, *, base: str | None = None, force: bool = False,
          log: Log = lambda _: None, step: Callable[[ImageRecipe], None] = lambda _: None,
          python: str | None = None, client: docker.DockerClient | None = None) -> list[str]:
    """Build the named images (default all) that are missing, or rebuild them with `force`.
    With `base`, the Dockerfiles build FROM that public image and no debootstrap runs.
    With `python`, the images are that Python version's (`python_recipes`). Returns the tags built."""
    client = client or docker.from_env()
    with _engine_lock(client):
        return _build_locked(client, names, base, force, log, step, python)


def _build_locked(client: docker.DockerClient, names: list[str] | None, base: str | None, force: bool,
                  log: Log, step: Callable[[ImageRecipe], None], python: str | None) -> list[str]:
    built: list[str] = []
    if python is not None:
        pool = python_recipes(python)
        asked = [r for r in pool if not names or r.name in names]
    else:
        pool = list(RECIPES)
        asked = recipes(names)
    # A Dockerfile image needs the image it builds FROM: build that first when it is missing
    # (`force` rebuilds only the images asked for), unless a public base replaces ours.
    known = {r.name: r for r in pool}
    wanted: list[ImageRecipe] = []

    def add(recipe: ImageRecipe) -> None:
        if recipe in wanted:
            return
        if recipe.needs is not None and not (recipe.needs == "base" and base is not None):
            need = known[recipe.needs]
            if need in asked or not image_exists(client, need.tag):
                add(need)
        wanted.append(recipe)

    for recipe in asked:
        add(recipe)
    for recipe in wanted:
        if recipe.dockerfile_dir is None and base is not None:
            continue  # a public base replaces ours
        if not (force and recipe in asked) and image_exists(client, recipe.tag):
            continue
        step(recipe)
        if recipe.dockerfile_dir is None:
            _build_base(log, recipe.tag, recipe.suite)
        else:
            _build_dockerfile(client, recipe, base or recipe.base_tag, log)
        built.append(recipe.tag)
    return built
