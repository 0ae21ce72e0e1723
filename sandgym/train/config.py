"""Training configuration: one pydantic model, loadable from TOML (`sandgym train CONFIG.toml`).

Relative paths in the file (output dir, model path) are resolved against the file's folder.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandgym.train.loss import LossConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinyModelConfig(_Strict):
    vocab_size: int = 264
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128


class ModelConfig(_Strict):
    # "tiny": a random Qwen2-shaped model with the built-in byte tokenizer (offline); else a
    # Hugging Face model folder (no downloads are attempted: local_files_only).
    name_or_path: str = "tiny"
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    # "auto": float32 on CPU; float32 master weights with bf16 autocast on CUDA.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: str = "auto"
    attention: Literal["auto", "flash_attn", "torch_varlen", "sdpa"] = "auto"
    gradient_checkpointing: bool = False
    logprob_chunk_size: int = Field(1024, gt=0)


class BackendConfig(_Strict):
    kind: Literal["auto", "hf", "vllm"] = "auto"  # auto: vllm when importable and on CUDA
    max_batch_size: int = Field(64, gt=0)
    # hf: serve the trainer's own weights (no copy); forced off when overlap is on.
    share_weights: bool = True
    # vllm
    gpu_memory_utilization: float = 0.3
    sleep_during_training: bool = True
    max_model_len: int = 4096

    @model_validator(mode="before")
    @classmethod
    def _no_external_server(cls, data: Any) -> Any:
        # Refused while the config is read, before any model is built.
        if isinstance(data, dict) and "base_url" in data:
            raise ValueError(
                "backend.base_url: an external inference server is not supported yet; remove it "
                "(the trainer starts its own colocated backend: kind = 'hf' or 'vllm')"
            )
        return data


class ToyTaskConfig(_Strict):
    """A learnable token-level task: reward = fraction of generated tokens inside
    [target_low, target_high] (byte ids; default lowercase ASCII letters, ~10% at random)."""

    prompt_len: int = 8
    turns: int = 2
    target_low: int = 97
    target_high: int = 122
    env_tokens: list[int] = Field(default_factory=lambda: [10, 62, 32])  # "\n> " between turns


class EnvConfig(_Strict):
    kind: Literal["toy", "sandgym"] = "toy"
    toy: ToyTaskConfig = Field(default_factory=ToyTaskConfig)
    # kind = "sandgym": an environment loaded by name (sandgym.envs registry, or a module with load_environment(**args))
    name: str = ""
    args: dict[str, Any] = Field(default_factory=dict)
    use_env_advantages: bool = False  # else recompute from rewards with [loss] options
    provider: str = "docker"  # sandbox provider for sandgym environments (docker, local, prime)
    max_sandboxes: int = Field(8, gt=0)
    # Run the rollouts on the sandgym nodes of this Ray cluster (sandgym.train.ray_source);
    # the inference backend must then be reachable from the nodes.
    ray_address: str | None = None
    # A rollout whose turn i prompt does not extend turn i-1's tokens (chat template
    # re-rendering): stop the run ("error") or drop that rollout and count it ("skip").
    on_prefix_mismatch: Literal["error", "skip"] = "error"


class RolloutConfig(_Strict):
    prompts_per_step: int = Field(4, gt=0)
    group_size: int = Field(8, gt=1)
    max_tokens: int = Field(64, gt=0)
    temperature: float = 1.0
    top_p: float = 1.0
    max_concurrent: int = Field(64, gt=0)


class OptimConfig(_Strict):
    steps: int = Field(20, gt=0)
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch_tokens: int = Field(4096, gt=0)  # packing budget; micro-batches accumulate
    num_iterations: int = Field(1, gt=0)  # optimizer passes over each batch (GRPO's mu)
    seed: int = 0
    # Overlap generation of step n+1 with training of step n (staleness <= 1).
    overlap: bool = False


class OutputConfig(_Strict):
    dir: str = "runs/train"
    checkpoint_every: int = 0  # steps; 0 = only at the end
    keep_checkpoints: int = 2
    resume: bool = True
    plot: bool = True
    wandb_project: str | None = None


class TrainConfig(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @classmethod
    def from_toml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        p = Path(path)
        data = tomllib.loads(p.read_text())
        for dotted, value in (overrides or {}).items():
            node = data
            *parents, leaf = dotted.split(".")
            for k in parents:
                node = node.setdefault(k, {})
            node[leaf] = value
        cfg = cls.model_validate(data)
        base = p.resolve().parent
        if not Path(cfg.output.dir).is_absolute():
            cfg.output.dir = str((base / cfg.output.dir).resolve())
        mp = cfg.model.name_or_path
        if mp != "tiny" and (mp.startswith(".") or "/" not in mp) and (base / mp).exists():
            cfg.model.name_or_path = str(base / mp)
        return cfg
