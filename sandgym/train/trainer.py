"""The GRPO loop: take finished rollout groups from the pipeline, mask infrastructure
failures, compute group advantages, drop what teaches nothing (stale groups; zero-variance
groups with dynamic sampling) and refill, pack, take an optimizer step, push weights, log,
checkpoint.

Generation (pipeline.py) runs in an event loop of its own and, with `optim.async_level` k > 0,
up to k steps ahead of training; every response carries the policy version that produced it,
and a group older than `optim.max_off_policy_steps` versions when it would be trained on is
dropped and counted. Infrastructure failures (State.failed: a sandbox died, the model server
failed, the environment's code raised, a time limit, a reward function crashed) are not
rewards: a failed rollout is left out of the loss (no sequence, so no gradient), its group's
advantages are computed over the group's valid members only, and the step's metrics report
the infra-failure rate. A group with fewer than 2 valid members has no signal: with dynamic
sampling it is dropped and another group is generated, otherwise its valid members get
advantage 0. (Down-weighting by the valid count rather than refilling: every valid rollout
keeps its own weight in the loss; normalisers count only the sequences trained on.)

With several processes (distributed.py) rank 0 runs the backend and the pipeline and
broadcasts each step's sequences; all ranks train (FSDP2) and take part in the weight gather.

Output folder: config.json (the resolved config), metrics.jsonl (one line per step),
samples.jsonl (`output.samples_per_step` rollout records of each step, with "step"),
reward_loss.png, checkpoints/step_NNNNNN/ (full model and optimizer state, step, data
position, RNG states; resume picks the newest).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import torch

from sandgym.core.evaluation import record_of
from sandgym.core.failures import ERROR_KINDS
from sandgym.core.state import State
from sandgym.core.stats import group_advantages
from sandgym.train.backends.base import InferenceBackend
from sandgym.train.batch import PrefixMismatchError, Sequence, states_to_sequences
from sandgym.train.checkpoints import STATE_FILE, latest_checkpoint, write_checkpoint
from sandgym.train.config import ConfigError, TrainConfig
from sandgym.train.distributed import SINGLE, Dist, rank_device
from sandgym.train.folder import CONFIG, METRICS, PLOT, SAMPLES
from sandgym.train.pipeline import ReadyGroup, RolloutPipeline
from sandgym.train.policy import PolicyTrainer, autocast_dtype
from sandgym.train.rollout_source import RolloutSource

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def load_model_and_tokenizer(cfg: TrainConfig) -> tuple[PreTrainedModel, Any]:
    mc = cfg.model
    if mc.name_or_path == "tiny":
        from sandgym.models.tiny import byte_tokenizer, tiny_qwen2

        t = mc.tiny
        model = tiny_qwen2(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            num_layers=t.num_layers,
            num_heads=t.num_heads,
            num_kv_heads=t.num_kv_heads,
            intermediate_size=t.intermediate_size,
            seed=cfg.optim.seed,
        )
        return model, byte_tokenizer()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(mc.name_or_path, local_files_only=True, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(mc.name_or_path, local_files_only=True)
    return model, tok


def make_backend(cfg: TrainConfig, model: PreTrainedModel, tokenizer: Any, device: torch.device) -> InferenceBackend:
    """The inference backend, not started. Made while `model` is whole (before FSDP2 shards
    it): the transformers backend serves it or a copy of it, vLLM loads it from disk."""
    kind = cfg.backend.kind
    if kind == "auto":
        import importlib.util

        kind = "vllm" if device.type == "cuda" and importlib.util.find_spec("vllm") is not None else "hf"
    if kind == "vllm":
        from sandgym.train.backends.vllm import VLLMBackend

        return VLLMBackend.from_config(cfg, model, tokenizer)
    from sandgym.train.backends.hf import HFBackend

    return HFBackend(
        model,
        tokenizer,
        share_weights=cfg.hf_share_weights(),
        max_batch_size=cfg.backend.max_batch_size,
        autocast_dtype=autocast_dtype(cfg.model, device),
    )


def make_rollout_source(cfg: TrainConfig) -> RolloutSource:
    """The `[env]` section's source: kind = "toy" (ToyTask) or "sandgym" (an environment)."""
    if cfg.env.kind == "toy":
        from sandgym.train.toy import ToyTask

        return ToyTask(cfg.env.toy, seed=cfg.optim.seed)
    if cfg.env.ray_address:
        from sandgym.train.ray_source import RayRolloutSource

        return RayRolloutSource(cfg.env.name, cfg.env.args, cfg.env.ray_address)
    from sandgym.train.env_source import EnvRolloutSource

    return EnvRolloutSource(
        cfg.env.name,
        cfg.env.args,
        provider=cfg.env.provider,
        max_sandboxes=cfg.env.max_sandboxes,
        token_in=cfg.env.token_in,
        warm_sandboxes=cfg.env.warm_sandboxes,
    )


