"""A GPT-2/GPT-3 style decoder (learned positions, LayerNorm, GELU MLP, tied embeddings).

Plain PyTorch, no downloads: the shapes are what decide allocations, so presets mirror public
configurations (GPT-3 paper table 2.1; GPT-2 model cards).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    layers: int = 24
    d_model: int = 2048
    heads: int = 16
    ffn: int = 8192
    vocab: int = 50257
    max_positions: int = 2048
    attention: str = "math"  # math: explicit softmax(QK^T)V; sdpa: F.scaled_dot_product_attention
    dropout: float = 0.0


PRESETS = {
    # 16 heads of 128 (the paper's 24 heads do not multiply to 2048).
    "gpt3-medium": GPTConfig(layers=24, d_model=1024, heads=16, ffn=4096),
    "gpt3-xl": GPTConfig(layers=24, d_model=2048, heads=16, ffn=8192),
    "gpt2-xl": GPTConfig(layers=48, d_model=1600, heads=25, ffn=6400, max_positions=1024),
    "gpt2-small": GPTConfig(layers=12, d_model=768, heads=12, ffn=3072, max_positions=1024),
    "tiny-gpt": GPTConfig(layers=2, d_model=64, heads=4, ffn=256, vocab=512, max_positions=128),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.heads, self.attention, self.dropout = c.heads, c.attention, c.dropout
        self.c_attn = nn.Linear(c.d_model, 3 * c.d_model)
        self.c_proj = nn.Linear(c.d_model, c.d_model)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            att = F.dropout(att, self.dropout, self.training)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, s, d))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c.d_model), CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, c.ffn), nn.GELU(), nn.Linear(c.ffn, c.d_model))

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.d_model)
        self.wpe = nn.Embedding(c.max_positions, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx, targets=None):
        s = idx.size(1)
        pos = torch.arange(s, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        # The causal mask (True above the diagonal), made once per forward for every block.
        mask = None if self.config.attention == "sdpa" else torch.ones(s, s, dtype=torch.bool, device=idx.device).triu(1)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
