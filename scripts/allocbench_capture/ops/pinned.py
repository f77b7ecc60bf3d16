"""Pinned host memory on fake CUDA: pinning needs the driver, and host memory is not what a
capture measures, so a pinned tensor is a plain copy that is_pinned() answers True for."""
from __future__ import annotations

from .registry import rule


@rule("fake_run", "aten._pin_memory.default", "aten.is_pinned.default")
def _pinned(recorder, func, args, kwargs):
    """Pinned host memory needs the driver; it is host memory, and not what is measured: a copy,
    whose storage is_pinned() then answers True for (and for its views)."""
    import torch

    if str(func) == "aten.is_pinned.default":
        return recorder.is_pinned(args[0])
    if isinstance(args[0], torch._subclasses.fake_tensor.FakeTensor):
        with recorder.fake_mode:
            copy = torch.ops.aten.clone.default(args[0])
    else:
        copy = args[0].clone()
    return recorder.mark_pinned(copy)
