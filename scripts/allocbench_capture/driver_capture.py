"""``capture --backend driver``: the script runs on PyTorch's own CUDA path over the fake CUDA
stack (driver_build.py; this process was started with it preloaded), and PyTorch's own caching
allocator reports every allocation and free (allocation_tracker.cpp). What the capture adds from
Python: a step after each ``optimizer.step()``, a ``record_stream`` row when the script records a
stream on a tensor, a ``sync`` row when it waits for the device or a stream."""
from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import importlib.util
import itertools
import os
import sys
import threading
import time
import weakref

from . import state
from .errors import FakeValueNeeded, SetupError, StopCapture
from .fake_cuda.modules import _rnns_without_cudnn
from .messages import SaysOnce
from .patches import _Patches
from .ranks import KNOWN_ROLES, RANK_FLAG, communicators, install_fake_process_group, role_of
from .trace import FORMAT_HEADER, HEADER_LINE, flops_line


# What the trace says of cuDNN (driver_build.py fakes it where torch links it and its headers are).
CUDNN_FAKED = ("allocbench's fake (convolutions and batch norm take cuDNN's path; each asks for "
               "ALLOCBENCH_CUDNN_WORKSPACE_BYTES of workspace, {} here: what NVIDIA's heuristics pick is not known off the card; "
               "RNNs and attention take PyTorch's own kernels)")
CUDNN_OFF = "off: no cuDNN headers beside this torch to build its fake; convolutions and attention take PyTorch's own kernels"

# Where a fake-tensor capture models what a GPU does, the driver backend sees PyTorch do it.
BACKEND_LINE = "backend: driver (PyTorch's own CUDA path on allocbench's fake CUDA runtime; kernels skipped; its caching allocator's own events)"


class _Counts:
    """The trace's counters, as the fake-tensor capture's sink has them (for the summary and the
    progress line), read from the tracker."""

    def __init__(self, lib):
        self.lib = lib
        self.memory_stats = type("Stats", (), {"num_ooms": 0})()
        self.capacity = None
        self.notes = []  # comments for the trace's end (say_once's)

    def comment(self, text):
        self.notes.append(text)

    def _read(self):
        counts = (ctypes.c_uint64 * 8)()
        self.lib.allocbench_tracker_counts(counts)
        self.memory_stats.num_ooms = counts[5]
        return counts

    allocs = property(lambda self: self._read()[0])
    frees = property(lambda self: self._read()[1])
    rows = property(lambda self: self._read()[2])
    live_bytes = property(lambda self: self._read()[3])
    peak_live_bytes = property(lambda self: self._read()[4])
    devices = property(lambda self: [d for d in range(64) if self._read()[6] >> d & 1])
    fingerprint = property(lambda self: f"{self._read()[7]:016x}")


