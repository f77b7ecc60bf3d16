"""Progress for ``allocbench capture``: what the capture is doing, written to a small JSON file
twice a second from the op dispatch (the caller draws it; a script that stops dispatching ops,
in its own CPU work or a data loader's wait, leaves the file as it was and the caller's clock
running)."""
from __future__ import annotations

import json
import os
import sys
import time

_EVERY_SECONDS = 0.5


class _Progress:
    def __init__(self, path):
        self.path = path
        self.last = 0.0
        self.pid = os.getpid()  # (a forked DataLoader worker dispatches too: only this process says)

    def tick(self, recorder, force=False):
        now = time.monotonic()
        if (not force and now - self.last < _EVERY_SECONDS) or os.getpid() != self.pid:
            return
        self.last = now
        sink = recorder.sink
        torch = sys.modules["torch"]  # (imported by the capture already; the package itself needs no torch)
        if recorder.closed:
            phase = "closing"
        elif not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            phase = "no_grad"  # evaluation, inference, generation
        else:
            phase = "steps" if recorder.step_no else "first_step"
        state = dict(
            phase=phase, steps=recorder.step_no, rows=sink.rows, allocs=sink.allocs, live_bytes=sink.live_bytes,
            peak_live_bytes=sink.peak_live_bytes, dispatch_seconds=round(recorder.dispatch_seconds, 3),
            values_made_up=sum(recorder.made_up.values()),
        )
        partial = f"{self.path}.part"
        try:
            with open(partial, "w") as f:
                json.dump(state, f)
            os.replace(partial, self.path)  # (whole: the reader never sees half a file)
        except OSError:
            pass  # (progress is a courtesy: the capture goes on without it)
