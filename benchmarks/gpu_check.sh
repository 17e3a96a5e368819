#!/usr/bin/env bash
# Issue #27's GPU check, for a lent GPU machine (torch and transformers installed, no package registry, a few
# minutes): the Qwen2.5-Coder-1.5B architecture with random weights on CUDA, new tokens per second at batch 1, 32
# and 128 for fixlab's engine, plain `generate` (one at a time; each batch left-padded) and transformers'
# continuous batching (`generate_batch`), with greedy agreement against one-at-a-time `generate`.
#   bf16 (the speed), then float32 (exactness, fewer tokens: bf16 near-ties on random weights flip under batching).
# Each run saves its results file after every row, so a lease that ends early keeps what was measured.
#   bash benchmarks/gpu_check.sh [out folder]     (default: $OUT, else benchmarks/results)
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$out"
py="$(command -v python || command -v python3)"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
run() {  # seconds, tag, flags...
    local limit=$1 tag=$2; shift 2
    echo "== $tag (limit ${limit}s)"
    timeout -s INT "$limit" "$py" benchmarks/generation.py --device cuda --arch Qwen2.5-Coder-1.5B-Instruct --layers 0 \
        --seq-prompts 3 --hf-batched --hf-cb --out "$out/generation-cuda-$tag-$stamp.json" "$@"
    echo "== $tag: exit $?"
}
run "${GPU_BF16_S:-300}" bf16 --dtype bfloat16 --batches 1 32 128 --new-tokens 128
run "${GPU_FP32_S:-120}" fp32 --dtype float32 --batches 1 32 --new-tokens 32
