"""The capture: ``capture()`` records the trace of the code inside its block, with the patches and
modes it needs installed for the block's duration (``_start``) and removed after, whatever ends it."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import warnings

from . import state
from .autograd import _linear_bias_add_in_place, _probe_exclusive_use_count
from .card import _ALLOC_CONF_VARS, FAKE_TOTAL_MEMORY, _alloc_conf_items, _conf_fraction, _note_script_conf
from .errors import SetupError, StopCapture
from .fake_cuda.device import _fake_cuda_api
from .fake_tensors import _fake_tensor_fixes, _no_device_init
from .messages import _note_caught_value_reads
from .ops.blas import _CublasWorkspaces, _patch_blas_workspace_sizes
from .ops.meta_kernels import _missing_meta_kernels
from .patches import _Patches
from .progress import _Progress
from .shim import _install_fake_cuda_guard
from .sites import _Sites
from .threads import _recorded_threads
from .trace import HEADER_LINE, _TraceSink, flops_line


@contextlib.contextmanager
def capture(path, fake=None, device="cuda", steps=None, cublas_workspace_mib=None, scalar_value=None, comments=(), sites=True, site_root=None, device_memory=None, strict_values=False, progress=None, card_memory=None):
    """Records the allocation trace of the code inside the block into ``path`` (a v1 trace).

    ``fake``: None picks fake tensors when ``device`` is cuda and no GPU is present.
    ``steps``: stop (raise StopCapture) after this many steps. A read of a fake value (``.item()``,
    ``bool()``, ``.numpy()``) the capture does not know is answered with a stand-in,
    ``scalar_value`` (0 by default), and counted per site (the trace's ``# value made up:`` lines);
    ``strict_values``: raise FakeValueNeeded instead. ``sites``: record each alloc's site
    (``#site``/``#at`` lines), file names relative to ``site_root`` (default: the working
    directory) when under it. ``device_memory``: the fake card's bytes; live tensors past it raise
    torch.cuda.OutOfMemoryError. Unset, the card answers as an H100 80 GB and raises nothing: the
    trace is the whole run, and a replay decides on which card it fits (``card_memory``: the bytes
    it then reports, for a script that sizes its work by the card). ``progress``: a file the
    capture's state is written to twice a second (JSON; ``allocbench capture`` draws it).
    """
    import torch

    if state.active is not None:
        raise SetupError("a capture is already running in this process")
    if fake is None:
        fake = device == "cuda" and not torch.cuda.is_available()
    if not fake and device == "cuda" and not torch.cuda.is_available():
        raise SetupError("--real needs a GPU, and torch.cuda.is_available() is False here: drop --real to capture on fake CUDA tensors")
    if fake and device == "cuda":
        _install_fake_cuda_guard(torch)
    # --cublas-workspace-mib 0: none; unset: CUBLAS_WORKSPACE_CONFIG's (see _CublasWorkspaces).
    if cublas_workspace_mib is not None and cublas_workspace_mib < 0:
        raise SetupError(f"--cublas-workspace-mib must be 0 or more, not {cublas_workspace_mib}")
    modelled = device == "cuda" and cublas_workspace_mib != 0
    workspaces = _CublasWorkspaces(torch, None if cublas_workspace_mib is None else cublas_workspace_mib << 20) if modelled else None
    header = [
        HEADER_LINE,
        f"torch {torch.__version__}, {'fake' if fake else 'real'} {device} tensors, python {sys.version.split()[0]}",
        workspaces.describe() if workspaces else "cuBLAS workspace: not modelled",
        "not seen: kernel-internal scratch (attention/embedding backward, cub), cuDNN and cuFFT workspaces, NCCL, the CUDA context",
        "backend: fake-tensors (FakeTensorMode and the capture's rules for what a GPU does)" if fake else "backend: real tensors",
        *comments,
    ]
    on_fake_card = fake and device == "cuda"
    if device_memory is not None and not on_fake_card:
        raise SetupError("--device-memory sizes the fake card: it has no effect with --real or --device cpu")
    if device_memory is not None and device_memory < 1:
        raise SetupError("--device-memory must be at least 1 byte")
    if strict_values and scalar_value is not None:
        raise SetupError("--strict-values stops at the first read of a fake value, --scalar-value answers it: choose one")
    if not strict_values and scalar_value is None:
        scalar_value = 0.0  # the stand-in (a valid index, a count, False: the usual loop goes on)
    if on_fake_card and device_memory is not None:
        header.append(f"fake card memory: {device_memory} bytes (torch.cuda.OutOfMemoryError past it)")
    elif on_fake_card:
        header.append(f"fake card memory: unbounded (answers as {card_memory or FAKE_TOTAL_MEMORY} bytes; no OutOfMemoryError: the replay decides)")
    if card_memory is not None and (device_memory is not None or not on_fake_card):
        raise SetupError("--card sets what the unbounded fake card reports: it has no effect with --device-memory, --real or --device cpu")
    sink = _TraceSink(path, header)
    sink.reported_memory = card_memory
    if on_fake_card and device_memory is not None:
        sink.capacity, sink.oom_error = device_memory, torch.cuda.OutOfMemoryError
        # A fraction in the allocator's settings caps the card as set_per_process_memory_fraction does.
        conf = next((os.environ[name] for name in _ALLOC_CONF_VARS if name in os.environ), "")
        value = _conf_fraction(_alloc_conf_items(conf))
        sink.fraction = 1.0 if value is None else value  # (a fraction of 0 is a cap, not unset)
    site_table = _Sites(torch, site_root or os.getcwd()) if sites else None
    from .recorder import Recorder  # (it needs torch: imported once a capture starts)

    value_sites = site_table or _Sites(torch, site_root or os.getcwd())
    recorder = Recorder(sink, device, fake, workspaces, scalar_value, site_table, value_sites, _Progress(progress) if progress else None)
    recorder.max_steps = steps
    patches = _Patches()
    outcome = "incomplete: stopped by an error"
    multithreading = torch.autograd.is_multithreading_enabled()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: recorder.optimizer_stepped(opt))
    # A recorded thread's stop (_recorded_threads) is raised on the capture's thread at its next
    # op; a signal of the capture's own (not SIGINT, whose handling is the script's) also wakes
    # it from a wait on that thread. Only the main thread can take signals.
    woke_before = None
    if threading.current_thread() is threading.main_thread():
        recorder.wake_signal = getattr(signal, "SIGRTMIN", signal.SIGUSR2) + (7 if hasattr(signal, "SIGRTMIN") else 0)
        woke_before = signal.signal(recorder.wake_signal, lambda signum, frame: recorder.raise_thread_error())
    conf_before = {name: os.environ.get(name) for name in _ALLOC_CONF_VARS}
    stack = contextlib.ExitStack()
    try:
        try:
            _start(torch, recorder, stack, patches, fake, device)
        except SetupError:
            raise
        except Exception as e:
            raise SetupError(f"the capture could not start in torch {torch.__version__}: {type(e).__name__}: {e}") from e
        state.active = recorder
        _close_on_hard_exit(recorder, patches, sink)
        recorder.started = time.monotonic()  # (the script's time from here: not the capture's set-up)
        if recorder.progress is not None:
            recorder.progress.tick(recorder, force=True)
        yield recorder
        recorder.raise_thread_error()
        outcome = f"complete: {recorder.step_no} steps"
    except StopCapture:
        outcome = f"complete: stopped after {recorder.step_no} steps (--steps)"
    except KeyboardInterrupt as e:
        # A recorded thread's stop (_recorded_threads) arrives as an interrupt: it is that stop.
        stop = recorder.thread_error
        if isinstance(stop, StopCapture):
            outcome = f"complete: stopped after {recorder.step_no} steps (--steps)"
        else:
            outcome = f"incomplete: {type(stop or e).__name__}"
            sink.end_on_refused(stop or e)
            if stop is not None:
                raise stop from None
            raise
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        outcome = f"complete: {recorder.step_no} steps" if code == 0 else f"incomplete: exit status {code}"
        stop = recorder.thread_error
        if code == 0 and stop is not None and not isinstance(stop, StopCapture):
            # The script ended well only because a recorded thread stopped: that stop is the outcome.
            outcome = f"incomplete: {type(stop).__name__}"
            sink.end_on_refused(stop)
            raise stop from None
        raise
    except BaseException as e:
        outcome = f"incomplete: {type(e).__name__}"
        sink.end_on_refused(e)
        raise
    finally:
        with recorder.lock:  # no recorded thread is inside an op while the capture closes
            recorder.record_deaths()
            recorder.closed = True
        state.active = None
        stack.close()
        hook.remove()
        if recorder.wake_signal is not None:
            signal.signal(recorder.wake_signal, woke_before)
        patches.undo()
        torch.autograd.set_multithreading_enabled(multithreading)
        with recorder.lock:
            _note_script_conf(sink, recorder.script_conf, conf_before)
            _note_caught_value_reads(recorder, sys.exc_info()[1])
            _note_made_up_values(recorder)
            _note_flops(recorder)
            sink.close(outcome)
        recorder.outcome = outcome


def _note_made_up_values(recorder):
    """One trace line per site where a value was made up, with its count: the script's control
    flow there followed the stand-in, not the data (a loss compared, a token sampled)."""
    for row in recorder.made_up_summary():
        recorder.sink.comment(f"value made up: {row['read']} ×{row['count']} at {row['site']} (answered {recorder.scalar_value:g})")


def _note_flops(recorder):
    """The math the device would have done (`# flops: N ...`): what `advise` estimates a step's
    time from when none is given."""
    if recorder.flops:
        recorder.sink.comment(flops_line(recorder.flops))


def _close_on_hard_exit(recorder, patches, sink):
    """os._exit skips every `finally`: the trace would end without its closing line or its last
    buffered rows. The capturing process closes it first (a forked child, a DataLoader worker,
    exits on its own)."""
    real_exit, owner = os._exit, os.getpid()

    def hard_exit(code):
        if os.getpid() == owner and not recorder.closed:
            with recorder.lock:
                recorder.closed = True
                _note_caught_value_reads(recorder, None)
                _note_made_up_values(recorder)
                _note_flops(recorder)
                recorder.outcome = f"complete: {recorder.step_no} steps" if code == 0 else f"incomplete: exit status {code} (os._exit)"
                sink.close(recorder.outcome)
            if recorder.on_hard_exit is not None:
                recorder.on_hard_exit(code)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to flush
                    pass
        real_exit(code)

    patches.set(os, "_exit", hard_exit)


def _no_gpu_fusion(torch, stack):
    """TorchScript's profiling executor fuses a scripted function's elementwise ops into one GPU
    kernel from its third call on, compiled by the driver (NVRTC, libcuda): on fake CUDA the ops
    run unfused, as with torch._C._jit_override_can_fuse_on_gpu(False) (said when something is
    scripted: their intermediates are allocations a fused kernel would not make)."""
    can_fuse = getattr(torch._C, "_jit_can_fuse_on_gpu", None)
    override = getattr(torch._C, "_jit_override_can_fuse_on_gpu", None)
    if can_fuse is None or override is None:
        return
    before = can_fuse()
    override(False)
    stack.callback(override, before)


def _start(torch, recorder, stack, patches, fake, device):
    # Run backward on this thread: the op order is then the device thread's, deterministically.
    torch.autograd.set_multithreading_enabled(False)
    if not fake:
        # A rank of `--nproc-per-node --real --device cpu`: the fake process group, to check
        # against the same script's ranks with real collectives (gloo).
        from .ranks import install_fake_process_group

        install_fake_process_group(torch, patches.set)
    if recorder.blas is not None:
        _patch_blas_workspace_sizes(torch, recorder, patches, fake)
    original_empty_cache = torch.cuda.empty_cache

    def empty_cache():
        if not recorder.closed:
            recorder.sink.empty_cache()
        if not fake:
            original_empty_cache()

    patches.set(torch.cuda, "empty_cache", empty_cache)
    patches.set(torch.cuda.memory, "empty_cache", empty_cache)
    # Leaving the outermost autocast clears its cast cache (autocast.__exit__): an unordered map
    # of casts, freed in an address-dependent order.
    original_clear_autocast_cache = torch.clear_autocast_cache

    def clear_autocast_cache():
        with recorder.sink.frees_in_id_order():
            original_clear_autocast_cache()

    patches.set(torch, "clear_autocast_cache", clear_autocast_cache)
    original_resize = torch.UntypedStorage.resize_

    def resize_(storage, size):
        return recorder.resize_storage(storage, int(size), lambda: original_resize(storage, size))

    patches.set(torch.UntypedStorage, "resize_", resize_)
    _recorded_threads(threading, patches, recorder)
    _linear_bias_add_in_place(torch, patches, recorder)
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        _fake_tensor_fixes(torch, patches)
        # torch warns when its own code (an RNN's flatten_parameters, a storage's load) takes a
        # fake tensor's data pointer: the script did nothing wrong, and the address is unused.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        if device == "cuda":
            _fake_cuda_api(torch, patches, recorder)
            _no_gpu_fusion(torch, stack)
            _missing_meta_kernels(torch, stack)
            recorder.fake_mode = _no_device_init(FakeTensorMode)(allow_non_fake_inputs=True)
        else:
            # Checking the capture on CPU: every tensor is fake, as CUDA ones are in a real capture.
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
    stack.enter_context(recorder)
    recorder.exclusive_use_count = _probe_exclusive_use_count(torch, recorder, device)


