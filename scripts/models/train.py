#!/usr/bin/env python3
"""A plain training loop over the shipped models (or any `transformers` causal LM built from its
config, no weights): `.cuda()`, autocast, GradScaler, AdamW, gradient clipping and accumulation,
variable sequence lengths. Capture it with `allocbench capture -o trace.csv -- scripts/models/train.py ...`.
With `--fsdp`, a torchrun script: FSDP2 (`fully_shard`) over every rank; capture its ranks with
`allocbench capture --backend driver --nproc-per-node 8 --ranks distinct -o DIR -- scripts/models/train.py --fsdp ...`.
"""
import argparse
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402
import llama  # noqa: E402


def build(name, attention):
    if name in gpt.PRESETS:
        c = gpt.PRESETS[name]
        c.attention = attention
        return gpt.GPT(c), c.vocab
    if name in llama.PRESETS:
        return llama.Llama(llama.PRESETS[name]), llama.PRESETS[name].vocab
    if name.startswith("hf:"):
        # A transformers model from its configuration alone: hf:MODEL_TYPE[,key=value...] or hf:config.json
        from transformers import AutoConfig, AutoModelForCausalLM

        spec = name[3:]
        if spec.endswith(".json"):
            config = AutoConfig.from_pretrained(spec)
        else:
            model_type, *pairs = spec.split(",")
            kwargs = {k: int(v) if v.isdigit() else v for k, v in (p.split("=", 1) for p in pairs)}
            config = AutoConfig.for_model(model_type, **kwargs)
        return AutoModelForCausalLM.from_config(config), config.vocab_size
    known = ", ".join([*gpt.PRESETS, *llama.PRESETS])
    raise SystemExit(f"train.py: unknown model '{name}' (known: {known}, or hf:MODEL_TYPE[,key=value...])")


def checkpoint_blocks(model):
    """Recompute each transformer block in backward (torch.utils.checkpoint, non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    blocks = getattr(model, "blocks", None) or getattr(model, "layers", None)
    for block in blocks:
        forward = block.forward
        block.forward = lambda *args, _f=forward: checkpoint(_f, *args, use_reentrant=False)


def lengths(spec, seed):
    """`2048` (fixed), `128..2048` (uniform), `lognormal:MEDIAN,SIGMA,MIN,MAX` or `list:A,B,...`
    (cycled); seeded."""
    rng = random.Random(seed)
    if spec.startswith("lognormal:"):
        median, sigma, lo, hi = (float(x) for x in spec[len("lognormal:"):].split(","))
        while True:
            yield int(min(max(round(rng.lognormvariate(math.log(median), sigma)), lo), hi))
    if spec.startswith("list:"):
        values = [int(x) for x in spec[len("list:"):].split(",")]
        while True:
            yield from values
    if ".." in spec:
        lo, hi = (int(x) for x in spec.split(".."))
        while True:
            yield rng.randint(lo, hi)
    while True:
        yield int(spec)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="gpt3-xl")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", default="128..2048")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--amp", default="bf16", choices=["bf16", "fp16", "none"])
    p.add_argument("--attention", default="math", choices=["math", "sdpa"])
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "adamw-fused", "adamw-loop", "sgd"],
                   help="adamw: PyTorch's default (foreach on CUDA); adamw-loop: foreach=False")
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping (0: off)")
    p.add_argument("--param-dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: pure bf16 training (no autocast needed)")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of every block")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fsdp", action="store_true",
                   help="FSDP2 under torchrun: the model built on the meta device, each block and the root fully_shard-ed over "
                        "every rank, then materialized shard by shard; with --amp bf16 the bf16 compute is FSDP2's "
                        "MixedPrecisionPolicy (bf16 params gathered, fp32 gradients reduced) instead of autocast")
    p.add_argument("--reshard-after-forward", default="true", choices=["true", "false"],
                   help="--fsdp: free each block's gathered parameters after its forward (true) or keep them for backward")
    p.add_argument("--forward-prefetch", type=int, default=0,
                   help="--fsdp: blocks each block all-gathers ahead in forward (set_modules_to_forward_prefetch; 0: FSDP2's default)")
    p.add_argument("--backward-prefetch", type=int, default=None,
                   help="--fsdp: blocks each block all-gathers ahead in backward (set_modules_to_backward_prefetch; "
                        "default: FSDP2's implicit one)")
    p.add_argument("--compile", default="none", choices=["none", "default", "reduce-overhead", "max-autotune"],
                   help="torch.compile the model in this mode (none: eager)")
    a = p.parse_args()

    torch.manual_seed(a.seed)
    if a.fsdp:
        model, vocab, a.device = sharded(a)
    else:
        model, vocab = build(a.model, a.attention)
        if a.param_dtype == "bf16":
            model = model.to(a.device, torch.bfloat16)  # one copy, straight to bf16
        else:
            model = model.cuda() if a.device == "cuda" else model.to(a.device)
    if a.checkpointing:
        checkpoint_blocks(model)
    model.train()
    step_model = model if a.compile == "none" else torch.compile(model, mode=a.compile)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        variant = {"adamw": {}, "adamw-fused": {"fused": True}, "adamw-loop": {"foreach": False}}[a.optimizer]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **variant)
    # (FSDP2's mixed precision casts the gathered parameters itself: no autocast with it.)
    dtype = None if a.fsdp else {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[a.amp]
    scaler = torch.amp.GradScaler(a.device, enabled=a.amp == "fp16")
    seq = lengths(a.seq_len, a.seed)
    for _ in range(a.steps):
        for _ in range(a.accum):
            s = next(seq)
            idx = torch.randint(0, vocab, (a.batch, s), device=a.device)
            targets = torch.randint(0, vocab, (a.batch, s), device=a.device)
            with torch.autocast(a.device.split(":")[0], dtype=dtype or torch.float32, enabled=dtype is not None):
                out = step_model(idx, targets) if not hasattr(model, "hf_device_map") and a.model[:3] != "hf:" else step_model(idx, labels=targets)
                loss = out[1] if isinstance(out, tuple) else out.loss
            scaler.scale(loss / a.accum).backward()
        if a.clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    if a.fsdp:
        torch.distributed.destroy_process_group()


def sharded(a):
    """FSDP2 as its tutorial writes it: init_process_group, the rank's device, the model on the
    meta device, fully_shard per block then the root, to_empty on the device (each rank holds its
    shard of every parameter; weights left uninitialised, which memory does not see)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    device = a.device
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = f"cuda:{torch.cuda.current_device()}"
    with torch.device("meta"):
        model, vocab = build(a.model, a.attention)
    if a.param_dtype == "bf16":
        model = model.to(torch.bfloat16)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if a.amp == "bf16" else MixedPrecisionPolicy()
    reshard = a.reshard_after_forward == "true"
    blocks = list(getattr(model, "blocks", None) or getattr(model, "layers", None) or [])
    for block in blocks:
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    for i, block in enumerate(blocks):
        if a.forward_prefetch > 0:
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + a.forward_prefetch])
        if a.backward_prefetch is not None:
            block.set_modules_to_backward_prefetch(blocks[max(0, i - a.backward_prefetch):i][::-1])
    model.to_empty(device=device)
    return model, vocab, device


if __name__ == "__main__":
    main()
