"""Shared fixtures (the session's simulated Ray cluster), and the one place that decides
whether a test may run here: `require(...)`.

A test that needs something of the machine says so with `require("docker", "vm")` (or the
`requires("docker", "vm")` marker; the `docker` marker is `requires("docker")`). Where it is
missing the test is skipped, saying what is missing and how to get it -- except under CI=true
for what scripts/bootstrap.sh installs (the engine, the images, gVisor, squid, the registry,
bubblewrap, systemd's tools, the Python extras): there a missing one is a broken CI machine,
and the test *fails*. Only what CI genuinely lacks (a GPU; PyPI when the machine is offline) is skipped in
CI too. `lacking(why)` is the same rule for a mechanism a test finds missing itself.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

from sandgym.cli import GC_THRESHOLDS
from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.spec import EgressPolicy, host_cpus

CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")

# The test processes collect garbage as the CLI's do (sandgym/cli/__init__.py): each worker
# runs for many minutes over one large heap.
gc.set_threshold(*GC_THRESHOLDS)

# Each xdist worker is one of several busy processes on this machine's cores. torch's OpenMP
# pool sized to every core makes them fight: at each barrier a thread waits for a peer that
# another worker has descheduled. The learning gate beside one busy core: 2 threads 402 s wall
# and 361 CPU-s, 1 thread 329 s and 254 CPU-s. Set before torch loads; subprocesses (the
# CLI's `sandgym train`) inherit them.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1:
    _CORES = str(max(1, host_cpus() // _WORKERS))  # the cores this process may run on
    os.environ.setdefault("OMP_NUM_THREADS", _CORES)
    # The same for torch.compile: at one thread it compiles in-process instead of starting a
    # pool of compile workers (each imports torch): tests/train/test_compile_layers.py 30 -> 24 s.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", _CORES)

BOOTSTRAP = "scripts/bootstrap.sh installs it"


def lacking(why: str, *, ci_has_it: bool = True) -> NoReturn:
    """Skip the test (or the module, when called at import), saying why; under CI=true fail
    instead when CI is meant to have what is missing (`ci_has_it`)."""
    if CI and ci_has_it:
        pytest.fail(f"CI=true, and CI must have this: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


# ---- the capabilities -------------------------------------------------------------------


@functools.cache
def docker_ready() -> str | None:
    """None when the engine answers and the default image exists, else the reason."""
    try:
        import docker

        client = docker.from_env()
        try:
            client.ping()
            client.images.get(SandboxSpec().image)
        finally:
            client.close()
    except Exception as exc:  # engine down or image missing
        return f"docker not ready: {exc!r} ({BOOTSTRAP}; or `sandgym images build`)"
    return None


def _image(ref: str) -> str | None:
    if why := docker_ready():
        return why
    import docker

    client = docker.from_env()
    try:
        client.images.get(ref)
    except Exception as exc:
        return f"image {ref} is missing: {exc!r} (`sandgym images build`; {BOOTSTRAP})"
    finally:
        client.close()
    return None


def _docker_check(spec: SandboxSpec, what: str) -> str | None:
    """None when the docker provider accepts `spec` (its `check`), else its SpecError."""
    if why := docker_ready():
        return why
    from sandgym.sandboxes.errors import SpecError
    from sandgym.sandboxes.providers.docker.provider import DockerProvider

    provider = DockerProvider()
    try:
        provider.check(spec)
    except SpecError as exc:
        return f"this engine cannot run {what}: {exc}"
    finally:
        provider.client.close()
    return None


def _disks() -> str | None:
    if why := docker_ready():
        return why
    from sandgym.sandboxes.providers.docker.provider import DockerProvider

    provider = DockerProvider()
    try:
        why = provider._loop_unavailable()
    finally:
        provider.client.close()
    return f"no per-sandbox disks here: {why}" if why else None


def _binary(name: str, package: str) -> str | None:
    if shutil.which(name) or os.path.exists(f"/usr/sbin/{name}"):
        return None
    return f"{name} is not installed (apt-get install {package}; {BOOTSTRAP})"


def _bwrap() -> str | None:
    from sandgym.sandboxes.providers.local import LocalProvider

    caps = LocalProvider().capabilities
    return None if caps.bwrap else f"bubblewrap is unusable here: {caps.bwrap_error} ({BOOTSTRAP})"


def _package(module: str, install: str) -> Callable[[], str | None]:
    """`install`: the command that installs it ("pip install -e '.[ray]'")."""

    def check() -> str | None:
        if importlib.util.find_spec(module) is not None:
            return None
        return f"the Python package {module} is not installed ({install}; {BOOTSTRAP})"

    return check


def pypi_reachable(package: str = "six") -> str | None:
    """None when pip's index answers for `package`, else why not."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", package], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return "PyPI is unreachable: pip index timed out after 60 s"
    if out.returncode != 0:
        return "PyPI is unreachable: " + (out.stderr.strip().splitlines() or ["pip index failed"])[-1]
    try:
        urllib.request.urlopen(f"https://pypi.org/simple/{package}/", timeout=10).close()
    except Exception as exc:
        return f"PyPI is unreachable from this host: {exc!r}"
    return None


