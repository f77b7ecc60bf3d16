"""``capture --backend driver``: the script runs on PyTorch's own CUDA path over the fake CUDA
stack (driver_build.py; this process was started with it preloaded), and PyTorch's own caching
allocator reports every allocation and free (allocation_tracker.cpp). What the capture adds from
Python: a step after each ``optimizer.step()``, a ``record_stream`` row when the script records a
stream on a tensor, a ``sync`` row when it waits for the device or a stream."""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time

from .errors import SetupError, StopCapture
from .trace import FORMAT_HEADER, HEADER_LINE

# Where a fake-tensor capture models what a GPU does, the driver backend sees PyTorch do it.
BACKEND_LINE = "backend: driver (PyTorch's own CUDA path on allocbench's fake CUDA runtime; kernels skipped; its caching allocator's own events)"


class _Counts:
    """The trace's counters, as the fake-tensor capture's sink has them (for the summary and the
    progress line), read from the tracker."""

    def __init__(self, lib):
        self.lib = lib
        self.memory_stats = type("Stats", (), {"num_ooms": 0})()
        self.capacity = None

    def _read(self):
        counts = (ctypes.c_uint64 * 6)()
        self.lib.allocbench_tracker_counts(counts)
        self.memory_stats.num_ooms = counts[5]
        return counts

    allocs = property(lambda self: self._read()[0])
    frees = property(lambda self: self._read()[1])
    rows = property(lambda self: self._read()[2])
    live_bytes = property(lambda self: self._read()[3])
    peak_live_bytes = property(lambda self: self._read()[4])


class DriverRecorder:
    """What cli.py reads of a capture: steps, counters, the outcome, the values made up (none
    are counted here: a read from the fake device gives zeros, the default stand-in)."""

    def __init__(self, lib, max_steps):
        self.lib = lib
        self.sink = _Counts(lib)
        self.step_no = 0
        self.max_steps = max_steps
        self.closed = False
        self.lock = threading.Lock()
        self.made_up = {}
        self.scalar_value = 0.0
        self.dispatch_seconds = 0.0  # (no Python dispatch: the ops run in C++)
        self.started = time.monotonic()
        self.on_hard_exit = None
        self.outcome = ""
        self.flops = 0

    def made_up_summary(self):
        return []

    def line(self, text):
        self.lib.allocbench_tracker_line(text.encode())

    def optimizer_stepped(self, *_):
        if self.closed:
            return
        with self.lock:
            self.step_no += 1
            self.line(f"step,{self.step_no},,")
        if self.max_steps is not None and self.step_no >= self.max_steps:
            raise StopCapture()


def _stream_handle(stream):
    return ctypes.c_void_p(stream.cuda_stream if stream is not None else 0)


def _patch_streams(torch, recorder, undo):
    """record_stream and the waits: rows the allocator's trace does not carry (it sees their
    effect only when a deferred free completes)."""
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
                recorder.line(row(*args, **kwargs))
            return out

        setattr(owner, name, waited)
        undo.append(lambda: setattr(owner, name, original))

    wrap(torch.cuda, "synchronize", lambda *a, **k: "sync,,,")
    wrap(torch.cuda.Stream, "synchronize", lambda self: f"sync,,,{lib.allocbench_tracker_stream_id(_stream_handle(self))}")


@contextlib.contextmanager
def capture_on_driver(path, stack, steps=None, comments=()):
    import torch

    lib = ctypes.CDLL(stack["tracker"])
    lib.allocbench_tracker_open.argtypes = [ctypes.c_char_p]
    lib.allocbench_tracker_line.argtypes = [ctypes.c_char_p]
    lib.allocbench_tracker_record_stream.argtypes = [ctypes.c_uint64, ctypes.c_void_p]
    lib.allocbench_tracker_stream_id.argtypes = [ctypes.c_void_p]
    lib.allocbench_tracker_stream_id.restype = ctypes.c_uint64
    if not torch.cuda.is_available():
        raise SetupError("torch saw no CUDA device on the fake runtime (torch.cuda.is_available() is False): use --backend fake-tensors")
    header = [
        HEADER_LINE,
        f"torch {torch.__version__}, python {sys.version.split()[0]}",
        BACKEND_LINE,
        f"fake card: {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory} bytes reported",
        "not seen: cuDNN (off: convolutions and attention take PyTorch's own kernels), NCCL, the CUDA context",
        *comments,
    ]
    with open(path, "w") as f:
        f.write("".join(f"# {line}\n" for line in header) + FORMAT_HEADER + "\n")
    if lib.allocbench_tracker_open(os.fsencode(path)) != 0:
        raise SetupError(f"cannot write the trace {path}")
    # cuDNN is NVIDIA's real library and cannot start on the fake driver: PyTorch's own kernels
    # run instead (a fake cuDNN with the card's workspace sizes is to come).
    torch.backends.cudnn.enabled = False
    torch.backends.cuda.enable_cudnn_sdp(False)
    recorder = DriverRecorder(lib, steps)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(recorder.optimizer_stepped)
    undo = []
    _patch_streams(torch, recorder, undo)
    outcome = "incomplete: stopped by an error"
    try:
        yield recorder
        outcome = f"complete: {recorder.step_no} steps"
    except StopCapture:
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
        hook.remove()
        for restore in reversed(undo):
            restore()
        lib.allocbench_tracker_close()
        with open(path, "a") as f:
            f.write(f"# capture {outcome}\n")
        recorder.outcome = outcome
