"""Note [Known values]: what fake tensors are known to hold, and the reads of values it answers.

The Recorder's ``KnownValues`` part follows the values (a fill's number, small tensors' contents)
through the ops that keep, combine or compare them, and shapes the outputs that depend on them
(nonzero, a mask's indexing); the rules below answer reads of values with them: ``.item()``
(_local_scalar_dense) and torch.equal / torch.allclose."""
from __future__ import annotations

import itertools
import weakref

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils._pytree import tree_leaves, tree_map

from .errors import FakeValueNeeded
from .ops.registry import PASS, rule

aten = torch.ops.aten
fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor

KNOWN_VALUES_SAID = "answer reads of fake tensors where they can (docs/capture.md, 'Values the capture knows'): isnan/isinf are all False, isfinite all True, isin finds nothing (a generation runs to its max length)"


# Note [Known values]: fake tensors have no data, but some values are known and libraries
# steer by them, so the capture follows them: a tensor filled with one Python number (full,
# ones, zeros, their _like forms, scalar_tensor, fill_) holds it in every element, and two
# assumptions give the rest. A healthy run has no NaN or Inf, so isnan/isinf tests are all
# False, as GradScaler's found_inf is taken to be 0 (see _fake_tensor_fixes): transformers'
# Trainer filters NaN losses with `torch.isnan(loss) or torch.isinf(loss)`, clip_grad_norm_
# has error_if_nonfinite. And isin finds nothing: generate()'s end-of-sequence test
# (EosTokenCriteria) never fires, so a generation runs to its max length, the longest and the
# most memory, instead of stopping wherever --scalar-value steers it. Such a value follows the
# ops that compare, combine, reduce, copy or view it, and elementwise arithmetic with another
# known value or a number (cast to the result's dtype), and answers reads of it without
# --scalar-value; any other write to the tensor forgets it. Pointwise ops (torch.Tag.pointwise:
# arithmetic, compares, logical and bitwise ops, where, clamp, rounding division) of known
# values are evaluated on one-element CPU tensors of the same dtypes and dimensions, so
# torch's own type promotion and rounding give the value; where/masked_fill with a known
# condition take the chosen side's value. Small tensors (token ids from the CPU, a mask made
# from them, arange's positions) are followed whole: an op whose tensor operands are all
# known and small, and whose outputs are small, runs on their contents on the CPU (not ops
# that draw random numbers or leave memory uninitialised), so `(input_ids < 0).any()` and
# `.tolist()` of them read as a real run reads them. A number is held as its tensor's dtype
# holds it (_in_dtype). The NaN/Inf assumption is for unknown values only (a causal mask's
# known -inf is tested as it is). A tensor that takes another storage (`t.data = other`,
# swap_tensors: no op this mode sees) is unknown: each entry keeps the storage it was known in.
assumed_false = {"isnan", "isinf", "isposinf", "isneginf", "isin"}
contents_elements = 1 << 12  # a tensor followed whole (or checked for one value throughout), at most
nondeterministic_tag = torch.Tag.nondeterministic_seeded
# Their outputs' contents are not the op's to say: uninitialised memory, or strides that
# address the fake storage, which the contents do not mirror.
contents_excluded = {"set", "resize", "resize_as", "_reshape_alias", "_local_scalar_dense"}
contents_excluded_parts = ("empty", "as_strided", "philox")  # (philox: random, untagged)
fills = {"full": 1, "full_like": 1, "new_full": 2, "fill": 1, "scalar_tensor": 0}  # op -> position of the value
constants = {"ones": 1, "ones_like": 1, "new_ones": 1, "zeros": 0, "zeros_like": 0, "new_zeros": 0}
keeps_value = {"amax", "amin", "clone", "_to_copy", "detach", "alias", "view", "_unsafe_view", "reshape",
               "squeeze", "unsqueeze", "expand", "select", "slice", "lift_fresh", "copy"}
