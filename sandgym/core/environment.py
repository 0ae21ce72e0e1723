"""Environment: a dataset, a way to roll out a model on one row, and a rubric to score it.

`Environment.rollout` never raises for a failing rollout: the error is recorded on the
`State` (model 5xx after retries, a dead sandbox, a timeout) and the other rollouts go on.
Cleanup (`@cleanup` methods: e.g. releasing the sandbox) always runs, shielded from
cancellation, after scoring so reward functions may still use the rollout's sandbox.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import anyio

from .calls import maybe_await
from .clients import ModelClient, ModelResponse
from .decorators import CLEANUP, STOP, TEARDOWN, marked, stop
from .failures import classify, error_text
from .parsers import Parser
from .rubric import Rubric
from .state import Message, State, Turn

if TYPE_CHECKING:
    from datasets import Dataset

    from sandgym.sandboxes.manager import SandboxManager
    from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)

Row = dict[str, Any]


def to_dataset(data: Any) -> Dataset | list[Row] | None:
    """A Hugging Face Dataset as given; a list (or iterable) of dicts as a list of dicts, every
    row with every column (None where a row lacks one, as a Dataset would have it). Lists are
    not converted: that imports `datasets` (pandas, pyarrow: a second of a CLI's start)."""
    if data is None:
        return None
    hf = sys.modules.get("datasets")  # not imported: `data` cannot be one of its Datasets
    if hf is not None and isinstance(data, hf.Dataset):
        return data
    rows = [dict(r) for r in data]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in columns} for r in rows]


