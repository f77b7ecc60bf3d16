"""The op rules: what the recorder does for particular ops, registered by op.

Every op the recorder sees goes through the same steps (Recorder._dispatch, in the order a CUDA
kernel allocates); at some of them an op may have a rule of its own. Each op family's module
(ops/ctc.py, ops/blas.py, ...) registers its rules here with ``@rule(step, op, ...)``, an op named
either

- ``"aten.NAME.OVERLOAD"``: that overload of aten's op (``str(func)``), or
- ``"NAME"``: every overload of every op of that name (``func.overloadpacket.__name__``).

An op has at most one rule per step, so rules never need an order among themselves: registering
a second one for the same op and step (by overload or by name) is an error. The steps:

- ``instead(recorder, func, args, kwargs)``: runs in place of the op's usual dispatch and returns
  its result, or PASS when it does not apply (a value read on real tensors, say);
- ``refuse(recorder, func, args)``: on fake tensors, raises what the CUDA kernel refuses and the
  meta kernel lets through;
- ``before_kernel(recorder, func, args, kwargs)``: buffers the kernel allocates before its outputs;
  returns what ``scratch`` gets as ``pending``;
- ``fake_run(recorder, func, args, kwargs)``: runs the op on fake tensors in place of FakeTensorMode
  (its outputs, or PASS);
- ``outputs(recorder, func, args, kwargs, out)``: the outputs the kernel allocates, in its order;
- ``output_storage(recorder, func, args, kwargs, out)``: the output's storage as the kernel leaves
  it, before it is recorded; returns what ``scratch`` gets as ``pending``;
- ``after_outputs(recorder, func, args, kwargs, out)``: what the kernel allocates after its outputs
  and before anything else (BLAS workspaces);
- ``scratch(recorder, func, args, kwargs, out, pending)``: buffers the kernel allocates and frees
  after its outputs.

Meta kernels for ops that have none are registered by name with ``@meta_kernel(name)``."""
from __future__ import annotations

PASS = object()  # an `instead` or `fake_run` rule that does not apply: the op goes on as usual

STEPS = ("instead", "refuse", "before_kernel", "fake_run", "outputs", "output_storage", "after_outputs", "scratch")
_BY_OVERLOAD = {step: {} for step in STEPS}  # step -> "aten.NAME.OVERLOAD" -> rule
_BY_NAME = {step: {} for step in STEPS}  # step -> "NAME" -> rule
META_KERNELS = {}  # aten op name -> the Meta kernel to register when the op has none


def rule(step, *ops):
    """Registers the decorated function as the ``step`` rule of each of ``ops``."""
    if step not in STEPS:
        raise ValueError(f"no step {step!r} (the steps: {', '.join(STEPS)})")

    def register(fn):
        for op in ops:
            table = (_BY_OVERLOAD if "." in op else _BY_NAME)[step]
            if op in table:
                raise ValueError(f"{op} has two {step} rules: {table[op].__qualname__} and {fn.__qualname__}")
            table[op] = fn
        return fn

    return register


def meta_kernel(name):
    """Registers the decorated function as the Meta kernel of aten's op ``name`` (for its overloads
    that have none: see capture's _missing_meta_kernels)."""

    def register(fn):
        if name in META_KERNELS:
            raise ValueError(f"{name} has two meta kernels")
        META_KERNELS[name] = fn
        return fn

    return register


class OpRules:
    """One op's rules, one attribute per step (None: no rule)."""

    __slots__ = STEPS

    def __init__(self, **rules):
        for step in STEPS:
            setattr(self, step, rules.get(step))


NO_RULES = OpRules()


def rules_for(func):
    """The rules of the OpOverload ``func``: its overload's, else its name's, per step."""
    overload, name = str(func), func.overloadpacket.__name__
    found = {}
    for step in STEPS:
        own, named = _BY_OVERLOAD[step].get(overload), _BY_NAME[step].get(name)
        if own is not None and named is not None:
            raise ValueError(f"{overload} has two {step} rules: {own.__qualname__} and {named.__qualname__}")
        if own is not None or named is not None:
            found[step] = own if own is not None else named
    if not found:
        return NO_RULES
    if "before_kernel" in found and "output_storage" in found:
        raise ValueError(f"{overload}: before_kernel and output_storage both hand scratch its `pending`")
    return OpRules(**found)
