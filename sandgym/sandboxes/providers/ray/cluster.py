"""Ray, as sandgym uses it: how a machine says it hosts sandboxes, how a driver connects, and
a simulated multi-node cluster on 127.0.0.1 (tests, benchmarks, `sandgym ray up`).

A *sandgym node* is a Ray node that advertises the custom resource `sandgym_node:<name>`
(one unit) and, optionally, `sandgym_sandboxes` (its hard cap on live sandboxes). Its node
agent (agent.py) asks for that one unit, so exactly one agent runs per machine, pinned there:

    ray start --head --resources='{"sandgym_node:gpu-a": 1}'
    ray start --address=HEAD:6379 --resources='{"sandgym_node:gpu-b": 1, "sandgym_sandboxes": 16}'

Without `sandgym_sandboxes` a node's cap is what its cores can score (`default_node_cap`).

Loopback: Ray rewrites 127.0.0.1 to the machine's routable address when it connects
(`resolve_ip_for_localhost`), so a cluster bound to 127.0.0.1 is unreachable from a driver
that did not opt out. `import_ray(loopback=True)` opts out the way Ray does on laptops
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: "this host is the whole cluster"); nodes started by
`LocalCluster` inherit it, so nothing of Ray binds to or dials anything but 127.0.0.1.

Authentication: Ray's GCS and raylets accept anyone who can reach their ports unless the
cluster runs with Ray's token authentication (`RAY_AUTH_MODE=token` on every node and
driver, the token from $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token).
`LocalCluster` (and so `sandgym ray up`) turns it on, making the token if there is none;
`connect` turns it on in a driver whenever a token is at hand (a cluster without
authentication accepts such a driver too). Usage-stats reporting is off everywhere.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ....errors import UserError
from ...cpu_bound import cpu_slots
from ...spec import SandboxSpec

log = logging.getLogger(__name__)

NODE_RESOURCE_PREFIX = "sandgym_node:"
CAP_RESOURCE = "sandgym_sandboxes"
NAMESPACE = "sandgym"
LOOPBACK = "127.0.0.1"
# Failure detection for simulated clusters: a node that misses 3 health checks 0.5 s apart
# is dead (Ray's defaults take tens of seconds, right for real networks, slow for tests).
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
_MIB = 1 << 20
MIN_OBJECT_STORE_MB = 75  # Ray's minimum
SCORING_CPU = 0.5  # a scoring sandbox's share of a core (the humaneval, pycalc and code-judge specs)


def default_node_cap() -> int:
    """A node's cap when it advertises none: the sandboxes its cores can score at once (one
    per SCORING_CPU of a core), not more: a node that runs more test programs at once than
    its cores can would time correct solutions out."""
    return cpu_slots(SandboxSpec(cpu=SCORING_CPU))


def shared_node_cap(nodes: int) -> int:
    """Each of `nodes` simulated nodes' part of this machine's cap: they share its cores."""
    return max(1, default_node_cap() // nodes)


def node_resources(name: str, max_sandboxes: int | None = None) -> dict[str, float]:
    """The custom resources that make a Ray node the sandgym node `name`."""
    if not name or any(c in name for c in " :\n"):
        raise ValueError(f"node name {name!r}: use letters, digits, '-', '_' or '.'")
    res = {NODE_RESOURCE_PREFIX + name: 1.0}
    if max_sandboxes is not None:
        if max_sandboxes < 1:
            raise ValueError(f"max_sandboxes must be >= 1, got {max_sandboxes}")
        res[CAP_RESOURCE] = float(max_sandboxes)
    return res


def node_name_of(resources: dict[str, Any]) -> str | None:
    """The sandgym node name a Ray node advertises, or None."""
    for key in resources:
        if key.startswith(NODE_RESOURCE_PREFIX):
            return key[len(NODE_RESOURCE_PREFIX) :]
    return None


def is_loopback(address: str | None) -> bool:
    if not address or address in ("auto", "local"):
        return True  # a cluster started on this machine
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


AUTH_MODE_ENV = "RAY_AUTH_MODE"


def token_source() -> str | None:
    """Where Ray would read its authentication token from, in Ray's order of precedence
    ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token); None when there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "$RAY_AUTH_TOKEN"
    if path := os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return path
    default = default_token_path()
    return str(default) if default.is_file() and default.stat().st_size > 0 else None


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def enable_token_auth(*, generate: bool) -> str:
    """Turn on Ray's token authentication for this process and the Ray processes it starts
    (they inherit the environment); returns where the token is. With `generate`, a missing
    token is made where `ray get-auth-token --generate` makes it (~/.ray/auth_token, 0600)."""
    source = token_source()
    if source is None:
        if not generate:
            raise UserError("RAY_AUTH_MODE=token but no Ray token: set RAY_AUTH_TOKEN or run `ray get-auth-token --generate`")
        path = default_token_path()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        source = str(path)
    _token_mode()
    return source


