"""BFCL v4 (Berkeley Function Calling Leaderboard), scored as its authors score it.

`bfcl_v4_single_turn`: simple (python, java, javascript), multiple, parallel,
parallel_multiple, irrelevance and the live_* categories. One model call with the entry's
functions as tools (converted by BFCL's own `convert_to_tool`); the reply is recorded as
BFCL's OpenAI function-calling handler records it and checked by BFCL's AST checker (or its
relevance check) through `bfcl_eval`'s evaluation runner, in a sandgym/bfcl sandbox.

`bfcl_v4_multi_turn`: base, miss_func, miss_param, long_context. BFCL's inference loop for
function-calling models, step for step: each user turn, the model calls functions until it
answers without a call (at most BFCL's step limit, then the entry is force-quit);
miss_func adds the held-out functions at their turn. The stateful backends (file system,
trading bot, travel, vehicle control, messaging, ...) run INSIDE the rollout's sandbox: a
persistent process that BFCL's `execute_multi_turn_func_call` fills from the entry's initial
config and `eval`s each call in. The result is scored by BFCL's state- and response-based
`multi_turn_checker`, which runs the calls again, in a fresh process in a clean sandbox.

Every record keeps the result as BFCL writes it (`info.bfcl_result`), so `sandgym bfcl
export RUN` turns a run into BFCL result files that `bfcl evaluate` scores (`sandgym bfcl
evaluate RUN` does both and compares per category).

The oracle replays the ground truth (its first possible answer; the ground-truth calls of
each turn, then a closing message); relevance entries have none, so the oracle calls the
first function. The null policy calls nothing: 0, except on irrelevance (1).

kwargs: categories (names, a comma list, or single_turn / non_live / live / multi_turn),
per_category (N entries of each category, evenly spread), ids (entry ids to include; with
per_category, in addition to those), model (the BFCL model registry name used for decoding
and scoring; default an OpenAI function-calling entry).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio

from sandgym.bfcl import data
from sandgym.bfcl.oracle import all_functions, parse_call, relevance_call, single_turn_calls
from sandgym.bfcl.sandbox_code import backend_call, backend_setup, parse_marked
from sandgym.bfcl.scoring import SingleTurnScorer, check_multi_turn, model_responses, single_turn_request
from sandgym.core.decorators import stop
from sandgym.core.environment import MultiTurnEnv, SingleTurnEnv
from sandgym.core.rubric import Rubric
from sandgym.core.sandbox_env import SandboxEnv
from sandgym.core.sandbox_repl import SandboxRepl, session_service
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call
from sandgym.sandboxes.spec import SandboxSpec

BACKEND_TIMEOUT_S = 120.0


def _spread(n_total: int, n: int | None) -> list[int]:
    if n is None or n < 0 or n >= n_total:
        return list(range(n_total))
    return sorted({math.floor(i * n_total / n) for i in range(n)})


def build_rows(
    cats: list[str], per_category: int | None, ids: list[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, data.Entry]]:
    rows: list[dict[str, Any]] = []
    entries: dict[str, data.Entry] = {}
    wanted = set(ids or [])
    for cat in cats:
        all_entries = data.load_entries(cat)
        picked = set(_spread(len(all_entries), per_category)) if per_category is not None or not wanted else set()
        picked |= {i for i, e in enumerate(all_entries) if e.id in wanted}
        for i in sorted(picked):
            e = all_entries[i]
            entries[e.id] = e
            first = e.turns[0] if e.turns and e.turns[0] else [{"role": "user", "content": data.additional_function_prompt()}]
            rows.append(
                {
                    "example_id": len(rows),
                    # Messages as JSON text: live entries' messages differ in shape (one Arrow type).
                    "prompt": json.dumps(first),
                    "info": {"id": e.id, "category": cat},
                }
            )
    return rows, entries


class _BFCLMixin:
    entries: dict[str, data.Entry]
    bfcl_model: str
    _tools_cache: dict[str, list[dict[str, Any]]]

    def format_prompt(self, row: Mapping[str, Any]) -> list[Message]:
        prompt = row.get("prompt")
        return json.loads(prompt) if isinstance(prompt, str) else [dict(m) for m in prompt or []]

    def entry(self, state: State) -> data.Entry:
        return self.entries[state.info["id"]]

    def tools_of(self, functions: list[dict[str, Any]], key: str) -> list[dict[str, Any]] | None:
        if key not in self._tools_cache:
            self._tools_cache[key] = data.openai_tools(functions)
        return self._tools_cache[key] or None


def _record_outcome(state: State, out: dict[str, Any]) -> float:
    state.info["bfcl_valid"] = bool(out.get("valid"))
    if not out.get("valid"):
        state.info["bfcl_error_type"] = out.get("error_type")
        state.info["bfcl_error"] = out.get("error")
    return 1.0 if out.get("valid") else 0.0


# ---- single turn -----------------------------------------------------------------------


class BFCLSingleTurnEnv(_BFCLMixin, SingleTurnEnv):
    def __init__(self, *args: Any, entries: dict[str, data.Entry], bfcl_model: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entries = entries
        self.bfcl_model = bfcl_model
        self._tools_cache = {}
        self.scorer: SingleTurnScorer | None = None

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        e = self.entry(state)
        return self.tools_of(e.functions, e.id)

    async def run_turns(self, client: Any, model: str, state: State, sampling_args: Any) -> None:
        await super().run_turns(client, model, state, sampling_args)
        state.info["bfcl_result"] = model_responses(state.turns[-1].completion) if state.turns else None

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        e = self.entry(state)
        if e.category in ("irrelevance", "live_irrelevance"):
            return {"role": "assistant", "content": "None of the functions can answer this request."}
        calls = [relevance_call(e)] if e.category == "live_relevance" else single_turn_calls(e)
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call(name, args, f"call_{state.id[:8]}_{i}") for i, (name, args) in enumerate(calls)],
        }

    @asynccontextmanager
    async def sandbox_session(
        self, provider: Any = "docker", *, max_sandboxes: int = 8, warm: int = 0, manager: Any = None
    ) -> AsyncIterator[Any]:
        """One sandbox for the session: the shared scorer's (started at once)."""
        if manager is None:
            max_sandboxes = 1  # rollouts themselves need no sandbox (and none is warmed)
        async with super().sandbox_session(provider, max_sandboxes=max_sandboxes, warm=0, manager=manager) as mgr:
            async with session_service(lambda tg: SingleTurnScorer(mgr, self.sandbox_spec, tg, self.bfcl_model)) as self.scorer:
                try:
                    yield mgr
                finally:
                    self.scorer = None

    async def bfcl_valid(self, state: State) -> float:
        if self.scorer is None:
            raise RuntimeError(f"{self.name} scores in a sandgym/bfcl sandbox: run it inside `env.sandbox_session(...)`")
        e = self.entry(state)
        out = await self.scorer.score(single_turn_request(e, state.info.get("bfcl_result"), self.bfcl_model))
        return _record_outcome(state, out)


