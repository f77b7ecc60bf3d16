"""Autograd under a dispatch mode: the in-place sums and writes an untraced run makes.

isTensorSubclassLike() is true whenever a dispatch mode is active, so under a capture the
autograd engine and some formulas take out-of-place branches that allocate what an untraced run
never does (see the three notes). The recorder undoes each: the engine's gradient sums run in
place (``_engine_add``), and an out-of-place result takes over the temporary's allocation
(``_in_place_in_an_untraced_backward``, linear's bias add)."""
from __future__ import annotations



# Note [Gradient accumulation under a dispatch mode]: the autograd engine sums gradients in place
# when it may: AccumulateGrad adds a new gradient into an existing .grad (`variable_grad +=
# new_grad`) and InputBuffer::accumulate adds into a buffered gradient it holds the only reference
# to (torch/csrc/autograd/functions/accumulate_grad.h, input_buffer.cpp). Both fall back to an
# out-of-place `a + b` for "subclass-like" tensors, and isTensorSubclassLike() is true for fake
# tensors and whenever a dispatch mode is active: under a capture every such sum would allocate a
# gradient-sized tensor that a plain run never allocates. The recorder does these sums in place
# instead, under the engine's own conditions; the reference count the engine tests (1) is seen
# from inside a dispatch mode with a constant offset, measured once per capture by a probe.


def _engine_add(torch, func_is_add, args, kwargs, exclusive_use_count):
    """True when this add.Tensor is the engine summing two gradients, which an untraced run does in place."""
    if not func_is_add or torch.is_grad_enabled() or len(args) < 2 or kwargs.get("alpha", 1) != 1:
        return False
    node = torch._C._current_autograd_node()
    if node is None:
        return False
    old, new = args[0], args[1]
    if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
        return False
    if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
        return False
    if node.name().endswith("AccumulateGrad"):
        return True  # `variable_grad += new_grad` does not depend on reference counts
    if exclusive_use_count is None or old._use_count() > exclusive_use_count or not _non_overlapping_and_dense(old):
        return False
    return torch._C._storage_Use_Count(old.untyped_storage()._cdata) <= 2


# Note [linear's bias add]: at::linear (aten/src/ATen/native/Linear.cpp), when it cannot fuse the
# bias into addmm (an input of 3 or more dims that is not contiguous, as nn.MultiheadAttention's
# batch_first input is), computes matmul(input, weight.t()) and then adds the bias in place,
# `output.add_(bias)`, unless isTensorSubclassLike(bias) -- "for composite compliance" it then
# uses an out-of-place `at::add`. isTensorSubclassLike() is true whenever a dispatch mode is
# active, so under a capture the add would allocate a second output-sized tensor that an untraced
# run never allocates. The recorder lets the add's output take over the matmul output's
# allocation instead: one buffer, as in the untraced run (forward-mode AD, the other reason for
# the out-of-place add, is not taken into account).


# Note [Out-of-place backward formulas]: isTensorSubclassLike() is true whenever a dispatch mode is
# active (as for linear's bias add above), so under a capture these backward formulas
# (torch/csrc/autograd/FunctionsManual.cpp) take their branch "for composite compliance": out of
# place on a fresh temporary (gather_backward's new_zeros(...).scatter_add, index_backward's
# zeros.index_put, value_selecting_reduction_backward's zeros.scatter for topk, sort, max/min
# over a dim..., binary_cross_entropy_with_logits_backward's sigmoid().sub(target).mul(grad)),
# where an untraced run (grad mode off) writes the same temporary in place. The out-of-place
# result takes over the temporary's allocation: one buffer, as in the untraced run.
_VALUE_SELECTING = {"aten.scatter.src"}
_IN_PLACE_IN_UNTRACED_BACKWARD = {
    "GatherBackward0": {"aten.scatter_add.default"},
    "IndexBackward0": {"aten.index_put.default"},
    "IndexSelectBackward0": {"aten.index_add.default"},
    "TakeBackward0": {"aten.put.default"},
    "BinaryCrossEntropyWithLogitsBackward0": {"aten.sub.Tensor", "aten.mul.Tensor"},
    **{node: _VALUE_SELECTING for node in (
        "TopkBackward0", "SortBackward0", "SortBackward1", "KthvalueBackward0", "MaxBackward0", "MinBackward0",
        "MedianBackward1", "NanmedianBackward1", "ModeBackward0", "CummaxBackward0", "CumminBackward0")},
}


_IN_PLACE_OPS = frozenset(op for ops in _IN_PLACE_IN_UNTRACED_BACKWARD.values() for op in ops)


def _in_place_in_an_untraced_backward(torch, func, args, out):
    """Whether this op, in the backward formula running now, writes its first operand in place in
    an untraced run: an operand only the formula holds (a temporary), of the result's layout. (The
    running node is asked last: only for the few ops that qualify.)"""
    if torch.is_grad_enabled() or not args or str(func) not in _IN_PLACE_OPS:
        return False
    old = args[0]
    if not isinstance(old, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if old.shape != out.shape or old.dtype != out.dtype or not _non_overlapping_and_dense(old):
        return False
    if torch._C._storage_Use_Count(old.untyped_storage()._cdata) > 2:
        return False
    node = torch._C._current_autograd_node()
    return node is not None and str(func) in _IN_PLACE_IN_UNTRACED_BACKWARD.get(node.name(), ())


def _linear_bias_add_in_place(torch, patches, recorder):
    functional = torch.nn.functional
    original = functional.linear

    def linear(input, weight, bias=None):
        if bias is None or recorder.closed:
            return original(input, weight, bias)
        recorder.linear_bias_add = True
        try:
            return original(input, weight, bias)
        finally:
            recorder.linear_bias_add = False

    patches.set(functional, "linear", linear)


def _non_overlapping_and_dense(t):
    """TensorImpl::is_non_overlapping_and_dense: some permutation of the dims is contiguous."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _probe_exclusive_use_count(torch, recorder, device):
    """The reference count, seen from inside the recorder, of a gradient the engine alone holds."""
    recorder.probing = []
    try:
        leaf = torch.ones(4, device=device, requires_grad=True)
        y = leaf * 2
        (y.sin() + y.cos()).sum().backward()  # y's gradient: SinBackward's, then CosBackward's added to it
    finally:
        seen, recorder.probing = recorder.probing, None
    return max(seen) if seen else None