class Environment:
    """Base class. Subclasses implement `run_turns` (MultiTurnEnv does)."""

    def __init__(
        self,
        dataset: Any = None,
        eval_dataset: Any = None,
        *,
        system_prompt: str | None = None,
        few_shot: Sequence[Message] | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        max_concurrent: int | None = None,
        name: str | None = None,
        pass_threshold: float = 1.0,
        sandbox_spec: SandboxSpec | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.dataset = to_dataset(dataset)
        self.eval_dataset = to_dataset(eval_dataset)
        if self.dataset is None and self.eval_dataset is None:
            raise ValueError("an environment needs a dataset or an eval_dataset")
        self.system_prompt = system_prompt
        self.few_shot = list(few_shot or [])
        self.parser = parser or (rubric.parser if rubric else Parser())
        self.rubric = rubric or Rubric(parser=self.parser)
        self.sampling_args = dict(sampling_args or {})
        self.max_concurrent = max_concurrent
        self.name = name or type(self).__name__
        self.pass_threshold = pass_threshold
        self.sandbox_spec = sandbox_spec  # None: this environment needs no sandboxes
        self.timeout_s = timeout_s
        self.sandboxes: SandboxManager | None = None  # bound by `sandbox_session`

    # ---- data ------------------------------------------------------------------------

    def format_prompt(self, row: Mapping[str, Any]) -> list[Message]:
        prompt = row.get("prompt")
        if prompt is None:
            prompt = row.get("question")
            if prompt is None:
                raise ValueError("a row needs `prompt` (messages or text) or `question`")
        messages: list[Message] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        head: list[Message] = []
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            head.append({"role": "system", "content": self.system_prompt})
        if self.few_shot and len(messages) == 1:
            head.extend(dict(m) for m in self.few_shot)
        return head + messages

    def rows(self, n: int | None = None, *, split: str = "eval") -> list[Row]:
        """Rows as plain dicts with `example_id` (their index unless the dataset has one)."""
        ds = self.eval_dataset if (split == "eval" and self.eval_dataset is not None) else self.dataset
        if ds is None:
            ds = self.eval_dataset
        assert ds is not None
        count = len(ds) if n is None or n < 0 else min(n, len(ds))
        # Fresh copies every call, as Dataset.to_list gives: callers may change what they get.
        chosen = copy.deepcopy(ds[:count]) if isinstance(ds, list) else ds.select(range(count)).to_list()
        out: list[Row] = []
        for i, row in enumerate(chosen):
            row.setdefault("example_id", i)
            if row.get("example_id") is None:
                row["example_id"] = i
            info = row.get("info")
            if isinstance(info, str):
                try:
                    row["info"] = json.loads(info)
                except json.JSONDecodeError:
                    row["info"] = {"text": info}
            out.append(row)
        return out

    def init_state(self, row: Mapping[str, Any], rollout_index: int = 0) -> State:
        return State(
            env=self.name,
            task=row.get("task") or self.name,
            example_id=int(row.get("example_id") or 0),
            rollout_index=rollout_index,
            prompt=self.format_prompt(row),
            answer=row.get("answer"),
            info=dict(row.get("info") or {}),
        )

    # ---- sandboxes -------------------------------------------------------------------

    def sandbox_specs(self) -> list[SandboxSpec]:
        return [self.sandbox_spec] if self.sandbox_spec is not None else []

    def bind_sandboxes(self, manager: SandboxManager | None) -> None:
        self.sandboxes = manager

    @asynccontextmanager
    async def sandbox_session(
        self,
        provider: Any = "docker",
        *,
        max_sandboxes: int = 8,
        warm: int = 0,
        manager: SandboxManager | None = None,
    ) -> AsyncIterator[SandboxManager | None]:
        """Bind a SandboxManager for the block (made here unless given) when the environment
        needs sandboxes; warm `warm` sandboxes of each spec first. Every sandbox made is
        destroyed on exit."""
        specs = self.sandbox_specs()
        if not specs:
            yield None
            return
        if manager is not None:
            self.bind_sandboxes(manager)
            try:
                yield manager
            finally:
                self.bind_sandboxes(None)
            return
        from sandgym.sandboxes.manager import SandboxManager

        # Sandboxes not kept for reuse are destroyed off the rollout's path.
        async with SandboxManager(provider, max_sandboxes=max_sandboxes, background_recycle=True) as mgr:
            self.bind_sandboxes(mgr)
            try:
                if warm > 0:
                    per_spec = max(1, warm // len(specs))
                    for spec in dict((s.key(), s) for s in specs).values():
                        await mgr.warm(spec, per_spec)
                yield mgr
            finally:
                self.bind_sandboxes(None)

    def require_sandboxes(self) -> SandboxManager:
        if self.sandboxes is None:
            raise RuntimeError(f"{self.name} needs sandboxes: run it inside `env.sandbox_session(...)`")
        return self.sandboxes

    # ---- rollout ---------------------------------------------------------------------

    async def setup_state(self, state: State) -> None:
        """Per-rollout setup (acquire a sandbox, ...). Counted as setup time."""

    async def run_turns(self, client: ModelClient, model: str, state: State, sampling_args: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def scoring_args(self, state: State) -> dict[str, Any]:
        """Extra named arguments offered to reward functions."""
        return {"sandbox": state.scratch.get("sandbox"), "sandboxes": self.sandboxes}

    async def score_rollout(self, state: State) -> None:
        await self.rubric.score_rollout(state, self.scoring_args(state))

    async def score_group(self, states: Sequence[State]) -> None:
        await self.rubric.score_group(states, {"sandboxes": self.sandboxes})

    async def rollout(
        self,
        client: ModelClient,
        model: str,
        row: Mapping[str, Any],
        rollout_index: int = 0,
        sampling_args: Mapping[str, Any] | None = None,
        *,
        score: bool = True,
    ) -> State:
        state = self.init_state(row, rollout_index)
        args = {**self.sampling_args, **(sampling_args or {})}
        t_start = time.perf_counter()
        try:
            try:
                t0 = time.perf_counter()
                await self.setup_state(state)
                state.timing.setup_s += time.perf_counter() - t0
                with anyio.fail_after(self.timeout_s) if self.timeout_s else nullcontext():
                    await self.run_turns(client, model, state, args)
            except TimeoutError as exc:
                if classify(exc, default="timeout") == "timeout":
                    state.fail(f"TimeoutError: rollout exceeded {self.timeout_s}s", "timeout")
                    state.stop_reason = "timeout"
                else:  # e.g. a sandbox call that timed out: that is the sandbox's failure
                    state.fail(error_text(exc), classify(exc))
                    state.stop_reason = "error"
            except Exception as exc:
                log.debug("rollout %s/%s failed", state.example_id, rollout_index, exc_info=True)
                state.fail(error_text(exc), classify(exc))
                state.stop_reason = "error"
            self._finish_accounting(state)
            if score and state.error is None:
                try:
                    await self.score_rollout(state)
                except Exception as exc:
                    state.fail(f"scoring failed: {error_text(exc)}", classify(exc, default="scoring"))
                    state.stop_reason = "error"
            if state.error is not None:
                state.reward = 0.0
        finally:
            with anyio.CancelScope(shield=True):
                for fn in marked(self, CLEANUP):
                    try:
                        await maybe_await(fn(state))
                    except Exception as exc:
                        log.warning("cleanup %s failed: %r", getattr(fn, "__name__", fn), exc)
            state.timing.total_s = time.perf_counter() - t_start
        return state

    def _finish_accounting(self, state: State) -> None:
        state.timing.model_s = sum(t.model_s for t in state.turns)
        state.timing.tools_s = sum(t.tools_s for t in state.turns)
        usage: dict[str, int] = {}
        for t in state.turns:
            for k, v in t.usage.items():
                usage[k] = usage.get(k, 0) + int(v)
        state.usage = usage

    async def rollout_group(
        self,
        client: ModelClient,
        model: str,
        row: Mapping[str, Any],
        n: int,
        sampling_args: Mapping[str, Any] | None = None,
        *,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> list[State]:
        """`n` rollouts of one row, concurrently, then group rewards and advantages. Each
        rollout holds `limiter` while it runs (not while the group is scored), so groups
        rolled out side by side can share one cap."""
        states: list[State | None] = [None] * n

        async def one(i: int) -> None:
            async with limiter if limiter is not None else nullcontext():
                states[i] = await self.rollout(client, model, row, i, sampling_args)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        done = [s for s in states if s is not None]
        await self.score_group(done)
        return done

    async def generate(
        self,
        client: ModelClient,
        model: str,
        rows: Sequence[Mapping[str, Any]] | None = None,
        *,
        num_examples: int | None = None,
        rollouts_per_example: int = 1,
        max_concurrent: int | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        split: str = "train",
    ) -> list[State]:
        """Roll out every row `rollouts_per_example` times (groups scored together, with
        advantages): the training path. At most `max_concurrent` rollouts run at once across
        all groups. Bind sandboxes first when the env needs them."""
        rows = list(rows) if rows is not None else self.rows(num_examples, split=split)
        limiter = anyio.CapacityLimiter(max_concurrent or self.max_concurrent or 64)
        groups: list[list[State]] = [[] for _ in rows]

        async def group(gi: int, row: Mapping[str, Any]) -> None:
            groups[gi] = await self.rollout_group(client, model, row, rollouts_per_example, sampling_args, limiter=limiter)

        async with anyio.create_task_group() as tg:
            for gi, row in enumerate(rows):
                tg.start_soon(group, gi, row)
        return [s for g in groups for s in g]

    # ---- offline policies ------------------------------------------------------------

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        """What the oracle policy says next: by default the reference answer as text."""
        return {"role": "assistant", "content": "" if state.answer is None else str(state.answer)}

    # ---- teardown --------------------------------------------------------------------

    async def close(self) -> None:
        for fn in marked(self, TEARDOWN):
            await maybe_await(fn())


class MultiTurnEnv(Environment):
    """Model turn, environment response, repeat until a `@stop` condition holds."""

    def __init__(self, *args: Any, max_turns: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_turns = max_turns

    async def env_response(self, messages: list[Message], state: State) -> list[Message]:
        """The environment's answer to the last model message (e.g. tool results)."""
        raise NotImplementedError

    @stop
    def max_turns_reached(self, state: State) -> bool:
        return self.max_turns > 0 and len(state.turns) >= self.max_turns

    @stop
    def truncated(self, state: State) -> bool:
        return bool(state.turns) and state.turns[-1].finish_reason == "length"

    async def is_completed(self, state: State) -> bool:
        for fn in marked(self, STOP):
            if await maybe_await(fn(state)):
                state.stop_reason = getattr(fn, "__name__", "stop")
                return True
        return False

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        return None

    async def get_model_response(
        self, client: ModelClient, model: str, messages: list[Message], state: State, sampling_args: Mapping[str, Any]
    ) -> ModelResponse:
        return await client.chat(messages, model=model, tools=self.tools_for(state), sampling_args=sampling_args, state=state)

    async def run_turns(self, client: ModelClient, model: str, state: State, sampling_args: Mapping[str, Any]) -> None:
        messages: list[Message] = list(state.prompt)
        state.tools = self.tools_for(state)
        while True:
            t0 = time.perf_counter()
            resp = await self.get_model_response(client, model, messages, state, sampling_args)
            turn = Turn(
                prompt=list(messages),
                completion=resp.message,
                tokens=resp.tokens,
                token_source=resp.token_source,
                token_in=resp.token_in,
                finish_reason=resp.finish_reason,
                usage=resp.usage,
                model_s=time.perf_counter() - t0,
            )
            state.turns.append(turn)
            messages.append(resp.message)
            state.completion.append(resp.message)
            if await self.is_completed(state):
                return
            t1, setup0 = time.perf_counter(), state.timing.setup_s
            env_msgs = await self.env_response(messages, state)
            # A sandbox made lazily during the tool call counts as setup, not tool time.
            turn.tools_s = time.perf_counter() - t1 - (state.timing.setup_s - setup0)
            turn.env_response = list(env_msgs)
            messages.extend(env_msgs)
            state.completion.extend(env_msgs)
            if await self.is_completed(state):
                return


class SingleTurnEnv(MultiTurnEnv):
    """One model call; the rubric scores it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["max_turns"] = 1
        super().__init__(*args, **kwargs)

    async def env_response(self, messages: list[Message], state: State) -> list[Message]:
        return []
