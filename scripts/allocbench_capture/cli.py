"""``python -m allocbench_capture``: runs a script under a capture and writes its outcome (the
``--status`` JSON ``allocbench capture`` reads, and the message for the user)."""
from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

from . import driver_build
from .capture import capture
from .card import FAKE_TOTAL_MEMORY
from .driver_capture import capture_on_driver
from .errors import EXIT_SCRIPT_ERROR, EXIT_SETUP_ERROR, SetupError
from .messages import (
    _driver_message,
    _fake_data_message,
    _from_the_script,
    _is_driver_error,
    _is_fake_data_error,
    _torchscript_error,
    _where,
)

def _write_status(path, **status):
    if not path:
        return
    with open(path, "w") as f:
        json.dump(status, f)


# Set in the process that runs the script on the driver backend: the built stack (JSON).
_DRIVER_STACK = "ALLOCBENCH_DRIVER_STACK"


def _restart_on_driver(opts):
    """The driver backend's fake CUDA libraries must be in place before torch loads NVIDIA's:
    builds them (cached) and starts this same command again with them preloaded."""
    stack = driver_build.build()
    env = dict(os.environ)
    env[_DRIVER_STACK] = json.dumps(stack)
    env["LD_PRELOAD"] = ":".join([*stack["preload"], *filter(None, env.get("LD_PRELOAD", "").split(":"))])
    # torch and Triton dlopen libcuda.so.1 by name (Triton from TRITON_LIBCUDA_PATH's folder).
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [stack["lib_dir"], env.get("LD_LIBRARY_PATH", "")]))
    env["TRITON_LIBCUDA_PATH"] = stack["lib_dir"]
    # The card: bounded by --device-memory (OutOfMemoryError past it, from PyTorch's own
    # allocator), else as large as the fake's address space allows, answering as --card-memory.
    env["ALLOCBENCH_FAKE_CAPACITY"] = str(opts.device_memory or _UNBOUNDED_BYTES)
    env["ALLOCBENCH_FAKE_REPORTED_MEMORY"] = str(opts.device_memory or opts.card_memory or FAKE_TOTAL_MEMORY)
    env["ALLOCBENCH_FAKE_NAME"] = "allocbench fake GPU (driver backend)"
    env["ALLOCBENCH_FAKE_DEVICES"] = str(opts.gpus)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


# The unbounded fake card's memory: 1 PiB (no OutOfMemoryError; the replay decides).
_UNBOUNDED_BYTES = 1 << 50


def _auto_backend(opts):
    """--backend auto (the default): PyTorch's own CUDA path (the driver backend) where this torch
    is a CUDA build and the fake CUDA stack builds for it; else the fake-tensor backend, said in
    one line. Options only one backend has choose it."""
    if opts.real or opts.device == "cpu" or opts.cublas_workspace_mib is not None:
        return "fake-tensors"
    if opts.gpus > 1 or os.environ.get(_DRIVER_STACK):
        return "driver"
    try:
        from .driver_build import build

        build()
    except SetupError as e:
        print(f"allocbench capture: capturing on fake tensors: the driver backend cannot run here ({e})", file=sys.stderr)
        return "fake-tensors"
    return "driver"