# (_is_any_true/_is_all_true: the autograd engine's anomaly check, isnan(out)._is_any_true().)
reductions = {"any": bool, "all": bool, "_is_any_true": bool, "_is_all_true": bool}
pointwise_untagged = {"floor_divide"}  # elementwise, but without the tag
pointwise_tag = torch.Tag.pointwise
full_reductions = {aten.max.default, aten.min.default}
view_dtype = aten.view.dtype  # (reinterprets the bits: not the same value)
disable_modes = torch.utils._python_dispatch._disable_current_modes
# What can know a value with nothing known yet (a real tensor's moves included).
# x == x and x != ±inf are True for an unknown value (no NaN, no Inf): isfinite decomposes so.
no_nan_no_inf = {"eq", "ne"}
value_sources = assumed_false | no_nan_no_inf | set(fills) | set(constants) | {
    "_to_copy", "copy", "lift_fresh", "arange", "eye", "linspace", "logspace", "tril_indices", "triu_indices"}


class KnownValues:
    """The Recorder's bookkeeping of known values (a mixin: its state is the Recorder's own,
    ``known_values``, ``known_by_storage``, ``known_stores``, ``pointwise_ops``)."""

    def _follow_known_value(self, func, args, kwargs, out):
        """Note [Known values]: what every element of ``out`` is known to be, if anything."""
        name = func.overloadpacket.__name__
        known = self.known_values
        base = name[:-1] if name.endswith("_") and not name.endswith("__") else name  # in-place forms
        if not len(known) and base not in value_sources:
            return
        try:
            if base == "_amp_foreach_non_finite_check_and_unscale" and len(args) > 1:
                # A healthy run finds no Inf or NaN: found_inf keeps its value (0), so
                # _amp_update_scale_ then grows the scale as on the device.
                outputs = [(args[1], self.known_of(args[1]))]
            elif base not in value_sources and not self._any_operand_known(args, kwargs):
                outputs = []  # (the usual op: nothing it reads is known, so neither is its output)
            else:
                value = self._known_result(func, base, args, kwargs, out)
                outputs = [(out, value)] if value is not None else self._known_contents(func, base, args, kwargs, out)
        except Exception:  # noqa: BLE001 - (an op this bookkeeping cannot follow: unknown)
            outputs = []
        # (_forget_storage_of and _know raise nothing: a tensor they cannot place is unknown)
        for pos, arg_name in self._written_arg_positions(func):
            arg = args[pos] if pos < len(args) else kwargs.get(arg_name)
            for leaf in tree_leaves(arg):
                if isinstance(leaf, torch.Tensor):
                    self._forget_storage_of(leaf)
        for leaf, value in outputs:
            if value is not None and isinstance(leaf, fake_tensor_type):
                self._know(leaf, value)

    def _any_operand_known(self, args, kwargs):
        """Whether an operand (a tensor argument, or one in a list of them) may have a known value."""
        known = self.known_values
        for arg in itertools.chain(args, kwargs.values()):
            for x in (arg if isinstance(arg, (list, tuple)) else (arg,)):
                if isinstance(x, fake_tensor_type):
                    if x in known:
                        return True
                elif isinstance(x, torch.Tensor) and x.numel() <= contents_elements:
                    return True  # a small real tensor: its data is there
        return False

    def _know(self, tensor, value):
        """``tensor`` holds ``value`` (a number throughout, as its dtype holds it, or its
        contents), until its storage is written or it takes another storage."""
        try:
            key = tensor.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 - (a sparse tensor has none: forgotten by itself only)
            key = None
        if not isinstance(value, torch.Tensor):
            try:
                with disable_modes():
                    value = _in_dtype(torch, tensor.dtype, value)
            except Exception:  # noqa: BLE001 - (NaN cast to an integer, a dtype torch cannot fill: unknown)
                return
        self.known_values[tensor] = (value, key)
        if key is None:
            return
        # The reference first: making it may collect garbage, and a holder of this storage
        # dying then must not drop the index entry between its lookup and this insert.
        ref = weakref.ref(tensor, lambda _, key=key, ident=id(tensor): self._drop_holder(key, ident))
        self.known_by_storage.setdefault(key, {})[id(tensor)] = ref
        self.known_stores += 1
        if not self.known_stores % 4096:
            for emptied in [k for k, holders in self.known_by_storage.items() if not holders]:
                self.known_by_storage.pop(emptied, None)

    def _drop_holder(self, key, ident):
        # (A weak reference's callback: it runs on whichever thread drops the tensor, without
        # the lock, so it only removes its own entry; emptied storages are pruned in _know.)
        holders = self.known_by_storage.get(key)
        if holders is not None:
            holders.pop(ident, None)

    def _forget_storage_of(self, tensor):
        """A write to ``tensor``: it, and every view of its storage (`t[i] = v` writes t; t2 =
        t.view(...) changes with t), are no longer known."""
        self.known_values.pop(tensor, None)
        try:
            key = tensor.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 - (a sparse tensor: no storage to share)
            return
        self.forget_storage(key)

    def forget_storage(self, key):
        """Every known tensor viewing the storage ``key`` is unknown (it was written or resized)."""
        for ref in list(self.known_by_storage.pop(key, {}).values()):
            held = ref()
            if held is not None:
                self.known_values.pop(held, None)

    def _known_contents(self, func, base, args, kwargs, out):
        """[(output, its known value or contents)] when the op can run on its operands'
        contents (Note [Known values]); [] otherwise."""
        written = []
        for pos, arg_name in self._written_arg_positions(func):
            arg = args[pos] if pos < len(args) else kwargs.get(arg_name)
            written += [t for t in tree_leaves(arg) if isinstance(t, torch.Tensor)]
        if any(not isinstance(t, fake_tensor_type) for t in written):
            return []  # (a real tensor written: its data is the script's, left alone)
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        # Written operands that are not returned (_foreach_add_, _amp_update_scale_'s growth
        # tracker) are outputs too: their contents after the op, run in place.
        returned = len(outs)
        outs += [t for t in written if not any(t is o for o in outs)]
        if (not outs or not all(isinstance(o, fake_tensor_type) and o.numel() <= contents_elements for o in outs)
                or nondeterministic_tag in func.tags or base in contents_excluded
                or any(part in base for part in contents_excluded_parts)):
            return []
        reals, used = [], {}
        try:
            if base == "copy" and len(args) > 1:
                # copy_(self, src): self becomes src, broadcast and cast.
                source = self._contents_of(args[1]) if isinstance(args[1], torch.Tensor) else None
                if source is None:
                    return []
                with disable_modes():
                    computed = source.to(args[0].dtype).expand(args[0].shape).clone()
            else:
                computed = self._on_contents(func, args, kwargs, reals, used)
        except LookupError:
            return []
        results = [r for r in tree_leaves(computed) if isinstance(r, torch.Tensor)][:returned]
        results += [used[id(t)] for t in outs[returned:]]  # (their contents, written in place)
        if len(results) != len(outs):
            return []
        followed = []
        with disable_modes():
            for fake, real in zip(outs, results):
                if real.shape != fake.shape or real.dtype != fake.dtype:
                    followed.append((fake, None))  # (a kernel of another shape: not followed)
                    continue
                if real._is_view() and reals:
                    real = real.clone()  # (never an alias of the script's own tensors)
                followed.append((fake, _one_value_or_contents(real)))
        return followed

    def _shaped_by_contents(self, func, args, kwargs, leaves):
        """Outputs whose shape depends on values (nonzero, a boolean mask's indexing, unique)
        of operands followed whole (Note [Known values]): the op runs on their contents and
        its outputs are fake tensors of the shapes it gave, on the operands' device; None
        when an operand is unknown."""
        fakes = [x for x in leaves if isinstance(x, fake_tensor_type)]
        if not fakes or nondeterministic_tag in func.tags:
            return None
        device = fakes[0].device
        try:
            computed = self._on_contents(func, args, kwargs)
        except LookupError:
            return self._shaped_by_mask(func, args, kwargs, device)
        except Exception:  # noqa: BLE001 - (no CPU kernel for this dtype: the shape stays unknown)
            return None

        def fake_like(t):
            if not isinstance(t, torch.Tensor):
                return t
            with self.fake_mode:
                return torch.empty(tuple(t.shape), dtype=t.dtype, device=device)

        return tree_map(fake_like, computed)

    def _shaped_by_mask(self, func, args, kwargs, device):
        """``x[mask]`` and ``masked_select(x, mask)`` of an unknown ``x``: their shapes need
        only the mask's contents. None when the mask is unknown too. And bincount of unknown
        values with a minlength (a mixture of experts' load count): its values are taken to be
        below minlength, so it has minlength bins."""
        if func is aten.bincount.default and args:
            weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
            minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0)
            if not minlength:
                return None
            self.say_once("bincount", "of values the capture does not know has minlength bins (its values are taken to be below minlength)",
                          trace_note="of unknown values: minlength bins")
            with disable_modes():
                made = torch.bincount(torch.zeros(0, dtype=torch.long, device="cpu"),
                                      None if weights is None else torch.zeros(0, dtype=weights.dtype, device="cpu"),
                                      minlength=minlength)
            with self.fake_mode:
                return torch.empty(tuple(made.shape), dtype=made.dtype, device=device)
        def mask_contents(m):
            if isinstance(m, torch.Tensor) and m.dtype in (torch.bool, torch.uint8):
                return self._contents_of(m)
            return None

        if func is aten.masked_select.default and len(args) == 2:
            mask = mask_contents(args[1])
            if mask is None:
                return None
            with disable_modes():
                count = int(mask.bool().expand(torch.broadcast_shapes(args[0].shape, mask.shape)).sum())
            with self.fake_mode:
                return torch.empty((count,), dtype=args[0].dtype, device=device)
        if func is aten.index.Tensor and len(args) == 2:
            indices = []
            for index in args[1]:
                if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                    mask = mask_contents(index)
                    if mask is None:
                        return None
                    with disable_modes():
                        positions = mask.nonzero().unbind(1)  # (a mask indexes as its nonzero positions)
                    with self.fake_mode:
                        indices.extend(torch.empty(tuple(p.shape), dtype=torch.long, device=device) for p in positions)
                else:
                    indices.append(index)
            with self.fake_mode:
                return func(args[0], indices)
        return None

    def _on_contents(self, func, args, kwargs, reals=None, used=None):
        """``func`` run on the CPU on its operands' contents; LookupError when one is unknown.
        ``reals`` collects the script's real tensors among them, ``used`` the contents of
        each fake operand by id."""

        def operand(x):
            if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("cuda")):
                return torch.device("cpu")
            if not isinstance(x, torch.Tensor):
                return x
            contents = self._contents_of(x)
            if contents is None:
                raise LookupError  # (an unknown operand: the outputs are unknown)
            if reals is not None and not isinstance(x, fake_tensor_type):
                reals.append(contents)
            if used is not None and isinstance(x, fake_tensor_type):
                used[id(x)] = contents
            return contents

        tree_args, tree_kwargs = tree_map(operand, (list(args), dict(kwargs)))
        if tree_kwargs.get("pin_memory"):
            tree_kwargs["pin_memory"] = False
        with disable_modes(), torch.no_grad():
            return func(*tree_args, **tree_kwargs)

    def known_of(self, tensor):
        """What ``tensor`` is known to hold (a number, or its contents), or None. A tensor that
        took another storage since (``t.data = other``, swap_tensors: no op the mode sees) is
        unknown."""
        entry = self.known_values.get(tensor)
        if entry is None:
            return None
        value, key = entry
        if key is not None:
            try:
                moved = tensor.untyped_storage()._cdata != key
            except Exception:  # noqa: BLE001
                moved = True
            if moved:
                self.known_values.pop(tensor, None)
                return None
        return value

    def _contents_of(self, x):
        """All of ``x``'s elements as a CPU tensor of its shape and dtype, if known and small."""
        if x.is_sparse or x.numel() > contents_elements:
            return None
        if not isinstance(x, fake_tensor_type):
            return x  # a real tensor: its own data
        known = self.known_of(x)
        if known is None or isinstance(known, torch.Tensor):
            return known
        with disable_modes():
            return torch.full(tuple(x.shape), known, dtype=x.dtype, device="cpu")

    def _known_result(self, func, base, args, kwargs, out):
        def value_of(x):
            if isinstance(x, fake_tensor_type):
                known = self.known_of(x)
                return None if isinstance(known, torch.Tensor) else known  # (contents: not one value)
            if isinstance(x, torch.Tensor):
                # A real tensor (token ids made with torch.tensor, moved to fake CUDA): known
                # when small and every element is the same.
                if x.is_sparse or x.numel() > contents_elements:
                    return None
                with disable_modes():  # read the real data, past this mode and fake ones
                    value = _one_value_or_contents(x)
                return None if isinstance(value, torch.Tensor) else value
            return x if isinstance(x, (bool, int, float)) else None

        if base in ("where", "masked_fill") and len(args) == 3 and isinstance(out, torch.Tensor):
            # where(condition, self, other), masked_fill(self, mask, value): a known
            # condition picks a side, and two equal sides need no condition.
            if base == "where":
                condition, chosen, other = (value_of(a) for a in args)
            else:
                chosen, condition, other = (value_of(a) for a in (args[2], args[1], args[0]))
            if condition is not None:
                chosen = chosen if condition else other
            elif chosen != other:
                return None
            return None if chosen is None else self._as_dtype_of(out, chosen)
        if base == "isin":
            # Both sides known: compute it; otherwise nothing is found (the assumption).
            invert = bool(kwargs.get("invert", args[3] if len(args) > 3 else False))
            whole = len(args) > 1 and all(
                not isinstance(a, torch.Tensor) or self._contents_of(a) is not None for a in args[:2])
            # (both known: computed on their contents, as torch computes it)
            return None if whole else invert
        if base in assumed_false and value_of(args[0]) is None and self._contents_of(args[0]) is None:
            return False  # (known values are tested as they are: a causal mask's -inf)
        if base in no_nan_no_inf and len(args) > 1 and isinstance(args[0], torch.Tensor) and value_of(args[0]) is None \
                and self._contents_of(args[0]) is None:
            # The assumption above, as isfinite(x) (x == x) * (x.abs() != inf) and `x != x`
            # ask it: an unknown value equals itself and is no infinity.
            itself = args[1] is args[0]
            infinity = isinstance(args[1], float) and args[1] in (float("inf"), float("-inf"))
            if itself or infinity:
                return (base == "eq") == itself
        if base in constants:
            return constants[base]
        if base in fills:
            pos = fills[base]
            return value_of(args[pos]) if pos < len(args) else None
        first = value_of(args[1] if base == "copy" else args[0])  # copy(self, src): src's value
        if first is None:
            return None
        if (base in keeps_value and func is not view_dtype) or func in full_reductions:
            return first
        if base in reductions:
            return reductions[base](first) if args[0].numel() else None
        if base == "sum":
            # Each output element sums (input elements / output elements) equal values.
            return first * (int(args[0].numel()) // int(out.numel())) if out.numel() else None
        if base == "count_nonzero":
            # ... and counts them all, or none.
            return (int(args[0].numel()) // int(out.numel()) if first else 0) if out.numel() else None
        if base == "mean":
            return first if args[0].numel() else None
        if not isinstance(out, torch.Tensor) or not self._pointwise(func, base):
            return None

        def one_element(x):
            # A known tensor as one element of its dtype and dimensions: 0-dim ones still
            # promote as scalars do, and the rest as tensors.
            if not isinstance(x, torch.Tensor):
                return x
            value = value_of(x)
            if value is None:
                raise LookupError  # (an unknown operand: the result is unknown)
            return torch.full((1,) * x.dim(), value, dtype=x.dtype, device="cpu")

        try:
            with disable_modes():
                result = func(*[one_element(a) for a in args], **{k: one_element(v) for k, v in kwargs.items()})
                return result.reshape(-1)[0].item()
        except LookupError:
            return None

    def _pointwise(self, func, base):
        """True for an elementwise op (tagged so, or its out-of-place form is)."""
        pointwise = self.pointwise_ops.get(func)
        if pointwise is None:
            functional = getattr(getattr(aten, base, None), func._overloadname, None)
            pointwise = nondeterministic_tag not in func.tags and (base in pointwise_untagged or any(
                pointwise_tag in op.tags for op in (func, functional) if op is not None))
            self.pointwise_ops[func] = pointwise
        return pointwise

    def learn_contents(self, fake, real):
        """``fake`` holds ``real``'s values (a checkpoint's tensor loaded onto fake CUDA)."""
        if not self.fake or real.is_sparse or not 0 < real.numel() <= contents_elements:
            return
        with self.lock, disable_modes():
            self._know(fake, _one_value_or_contents(real.detach().clone()))

    def copy_known(self, source, copy):
        """``copy`` holds what ``source`` is known to hold (a deep copy)."""
        with self.lock:
            known = self.known_of(source)
            if known is not None:
                with disable_modes():
                    self._know(copy, known.clone() if isinstance(known, torch.Tensor) else known)

    def known_contents(self, tensor):
        """A fake tensor's contents as a real CPU tensor, when known (Note [Known values])."""
        with self.lock:
            if self.known_of(tensor) is None:
                return None
            self.say_once("known values", KNOWN_VALUES_SAID)
            return self._contents_of(tensor)

    def _scalar(self, func, args):
        value = self.known_of(args[0]) if isinstance(args[0], fake_tensor_type) else None
        if isinstance(value, torch.Tensor):
            with disable_modes():
                value = value.item()  # (followed whole: a one-element tensor's element)
        if value is not None:
            self.say_once("known values", KNOWN_VALUES_SAID)
            return self._as_dtype_of(args[0], value)
        # FakeTensorMode knows the value of small tensors made from Python numbers and kept up
        # through in-place ops (an optimizer's step count); anything else has no value.
        try:
            return func(*args)
        except DataDependentOutputException as e:
            if self.scalar_value is None:
                raise FakeValueNeeded("aten._local_scalar_dense", on_cpu=args[0].device.type == "cpu") from e
        self.made_up_value(".item()")
        return self._as_dtype_of(args[0], self.scalar_value)

    def _compare_values(self, func, args, kwargs):
        """torch.equal / torch.allclose of fake tensors: a read of both operands' values. Known
        contents are compared as torch compares them; with --scalar-value every element holds
        that value (equal when the shapes are, allclose when they broadcast); else the read
        stops the capture as .item() does."""
        a, b = args[0], args[1]
        contents = [self._contents_of(x) if isinstance(x, torch.Tensor) else None for x in (a, b)]
        if all(c is not None for c in contents):
            with disable_modes():
                return func(*contents, *args[2:], **kwargs)
        if self.scalar_value is None:
            raise FakeValueNeeded(str(func), on_cpu=a.device.type == "cpu")
        self.made_up_value("torch.equal" if func is aten.equal.default else "torch.allclose")
        if func is aten.equal.default:
            return tuple(a.shape) == tuple(b.shape)
        try:
            torch.broadcast_shapes(a.shape, b.shape)
        except RuntimeError:
            return func(*args, **kwargs)  # (torch's own error for shapes that do not broadcast)
        return True

    @staticmethod
    def _as_dtype_of(tensor, value):
        """``value`` as the Python number a read of ``tensor`` gives."""
        if tensor.dtype == torch.bool:
            return bool(value)
        if tensor.dtype.is_complex:
            return complex(value)
        if tensor.dtype.is_floating_point:
            return float(value)
        return int(value)


@rule("instead", "aten._local_scalar_dense.default")
def _local_scalar_dense(recorder, func, args, kwargs):
    """``.item()``, ``bool()``, ``.tolist()`` of a fake tensor: its known value, else a stand-in
    (--scalar-value's, 0 by default), or FakeValueNeeded with --strict-values."""
    if not recorder.fake:
        return PASS
    return recorder._scalar(func, args)


@rule("instead", "aten.equal.default", "aten.allclose.default")  # Python bools read from the data
def _value_comparison(recorder, func, args, kwargs):
    if recorder.fake and any(isinstance(a, fake_tensor_type) for a in args[:2]):
        return recorder._compare_values(func, args, kwargs)
    return PASS


def _one_value_or_contents(real):
    """A real tensor's known value: its one number when every element is it, else the tensor."""
    flat = real.reshape(-1)
    if real.numel() and not real.is_complex() and bool((flat == flat[0]).all()):
        return flat[0].item()
    return real


def _in_dtype(torch, dtype, value):
    """``value`` as an element of ``dtype`` holds it: rounded to a float's precision (0.1 in
    float32, 257 in bfloat16, past the range inf), an integer truncated and wrapped as a cast
    wraps it (400 in int8 is -112)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(torch.tensor(complex(value), dtype=dtype, device="cpu").item())
    if dtype.is_floating_point:
        return torch.tensor(float(value), dtype=torch.float64, device="cpu").to(dtype).item()
    bits = torch.iinfo(dtype).bits
    number = int(value)
    if torch.iinfo(dtype).min == 0:
        return number % (1 << bits)
    return (number + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))

