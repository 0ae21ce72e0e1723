"""Scoring BFCL results inside sandgym/bfcl sandboxes with BFCL's own checkers."""

from __future__ import annotations

import json
from typing import Any

from anyio.abc import TaskGroup

from sandgym.core.failures import ScoringTimeout
from sandgym.core.sandbox_env import checked_exec
from sandgym.core.sandbox_repl import ReplReply, ReplService

from . import sandbox_code
from .data import BFCL_MODEL, BFCL_VERSION, Entry

SCORER_SETUP_TIMEOUT_S = 300.0  # BFCL's runner imports vendor SDKs: slow on a busy host
SCORE_TIMEOUT_S = 60.0
CHECK_TIMEOUT_S = 300.0


class ScoringError(RuntimeError):
    """The checker could not run (not: the result is wrong)."""


def model_responses(message: dict[str, Any]) -> Any:
    """One assistant message as BFCL's OpenAI function-calling handler records it: the tool
    calls as [{name: json-arguments}], or the text when there are none."""
    calls = message.get("tool_calls")
    if calls:
        return [{(c.get("function") or {}).get("name", ""): (c.get("function") or {}).get("arguments", "")} for c in calls]
    return message.get("content")


def _check_version(found: Any) -> None:
    if found != BFCL_VERSION:
        raise ScoringError(f"the sandbox has bfcl-eval {found}, the host {BFCL_VERSION}: rebuild the image (sandgym images build bfcl --force)")


class SingleTurnScorer:
    """The shared single-turn scorer of a session: BFCL's runner imported once in a
    sandgym/bfcl sandbox, then one cell per result (nothing of the result is executed)."""

    def __init__(self, manager: Any, spec: Any, task_group: TaskGroup, model: str = BFCL_MODEL) -> None:
        # The default model's handler is OpenAI's: the other vendors' SDKs are not imported.
        setup = sandbox_code.scorer_setup(sandbox_code.SKIPPED_SDKS if model == BFCL_MODEL else ())
        self.service = ReplService(
            manager, spec, task_group, setup_code=setup, setup_timeout=SCORER_SETUP_TIMEOUT_S,
            check_setup=self._check_setup, name="bfclscore",
        )  # fmt: skip

    @staticmethod
    def _check_setup(reply: ReplReply) -> None:
        info = sandbox_code.parse_marked(reply.stdout) if reply.ok else None
        if info is None:
            raise ScoringError(f"the BFCL scorer did not start ({reply.status}): {reply.stderr[-1500:]}")
        _check_version(info.get("bfcl_version"))

    async def open(self) -> None:
        await self.service.open()

    async def score(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = await self.service.run(sandbox_code.scorer_call(request), timeout=SCORE_TIMEOUT_S)
        if reply.status == "timeout":
            raise ScoringTimeout(f"BFCL's checker did not finish {request.get('id')} in {SCORE_TIMEOUT_S:g}s")
        if not reply.ok:
            raise ScoringError(f"the BFCL scorer failed on {request.get('id')} ({reply.status}): {reply.stderr[-800:]}")
        out = sandbox_code.parse_marked(reply.stdout)
        if out is None:  # the checker raised: a defect, not a wrong answer
            raise ScoringError(f"the BFCL checker failed on {request.get('id')}: {reply.stderr[-1500:]}")
        return out

    async def close(self) -> None:
        await self.service.close()


def single_turn_request(entry: Entry, result: Any, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "category": entry.category,
        "id": entry.id,
        "result": result,
        "entry": entry.eval_entry,
        "possible_answer": entry.ground_truth,
    }


async def check_multi_turn(manager: Any, spec: Any, entry: Entry, result: Any, model: str) -> dict[str, Any]:
    """BFCL's multi-turn checker on one result, in a fresh process in a clean sandbox (the
    checker runs the model's calls again; nothing of the rollout's sandbox takes part)."""
    request = {
        "model": model,
        "category": entry.category,
        "result": result,
        "ground_truth": entry.ground_truth,
        "entry": {k: entry.eval_entry[k] for k in ("id", "initial_config", "involved_classes")},
    }
    async with manager.sandbox(spec, reuse=True) as sb:
        r = await checked_exec(
            sb,
            ["python3", "-I", "-c", sandbox_code.multi_turn_check_program()],
            timeout=CHECK_TIMEOUT_S,
            stdin=json.dumps(request),
        )
    if r.timed_out:
        raise ScoringTimeout(f"BFCL's multi-turn checker did not finish {entry.id} in {CHECK_TIMEOUT_S:g}s")
    out = sandbox_code.parse_marked(r.stdout) if r.exit_code == 0 else None
    if out is None:
        raise ScoringError(f"BFCL multi-turn checker failed on {entry.id} (exit {r.exit_code}): {r.stderr[-1500:]}")
    _check_version(out.pop("bfcl_version", None))
    return out
