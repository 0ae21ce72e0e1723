"""Providers by name: `docker` (default), `local`, `prime`, `ray` (a fleet of machines on Ray)."""

from __future__ import annotations

from typing import Any

from .base import Provider

PROVIDERS = ("docker", "local", "prime", "ray")


def get_provider(name: str = "docker", **kwargs: Any) -> Provider:
    if name == "docker":
        from .providers.docker import DockerProvider

        return DockerProvider(**kwargs)
    if name == "local":
        from .providers.local import LocalProvider

        return LocalProvider(**kwargs)
    if name == "prime":
        from .providers.prime import PrimeProvider

        return PrimeProvider(**kwargs)
    if name == "ray":
        from .providers.ray import RayProvider

        return RayProvider(**kwargs)
    raise ValueError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
