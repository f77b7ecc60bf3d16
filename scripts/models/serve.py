#!/usr/bin/env python3
"""LLM serving as eager PyTorch does it without a paged cache: requests arrive in Poisson bursts,
each is prefilled on its prompt, then decoded one token per step with its own KV cache grown by
torch.cat (one bigger tensor allocated and the old one freed, per layer, per token) or written
into a preallocated max-length buffer. One step = one decode iteration over the running requests,
marked with allocbench_capture.step(). Capture it with
`allocbench capture -o serve.csv -- scripts/models/serve.py --model llama2-7b`.
"""
import argparse
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402

try:
    from allocbench_capture import step as mark_step
except ImportError:  # run without a capture

    def mark_step():
        pass


class CatCache:
    """Past keys and values of one layer, grown with torch.cat (a new, longer tensor per token)."""

    def __init__(self):
        self.k = self.v = None

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class PreallocatedCache:
    """A max-length buffer per layer, written in place."""

    def __init__(self, like, max_len):
        b, h, _, d = like.shape
        self.k = torch.empty(b, h, max_len, d, dtype=like.dtype, device=like.device)
        self.v = torch.empty_like(self.k)
        self.len = 0

    def update(self, k, v):
        n = k.shape[2]
        self.k[:, :, self.len : self.len + n].copy_(k)
        self.v[:, :, self.len : self.len + n].copy_(v)
        self.len += n
        return self.k[:, :, : self.len], self.v[:, :, : self.len]


class LazyPreallocated:
    def __init__(self, max_len):
        self.max_len, self.cache = max_len, None

    def update(self, k, v):
        if self.cache is None:
            self.cache = PreallocatedCache(k, self.max_len)
        return self.cache.update(k, v)


def lognormal(rng, median, sigma, lo, hi):
    return int(min(max(round(rng.lognormvariate(math.log(median), sigma)), lo), hi))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama2-7b")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--calm-rate", type=float, default=0.05, help="arrivals per step when calm")
    p.add_argument("--burst-rate", type=float, default=0.6, help="arrivals per step in a burst")
    p.add_argument("--mean-calm-steps", type=float, default=200.0)
    p.add_argument("--mean-burst-steps", type=float, default=40.0)
    p.add_argument("--prompt", default="300,0.8,16,3072", help="lognormal median,sigma,min,max")
    p.add_argument("--output", default="150,0.9,8,1024", help="lognormal median,sigma,min,max")
    p.add_argument("--kv-cache", default="naive_cat", choices=["naive_cat", "preallocated"])
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--schedule-out", help="write the admitted requests as a workload's `arrivals = [[step, prompt, output], ...]` line")
    a = p.parse_args()

    rng = random.Random(a.seed)
    config = llama.PRESETS[a.model]
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    model = llama.Llama(config).to(a.device, dtype).eval()
    prompt_dist = [float(x) for x in a.prompt.split(",")]
    output_dist = [float(x) for x in a.output.split(",")]
    waiting, running = 0, []
    arrived_at, schedule = [], []  # the step each waiting request arrived at; admitted [step, prompt, output]
    burst, phase_left = False, rng.expovariate(1 / a.mean_calm_steps)
    with torch.inference_mode():
        for step in range(1, a.steps + 1):
            # Arrivals: Poisson, at a rate that switches between calm and burst phases.
            phase_left -= 1
            if phase_left <= 0:
                burst = not burst
                phase_left = rng.expovariate(1 / (a.mean_burst_steps if burst else a.mean_calm_steps))
            rate = a.burst_rate if burst else a.calm_rate
            t, arrivals = rng.expovariate(rate), 0
            while t < 1.0:
                arrivals += 1
                t += rng.expovariate(rate)
            waiting += arrivals
            arrived_at += [step] * arrivals
            # Admit and prefill.
            while waiting and len(running) < a.max_batch:
                waiting -= 1
                prompt = lognormal(rng, *prompt_dist)
                remaining = lognormal(rng, *output_dist)
                schedule.append([arrived_at.pop(0), prompt, remaining])
                if a.kv_cache == "naive_cat":
                    caches = [CatCache() for _ in range(config.layers)]
                else:
                    caches = [LazyPreallocated(prompt + remaining) for _ in range(config.layers)]
                idx = torch.randint(0, config.vocab, (1, prompt), device=a.device)
                logits = model(idx, caches=caches)
                token = logits[:, -1:].argmax(-1)
                running.append([caches, prompt, remaining - 1, token])
            # Decode one token for every running request.
            for r in running:
                caches, pos, _, token = r
                logits = model(token, caches=caches, start=pos)
                r[1], r[2], r[3] = pos + 1, r[2] - 1, logits[:, -1:].argmax(-1)
            running = [r for r in running if r[2] > 0]
            mark_step()
    if a.schedule_out:
        with open(a.schedule_out, "w") as f:
            f.write("arrivals = [" + ", ".join(f"[{s}, {p}, {o}]" for s, p, o in schedule) + "]\n")


if __name__ == "__main__":
    main()