def _gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return "no GPU: torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA device here"


_VM = SandboxSpec(profile="vm", memory_mb=512, disk_mb=256)
_EGRESS = SandboxSpec(memory_mb=512, disk_mb=256, egress=EgressPolicy.nothing())

# name -> (check, whether CI must have it). bootstrap.sh installs everything marked True.
CAPABILITIES: dict[str, tuple[Callable[[], str | None], bool]] = {
    "docker": (docker_ready, True),
    "vm": (lambda: _docker_check(_VM, "vm (gVisor) sandboxes"), True),
    "disks": (_disks, True),
    "squid": (lambda: _binary("squid", "squid"), True),
    "egress": (lambda: _binary("squid", "squid") or _docker_check(_EGRESS, "sandboxes with egress"), True),
    "registry": (lambda: _binary("docker-registry", "docker-registry"), True),
    "htpasswd": (lambda: _binary("htpasswd", "apache2-utils"), True),
    "bwrap": (_bwrap, True),
    "nsenter": (lambda: _binary("nsenter", "util-linux"), True),
    "systemd": (lambda: _binary("systemd-analyze", "systemd") or _binary("systemd-socket-activate", "systemd"), True),
    "ray": (_package("ray", "pip install -e '.[ray]'"), True),
    "torch": (_package("torch", "pip install -e '.[train]'"), True),
    "swebench": (_package("swebench", "pip install -e '.[swe]'"), True),
    "schemathesis": (_package("schemathesis", "pip install -e '.[test]'"), True),
    "prime_sandboxes": (_package("prime_sandboxes", "pip install -e '.[platform]'"), True),
    "reasoning_gym": (_package("reasoning_gym", "pip install -e '.[bench]'"), True),
    "bfcl_eval": (_package("bfcl_eval", "pip install --no-deps bfcl-eval==2026.3.23"), True),
    # What CI may genuinely lack: skipped there too, saying why.
    "pypi": (pypi_reachable, False),
    "gpu": (_gpu, False),
}


@functools.cache
def missing(capability: str) -> str | None:
    """Why `capability` is unavailable here, or None. `image:REF` is a local image."""
    if capability.startswith("image:"):
        return _image(capability.removeprefix("image:"))
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; known: image:REF, {', '.join(CAPABILITIES)}")
    return CAPABILITIES[capability][0]()


def require(*capabilities: str) -> None:
    """Skip the test (or the module, at import) unless every capability is here; under CI=true
    a missing capability that bootstrap installs fails it instead."""
    for cap in capabilities:
        why = missing(cap)
        if why:
            lacking(why, ci_has_it=cap.startswith("image:") or CAPABILITIES[cap][1])


