"""The trainer's seams are named protocols and every implementation satisfies its protocol:
both inference backends (hf, vllm), both engines, both rollout sources (toy, environment).

`isinstance` with a runtime_checkable protocol only sees that the names exist (and on Python
3.11 it evaluates properties: a not-started VLLMBackend's `base_url` raises), so each object
is also checked member by member without running anything: every protocol member is present,
methods are methods (async where the protocol's is) with the protocol's parameters, names and
kinds, in order (extra parameters only with defaults), properties are properties."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from sandgym.models.tiny import byte_tokenizer, tiny_qwen2
from sandgym.train.backends.base import InferenceBackend, InferenceEngine
from sandgym.train.backends.hf import HFBackend, HFEngine
from sandgym.train.backends.vllm import VLLMBackend, VLLMEngine
from sandgym.train.config import ToyTaskConfig
from sandgym.train.env_source import EnvRolloutSource
from sandgym.train.rollout_source import RolloutSource
from sandgym.train.toy import ToyTask


def _members(proto: type) -> list[str]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n in vars(proto) if not n.startswith("_")}
    return sorted(names)


def _params(fn: Any) -> list[inspect.Parameter]:
    return list(inspect.signature(fn).parameters.values())[1:]  # without self


def conformance_errors(obj: Any, proto: type) -> list[str]:
    errors = []
    for name in _members(proto):
        try:
            impl = inspect.getattr_static(obj, name)
        except AttributeError:
            errors.append(f"{name}: missing")
            continue
        spec = vars(proto).get(name)
        if spec is None:  # a data member (annotation only): present is all that can be said
            continue
        if isinstance(spec, property):
            if not isinstance(impl, property):
                errors.append(f"{name}: not a property")
        else:
            if not inspect.isfunction(impl):
                errors.append(f"{name}: not a method")
                continue
            if inspect.iscoroutinefunction(spec) != inspect.iscoroutinefunction(impl):
                errors.append(f"{name}: async mismatch")
            want, got = _params(spec), _params(impl)
            if [(p.name, p.kind) for p in want] != [(p.name, p.kind) for p in got[: len(want)]]:
                errors.append(f"{name}: parameters {[p.name for p in got]} != {[p.name for p in want]}")
            elif any(p.default is inspect.Parameter.empty for p in got[len(want) :]):
                errors.append(f"{name}: extra required parameters")
    return errors


@pytest.fixture(scope="module")
def tok() -> Any:
    return byte_tokenizer()


def test_both_inference_backends_are_inference_backends(tok: Any) -> None:
    hf = HFBackend(tiny_qwen2(), tok)
    vllm = VLLMBackend("/m", tok)  # not started: nothing of vLLM is needed to construct it
    assert isinstance(hf, InferenceBackend)
    for b in (hf, vllm):
        assert conformance_errors(b, InferenceBackend) == [], type(b).__name__


def test_both_engines_are_inference_engines(tok: Any) -> None:
    engines = [HFEngine(tiny_qwen2(), tok), VLLMEngine(None, tok)]
    for e in engines:
        assert isinstance(e, InferenceEngine)
        assert conformance_errors(e, InferenceEngine) == [], type(e).__name__
    # The backend serves its own engine with the one OpenAI-compatible server.
    b = HFBackend(tiny_qwen2(), tok)
    assert b.server.engine is b.engine


def test_both_rollout_sources_are_rollout_sources() -> None:
    sources = [ToyTask(ToyTaskConfig()), EnvRolloutSource("tool_use", {})]
    for s in sources:
        assert isinstance(s, RolloutSource)
        assert conformance_errors(s, RolloutSource) == [], type(s).__name__


def test_the_check_sees_a_broken_implementation() -> None:
    class Renamed:
        name = "x"

        async def generate_groups(self, base_url: str, model: str, begin: int, count: int, group_size: int, sampling: dict, max_concurrent: int) -> list:
            return []

        def sandbox_session(self) -> Any:
            return None

    class Sync:
        name = "x"

        def generate_groups(self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict, max_concurrent: int) -> list:
            return []

        def sandbox_session(self) -> Any:
            return None

    class NoName:
        async def generate_groups(self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict, max_concurrent: int, extra: int) -> list:
            return []

    assert conformance_errors(Renamed(), RolloutSource) == ["generate_groups: parameters ['base_url', 'model', 'begin', 'count', 'group_size', 'sampling', 'max_concurrent'] != ['base_url', 'model', 'start', 'count', 'group_size', 'sampling', 'max_concurrent']"]
    assert conformance_errors(Sync(), RolloutSource) == ["generate_groups: async mismatch"]
    assert conformance_errors(NoName(), RolloutSource) == ["generate_groups: extra required parameters", "name: missing", "sandbox_session: missing"]
