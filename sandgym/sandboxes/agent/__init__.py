"""The in-sandbox exec agent (server.py, stdlib only, runs inside the sandbox) and its
host-side async client. See client.py's docstring for how a provider starts it."""

from .client import (
    AGENT_DIR,
    CONTAINER_AGENT_DIR,
    CONTAINER_SOCKET_DIR,
    SERVER_PATH,
    SOCKET_NAME,
    AgentClient,
    AgentRequestError,
    AgentUnresponsiveError,
    BatchJob,
    agent_command,
    agent_volumes,
)
from .transport import AgentTransport

__all__ = [
    "AGENT_DIR",
    "CONTAINER_AGENT_DIR",
    "CONTAINER_SOCKET_DIR",
    "SERVER_PATH",
    "SOCKET_NAME",
    "AgentClient",
    "AgentRequestError",
    "AgentTransport",
    "AgentUnresponsiveError",
    "BatchJob",
    "agent_command",
    "agent_volumes",
]
