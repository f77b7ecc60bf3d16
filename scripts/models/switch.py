#!/usr/bin/env python3
"""Several models served from one GPU in turn, as a multi-model inference service does it in
eager PyTorch: a model is built from its configuration (no weights), moved to the GPU in the
serving dtype, run for a few batched forwards, unloaded (`del model`, and `torch.cuda.empty_cache()`
only with --empty-cache), and the next one is loaded, in a random or round-robin schedule. One step
= one forward, marked with allocbench_capture.step(). The flags mirror workloads/model-switch.toml's
[model_switch] table. Capture it with
`allocbench capture -o switch.csv -- scripts/models/switch.py --model gpt3-medium --model llama2-7b`.

Forwards run under torch.no_grad() (serve.py uses torch.inference_mode(), as vLLM and TGI do).
Allocation-wise both give the same storages: neither saves anything for backward, and inference
mode only skips version counters and view tracking; a capture records the same trace under both.
"""
import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402
import llama  # noqa: E402
import train  # noqa: E402  (build: the shipped presets; lengths: the --seq-len forms)

try:
    from allocbench_capture import step as mark_step
except ImportError:  # run without a capture

    def mark_step():
        pass


def run_residency(name, attention, dtype, device, batch, seq_lens):
    """Load `name`, run one forward per sequence length, unload. Everything the residency made
    dies when this function returns (the model, the last ids and logits)."""
    model, vocab = train.build(name, attention)
    model = model.to(device, dtype).eval()
    with torch.no_grad():
        for s in seq_lens:
            idx = torch.randint(0, vocab, (batch, s), device=device)
            logits = model(idx)
            mark_step()
    del model, idx, logits


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", action="append", required=True, help="a preset of gpt.py or llama.py; repeat, in the toml's order")
    p.add_argument("--schedule", default="random", choices=["random", "round_robin"])
    p.add_argument("--switches", type=int, default=12, help="residencies (model loads)")
    p.add_argument("--steps-per-model", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", default="128..1024", help="as train.py: 2048, 128..2048, lognormal:M,S,MIN,MAX, list:A,B")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--attention", default="flash", choices=["flash", "math"], help="flash: SDPA (GPT); Llama always uses SDPA")
    p.add_argument("--empty-cache", action="store_true", help="torch.cuda.empty_cache() after each unload")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--schedule-out", help="write the residencies as a workload's `residencies = [{ model = I, seq_lens = [...] }, ...]` line")
    a = p.parse_args()
    unknown = [m for m in a.model if m not in gpt.PRESETS and m not in llama.PRESETS and not m.startswith("hf:")]
    if unknown:
        p.error(f"unknown model {unknown[0]!r} (known: {', '.join([*gpt.PRESETS, *llama.PRESETS])}, or hf:MODEL_TYPE[,key=value...])")
    if a.switches < 1 or a.steps_per_model < 1 or a.batch < 1:
        p.error("--switches, --steps-per-model and --batch must be at least 1")

    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    seq = train.lengths(a.seq_len, a.seed + 1)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    attention = "sdpa" if a.attention == "flash" else "math"
    residencies = []
    for r in range(a.switches):
        which = rng.randrange(len(a.model)) if a.schedule == "random" else r % len(a.model)
        seq_lens = [next(seq) for _ in range(a.steps_per_model)]
        residencies.append((which, seq_lens))
        run_residency(a.model[which], attention, dtype, a.device, a.batch, seq_lens)
        if a.empty_cache and a.device == "cuda":
            torch.cuda.empty_cache()
    if a.schedule_out:
        with open(a.schedule_out, "w") as f:
            rows = ", ".join(f"{{ model = {m}, seq_lens = [{', '.join(map(str, s))}] }}" for m, s in residencies)
            f.write(f"residencies = [{rows}]\n")


if __name__ == "__main__":
    main()
