"""Checkpoints on fake CUDA: torch.load onto CUDA gives each storage one fake allocation, torch.save
(and safetensors) of fake tensors writes zeros, and a file that predates the capture is kept."""
from __future__ import annotations

import os
import sys
import threading
import time

from ..fake_tensors import _view_of_buffer

def _fake_cuda_serialization(torch, patches, recorder):
    """torch.load onto CUDA and torch.save of fake tensors, as fine-tuning and checkpointing
    scripts do. Loading puts each storage bound for CUDA (map_location, or where it was saved) in
    one fake CUDA allocation of its size, as the real load's storage copy does; saving writes
    zeros of each fake tensor's shape and dtype (the values are not there)."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original_load, original_save = torch.load, torch.save

    def on_cuda(where):
        return str(where).startswith("cuda")

    def load(f, map_location=None, *args, **kwargs):
        # Load on the CPU, noting the storages bound for CUDA; then give each of those one fake
        # CUDA allocation (tensors that shared a storage share it still).
        bound = set()

        def restore(storage, location):
            if callable(map_location):
                # map_location=lambda s, loc: s.cuda() (the idiom of torch.load's docs): the
                # storage stays on the CPU, noted as bound for CUDA, instead of reaching the driver.
                def to_cuda(s, device=None, non_blocking=False, **kwargs):
                    bound.add(s._cdata)
                    return s

                cuda_methods = [(cls, cls.cuda) for cls in (torch.UntypedStorage, torch.storage.TypedStorage)]
                for cls, _ in cuda_methods:
                    cls.cuda = to_cuda
                try:
                    return map_location(storage, location)
                finally:
                    for cls, method in cuda_methods:
                        cls.cuda = method
            target = map_location.get(location, location) if isinstance(map_location, dict) else location if map_location is None else map_location
            if on_cuda(target):
                bound.add(storage._cdata)
            return storage

        loaded = original_load(f, restore, *args, **kwargs)
        if not bound:
            return loaded
        moved = {}

        def to_fake_cuda(t):
            if not isinstance(t, torch.Tensor) or isinstance(t, fake_type) or t.untyped_storage()._cdata not in bound:
                return t
            storage = t.untyped_storage()
            base = moved.get(storage._cdata)
            if base is None:
                base = moved[storage._cdata] = torch.empty(storage.nbytes(), dtype=torch.uint8, device="cuda")
            # Views of the one allocation (set_ onto a fake storage would keep it alive for good).
            out = _view_of_buffer(base, t)
            out = torch.nn.Parameter(out, t.requires_grad) if isinstance(t, torch.nn.Parameter) else out
            # A small tensor keeps its values (an optimizer's step count mapped to CUDA, read by
            # the first step): Note [Known values].
            recorder.learn_contents(out, t)
            return out

        if isinstance(loaded, torch.nn.Module):
            return loaded._apply(to_fake_cuda)
        return torch.utils._pytree.tree_map(to_fake_cuda, loaded)

    # torch.save writes zeros in place of each fake storage (views of it stay views), tagged with
    # the device the storage was on, so that loading the file back allocates where a real load
    # would. Fake tensors the pytree does not reach (inside a module, a dataclass) pickle as those
    # zeros too: FakeTensor.__reduce_ex__ and location_tag are replaced for the whole capture and
    # act only inside a save, per thread (saves may overlap on threads).
    saving = threading.local()
    serialization = torch.serialization
    original_tag, original_reduce = serialization.location_tag, fake_type.__reduce_ex__

    def zeros_like_fake(t):
        if not isinstance(t, fake_type):
            return t
        zeros, device_of = saving.current
        key = t.untyped_storage()._cdata
        # Real CPU tensors, made below every mode (the recorder would fake large ones).
        with torch.utils._python_dispatch._disable_current_modes():
            base = zeros.get(key)
            if base is None:
                # A large one is fresh pages from the kernel (glibc mmaps anything past 32 MiB),
                # zeros already: left untouched, the save reads the shared zero page and the
                # capture's RSS does not grow by the size of the model.
                nbytes = t.untyped_storage().nbytes()
                make = torch.empty if nbytes >= 64 << 20 else torch.zeros
                # (On the CPU whatever torch.set_default_device says.)
                base = zeros[key] = make(nbytes, dtype=torch.uint8, device="cpu")
                device_of[base.untyped_storage()._cdata] = str(t.device)
            return _view_of_buffer(base, t)

    def reduce_fake(t, protocol):
        if getattr(saving, "current", None) is None:
            return original_reduce(t, protocol)
        zeros = zeros_like_fake(t)
        if isinstance(t, torch.nn.Parameter) or getattr(t, "_is_param", False):
            # A module's parameter must load back as one (register_parameter checks).
            with torch.utils._python_dispatch._disable_current_modes():
                zeros = torch.nn.Parameter(zeros, requires_grad=t.requires_grad)
        return zeros.__reduce_ex__(protocol)

    def location_tag(storage):
        current = getattr(saving, "current", None)
        tag = current and current[1].get(getattr(storage, "_untyped_storage", storage)._cdata)
        return tag or original_tag(storage)

    started = time.time()
    kept, written = set(), set()
    holds_zeros = set()  # files a save of fake tensors wrote (absolute paths)
    original_replace, original_rename = os.replace, os.rename

    def predates_capture(path):
        return os.path.isfile(path) and os.path.getmtime(path) < started

    def say_kept(path, why):
        if path not in kept:
            kept.add(path)
            print(f"allocbench capture: left {path} as it was: it predates the capture, and {why}", file=sys.stderr)

    def keep_original(src, dst):
        os.remove(src)
        say_kept(dst, "the file moved onto it holds zeros for fake CUDA tensors")

    def moving(original):
        # Saving to a temporary file and renaming it onto the checkpoint (an atomic save) would
        # replace the user's checkpoint with zeros as a save straight onto it would: kept too.
        def move(src, dst, *args, **kwargs):
            if not args and not kwargs and isinstance(src, (str, bytes, os.PathLike)) and isinstance(dst, (str, bytes, os.PathLike)):
                source, target = os.path.abspath(os.fsdecode(os.fspath(src))), os.fsdecode(os.fspath(dst))
                if source in holds_zeros and predates_capture(target):
                    holds_zeros.discard(source)
                    return keep_original(source, target)
            return original(src, dst, *args, **kwargs)

        return move

    def save(obj, f, *args, **kwargs):
        # A file that was there before the capture (the user's checkpoint) is not replaced by
        # one that holds zeros for its fake tensors: the save goes to a file beside it, which
        # replaces it only when no fake storage was written (said once per file). A file object
        # is the script's own to guard.
        path = os.fsdecode(os.fspath(f)) if isinstance(f, (str, bytes, os.PathLike)) else None
        guarded = path is not None and path not in written and predates_capture(path)
        target = f"{path}.allocbench-{os.getpid()}.tmp" if guarded else f
        outer = getattr(saving, "current", None)
        saving.current = ({}, {})
        try:
            result = original_save(torch.utils._pytree.tree_map(zeros_like_fake, obj), target, *args, **kwargs)
            if guarded and saving.current[0]:
                os.remove(target)
                say_kept(path, "a save of fake CUDA tensors holds zeros")
            elif guarded:
                original_replace(target, path)
            elif path is not None and saving.current[0]:
                holds_zeros.add(os.path.abspath(path))
            if path is not None and not (guarded and path in kept):
                written.add(path)
            return result
        except BaseException:
            if guarded and os.path.exists(target):
                os.remove(target)
            raise
        finally:
            saving.current = outer

    patches.set(fake_type, "__reduce_ex__", reduce_fake)
    patches.set(serialization, "location_tag", location_tag)
    patches.set(torch, "load", load)
    patches.set(torch, "save", save)
    patches.set(os, "replace", moving(original_replace))
    patches.set(os, "rename", moving(original_rename))
    # safetensors (transformers' save_pretrained) copies each tensor's bytes from its data
    # pointer: a fake tensor's are zeros of its size.
    try:
        import safetensors.torch as safetensors_torch
    except Exception:  # noqa: BLE001 - not installed, or broken: nothing to patch
        safetensors_torch = None
    original_tobytes = getattr(safetensors_torch, "_tobytes", None)  # safetensors < 0.6
    if original_tobytes is not None:

        def tobytes(tensor, name, *args, **kwargs):
            if isinstance(tensor, fake_type):
                return bytes(tensor.numel() * tensor.element_size())
            return original_tobytes(tensor, name, *args, **kwargs)

        patches.set(safetensors_torch, "_tobytes", tobytes)
    original_to_ndarray = getattr(safetensors_torch, "_to_ndarray", None)  # safetensors ≥ 0.6: (array, tensor)
    if original_to_ndarray is not None:

        def to_ndarray(tensor, *args, **kwargs):
            if isinstance(tensor, fake_type):
                import numpy

                return numpy.zeros(tensor.numel() * tensor.element_size(), dtype=numpy.uint8), tensor
            return original_to_ndarray(tensor, *args, **kwargs)

        patches.set(safetensors_torch, "_to_ndarray", to_ndarray)
