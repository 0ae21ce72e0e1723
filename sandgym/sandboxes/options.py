"""The options of the built-in providers, typed: what `get_provider(name, **options)`,
`SandboxManager(provider_options=...)` and `sandgym serve`'s config accept for each one.

Each model mirrors its provider's constructor (tests/sandboxes/test_registry.py holds them
to it) and refuses an option it does not know, by name, before anything is made. A provider
of one's own may declare its options the same way: a pydantic model as the class attribute
`Options` (see registry.py). Pure data: importing this module imports no provider.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ProviderOptions(BaseModel):
    """Options of one provider: unknown ones are refused; values are passed on as given. A
    field holding another provider's options names the field with that provider's name in
    `json_schema_extra={"options_of": ...}`; the registry checks them against it."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)


class DockerOptions(ProviderOptions):
    client: Any = Field(None, description="a docker.DockerClient (default: docker.from_env())")
    max_concurrency: int = Field(64, ge=1, description="engine calls in flight at once")
    timeout_s: float = Field(120.0, gt=0, description="timeout of one engine API call")
    execd: bool = Field(True, description="False: always `docker exec` (main process `sleep`)")
    socket_root: str | os.PathLike[str] | None = Field(
        None, description="where per-container execd socket dirs go (default /run/sandgym-sockets as root)")
    image_aliases: dict[str, str] | None = Field(
        None, description="image names mapped to local images before any lookup or pull")
    allow_vm_without_gvisor: bool | None = Field(
        None, description="run profile=vm under plain runc when gVisor is missing (None: $SANDGYM_ALLOW_VM_WITHOUT_GVISOR)")
    egress_host_ports: list[int] | tuple[int, ...] = Field(
        (), description="host loopback ports sandboxes may reach as host.sandgym.internal:PORT")
    ca_bundle: str | None = Field("auto", description="CA bundle mounted into sandboxes with egress")
    pull_progress: Callable[..., None] | None = Field(None, description="called with each pull progress event")
    state_root: str | os.PathLike[str] | None = Field(None, description="where the egress proxy keeps its state")
    disk: Literal["auto", "loop", "tmpfs"] = Field("auto", description="per-sandbox disk: ext4 file (loop) or tmpfs")
    runtime: Literal["auto", "runsc", "runc"] = Field("auto", description="container runtime")
    build_images: bool = Field(True, description="build sandgym's own images when missing")


class LocalOptions(ProviderOptions):
    root: str | os.PathLike[str] | None = Field(None, description="where sandboxes live (default: a temp folder)")
    isolation: Literal["auto", "bwrap", "none"] = Field("auto", description="bubblewrap, or plain processes")
    uid_base: int = Field(1_610_000_000, ge=1, description="first private uid (as root)")
    uid_count: int = Field(1_000_000, ge=1, description="how many private uids")
    persistent: bool = Field(True, description="sandboxes outlive this process until pruned")


class PrimeOptions(ProviderOptions):
    endpoints: list[str] | str | None = Field(
        None, description="URLs (or one comma-separated string); default $SANDGYM_PRIME_ENDPOINTS / $PRIME_API_BASE_URL")
    api_key: str | None = Field(None, description="default: the SDK's ($PRIME_API_KEY or its config)")
    create_attempts: int = Field(60, ge=1, description="polls while a sandbox starts")
    state_dir: str | None = Field(None, description="where the SDK's gateway tokens are cached")


class RayOptions(ProviderOptions):
    address: str | None = Field(None, description="the Ray cluster (None: the one Ray finds)")
    fleet: Any = Field(None, description="a Fleet to use instead of making one")
    max_sandboxes: int | None = Field(None, ge=1, description="cluster-wide cap of this fleet")
    max_per_node: int | None = Field(None, ge=1, description="this fleet's limit per node")
    nodes: list[str] | None = Field(None, description="only these node names")
    create_rate: float = Field(50.0, gt=0, description="creates per second, cluster-wide")
    create_burst: float | None = None
    create_attempts: int = Field(3, ge=1)
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    monitor_interval_s: float = 0.5
    lease_s: float = 60.0
    node_wait_s: float = 120.0
    agent_provider: str = Field("docker", description="the provider a node agent runs")
    agent_provider_options: dict[str, Any] | None = Field(
        None, description="its options (checked against it)", json_schema_extra={"options_of": "agent_provider"})
    agent_max_sandboxes: int | None = None
