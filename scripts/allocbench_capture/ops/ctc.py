"""CTC loss (F.ctc_loss: aten._ctc_loss and its backward) on fake CUDA.

PyTorch's native CUDA kernels are what a capture runs and records (cuDNN's CTC needs the driver,
and sizes its workspace by its own heuristics): the library checks answer "no"; lengths in CPU
tensors are read as a GPU run reads them (the Tensor overloads, torch.ctc_loss's patch); the
kernels' shapes, their buffers before and after the outputs, and the backward's Meta kernel."""
from __future__ import annotations

import functools

from .meta_kernels import like
from .registry import PASS, meta_kernel, rule

_CTC_FORWARD, _CTC_BACKWARD = "aten._ctc_loss.default", "aten._ctc_loss_backward.default"
_CUDNN_CHECKS = ("aten._use_cudnn_ctc_loss.default", "aten._use_cudnn_ctc_loss.Tensor")
_MIOPEN_CHECKS = ("aten._use_miopen_ctc_loss.default", "aten._use_miopen_ctc_loss.Tensor")


def _ctc_use_cudnn(torch, args, kwargs):
    """_use_cudnn_ctc_loss (aten/src/ATen/native/cudnn/LossCTC.cpp) on fake CUDA: cuDNN's CTC loss
    takes float32 log-probs on the GPU, blank 0, 1-D int32 targets on the CPU (any device for the
    Tensor overload, with int32 lengths), every input length T (IntArrayRef overload) and target
    lengths under 256, none above its input's."""
    log_probs, targets, input_lengths, target_lengths = args[:4]
    blank = kwargs.get("blank", args[4] if len(args) > 4 else 0)
    tensor_lengths = isinstance(input_lengths, torch.Tensor)
    if tensor_lengths:
        if input_lengths.dtype != torch.int32 or target_lengths.dtype != torch.int32:
            return False
        if any(t.device.type != "cpu" for t in (input_lengths, target_lengths)):
            return None  # the lengths' values are on the fake device: unknown here
        input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
    ok = (torch.backends.cudnn.enabled and blank == 0 and targets.dim() == 1 and targets.dtype == torch.int32
          and (tensor_lengths or targets.device.type == "cpu") and targets.is_contiguous()
          and log_probs.dtype == torch.float32 and log_probs.device.type == "cuda" and log_probs.dim() == 3)
    if not ok:
        return False
    T = log_probs.shape[0]
    if not tensor_lengths and any(length != T for length in input_lengths):
        return False
    return all(t < 256 and t <= i for t, i in zip(target_lengths, input_lengths))



def _native_kernels_recorded(recorder):
    """The native CUDA kernels' own buffers are recorded: on fake CUDA."""
    return recorder.device_type == "cuda" and recorder.fake


@rule("instead", *_CUDNN_CHECKS, *_MIOPEN_CHECKS)
def _ctc_uses_library(recorder, func, args, kwargs):
    """_use_cudnn_ctc_loss / _use_miopen_ctc_loss on fake CUDA: PyTorch's own kernel runs. cuDNN's
    (its inputs qualify) sizes a workspace by its own heuristics, so it is said once and
    replaced by the native kernel's allocations; MIOpen is ROCm's."""
    import torch

    if not recorder.fake:
        return PASS
    if str(func) in _CUDNN_CHECKS and _ctc_use_cudnn(torch, args, kwargs) is not False:
        recorder.say_once("F.ctc_loss", "runs PyTorch's CUDA kernel on fake CUDA where a GPU may run cuDNN's (int32 targets on the CPU, "
                      "blank 0): cuDNN's workspace is its own choice", "PyTorch's CTC kernel in place of cuDNN's")
    return False


@rule("instead", "aten._ctc_loss.Tensor", "aten._ctc_loss_backward.Tensor")
def _ctc_length_tensors(recorder, func, args, kwargs):
    """ctc_loss_tensor (LossCTC.cpp) reads its CPU lengths and calls the IntArrayRef kernel, as does
    its backward: recorded as that runs."""
    import torch

    fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor
    if not recorder.fake or any(isinstance(a, fake_tensor_type) for a in args[2:4]):
        return PASS
    aten = torch.ops.aten
    kernel = aten._ctc_loss.default if str(func) == "aten._ctc_loss.Tensor" else aten._ctc_loss_backward.default
    lengths = [a.tolist() if isinstance(a, torch.Tensor) else a for a in args[2:4]]
    with recorder:
        return kernel(*args[:2], *lengths, *args[4:], **kwargs)


