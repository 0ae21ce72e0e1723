"""The GRPO loop: generate a batch of rollout groups through the inference backend, score,
compute group advantages, pack, take an optimizer step, push weights, log, checkpoint.

Output folder: metrics.jsonl (one line per step), reward_loss.png, checkpoints/step_NNNNNN/
(model, optimizer, scheduler, step, data position, RNG states; resume picks the newest).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import logging
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import anyio
import torch

from sandgym.core.state import State
from sandgym.core.stats import group_advantages
from sandgym.train.backends.base import InferenceBackend
from sandgym.train.batch import PrefixMismatchError, Sequence, states_to_sequences
from sandgym.train.config import TrainConfig
from sandgym.train.policy import PolicyTrainer, autocast_dtype, resolve_device
from sandgym.train.rollout_source import RolloutSource

log = logging.getLogger(__name__)


def load_model_and_tokenizer(cfg: TrainConfig) -> tuple[torch.nn.Module, Any]:
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


def make_backend(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device) -> InferenceBackend:
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
        share_weights=cfg.backend.share_weights and not cfg.optim.overlap,
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

    return EnvRolloutSource(cfg.env.name, cfg.env.args, provider=cfg.env.provider, max_sandboxes=cfg.env.max_sandboxes)


class Trainer:
    def __init__(self, cfg: TrainConfig, on_step: Callable[[dict[str, float]], None] | None = None) -> None:
        self.cfg = cfg
        self.on_step = on_step
        self.out = Path(cfg.output.dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out / "metrics.jsonl"
        self.plot_path = self.out / "reward_loss.png"
        torch.manual_seed(cfg.optim.seed)
        random.seed(cfg.optim.seed)
        self.device = resolve_device(cfg.model.device)
        model, self.tokenizer = load_model_and_tokenizer(cfg)
        self.model = model.to(self.device)
        ref = None
        if cfg.loss.kl_beta > 0:
            ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.policy = PolicyTrainer(self.model, cfg.model, cfg.optim, cfg.loss, self.device, ref_model=ref)
        self.source = make_rollout_source(cfg)
        self.backend: InferenceBackend | None = None  # made and started by run()
        self.step = 0  # completed optimizer steps (generation batches)
        self.data_position = 0  # index of the next dataset row
        self._wandb: Any = None

    # ---- checkpoints ---------------------------------------------------------------------

    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def save_checkpoint(self) -> Path:
        root = self.checkpoint_dir()
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step_{self.step:06d}"
        tmp = root / f".tmp_step_{self.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.policy.optimizer.state_dict(),
                "scheduler": self.policy.scheduler.state_dict(),
                "step": self.step,
                "data_position": self.data_position,
                "rng_torch": torch.get_rng_state(),
                "rng_python": random.getstate(),
                "config": self.cfg.model_dump(mode="json"),
            },
            tmp / "trainer_state.pt",
        )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # a checkpoint exists whole or not at all
        ckpts = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in ckpts[: -self.cfg.output.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def latest_checkpoint(self) -> Path | None:
        ckpts = sorted(p for p in self.checkpoint_dir().glob("step_*") if (p / "trainer_state.pt").exists())
        return ckpts[-1] if ckpts else None

    def load_checkpoint(self, path: Path) -> None:
        st = torch.load(path / "trainer_state.pt", map_location=self.device, weights_only=False)
        self.model.load_state_dict(st["model"])
        self.policy.optimizer.load_state_dict(st["optimizer"])
        self.policy.scheduler.load_state_dict(st["scheduler"])
        self.step = int(st["step"])
        self.data_position = int(st["data_position"])
        torch.set_rng_state(st["rng_torch"].cpu())
        random.setstate(st["rng_python"])
        # Metrics of steps after the checkpoint were lost with the crash: drop them.
        if self.metrics_path.exists():
            keep = [ln for ln in self.metrics_path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= self.step]
            self.metrics_path.write_text("".join(ln + "\n" for ln in keep))
        log.info("resumed from %s (step %d, data position %d)", path, self.step, self.data_position)

    # ---- generation ----------------------------------------------------------------------

    def _sampling(self) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"max_tokens": r.max_tokens, "temperature": r.temperature, "top_p": r.top_p}

    def generate(self, data_position: int) -> tuple[list[list[State]], float]:
        r = self.cfg.rollout
        backend = self.backend
        if backend is None:
            raise RuntimeError("the inference backend is not started")
        t0 = time.perf_counter()

        async def go() -> list[list[State]]:
            return await self.source.generate_groups(
                backend.base_url, backend.model_name, data_position, r.prompts_per_step, r.group_size, self._sampling(), r.max_concurrent
            )

        groups = anyio.run(go)
        return groups, time.perf_counter() - t0

    def assign_advantages(self, groups: list[list[State]]) -> None:
        if self.cfg.env.use_env_advantages and all(s.advantage is not None for g in groups for s in g):
            return
        loss = self.cfg.loss
        for g in groups:
            adv = group_advantages([s.reward for s in g], normalize_std=loss.scale_advantages_by_std, eps=loss.advantage_eps)
            for s, a in zip(g, adv):
                s.advantage = float(a)

    def sequences(self, states: list[State]) -> tuple[list[Sequence], int]:
        """Trainable sequences; with on_prefix_mismatch = "skip", rollouts whose turns do not
        extend each other are dropped (counted) instead of stopping the run."""
        if self.cfg.env.on_prefix_mismatch == "error":
            return states_to_sequences(states), 0
        out: list[Sequence] = []
        skipped = 0
        for st in states:
            try:
                out.extend(states_to_sequences([st]))
            except PrefixMismatchError as exc:
                skipped += 1
                log.warning("skipping rollout: %s", exc)
        return out, skipped

    # ---- loop ----------------------------------------------------------------------------

    def run(self) -> list[dict[str, float]]:
        cfg = self.cfg
        if cfg.output.resume and (ck := self.latest_checkpoint()) is not None:
            self.load_checkpoint(ck)
        if cfg.output.wandb_project:
            try:
                import wandb  # type: ignore[import-not-found]

                self._wandb = wandb.init(project=cfg.output.wandb_project, config=cfg.model_dump(mode="json"))
            except ImportError:
                log.warning("wandb_project is set but wandb is not installed; logging to JSONL only")
        backend = self.backend = make_backend(cfg, self.model, self.tokenizer, self.device)
        backend.start()
        log.info("inference backend %s at %s; attention kernel %s", backend.name, backend.base_url, self.policy.kernel)
        history: list[dict[str, float]] = []
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1) if cfg.optim.overlap else None
        pending: concurrent.futures.Future[tuple[list[list[State]], float]] | None = None
        try:
            while self.step < cfg.optim.steps:
                t_step = time.perf_counter()
                pos = self.data_position
                if pending is not None:
                    groups, gen_s = pending.result()
                    staleness = 1.0
                else:
                    groups, gen_s = self.generate(pos)
                    staleness = 0.0
                self.data_position = pos + cfg.rollout.prompts_per_step
                pending = None
                if pool is not None and self.step + 1 < cfg.optim.steps:
                    # Next batch is generated with the weights before this step's update.
                    pending = pool.submit(self.generate, self.data_position)
                self.assign_advantages(groups)
                states = [s for g in groups for s in g]
                seqs, skipped = self.sequences(states)
                rewards = [s.reward for s in states if s.error is None]
                m: dict[str, float] = {
                    "step": float(self.step + 1),
                    "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
                    "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
                    "rollouts": float(len(states)),
                    "rollout_errors": float(sum(s.error is not None for s in states)),
                    "completion_tokens_mean": statistics.fmean(
                        [sum(len(t.tokens.completion_ids) for t in s.turns if t.tokens) for s in states]
                    )
                    if states
                    else 0.0,
                    "generate_s": gen_s,
                    "prefix_mismatch_skipped": float(skipped),
                    "staleness": staleness,
                }
                if pool is None:
                    backend.sleep()  # vLLM frees its GPU memory for training; hf: no-op
                if seqs:
                    m.update(self.policy.step(seqs))
                else:
                    m.update({"loss": 0.0, "train_s": 0.0, "train_tokens_per_s": 0.0})
                    log.warning("step %d: no trainable rollouts (all errored or empty)", self.step + 1)
                backend.update_weights(self.model)
                self.step += 1
                m["step_s"] = time.perf_counter() - t_step
                m["data_position"] = float(self.data_position)
                self._log(m)
                history.append(m)
                every = cfg.output.checkpoint_every
                if (every and self.step % every == 0) or self.step == cfg.optim.steps:
                    self.save_checkpoint()
        finally:
            if pending is not None:
                pending.cancel()
            if pool is not None:
                pool.shutdown(wait=True)
            backend.close()
            if self._wandb is not None:
                self._wandb.finish()
        if cfg.output.plot and self.metrics_path.exists():
            from sandgym.train.plot import plot_metrics

            plot_metrics(self.metrics_path, self.plot_path)
        return history

    def _log(self, m: dict[str, float]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(m) + "\n")
        if self._wandb is not None:
            self._wandb.log(m, step=int(m["step"]))
        if self.on_step is not None:
            self.on_step(m)
