"""Training configuration: one pydantic model, loadable from TOML (`sandgym train CONFIG.toml`).

Relative paths in the file (output dir, model path) are resolved against the file's folder.
Unknown keys are refused, and options that cannot work together stop the run while the
config is read, before any model is built, with one line naming the key (`ConfigError`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandgym.errors import UserError


class Strict(BaseModel):
    """A config section: a key it does not know is refused."""

    model_config = ConfigDict(extra="forbid")


Normalization = Literal["token", "sequence", "constant"]
PolicyLoss = Literal["ppo", "gspo", "cispo"]
ISCorrection = Literal["none", "tis", "mis", "reject"]
ISLevel = Literal["token", "sequence", "geometric"]


class ConfigError(UserError):
    """A training configuration whose options cannot work together; the message names the
    key. Raised while the config is read (not a ValueError: pydantic lets it through
    unwrapped, and the CLI prints it as one line)."""


class LossConfig(Strict):
    policy_loss: PolicyLoss = "ppo"
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.28, ge=0.0)  # DAPO's clip-higher default
    # GSPO's sequence ratios sit much closer to 1 than token ratios: the paper's bounds.
    gspo_eps_low: float = Field(3e-4, ge=0.0)
    gspo_eps_high: float = Field(4e-4, ge=0.0)
    cispo_eps_high: float = Field(4.0, gt=0.0)  # CISPO weight cap 1 + eps (no lower bound)
    normalization: Normalization = "token"
    constant_length: int = Field(1024, gt=0)  # Dr. GRPO's fixed denominator per sequence
    kl_beta: float = Field(0.0, ge=0.0)
    is_correction: ISCorrection = "none"
    is_level: ISLevel = "token"
    is_low: float = Field(0.0, ge=0.0)  # mis / reject lower bound on rho
    is_high: float = Field(2.0, gt=0.0)  # tis cap; mis / reject upper bound
    scale_advantages_by_std: bool = True
    advantage_eps: float = Field(1e-6, gt=0.0)

    @model_validator(mode="after")
    def _compatible(self) -> LossConfig:
        if self.policy_loss == "gspo" and self.normalization != "sequence":
            raise ConfigError(
                f"loss.normalization = {self.normalization!r} conflicts with loss.policy_loss = 'gspo': GSPO's "
                "sequence-level ratio gives one term per sequence; set loss.normalization = 'sequence'"
            )
        if self.policy_loss == "gspo" and self.is_correction != "none" and self.is_level == "token":
            raise ConfigError(
                "loss.is_level = 'token' conflicts with loss.policy_loss = 'gspo' (a per-token weight inside a "
                "sequence-level ratio); use loss.is_level = 'sequence' or 'geometric'"
            )
        if self.is_correction in ("mis", "reject") and self.is_low >= self.is_high:
            raise ConfigError(f"loss.is_low ({self.is_low}) must be below loss.is_high ({self.is_high})")
        return self


class TinyModelConfig(Strict):
    vocab_size: int = 264
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128


class ModelConfig(Strict):
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
    # LM head + logprob + entropy: "torch" (sandgym's chunked PyTorch path, any device), "trl"
    # (TRL's fused Triton LM head; torch tiles without Triton), "liger" (liger-kernel's fused
    # linear cross-entropy, CUDA only, no entropy metric). "auto": on CUDA the fastest one
    # installed (trl, then liger, then torch: logprobs.AUTO_ORDER_CUDA), on CPU "torch".
    logprob_kernel: Literal["auto", "torch", "trl", "liger"] = "auto"
    # torch.compile each decoder layer (dynamic shapes: packed lengths vary per micro-batch).
    # On an H100 it took the 0.5B step from 4.26 to 2.75 s (benchmarks/RESULTS.md); the first
    # step pays the compile. Off by default: it needs a C++ compiler on CPU, and with a shared
    # transformers backend generation runs through the compiled layers too.
    compile_layers: bool = False
    # Micro-batches hold the prefix their sequences share (a tools block, a system prompt, a
    # group's question) once, and each sequence attends to it: the same logprobs and gradients
    # from fewer tokens (the pycalc gate's rollouts: 2.5x fewer). With the sdpa attention
    # kernel (CPU, or chosen); the flash kernels take no such layout and pack as before.
    share_prefix: bool = True
    # Start from another run's weights (e.g. `sandgym sft`'s): a checkpoint folder or a run
    # folder (its newest checkpoint). Same architecture required; a resumed run ignores it.
    init_from: str | None = None


class BackendConfig(Strict):
    kind: Literal["auto", "hf", "vllm"] = "auto"  # auto: vllm when importable and on CUDA
    max_batch_size: int = Field(64, gt=0)
    # hf: serve the trainer's own weights (no copy). Unset: yes when that can work
    # (synchronous, one process), else a copy that update_weights refreshes.
    share_weights: bool | None = None
    # vllm
    gpu_memory_utilization: float = 0.3
    # Free the engine's GPU memory while training. Unset: yes when synchronous (an asleep
    # engine cannot generate while the trainer trains).
    sleep_during_training: bool | None = None
    max_model_len: int = 4096
    # vLLM's tensor parallelism. The colocated engine shares the trainer's GPUs, so it can
    # be at most distributed.nproc; above 1, weights reach the engine's workers as CPU copies
    # (not yet run on a device: issue 14).
    tensor_parallel_size: int = Field(1, gt=0)

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


class ToyTaskConfig(Strict):
    """A learnable token-level task: reward = fraction of generated tokens inside
    [target_low, target_high] (byte ids; default lowercase ASCII letters, ~10% at random)."""

    prompt_len: int = 8
    turns: int = 2
    target_low: int = 97
    target_high: int = 122
    env_tokens: list[int] = Field(default_factory=lambda: [10, 62, 32])  # "\n> " between turns


class EnvConfig(Strict):
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
    # Sandboxes made ready when a step's rollouts start; with an environment that reuses
    # sandboxes (reset between rollouts, where the provider can) they are handed from rollout
    # to rollout instead of made anew each time.
    warm_sandboxes: int = Field(0, ge=0)
    # Turn i's prompt was sent as token ids extending turn i-1 (token-in, core/tokens.py),
    # where the server allows it; off: every turn is sent as messages and rendered by the server.
    token_in: bool = True
    # A rollout whose turn i prompt does not extend turn i-1's tokens (a server that
    # re-rendered the chat; cannot happen with token-in unless a server changes ids): stop
    # the run ("error"), drop that rollout and count it ("skip"), or train it as one sequence
    # per run of extending turns ("split": each sequence is what the model saw).
    on_prefix_mismatch: Literal["error", "skip", "split"] = "error"


class RolloutConfig(Strict):
    prompts_per_step: int = Field(4, gt=0)  # groups per optimizer step
    group_size: int = Field(8, gt=1)
    max_tokens: int = Field(64, gt=0)
    temperature: float = 1.0
    top_p: float = 1.0
    max_concurrent: int = Field(64, gt=0)  # rollouts in flight
    # DAPO's dynamic sampling: a group whose valid rollouts all have the same reward (or
    # fewer than 2 valid rollouts) teaches nothing; drop it and generate another.
    dynamic_sampling: bool = False
    # At most this many times prompts_per_step groups are examined for one step (dropped
    # groups included); past it the step trains on the groups it has.
    max_groups_factor: float = Field(3.0, ge=1.0)


class OptimConfig(Strict):
    steps: int = Field(20, gt=0)
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    # AdamW's epsilon. Adam scales every coordinate's step to about lr whatever its gradient;
    # a larger eps leaves coordinates whose gradient is only noise (where rewarded and
    # unrewarded samples cancel) nearly still instead.
    eps: float = Field(1e-8, gt=0)
    warmup_steps: int = 0
    # After warmup: constant, or decaying to 0 at `steps` (linear or cosine).
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    grad_clip: float = 1.0
    micro_batch_tokens: int = Field(4096, gt=0)  # packing budget; micro-batches accumulate
    num_iterations: int = Field(1, gt=0)  # optimizer passes over each batch (GRPO's mu)
    seed: int = 0
    # How many steps rollout generation may run ahead of training: 0 = synchronous
    # (generate, then train); k > 0 = the groups of step n start generating as soon as the
    # weights of step n - k are served, and keep going while the trainer trains.
    async_level: int = Field(0, ge=0)
    # A group sampled by weights more than this many optimizer steps older than the ones
    # being trained is dropped (counted in `stale_groups_dropped`) and replaced.
    max_off_policy_steps: int = Field(2, ge=0)


class DistributedConfig(Strict):
    # Trainer processes (FSDP2 data-parallel, parameters sharded). `sandgym train --nproc N`
    # or torchrun's WORLD_SIZE set it; rank 0 also runs the inference backend and rollouts.
    nproc: int = Field(1, gt=0)
    # Collective backend: auto = nccl on CUDA, gloo on CPU.
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    timeout_s: float = Field(1800.0, gt=0)


class OutputConfig(Strict):
    dir: str = "runs/train"
    checkpoint_every: int = 0  # steps; 0 = only at the end
    keep_checkpoints: int = 2
    resume: bool = True
    plot: bool = True
    wandb_project: str | None = None
    # Rollouts of each step kept in samples.jsonl (spread from best to worst reward; failed
    # ones included), for `sandgym view`; 0: none.
    samples_per_step: int = Field(4, ge=0)


class _Output(Protocol):
    dir: str


class RunConfig(Strict):
    """A run's whole config read from a TOML file (`sandgym train`, `sandgym sft`): relative
    paths in it are relative to the file's folder."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    if TYPE_CHECKING:  # for the type checker only: each run config places its own output section
        output: _Output

    @classmethod
    def from_toml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Self:
        p = Path(path)
        cfg = cls.model_validate(load_toml(p, overrides))
        cfg.resolve_paths(p.resolve().parent)
        return cfg

    def resolve_paths(self, base: Path) -> None:
        """The output folder and the model's paths, made absolute against `base`; a run
        config with paths of its own adds them."""
        if not Path(self.output.dir).is_absolute():
            self.output.dir = str((base / self.output.dir).resolve())
        resolve_model_paths(self.model, base)


