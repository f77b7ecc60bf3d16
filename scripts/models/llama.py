"""A Llama-style decoder: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, SDPA.

Plain PyTorch, no downloads; presets mirror the public Llama-2 configurations.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    layers: int = 32
    d_model: int = 4096
    heads: int = 32
    kv_heads: int = 32
    ffn: int = 11008
    vocab: int = 32000
    max_positions: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


PRESETS = {
    "llama2-7b": LlamaConfig(),
    "llama2-13b": LlamaConfig(layers=40, d_model=5120, heads=40, kv_heads=40, ffn=13824),
    "llama3-8b": LlamaConfig(layers=32, d_model=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, max_positions=8192, rope_theta=500000.0),
    "tiny-llama": LlamaConfig(layers=2, d_model=64, heads=4, kv_heads=2, ffn=172, vocab=512, max_positions=128),
    "tiny-llama-mha": LlamaConfig(layers=2, d_model=64, heads=4, kv_heads=4, ffn=172, vocab=512, max_positions=4096),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(c: LlamaConfig, s: int, device):
    half = c.d_model // c.heads // 2
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2 :]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.d_model // c.heads
        self.q_proj = nn.Linear(c.d_model, c.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * self.head_dim, c.d_model, bias=False)

    def forward(self, x, cos, sin, cache=None):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or s > 1)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm, self.self_attn = RMSNorm(c.d_model, c.norm_eps), Attention(c)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.norm_eps)
        self.gate_proj = nn.Linear(c.d_model, c.ffn, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.ffn, bias=False)
        self.down_proj = nn.Linear(c.ffn, c.d_model, bias=False)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, idx, targets=None, caches=None, start=0):
        s = idx.size(1)
        cos, sin = rope_tables(self.config, start + s, idx.device)
        cos, sin = cos[start:], sin[start:]
        x = self.embed_tokens(idx)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i])
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))
