"""Providers by name: the built-ins (`docker`, the default; `local`; `prime`; `ray`), those
installed by other packages under the entry-point group `sandgym.providers`, and any class
named by dotted path, `pkg.module:ClassName`.

    get_provider("docker", image_aliases={...})       # a built-in, its options typed
    get_provider("mypkg.sandboxes:MyProvider", x=1)   # anyone's, by dotted path

A package offers a provider under a short name with an entry point (pyproject.toml):

    [project.entry-points."sandgym.providers"]
    mine = "mypkg.sandboxes:MyProvider"

Built-ins are dotted paths too, imported only when asked for: this module imports no
provider (the ray provider's agent runs a SandboxManager, which uses this registry).

Options are checked before the provider is made: against the built-in's model in
options.py, or a class's own `Options` (a pydantic model) when it declares one; a misspelt
option is refused by name (ProviderOptionsError).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ValidationError

from .base import Provider
from .options import DockerOptions, LocalOptions, PrimeOptions, RayOptions

ENTRY_POINT_GROUP = "sandgym.providers"

BUILTIN: dict[str, str] = {
    "docker": "sandgym.sandboxes.providers.docker:DockerProvider",
    "local": "sandgym.sandboxes.providers.local:LocalProvider",
    "prime": "sandgym.sandboxes.providers.prime:PrimeProvider",
    "ray": "sandgym.sandboxes.providers.ray:RayProvider",
}
OPTIONS: dict[str, type[BaseModel]] = {
    "docker": DockerOptions, "local": LocalOptions, "prime": PrimeOptions, "ray": RayOptions,
}
PROVIDERS = tuple(BUILTIN)


class UnknownProviderError(ValueError):
    """A provider name that is neither built in, installed, nor an importable dotted path."""


class ProviderOptionsError(ValueError):
    """Options a provider does not take (or values of the wrong kind), each named."""


def installed() -> dict[str, str]:
    """Providers other packages declare under the `sandgym.providers` entry-point group."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _unknown(name: str, why: str = "") -> UnknownProviderError:
    extra = installed()
    names = ", ".join(PROVIDERS) + (f"; installed: {', '.join(sorted(extra))}" if extra else "")
    return UnknownProviderError(
        f"unknown provider {name!r}{why}; choose one of {names}, or name a class by dotted path "
        "(pkg.module:ClassName)"
    )


def dotted_path(name: str) -> str:
    """The `pkg.module:ClassName` a provider name stands for (no import yet)."""
    if name in BUILTIN:
        return BUILTIN[name]
    extra = installed()
    if name in extra:
        return extra[name]
    if ":" in name:
        return name
    raise _unknown(name)


def provider_class(name: str) -> type[Any]:
    """Import and return the class a provider name stands for."""
    path = dotted_path(name)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise _unknown(name, f" ({path!r} is not of the form pkg.module:ClassName)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if name in BUILTIN or exc.name is None or not module_name.startswith(exc.name):
            raise  # a module that exists but fails to import: its own error, unchanged
        raise _unknown(name, f" (no module {module_name!r})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _unknown(name, f" (module {module_name!r} has no {attr!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _unknown(name, f" ({path} is not a class)")
    return obj


def options_model(name: str, cls: type[Any] | None = None) -> type[BaseModel] | None:
    """The typed options of a provider: a built-in's, or a class's own `Options` model."""
    if name in OPTIONS:
        return OPTIONS[name]
    declared = getattr(cls if cls is not None else provider_class(name), "Options", None)
    return declared if isinstance(declared, type) and issubclass(declared, BaseModel) else None


def provider_options(name: str, options: Mapping[str, Any], cls: type[Any] | None = None) -> dict[str, Any]:
    """`options` checked against the provider's model; only those given are returned, so
    the constructor's own defaults apply to the rest."""
    model = options_model(name, cls)
    if model is None:
        return dict(options)
    try:
        checked = model.model_validate(dict(options))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err.get("loc", ())) or "(options)"
            problems.append(f"{key}: {err.get('msg', 'invalid')}")
        known = ", ".join(model.model_fields)
        raise ProviderOptionsError(
            f"bad option for the {name} provider: {'; '.join(problems)} (its options: {known})"
        ) from None
    for key, info in model.model_fields.items():  # options of another provider, e.g. a node agent's
        extra = info.json_schema_extra
        nested = getattr(checked, key)
        if isinstance(extra, dict) and "options_of" in extra and nested:
            provider_options(str(getattr(checked, str(extra["options_of"]))), nested)
    return {k: getattr(checked, k) for k in checked.model_fields_set}


def get_provider(name: str = "docker", **options: Any) -> Provider:
    """Make the provider `name` stands for, its options checked first."""
    cls = provider_class(name)
    provider = cls(**provider_options(name, options, cls))
    if not isinstance(provider, Provider):
        raise TypeError(
            f"{dotted_path(name)} does not implement the Provider protocol (sandgym.sandboxes.base): "
            "it needs name, check, create, list, remove and aclose"
        )
    return provider
