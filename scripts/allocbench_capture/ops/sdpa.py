"""Scaled dot-product attention on fake CUDA: the fused kernel a GPU picks, and what it allocates.

F.scaled_dot_product_attention is patched to dispatch to the backend an H100 picks
(``_fake_cuda_sdpa``; the real selection asks the driver and falls back to math). The rules:
the fused kernels' RNG state outputs are CPU tensors (not recorded) without dropout, and
FlashAttention-2's backward allocates scratch besides its outputs (``flash_backward_scratch``,
also used by scripts/blind_spots.py)."""
from __future__ import annotations

from ..card import _round_up
from .registry import rule

_RNG_OUTPUTS = frozenset({"rng_state", "unused", "philox_seed", "philox_offset"})


def _dropout(func, args, kwargs):
    for i, a in enumerate(func._schema.arguments):
        if a.name == "dropout_p":
            return (args[i] if i < len(args) else kwargs.get("dropout_p", 0.0)) > 0.0
    return False



@rule("outputs", "aten._scaled_dot_product_flash_attention.default", "aten._scaled_dot_product_efficient_attention.default")
def _without_rng_state(recorder, func, args, kwargs, out):
    """Without dropout the fused attention kernels return their RNG state as CPU tensors
    (flash_api.cpp, mem_eff_attention); the meta kernels say CUDA."""
    if isinstance(out, tuple) and not _dropout(func, args, kwargs):
        return [o for o, r in zip(out, func._schema.returns) if r.name not in _RNG_OUTPUTS]
    return out


@rule("scratch", "aten._scaled_dot_product_flash_attention_backward.default")
def _flash_backward(recorder, func, args, kwargs, out, pending):
    """FlashAttention-2's backward scratch, after its gradients (flash_backward_scratch)."""
    import torch

    if recorder.device_type == "cuda":
        recorder._kernel_scratch(_flash_backward_scratch(torch, args), args[1])


# An H100 SXM's streaming multiprocessors (the fake device's multi_processor_count).
H100_SMS = 132


def flash_backward_scratch(batch, heads, seq_q, seq_k, head_dim, heads_k=None, elem_bytes=2, deterministic=False):
    """Bytes FlashAttention-2's backward allocates through the caching allocator besides its
    outputs, in order (mha_bwd in aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp;
    freed in reverse): softmax_d [B, H, S_q rounded to 128] fp32; the dq accumulator [B, S_q
    rounded, H, D rounded to 32 (64 past 128)] fp32, always (`bool loop = true`), split
    ceil(SMs / (B·H)) ways when deterministic; and for grouped-query attention (fewer key heads)
    dk and dv expanded to every query head, [B, S_k, H, D] in the inputs' dtype, summed into dk
    and dv after the kernel."""
    s_q_rounded = _round_up(seq_q, 128)
    d_rounded = _round_up(head_dim, 32 if head_dim <= 128 else 64)
    softmax_d = batch * heads * s_q_rounded * 4
    splits = -(-H100_SMS // (batch * heads)) if deterministic else 1
    dq_accum = splits * batch * s_q_rounded * heads * d_rounded * 4
    expanded = batch * seq_k * heads * head_dim * elem_bytes if heads_k not in (None, heads) else 0
    return [softmax_d, dq_accum, expanded, expanded]


def _flash_backward_scratch(torch, args):
    q, k = args[1], args[2]  # query [B, H, S_q, D], key [B, H_k, S_k, D]
    b, h, s_q, d = q.shape
    # _flash_attention_backward: deterministic unless deterministic algorithms only warn.
    deterministic = torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    return flash_backward_scratch(b, h, s_q, k.shape[2], d, heads_k=k.shape[1], elem_bytes=q.element_size(), deterministic=deterministic)


def _sdp_backend(torch, q, k, v, attn_mask, enable_gqa, is_causal):
    """The backend PyTorch's SDPA picks on an H100 (sm90) for these inputs, in its priority order
    flash, memory-efficient, math (select_sdp_backend, aten/src/ATen/native/transformers/cuda/
    sdp_utils.cpp; the main checks only): on fake CUDA tensors the real selection asks the driver
    for the GPU's capability and falls back to math, which materialises B·H·S² scores."""
    cuda_backends = torch.backends.cuda
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not (q.dtype == k.dtype == v.dtype):
        return "math"
    d, heads_q, heads_k = q.shape[-1], q.shape[1], k.shape[1]
    same_heads = heads_q == heads_k and k.shape[1] == v.shape[1]
    half = q.dtype in (torch.float16, torch.bfloat16)
    # check_flash_causal_non_square_seqlens: FlashAttention-2's causal mask is aligned to the lower
    # right, so a causal call whose query and key lengths differ is refused.
    causal_non_square = is_causal and q.shape[-2] != k.shape[-2]
    if (cuda_backends.flash_sdp_enabled() and half and attn_mask is None and d <= 256 and d % 8 == 0 and not causal_non_square
            and k.shape[-1] == d and v.shape[-1] == d and (same_heads or (enable_gqa and heads_q % heads_k == 0))):
        return "flash"
    if (cuda_backends.mem_efficient_sdp_enabled() and same_heads and (half or q.dtype == torch.float32)
            and d % (8 if half else 4) == 0 and k.shape[-1] == d):
        return "efficient"
    return "math"


def _mem_efficient_mask(torch, mask, query, key):
    """The mask scaled_dot_product_attention hands the memory-efficient kernel (aten/src/ATen/
    native/transformers/attention.cpp): convert_boolean_attn_mask turns a boolean mask into an
    additive one of the query's dtype (where(mask, 0, -inf), -inf a scalar tensor on the device),
    and preprocess_mask pads one that is not aligned_tensor<8> (strides but the last a multiple of
    8, the last 1) to a multiple of 8 columns (pad_bias: padded, then sliced back), then expands
    it to (B, H, L, S)."""
    if mask.dtype == torch.bool:
        neg_inf = torch.scalar_tensor(float("-inf"), dtype=query.dtype, device=mask.device)
        mask = torch.where(mask, 0.0, neg_inf)
        del neg_inf
    if not (all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1):
        columns = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, 8 - columns % 8))[..., :columns]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _fake_cuda_sdpa(torch, original):
    """scaled_dot_product_attention that dispatches to the fused kernel a GPU would run."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention.default
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention.default

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if query.device.type != "cuda":
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if torch.is_autocast_enabled("cuda"):
            # SDPA is on CUDA autocast's lower-precision list: floating inputs are cast first.
            low = torch.get_autocast_dtype("cuda")
            query, key, value = (t.to(low) if t.is_floating_point() and t.dtype != low else t for t in (query, key, value))
            if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != low:
                attn_mask = attn_mask.to(low)
        backend = _sdp_backend(torch, query, key, value, attn_mask, enable_gqa, is_causal)
        if backend == "flash":
            return flash(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if backend == "efficient":
            need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            if attn_mask is not None:
                attn_mask = _mem_efficient_mask(torch, attn_mask, query, key)
            return efficient(query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    return sdpa