class TrainConfig(RunConfig):
    backend: BackendConfig = Field(default_factory=BackendConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @model_validator(mode="after")
    def _compatible(self) -> TrainConfig:
        """Combinations that cannot work, refused before anything is built."""
        b, o, d = self.backend, self.optim, self.distributed
        level = o.async_level
        if level > 0 and b.share_weights is True:
            raise ConfigError(
                f"backend.share_weights = true cannot be combined with optim.async_level = {level}: generation "
                "goes on while the optimizer changes the shared weights; leave it unset (a copy is served)"
            )
        if level > 0 and b.kind == "vllm" and b.sleep_during_training is True:
            raise ConfigError(
                f"backend.sleep_during_training = true cannot be combined with optim.async_level = {level}: an "
                "asleep engine cannot generate while the trainer trains; leave it unset or false"
            )
        if o.max_off_policy_steps < level:
            raise ConfigError(
                f"optim.max_off_policy_steps ({o.max_off_policy_steps}) must be at least optim.async_level "
                f"({level}): groups generated that far ahead would all be dropped as stale"
            )
        if d.nproc > 1 and b.share_weights is True:
            raise ConfigError(
                f"backend.share_weights = true cannot be combined with distributed.nproc = {d.nproc}: the trainer's "
                "weights are sharded across processes; leave it unset (rank 0 serves a gathered copy)"
            )
        if d.nproc > 1 and self.model.compile_layers:
            raise ConfigError(
                f"model.compile_layers = true cannot be combined with distributed.nproc = {d.nproc} yet: compiled "
                "layers under FSDP2's hooks have not been checked; run one process or leave it off"
            )
        if b.tensor_parallel_size > 1 and b.kind == "hf":
            raise ConfigError("backend.tensor_parallel_size > 1 needs backend.kind = 'vllm' (the transformers backend has none)")
        if b.tensor_parallel_size > d.nproc:
            raise ConfigError(
                f"backend.tensor_parallel_size ({b.tensor_parallel_size}) must be at most distributed.nproc ({d.nproc}): "
                "the colocated engine runs on the trainer processes' GPUs"
            )
        if b.kind == "vllm" and self.model.device == "cpu":
            raise ConfigError("backend.kind = 'vllm' needs a CUDA device, but model.device = 'cpu'; use backend.kind = 'hf'")
        if d.backend == "nccl" and self.model.device == "cpu":
            raise ConfigError("distributed.backend = 'nccl' needs CUDA, but model.device = 'cpu'; use 'gloo' or 'auto'")
        return self

    def hf_share_weights(self) -> bool:
        """backend.share_weights as it applies to this run."""
        b = self.backend.share_weights
        return (self.optim.async_level == 0 and self.distributed.nproc == 1) if b is None else b

    def vllm_sleeps(self) -> bool:
        """backend.sleep_during_training as it applies to this run."""
        s = self.backend.sleep_during_training
        return self.optim.async_level == 0 if s is None else s


def load_toml(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A TOML config as a dict, with `{"section.key": value}` overrides applied."""
    data = tomllib.loads(path.read_text())
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return data


def resolve_model_paths(model: ModelConfig, base: Path) -> None:
    """Relative model folders and `init_from` are relative to the config file's folder."""
    mp = model.name_or_path
    if mp != "tiny" and (mp.startswith(".") or "/" not in mp) and (base / mp).exists():
        model.name_or_path = str(base / mp)
    if model.init_from is not None and not Path(model.init_from).is_absolute():
        model.init_from = str((base / model.init_from).resolve())
