"""The recorder: the dispatch mode that sees every aten op below autograd and autocast and turns
the storages its outputs allocate into trace rows.

Every op goes through Recorder._dispatch's steps, in the order a CUDA kernel allocates; at some of
them an op family has rules of its own, registered by op (ops/registry.py) in the family's module.
What fake tensors are known to hold is the KnownValues part's (known_values.py). Imported when a
capture starts (it needs torch)."""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
import weakref

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

try:  # PyTorch's own FLOP formulas (what FlopCounterMode counts), keyed by op packet
    from torch.utils.flop_counter import flop_registry as _FLOP_REGISTRY
except ImportError:  # (an older torch: no count, the estimate falls back to memory traffic)
    _FLOP_REGISTRY = {}

from . import ops  # noqa: F401 - registers every op family's rules
from .autograd import _engine_add, _in_place_in_an_untraced_backward
from .errors import _NO_SUCH_DEVICE, _NO_SUCH_DEVICE_FIX, NeedsDriver, StopCapture
from .fake_tensors import _REAL_CPU_BYTES, _REAL_CPU_DERIVED_BYTES
from .messages import SaysOnce
from .known_values import KnownValues
from .ops.registry import PASS, rules_for

aten = torch.ops.aten
fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor
add_tensor = aten.add.Tensor
implicit_key = torch._C.DispatchKey.CompositeImplicitAutograd