def main(argv=None):
    # (The description: the first paragraph of the package's docstring.)
    parser = argparse.ArgumentParser(prog="python -m allocbench_capture", description=sys.modules[__package__].__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="the trace to write (v1 CSV)")
    parser.add_argument("--steps", type=int, help="stop after this many steps")
    parser.add_argument("--real", action="store_true", help="record real tensors (needs a GPU for cuda)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="the device whose storages are recorded")
    parser.add_argument("--cublas-workspace-mib", type=int, help="the modelled cuBLAS workspace (default: CUBLAS_WORKSPACE_CONFIG's, 32 MiB when unset; 0: none)")
    parser.add_argument("--scalar-value", type=float, help="answer reads of fake values (.item(), .numpy()) with this value (default 0)")
    parser.add_argument("--strict-values", action="store_true", help="stop at the first read of a fake value instead of answering it")
    parser.add_argument("--progress", help="write the capture's progress here twice a second (JSON, for allocbench capture)")
    parser.add_argument("--no-sites", action="store_true", help="leave out the allocation sites (#site/#at lines)")
    parser.add_argument("--device-memory", type=int, help="the fake card's memory in bytes: OutOfMemoryError past it (default: unbounded, answering as an H100 80 GB)")
    parser.add_argument("--card-memory", type=int, help="the memory the unbounded fake card reports (default: an H100 80 GB's)")
    parser.add_argument("--status", help="write the outcome as JSON here (for allocbench capture)")
    parser.add_argument("--gpus", type=int, default=1, help="fake GPUs in the process (driver backend): one trace per device used")
    parser.add_argument("--backend", default="auto", choices=["auto", "fake-tensors", "driver"],
                        help="fake-tensors: FakeTensorMode and rules for what a GPU does; driver: PyTorch's own CUDA path on a fake CUDA runtime; "
                             "auto (default): driver where this torch is a CUDA build and the fake stack builds, else fake-tensors")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        argv = argv[:cut] + argv[cut + 1:]
    opts = parser.parse_args(argv)
    status = dict(trace=opts.output, script=opts.script)

    def say(message):
        # Under allocbench capture (--status) the caller prints the outcome.
        if not opts.status:
            print(f"allocbench capture: {message}", file=sys.stderr)

    def fail_setup(message):
        say(message)
        _write_status(opts.status, state="setup_error", exit_code=EXIT_SETUP_ERROR, message=message, **status)
        return EXIT_SETUP_ERROR

    if opts.steps is not None and opts.steps < 1:
        return fail_setup("--steps must be at least 1")
    if os.path.isdir(opts.script):
        return fail_setup(f"{opts.script}: is a directory, not a script")
    if not os.path.isfile(opts.script):
        return fail_setup(f"{opts.script}: no such script")
    if opts.gpus < 1 or opts.gpus > 16:
        return fail_setup(f"--gpus {opts.gpus}: between 1 and 16 fake GPUs")
    if opts.backend == "auto":
        opts.backend = _auto_backend(opts)
    status["backend"] = opts.backend
    if opts.gpus > 1 and opts.backend != "driver":
        return fail_setup("--gpus gives several fake GPUs on the driver backend: add --backend driver")
    if opts.backend == "driver":
        refused = [flag for flag, given in (("--real", opts.real), ("--device cpu", opts.device == "cpu"),
                                            ("--cublas-workspace-mib", opts.cublas_workspace_mib is not None)) if given]
        if refused:
            return fail_setup(f"{refused[0]} is a fake-tensors option: the driver backend runs PyTorch's own CUDA path (reads get the "
                              "stand-in, cuBLAS workspaces are PyTorch's own); drop it or use --backend fake-tensors")
        if not os.environ.get(_DRIVER_STACK):
            try:
                _restart_on_driver(opts)
            except SetupError as e:
                return fail_setup(str(e))
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return fail_setup(
            f"no torch in {sys.executable} ({e}): install it there (pip install torch), or name a Python that has it "
            "with --python or ALLOCBENCH_PYTHON"
        )

    def terminated(signum, frame):
        # `timeout`, `kill` or a scheduler's time limit: stop as Ctrl-C does, keeping the rows.
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    script = os.path.abspath(opts.script)
    sys.argv = [opts.script, *opts.args]
    sys.path.insert(0, os.path.dirname(script))
    exit_code, state, message = 0, "complete", ""
    recorder = None

    def write_status(state, exit_code, message):
        sink = recorder.sink if recorder is not None else None
        _write_status(
            opts.status, state=state, exit_code=exit_code, message=message,
            outcome=getattr(recorder, "outcome", ""), steps=getattr(recorder, "step_no", 0),
            allocs=sink.allocs if sink else 0, frees=sink.frees if sink else 0,
            peak_live_bytes=sink.peak_live_bytes if sink else 0, live_bytes_at_end=sink.live_bytes if sink else 0,
            ooms=sink.memory_stats.num_ooms if sink else 0, device_memory=sink.capacity if sink else None,
            fake=not opts.real, rows=sink.rows if sink else 0,
            values_made_up=recorder.made_up_summary() if recorder is not None else [],
            device_traces=getattr(recorder, "device_traces", []),
            role=getattr(recorder, "role", None), same_role_as=getattr(recorder, "same_role_as", None),
            gpu_benchmarks=getattr(recorder, "gpu_benchmarks", 0),
            stand_in=recorder.scalar_value if recorder is not None else None,
            dispatch_seconds=round(recorder.dispatch_seconds, 3) if recorder is not None else 0.0,
            capture_seconds=round(time.monotonic() - recorder.started, 3) if recorder is not None else 0.0,
            **status,
        )

    def hard_exit_status(code):
        # The script called os._exit(code): the process ends there, as the script asked.
        exit_code = code & 0xFF  # (as the shell sees it)
        write_status("complete" if exit_code == 0 else "script_error", exit_code,
                     f"the script exited with status {exit_code} (os._exit)" if exit_code else "")

    if opts.backend == "driver":
        active = capture_on_driver(opts.output, json.loads(os.environ[_DRIVER_STACK]), steps=opts.steps,
                                   comments=[f"script: {' '.join([opts.script, *opts.args])}"], scalar_value=opts.scalar_value,
                                   site_root=os.path.dirname(script), strict_values=opts.strict_values, sites=not opts.no_sites)
    else:
        active = capture(
            opts.output, fake=not opts.real, device=opts.device, steps=opts.steps,
            cublas_workspace_mib=opts.cublas_workspace_mib, scalar_value=opts.scalar_value,
            strict_values=opts.strict_values, progress=opts.progress, card_memory=opts.card_memory,
            comments=[f"script: {' '.join([opts.script, *opts.args])}"],
            sites=not opts.no_sites, site_root=os.path.dirname(script), device_memory=opts.device_memory,
        )
    try:
        with active as recorder:
            recorder.on_hard_exit = hard_exit_status
            runpy.run_path(script, run_name="__main__")
    except SetupError as e:
        return fail_setup(str(e))
    except SystemExit as e:
        code = e.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        state = "complete" if exit_code == 0 else "script_error"
        message = f"the script exited with status {exit_code}" if exit_code else ""
    except KeyboardInterrupt:
        exit_code, state, message = 130, "interrupted", "interrupted"
    except BaseException as e:  # noqa: BLE001 - the script's own error passes through
        lost = _torchscript_error(e, recorder)
        # (On the driver backend a CUDA error is the fake runtime's own, already naming its call.)
        fake_cuda = not opts.real and opts.backend == "fake-tensors"
        if lost is not None and (_is_fake_data_error(lost) or (fake_cuda and _is_driver_error(lost))):
            e = lost
        if _is_fake_data_error(e):
            message = _fake_data_message(e, script, fake_cpu=not opts.real and opts.device == "cpu")
            say(message)
            state = "fake_data"
        elif fake_cuda and _is_driver_error(e):
            message = _driver_message(e, script)
            say(message)
            state = "fake_data"
        else:
            traceback.print_exception(type(e), e, _from_the_script(e.__traceback__))
            if lost is not None:
                # The error TorchScript emptied, as a GPU run would have printed it.
                print(f"{type(lost).__name__}: {lost}", file=sys.stderr)
                e = lost
            where, _ = _where(e, script)
            message = f"the script raised {type(e).__name__} at {where}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
            state = "script_error"
        exit_code = EXIT_SCRIPT_ERROR
    write_status(state, exit_code, message)
    # A script's thread can outlive a capture that stopped the script (--steps, an error): a
    # producer blocked on a full queue would keep the interpreter from exiting, and the trace and
    # status are written. Leave without waiting for such threads, as no step of theirs is recorded.
    stopped = state != "complete" or "(--steps)" in getattr(recorder, "outcome", "")
    main_thread = threading.main_thread()
    if stopped and any(t.is_alive() and not t.daemon and t is not main_thread for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(exit_code)
    return exit_code