# ---- multi turn ------------------------------------------------------------------------


class BFCLMultiTurnEnv(_BFCLMixin, SandboxEnv):
    """BFCL's multi-turn inference loop; the backends live in the rollout's sandbox."""

    def __init__(self, *args: Any, entries: dict[str, data.Entry], bfcl_model: str, **kwargs: Any) -> None:
        super().__init__(*args, max_turns=0, **kwargs)
        # The tools are the entry's functions, not bash.
        self.tools.pop("bash", None)
        self.skipped_args.pop("bash", None)
        self.tool_schemas = []
        self.entries = entries
        self.bfcl_model = bfcl_model
        self._tools_cache = {}
        self.step_limit = data.step_limit()

    # BFCL goes on after a text reply (next turn) and after a cut-off reply: only its own
    # end (all turns done, or force-quit) stops a rollout.
    def no_tools_called(self, state: State) -> bool:
        return False

    def truncated(self, state: State) -> bool:
        return False

    async def setup_state(self, state: State) -> None:
        await super().setup_state(state)
        e = self.entry(state)
        state.scratch["bfcl"] = {"turn": 0, "step": 0, "functions": list(e.functions), "tools_key": e.id, "done": False}
        state.info["bfcl_result"] = [[]]

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        b = state.scratch["bfcl"]
        return self.tools_of(b["functions"], b["tools_key"])

    @stop
    def bfcl_finished(self, state: State) -> bool:
        return bool(state.scratch.get("bfcl", {}).get("done"))

    async def run_turns(self, client: Any, model: str, state: State, sampling_args: Any) -> None:
        async with anyio.create_task_group() as tg:
            state.scratch["backend_tg"] = tg
            try:
                await super().run_turns(client, model, state, sampling_args)
            finally:
                repl = state.scratch.pop("backend", None)
                with anyio.CancelScope(shield=True):
                    if repl is not None:
                        await repl.stop()
                    # Scoring needs no backend (the checker replays the calls elsewhere): give
                    # the sandbox back now, so a rollout never holds two at once.
                    await self.release_sandbox(state)
                tg.cancel_scope.cancel()

    async def setup_sandbox(self, sandbox: Any, state: State) -> None:
        """Start the backends in the rollout's fresh sandbox, from the entry's initial config."""
        e = self.entry(state)
        repl = SandboxRepl(sandbox, state.scratch["backend_tg"], name="bfclbackend")
        state.scratch["backend"] = repl
        reply = await repl.run(
            backend_setup(e.id, e.category, e.eval_entry.get("initial_config") or {}, e.eval_entry["involved_classes"]),
            timeout=BACKEND_TIMEOUT_S,
        )
        if not reply.ok or parse_marked(reply.stdout) is None:
            raise RuntimeError(f"BFCL backends did not start for {e.id} ({reply.status}): {reply.stderr[-1500:]}")

    async def execute(self, calls: list[str], state: State) -> list[str]:
        sandbox = await self.sandbox_for(state)  # made (and the backends started) on first use
        repl: SandboxRepl = state.scratch["backend"]
        generation = repl.generation
        reply = await repl.run(backend_call(calls), timeout=BACKEND_TIMEOUT_S)
        results = parse_marked(reply.stdout) if reply.ok else None
        if results is None:
            detail = reply.stderr.strip()[-500:] or reply.status
            if not repl.running or repl.generation != generation:
                # The backend process is gone: its state with it. Start over from the initial config.
                await self.setup_sandbox(sandbox, state)
                detail += " (the backends were restarted from the initial state)"
            return [f"Error during execution: {detail}"] * len(calls)
        return [str(r) for r in results]

    async def env_response(self, messages: list[Message], state: State) -> list[Message]:
        b = state.scratch["bfcl"]
        e = self.entry(state)
        msg = messages[-1]
        responses = model_responses(msg)
        state.info["bfcl_result"][b["turn"]].append(responses)
        call_ids = [c.get("id") or f"call_{i}" for i, c in enumerate(msg.get("tool_calls") or [])]
        out: list[Message] = []
        try:
            decoded = data.decode_execute(responses)
            ok = bool(decoded) and not (len(decoded) == 1 and not decoded[0])
        except Exception as exc:
            decoded, ok = [], False
            # BFCL ends the turn here; the calls still get answers so the chat stays valid.
            out = [{"role": "tool", "tool_call_id": cid, "content": f"Error: could not decode the call: {exc}"} for cid in call_ids]
        if ok:
            t0 = time.perf_counter()
            results = await self.execute(decoded, state)
            state.metrics["backend_s"] = state.metrics.get("backend_s", 0.0) + time.perf_counter() - t0
            out = [{"role": "tool", "tool_call_id": cid, "content": r} for r, cid in zip(results, call_ids, strict=False)]
            b["step"] += 1
            if b["step"] > self.step_limit:
                b["done"] = True  # BFCL's force-quit: the remaining turns are never asked
                state.info["bfcl_force_quit"] = True
            return out
        return out + self._next_turn(state, e)

    def _next_turn(self, state: State, e: data.Entry) -> list[Message]:
        b = state.scratch["bfcl"]
        b["turn"] += 1
        b["step"] = 0
        if b["turn"] >= len(e.turns):
            b["done"] = True
            return []
        state.info["bfcl_result"].append([])
        turn_msgs = [dict(m) for m in e.turns[b["turn"]]]
        held_out = e.missed_function.get(str(b["turn"]))
        if held_out:
            b["functions"] = b["functions"] + list(held_out)
            b["tools_key"] = f"{e.id}@{b['turn']}"
            turn_msgs = [{"role": "user", "content": data.additional_function_prompt()}]
        return turn_msgs

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        b = state.scratch["bfcl"]
        e = self.entry(state)
        truth = e.ground_truth[b["turn"]] if b["turn"] < len(e.ground_truth) else []
        if b["step"] == 0 and truth:
            functions = all_functions(e)
            calls = [parse_call(c, functions) for c in truth]
            tag = f"call_{state.id[:8]}_{b['turn']}"
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call(n, a, f"{tag}_{i}") for i, (n, a) in enumerate(calls)],
            }
        return {"role": "assistant", "content": "Done." if truth else "I cannot do that with the functions I have."}

    async def bfcl_valid(self, state: State) -> float:
        e = self.entry(state)
        out = await check_multi_turn(self.require_sandboxes(), self.sandbox_spec, e, state.info.get("bfcl_result"), self.bfcl_model)
        return _record_outcome(state, out)


