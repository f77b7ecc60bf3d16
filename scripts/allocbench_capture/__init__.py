"""Capture the CUDA caching-allocator trace of an unmodified PyTorch script, with or without a GPU.

Every new CUDA storage becomes one ``alloc`` row of an allocbench v1 trace (bytes = the storage's
``nbytes``; views and in-place ops add nothing; a storage resize is an alloc of the new size then a
free of the old), its ``free`` row is written when the storage dies, and a ``step`` row follows
every ``optimizer.step()`` (a global optimizer hook) or an explicit ``allocbench_capture.step()``.

Allocation sites ride in the trace as comment lines every v1 reader skips: ``#site N FILE:LINE
FUNCTION`` defines site N (0, 1, 2... in order of first use), ``#at N`` returns to an earlier
one and ``#at -`` to none (an alloc with no frame to name); each ``alloc`` row was made at the
site most recently defined or returned to. A site is the
innermost Python frame outside torch, the standard library and this package (the frame a user
reads in their own code), its file relative to the script's directory when under it.

Without a GPU (the default) tensors on ``"cuda"`` are fake (``FakeTensorMode``: shapes, no data,
no compute) yet take CUDA's paths: CUDA's autocast policy, the CUDA branches of composite ops and
the real autograd engine. ``--real`` records real tensors instead (a GPU, or ``--device cpu``).

As a program (what ``allocbench capture`` runs; the package's folder on PYTHONPATH)::

    python3 -m allocbench_capture -o trace.csv [--steps N] [--real] [--cublas-workspace-mib M] -- train.py [ARGS...]

As a library (a notebook, a custom loop)::

    import allocbench_capture
    with allocbench_capture.capture("trace.csv"):          # fake CUDA unless fake=False
        train()                                             # call allocbench_capture.step() per iteration
                                                            # if no optimizer steps

Blind spots (allocations the dispatcher never sees): kernel-internal scratch (flash / memory-efficient
attention backward, embedding backward's sort buffers, cub temporaries), NCCL buffers and the CUDA
context (outside the caching allocator). cuBLAS and cuBLASLt workspaces are modelled as the torch
running the capture takes them: per call (torch 2.15's default) or kept per handle and stream
(``TORCH_CUBLAS_WORKSPACE_CACHE=1``, older torch), sized by ``CUBLAS_WORKSPACE_CONFIG`` (32 MiB,
Hopper's default, when unset; ``--cublas-workspace-mib`` overrides it) and ``CUBLASLT_WORKSPACE_SIZE``.

The package: capture.py runs a capture (cli.py the program); recorder.py is the dispatch mode
that records each op's storages, with op rules registered per op family in ops/ (ops/registry.py
says how) and known values in known_values.py; trace.py writes the rows, sites.py finds their
sites, card.py is the fake card's memory; fake_cuda/ answers torch.cuda without a driver (shim.py
the C++ part), fake_tensors.py and autograd.py make fake tensors and autograd under a mode act as
on a device; messages.py says why a script stopped.
"""
from __future__ import annotations

from . import state
from .capture import capture
from .cli import main
from .errors import EXIT_SCRIPT_ERROR, EXIT_SETUP_ERROR, FakeValueNeeded, NeedsDriver, SetupError, StopCapture
from .ops.sdpa import flash_backward_scratch
from .trace import FORMAT_HEADER

__all__ = [
    "capture", "step", "fake", "main", "flash_backward_scratch", "StopCapture", "FakeValueNeeded", "NeedsDriver",
    "SetupError", "FORMAT_HEADER", "EXIT_SETUP_ERROR", "EXIT_SCRIPT_ERROR",
]


def step():
    """Marks an iteration boundary (for loops without an optimizer: serving, eval). A no-op when no
    capture is running, so scripts may call it unconditionally."""
    if state.active is not None:
        state.active.step()


def fake():
    """True while a fake-tensor capture runs: guard code that needs real values with it."""
    return state.active is not None and state.active.fake

