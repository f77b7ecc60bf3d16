#!/usr/bin/env bash
# Re-captures the shipped traces in workloads/captured/ from scripts/models/ on fake CUDA tensors
# (no GPU needed; a Python with torch: --python, $ALLOCBENCH_PYTHON or python3).
# About 10 minutes for GPT-3 XL and 6 for Llama-2-7B on one core.
#   scripts/capture_workloads.sh [gpt3-xl-1.3b|llama2-7b-80g ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cargo build --release --message-format=json-render-diagnostics 2>/dev/null | sed -n 's/.*"executable":"\([^"]*allocbench\)".*/\1/p' | tail -1)
bin=${bin:-target/release/allocbench}
mkdir -p workloads/captured
which=("$@")
[ ${#which[@]} -gt 0 ] || which=(gpt3-xl-1.3b llama2-7b-80g)
for name in "${which[@]}"; do
  case "$name" in
    # The shape, batch, lengths, precision and optimizer of workloads/gpt3-xl-1.3b.toml.
    gpt3-xl-1.3b) args=(--model gpt3-xl --steps 200 --batch 4 --seq-len 128..2048 --seed 1 --amp bf16 --attention math) ;;
    # workloads/llama2-7b-80g.toml: pure bf16, fused AdamW, checkpointing, flash attention (SDPA).
    llama2-7b-80g) args=(--model llama2-7b --steps 60 --batch 2 --seq-len lognormal:2048,0.6,256,4096 --param-dtype bf16 --amp none --optimizer adamw-fused --checkpointing --seed 7) ;;
    *) echo "unknown capture '$name' (gpt3-xl-1.3b, llama2-7b-80g)" >&2; exit 2 ;;
  esac
  tmp=$(mktemp --suffix=.csv)
  "$bin" capture -o "$tmp" -- scripts/models/train.py "${args[@]}"
  gzip -9 -c "$tmp" > "workloads/captured/$name.csv.gz"
  rm -f "$tmp"
  echo "wrote workloads/captured/$name.csv.gz"
done
