#!/usr/bin/env python3
"""Writes real PyTorch memory snapshots for allocbench's test fixtures.

Trains a small decoder-only transformer for a few steps with variable sequence lengths under
torch.cuda.memory._record_memory_history(), then torch.cuda.memory._dump_snapshot():
  OUT/snapshot-small.pickle      full history (python stacks), the fixture `allocbench trace` imports
  OUT/snapshot-truncated.pickle  a ring buffer too small for the run (max_entries=256): truncated
Needs a CUDA GPU and PyTorch.   python3 scripts/make_snapshot.py OUT_DIR
"""
import os
import sys

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def train(steps, seqs):
    torch.manual_seed(0)
    d, h, vocab = 256, 4, 1000
    model = nn.Sequential(nn.Embedding(vocab, d), *[Block(d, h) for _ in range(2)], nn.Linear(d, vocab)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        s = seqs[step % len(seqs)]
        tokens = torch.randint(0, vocab, (4, s), device="cuda")
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.float().view(-1, vocab), tokens.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=1_000_000)
    train(3, [64, 192, 128])
    torch.cuda.memory._dump_snapshot(os.path.join(out, "snapshot-small.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=256)
    train(2, [96, 160])
    torch.cuda.memory._dump_snapshot(os.path.join(out, "snapshot-truncated.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    print("torch", torch.__version__, "wrote", sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