class DriverRecorder(SaysOnce):
    """What cli.py reads of a capture: steps, counters, the outcome, and the values made up: a
    read of the device from Python (``.item()``, ``bool()``, a copy to the CPU) is answered with
    the stand-in and counted at the script's line, as the fake-tensor capture counts them."""

    def __init__(self, lib, max_steps, sites, scalar_value, strict_values=False):
        self.lib = lib
        self.sink = _Counts(lib)
        self.step_no = 0
        self.max_steps = max_steps
        self.closed = False
        self.lock = threading.Lock()
        self.made_up = {}  # (site, read) -> count
        self.sites = sites
        self.scalar_value = scalar_value
        self.strict_values = strict_values  # stop at the first read instead of answering it
        self.value_reads = []  # (FakeValueNeeded registers itself with the active capture)
        self.dispatch_seconds = 0.0  # (no Python dispatch: the ops run in C++)
        self.started = time.monotonic()
        self.on_hard_exit = None
        self.outcome = ""
        self.device_traces = []  # the traces of devices other than 0, once closed
        self.flush = None  # writes the rows waiting for their sites (with the GIL: a ctypes.PyDLL call)
        self.role = None  # a rank's fingerprint through step 1 (take_role)
        self.gpu_benchmarks = 0  # Inductor's autotuning benchmarks (every choice timed alike)
        self.same_role_as = None  # the earlier rank of the same role (--ranks distinct)
        self.cpp_reads_before = _RUNTIME.allocbench_fake_unknown_reads()  # (torch's own start-up reads)
        self.skipped_calls = set()  # (say_once's)

    def made_up_value(self, read):
        if self.strict_values:
            raise FakeValueNeeded("aten._local_scalar_dense")
        site = self.sites.here_line() or "(no frame of the script's)"
        with self.lock:
            self.made_up[(site, read)] = self.made_up.get((site, read), 0) + 1

    def made_up_summary(self):
        """[{site, read, count}] of the values made up, most first; PyTorch's own reads in C++
        (zeros, whatever --scalar-value says) last."""
        rows = [dict(site=site, read=read, count=n) for (site, read), n in self.made_up.items()]
        rows = sorted(rows, key=lambda r: -r["count"])
        cpp_reads = _RUNTIME.allocbench_fake_unknown_reads() - self.cpp_reads_before
        if cpp_reads:
            rows.append(dict(site=CPP_READ_SITE, read=CPP_READ, count=cpp_reads))
        return rows

    def line(self, text, device=-1):
        """A row on ``device``'s trace, or on every device's (-1); the rows before it go out with
        their sites."""
        self.lib.allocbench_tracker_line(device, text.encode())
        if self.flush is not None:
            self.flush()

    # allocbench_capture.fake(): tensors are real ones of PyTorch's CUDA path, their values are not.
    fake = True

    def step(self):
        """allocbench_capture.step(): a step row for loops without an optimizer."""
        self.optimizer_stepped()

    def optimizer_stepped(self, *_):
        if self.closed:
            return
        with self.lock:
            self.step_no += 1
            self.line(f"step,{self.step_no},,")
        if self.step_no == 1 and os.environ.get(RANK_FLAG):
            self.take_role()
        if self.max_steps is not None and self.step_no >= self.max_steps:
            raise StopCapture()

    def take_role(self):
        """A rank's role, the fingerprint of its allocations through step 1 (or through its end,
        for a script without steps): under `--ranks distinct` a rank whose role an earlier rank
        had stops here, and allocbench keeps that rank's trace for both."""
        import torch

        self.role = role_of(self.sink.fingerprint, torch)
        self.line(f"# role: {self.role} (the fingerprint of the alloc and free rows and the communicators through step {self.step_no})")
        for known in filter(None, os.environ.get(KNOWN_ROLES, "").split(",")):
            fingerprint, _, rank = known.partition("=")
            if fingerprint == self.role:
                self.same_role_as = int(rank)
                raise StopCapture()


def _stream_handle(stream):
    return ctypes.c_void_p(stream.cuda_stream if stream is not None else 0)


def _patch_streams(torch, recorder, undo):
    """record_stream, the waits and empty_cache: rows the allocator's trace does not carry (it
    sees their effect only when a deferred free completes, or segments freed)."""
    lib = recorder.lib
    record_stream = torch.Tensor.record_stream

    def recorded(self, stream):
        out = record_stream(self, stream)
        if self.is_cuda:
            lib.allocbench_tracker_record_stream(ctypes.c_uint64(self.untyped_storage().data_ptr()), _stream_handle(stream))
        return out

    torch.Tensor.record_stream = recorded
    undo.append(lambda: setattr(torch.Tensor, "record_stream", record_stream))

    def wrap(owner, name, row):
        original = getattr(owner, name)

        def waited(*args, **kwargs):
            out = original(*args, **kwargs)
            if not recorder.closed:
                recorder.line(*row(*args, **kwargs))
            return out

        setattr(owner, name, waited)
        undo.append(lambda: setattr(owner, name, original))

    def device_of(device=None):
        return torch.cuda._utils._get_device_index(device, optional=True)

    wrap(torch.cuda, "synchronize", lambda device=None: ("sync,,,", device_of(device)))
    # empty_cache gives the current device's cached segments back (torch.cuda.graph does it too).
    wrap(torch.cuda, "empty_cache", lambda: ("empty_cache,,,", torch.cuda.current_device()))
    wrap(torch.cuda.Stream, "synchronize", lambda self: (f"sync,,,{lib.allocbench_tracker_stream_id(_stream_handle(self))}", self.device.index))


