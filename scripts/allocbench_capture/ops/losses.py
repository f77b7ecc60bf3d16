"""Loss kernels: the elementwise storage and buffers their CUDA kernels make that the meta kernels
do not (_LOSS_KERNELS), and the nll_loss targets the CUDA kernels refuse."""
from __future__ import annotations

import math

from .dtype_names import _SCALAR_TYPE
from .registry import rule

# Loss kernels that reduce into or through an elementwise loss the meta kernel does not make
# (Loss.cpp, Loss.cu): name -> (position of `reduction`, whether the output keeps the elementwise
# storage, the kernel's buffer). mse_loss and smooth_l1_loss are structured: the meta step makes
# the elementwise output and resize_({}) keeps its storage, then the kernel computes the
# elementwise loss into a temporary ("elementwise", after the output) and reduces it into the
# output. binary_cross_entropy writes the loss into empty_like(input), reduces it into a 0-dim
# temporary ("scalar") and resize_as_ keeps the storage. huber_loss computes the elementwise loss
# into a temporary first ("before") and reduces it into a fresh output. Without a reduction
# (Reduction::None) each writes the elementwise loss as its output, and nothing more.
# soft_margin_loss runs as its composite on fake CUDA (_COMPOSITES_ON_CUDA), which keeps the
# storage itself; its entry gives fake CPU tensors the storage a CPU run keeps.
_LOSS_KERNELS = {
    "soft_margin_loss": (2, True, "scalar"),
    "mse_loss": (2, True, "elementwise"),
    "smooth_l1_loss": (2, True, "elementwise"),
    "binary_cross_entropy": (3, True, "scalar"),
    "huber_loss": (2, False, "before"),
}


@rule("output_storage", *_LOSS_KERNELS)
def _loss_kernel(recorder, func, args, kwargs, out):
    """_LOSS_KERNELS: the output's storage as the kernel leaves it (elementwise-sized, on any
    device: the CPU kernels share the code), and on CUDA the kernel's own buffers:
    (buffers allocated before the output, as (trace id, bytes), to free after it; sizes of
    the buffers allocated and freed after it)."""
    import torch

    name = func.overloadpacket.__name__
    if not (recorder.fake and func._overloadname == "default" and isinstance(out, torch.Tensor)):
        return None
    position, elementwise_output, scratch = _LOSS_KERNELS[name]
    reduction = kwargs.get("reduction", args[position] if len(args) > position else 1)
    if reduction == 0:  # Reduction::None: the elementwise loss is the output
        return [], []
    shape = torch.broadcast_shapes(args[0].shape, args[1].shape) if name != "binary_cross_entropy" else args[0].shape
    elementwise = math.prod(shape) * out.element_size()
    if elementwise_output:
        storage = out.untyped_storage()
        if storage.nbytes() < elementwise and storage._cdata not in recorder.storages:
            storage.resize_(elementwise)
    if recorder.device_type != "cuda":
        return [], []
    if scratch == "before":
        return [(recorder._alloc(elementwise, out), elementwise)], []
    return [], [elementwise if scratch == "elementwise" else out.element_size()]


@rule("scratch", *_LOSS_KERNELS)
def _loss_scratch(recorder, func, args, kwargs, out, pending):
    """The buffers made before the output freed, then those made and freed after it."""
    if pending is None:
        return
    scratch_before, loss_scratch_after = pending
    for trace_id, n in scratch_before:
        recorder.sink.free(trace_id, n)
    if loss_scratch_after:
        recorder._kernel_scratch(loss_scratch_after, out)


@rule("refuse", "nll_loss_forward", "nll_loss2d_forward")
def _nll_loss_target(recorder, func, args):
    """nll_loss with a target that is not Long or Byte (AT_DISPATCH_NLL_LOSS_INDEX_TYPES;
    cross_entropy's int32 targets), which a fake op's meta kernel lets through, refused as the
    CUDA kernel refuses it."""
    import torch

    tensor_type, name = torch.Tensor, func.overloadpacket.__name__
    if name in ("nll_loss_forward", "nll_loss2d_forward") and len(args) > 1:
        target = args[1]
        if isinstance(target, tensor_type) and target.device.type == "cuda" and str(target.dtype) not in ("torch.int64", "torch.uint8"):
            kernel = "nll_loss_forward_reduce_cuda_kernel_2d_index" if name == "nll_loss_forward" else "nll_loss2d_forward_kernel"
            raise NotImplementedError(f'"{kernel}" not implemented for \'{_SCALAR_TYPE.get(str(target.dtype).replace("torch.", ""), str(target.dtype))}\'')
