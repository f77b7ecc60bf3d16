"""What fake tensors (FakeTensorMode: shapes, no data) need to run scripts as real ones do.

GradScaler's finite step, formatting, swapping a fake parameter's data (Module._apply, lazy
modules' placeholders), the optimizers' foreach paths; FakeTensorMode's logged meta failures and
device init; and the bounds of Note [Real CPU, fake CUDA]. Used on fake CUDA and fake CPU alike."""
from __future__ import annotations

import types

from .errors import FakeValueNeeded

# CPU factories making at most this many bytes of floating tensors run for real under fake CUDA,
# and CPU ops on real tensors up to the second bound (Note [Real CPU, fake CUDA]).
_REAL_CPU_BYTES = 1 << 20
_REAL_CPU_DERIVED_BYTES = 1 << 30


def _view_of_buffer(buffer, like):
    """A tensor of ``like``'s dtype, shape, strides and offset over the byte buffer ``buffer``
    (one allocation standing for ``like``'s storage)."""
    whole = buffer[: buffer.numel() - buffer.numel() % like.element_size()]
    return whole.view(like.dtype).as_strided(like.shape, like.stride(), like.storage_offset())



def _fake_tensor_fixes(torch, patches):
    """What scripts do that fake tensors would otherwise refuse."""
    # GradScaler reads found_inf with .item() before optimizer.step(); fake tensors have no value,
    # and a finite step is what a healthy run takes.
    from torch.amp import grad_scaler

    def maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    patches.set(grad_scaler.GradScaler, "_maybe_opt_step", maybe_opt_step)
    # f"{loss:.4f}": Tensor.__format__ formats a 0-d tensor as its value only when its type is
    # exactly Tensor; a fake one is a subclass, so formatted as an object, which takes no spec.
    fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor

    def format_value(self, spec):
        if self.dim() == 0:
            try:
                return self.item().__format__(spec)  # the value as .item() answers it (--scalar-value)
            except FakeValueNeeded as e:
                if spec:
                    raise
                e.handled = True
                # f"{loss}": formatted as the tensor it is (its repr), as before, not a stop.
        return object.__format__(self, spec)

    patches.set(fake_tensor_type, "__format__", format_value)
    # Module.cuda() swaps parameters with torch.utils.swap_tensors, which refuses tensors with
    # weak references, and FakeTensorMode keeps one to every fake tensor it makes.
    original_swap = torch.utils.swap_tensors
    fake_type = torch._subclasses.fake_tensor.FakeTensor

    def swap_tensors(t1, t2):
        if isinstance(t1, fake_type) or isinstance(t2, fake_type):
            real_weakref = torch.utils.weakref
            shim = types.SimpleNamespace(getweakrefs=lambda obj: [])
            try:
                torch.utils.weakref = shim
                return original_swap(t1, t2)
            finally:
                torch.utils.weakref = real_weakref
        return original_swap(t1, t2)

    patches.set(torch.utils, "swap_tensors", swap_tensors)
    patches.set(torch.nn.Module, "_apply", _module_apply_as_on_a_device(torch, torch.nn.Module._apply, swap_tensors))
    _lazy_placeholders(torch, patches, swap_tensors)
    # Optimizers and clip_grad_norm_ take their foreach paths only for plain tensor types; on CUDA a
    # script's default AdamW is foreach (whole-list temporaries), and fake tensors must take it too.
    import importlib

    for name in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        module = importlib.import_module(name)
        types_list = getattr(module, "_foreach_supported_types", None)
        if isinstance(types_list, list) and fake_type not in types_list:
            patches.set(module, "_foreach_supported_types", [*types_list, fake_type])


