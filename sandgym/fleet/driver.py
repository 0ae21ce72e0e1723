"""The driver of rollouts on a Ray fleet: `sandgym eval ENV --ray ADDRESS`, and the trainer's
rollout source with a Ray address (train/ray_source.py).

The driver keeps the run's state in the same run folder as on one machine (sandgym.run_folder,
through core.evaluation's eval_folder, EvalPlan and eval_summary: one meta, one same-run
rule, one resume, one summary) and sends each rollout (or each group, when the rubric
scores groups) to a node agent, where it runs next to its sandbox (rollouts.py, through
`NodeAgent.run`); the finished record comes back and is appended at once, so `--resume`
works, and refuses another run's folder, exactly as on one machine.

Fan-in: `concurrency` rollouts are in flight in all, at most `per_node` on one node
(default: `concurrency` spread evenly over the nodes up at the start); the agents' Ray
`max_concurrency` is explicit and checked against it, so nothing is queued silently.

Node failure: a rollout whose node is lost (or whose sandbox failed) comes back as
`SandboxLostError` / error_kind "sandbox"; one that ran past a time limit (a scoring step
on a loaded node, say) as error_kind "timeout". It is retried on another node, at most
`node_retries` times; the record that is kept (the successful retry, or the last failure
once the bound is spent) lists the failed attempts in `info["fleet"]["attempts"]`, and the
summary counts them (`fleet.retried_rollouts`, `fleet.retries`). A failure that is kept
stays an infrastructure failure: out of reward_mean and pass@k, never a reward of 0.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from sandgym.core.environment import Environment
from sandgym.core.evaluation import EvalPlan, eval_folder, eval_meta, eval_summary, record_of
from sandgym.core.failures import error_text
from sandgym.core.state import State
from sandgym.sandboxes.errors import SandboxLostError
from sandgym.sandboxes.providers.ray.fleet import AGENT_MAX_CONCURRENCY, Fleet, FleetNode

from . import rollouts
from .jobs import ClientSpec, EnvSpec

log = logging.getLogger(__name__)

# Failures that are the machine's, worth another node: its sandbox died, or a time limit
# passed (a scoring step on a loaded node, say: core.failures.ScoringTimeout).
RETRY_KINDS = frozenset({"sandbox", "timeout"})
# Calls an agent must serve besides rollouts (heartbeats, prepare, a fleet's sandboxes).
AGENT_RESERVE = 64


class RolloutDispatcher:
    """Sends rollouts to the fleet's nodes, at most `per_node` at once on each and `total`
    in all, retrying node losses elsewhere (at most `node_retries` times per rollout)."""

    def __init__(
        self,
        fleet: Fleet,
        env: Environment,
        env_spec: EnvSpec,
        client_spec: ClientSpec,
        *,
        total: int,
        per_node: int | None = None,
        node_retries: int = 2,
        warm: bool = True,
        sampling_args: Mapping[str, Any] | None = None,
    ) -> None:
        if total < 1:
            raise ValueError(f"concurrency must be >= 1, got {total}")
        if node_retries < 0:
            raise ValueError(f"node_retries must be >= 0, got {node_retries}")
        self.fleet = fleet
        self.env = env
        self.env_spec = env_spec
        self.client_spec = client_spec
        self.total = total
        self.per_node = per_node or fleet.per_node_share(total)
        if self.per_node + AGENT_RESERVE > AGENT_MAX_CONCURRENCY:
            raise ValueError(
                f"{self.per_node} rollouts in flight per node is more than a node agent serves at once "
                f"({AGENT_MAX_CONCURRENCY - AGENT_RESERVE}); add nodes or lower the concurrency"
            )
        self.node_retries = node_retries
        self.warm = warm
        self.sampling_args = dict(sampling_args or {})
        self.used: Counter[str] = Counter()
        self.retries_waiting = 0  # retries go first: a lost node's rollouts finish soonest
        self.prepared: set[str] = set()
        fleet.on_join.append(self._prepare)

    async def start(self) -> None:
        async with anyio.create_task_group() as tg:
            for node in self.fleet.ready_nodes():
                tg.start_soon(self._prepare, node)

    async def _prepare(self, node: FleetNode) -> None:
        """Load the environment on the node and warm its pool (a node joining later too)."""
        warm = min(node.limit, self.per_node) if self.warm else 0
        try:
            await self.fleet.call(node, "run", self.fleet.session, rollouts.prepare, self.env_spec, warm)
            self.prepared.add(node.name)
        except SandboxLostError:
            pass
        self.fleet.notify()

    def _pick(self, avoid: set[str]) -> FleetNode | None:
        ready = self.fleet.ready_nodes()
        if sum(self.used[n.name] for n in ready) >= self.total:
            return None
        free = [n for n in ready if self.used[n.name] < self.per_node]
        preferred = [n for n in free if n.name not in avoid] or free
        return min(preferred, key=lambda n: (self.used[n.name], n.name)) if preferred else None

    async def _slot(self, avoid: set[str]) -> FleetNode:
        """A slot on a node (one not in `avoid` if there is room on one); a retry (non-empty
        `avoid`) is served before any first attempt."""
        retry = bool(avoid)
        self.retries_waiting += retry
        since: float | None = None
        try:
            while True:
                node = self._pick(avoid) if retry or not self.retries_waiting else None
                if node is not None:
                    self.used[node.name] += 1
                    return node
                if not any(n.state in ("ready", "starting") for n in self.fleet.nodes.values()):
                    since = since or time.monotonic()
                    if time.monotonic() - since > self.fleet.node_wait_s:
                        raise SandboxLostError(f"no sandgym node up for {self.fleet.node_wait_s:.0f}s")
                else:
                    since = None
                await self.fleet.wait_change(1.0)
        finally:
            if retry:
                self.retries_waiting -= 1
                self.fleet.notify()

    def _free(self, node: FleetNode) -> None:
        self.used[node.name] -= 1
        self.fleet.notify()

    async def run(self, row: Mapping[str, Any], indices: Sequence[int], *, grouped: bool) -> list[dict[str, Any]]:
        """Records for `indices` of `row` (one each), run on some node; never raises for a
        lost node: past the retry bound the records are failures of kind "sandbox"."""
        attempts: list[dict[str, Any]] = []
        while True:
            try:
                node = await self._slot({a["node"] for a in attempts})
            except SandboxLostError as exc:
                return self._failed(row, indices, attempts, exc)
            which: int
            try:
                job = (self.env_spec, self.client_spec, dict(row))
                if grouped:
                    recs = await self.fleet.call(node, "run", self.fleet.session, rollouts.rollout_group, *job,
                                                 list(indices), self.sampling_args)
                else:
                    (which,) = indices
                    recs = await self.fleet.call(node, "run", self.fleet.session, rollouts.rollout, *job, which,
                                                 self.sampling_args)
            except SandboxLostError as exc:
                attempts.append({"node": node.name, "error": error_text(exc), "error_kind": "sandbox", "at": time.time()})
                log.warning("rollout %s%s lost with node %s; attempt %d", row.get("example_id"), list(indices), node.name, len(attempts))
                if len(attempts) > self.node_retries:
                    return self._failed(row, indices, attempts, exc)
                continue
            finally:
                self._free(node)
            bad = next((r for r in recs if r.get("error_kind") in RETRY_KINDS), None)
            if bad is not None and len(attempts) < self.node_retries:
                attempts.append({"node": node.name, "error": bad.get("error"), "error_kind": bad.get("error_kind"), "at": time.time()})
                continue
            return [self._annotate(r, node.name, attempts, len(attempts)) for r in recs]

    @staticmethod
    def _annotate(rec: dict[str, Any], node: str, attempts: list[dict[str, Any]], retries: int) -> dict[str, Any]:
        """`info["fleet"]`: where the kept record ran, how often the rollout was run again,
        and each failed attempt (node, error, when)."""
        info = dict(rec.get("info") or {})
        info["fleet"] = {"node": node, "retries": retries, "attempts": list(attempts), "finished_at": time.time()}
        rec["info"] = info
        return rec

    def _failed(self, row: Mapping[str, Any], indices: Sequence[int], attempts: list[dict[str, Any]], exc: BaseException) -> list[dict[str, Any]]:
        """The retry bound is spent (or no node is left): a typed infrastructure failure."""
        out = []
        for i in indices:
            state: State = self.env.init_state(row, i)
            state.fail(f"{error_text(exc)} (after {len(attempts)} attempt(s) on the fleet)", "sandbox")
            state.stop_reason = "error"
            node = attempts[-1]["node"] if attempts else ""
            out.append(self._annotate(record_of(state), node, attempts, max(0, len(attempts) - 1)))
        return out


def fleet_summary(records: Sequence[Mapping[str, Any]], fleet: Fleet, dispatcher: RolloutDispatcher) -> dict[str, Any]:
    infos = [(r.get("info") or {}).get("fleet") or {} for r in records]
    return {
        "address": fleet.address,
        "nodes": [n.name for n in fleet.ready_nodes()],
        "concurrency": dispatcher.total,
        "per_node_concurrency": dispatcher.per_node,
        "agent_max_concurrency": AGENT_MAX_CONCURRENCY,
        "rollouts_by_node": dict(sorted(Counter(i.get("node", "") for i in infos).items())),
        "retried_rollouts": sum(1 for i in infos if i.get("retries")),
        "retries": sum(int(i.get("retries") or 0) for i in infos),
        "events": list(fleet.events),
        "pruned": {e["node"]: e["pruned"] for e in fleet.events if e["event"] == "joined" and e.get("pruned")},
    }


def default_concurrency(fleet: Fleet) -> int:
    """Two rollouts in flight per sandbox slot of each node: one scoring, one being prepared."""
    return max(1, sum(2 * n.limit for n in fleet.ready_nodes()))


async def run_fleet_eval(
    env: Environment,
    env_spec: EnvSpec,
    client_spec: ClientSpec,
    *,
    address: str | None,
    output_dir: str | os.PathLike[str],
    num_examples: int | None = None,
    rollouts_per_example: int = 1,
    concurrency: int | None = None,
    per_node: int | None = None,
    node_retries: int = 2,
    sampling_args: Mapping[str, Any] | None = None,
    warm: bool = True,
    min_nodes: int = 1,
    fleet: Fleet | None = None,
    fleet_options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    resume: bool | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`run_eval` across the sandgym nodes of the Ray cluster at `address`: the same run
    folder (checked before the cluster is contacted), plus the summary's `fleet` section."""
    folder = eval_folder(output_dir)
    folder.open(eval_meta(env, client_spec.model, num_examples, rollouts_per_example, sampling_args, meta), resume=resume)
    own_fleet = fleet is None
    try:
        plan = EvalPlan(env.rows(num_examples), rollouts_per_example, folder.done())
        if on_start:
            on_start(len(plan.wanted), plan.resumed)
        fleet = fleet or Fleet(address, **dict(fleet_options or {}))
        t0 = time.perf_counter()
        try:
            await fleet.start(min_nodes=min_nodes)
            total = concurrency or default_concurrency(fleet)
            dispatcher = RolloutDispatcher(
                fleet, env, env_spec, client_spec, total=total, per_node=per_node,
                node_retries=node_retries, warm=warm, sampling_args=sampling_args,
            )
            folder.update_meta({"ray": {"address": address, "concurrency": total, "per_node": dispatcher.per_node,
                                        "node_retries": node_retries}})
            await dispatcher.start()

            def emit(rec: dict[str, Any]) -> None:
                folder.append(rec)
                if on_record:
                    on_record(rec)

            async def job(row: Mapping[str, Any], indices: list[int], grouped: bool) -> None:
                for rec in await dispatcher.run(row, indices, grouped=grouped):
                    emit(rec)

            async with anyio.create_task_group() as tg:
                if env.rubric.group_funcs:
                    for row, indices in plan.groups():
                        tg.start_soon(job, row, indices, True)
                else:
                    for row, i in plan.todo:
                        tg.start_soon(job, row, [i], False)
            wall = time.perf_counter() - t0
            summary = eval_summary(env, client_spec.model, rollouts_per_example, folder, plan, wall)
            summary["fleet"] = fleet_summary(folder.records_of(plan.wanted), fleet, dispatcher)
        finally:
            if own_fleet:
                await fleet.close()
    finally:
        folder.close()
    folder.write_summary(summary)
    return summary


async def generate_groups(
    fleet: Fleet,
    env: Environment,
    env_spec: EnvSpec,
    client_spec: ClientSpec,
    rows: Sequence[Mapping[str, Any]],
    group_size: int,
    *,
    max_concurrent: int,
    sampling_args: Mapping[str, Any] | None = None,
    node_retries: int = 2,
) -> list[list[State]]:
    """The trainer's rollout source on a fleet: `group_size` rollouts of each row, each group
    run and scored (group rewards, advantages) on one node, in row order."""
    dispatcher = RolloutDispatcher(
        fleet, env, env_spec, client_spec, total=max(1, math.ceil(max_concurrent / group_size)),
        node_retries=node_retries, warm=False, sampling_args=sampling_args,
    )
    await dispatcher.start()
    groups: list[list[State]] = [[] for _ in rows]

    async def one(gi: int, row: Mapping[str, Any]) -> None:
        recs = await dispatcher.run(row, list(range(group_size)), grouped=True)
        groups[gi] = [State.model_validate(r) for r in recs]

    async with anyio.create_task_group() as tg:
        for gi, row in enumerate(rows):
            tg.start_soon(one, gi, row)
    return groups
