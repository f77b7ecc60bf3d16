"""The fake device's streams and events: which stream each allocation is made on, which other
streams use a block (record_stream), and when the script learns a stream's work is done."""
from __future__ import annotations

import contextlib
import threading

from .. import state

class _FakeStreams:
    """The streams of the fake device: the default stream (id 0) and each ``torch.cuda.Stream()``
    the script makes (ids 1, 2, ... in order). No work is ever queued; what a replay needs is which
    stream each allocation is made on (the thread's current stream: CUDACachingAllocator's malloc
    takes getCurrentCUDAStream()), which other streams use a block (record_stream) and when the
    script learns a stream's work is done (synchronize, or a query that answers True)."""

    def __init__(self, sink):
        self.sink = sink
        self.count = 0
        self.capturing = {}  # stream id -> the CUDA graph capturing on it (Note [Private pools])
        self.local = threading.local()  # the current stream is per thread, as in PyTorch
        streams = self

        class Stream(_FakeStream):
            def __init__(self, device=None, priority=0, **kwargs):
                self.stream_id = self.cuda_stream = streams.count
                streams.count += 1
                self.priority = priority
                self.streams = streams
                self.entered = []

        class Event(_FakeEvent):
            def record(self, stream=None):
                self.stream = stream if stream is not None else streams.current()

        self.Stream, self.Event = Stream, Event
        self.default = Stream()

    def current(self):
        return getattr(self.local, "stream", self.default)

    def join_capture(self, stream, waited_on):
        """``stream`` waits on ``waited_on``: if that one is being captured and this one is not,
        it joins the capture (a `pool_join` row) until the graph's capture_end."""
        graph = self.capturing.get(getattr(waited_on, "stream_id", None))
        if graph is None or stream.stream_id in self.capturing or stream.stream_id == 0:
            return
        self.capturing[stream.stream_id] = graph
        graph._joined.append(stream.stream_id)
        self.sink.pool_join(graph._capture[0], stream.stream_id)

    def exchange(self, stream):
        """Makes ``stream`` current (None: no change, as torch.cuda.stream(None)); returns the previous one."""
        previous = self.current()
        if stream is not None:
            self.local.stream = stream
        return previous

    def set_current(self, stream):
        """``torch.cuda.set_stream(s)``."""
        self.exchange(stream)

    def context(self, stream=None):
        """``torch.cuda.stream(s)``: ``s`` is current inside the block."""

        @contextlib.contextmanager
        def current_inside():
            previous = self.exchange(stream)
            try:
                yield stream
            finally:
                self.exchange(previous)

        return current_inside()


class _FakeStream:
    """A stream of the fake device (made by ``_FakeStreams``): work is never queued, so it is
    always complete; saying so (synchronize, query) lets the blocks it used be reused."""

    cuda_stream = 0
    stream_id = 0
    priority = 0
    # torch.Stream's attributes (FSDP2 reads them off its streams).
    device_index = 0
    device_type = 1  # DeviceType::CUDA, as torch.cuda.Stream answers

    @property
    def device(self):
        import torch

        return torch.device("cuda", 0)

    @staticmethod
    def priority_range():
        """(least, greatest) stream priority, as an H100's driver answers it."""
        return (0, -5)

    def is_capturing(self):
        return self.stream_id in self.streams.capturing

    def query(self):
        self.streams.sink.sync(self.stream_id)
        return True

    def synchronize(self):
        self.streams.sink.sync(self.stream_id)

    def wait_stream(self, other):
        # A device-side wait completes nothing on the host; on a capturing stream's work it joins
        # this stream to the capture (CUDA's fork), whose pool its allocations then go to.
        self.streams.join_capture(self, other)

    def wait_event(self, event):
        if event.stream is not None:
            self.streams.join_capture(self, event.stream)

    def record_event(self, event=None):
        event = event if event is not None else self.streams.Event()
        event.record(self)
        return event

    def __enter__(self):
        # `with stream:` makes it current, as torch.Stream's context manager does.
        self.entered.append(self.streams.exchange(self))
        return self

    def __exit__(self, *exc):
        self.streams.exchange(self.entered.pop())
        return False


class _FakeEvent:
    """A CUDA event on the fake device: recorded work is always complete, and takes no time."""

    stream = None

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        self.stream = stream

    def wait(self, stream=None):
        pass

    def query(self):
        self.synchronize()
        return True

    def synchronize(self):
        # The work recorded before the event is done: its stream's, in this model.
        if self.stream is not None:
            self.stream.synchronize()

    def elapsed_time(self, end_event):
        # No kernel runs: a script that divides by the time must not stop on a zero.
        if state.active is not None:
            state.active.say_once("torch.cuda.Event.elapsed_time", f"is not measured on fake CUDA: it answers {FAKE_ELAPSED_MS} ms")
        return FAKE_ELAPSED_MS


# What torch.cuda.Event.elapsed_time answers on the fake device (milliseconds; nothing runs).
FAKE_ELAPSED_MS = 1.0