def _token_mode() -> None:
    os.environ[AUTH_MODE_ENV] = "token"
    if "ray._raylet" in sys.modules:
        # Ray reads the mode into its config when imported: refresh it, as Ray itself does
        # when it turns authentication on (`_enable_token_auth`).
        from ray._raylet import Config  # type: ignore[attr-defined]  # a Cython module mypy cannot see into

        Config.initialize("")


def import_ray(*, loopback: bool = True) -> ModuleType:
    """Import ray; with `loopback`, keep every address it uses on 127.0.0.1. Usage stats
    reporting (a call to the internet) is off either way."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if loopback:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
        from ray._private import ray_constants
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("Ray is not installed: pip install 'sandgym[ray]'") from exc
    if loopback:
        # Read at import time; set it too in case ray was imported before us.
        ray_constants.ENABLE_RAY_CLUSTER = False
    return ray


def _ray_messages_to_stderr(ray: ModuleType) -> None:
    """Ray prints cluster events (a node died, ...) to the driver's *stdout*; they are
    diagnostics, and stdout is the command's (`sandgym eval --json` ends with its summary)."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if worker is None or original is None or getattr(original, "_sandgym", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr._sandgym = True  # type: ignore[attr-defined]  # a mark on the function object: installed once
    worker.print_to_stdstream = to_stderr


class ClusterUnreachable(UserError, ConnectionError):
    """No Ray cluster answers at the address given."""


