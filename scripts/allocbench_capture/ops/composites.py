"""Ops whose CUDA kernel is a composite one, run as such on fake CUDA so that their parts are
recorded: the _COMPOSITES_ON_CUDA (below), and _pack_padded_sequence with real CPU lengths."""
from __future__ import annotations

from .registry import PASS, rule

# Ops whose CUDA kernel is their composite one (CompositeExplicitAutograd, no CUDA kernel of their
# own) and allocates more than the output on the way, which the meta kernel a fake run takes
# skips: run as composites on fake CUDA (Recorder._composite_on_cuda). BCEWithLogitsLoss makes
# log_sigmoid(input) and (1 - target) * input, SoftMarginLoss its elementwise loss (kept as the
# output's storage) and the mean, its backward exp(-target * input), logsumexp the shifted
# exp(self - max), dist self - other, isinf abs(self) (Loss.cpp, ReduceOps.cpp, TensorCompare.cpp).
# The window functions (TensorFactories.cpp) compute a periodic window of N as N + 1 points and
# narrow it: a meta kernel answers the view's N, and FakeTensor's dispatch cache answers it so
# from the second call on, where the composite keeps the N + 1 storage.
_COMPOSITES_ON_CUDA = frozenset({
    "binary_cross_entropy_with_logits", "soft_margin_loss", "soft_margin_loss_backward", "logsumexp", "dist", "isinf",
    "hann_window", "hamming_window", "blackman_window", "bartlett_window"})


@rule("instead", *sorted(_COMPOSITES_ON_CUDA))
def _composite_on_cuda(recorder, func, args, kwargs):
    """Its CUDA kernel is the composite one (_COMPOSITES_ON_CUDA), whose parts a meta kernel skips:
    run here with the mode pushed, each part is recorded as it runs."""
    composite = _composite_key(recorder, func, args, kwargs)
    if composite is None:
        return PASS
    with recorder:
        return func._op_dk(composite, *args, **kwargs)


def _composite_key(recorder, func, args, kwargs):
    """The composite dispatch key whose kernel a GPU runs for ``func`` on fake CUDA operands,
    when it is one of _COMPOSITES_ON_CUDA and has no CUDA kernel of its own; else None."""
    import torch

    fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor
    explicit_keys = (torch._C.DispatchKey.CompositeExplicitAutograd, torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional)
    if not recorder.fake or recorder.device_type != "cuda" or func.overloadpacket.__name__ not in _COMPOSITES_ON_CUDA:
        return None
    if func not in recorder.explicit_ops:
        has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)  # noqa: E731
        own = has(torch._C.DispatchKey.CUDA)
        recorder.explicit_ops[func] = None if own else next((key for key in explicit_keys if has(key)), None)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:  # a factory: its device argument says
        return recorder.explicit_ops[func] if torch.device(kwargs.get("device") or "cpu").type == "cuda" else None
    return recorder.explicit_ops[func] if isinstance(first, fake_tensor_type) and first.device.type == "cuda" else None


@rule("instead", "aten._pack_padded_sequence.default")
def _pack_padded_sequence(recorder, func, args, kwargs):
    """pack_padded_sequence takes its lengths on the CPU (nn.utils.rnn), real here: its kernel
    (PackedSequence.cpp, CompositeExplicitAutograd) reads them and slices, copies and concatenates
    the fake input, each part recorded as it runs. A fake run would have no lengths to read."""
    import torch

    if not recorder.fake or isinstance(args[1], torch._subclasses.fake_tensor.FakeTensor):
        return PASS
    with recorder:
        return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
