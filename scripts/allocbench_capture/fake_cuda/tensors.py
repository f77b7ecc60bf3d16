"""Fake CUDA tensors' deep copies and data pointers, as a device run makes and answers them."""
from __future__ import annotations

import copy

from ..card import _round_up
from ..fake_tensors import _view_of_buffer

def _fake_deep_copies(torch, patches, recorder):
    """``copy.deepcopy`` of a fake CUDA tensor (``best = deepcopy(model.state_dict())``). torch's
    copies the storage and ``set_``s a ``new_empty([])`` onto it; on fake tensors FakeTensorMode's
    dispatch cache keys that set_ on the storage and keeps it alive for good (each copy leaked),
    and freeing such storages crashes the interpreter. The copy here makes what a device run
    allocates without set_: one buffer of the storage's size per storage copied (tensors sharing
    one share the copy), then the new_empty that set_ frees, with the tensor a view of the buffer."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original = torch.Tensor.__deepcopy__

    def deepcopy(self, memo):
        if (type(self) is not fake_type or self.device.type != "cuda" or id(self) in memo or not self.is_leaf
                or self.is_sparse or self.is_quantized or self.is_conj() or self.is_neg()):
            return original(self, memo)
        if getattr(self, "_is_param", False):
            # A parameter on fake CUDA is a FakeTensor marked _is_param (Parameter.__new__'s way
            # for subclasses), so Parameter.__deepcopy__ is not the one Python finds. As it does
            # (torch/nn/parameter.py): a Parameter of a clone of the data, no grad, no attributes.
            with torch.no_grad():
                data = self.data.clone(memory_format=torch.preserve_format)
            recorder.copy_known(self, data)
            copied = memo[id(self)] = torch.nn.Parameter(data, self.requires_grad)
            return copied
        with torch.no_grad():
            storage = self.untyped_storage()
            key = ("allocbench deep copy of storage", storage._cdata)
            buffer = memo.get(key)
            if buffer is None:
                buffer = memo[key] = torch.empty(storage.nbytes(), dtype=torch.uint8, device=self.device)
            torch.empty((), dtype=self.dtype, device=self.device)  # new_empty([]), freed by set_
            copied = _view_of_buffer(buffer, self).detach()
            recorder.copy_known(self, copied)
        if self.requires_grad:
            copied.requires_grad_()
        if self.grad is not None:
            copied.grad = copy.deepcopy(self.grad, memo)
        for name, value in vars(self).items():
            if name not in vars(copied):  # the script's own attributes; the fake tensor's are the copy's
                vars(copied)[name] = copy.deepcopy(value, memo)
        memo[id(self)] = copied
        return copied

    patches.set(torch.Tensor, "__deepcopy__", deepcopy)


# Where fake data pointers start (an address a CUDA allocation could have).
FAKE_ADDRESS_BASE = 0x7F0000000000


def _fake_data_pointers(torch, patches, recorder):
    """data_ptr() of recorded fake storages (and their tensors): one address per allocation,
    packed in allocation order, 512-byte aligned as the caching allocator's blocks are."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original_storage_ptr, original_tensor_ptr = torch.UntypedStorage.data_ptr, fake_type.data_ptr
    addresses, top = {}, [FAKE_ADDRESS_BASE]

    def address(storage):
        entry = recorder.storages.get(storage._cdata)
        if entry is None or entry[0] is None:
            return None
        at = addresses.get(entry[0])
        if at is None:
            at = addresses[entry[0]] = top[0]
            top[0] += _round_up(max(entry[1], 1), 512)
        return at

    def storage_data_ptr(self):
        at = address(self) if self.device.type == "meta" else None
        return original_storage_ptr(self) if at is None else at

    def tensor_data_ptr(self):
        at = address(self.untyped_storage())
        return original_tensor_ptr(self) if at is None else at + self.storage_offset() * self.element_size()

    patches.set(torch.UntypedStorage, "data_ptr", storage_data_ptr)
    patches.set(fake_type, "data_ptr", tensor_data_ptr)