def available(capability: str) -> bool:
    """For a test that covers more where a capability is there (the vm profile too, say):
    whether it is here. Under CI=true, where bootstrap installs it, missing fails the test, so
    the optional part cannot go quiet in CI."""
    if missing(capability) is None:
        return True
    if CI and (capability.startswith("image:") or CAPABILITIES[capability][1]):
        lacking(str(missing(capability)))
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`slow` tests first, those with the largest time bound first among them (stable
    otherwise): with workers (.ci/run's `-n 3`, files whole: `--dist loadfile` in pyproject.toml) the longest file starts at
    once beside the rest instead of being the run's tail. The tests that use `cluster` stay
    together, where the first of them is: the cluster is stopped once the next test needs
    none (`pytest_runtest_teardown`)."""

    def key(item: pytest.Item) -> tuple[bool, float]:
        bound = item.get_closest_marker("timeout")
        return item.get_closest_marker("slow") is None, -float(bound.args[0] if bound and bound.args else 0)

    items.sort(key=key)
    ray = [i for i in items if "cluster" in i.fixturenames]
    unlisted = sorted({i.nodeid.split("::")[0] for i in ray} - CLUSTER_FILES)
    if unlisted:
        raise pytest.UsageError(f"tests/conftest.py: add {', '.join(unlisted)} to CLUSTER_FILES (its tests use `cluster`)")
    if ray:
        at = items.index(ray[0])
        rest = [i for i in items if "cluster" not in i.fixturenames]
        items[:] = rest[:at] + ray + rest[at:]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile` in collection order, with the files of `CLUSTER_FILES` as one unit: one worker
    runs them, with one Ray cluster, instead of each worker starting its own (a cluster takes
    ~10 s to start and keeps three raylets and their agents busy while it runs)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # Files in collection order (`pytest_collection_modifyitems`: slow first). xdist's default
    # reorders them by test count, which put the one-test learning gate last: the run's tail.
    config.option.loadscopereorder = False

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = str(super()._split_scope(nodeid))
            return "ray-cluster" if scope in CLUSTER_FILES else scope

    return Scheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The `requires(...)` and `docker` markers, checked before any fixture is made."""
    if item.get_closest_marker("docker") is not None:
        require("docker")
    for mark in item.iter_markers("requires"):
        require(*mark.args)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


NODE_CAP = 3  # sandboxes per node of `cluster`: small, the three nodes share two cores
# The files whose tests use `cluster`: pytest_xdist_make_scheduler gives them one worker (a file
# that uses it and is not listed stops the run: pytest_collection_modifyitems).
CLUSTER_FILES = frozenset(
    f"tests/{f}.py"
    for f in ("fleet/test_fleet", "fleet/test_fleet_eval", "fleet/test_node_caps", "fleet/test_placement",
              "fleet/test_serve_fleet", "fleet/test_train_on_fleet", "sandboxes/test_contract_ray")
)
_running: list[Any] = []  # this process's cluster (a LocalCluster), while tests need it


@pytest.fixture
def cluster() -> object:
    """A simulated 3-node Ray cluster on 127.0.0.1 (one raylet per node, one Docker engine),
    started for the first test that needs one and shared by the tests that follow it (a process
    joins one Ray cluster only); stopped once the next test needs none. Node names carry this
    process's pid, so the containers its agents make (labelled `sandgym.node=<name>`) are told
    apart from anyone else's. Tests that kill a node bring it back before they end."""
    if not _running:
        require("docker", "ray")
        from sandgym.sandboxes.providers.ray.cluster import LocalCluster, connect

        names = [f"t{os.getpid()}n{i}" for i in range(3)]
        c = LocalCluster(names, max_sandboxes_per_node=NODE_CAP, num_gpus=2)
        c.start()
        _running.append(c)
        connect(c.address)  # this process is a driver too
    return _running[0]


def _stop_cluster() -> None:
    while _running:
        _running.pop().shutdown()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last of the tests that use `cluster` (they run one after another), the
    cluster goes; an idle one costs a few CPU seconds a minute."""
    if _running and (nextitem is None or "cluster" not in nextitem.fixturenames):
        _stop_cluster()


def pytest_sessionfinish() -> None:
    _stop_cluster()