def _probe(address: str, timeout_s: float) -> None:
    """Ray's own connect retries for minutes when nothing listens: fail fast instead."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not port.isdigit():
        raise ClusterUnreachable(f"Ray address {address!r} is not HOST:PORT")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, timeout_s)):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ClusterUnreachable(
                    f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with `sandgym ray up` "
                    "or `ray start --head`"
                ) from None
            time.sleep(0.5)


def connect(address: str | None, *, probe_s: float = 10.0) -> ModuleType:
    """Connect this process to the Ray cluster at `address` (default: $RAY_ADDRESS, else the
    cluster last started on this machine); once, later calls reuse the connection. Never
    starts a cluster of its own: that one would have no sandgym nodes. An address where
    nothing listens fails within `probe_s` with ClusterUnreachable."""
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    ray = import_ray(loopback=is_loopback(address))
    _ray_messages_to_stderr(ray)
    if not ray.is_initialized():
        if address != "auto" and "://" not in address:
            _probe(address, probe_s)
        if os.environ.get(AUTH_MODE_ENV) is None and token_source() is not None:
            _token_mode()  # a cluster without authentication accepts such a driver too
        elif os.environ.get(AUTH_MODE_ENV) == "token" and token_source() is None:
            raise ClusterUnreachable(
                f"RAY_AUTH_MODE=token but this driver has no Ray token to join {address} with: set RAY_AUTH_TOKEN, "
                f"RAY_AUTH_TOKEN_PATH, or copy the cluster's token to {default_token_path()}"
            )
        main = threading.current_thread() is threading.main_thread()
        ours = signal.getsignal(signal.SIGTERM) if main else None
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, include_dashboard=False)
        except ConnectionError as exc:
            mode = os.environ.get(AUTH_MODE_ENV, "disabled")
            raise ClusterUnreachable(
                f"could not join the Ray cluster at {address}: {exc} (this driver's RAY_AUTH_MODE={mode}, "
                f"token from {token_source() or 'nowhere'}; a cluster with token authentication needs its token "
                "here: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
            ) from exc
        finally:
            if main and callable(ours):
                # ray.init makes SIGTERM sys.exit(15) (a traceback mid-request); a process that
                # handles SIGTERM itself (`sandgym serve` drains) keeps its handler.
                signal.signal(signal.SIGTERM, ours)
    return ray


class LocalCluster:
    """A simulated Ray cluster on this machine: one raylet per sandgym node on 127.0.0.1,
    the first node also the head. Killing a node (`kill_node`) SIGKILLs its raylet and
    with it the node's workers (its agent), as a machine that died; `add_node` with the
    same name brings it back. Processes end with `shutdown()` (or at exit). With `auth` (the
    default) the cluster uses Ray's token authentication (`enable_token_auth`).

    `max_sandboxes_per_node`: each node's cap; None: this machine's scoring capacity
    (`default_node_cap`) shared by the simulated nodes, since they share its cores."""

    def __init__(
        self,
        nodes: Sequence[str] = ("n0", "n1", "n2"),
        *,
        max_sandboxes_per_node: int | None = None,
        num_cpus: float = 1,
        num_gpus: float = 0,
        object_store_mb: int = MIN_OBJECT_STORE_MB,
        fast_failure_detection: bool = True,
        head_port: int | None = None,
        auth: bool = True,
    ) -> None:
        """`head_port`: the GCS port (the cluster's address is 127.0.0.1:PORT); None: any free one."""
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"node names must be unique, got {list(nodes)}")
        self.names = list(nodes)
        self.max_sandboxes_per_node = max_sandboxes_per_node or shared_node_cap(len(self.names))
        self.auth = auth
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.object_store_mb = max(MIN_OBJECT_STORE_MB, object_store_mb)
        self.fast_failure_detection = fast_failure_detection
        self.head_port = head_port
        self._cluster: Any = None
        self._nodes: dict[str, Any] = {}

    def _node_args(self, name: str, head: bool, max_sandboxes: int | None = None) -> dict[str, Any]:
        args: dict[str, Any] = dict(
            num_cpus=self.num_cpus,
            num_gpus=self.num_gpus,
            resources=node_resources(name, max_sandboxes or self.max_sandboxes_per_node),
            object_store_memory=self.object_store_mb * _MIB,
            node_ip_address=LOOPBACK,
        )
        if head:
            args["include_dashboard"] = False
            if self.head_port is not None:
                args["gcs_server_port"] = self.head_port
            if self.fast_failure_detection:
                args["_system_config"] = dict(FAST_FAILURE_DETECTION)
        return args

    def start(self) -> str:
        import_ray(loopback=True)
        if self.auth:
            source = enable_token_auth(generate=True)
            if "RAY_AUTH_TOKEN" not in os.environ:
                # This process owns the cluster: the drivers it starts get the token with the
                # mode, whatever HOME they run with.
                os.environ["RAY_AUTH_TOKEN"] = Path(source).read_text().strip()
        from ray.cluster_utils import Cluster

        head, *rest = self.names
        self._cluster = Cluster(initialize_head=True, head_node_args=self._node_args(head, True))
        self._nodes[head] = self._cluster.head_node
        for name in rest:
            self.add_node(name)
        return self.address

    @property
    def address(self) -> str:
        if self._cluster is None:
            raise RuntimeError("cluster not started")
        return str(self._cluster.address)

    def add_node(self, name: str, max_sandboxes: int | None = None) -> None:
        """Start node `name` (new, or back after `kill_node`); `max_sandboxes`: its cap, if
        not the cluster's."""
        if self._cluster is None:
            raise RuntimeError("cluster not started")
        if name in self._nodes:
            raise ValueError(f"node {name!r} is running")
        self._nodes[name] = self._cluster.add_node(**self._node_args(name, False, max_sandboxes))
        if name not in self.names:
            self.names.append(name)

    def kill_node(self, name: str) -> None:
        """SIGKILL node `name`'s Ray processes (not the head's)."""
        node = self._nodes.get(name)
        if node is None:
            raise ValueError(f"no running node {name!r}; running: {sorted(self._nodes)}")
        if node is self._cluster.head_node:
            raise ValueError(f"{name!r} is the head node; killing it ends the cluster")
        self._cluster.remove_node(node, allow_graceful=False)
        del self._nodes[name]

    def remove_node(self, name: str) -> None:
        """`kill_node` for a node that is not coming back: its name leaves `names` too."""
        self.kill_node(name)
        self.names.remove(name)

    def node_id(self, name: str) -> str:
        return str(self._nodes[name].node_id)

    @property
    def running(self) -> list[str]:
        return [n for n in self.names if n in self._nodes]

    def shutdown(self) -> None:
        """Stop the agents (each destroys its sandboxes), then every node."""
        if self._cluster is not None:
            import ray

            try:
                connect(self.address)
                stop_agents(self.running)
            except Exception as exc:
                log.warning("could not stop the node agents: %r", exc)
            if ray.is_initialized():  # this process's driver talks to the cluster going away
                ray.shutdown()
            self._cluster.shutdown()
            self._cluster = None
            self._nodes.clear()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def agent_name(node: str) -> str:
    return f"sandgym-node:{node}"


def stop_agents(names: Iterable[str], timeout: float = 30.0) -> list[str]:
    """Shut down the agents of these nodes (each destroys its sandboxes first), then end
    their actors; returns the names whose agent was running. Needs a connected driver."""
    import ray

    handles = {}
    for name in names:
        try:
            handles[name] = ray.get_actor(agent_name(name), namespace=NAMESPACE)
        except ValueError:
            continue
    refs = [h.shutdown.remote() for h in handles.values()]
    try:
        ray.get(refs, timeout=timeout)
    except Exception as exc:  # a dead node's agent cannot answer; the rest are done
        log.warning("stopping agents: %r", exc)
    for h in handles.values():
        try:
            ray.kill(h)
        except Exception as exc:
            log.debug("kill: %r", exc)
    return sorted(handles)
