"""Sandboxes: one manager over any provider (docker, local, prime, ray, or one's own).

base.py (the `Sandbox` interface and `Provider` protocol), live.py (live processes),
manager.py (caps, pools, hooks, TTL), registry.py (providers by name, entry point or dotted
path), options.py (the built-ins' typed options), providers/ (docker/, local/, prime.py,
ray/), execd/ (the in-sandbox exec daemon), contract.py (what every provider must pass).
"""

from .base import AdoptingProvider, Provider, Sandbox
from .errors import (
    HookError,
    ImagePullError,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGoneError,
    SandboxLostError,
    SpecError,
)
from .hooks import Hooks
from .live import LiveProcess
from .manager import ManagedSandbox, SandboxManager
from .ownership import prune
from .registry import PROVIDERS, get_provider
from .result import ERROR_TYPES, EgressLogEntry, ExecResult, SandboxInfo
from .spec import DEFAULT_IMAGE, EgressPolicy, SandboxSpec

__all__ = [
    "AdoptingProvider", "DEFAULT_IMAGE", "ERROR_TYPES", "PROVIDERS", "EgressLogEntry", "EgressPolicy", "ExecResult", "HookError",
    "Hooks", "ImagePullError", "LiveProcess", "ManagedSandbox", "Provider",
    "Sandbox", "SandboxCreateError", "SandboxError", "SandboxFileNotFound", "SandboxGoneError", "SandboxLostError",
    "SandboxInfo", "SandboxManager", "SandboxSpec", "SpecError", "get_provider", "prune",
]
