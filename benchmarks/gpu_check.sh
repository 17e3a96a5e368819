#!/usr/bin/env bash
# The GPU check (issues #27, #53), for a lent GPU machine (torch and transformers installed, no package registry, ten
# minutes): the Qwen2.5-Coder-1.5B architecture with random weights on CUDA, new tokens per second at 1, 32 and 128
# concurrent requests, warm, side by side in one results file:
#   fixlab's engine; plain `generate` (each batch left-padded); transformers' continuous batching (`generate_batch`);
#   fixlab's two servers on kept libraries (serving/hf_batching.py: static cache + torch.compile, continuous
#   batching), which `runtime: auto` races on a GPU; and vLLM's offline engine where vLLM is installed.
# Greedy agreement with one-at-a-time `generate` is in each row (bf16 near-ties on random weights may flip a token).
# The results file is saved after every row, so a lease that ends early keeps what was measured.
#   bash benchmarks/gpu_check.sh [out folder]     (default: $OUT, else benchmarks/results)
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$out"
py="$(command -v python || command -v python3)"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
vllm=()
"$py" -c "import vllm" 2>/dev/null && vllm=(--vllm) && echo "vLLM found: its row is timed too"
echo "== bf16 (limit ${GPU_BF16_S:-480}s)"
timeout -s INT "${GPU_BF16_S:-480}" "$py" benchmarks/generation.py --device cuda --arch Qwen2.5-Coder-1.5B-Instruct \
    --layers 0 --seq-prompts 3 --hf-batched --hf-cb --kept "${vllm[@]}" --dtype bfloat16 --batches 1 32 128 \
    --new-tokens 128 --out "$out/generation-cuda-bf16-$stamp.json" "$@"
echo "== bf16: exit $?"
