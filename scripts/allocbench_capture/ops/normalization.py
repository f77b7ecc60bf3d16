"""Batch norm's backward on a GPU: the order its CUDA kernels allocate in."""
from __future__ import annotations

from .registry import rule

_BACKWARD = ("native_batch_norm_backward", "batch_norm_backward")


def _channels_last_kernels(t):
    """batch_norm_use_channels_last_kernels (Normalization.cuh)."""
    import torch

    return (t.is_contiguous(memory_format=torch.channels_last) or t.is_contiguous(memory_format=torch.channels_last_3d)
            or (t.is_contiguous() and t.dim() > 1 and t.stride(1) == 1))


def _split(recorder, args):
    """Whether batch_norm_backward_cuda (Normalization.cu) reduces first and computes grad_input
    after, rather than in its fused kernel: training, on the captured device, with the
    channels-last kernels or without an input gradient. Then it allocates sum_dy and
    sum_dy_xmu (when grad_input is wanted), grad_weight and grad_bias, then grad_input, and
    frees the two sums when it returns."""
    import torch

    grad_out, inp, train, mask = args[0], args[1], args[7], args[9]
    return (recorder.fake and isinstance(inp, torch.Tensor) and inp.device.type == recorder.device_type and train and grad_out is not None
            and (not mask[0] or _channels_last_kernels(inp)))


@rule("before_kernel", *_BACKWARD)
def _reduction_sums(recorder, func, args, kwargs):
    if kwargs or not _split(recorder, args) or not args[9][0] or args[5] is None:
        return None
    mean = args[5]
    n = mean.numel() * mean.element_size()
    return [(recorder._alloc(n, mean), n) for _ in range(2)]


@rule("outputs", *_BACKWARD)
def _reduce_then_input(recorder, func, args, kwargs, out):
    if kwargs or not _split(recorder, args):
        return out
    return (out[1], out[2], out[0])


@rule("scratch", *_BACKWARD)
def _sums_freed(recorder, func, args, kwargs, out, pending):
    for trace_id, n in reversed(pending or []):
        recorder.sink.free(trace_id, n)
