"""Sandboxes: one manager over Docker, local and Prime providers.

base.py (the `Sandbox` interface and `Provider` protocol), live.py (live processes),
manager.py (caps, pools, hooks, TTL), providers/ (docker/, local/, prime.py), execd/ (the
in-sandbox exec daemon), contract.py (what every provider must pass).
"""

from .base import Provider, Sandbox
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
    "DEFAULT_IMAGE", "ERROR_TYPES", "PROVIDERS", "EgressLogEntry", "EgressPolicy", "ExecResult", "HookError",
    "Hooks", "ImagePullError", "LiveProcess", "ManagedSandbox", "Provider",
    "Sandbox", "SandboxCreateError", "SandboxError", "SandboxFileNotFound", "SandboxGoneError", "SandboxLostError",
    "SandboxInfo", "SandboxManager", "SandboxSpec", "SpecError", "get_provider", "prune",
]
