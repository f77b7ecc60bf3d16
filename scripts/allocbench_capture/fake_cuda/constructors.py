"""Tensors made from data on fake CUDA: torch.tensor / as_tensor / asarray, sequence indices and
the legacy typed constructors (torch.cuda.FloatTensor...) copy their data to the device inside
C++, below the dispatcher; here they build on the CPU and copy into one fake CUDA tensor."""
from __future__ import annotations

import contextlib

from .. import state

@contextlib.contextmanager
def _real_cpu_from_data():
    """A CPU tensor built from Python or NumPy data stays real, however large (Note [Real CPU, fake
    CUDA]): its values are the script's, already in memory."""
    local = state.active.from_data if state.active is not None else None
    if local is not None:
        local.depth = getattr(local, "depth", 0) + 1
    try:
        yield
    finally:
        if local is not None:
            local.depth -= 1


def _constructor_via_cpu(torch, original, takes_requires_grad=True, shares=False):
    """``original`` (torch.tensor, as_tensor, asarray) for a CUDA device, made on the CPU and copied
    into one fake CUDA tensor. ``shares``: a CUDA tensor of the right dtype is returned as it is
    (as_tensor and asarray share storage; torch.tensor copies)."""

    def construct(data, *args, device=None, **kwargs):
        if device is None:
            # torch.set_default_device("cuda") and `with torch.device("cuda")` (DeviceContext) give
            # factory calls their device; the mode does not see this wrapper, so it asks.
            device = torch.utils._device.CURRENT_DEVICE
        if device is None or torch.device(device).type != "cuda":
            with _real_cpu_from_data():
                if kwargs.get("pin_memory") and state.active is not None and state.active.fake:
                    # Pinned in C++ below the dispatcher (the driver's host allocator): the same
                    # host memory made unpinned, then answered pinned as on a GPU machine.
                    return state.active.mark_pinned(original(data, *args, device=device, **{**kwargs, "pin_memory": False}))
                return original(data, *args, device=device, **kwargs)
        requires_grad = kwargs.pop("requires_grad", False) if takes_requires_grad else False
        if isinstance(data, torch.Tensor) and data.device.type == "cuda":
            dtype = kwargs.get("dtype", args[0] if args else None)
            if dtype in (None, data.dtype):
                out = data if shares and not kwargs.get("copy") else data.detach().clone()
            else:
                out = data.detach().to(dtype)
            return out.requires_grad_() if requires_grad else out
        host = original(data, *args, device="cpu", **kwargs)
        # Not host.to(device): FakeTensorMode runs ops on small constant tensors for real.
        moved = torch.empty(host.shape, dtype=host.dtype, device=device).copy_(host)
        return moved.requires_grad_() if requires_grad else moved

    return construct


