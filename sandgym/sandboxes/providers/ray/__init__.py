"""The `ray` provider: sandboxes on the sandgym nodes of a Ray cluster.

cluster.py (how a Ray node becomes a sandgym node; connecting, on loopback too; a simulated
cluster on 127.0.0.1), agent.py (the node agent: one actor per machine wrapping its provider,
hard cap, warm pools and execd, and running work sent to it next to its sandboxes), fleet.py
(a driver's view: discovery, placement, caps, creation-rate limit, backoff, node-loss
detection), provider.py (`RayProvider` behind the Provider protocol), sandbox.py (`RaySandbox`),
ratelimit.py. Ray is optional (`pip install 'sandgym[ray]'`); nothing here imports it at
module level. Distributed rollouts and training placement build on this in sandgym.fleet.
"""

from .cluster import CAP_RESOURCE, NODE_RESOURCE_PREFIX, LocalCluster, connect, node_resources
from .fleet import Fleet, FleetNode
from .provider import RayProvider, RaySandbox

__all__ = [
    "CAP_RESOURCE", "Fleet", "FleetNode", "LocalCluster", "NODE_RESOURCE_PREFIX", "RayProvider", "RaySandbox",
    "connect", "node_resources",
]
