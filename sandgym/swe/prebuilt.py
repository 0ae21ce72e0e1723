"""SWE-bench's prebuilt instance images: their names, and how a sandbox runs them.

SWE-bench publishes one image per instance (`swebench/sweb.eval.x86_64.<id>:latest` on
Docker Hub, `__` in the id spelled `_1776_`, as its harness, mini-swe-agent and SkyRL name
them). In such an image the repository is /testbed (root-owned, at `base_commit`, already
installed) and its Python is the conda env `testbed` (/opt/miniconda3/envs/testbed); the
harness runs `source /opt/miniconda3/bin/activate && conda activate testbed` before the
tests. So nothing is built or installed here: the sandbox runs the image as root with a
writable root file system (the `vm` profile), PATH puts the env first for every command,
and the eval script activates the env as the harness does when the image has conda's
`activate`. Pulls go through the sandbox provider's pull support (a failed pull is an
`ImagePullError`); `--registry HOST[:PORT][/prefix]` names a mirror instead of Docker Hub.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .images import ImageLayout, ImageSourceError
from .tasks import TESTBED, SWETask

CONDA = "/opt/miniconda3"
CONDA_ENV = "testbed"
DEFAULT_NAMESPACE = "swebench"  # swebench's run_evaluation --namespace default
DEFAULT_ARCH = "x86_64"
DEFAULT_TAG = "latest"
# What `conda activate testbed` puts first, then the PATH of SWE-bench's images (Ubuntu's
# default with /opt/miniconda3/bin in front).
PREBUILT_PATH = (f"{CONDA}/envs/{CONDA_ENV}/bin:{CONDA}/condabin:{CONDA}/bin:"
                 "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

PREBUILT_LAYOUT = ImageLayout(
    source="prebuilt",
    profile="vm",  # root with a writable root: /testbed is the image's own, root-owned
    user=None,  # the vm profile's default: root, as SWE-bench's harness runs
    env=(("PATH", PREBUILT_PATH),),
    # What the image's install left untracked (egg-info, build outputs) is the baseline, not
    # part of a step's diff: hidden from git in this repository only, as built images do.
    setup=(f"cd {TESTBED} && mkdir -p .git/info && git ls-files --others --exclude-standard --directory "
           f">> .git/info/exclude && git rev-parse HEAD"),
    activate=(f"if [ -f {CONDA}/bin/activate ]; then source {CONDA}/bin/activate && conda activate {CONDA_ENV}; fi",),
)

# Docker's reference grammar: lowercase path components joined by `.`, `_`, `__` or dashes.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?")


def instance_image_key(instance_id: str, namespace: str | None = DEFAULT_NAMESPACE, tag: str = DEFAULT_TAG,
                       arch: str = DEFAULT_ARCH) -> str:
    """The image name swebench gives an instance (swebench 4.1's
    `TestSpec.instance_image_key`): `sweb.eval.<arch>.<id lowercased>:<tag>`; under a
    namespace (a published image) every `__` becomes `_1776_`. Namespace None: the local
    image swebench's harness builds (no renaming)."""
    key = f"sweb.eval.{arch}.{instance_id.lower()}:{tag}"
    if namespace is not None:
        key = f"{namespace}/{key}".replace("__", "_1776_")
    return key


def parse_registry(text: str) -> str:
    """`HOST[:PORT][/prefix...]` checked and normalized (no scheme, no trailing slash).
    The host needs a `.` or a `:` or is `localhost`: Docker reads any other first
    component as a Docker Hub namespace."""
    value = text.strip().rstrip("/")
    if "://" in value:
        raise ValueError(f"registry {text!r}: give HOST[:PORT][/prefix] without a scheme (Docker picks https or http)")
    host, _, prefix = value.partition("/")
    if not host or not _HOST.fullmatch(host):
        raise ValueError(f"registry {text!r}: {host!r} is not a registry host (HOST[:PORT])")
    if "." not in host and ":" not in host and host != "localhost":
        raise ValueError(f"registry {text!r}: {host!r} has no '.' or ':' and is not localhost, so Docker would read it "
                         f"as a Docker Hub namespace; use HOST:PORT or a dotted host name")
    for part in prefix.split("/") if prefix else ():
        if not _COMPONENT.fullmatch(part):
            raise ValueError(f"registry {text!r}: path component {part!r} must be lowercase letters, digits and . _ -")
    return value


def _check_namespace(namespace: str | None) -> str | None:
    if namespace is None:
        return None
    for part in namespace.split("/"):
        if not _COMPONENT.fullmatch(part):
            raise ValueError(f"image namespace {namespace!r}: {part!r} must be lowercase letters, digits and . _ -")
    return namespace


@dataclass(frozen=True)
class PrebuiltImages:
    """Where a task's prebuilt image comes from: `registry` (None: Docker Hub, as docker
    names it), swebench's `namespace` (None: the unnamespaced local images swebench's harness
    builds), tag and architecture. Bad values raise ValueError naming the value."""

    registry: str | None = None
    namespace: str | None = DEFAULT_NAMESPACE
    tag: str = DEFAULT_TAG
    arch: str = DEFAULT_ARCH

    def __post_init__(self) -> None:
        if self.registry is not None:
            object.__setattr__(self, "registry", parse_registry(self.registry))
        _check_namespace(self.namespace)
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", self.tag):
            raise ValueError(f"image tag {self.tag!r} is not a valid Docker tag")

    def image(self, task: SWETask) -> str:
        """The task's image reference; ImageSourceError for rows SWE-bench has no instance
        image of (SWE-smith rows: their bug is a setup patch applied at build)."""
        if task.setup_patch.strip():
            raise ImageSourceError(f"{task.instance_id}: a row with a setup patch (SWE-smith) has no SWE-bench instance "
                                   f"image; use --image-source build")
        key = instance_image_key(task.instance_id, self.namespace, self.tag, self.arch)
        return f"{self.registry}/{key}" if self.registry else key
