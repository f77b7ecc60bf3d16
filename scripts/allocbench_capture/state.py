"""The capture in progress, shared by every module of the package.

``active`` is the Recorder of the capture running in this process, if any. Every module reads it
as ``state.active`` when it runs (never a copy taken at import), so ``allocbench_capture.step()``
in the user's script reaches the live recorder whichever module started it. ``HERE`` is the
package's folder: frames of the files under it are the capture's own, neither the user's nor a
library's (allocation sites, tracebacks, error messages)."""
from __future__ import annotations

import os
import threading

active = None  # the Recorder of the capture in progress, if any

# The package's folder, with a trailing separator: a path under it is one of the capture's files.
HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def is_ours(path):
    """Whether the absolute ``path`` is one of the capture's own files."""
    return path.startswith(HERE)


def _fresh_lock_after_fork():
    # A forked child (a DataLoader worker) gets the recorder's lock as its parent's threads left
    # it, maybe held by a thread that does not exist there: a fresh one.
    if active is not None:
        active.lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)
