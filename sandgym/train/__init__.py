"""GRPO training on sandgym rollouts.

- batch.py: State (multi-turn, server token ids) -> Sequence with loss mask -> packed MicroBatch
- loss.py: the GRPO loss variants (token/sequence/constant normalisation,
  asymmetric clipping, KL to a reference, truncated importance sampling)
- attention.py: packed varlen attention for transformers models (flash_attn, torch varlen, SDPA)
- logprobs.py: chunked logprobs/entropy without materialising full-vocabulary logits, and the
  choice of LM head kernel; fused_logprobs.py: TRL's and liger-kernel's fused LM heads
- policy.py: one optimizer step on a batch of sequences (PolicyTrainer)
- trainer.py: the loop (generate -> score -> advantages -> step -> push weights -> log/checkpoint)
- backends/: inference behind an OpenAI-compatible server: base.py (GenRequest/GenResult, the
  InferenceEngine and InferenceBackend protocols), openai_server.py (the server, any engine),
  hf.py (built-in transformers engine + backend), vllm.py (colocated vLLM engine + backend)
- rollout_source.py: the RolloutSource protocol; toy.py (ToyTask, a learnable toy task) and
  env_source.py (EnvRolloutSource, sandgym environments) implement it
- config.py: TrainConfig (TOML); plot.py: metrics JSONL -> PNG (tiny models: sandgym.models.tiny)
"""
