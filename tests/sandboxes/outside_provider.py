"""A provider defined outside sandgym, as a newcomer would write one: a thin subclass of the
local provider with its own name and its own typed option. Named by dotted path
(`tests.sandboxes.outside_provider:OutsideProvider`) it must pass the whole contract."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.providers.local import LocalProvider
from sandgym.sandboxes.spec import SandboxSpec


class OutsideProvider(LocalProvider):
    name = "outside"

    class Options(BaseModel):
        """Its options, typed: the registry refuses any other."""

        model_config = ConfigDict(extra="forbid")
        greeting: str = "hello"

    def __init__(self, greeting: str = "hello") -> None:
        super().__init__()
        self.greeting = greeting

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> Sandbox:
        env = {**spec.env, "OUTSIDE_GREETING": self.greeting}
        return await super().create(spec.model_copy(update={"env": env}), labels)


class NotAProvider:
    """Has a name, and nothing else a provider needs."""

    name = "not-a-provider"
