"""Convolution: the mixed input and weight dtypes its CUDA kernel refuses."""
from __future__ import annotations

from .dtype_names import _SCALAR_TYPE
from .registry import rule


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
