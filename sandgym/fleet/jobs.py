"""What a driver sends a node to run rollouts there: the environment (by name and
arguments, loaded on the node) and the policy (an offline one, or an OpenAI-compatible
server the node can reach). Both are small pydantic models, so they cross Ray as data."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EnvSpec(BaseModel):
    """`sandgym.envs.load_environment(name, **args)` on the node."""

    model_config = ConfigDict(frozen=True)

    name: str
    args: dict[str, Any] = Field(default_factory=dict)

    def key(self) -> str:
        return json.dumps([self.name, self.args], sort_keys=True, default=str)

    def load(self) -> Any:
        from sandgym import envs

        return envs.load_environment(self.name, **self.args)


class ClientSpec(BaseModel):
    """The policy rollouts ask: `policy` (oracle, null) or a server at `base_url`."""

    model_config = ConfigDict(frozen=True)

    model: str = "default"
    policy: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = 600.0
    max_retries: int = 3
    request_tokens: bool = True

    @model_validator(mode="after")
    def _one_kind(self) -> ClientSpec:
        if (self.policy is None) == (self.base_url is None):
            raise ValueError("give exactly one of policy or base_url")
        return self

    def key(self) -> str:
        return self.model_dump_json()

    def build(self, env: Any) -> Any:
        if self.policy is not None:
            from sandgym.core.policies import get_policy

            return get_policy(self.policy, env)
        from sandgym.core.clients import OpenAIClient

        return OpenAIClient(
            self.base_url,
            self.api_key,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            request_tokens=self.request_tokens,
        )