def _sequence_indices(torch, patches, tensor):
    """``x[[0, 2]]``, ``x[0, [1, 2]]``, ``v[:, [-1]]`` on fake CUDA. PyTorch turns a Python
    sequence index into a CUDA tensor inside its C++ indexing (indexing_tensor_from_data in
    python_variable_indexing.cpp), below the dispatcher, so it would reach the driver: the
    sequence becomes that one small tensor here, through ``tensor`` (torch.tensor on fake CUDA),
    and lives as long as the indexing, as on the device."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original_getitem, original_setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def holds_tensors(item):
        return isinstance(item, torch.Tensor) or (
            isinstance(item, (list, tuple)) and any(holds_tensors(v) for v in item))

    def index_tensor(item, device):
        if not isinstance(item, (list, range)) or holds_tensors(item):
            return item  # (tensors in a list: PyTorch's own path stacks them on their device)
        try:
            host = torch.tensor(item, device="cpu")  # numbers, numpy scalars, nested lists
        except (TypeError, ValueError, RuntimeError):
            return item  # (what PyTorch refuses, it refuses with its own error)
        # Bool and Byte stay masks, anything else becomes Long, as indexing_tensor_from_data makes it.
        dtype = host.dtype if host.dtype in (torch.bool, torch.uint8) else torch.long
        return tensor(host.to(dtype), device=device)

    def on_device(self, index):
        if not isinstance(self, fake_type) or self.device.type != "cuda":
            return index
        if isinstance(index, list) and len(index) < 32 and any(
                isinstance(v, (torch.Tensor, list, tuple, range, slice)) or v is None or v is Ellipsis for v in index):
            index = tuple(index)  # treatSequenceAsTuple: such a list indexes as a tuple does
        if isinstance(index, tuple):
            return tuple(index_tensor(item, self.device) for item in index)
        return index_tensor(index, self.device)

    def getitem(self, index):
        return original_getitem(self, on_device(self, index))

    def setitem(self, index, value):
        return original_setitem(self, on_device(self, index), value)

    patches.set(torch.Tensor, "__getitem__", getitem)
    patches.set(torch.Tensor, "__setitem__", setitem)


def _fake_cuda_legacy_types(torch, patches):
    """torch.cuda.FloatTensor and its kin, the legacy typed constructors older scripts still use
    (``Tensor = torch.cuda.FloatTensor``; ``LongTensor(labels)``; ``x.type(Tensor)``): given data,
    or as the target of ``Tensor.type``, they copy to the device inside C++, below the dispatcher,
    and would reach the driver. Each type is replaced by a stand-in that makes the one CUDA
    allocation the real constructor makes, and is still what ``isinstance`` and ``Tensor.type``
    accept."""
    tensortype = type(torch.FloatTensor)
    cuda = torch.cuda
    sizes_only = lambda args: (len(args) == 1 and isinstance(args[0], torch.Size)) or (
        bool(args) and all(isinstance(a, int) and not isinstance(a, bool) for a in args))

    class LegacyCudaType(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, cls.original)

        def __call__(cls, *args, **kwargs):
            device = kwargs.get("device")
            if set(kwargs) - {"device"} or (device is not None and torch.device(device).type != "cuda") or any(
                    isinstance(a, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)) for a in args):
                # An alias of a tensor or storage (no copy), or a call the original refuses.
                return cls.original(*args, **kwargs)
            if sizes_only(args):
                return torch.empty(*args, dtype=cls.dtype, device="cuda")
            # Data (a sequence, an array, nothing): made on the CPU by the CPU type of the same
            # name, then copied into one fake CUDA tensor, as _constructor_via_cpu does.
            host = cls.host(*args)
            return torch.empty(host.shape, dtype=cls.dtype, device="cuda").copy_(host)

    stand_ins = {}
    for name in dir(cuda):
        original = getattr(cuda, name)
        if name.endswith("Tensor") and isinstance(original, tensortype) and hasattr(torch, name):
            stand_in = LegacyCudaType(name, (), {
                "original": original, "host": getattr(torch, name), "dtype": original.dtype,
                "is_cuda": True, "is_sparse": False, "layout": original.layout, "__module__": "torch.cuda",
            })
            stand_ins[f"torch.cuda.{name}"] = stand_in
            patches.set(cuda, name, stand_in)
    if not stand_ins:
        return

    def cuda_type_of(target):
        """The stand-in a Tensor.type target names, or None for any other target."""
        if isinstance(target, str):
            return stand_ins.get(target)
        if isinstance(target, LegacyCudaType):
            return target
        if isinstance(target, tensortype) and target.is_cuda and not target.is_sparse:
            return stand_ins.get(f"torch.cuda.{target.__name__}")
        return None

    original_type = torch.Tensor.type

    def tensor_type(self, dtype=None, non_blocking=False, **kwargs):
        target = cuda_type_of(dtype)
        if target is None:
            return original_type(self, dtype, non_blocking, **kwargs)
        # "If this is already of the correct type, no copy is performed."
        if self.is_cuda and self.dtype == target.dtype and self.layout == torch.strided:
            return self
        return self.to(device="cuda", dtype=target.dtype, non_blocking=non_blocking)

    patches.set(torch.Tensor, "type", tensor_type)
    original_set_default = torch.set_default_tensor_type

    def set_default_tensor_type(t):
        target = cuda_type_of(t)
        return original_set_default(target.original if target is not None else t)

    patches.set(torch, "set_default_tensor_type", set_default_tensor_type)
    original_new = torch.Tensor.new

    def new(self, *args, **kwargs):
        # x.new(data) of a CUDA x: the legacy constructor again (sizes and aliases dispatch).
        if (args and not kwargs and self.is_cuda and not sizes_only(args)
                and not any(isinstance(a, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)) for a in args)):
            host = original_new(torch.empty(0, dtype=self.dtype, device="cpu"), *args)
            return torch.empty(host.shape, dtype=self.dtype, device="cuda").copy_(host)
        return original_new(self, *args, **kwargs)

    patches.set(torch.Tensor, "new", new)