@rule("before_kernel", _CTC_FORWARD, _CTC_BACKWARD)
def _ctc_lengths(recorder, func, args, kwargs):
    """The native CTC kernels' first buffers (aten/src/ATen/native/cuda/LossCTC.cu): the target
    and input lengths and the targets' batch offsets on the device (B int64 each), and in
    the backward log_beta (like log_alpha); freed when the kernel returns."""
    if not _native_kernels_recorded(recorder):
        return None
    backward = str(func) == _CTC_BACKWARD
    log_probs = args[1] if backward else args[0]
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    sizes = [batch * 8] * 3 + ([args[6].numel() * args[6].element_size()] if backward else [])
    return [(recorder._alloc(n, log_probs), n) for n in sizes]


@rule("fake_run", _CTC_FORWARD)
def _ctc_shapes(recorder, func, args, kwargs):
    """FakeTensor takes _ctc_loss's shape for data-dependent, but its lengths are ints:
    neg_log_likelihood (B), log_alpha (B, T, 2·max target length + 1) (LossCTC.cu)."""
    import torch

    if not isinstance(args[0], torch._subclasses.fake_tensor.FakeTensor):
        return PASS
    fake_mode = recorder.fake_mode
    log_probs, target_lengths = args[0], args[3]
    like = {"dtype": log_probs.dtype, "device": log_probs.device}
    with fake_mode:
        return (torch.empty((log_probs.shape[1],), **like),
                torch.empty((log_probs.shape[1], log_probs.shape[0], 2 * max(target_lengths, default=0) + 1), **like))


@rule("outputs", _CTC_FORWARD)
def _ctc_outputs(recorder, func, args, kwargs, out):
    """ctc_loss_gpu_template allocates log_alpha, then neg_log_likelihood (its outputs' reverse order)."""
    if not _native_kernels_recorded(recorder):
        return out
    return (out[1], out[0])


@rule("scratch", _CTC_FORWARD, _CTC_BACKWARD)
def _ctc_scratch(recorder, func, args, kwargs, out, pending):
    """The backward's blank gradient, then the lengths' buffers freed (the kernel returns)."""
    if pending is None:
        return
    if str(func) == _CTC_BACKWARD:
        _ctc_backward_blank_gradient(recorder, args)
    for trace_id, n in reversed(pending):
        recorder.sink.free(trace_id, n)


def _ctc_backward_blank_gradient(recorder, args):
    """ctc_loss_backward_gpu_template with many time steps or classes (2T + 24B/10 + 2C/10 > 450):
    the blank gradient's log-sum-exp over log_alpha + log_beta (every other s), after the
    gradient: the sum, then logsumexp's max, |max| and its isinf mask (freed), the shifted
    copy, the reduced sum (the copy freed), the max freed; the sum and its result freed last."""
    log_probs, log_alpha = args[1], args[6]
    T, B, C = log_probs.shape if log_probs.dim() == 3 else (log_probs.shape[0], 1, log_probs.shape[1])
    if 2 * T + (24 * B) // 10 + (2 * C) // 10 <= 450:
        return
    e, S = log_probs.element_size(), (log_alpha.shape[-1] - 1) // 2
    pair, row = B * T * (S + 1) * e, B * T * e
    summed = recorder._alloc(pair, log_probs)
    maxes = recorder._alloc(row, log_probs)
    magnitude, infinite = recorder._alloc(row, log_probs), recorder._alloc(B * T, log_probs)
    recorder.sink.free(infinite, B * T)
    recorder.sink.free(magnitude, row)
    shifted = recorder._alloc(pair, log_probs)
    result = recorder._alloc(row, log_probs)
    recorder.sink.free(shifted, pair)
    recorder.sink.free(maxes, row)
    recorder.sink.free(result, row)
    recorder.sink.free(summed, pair)


@meta_kernel("_ctc_loss_backward")
def _ctc_loss_backward_meta(grad, log_probs, *rest, **kwargs):
    """_ctc_loss_backward's gradient: full_like(log_probs, -inf, LEGACY_CONTIGUOUS_MEMORY_FORMAT) in LossCTC.cu."""
    return like(log_probs)


def _ctc_loss_with_host_lengths(torch, original):
    """torch.ctc_loss of fake CUDA log-probs with lengths in CPU tensors: ctc_loss (LossCTC.cpp) copies
    them to lists and runs the IntArrayRef overload, but takes the Tensor one for a tensor subclass,
    which a fake tensor is (and whose 'mean' would divide by the CPU lengths): lists here too."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor

    def ctc_loss(log_probs, targets, input_lengths, target_lengths, *args, **kwargs):
        lengths = (input_lengths, target_lengths)
        if isinstance(log_probs, fake_type) and all(isinstance(t, torch.Tensor) and not isinstance(t, fake_type) and t.device.type == "cpu" for t in lengths):
            input_lengths, target_lengths = (t.tolist() for t in lengths)
        return original(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)

    functools.update_wrapper(ctc_loss, original)
    return ctc_loss