class Recorder(SaysOnce, KnownValues, TorchDispatchMode):
    """Sees every aten op below autograd and autocast, and records the storages of its outputs."""

    def __init__(self, sink, device_type, fake, blas_workspaces, scalar_value, sites=None, value_sites=None, progress=None):
        super().__init__()
        self.sink = sink
        self.sites = sites
        # Reads of values the capture made up: (site, read) -> count (said in the trace and summary).
        self.value_sites = value_sites or sites
        self.made_up = {}
        self.quiet_values = 0  # >0: the capture's own stand-ins (not the script's reads)
        # Time inside the capture's op dispatch (fake kernels, recording) vs the whole run.
        self.started = time.monotonic()
        self.dispatch_seconds = 0.0
        self.dispatch_depth = 0
        # Math the device would do (matmuls, convolutions, attention), counted as
        # torch.utils.flop_counter counts it: the trace's `# flops:` line, a step-time estimate.
        self.flops = 0
        self.counting_flops = False  # inside a counted op: its parts are not counted again
        self.progress = progress  # _Progress, or None
        self.device_type = device_type
        self.fake = fake
        self.blas = blas_workspaces  # _CublasWorkspaces, or None when none are modelled
        self.scalar_value = scalar_value
        self.closed = False
        self.storages = {}  # StorageImpl address -> [trace id or None, nbytes]
        self.deaths = collections.deque()  # storages whose finalizer could not take the lock
        self.next_id = 1
        self.step_no = 0
        self.max_steps = None
        self.stream_ids = {}
        self.fake_streams = None  # _FakeStreams on fake CUDA
        self.written_args = {}
        self.probing = None
        self.fake_mode = None  # set for fake CUDA: CPU ops run for real where cheap
        self.exclusive_use_count = None
        self.annotate = bool(os.environ.get("ALLOCBENCH_CAPTURE_OPS"))
        self.pointwise_ops = {}  # op -> whether it is elementwise (Note [Known values])
        self.known_by_storage = {}  # storage -> {id: weak reference} of the known tensors viewing it
        self.known_stores = 0
        self.current_op = ""
        self.implicit_ops = {}  # OpOverload -> has a C++ CompositeImplicitAutograd kernel
        self.explicit_ops = {}  # OpOverload -> the composite key CUDA runs it by (_COMPOSITES_ON_CUDA), or None
        self.backend_ops = {}  # (OpOverload, device type) -> has a kernel of that backend
        self.op_rules = {}  # OpOverload -> its rules (ops/registry.py's OpRules)
        self.linear_bias_add = False  # F.linear with a bias is running (Note [linear's bias add])
        self.script_conf = {}  # allocator settings the script made itself (key -> value)
        self.skipped_calls = set()  # torch.cuda calls answered without a driver, said once each
        self.from_data = threading.local()  # depth of CPU constructors from data on this thread
        self.dispatch_error = None  # the last error raised out of an op (type, message, id, on_cpu, fix)
        self.value_reads = []  # every FakeValueNeeded raised (the capture's own catches marked `handled`)
        self.on_hard_exit = None  # called with the code when the script calls os._exit
        self.known_values = torch.utils.weak.WeakIdKeyDictionary()  # Note [Known values]
        self.pinned = torch.utils.weak.WeakIdKeyDictionary()  # the storages of pinned tensors (mark_pinned)
        # Threads the script starts are recorded too (_recorded_threads): one event at a time.
        self.lock = threading.RLock()
        # An error that stopped a recorded thread, handed to the main thread.
        self.thread_error = None
        # The thread the capture runs on (where a recorded thread's stop is raised), and the
        # signal that wakes it for that, when it is the main thread (see capture()).
        self.owner = threading.current_thread()
        self.wake_signal = None

    def made_up_value(self, read):
        """A read of a value the capture does not have, answered with the stand-in: counted per site."""
        if self.quiet_values:
            return
        site = self.value_sites.here_line() if self.value_sites is not None else None
        key = (site or "(no frame of the script's)", read)
        self.made_up[key] = self.made_up.get(key, 0) + 1

    def made_up_summary(self):
        """[{site, read, count}] of the values made up, most first."""
        rows = [dict(site=site, read=read, count=n) for (site, read), n in self.made_up.items()]
        return sorted(rows, key=lambda r: -r["count"])

    def raise_thread_error(self):
        """On the capture's own thread: a recorded thread's stop (_recorded_threads), raised here."""
        error = self.thread_error
        if error is not None and not self.closed and threading.current_thread() is self.owner:
            raise error

    # --- events -------------------------------------------------------------------------
    def _new_id(self):
        with self.lock:
            i = self.next_id
            self.next_id += 1
            return i

    def step(self):
        if self.closed:
            return
        self.raise_thread_error()
        with self.lock:
            self.record_deaths()
            self.step_no += 1
            self.sink.step(self.step_no)
        if self.max_steps is not None and self.step_no >= self.max_steps:
            raise StopCapture()

    def optimizer_stepped(self, optimizer):
        # Every optimizer.step() is a step (with two optimizers, as in a GAN, two per iteration).
        self.step()

    def _stream_of(self, tensor):
        if tensor.device.type != "cuda":
            return 0
        return self._current_stream_id(tensor.device)

    def _current_stream_id(self, device):
        """The trace's id of the current stream (what CUDACachingAllocator's malloc takes)."""
        if self.fake:
            return self.fake_streams.current().stream_id if self.fake_streams else 0
        if device.type != "cuda":
            return 0
        raw = torch.cuda.current_stream(device).cuda_stream
        return self.stream_ids.setdefault(raw, len(self.stream_ids))

    def _observe(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        if self.fake and t.device.type == "cuda" and (t.device.index or 0) > 0:
            raise NeedsDriver(_NO_SUCH_DEVICE.format(device=t.device), fix=_NO_SUCH_DEVICE_FIX)
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            # Sparse, nested or functional wrappers have no single storage.
            if self.fake and t.layout != torch.strided:
                # A fake sparse tensor's nnz is data (a sparse Embedding's gradient comes out
                # empty): its indices and values are not what the GPU would hold.
                self.say_once(
                    f"{t.layout} tensors",
                    "have data-dependent sizes on fake CUDA: their indices and values are not recorded",
                    "not recorded (their sizes are data)",
                )
            return
        key = st._cdata
        nbytes = st.nbytes()
        entry = self.storages.get(key)
        if entry is None:
            # A zero-byte storage is a null pointer: no allocator call (CUDACachingAllocator
            # returns nullptr for size 0), but it may be resized later.
            trace_id = self._alloc(nbytes, t) if nbytes else None
            self.storages[key] = [trace_id, nbytes]
            weakref.finalize(st, self._storage_died, key)
        elif entry[1] != nbytes:
            # resize_ reallocates: the new block is allocated before the old one is freed.
            new_id = self._alloc(nbytes, t) if nbytes else None
            if entry[0] is not None:
                self.sink.free(entry[0], entry[1])
            entry[0], entry[1] = new_id, nbytes

    def _inherit_allocation(self, new, old):
        """``new``'s storage takes over ``old``'s allocation: in an untraced run they are one
        buffer (an in-place op there), and ``old``'s storage dies without a free."""
        if not isinstance(new, torch.Tensor) or not isinstance(old, torch.Tensor) or new.device.type != self.device_type:
            return
        entry = self.storages.get(old.untyped_storage()._cdata)
        storage = new.untyped_storage()
        key = storage._cdata
        if entry is None or key in self.storages or entry[1] != storage.nbytes():
            return
        self.storages[key] = [entry[0], entry[1]]
        weakref.finalize(storage, self._storage_died, key)
        entry[0] = None

    def _alloc(self, nbytes, t):
        if self.annotate:
            self.sink.comment(f"op {self.current_op}")
        trace_id = self._new_id()
        self.record_alloc(trace_id, nbytes, self._stream_of(t))
        return trace_id

    def record_alloc(self, trace_id, nbytes, stream, comment=None):
        """One alloc row at the user's frame (after ``comment``); a request past the fake
        card's memory raises torch.cuda.OutOfMemoryError instead."""
        site = self.sites.here_frame() if self.sites else None
        if self.sink.capacity is not None:
            self.sink.check_fits(trace_id, nbytes, stream, site)
        if comment:
            self.sink.comment(comment)
        self.sink.alloc(trace_id, nbytes, stream, site)

    def record_stream(self, tensor, stream):
        """``tensor.record_stream(stream)``: stream uses the tensor's block."""
        try:
            entry = self.storages.get(tensor.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return
        if entry is not None and entry[0] is not None and not self.closed:
            self.sink.record_stream(entry[0], stream)

    def _storage_died(self, key):
        # (A finalizer: it runs on whichever thread drops the storage's last reference. One that
        # cannot take the lock at once leaves the free to the next op: the thread holding it may
        # be inside an op that waits on this one, as a collective waits on gloo's worker thread.)
        if not self.lock.acquire(blocking=False):
            self.deaths.append(key)
            return
        try:
            self._record_death(key)
        finally:
            self.lock.release()

    def _record_death(self, key):
        entry = self.storages.pop(key, None)
        if entry is not None and entry[0] is not None and not self.closed:
            self.sink.free(entry[0], entry[1])

    def record_deaths(self):
        """The frees finalizers left (_storage_died); with the lock held."""
        while self.deaths:
            self._record_death(self.deaths.popleft())

    def clear_cublas_workspace(self, stream):
        """clearCublasWorkspacesForStream: the stream's kept workspaces are freed (a CUDA graph's
        reset does it for its capture stream, so a workspace no longer pins the graph's pool)."""
        if self.blas is not None:
            self.blas.clear_stream(self, stream)

    def _written_arg_positions(self, func):
        positions = self.written_args.get(func)
        if positions is None:
            positions = [
                (i, a.name)
                for i, a in enumerate(func._schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            ]
            self.written_args[func] = positions
        return positions

    # --- dispatch -----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Threads the script starts run with this mode too (_recorded_threads): one op at a
        # time (reentrant: an op's parts dispatch here again on the same thread).
        if self.closed:
            return func(*args, **(kwargs or {}))
        if self.thread_error is not None:
            self.raise_thread_error()
        try:
            with self.lock:
                if self.dispatch_depth:
                    return self._dispatch_counted(func, types, args, kwargs)
                self.record_deaths()
                start = time.perf_counter()
                self.dispatch_depth = 1
                try:
                    return self._dispatch_counted(func, types, args, kwargs)
                finally:
                    self.dispatch_depth = 0
                    self.dispatch_seconds += time.perf_counter() - start
                    if self.progress is not None:
                        self.progress.tick(self)
        except BaseException as e:
            # TorchScript's interpreter turns a Python error into a RuntimeError with an
            # empty message: what it was is kept for that message (_torchscript_error).
            # Not the exception itself: its frames would keep the op's tensors alive.
            self.dispatch_error = (type(e), str(e), id(e), getattr(e, "on_cpu", False), getattr(e, "fix", None))
            raise

    def _dispatch_counted(self, func, types, args, kwargs):
        """_dispatch, adding the op's FLOPs when PyTorch's flop counter has a formula for it and
        it runs on the captured device (convolution's _convolution and cudnn_convolution are
        its parts, not more work: only the outermost counted op counts)."""
        count = _FLOP_REGISTRY.get(func.overloadpacket) if not self.counting_flops else None
        if count is None:
            return self._dispatch(func, types, args, kwargs)
        self.counting_flops = True
        try:
            out = self._dispatch(func, types, args, kwargs)
        finally:
            self.counting_flops = False
        first = next((a for a in tree_leaves(args) if isinstance(a, torch.Tensor)), None)
        if first is not None and first.device.type == self.device_type:
            try:
                self.flops += int(count(*args, **(kwargs or {}), out_val=out))
            except Exception:  # noqa: BLE001 - a formula that cannot read these arguments: not counted
                pass
        return out

    def resize_storage(self, storage, nbytes, resize):
        """UntypedStorage.resize_ to ``nbytes`` (FSDP frees a parameter's storage with
        resize_(0) and brings it back) is no op the mode sees: the allocation follows here, as
        in _observe. The new block is allocated (and checked against the fake card) before the
        storage changes, and the old one freed after, as the device allocator does."""
        with self.lock:
            entry = None if self.closed else self.storages.get(storage._cdata)
            if entry is None or entry[1] == nbytes:
                return resize()
            new_id = None
            if nbytes:
                new_id = self._new_id()
                self.record_alloc(new_id, nbytes, self._current_stream_id(storage.device))
            try:
                out = resize()
            except BaseException:
                if new_id is not None:
                    self.sink.free(new_id, nbytes)  # the resize failed: its block never was
                raise
            if entry[0] is not None:
                self.sink.free(entry[0], entry[1])
            entry[0], entry[1] = new_id, nbytes
            self.forget_storage(storage._cdata)  # (new memory: its values are not the old ones)
            return out

    def _rules_of(self, func):
        """The op's own rules (ops/registry.py), looked up once per op."""
        rules = self.op_rules.get(func)
        if rules is None:
            rules = self.op_rules[func] = rules_for(func)
        return rules

    def _dispatch(self, func, types, args=(), kwargs=None):
        # The steps every op takes, in this order (the order a CUDA kernel allocates in: buffers
        # before its outputs, the outputs, then its workspace and scratch); where an op has a rule
        # of its own for a step (ops/registry.py), it runs there. The order of the steps is fixed
        # here; an op has one rule per step at most, so rules need no order among themselves.
        kwargs = kwargs or {}
        if self.closed:
            return func(*args, **kwargs)
        # First, before any rule of the op's: an op the device decomposes runs no kernel of its own.
        if self._decomposes(func, args, kwargs):
            # Note [CompositeImplicitAutograd under inference_mode]: the op reached this mode
            # whole because the Autograd keys were skipped (inference_mode); the device's own
            # kernel is the CompositeImplicit one, which runs its parts below this mode unseen.
            # Running it here with the mode pushed records its parts (linear's addmm and cuBLAS
            # workspace, native_layer_norm's mean and rstd), as ProxyTorchDispatchMode and
            # FakeTensorMode do with func.decompose(). The C++ kernel, not decompose(): that
            # prefers Python decompositions (torch/_decomp), which eager never runs.
            with self:
                return func._op_dk(implicit_key, *args, **kwargs)
        rules = self._rules_of(func)
        if rules.instead is not None:
            # What runs in place of the op's fake kernel: the composite kernel a GPU runs, the
            # answer to a read of values, the kernel a library check leads to.
            out = rules.instead(self, func, args, kwargs)
            if out is not PASS:
                return out
        if self.fake and rules.refuse is not None:
            rules.refuse(self, func, args)  # what the CUDA kernel refuses and the meta kernel lets through
        # Buffers the kernel allocates before its outputs (recorded before them; freed in `scratch`).
        pending = rules.before_kernel(self, func, args, kwargs) if rules.before_kernel is not None else None
        if self.probing is not None:
            if func is add_tensor and torch._C._current_autograd_node() is not None:
                self.probing.append(args[0]._use_count())
            return self._run(func, args, kwargs)
        if _engine_add(torch, func is add_tensor, args, kwargs, self.exclusive_use_count):
            out = args[0].add_(args[1])
        else:
            out = self._run(func, args, kwargs)
        if _in_place_in_an_untraced_backward(torch, func, args, out):
            self._inherit_allocation(out, args[0])  # Note [Out-of-place backward formulas]
        if func is add_tensor and self.linear_bias_add:
            # Note [linear's bias add]: an untraced run adds the bias in place.
            self.linear_bias_add = False
            self._inherit_allocation(out, args[0])
        if self.annotate:
            self.current_op = func.__name__
        # The outputs the kernel allocates, in its order; the storage it leaves them.
        out_seen = out if rules.outputs is None else rules.outputs(self, func, args, kwargs, out)
        if rules.output_storage is not None:
            pending = rules.output_storage(self, func, args, kwargs, out)
        for leaf in tree_leaves(out_seen):
            self._observe(leaf)
        for pos, name in self._written_arg_positions(func):
            arg = args[pos] if pos < len(args) else kwargs.get(name)
            for leaf in tree_leaves(arg):
                self._observe(leaf)
        if rules.after_outputs is not None:
            rules.after_outputs(self, func, args, kwargs, out)  # (BLAS workspaces: right after the outputs)
        if self.fake:
            self._follow_known_value(func, args, kwargs, out)
        if rules.scratch is not None:
            rules.scratch(self, func, args, kwargs, out, pending)  # buffers made and freed after the outputs
        return out

    def _decomposes(self, func, args, kwargs):
        """True when the device runs this op's CompositeImplicitAutograd kernel: it has one and
        the device's backend has no kernel of its own (autograd_would_have_decomposed in
        torch/utils/_python_dispatch.py; e.g. _fused_rms_norm has a CUDA kernel). Under
        no_grad such ops are decomposed at the Autograd key and never reach this mode."""
        implicit = self.implicit_ops.get(func)
        if implicit is None:
            try:
                implicit = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), implicit_key)
            except RuntimeError:
                implicit = False  # a TorchScript prim (prim::device): not a dispatcher op
            self.implicit_ops[func] = implicit
        if not implicit:
            return False
        first = next((t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        device = first.device.type if first is not None else torch.device(kwargs.get("device") or "cpu").type
        own = self.backend_ops.get((func, device))
        if own is None:
            backend = torch._C._parse_dispatch_key(torch._C._dispatch_key_for_device(device))
            own = backend is not None and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), backend)
            self.backend_ops[(func, device)] = own
        return not own

    def _kernel_scratch(self, sizes, like):
        """Buffers a CUDA kernel allocates and frees inside one op, after its outputs."""
        ids = [self._alloc(n, like) for n in sizes if n]
        for trace_id, n in reversed(list(zip(ids, [n for n in sizes if n]))):
            self.sink.free(trace_id, n)

    def _run(self, func, args, kwargs):
        """Runs the op: on fake tensors when it touches CUDA, for real when it is a small CPU op."""
        fake_mode = self.fake_mode
        if fake_mode is None:
            return func(*args, **kwargs)
        rule = self._rules_of(func).fake_run
        if rule is not None:
            # An op whose fake run is its family's own (CTC's shapes, pinned memory).
            out = rule(self, func, args, kwargs)
            if out is not PASS:
                return out
        leaves = tree_leaves((args, kwargs))
        if any(isinstance(x, fake_tensor_type) or (isinstance(x, torch.device) and x.type == "cuda") for x in leaves):
            try:
                with fake_mode:
                    return func(*args, **kwargs)
            except (DynamicOutputShapeException, DataDependentOutputException):
                shaped = self._shaped_by_contents(func, args, kwargs, leaves)
                if shaped is None:
                    raise
                return shaped
        if any(isinstance(x, (torch.UntypedStorage, torch.storage.TypedStorage)) for x in leaves):
            # set_ onto a real storage (torch.load rebuilding CPU tensors): its memory exists
            # already, and a fake run would render the whole storage into an error message.
            return func(*args, **kwargs)
        if kwargs.get("pin_memory"):
            # torch.empty(..., pin_memory=True): host memory the same, made without the driver;
            # is_pinned() answers True for it, as on a GPU machine.
            kwargs = {**kwargs, "pin_memory": False}
            return self.mark_pinned(self._run(func, args, kwargs))
        # Note [Real CPU, fake CUDA]: CPU work stays real, so scripts can read its values (data
        # loading, sampler weights, statistics, token ids), except large floating tensors that
        # come from nothing (a factory: a model built on the CPU before .cuda() is torch.empty
        # and an init), which are fake, since this machine need not hold them; every op on a
        # fake tensor is fake. An op on real data makes real data up to a far larger bound (the
        # data it works from is here already), and a constructor from Python or NumPy data
        # holds that data. The fake run tells what the op would make.
        if getattr(self.from_data, "depth", 0):
            return func(*args, **kwargs)
        try:
            with fake_mode:
                predicted = func(*args, **kwargs)
        except Exception:
            return func(*args, **kwargs)
        made = [t for t in tree_leaves(predicted) if isinstance(t, torch.Tensor)]
        floating = sum(t.numel() * t.element_size() for t in made if t.is_floating_point() or t.is_complex())
        from_real_data = any(isinstance(x, torch.Tensor) for x in leaves)
        return func(*args, **kwargs) if floating <= (_REAL_CPU_DERIVED_BYTES if from_real_data else _REAL_CPU_BYTES) else predicted

    def mark_pinned(self, tensor):
        """``tensor`` (a CPU tensor made pinned on a GPU machine), answered pinned from now on."""
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
            self.pinned[tensor.untyped_storage()] = True
        return tensor

    def is_pinned(self, tensor):
        return tensor.device.type == "cpu" and tensor.untyped_storage() in self.pinned
