"""The trace writer: allocbench v1 rows (alloc, free, step, record_stream, sync, pools), written as
they happen, with the allocation sites' ``#site``/``#at`` lines and comments."""
from __future__ import annotations

import contextlib

from .card import _FakeCard, _MemoryStats

FORMAT_HEADER = "op,id,bytes,stream"
# The first line of every capture's trace (what allocbench recognises a capture by).
HEADER_LINE = "allocbench capture v1: one alloc per new storage, free when it dies, step after optimizer.step()"


def flops_line(flops):
    """The trace's closing `# flops:` line (what `advise` estimates a step's time from)."""
    return f"flops: {flops} (matmul, convolution and attention on the device, as torch.utils.flop_counter counts them)"


class _TraceSink(_FakeCard):
    """Writes trace rows as they happen; flushed at every step so a killed run keeps its rows."""

    def __init__(self, path, comments):
        self.path = path
        if str(path).endswith(".gz"):
            import gzip

            self.file = gzip.open(path, "wt", compresslevel=6)
        else:
            self.file = open(path, "w", buffering=1 << 16)
        for c in comments:
            self.file.write(f"# {c}\n")
        self.file.write(FORMAT_HEADER + "\n")
        self.file.flush()  # a readable trace even if the interpreter dies before the first step
        self.allocs = self.frees = self.steps = 0
        self.rows = 0  # every row written (alloc, free, step, stream, pool...)
        self.live_bytes = self.peak_live_bytes = 0
        self.memory_stats = _MemoryStats()
        self.site = None  # the site the next alloc row is at (the last '#site' or '#at')
        self.side_stream_of = {}  # live trace id -> its stream, when not the default stream
        self.used_by = {}  # live trace id -> the other streams that used it (record_stream)
        self.waiting = set()  # streams whose work a freed block waits for (no sync since)
        # The fake card's memory and the error a request past it raises (None: no limit here,
        # as for real tensors, whose own allocator raises).
        self.capacity = None
        self.reported_memory = None  # what an unbounded fake card reports (None: an H100's)
        self.oom_error = None
        self.fraction = 1.0  # per_process_memory_fraction the script set
        self.refused = None  # (id, bytes, stream, site index, message) of the last request refused
        self.deferred_frees = None  # inside frees_in_id_order: the frees to write, sorted, at its end

    def _at_site(self, site):
        """The next row is made at ``site`` ((index, '#site' text when new) or None)."""
        if site is not None:
            index, definition = site
            if definition is not None:
                self.file.write(f"#site {index} {definition}\n")
            elif index != self.site:
                self.file.write(f"#at {index}\n")
            self.site = index
        elif self.site is not None:
            self.file.write("#at -\n")  # no frame to name: not the previous alloc's site
            self.site = None

    def alloc(self, trace_id, nbytes, stream, site=None):
        self._at_site(site)
        self.file.write(f"alloc,{trace_id},{nbytes},{stream}\n")
        self.rows += 1
        if stream:
            self.side_stream_of[trace_id] = stream
        self.allocs += 1
        self.live_bytes += nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        self.memory_stats.alloc(nbytes)

    @contextlib.contextmanager
    def frees_in_id_order(self):
        """Frees inside the block are written in allocation order, not in the order they come:
        a C++ container keyed by address (autocast's cast cache) frees in an order that changes
        from run to run, and a trace should not."""
        if self.deferred_frees is not None:
            yield
            return
        self.deferred_frees = []
        try:
            yield
        finally:
            deferred, self.deferred_frees = self.deferred_frees, None
            for trace_id, nbytes in sorted(deferred):
                self.free(trace_id, nbytes)

    def free(self, trace_id, nbytes):
        if self.deferred_frees is not None:
            self.deferred_frees.append((trace_id, nbytes))
            return
        self.file.write(f"free,{trace_id},,\n")
        self.rows += 1
        if self.side_stream_of:
            self.side_stream_of.pop(trace_id, None)
        if self.used_by:
            # The free records an event on each using stream (insert_events): the block waits for them.
            self.waiting.update(self.used_by.pop(trace_id, ()))
        self.frees += 1
        self.live_bytes -= nbytes
        self.memory_stats.free(nbytes)

    def record_stream(self, trace_id, stream):
        """Stream ``stream`` uses the live block ``trace_id``; its own stream's use is ignored (recordStream)."""
        if stream == self.side_stream_of.get(trace_id, 0) or stream in self.used_by.get(trace_id, ()):
            return
        self.used_by.setdefault(trace_id, set()).add(stream)
        self.file.write(f"record_stream,{trace_id},,{stream}\n")
        self.rows += 1

    def sync(self, stream):
        """The script knows ``stream``'s work done (None: every stream's). Written only when a freed
        block waits for that stream: the one thing a sync changes in a replay."""
        if stream is None and self.waiting:
            self.file.write("sync,,,\n")
            self.rows += 1
            self.waiting.clear()
        elif stream in self.waiting:
            self.file.write(f"sync,,,{stream}\n")
            self.rows += 1
            self.waiting.discard(stream)

    def step(self, n):
        self.file.write(f"step,{n},,\n")
        self.rows += 1
        self.steps = n
        self.file.flush()

    def empty_cache(self):
        self.file.write("empty_cache,,,\n")
        self.rows += 1

    def pool_begin(self, pool, stream):
        self.file.write(f"pool_begin,{pool},,{'' if stream is None else stream}\n")
        self.rows += 1

    def pool_end(self, pool):
        self.file.write(f"pool_end,{pool},,\n")
        self.rows += 1

    def pool_join(self, pool, stream):
        self.file.write(f"pool_join,{pool},,{stream}\n")
        self.rows += 1

    def pool_release(self, pool):
        self.file.write(f"pool_release,{pool},,\n")
        self.rows += 1

    def empty_pool_cache(self, pool):
        self.file.write(f"empty_cache,{pool},,\n")
        self.rows += 1

    def pool_use_on_oom(self, pool):
        self.file.write(f"pool_use_on_oom,{pool},,\n")
        self.rows += 1

    def comment(self, text):
        self.file.write(f"# {text}\n")

    def close(self, outcome):
        if self.file.closed:
            return
        self.file.write(f"# capture {outcome}\n")
        self.file.close()

