"""Past one machine on Ray: a fleet of node agents, distributed rollouts, and node failures
that lose nothing.

cluster.py (how a Ray node becomes a sandgym node; connecting; a simulated cluster on
127.0.0.1), agent.py (the node agent: one actor per machine wrapping its provider, cap, warm
pools and execd; rollouts run there), fleet.py (discovery, placement, caps, rate limit,
failure detection), provider.py (the `ray` provider behind SandboxManager), jobs.py (what a
driver sends a node), placement.py (placement groups for training). Distributed evaluation
is sandgym.core.distributed. Ray is optional: `pip install 'sandgym[ray]'`.
"""

from .cluster import CAP_RESOURCE, NODE_RESOURCE_PREFIX, LocalCluster, connect, node_resources
from .fleet import Fleet, FleetNode
from .jobs import ClientSpec, EnvSpec
from .provider import RayProvider, RaySandbox

__all__ = [
    "CAP_RESOURCE", "ClientSpec", "EnvSpec", "Fleet", "FleetNode", "LocalCluster", "NODE_RESOURCE_PREFIX",
    "RayProvider", "RaySandbox", "connect", "node_resources",
]
