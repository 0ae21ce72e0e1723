"""Building the sandbox images with no container registry.

`sandgym/base` comes from Debian's packages (images/build-base.sh: debootstrap minbase,
then `docker import`); `sandgym/python` is an ordinary Dockerfile FROM it, built with host
networking so apt can reach the package mirror. `--base IMAGE` replaces the debootstrap
step with a public image where a registry is reachable. Images FROM sandgym/python (e.g.
`sandgym/bfcl`) get it as the PYTHON_IMAGE build argument; those that pip-install in a build
stage get the host's CA bundle in their build context (`ca.pem`), so pip trusts what the
host's pip trusts (an egress proxy's CA included).

Other Python versions come from other Debian releases (`python_recipes`): the same two
steps from that release give `sandgym/python:<X.Y>` (SWE task images pick it by version).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

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


RECIPES: tuple[ImageRecipe, ...] = (
    ImageRecipe("base", BASE_TAG, "Debian bookworm minbase + python3 (debootstrap, docker import)"),
    ImageRecipe("python", "sandgym/python:latest", "python3, pip, venv, bash, git; user sandbox", "python", "base"),
    ImageRecipe("bfcl", "sandgym/bfcl:latest", "sandgym/python + bfcl-eval (BFCL v4 data, checkers, multi-turn backends)",
                "bfcl", "python", host_ca=True),
    ImageRecipe("math", "sandgym/math:latest", "sandgym/python + sympy, numpy, math-verify (math with a Python tool)",
                "math", "python", host_ca=True),
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


def build(names: list[str] | None = None, *, base: str | None = None, force: bool = False,
          log: Log = lambda _: None, step: Callable[[ImageRecipe], None] = lambda _: None,
          python: str | None = None) -> list[str]:
    """Build the named images (default all) that are missing, or rebuild them with `force`.
    With `base`, the Dockerfiles build FROM that public image and no debootstrap runs.
    With `python`, the images are that Python version's (`python_recipes`). Returns the tags built."""
    client = docker.from_env()
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
