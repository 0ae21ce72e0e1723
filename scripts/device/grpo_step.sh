#!/usr/bin/env bash
# benchmarks/grpo_step.py on a lent GPU machine: install the carried wheels (.whl/, see
# README.md here), then the benchmark; log and JSON under $OUT. Arguments go to the benchmark.
set -o pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$OUT/nvidia_smi.txt"
timeout 470 python3 benchmarks/grpo_step.py "$@" --json "$OUT/grpo_step.json" 2>&1 | grep -v -E "FutureWarning|warnings.warn|UserWarning" | tee "$OUT/grpo_step.log"