def _patch_pools(torch, recorder, patches):
    """Private pools: rows the allocator's trace does not carry, written where PyTorch routes its
    allocations (CUDAGraph.cpp and CUDACachingAllocator.cpp): a CUDA graph's capture begins
    allocating its stream's requests to the graph's pool (`pool_begin,P,,STREAM`,
    beginAllocateToPool), ends at capture end (`pool_end,P,,`, endAllocateToPool) and releases
    the pool when the graph is reset or destroyed (`pool_release,P,,`, releasePool);
    use_mem_pool and Inductor's CUDA graph trees route a thread's allocations the same way
    (`pool_begin,P,,` on every stream: _cuda_beginAllocateCurrentThreadToPool, then
    _cuda_endAllocateToPool and _cuda_releasePool); a MemPool is made with one use
    (createOrIncrefPool) and its deletion releases it and empties its cache. Pool ids (a
    graph's own (n, 0), graph_pool_handle's and MemPools' (0, n)) are numbered as first seen."""
    lib = recorder.lib
    numbers, fresh = {}, itertools.count(1)

    def number_of(pool_id):
        pool_id = tuple(pool_id)
        if pool_id not in numbers:
            numbers[pool_id] = next(fresh)
        return numbers[pool_id]

    def row(text, device):
        if not recorder.closed:
            recorder.line(text, device)

    def patch(owner, name, wrapper):
        patches.set(owner, name, wrapper(getattr(owner, name)))

    graph = torch.cuda.CUDAGraph
    captures = weakref.WeakKeyDictionary()  # graph -> (trace pool, device, fake capture id) of its open capture
    releases = weakref.WeakKeyDictionary()  # graph -> the finalizer releasing its captured pool
    capture_pools = {}  # the fake runtime's capture id -> (trace pool, device, the streams in it)

    def capture_begin(original):
        def begin(self, pool=None, *args, **kwargs):
            out = original(self, pool, *args, **kwargs)
            stream = torch.cuda.current_stream()
            # A pool shared with another graph or a MemPool, or the graph's own, whose id it says
            # once captured (named then, in capture_end_pre).
            shared = torch.cuda.graphs._get_pool_id(pool) if pool is not None else None
            number = number_of(shared) if shared is not None and any(shared) else next(fresh)
            device = stream.device.index
            stream_id = lib.allocbench_tracker_stream_id(_stream_handle(stream))
            row(f"pool_begin,{number},,{stream_id}", device)
            capture = _RUNTIME.allocbench_fake_capture_id(_stream_handle(stream))
            captures[self] = (number, device, capture)
            capture_pools[capture] = (number, device, {stream_id})
            return out

        return begin

    def capture_end_pre(original):
        def end(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            number, device, capture = captures.pop(self, (None, None, None))
            capture_pools.pop(capture, None)
            if number is not None:
                numbers.setdefault(tuple(torch._C._CUDAGraph.pool(self)), number)
                row(f"pool_end,{number},,", device)
                releases[self] = weakref.finalize(self, row, f"pool_release,{number},,", device)
            return out

        return end

    def reset(original):
        def released(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            finalizer = releases.pop(self, None)
            if finalizer is not None:
                finalizer()
            return out

        return released

    # A stream that waits on a capturing one joins its capture (the fake runtime's rule, CUDA's):
    # its allocations go to the capture's pool too (`pool_join,P,,STREAM`).
    def joining(original):
        def waited(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            stream = self if isinstance(self, torch.cuda.Stream) else (args[0] if args and args[0] is not None else torch.cuda.current_stream())
            capture = capture_pools.get(_RUNTIME.allocbench_fake_capture_id(_stream_handle(stream)))
            if capture is not None:
                number, device, streams = capture
                stream_id = lib.allocbench_tracker_stream_id(_stream_handle(stream))
                if stream_id not in streams:
                    streams.add(stream_id)
                    row(f"pool_join,{number},,{stream_id}", device)
            return out

        return waited

    patch(torch.cuda.Stream, "wait_event", joining)
    patch(torch.cuda.Stream, "wait_stream", joining)
    patch(torch.cuda.Event, "wait", joining)
    patch(graph, "capture_begin", capture_begin)
    patch(graph, "capture_end_pre", capture_end_pre)
    patch(graph, "reset", reset)

    def thread_routing(kind):
        def wrap(original):
            def routed(device, pool_id):
                out = original(device, pool_id)
                number = number_of(pool_id)
                row(f"pool_{kind},{number},,", torch.cuda._utils._get_device_index(device))
                return out

            return routed

        return wrap

    for name, kind in (("_cuda_beginAllocateCurrentThreadToPool", "begin"), ("_cuda_endAllocateToPool", "end"), ("_cuda_releasePool", "release")):
        for owner in (torch._C, torch.cuda.memory):
            if hasattr(owner, name):
                patch(owner, name, thread_routing(kind))

    def mem_pool_init(original):
        def made(self, *args, **kwargs):
            original(self, *args, **kwargs)
            number, device = number_of(self.id), torch.cuda.current_device()
            row(f"pool_begin,{number},,", device)
            row(f"pool_end,{number},,", device)
            if kwargs.get("use_on_oom", args[1] if len(args) > 1 else False):
                row(f"pool_use_on_oom,{number},,", device)
            weakref.finalize(self, lambda: (row(f"pool_release,{number},,", device), row(f"empty_cache,{number},,", device)))

        return made

    patch(torch.cuda.memory.MemPool, "__init__", mem_pool_init)
    # Inductor's CUDA graph trees restore a pool's checkpointed state to record a new graph on a
    # path; blocks that revives or frees there make no allocator events: counted and said.
    restores = [0]

    def checkpoint(original):
        def restored(*args, **kwargs):
            restores[0] += 1
            return original(*args, **kwargs)

        return restored

    patch(torch._C, "_cuda_setCheckpointPoolState", checkpoint)
    return restores


# Python's reads of a tensor's values, by Tensor method: what the trace's note calls each.
_READS = {"item": ".item()", "__bool__": "bool()", "__float__": "float()", "__int__": "int()", "__index__": "an index", "tolist": ".tolist()"}


# The fake runtime's count of copies to the host that read zeros, and its bracket for the reads
# counted here (src/gpu/oracle/fake_cudart.cpp; preloaded, so in the process's namespace).
_RUNTIME = ctypes.CDLL(None)
CPP_READ = "a copy to the host PyTorch made in C++ (a data-dependent shape: nonzero, a boolean mask, unique)"
CPP_READ_SITE = "PyTorch's C++ code (no line of the script's: zeros read)"


def _patch_reads(torch, recorder, undo):
    """A read of a device tensor's values: counted at the script's line and answered with the
    stand-in (the fake device holds no values; its copies to the host read zeros). Reads made in
    C++ (a data-dependent shape: nonzero, a boolean mask) see zeros: the fake runtime counts them
    (cpp_reads), without a line."""

    def stand_in_of(t):
        return torch.full(t.shape, recorder.scalar_value, dtype=t.dtype)

    for name, read in _READS.items():
        original = getattr(torch.Tensor, name)

        def reading(self, *args, _original=original, _read=read, **kwargs):
            if not (self.is_cuda and not recorder.closed):
                return _original(self, *args, **kwargs)
            recorder.made_up_value(_read)
            return _original(stand_in_of(self), *args, **kwargs)

        setattr(torch.Tensor, name, reading)
        undo.append(lambda name=name, original=original: setattr(torch.Tensor, name, original))

    # Copies to the host: the copy is made (the allocator sees what it sees), then filled with
    # the stand-in, and counted as one read.
    for name in ("cpu", "to"):
        original = getattr(torch.Tensor, name)

        def copied(self, *args, _original=original, _name=name, **kwargs):
            _RUNTIME.allocbench_fake_reads_counted_elsewhere(1)
            try:
                out = _original(self, *args, **kwargs)
            finally:
                _RUNTIME.allocbench_fake_reads_counted_elsewhere(-1)
            if self.is_cuda and isinstance(out, torch.Tensor) and out.device.type == "cpu" and not recorder.closed:
                recorder.made_up_value(f".{_name}('cpu')" if _name == "to" else ".cpu()")
                if recorder.scalar_value:
                    with torch.no_grad():
                        out.fill_(recorder.scalar_value)
            return out

        setattr(torch.Tensor, name, copied)
        undo.append(lambda name=name, original=original: setattr(torch.Tensor, name, original))


def _gpu_benchmarks():
    """Inductor's GPU benchmarks so far (its autotuning: Triton configs, max-autotune's choices),
    as its own counters have them (torch/_inductor/runtime/benchmarking.py, time_and_count)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return sum(n for key, n in utils.counters["inductor"].items() if key.startswith("benchmarking.") and key.endswith(".benchmark_gpu"))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` has been imported (now if it is)."""

    def __init__(self, name, then):
        self.name, self.then, self.looking = name, then, False

    def install(self):
        if self.name in sys.modules:
            self.then(sys.modules[self.name])
            return lambda: None
        sys.meta_path.insert(0, self)
        return lambda: self in sys.meta_path and sys.meta_path.remove(self)

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.looking:
            return None
        self.looking = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.looking = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then(module)

        spec.loader.exec_module = exec_module
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return spec


def _pause_flops_while_benchmarking(lib, patches, undo):
    """Inductor's autotuning times its choices by running them (torch/_inductor/runtime/
    benchmarking.py): their ATen matmuls are not the program's math, so the FLOP count pauses."""

    def patch(module):
        base = getattr(module, "Benchmarker", None)
        for cls in [c for c in vars(module).values() if isinstance(c, type) and base is not None and issubclass(c, base)]:
            for name in ("benchmark_gpu", "benchmark_gpu_with_cuda_graph"):
                original = cls.__dict__.get(name)
                if original is None:
                    continue

                def paused(*args, _original=original, **kwargs):
                    lib.allocbench_flops_pause(1)
                    try:
                        return _original(*args, **kwargs)
                    finally:
                        lib.allocbench_flops_pause(-1)

                patches.set(cls, name, paused)

    undo.append(_AfterImport("torch._inductor.runtime.benchmarking", patch).install())


def _with_reuses(wrapper, timeline, steps, lines):
    """memory.py's timeline (buffers from the step that makes them to the one after their last
    use) with the reuses Inductor's wrapper planned applied: a buffer whose memory goes to a new
    one (a `# reuse` line) allocates nothing, and the old one's free goes with it. Its peak."""
    delta = [0] * (steps + 2)
    by_name = {b.buffer.get_name(): b for b in timeline}
    for b in timeline:
        delta[b.start_step] += b.size_alloc
        if b.end_step != -1:
            delta[b.end_step + 1] -= b.size_free
    for line in lines:
        if isinstance(line, wrapper.ReuseLine) and line.delete_old:
            old, new = by_name.get(line.node.get_name()), by_name.get(line.reused_as.get_name())
            if old is not None and new is not None and old.end_step != -1:
                delta[new.start_step] -= new.size_alloc
                delta[old.end_step + 1] += old.size_free
    peak = live = 0
    for change in delta:
        live += change
        peak = max(peak, live)
    return peak


def _mark_inductor_graphs(recorder, patches, undo):
    """With ALLOCBENCH_INDUCTOR_WINDOWS=1, each graph Inductor compiles here gets a comment row
    with Inductor's own estimate of its peak memory (torch/_inductor/memory.py's
    estimate_peak_memory over its final node order, as its reorder_for_peak_memory computes it),
    the same timeline with the buffer reuse Inductor's wrapper then planned (_with_reuses), and
    the bytes of the inputs it takes for freeable; each run of the graph gets `call`/`return`
    rows around its allocations: what scripts/validate/inductor_peak.py compares. (A graph loaded from
    Inductor's caches was not scheduled here: it has no estimate.)"""
    if os.environ.get("ALLOCBENCH_INDUCTOR_WINDOWS") != "1":
        return
    numbers = itertools.count(1)

    def scheduled(module):
        from torch._inductor.virtualized import V
        from torch.utils._ordered_set import OrderedSet

        original = module.Scheduler.codegen

        def codegen(self, *args, **kwargs):
            try:
                from torch._inductor import memory

                graph = V.graph
                outputs = OrderedSet(graph.get_output_names())
                peak, freeable = memory.prepare_planning_info(self.nodes, self.name_to_buf, self.name_to_fused_node,
                                                              OrderedSet(graph.graph_inputs.keys()), outputs)
                timeline, _, _ = memory.compute_memory_timeline(self.nodes, freeable, outputs)
                kind = "backward" if graph.is_backward else "inference" if graph.is_inference else "forward"
                graph._allocbench_estimate = (kind, peak, None, sum(b.mpi_buffer.size_free for b in freeable.values()))
                graph._allocbench_timeline = (timeline, len(self.nodes))
            except Exception as e:  # noqa: BLE001 - an estimate this torch cannot make: none
                print(f"allocbench capture: no Inductor memory estimate for a graph ({type(e).__name__}: {e})", file=sys.stderr)
            return original(self, *args, **kwargs)

        patches.set(module.Scheduler, "codegen", codegen)

    def planned(module):
        from torch._inductor.virtualized import V

        cls = module.PythonWrapperCodegen
        original = cls.memory_plan_reuse

        def memory_plan_reuse(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            graph = V.graph
            estimate, timeline = getattr(graph, "_allocbench_estimate", None), getattr(graph, "_allocbench_timeline", None)
            if estimate is not None and timeline is not None:
                kind, peak, _, freeable = estimate
                graph._allocbench_estimate = (kind, peak, _with_reuses(module, *timeline, self.lines), freeable)
            return out

        patches.set(cls, "memory_plan_reuse", memory_plan_reuse)

    def compiled(module):
        cls = module.CompiledFxGraph
        init, call = cls.__init__, cls.__call__

        def made(self, *args, **kwargs):
            init(self, *args, **kwargs)
            graph = kwargs.get("graph", args[1] if len(args) > 1 else None)
            estimate = getattr(graph, "_allocbench_estimate", None)
            if estimate is not None and not recorder.closed:
                self._allocbench_graph = n = next(numbers)
                kind, peak, reused, freeable = estimate
                recorder.line(f"# inductor graph {n} ({kind}): estimate {peak} B, with its wrapper's buffer reuse {reused if reused is not None else '-'} B, "
                              f"freeable inputs {freeable} B")

        def run(self, inputs):
            n = getattr(self, "_allocbench_graph", None)
            if n is None or recorder.closed:
                return call(self, inputs)
            recorder.line(f"# inductor graph {n}: call")
            try:
                return call(self, inputs)
            finally:
                if not recorder.closed:
                    recorder.line(f"# inductor graph {n}: return")

        patches.set(cls, "__init__", made)
        patches.set(cls, "__call__", run)

    undo.append(_AfterImport("torch._inductor.scheduler", scheduled).install())
    undo.append(_AfterImport("torch._inductor.codegen.wrapper", planned).install())
    undo.append(_AfterImport("torch._inductor.output_code", compiled).install())


def device_trace(path, device):
    """Where device ``device``'s rows go beside ``path`` (allocation_tracker.cpp's naming)."""
    at = path.rfind(".csv")
    tag = f".cuda{device}"
    return path + tag + ".csv" if at < 0 else path[:at] + tag + path[at:]


@contextlib.contextmanager
def capture_on_driver(path, stack, steps=None, comments=(), scalar_value=None, site_root=None, strict_values=False, sites=True):
    import torch

    lib = ctypes.CDLL(stack["tracker"])
    lib.allocbench_tracker_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.allocbench_tracker_line.argtypes = [ctypes.c_int, ctypes.c_char_p]
    lib.allocbench_tracker_record_stream.argtypes = [ctypes.c_uint64, ctypes.c_void_p]
    lib.allocbench_tracker_stream_id.argtypes = [ctypes.c_void_p]
    lib.allocbench_tracker_stream_id.restype = ctypes.c_uint64
    _RUNTIME.allocbench_fake_unknown_reads.restype = ctypes.c_uint64
    _RUNTIME.allocbench_fake_capture_id.restype = ctypes.c_uint64
    _RUNTIME.allocbench_fake_reads_counted_elsewhere.argtypes = [ctypes.c_int]
    lib.allocbench_flops.argtypes = [ctypes.c_int]
    lib.allocbench_flops.restype = ctypes.c_uint64
    if not torch.cuda.is_available():
        raise SetupError("torch saw no CUDA device on the fake runtime (torch.cuda.is_available() is False): use --backend fake-tensors")
    header = [
        HEADER_LINE,
        f"torch {torch.__version__}, python {sys.version.split()[0]}",
        BACKEND_LINE,
        f"fake card: {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory} bytes reported",
        (f"cuDNN: {CUDNN_FAKED.format(os.environ.get('ALLOCBENCH_CUDNN_WORKSPACE_BYTES', '0'))}" if stack.get("cudnn") else f"not seen: cuDNN ({CUDNN_OFF})"),
        "not seen: NCCL, the CUDA context",
        *comments,
    ]
    header_text = "".join(f"# {line}\n" for line in header)
    with open(path, "w") as f:
        f.write(header_text + FORMAT_HEADER + "\n")
    # A rank of a multi-process capture writes its own device's rows (LOCAL_RANK's) to the trace named.
    primary = int(os.environ.get("LOCAL_RANK", "0")) if os.environ.get(RANK_FLAG) else 0
    if lib.allocbench_tracker_open(os.fsencode(path), header_text.encode(), primary) != 0:
        raise SetupError(f"cannot write the trace {path}")
    lib.allocbench_flops_pause.argtypes = [ctypes.c_int]
    lib.allocbench_flops_start()
    # NVIDIA's cuDNN cannot start on the fake driver: the fake's convolutions and batch norm run
    # where it is built (driver_build.py), PyTorch's own kernels where not. cuDNN's attention and
    # RNNs are not faked: SDPA takes flash, memory-efficient or math, as on the fake-tensor backend.
    if not stack.get("cudnn"):
        torch.backends.cudnn.enabled = False
    torch.backends.cuda.enable_cudnn_sdp(False)
    from .sites import _Sites

    if strict_values and scalar_value is not None:
        raise SetupError("--strict-values stops at the first read of a fake value, --scalar-value answers it: choose one")
    undo = []
    site_rules = _Sites(torch, site_root or os.getcwd())
    recorder = DriverRecorder(lib, steps, site_rules, 0.0 if scalar_value is None else scalar_value, strict_values)
    if sites:
        # Each allocation's Python stack, gathered by PyTorch itself (its memory history, no
        # entries kept), named by the tracker with the fake-tensor capture's rule (sites.py).
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=1)
        lib.allocbench_tracker_sites.argtypes = [ctypes.c_char_p] * 5
        lib.allocbench_tracker_sites(*(os.fsencode(p) for p in (site_rules.root, site_rules.torch_dir, site_rules.stdlib_dir, site_rules.here,
                                                               "\n".join(site_rules.libraries))))
        recorder.flush = ctypes.PyDLL(stack["tracker"]).allocbench_tracker_flush
        lib.allocbench_tracker_backward_site.argtypes = [ctypes.c_char_p]
        for name in ("backward", "grad"):
            original = getattr(torch.autograd, name)

            def run(*args, _original=original, **kwargs):
                # Autograd allocates on its device thread, with no Python frame: at this call.
                lib.allocbench_tracker_backward_site((site_rules.here_name() or "").encode())
                try:
                    return _original(*args, **kwargs)
                finally:
                    lib.allocbench_tracker_backward_site(b"")

            setattr(torch.autograd, name, run)
            undo.append(lambda name=name, original=original: setattr(torch.autograd, name, original))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(recorder.optimizer_stepped)
    _patch_streams(torch, recorder, undo)
    patches = _Patches()
    undo.append(patches.undo)
    pool_restores = _patch_pools(torch, recorder, patches)
    _pause_flops_while_benchmarking(lib, patches, undo)
    _mark_inductor_graphs(recorder, patches, undo)
    _patch_reads(torch, recorder, undo)
    install_fake_process_group(torch, patches.set)
    if stack.get("cudnn"):
        # An RNN packs its cuDNN weights only with cuDNN on; it runs without (below), so unpacked.
        patches.set(torch.nn.modules.rnn.RNNBase, "flatten_parameters", lambda self: None)
        _rnns_without_cudnn(torch, patches, recorder, on_fake_cuda=lambda weight: weight.device.type == "cuda")
    outcome = "incomplete: stopped by an error"
    state.active = recorder
    try:
        yield recorder
        outcome = f"complete: {recorder.step_no} steps"
    except StopCapture:
        if recorder.same_role_as is not None:
            outcome = f"complete: the same allocations and communicators as rank {recorder.same_role_as} through step 1 (--ranks distinct)"
        else:
            outcome = f"complete: stopped after {recorder.step_no} steps (--steps)"
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        outcome = f"complete: {recorder.step_no} steps" if code == 0 else f"incomplete: exit status {code}"
        raise
    except BaseException as e:
        outcome = f"incomplete: {type(e).__name__}"
        raise
    finally:
        with recorder.lock:
            recorder.closed = True
        state.active = None
        hook.remove()
        for restore in reversed(undo):
            restore()
        if recorder.role is None and os.environ.get(RANK_FLAG):
            recorder.role = role_of(recorder.sink.fingerprint, torch)  # (a script without steps: its whole run)
        closing = [*recorder.sink.notes, *communicators(torch)]
        if pool_restores[0]:
            closing.append(f"CUDA graph trees: a private pool's checkpointed state restored {pool_restores[0]} times (to record another graph on "
                           "a path): the blocks it revived or freed there are not rows")
        recorder.gpu_benchmarks = _gpu_benchmarks()
        if recorder.gpu_benchmarks:
            closing.append(f"autotuning: {recorder.gpu_benchmarks} GPU benchmarks of Inductor's timed every choice alike (no kernel runs on the "
                           "fake card): where it chose by time, it kept its first (default) choice")
        devices = recorder.sink.devices
        if recorder.flush is not None:
            recorder.flush()
            recorder.flush = None
            torch.cuda.memory._record_memory_history(enabled=None)
        lib.allocbench_tracker_close()
        lib.allocbench_flops_stop()
        others = [d for d in devices if d != primary]
        recorder.device_traces = [device_trace(path, d) for d in others]
        for trace, device in zip([path, *recorder.device_traces], [primary, *others]):
            with open(trace, "a") as f:
                for row in recorder.made_up_summary():
                    answered = 0 if row["read"] == CPP_READ else recorder.scalar_value
                    f.write(f"# value made up: {row['read']} ×{row['count']} at {row['site']} (answered {answered:g})\n")
                f.writelines(f"# {line}\n" for line in closing)
                flops = lib.allocbench_flops(device)
                if flops:
                    f.write(f"# {flops_line(flops)}\n")
                f.write(f"# capture {outcome}\n")
        recorder.outcome = outcome
