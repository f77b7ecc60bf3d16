"""Meta kernels for the CUDA ops scripts reach that have none (a fake run would otherwise call
their CUDA kernels), registered for the capture's duration. Op families register theirs with
``@meta_kernel`` (ops/ctc.py: _ctc_loss_backward); the others are here."""
from __future__ import annotations

from .registry import META_KERNELS, meta_kernel


def like(t, **kwargs):
    """A tensor shaped as ``t``, contiguous, as these CUDA kernels make their outputs."""
    import torch

    return torch.empty_like(t, memory_format=torch.contiguous_format, **kwargs)


def _with_mask(self, *rest, **kwargs):
    import torch

    return (like(self), like(self, dtype=torch.bool))


for _name, _kernel in {
    "_sample_dirichlet": lambda self, *rest, **kwargs: like(self),  # Beta/Dirichlet.rsample
    "_standard_gamma_grad": lambda self, output: like(self),  # Gamma.rsample's backward
    "_dirichlet_grad": lambda x, alpha, total: like(x),
    "multi_margin_loss_backward": lambda grad_output, self, *rest, **kwargs: like(self),
    "multilabel_margin_loss_backward": lambda grad_output, self, *rest, **kwargs: like(self),
    "fractional_max_pool3d_backward": lambda grad_output, self, *rest, **kwargs: like(self),
    "fake_quantize_per_tensor_affine_cachemask": _with_mask,
    "fake_quantize_per_channel_affine_cachemask": _with_mask,
    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": _with_mask,
    "_fake_quantize_learnable_per_tensor_affine": lambda self, *rest, **kwargs: like(self),
    "_fake_quantize_learnable_per_channel_affine": lambda self, *rest, **kwargs: like(self),
    "_fake_quantize_learnable_per_tensor_affine_backward": lambda grad, self, scale, zero_point, *rest, **kwargs: (
        like(self), like(scale), like(zero_point)),
    "_fake_quantize_learnable_per_channel_affine_backward": lambda grad, self, scale, zero_point, *rest, **kwargs: (
        like(self), like(scale), like(zero_point)),
    "geqrf": lambda self: (like(self), self.new_empty((*self.shape[:-2], min(self.shape[-2:])))),
}.items():
    meta_kernel(_name)(_kernel)

# The fused optimizers' in-place steps (SGD, Adagrad, and Adam's/AdamW's tensor-lr forms): they
# update their lists in place and make nothing, but some have no Meta kernel to say so.
_FUSED_OPTIMIZER_STEPS = ("_fused_sgd_", "_fused_adagrad_", "_fused_adam_", "_fused_adamw_")


def _missing_meta_kernels(torch, stack):
    """The Meta kernels of META_KERNELS, for the ops that have none, for the capture's duration: ops
    whose outputs are shaped as an operand, as their CUDA kernels make them (contiguous; the
    fake-quantize masks are bool), geqrf's (a, tau), and the fused optimizer steps, which make
    nothing."""
    library = torch.library.Library("aten", "IMPL")
    has_meta = lambda name: torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")  # noqa: E731
    for name, kernel in META_KERNELS.items():
        if hasattr(torch.ops.aten, name) and not has_meta(f"aten::{name}"):
            library.impl(name, kernel, "Meta")
    for name in _FUSED_OPTIMIZER_STEPS:
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if not has_meta(op.name()):
                library.impl(name if overload == "default" else f"{name}.{overload}", lambda *args, **kwargs: None, "Meta")
    stack.callback(library._destroy)
