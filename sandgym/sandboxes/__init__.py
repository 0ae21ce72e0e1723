"""Sandboxes: one manager over Docker, local and Prime providers.

base.py (the `Sandbox` interface and `Provider` protocol), live.py (live processes),
manager.py (caps, pools, hooks, TTL), providers/ (docker/, local/, prime.py), execd/ (the
in-sandbox exec daemon), contract.py (what every provider must pass).
"""

from .base import Provider, Sandbox
from .errors import (
    HookError,
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
from .result import ExecResult, SandboxInfo
from .spec import DEFAULT_IMAGE, SandboxSpec

__all__ = [
    "DEFAULT_IMAGE", "PROVIDERS", "ExecResult", "HookError", "Hooks", "LiveProcess", "ManagedSandbox", "Provider",
    "Sandbox", "SandboxCreateError", "SandboxError", "SandboxFileNotFound", "SandboxGoneError", "SandboxLostError",
    "SandboxInfo", "SandboxManager", "SandboxSpec", "SpecError", "get_provider", "prune",
]
