"""Threads and worker processes the script starts: a thread runs with the capture's mode (its
ops recorded with the main thread's, one at a time) and its stops reach the capture's thread;
a DataLoader worker's error keeps its frames for the message."""
from __future__ import annotations

import os
import signal
import sys
import types

from . import state
from .errors import FakeValueNeeded, NeedsDriver, StopCapture
from .messages import _frames, _from_the_script

def _worker_errors_keep_their_frames(patches):
    """A DataLoader worker process sends its error to the main process as text
    (torch._utils.ExceptionWrapper), which raises it anew at the `for ... in loader` line: the
    worker's frames and what the capture knew of the error ride along, so that a fake-value read in
    a Dataset's __getitem__ is named at its own line (the main process's line given as context)."""
    from torch._utils import ExceptionWrapper

    original_init, original_reraise = ExceptionWrapper.__init__, ExceptionWrapper.reraise

    def init(self, exc_info=None, where="in background"):
        if exc_info is None:
            exc_info = sys.exc_info()
        original_init(self, exc_info, where)
        exc = exc_info[1]
        self.allocbench = dict(origin_frames=_frames(exc_info[2]), origin_where=where,
                               on_cpu=getattr(exc, "on_cpu", False), fix=getattr(exc, "fix", None))

    def reraise(self):
        try:
            original_reraise(self)
        except BaseException as exc:
            for name, value in getattr(self, "allocbench", {}).items():
                try:
                    setattr(exc, name, value)
                except (AttributeError, TypeError):
                    pass
            raise

    patches.set(ExceptionWrapper, "__init__", init)
    patches.set(ExceptionWrapper, "reraise", reraise)


def _recorded_threads(threading_module, patches, recorder):
    """torch's dispatch modes are per thread: a thread the script starts (a prefetch thread,
    generate() under TextIteratorStreamer) runs with the capture's mode pushed, as the main
    thread does, and its ops are recorded one at a time with the main thread's."""
    original = getattr(threading_module.Thread, "_bootstrap_inner", None)
    if original is None:
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    class ThreadMode(TorchDispatchMode):
        """The capture's mode on one thread (a mode keeps per-instance state as it is entered and
        left, so each thread gets its own); a pass-through once the capture has ended."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return recorder.__torch_dispatch__(func, types, args, kwargs)

    def run_recorded(thread):
        try:
            thread.run()
        except (StopCapture, FakeValueNeeded, NeedsDriver) as e:
            # What stops a capture (--steps, a fake value read, the driver) stops it from any
            # thread: the capture's thread raises it at its next op, step or end. If that is the
            # main thread with Python's own Ctrl-C handler, it is also interrupted (a real signal,
            # so that a wait on this thread wakes); a thread dying alone could leave it waiting.
            with recorder.lock:
                if recorder.thread_error is not None or recorder.closed:
                    return
                recorder.thread_error = e
            if recorder.wake_signal is not None:
                signal.pthread_kill(recorder.owner.ident, recorder.wake_signal)
        except BaseException:
            if not recorder.closed:
                raise
            # After the capture ended its patches are gone: what fails then is no script error.

    def bootstrap_inner(self):
        if recorder.closed:
            return original(self)
        run = self.run
        self.run = lambda: run_recorded(types.SimpleNamespace(run=run))
        with ThreadMode():
            return original(self)

    patches.set(threading_module.Thread, "_bootstrap_inner", bootstrap_inner)
    # A thread's uncaught exception is printed as on a GPU: threading's frames, then the script's
    # (not run_recorded's and bootstrap_inner's, nor a fake op's dispatch).
    original_hook = threading_module.excepthook

    def excepthook(args):
        if not recorder.closed and args.exc_traceback is not None:
            tb = _from_the_script(_without_thread_wrappers(args.exc_traceback, threading_module.__file__))
            args = threading_module.ExceptHookArgs((args.exc_type, args.exc_value, tb, args.thread))
        return original_hook(args)

    patches.set(threading_module, "excepthook", excepthook)


def _without_thread_wrappers(tb, threading_file):
    """``tb`` without the capture's frames between threading's and the script's first."""
    threading_file = os.path.abspath(threading_file)
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept, in_script = [], False
    for entry in entries:
        name = os.path.abspath(entry.tb_frame.f_code.co_filename)
        ours = state.is_ours(name)
        in_script = in_script or not (ours or name == threading_file)
        if in_script or not ours:
            kept.append(entry)
    for entry, following in zip(kept, kept[1:] + [None]):
        entry.tb_next = following
    return kept[0] if kept else None

