"""CUDA graphs and memory pools on fake CUDA (Note [Private pools]): torch.cuda.CUDAGraph, graph,
graph_pool_handle, MemPool and use_mem_pool write the trace's pool rows; caching_allocator_alloc
and caching_allocator_delete a raw block's rows."""
from __future__ import annotations

import contextlib
import gc
import itertools

from .streams import _FakeStream


def _fake_cuda_graphs_and_raw_blocks(torch, patches, recorder, streams):
    """CUDA graphs, memory pools and caching_allocator_alloc on fake CUDA."""
    cuda = torch.cuda

    # Note [Private pools]: a CUDA graph capture runs the captured region eagerly once (replay()
    # runs nothing) with its allocations routed to the graph's private pool, as
    # CUDACachingAllocator's beginAllocateToPool does: `pool_begin,P,,STREAM` at capture_begin,
    # `pool_end,P,,` at capture_end and `pool_release,P,,` when the graph is reset or destroyed
    # (releasePool). A MemPool is a pool of its own: made with one use (begin and end with nothing
    # between), `use_mem_pool` routes every stream of the thread to it, and deleting it releases
    # that use and empties the pool's cache (`empty_cache,P,,`). Pool handles ((0, n) from graph_pool_handle or a MemPool, (n, 0) a graph's own)
    # name trace pool n. torch.cuda.make_graphed_callables runs unpatched on these: its warmup
    # iterations eagerly on its side stream, its forward and backward graphs captured into one
    # shared pool, and each later call only copies inputs and replays (no allocation of its own).
    pool_numbers = itertools.count(1)

    def trace_pool(handle):
        """The trace pool of a pool handle (a tuple, or a MemPool), made on first sight."""
        handle = tuple(getattr(handle, "id", handle))
        number = handle[0] or handle[1]
        if not number:
            raise RuntimeError(f"{handle} is the default pool, not a private one")
        return number

    def graph_pool_handle():
        return (0, next(pool_numbers))

    def capture_stream_check(stream):
        if stream.stream_id == 0:
            # CUDAGraph::capture_begin.
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok to replay them on the default stream.)")

    class CUDAGraph:
        """A CUDA graph on fake CUDA: the captured region runs eagerly once into the graph's
        private pool; replay() runs nothing."""

        def __init__(self, keep_graph=False):
            self._handle = None
            self._capture = None  # (trace pool, stream) while capturing
            self._held = []  # trace pools this graph holds until reset (releasePool)
            self._stream = None  # the capture stream, once captured
            self._joined = []  # streams that joined the capture (waited on its stream)

        def capture_begin(self, pool=None, capture_error_mode="global", check_input_liveness=False):
            if self._capture is not None:
                raise RuntimeError("capture_begin: this graph is already capturing")
            stream = streams.current()
            capture_stream_check(stream)
            handle = tuple(getattr(pool, "id", pool)) if pool is not None else (0, 0)
            if handle == (0, 0):
                handle = (next(pool_numbers), 0)
            number = trace_pool(handle)
            if not recorder.closed:
                recorder.sink.pool_begin(number, stream.stream_id)
            streams.capturing[stream.stream_id] = self
            self._handle, self._capture, self._stream = handle, (number, stream), stream
            self._held.append(number)

        def capture_end(self):
            if self._capture is None:
                raise RuntimeError("capture_end: this graph is not capturing")
            number, stream = self._capture
            if not recorder.closed:
                recorder.sink.pool_end(number)
            streams.capturing.pop(stream.stream_id, None)
            for joined in self._joined:
                streams.capturing.pop(joined, None)
            self._joined = []
            self._capture = None

        capture_end_pre = capture_end

        def capture_end_post(self):
            pass

        def instantiate(self):
            pass

        def replay(self):
            pass

        def reset(self):
            # CUDAGraph::reset: a capture left open is ended first (endAllocateToPool), the capture
            # stream's cuBLAS workspace is freed (it would pin the pool), then the pools released.
            if self._capture is not None:
                self.capture_end()
            if self._stream is not None:
                recorder.clear_cublas_workspace(self._stream.stream_id)
                self._stream = None
            held, self._held = self._held, []
            for number in held:
                if not recorder.closed:
                    recorder.sink.pool_release(number)

        def __del__(self):
            try:
                self.reset()
            except Exception:
                pass  # interpreter shutdown: the trace is closed

        def pool(self):
            if self._handle is None:
                raise RuntimeError("pool(): the graph has not been captured")
            return self._handle

        def pools(self):
            return [self._handle] if self._handle is not None else []

        def enable_debug_mode(self):
            pass

        def debug_dump(self, path, *args, **kwargs):
            pass

        def register_capture_start_hook(self, *args, **kwargs):
            pass

        register_capture_end_hook = register_post_instantiate_hook = register_capture_start_hook
        register_replay_start_hook = register_replay_end_hook = register_destroy_callback = register_capture_start_hook

    class graph:
        """torch.cuda.graph: synchronize, empty the cache, then capture on the capture stream (by
        default one side stream shared by every graph), as torch.cuda.graphs.graph.__enter__ does."""

        default_capture_stream = None

        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
            if stream is None and self.__class__.default_capture_stream is None:
                self.__class__.default_capture_stream = streams.Stream()
            self.pool = () if pool is None else (pool,)
            self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
            self.cuda_graph = cuda_graph
            self.capture_error_mode = capture_error_mode

        def __enter__(self):
            torch.cuda.synchronize()
            if getattr(torch.compiler.config, "force_cudagraph_gc", False):
                gc.collect()
            torch.cuda.empty_cache()
            self.previous = streams.exchange(self.capture_stream)
            try:
                self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
            except BaseException:
                streams.exchange(self.previous)
                raise

        def __exit__(self, *exc):
            try:
                self.cuda_graph.capture_end()
            finally:
                streams.exchange(self.previous)
            return False

    class MemPool:
        """torch.cuda.MemPool: a private pool made with one use (createOrIncrefPool), which its
        deletion releases."""

        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            self._id = graph_pool_handle()
            self.allocator = allocator
            self._uses = 1
            if not recorder.closed:
                recorder.sink.pool_begin(self._id[1], None)
                recorder.sink.pool_end(self._id[1])
                # setUseOnOOM: the allocator's own pools may take this pool's free blocks on OOM.
                if use_on_oom:
                    recorder.sink.pool_use_on_oom(self._id[1])

        @property
        def id(self):
            return self._id

        def use_count(self):
            return self._uses

        def snapshot(self, include_traces=True):
            return []

        def __del__(self):
            # ~MemPool: releasePool, then emptyCache(id) gives its free segments back at once.
            try:
                if not recorder.closed:
                    recorder.sink.pool_release(self._id[1])
                    recorder.sink.empty_pool_cache(self._id[1])
            except Exception:
                pass

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        """The thread's allocations (every stream) go to ``pool``: a begin, an end and a release.
        Inside a capture the graph also keeps the pool until its reset (graph._retain_pool): one
        more use, taken as the routing ends (a pool cannot be begun while it is routed to)."""
        number = trace_pool(pool)
        graph = streams.capturing.get(streams.current().stream_id)
        if not recorder.closed:
            recorder.sink.pool_begin(number, None)
        pool._uses += 1
        try:
            yield
        finally:
            pool._uses -= 1
            if not recorder.closed:
                recorder.sink.pool_end(number)
                if graph is not None:
                    recorder.sink.pool_begin(number, None)
                    recorder.sink.pool_end(number)
                    graph._held.append(number)
                recorder.sink.pool_release(number)

    # caching_allocator_alloc/delete: a raw block of the caching allocator, a row each; the pointer
    # handed back is a made-up address that names the row's id.
    raw_blocks = {}

    def caching_allocator_alloc(size, device=None, stream=None):
        trace_id = recorder._new_id()
        stream_id = stream.stream_id if isinstance(stream, _FakeStream) else streams.current().stream_id
        if size:
            recorder.record_alloc(trace_id, size, stream_id)
        pointer = (1 << 47) + (trace_id << 9)
        raw_blocks[pointer] = (trace_id, size)
        return pointer

    def caching_allocator_delete(pointer):
        block = raw_blocks.pop(pointer, None)
        if block is None:
            if pointer:
                raise RuntimeError(f"caching_allocator_delete: {pointer:#x} is not a block caching_allocator_alloc returned")
            return
        if block[1]:
            recorder.sink.free(*block)

    for name, fn in dict(
        CUDAGraph=CUDAGraph, graph=graph, graph_pool_handle=graph_pool_handle,
        MemPool=MemPool, use_mem_pool=use_mem_pool,
        caching_allocator_alloc=caching_allocator_alloc, caching_allocator_delete=caching_allocator_delete,
    ).items():
        for module in (cuda, cuda.memory, getattr(cuda, "graphs", None)):
            if module is not None and hasattr(module, name):
                patches.set(module, name, fn)