def _module_apply_as_on_a_device(torch, original, swap_tensors):
    """Module._apply (``.cuda()``, ``.half()``, ``.to(...)``, ``to_empty``) with fake parameters as it
    runs on real ones. Module._apply swaps a fake parameter's tensors (it cannot ``param.data =``
    one), and its loop variable then holds the old data until the next parameter is converted: one
    parameter more is live than on a GPU, where ``param.data = new`` frees the old data at once. And
    a meta parameter (``with torch.device("meta")``, then ``to_empty``) gets a new Parameter per
    module on a GPU, which unties tied weights, while the swap kept them tied. And a real CPU
    parameter (a small model's) moved to fake CUDA got a new Parameter per module, untying tied
    weights that ``.cuda()`` keeps tied on a GPU. Here the parameter keeps its identity (as
    ``param.data = new`` does) and the old data dies at once, or a meta one is replaced, as on the
    device. (torch's own _apply runs where it swaps anyway: the swap-on-conversion flag, tensor
    subclasses such as DTensor.)"""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    fake_type = torch._subclasses.fake_tensor.FakeTensor
    Parameter = torch.nn.Parameter
    is_lazy = torch.nn.parameter.is_lazy

    def retarget_lazy(placeholder, fn):
        """A lazy module's placeholder moves or converts without data (see _lazy_placeholders)."""
        # An empty tensor where the placeholder will materialize shows where fn takes it.
        probe = convert(fn, torch.empty(0, dtype=placeholder.dtype, device=vars(placeholder).get(LAZY_DEVICE, "cpu")))
        if isinstance(probe, fake_type):
            placeholder.data = torch.empty(0, dtype=probe.dtype, device="cpu")
            vars(placeholder)[LAZY_DEVICE] = probe.device
        else:
            placeholder.data = probe
            vars(placeholder).pop(LAZY_DEVICE, None)

    def convert(fn, tensor):
        with torch.no_grad():
            return fn(tensor)

    def apply(self, fn, recurse=True):
        if torch.__future__.get_swap_module_params_on_conversion() or any(
                is_traceable_wrapper_subclass(p) and not isinstance(p, fake_type) for p in self._parameters.values() if p is not None):
            return original(self, fn, recurse)
        if recurse:
            for module in self.children():
                module._apply(fn)
        for key, param in self._parameters.items():
            if param is None:
                continue
            if is_lazy(param):
                retarget_lazy(param, fn)
                continue
            applied = convert(fn, param)
            grad = param.grad
            # compute_should_use_set_data: a meta tensor's data cannot be set to a dense one's.
            if param.is_meta != applied.is_meta or torch.__future__.get_overwrite_module_params_on_conversion():
                out = Parameter(applied, param.requires_grad)
                self._parameters[key] = out
                if grad is not None:
                    out.grad = convert(fn, grad).requires_grad_(grad.requires_grad)
                continue
            if applied is param:
                pass
            elif not isinstance(param, fake_type) and not isinstance(applied, fake_type):
                param.data = applied  # real tensors: what torch does
            else:
                replaced = Parameter(applied, requires_grad=param.requires_grad)
                # The swap trades __dict__ too: the script's attributes on the parameter stay.
                for name, value in vars(param).items():
                    vars(replaced).setdefault(name, value)
                try:
                    param.grad = None
                    swap_tensors(param, replaced)
                except RuntimeError:
                    # A tensor others hold (a view of it, weight_norm's, a live graph) cannot be
                    # swapped: a new Parameter then, as torch does when it cannot set the data.
                    param.grad = grad
                    out = Parameter(applied, param.requires_grad)
                    self._parameters[key] = out
                    if grad is not None:
                        out.grad = convert(fn, grad).requires_grad_(grad.requires_grad)
                    continue
                del applied, replaced  # the old data, dead now unless the script holds it (param.data = new)
            if grad is not None:
                grad_applied = convert(fn, grad)
                if not isinstance(grad, fake_type) and not isinstance(grad_applied, fake_type):
                    param.grad = grad
                    param.grad.data = grad_applied
                elif grad_applied is not grad:
                    grad_applied.requires_grad_(grad.requires_grad)
                    swap_tensors(grad, grad_applied)
                    del grad_applied
                param.grad = grad
        for key, buf in self._buffers.items():
            if buf is not None and is_lazy(buf):
                retarget_lazy(buf, fn)
            elif buf is not None:
                self._buffers[key] = fn(buf)
        return self

    return apply


# Where a lazy module's CPU placeholder will materialize (a fake CUDA device).
LAZY_DEVICE = "_allocbench_lazy_device"


def _lazy_placeholders(torch, patches, swap_tensors):
    """Lazy modules (nn.LazyLinear, LazyConv2d, LazyBatchNorm2d) hold empty uninitialized
    placeholders until their first forward materializes them. A fake CUDA tensor cannot be one
    (dispatch refuses the subclass), so a CUDA placeholder stays an empty CPU tensor that remembers
    its device (``.cuda()`` included, see _module_apply_as_on_a_device), and materialize makes the
    fake CUDA tensor there: one allocation of the inferred shape, as on the device."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, UninitializedTensorMixin

    def is_cuda(device):
        return device is not None and torch.device(device).type == "cuda"

    for cls in (UninitializedParameter, UninitializedBuffer):
        def new(cls_, requires_grad=cls is UninitializedParameter, device=None, dtype=None, _original=cls.__new__):
            if device is None:
                device = torch.utils._device.CURRENT_DEVICE  # `with torch.device("cuda")`
            if not is_cuda(device):
                return _original(cls_, requires_grad, device, dtype)
            placeholder = _original(cls_, requires_grad, "cpu", dtype)
            vars(placeholder)[LAZY_DEVICE] = torch.device(device)
            return placeholder

        patches.set(cls, "__new__", staticmethod(new))
    original_materialize = UninitializedTensorMixin.materialize

    def materialize(self, shape, device=None, dtype=None):
        if device is None:
            device = vars(self).get(LAZY_DEVICE)
        if not is_cuda(device):
            return original_materialize(self, shape, device, dtype)
        data = torch.empty(shape, device=device, dtype=self.data.dtype if dtype is None else dtype)
        made = torch.nn.Parameter(data, self.requires_grad) if self.cls_to_become is torch.nn.Parameter else data
        for name, value in vars(self).items():
            if name != LAZY_DEVICE:
                vars(made).setdefault(name, value)
        swap_tensors(self, made)  # the placeholder becomes the tensor, as ``self.data =`` makes it

    patches.set(UninitializedTensorMixin, "materialize", materialize)
    for cls in (UninitializedParameter, UninitializedBuffer):
        if "__deepcopy__" not in vars(cls):
            continue  # Tensor's own deep copy keeps the instance's attributes

        def deepcopy(self, memo, _original=vars(cls)["__deepcopy__"]):
            # torch's copy is made on the placeholder's (CPU) device: keep where it materializes.
            copied = _original(self, memo)
            if LAZY_DEVICE in vars(self):
                vars(copied)[LAZY_DEVICE] = vars(self)[LAZY_DEVICE]
            return copied

        patches.set(cls, "__deepcopy__", deepcopy)


def _quiet_meta_failures(patches):
    """FakeTensorMode logs "failed while attempting to run meta for OP" with a traceback each time a
    meta kernel raises (a shape error the script may even catch); on a GPU the op raises and nothing
    is logged, so the records are dropped (the error itself still reaches the script)."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")

    def keep(record):
        return not str(record.msg).startswith("failed while attempting to run meta")

    patches.set(logger, "filters", [*logger.filters, keep])


def _no_device_init(fake_mode_type):
    """FakeTensorMode that never runs a device copy for real: it asks torch.cuda.is_available(),
    which the fake CUDA API answers True."""

    class NoDeviceInit(fake_mode_type):
        @property
        def avoid_device_init(self):
            return True

    return NoDeviceInit