def valid(state: State) -> bool:
    """A rollout whose reward judges the policy (infrastructure did not fail it)."""
    return not state.failed


def pick_samples(states: list[State], k: int) -> list[State]:
    """`k` of a step's rollouts for samples.jsonl: evenly spread over them ordered from best
    to worst reward (so a step's best, worst and middle are there), failed ones last."""
    if k <= 0 or not states:
        return []
    ranked = sorted(states, key=lambda s: (s.failed, -s.reward))
    if len(ranked) <= k:
        return ranked
    return [ranked[round(i * (len(ranked) - 1) / (k - 1))] for i in range(k)] if k > 1 else ranked[:1]


def group_signal(states: list[State]) -> bool:
    """Whether a group can teach anything: at least two valid members whose rewards differ."""
    rewards = [s.reward for s in states if valid(s)]
    return len(rewards) >= 2 and max(rewards) - min(rewards) > 0.0


class Trainer:
    def __init__(self, cfg: TrainConfig, on_step: Callable[[dict[str, float]], None] | None = None, dist: Dist = SINGLE) -> None:
        self.cfg = cfg
        self.on_step = on_step
        self.dist = dist
        self.out = Path(cfg.output.dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out / METRICS
        self.samples_path = self.out / SAMPLES
        self.plot_path = self.out / PLOT
        self._samples: list[State] = []
        if dist.is_main:
            (self.out / CONFIG).write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
        torch.manual_seed(cfg.optim.seed)
        random.seed(cfg.optim.seed)
        self.device = rank_device(cfg.model.device, dist)
        model, self.tokenizer = load_model_and_tokenizer(cfg)
        if cfg.model.init_from:
            from sandgym.train.checkpoints import load_weights

            load_weights(model, cfg.model.init_from, cfg.model.model_dump(mode="json"))
        self.model = model.to(self.device)  # type: ignore[arg-type]  # transformers wraps PreTrainedModel.to with functools.wraps, which hides the bound self from mypy
        ref = None
        if cfg.loss.kl_beta > 0:
            ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        # Rank 0 makes the backend (started by run()) while the model is still whole.
        self.backend: InferenceBackend | None = make_backend(cfg, self.model, self.tokenizer, self.device) if dist.is_main else None
        self.policy = PolicyTrainer(self.model, cfg.model, cfg.optim, cfg.loss, self.device, ref_model=ref, dist=dist)
        self.source: RolloutSource | None = make_rollout_source(cfg) if dist.is_main else None
        self.pipeline: RolloutPipeline | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self.step = 0  # completed optimizer steps = the policy version being served
        self.data_position = 0  # the first dataset row not yet trained on
        self._wandb: Any = None

    # ---- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self) -> Path | None:
        """Every rank takes part (the state is gathered); rank 0 writes. Returns the folder
        on rank 0."""
        model_sd = self.policy.full_state_dict()
        optim_sd = self.policy.optimizer_state_dict()
        if not self.dist.is_main:
            return None
        state = {
            "model": model_sd,
            "optimizer": optim_sd,  # keyed by parameter name: any number of processes resumes it
            "scheduler": self.policy.scheduler.state_dict(),
            "step": self.step,
            "data_position": self.data_position,
            "rng_torch": torch.get_rng_state(),
            "rng_python": random.getstate(),
            "config": self.cfg.model_dump(mode="json"),
        }
        return write_checkpoint(self.out, self.step, state, self.cfg.output.keep_checkpoints)

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.out)

    def load_checkpoint(self, path: Path) -> None:
        """Every rank loads the whole checkpoint (a shared or copied folder) and keeps its
        shard; checkpoints are full state dicts, so any number of processes can resume."""
        st = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
        self.policy.load_state(st["model"], st["optimizer"])
        self.policy.scheduler.load_state_dict(st["scheduler"])
        self.step = int(st["step"])
        self.data_position = int(st["data_position"])
        torch.set_rng_state(st["rng_torch"].cpu())
        random.setstate(st["rng_python"])
        # Metrics and samples of steps after the checkpoint were lost with the crash: drop them.
        for path in (self.metrics_path, self.samples_path) if self.dist.is_main else ():
            if path.exists():
                keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= self.step]
                path.write_text("".join(ln + "\n" for ln in keep))
        log.info("resumed from %s (step %d, data position %d)", path, self.step, self.data_position)

    # ---- generation ----------------------------------------------------------------------

    def _sampling(self) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"max_tokens": r.max_tokens, "temperature": r.temperature, "top_p": r.top_p}

    def generate(self, data_position: int) -> tuple[list[list[State]], float]:
        """One batch of `prompts_per_step` groups from `data_position`, outside the pipeline
        (the backend must be started): for tests and tools that look at rollouts."""
        r = self.cfg.rollout
        backend, source = self.backend, self.source
        if backend is None or source is None:
            raise RuntimeError("the inference backend is not started")
        t0 = time.perf_counter()

        async def go() -> list[list[State]]:
            return await source.generate_groups(
                backend.base_url, backend.model_name, data_position, r.prompts_per_step, r.group_size, self._sampling(), r.max_concurrent
            )

        groups = anyio.run(go)
        return groups, time.perf_counter() - t0

    def assign_advantages(self, groups: list[list[State]]) -> None:
        """Group-normalised advantages over each group's valid members; failed members get 0
        (they are not trained on). The environment's own advantages are kept when asked for
        and no member failed."""
        loss = self.cfg.loss
        for g in groups:
            ok = [s for s in g if valid(s)]
            if self.cfg.env.use_env_advantages and len(ok) == len(g) and all(s.advantage is not None for s in g):
                continue
            adv = group_advantages([s.reward for s in ok], normalize_std=loss.scale_advantages_by_std, eps=loss.advantage_eps)
            for s, a in zip(ok, adv, strict=True):
                s.advantage = float(a)
            for s in g:
                if not valid(s):
                    s.advantage = 0.0

    def sequences(self, states: list[State]) -> tuple[list[Sequence], int]:
        """Trainable sequences of the valid rollouts; with on_prefix_mismatch = "skip",
        rollouts whose turns do not extend each other are dropped (counted) instead of
        stopping the run; with "split" they become one sequence per run of extending turns."""
        states = [s for s in states if valid(s)]
        if self.cfg.env.on_prefix_mismatch in ("error", "split"):
            return states_to_sequences(states, split_on_mismatch=self.cfg.env.on_prefix_mismatch == "split"), 0
        out: list[Sequence] = []
        skipped = 0
        for st in states:
            try:
                out.extend(states_to_sequences([st]))
            except PrefixMismatchError as exc:
                skipped += 1
                log.warning("skipping rollout: %s", exc)
        return out, skipped

    def _portal_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._portal is not None
        return self._portal.call(fn, *args)

    def collect(self) -> tuple[list[ReadyGroup], dict[str, float]]:
        """The groups of this step: `prompts_per_step` groups taken as they finish, without
        stale ones (and, with dynamic sampling, without ones that teach nothing), refilled
        up to `max_groups_factor` x prompts_per_step groups examined. Rank 0."""
        cfg, pipe = self.cfg, self.pipeline
        assert pipe is not None
        want = cfg.rollout.prompts_per_step
        bound = math.ceil(cfg.rollout.max_groups_factor * want)
        kept: list[ReadyGroup] = []
        fresh: list[ReadyGroup] = []  # examined and not stale
        examined = stale = no_signal = refills = 0
        stale_rollouts = 0
        failures: Counter[str] = Counter()
        rollouts = 0
        staleness: list[int] = []
        t0 = time.perf_counter()
        while len(kept) < want and examined < bound:
            in_flight = self._portal_call(pipe.in_flight)
            need = want - len(kept)
            room = bound - examined - in_flight
            if in_flight < need and room > 0:
                n = min(need - in_flight, room)
                self._portal_call(pipe.launch_extra, n)
                refills += n
                in_flight += n
            if in_flight == 0:
                break
            g = self._portal_call(pipe.next_group)
            if g.error is not None:
                raise g.error
            examined += 1
            rollouts += len(g.states)
            for s in g.states:
                if s.failed:
                    failures[s.error_kind or "environment"] += 1
            age = self.step - g.version()
            if age > cfg.optim.max_off_policy_steps:
                stale += 1
                stale_rollouts += len(g.states)
                continue
            fresh.append(g)
            self.assign_advantages([g.states])
            if not group_signal(g.states):
                no_signal += 1
                if cfg.rollout.dynamic_sampling:
                    continue
            kept.append(g)
            staleness.append(age)
        if len(kept) < want:
            log.warning(
                "step %d: %d of %d groups after examining %d (stale %d, no signal %d); training on those",
                self.step + 1, len(kept), want, examined, stale, no_signal,
            )
        kept.sort(key=lambda g: g.row)
        rewards = [s.reward for g in fresh for s in g.states if valid(s)]
        failed = sum(failures.values())
        m: dict[str, float] = {
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "rollouts": float(rollouts),
            "rollout_errors": float(failed),
            "infra_failure_rate": failed / rollouts if rollouts else 0.0,
            **{f"failed_{k}": float(failures.get(k, 0)) for k in ERROR_KINDS},
            "groups_examined": float(examined),
            "groups_kept": float(len(kept)),
            "no_signal_groups": float(no_signal),
            "stale_groups_dropped": float(stale),
            "stale_rollouts_dropped": float(stale_rollouts),
            "refill_groups": float(refills),
            "staleness": statistics.fmean(staleness) if staleness else 0.0,
            "staleness_max": float(max(staleness)) if staleness else 0.0,
            "completion_tokens_mean": statistics.fmean(
                [sum(len(t.tokens.completion_ids) for t in s.turns if t.tokens) for g in kept for s in g.states]
            )
            if kept
            else 0.0,
            "generate_s": time.perf_counter() - t0,  # time the trainer waited for rollouts
        }
        return kept, m

    @contextlib.contextmanager
    def generation(self) -> Any:
        """Rank 0: the backend, the rollout source's sandbox session and the pipeline, for the run."""
        cfg, backend, source = self.cfg, self.backend, self.source
        assert backend is not None and source is not None
        with contextlib.ExitStack() as stack:
            backend.start()
            stack.callback(backend.close)
            if cfg.optim.async_level > 0 and not backend.can_update_in_flight:
                raise ConfigError(
                    f"optim.async_level = {cfg.optim.async_level} needs a backend that takes new weights while it "
                    f"generates; the {backend.name} backend as configured does not (backend.share_weights / "
                    "backend.sleep_during_training)"
                )
            log.info("inference backend %s at %s; attention kernel %s", backend.name, backend.base_url, self.policy.kernel)
            portal = self._portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
            stack.enter_context(portal.wrap_async_context_manager(source.sandbox_session()))
            r = cfg.rollout
            pipe = self.pipeline = RolloutPipeline(
                source,
                backend.base_url,
                backend.model_name,
                self._sampling(),
                r.group_size,
                r.prompts_per_step,
                r.max_concurrent,
                cfg.optim.async_level,
                next_row=self.data_position,
                last_batch=cfg.optim.steps - 1,
            )
            portal.start_task(pipe.run)
            stack.callback(portal.call, pipe.stop)
            portal.call(pipe.set_version, self.step)
            try:
                yield
            finally:
                self.pipeline = None
                self._portal = None

    # ---- loop ----------------------------------------------------------------------------

    def run(self) -> list[dict[str, float]]:
        cfg = self.cfg
        main = self.dist.is_main
        if cfg.output.resume and (ck := self.latest_checkpoint()) is not None:
            self.load_checkpoint(ck)
        if main and cfg.output.wandb_project:
            try:
                import wandb

                self._wandb = wandb.init(project=cfg.output.wandb_project, config=cfg.model_dump(mode="json"))
            except ImportError:
                log.warning("wandb_project is set but wandb is not installed; logging to JSONL only")
        history: list[dict[str, float]] = []
        try:
            with self.generation() if main else contextlib.nullcontext():
                if self.step > 0:  # a resumed run: serve the checkpoint's weights
                    self.push_weights()
                while self.step < cfg.optim.steps:
                    m = self.train_step()
                    if main:
                        self._log(m)
                        history.append(m)
                    every = cfg.output.checkpoint_every
                    if (every and self.step % every == 0) or self.step == cfg.optim.steps:
                        self.save_checkpoint()
        finally:
            if self._wandb is not None:
                self._wandb.finish()
        if main and cfg.output.plot and self.metrics_path.exists():
            from sandgym.train.plot import plot_metrics

            plot_metrics(self.metrics_path, self.plot_path)
        return history

    def push_weights(self) -> None:
        """Serve the current weights as version `self.step` (with several ranks every rank
        gathers; rank 0 pushes) and let the pipeline launch what may now start."""
        weights: Any = self.policy.full_state_dict() if self.dist.enabled else self.model
        if self.dist.is_main:
            assert self.backend is not None
            self.backend.update_weights(weights, version=self.step)
            if self.pipeline is not None:
                self._portal_call(self.pipeline.set_version, self.step)

    def train_step(self) -> dict[str, float]:
        t_step = time.perf_counter()
        m: dict[str, float] = {"step": float(self.step + 1)}
        seqs: list[Sequence] | None = None
        if self.dist.is_main:
            try:
                groups, gm = self.collect()
                m.update(gm)
                self._samples = pick_samples([s for g in groups for s in g.states], self.cfg.output.samples_per_step)
                seqs, skipped = self.sequences([s for g in groups for s in g.states])
                m["prefix_mismatch_skipped"] = float(skipped)
            except BaseException:
                self.dist.broadcast_object(None)  # the other ranks stop too
                raise
        seqs = self.dist.broadcast_object(seqs)
        if seqs is None:
            raise RuntimeError("rank 0 stopped; see its error")
        if self.dist.is_main and self.backend is not None:
            self.backend.sleep()  # vLLM (synchronous) frees its GPU memory for training; else no-op
        if seqs:
            m.update(self.policy.step(seqs))
        else:
            m.update({"loss": 0.0, "train_s": 0.0, "train_tokens_per_s": 0.0})
            if self.dist.is_main:
                log.warning("step %d: no trainable rollouts (all failed, stale or empty)", self.step + 1)
        self.step += 1
        t_push = time.perf_counter()
        self.push_weights()
        m["push_s"] = time.perf_counter() - t_push
        if self.pipeline is not None:
            self.data_position = self._portal_call(self.pipeline.data_position)
        m["step_s"] = time.perf_counter() - t_step
        m["data_position"] = float(self.data_position)
        return m

    def _log(self, m: dict[str, float]) -> None:
        if self._samples:
            # Samples first: a step's metrics line says its samples are there.
            with self.samples_path.open("a") as f:
                f.writelines(json.dumps({**record_of(s), "step": int(m["step"])}, default=str) + "\n" for s in self._samples)
            self._samples = []
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(m) + "\n")
        if self._wandb is not None:
            self._wandb.log(m, step=int(m["step"]))
        if self.on_step is not None:
            self.on_step(m)