# ---- loading ---------------------------------------------------------------------------


def load_environment(
    kind: str = "single_turn",
    categories: str | list[str] | None = None,
    per_category: int | None = None,
    ids: list[str] | str | None = None,
    model: str = data.BFCL_MODEL,
    sandbox_spec: SandboxSpec | None = None,
    **kwargs: Any,
) -> MultiTurnEnv:
    if kind not in ("single_turn", "multi_turn"):
        raise ValueError(f"kind must be single_turn or multi_turn, got {kind!r}")
    allowed = data.SINGLE_TURN_CATEGORIES if kind == "single_turn" else data.MULTI_TURN_CATEGORIES
    cats = data.categories(categories, allowed)
    id_list = [i.strip() for i in ids.split(",")] if isinstance(ids, str) else ids
    rows, entries = build_rows(cats, per_category, id_list)
    if not rows:
        raise ValueError(f"no BFCL entries selected (categories {cats}, per_category {per_category}, ids {id_list})")

    def tool_calls(state: State) -> float:
        return float(sum(len(t.completion.get("tool_calls") or []) for t in state.turns))

    rubric = Rubric()  # reward: BFCL's verdict (the env's bfcl_valid), added below
    if kind == "single_turn":
        # The scorer imports BFCL's runner (vendor SDKs: seconds): give it room.
        spec = sandbox_spec or SandboxSpec(image=data.BFCL_IMAGE, cpu=1.0, memory_mb=1024, disk_mb=64, exec_timeout_s=300)
        env: BFCLSingleTurnEnv | BFCLMultiTurnEnv = BFCLSingleTurnEnv(
            eval_dataset=rows, rubric=rubric, sandbox_spec=spec, entries=entries, bfcl_model=model,
            name="bfcl_v4_single_turn", **kwargs,
        )  # fmt: skip
    else:
        spec = sandbox_spec or SandboxSpec(image=data.BFCL_IMAGE, cpu=1.0, memory_mb=768, disk_mb=64, exec_timeout_s=300)
        env = BFCLMultiTurnEnv(
            eval_dataset=rows, rubric=rubric, sandbox_spec=spec, entries=entries, bfcl_model=model,
            name="bfcl_v4_multi_turn", **kwargs,
        )  # fmt: skip
    rubric.add_reward_func(env.bfcl_valid, 1.0)
    rubric.add_metric(tool_calls)
    return env
