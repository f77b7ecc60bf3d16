"""Convolution: the mixed input and weight dtypes its CUDA kernel refuses."""
from __future__ import annotations

from .dtype_names import _SCALAR_TYPE
from .registry import PASS, rule


@rule("refuse", "convolution")
def _mixed_dtypes(recorder, func, args):
    """check_input_same_type_as_parameters (Convolution.cpp): an input and weight of different
    dtypes, which a fake op's meta kernel lets through, refused as the CUDA kernel refuses them."""
    import torch

    tensor_type, name = torch.Tensor, func.overloadpacket.__name__
    if name == "convolution" and len(args) > 1 and all(isinstance(t, tensor_type) and t.device.type == "cuda" for t in args[:2]) \
            and args[0].dtype != args[1].dtype:
        # check_input_same_type_as_parameters (Convolution.cpp); FakeTensor's own check is off when
        # it allows real inputs, as the capture's mode does (the bias check stays).
        legacy = [f"torch.cuda.{_SCALAR_TYPE.get(str(t.dtype).replace('torch.', ''), str(t.dtype))}Tensor" for t in args[:2]]
        raise RuntimeError(f"Input type ({legacy[0]}) and weight type ({legacy[1]}) should be the same")


_CUDNN_BACKENDS = ("Cudnn", "CudnnTranspose")


@rule("fake_run", "convolution", "convolution_backward")
def _cudnn_layout_of_bf16(recorder, func, args, kwargs):
    """A bf16 convolution on a GPU from Ampere on runs on cuDNN (use_cudnn in Convolution.cpp:
    supportsBFloat16ConvolutionWithCuDNNv8, sm >= 80), whose output and gradients take
    cudnn_conv_suggest_memory_format's layout: channels-last when the input or the weight is.
    FakeTensor has no device to ask, picks PyTorch's slow kernel and makes them contiguous, and
    then every channels-last weight's gradient is copied into its layout (AccumulateGrad). The
    backend a GPU picks is what the same convolution selects on float32 stand-ins (no other
    check of use_cudnn asks the device but dilation's)."""
    import torch

    backward = func.overloadpacket.__name__ == "convolution_backward"
    inp, weight = (args[1], args[2]) if backward else (args[0], args[1])
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    if not (isinstance(inp, fake_type) and isinstance(weight, fake_type) and inp.device.type == "cuda"
            and torch.bfloat16 in (inp.dtype, weight.dtype) and weight.dim() in (4, 5) and not kwargs):
        return PASS
    stride, padding, dilation, transposed, output_padding, groups = args[4:10] if backward else args[3:9]
    with recorder.fake_mode:
        out = func(*args)
        stand_in = lambda t: torch.empty_strided(t.shape, t.stride(), dtype=torch.float32, device=t.device)  # noqa: E731
        x, w = stand_in(inp), stand_in(weight)
        backend = torch._C._select_conv_backend(x, w, None, stride, padding, dilation, transposed, output_padding, groups, None)
        if backend.name not in _CUDNN_BACKENDS:
            return out
        layout = torch._C._conv_determine_backend_memory_format(x, w, backend)
        in_layout = lambda t: t if t is None else t.to(memory_format=layout)  # noqa: E731
        return (in_layout(out[0]), in_layout(out[1]), out[2]) if backward else in_layout(out)
