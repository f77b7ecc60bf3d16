"""What the user is told when the script stops: where (the line of their code), why, and the fix;
and the tracebacks, from the script's first frame, without the capture's own frames."""
from __future__ import annotations

import linecache
import os
import re
import runpy
import sys
import sysconfig
import traceback

from . import state
from .errors import FakeValueNeeded, NeedsDriver
from .fake_tensors import _REAL_CPU_BYTES

def _note_caught_value_reads(recorder, ending):
    """Reads of fake values the script caught (`except Exception`) and went on from: the code that
    needed the values did not run, so the trace lacks its work. Said on the terminal and in the trace."""
    ended_by = set()
    if _torchscript_error(ending, recorder) is not None:
        ended_by.add(recorder.dispatch_error[2])  # (the read TorchScript caught and raised again, emptied)
    while ending is not None and id(ending) not in ended_by:
        ended_by.add(id(ending))
        ending = ending.__cause__ or ending.__context__
    caught = [e for e in recorder.value_reads if not getattr(e, "handled", False) and id(e) not in ended_by]
    if not caught or recorder.sink.file.closed:
        return
    where = _user_line(caught[0].__traceback__)
    at = f" (the first at {where})" if where else ""
    what = f"{len(caught)} read{'s' if len(caught) > 1 else ''} of fake tensor values{at} {'were' if len(caught) > 1 else 'was'} caught"
    recorder.sink.comment(f"{what} and the run went on: the work that needed the values may be missing from this trace")
    print(f"allocbench capture: warning: {what} (an `except` in the script or a library) and the run went on, so the "
          "work that needed the values may be missing from the trace; drop --strict-values to answer such reads with a "
          "stand-in, guard them (`if not allocbench_capture.fake():`), or capture with --real on a GPU", file=sys.stderr)


def _user_line(tb):
    """"file:line `code`" of the innermost frame of `tb` in the user's code (not the capture's, a
    library or Python's own), or None."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        name = frame.f_code.co_filename
        if name.startswith("<") or state.is_ours(os.path.abspath(name)) or any(m in name for m in ("site-packages", "dist-packages", os.sep + "lib" + os.sep + "python")):
            continue
        found = (name, lineno)
    if found is None:
        return None
    text = linecache.getline(found[0], found[1]).strip()
    return f"{_shown_path(found[0])}:{found[1]}" + (f" `{text}`" if text else "")


def _frames(tb):
    """(file, line, function) of each frame of ``tb``, outermost first."""
    return [(frame.f_code.co_filename, lineno, frame.f_code.co_name) for frame, lineno in traceback.walk_tb(tb)]


def _failing_frames(exc):
    """The frames where ``exc`` was raised: a DataLoader worker's own for an error a worker process
    sent (_worker_errors_keep_their_frames), the scripted function's for one TorchScript lost
    (_torchscript_error), else its traceback's."""
    frames = getattr(exc, "origin_frames", None)
    return frames if frames is not None else _frames(exc.__traceback__)


def _script_frame(frames, script):
    """The innermost frame of the user's code (the script or its own modules, not torch or us)."""
    libraries = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    best = None
    for filename, lineno, _ in frames:
        name = os.path.abspath(filename)
        if state.is_ours(name) or name.startswith(libraries) or filename.startswith("<"):
            continue
        if "site-packages" in name or "dist-packages" in name:
            continue
        best = (name, lineno)
    return best or (os.path.abspath(script), 0)


def _line_of(path, line):
    text = linecache.getline(path, line).strip() if line else ""
    return f"{_shown_path(path)}:{line}", text


def _where(exc, script):
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        path, line = os.path.abspath(exc.filename), exc.lineno  # raised while compiling: no frame of its own
    else:
        path, line = _script_frame(_failing_frames(exc), script)
    return _line_of(path, line)


def _origin(exc, script):
    """For an error raised elsewhere than where the script met it (a DataLoader worker process,
    TorchScript): " (in DataLoader worker process N; the main process was at FILE:LINE `code`)"
    (" (in the TorchScript function F; called at ...)"), else ""."""
    where = getattr(exc, "origin_where", None)
    if getattr(exc, "origin_frames", None) is None or not where:
        return ""
    caller = getattr(exc, "caller_frames", None)
    main_at, text = _line_of(*_script_frame(_frames(exc.__traceback__) if caller is None else caller, script))
    code = f" `{text}`" if text else ""
    called = getattr(exc, "caller_words", "the main process was at")
    return f" ({where}; {called} {main_at}{code})"


_TORCHSCRIPT_FAILED = "The following operation failed in the TorchScript interpreter."


def _torchscript_error(exc, recorder):
    """TorchScript's interpreter turns a Python error raised inside it (by this capture's mode: a
    fake-value read, a call with no stand-in) into a RuntimeError whose last line is its class with
    an empty message. That error, remade from what the mode kept of it (Recorder.dispatch_error),
    its frames ending at the scripted function's line; else None."""
    text = str(exc) if isinstance(exc, RuntimeError) else ""
    kept = getattr(recorder, "dispatch_error", None)
    if _TORCHSCRIPT_FAILED not in text or kept is None:
        return None
    lines = text.rstrip("\n").splitlines()
    if not lines or not lines[-1].rstrip().endswith(":") or " " in lines[-1].strip():
        return None  # (a message of its own: TorchScript kept it)
    cls, message, _, on_cpu, fix = kept
    inner = cls.__new__(cls)
    inner.args = (message,)
    scripted = [(path, int(line), function) for path, line, function in
                (m.groups() for m in map(_TORCHSCRIPT_FRAME.match, lines) if m)]
    inner.caller_frames = _frames(exc.__traceback__)
    inner.origin_frames = inner.caller_frames + scripted
    inner.origin_where = f"in the TorchScript function {scripted[-1][2]}" if scripted else "in TorchScript"
    inner.caller_words = "called at"
    inner.on_cpu, inner.fix = on_cpu, fix
    return inner


_TORCHSCRIPT_FRAME = re.compile(r'\s*File "(.+)", line (\d+), in (\S+)')


def _shown_path(path):
    """`path` relative to the working directory when inside it, else as it is."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _library_frame(frames, script):
    """Where in a library (torch's public modules included) the failing call was made, when that is
    deeper than the user's own line: "file:line in function", else None."""
    torch_private = (os.sep + "torch" + os.sep + "_", os.sep + "torch" + os.sep + "utils" + os.sep + "_")
    innermost = None
    for name, lineno, function in frames:
        if state.is_ours(os.path.abspath(name)) or name.startswith("<") or any(p in name for p in torch_private):
            continue
        innermost = (os.path.abspath(name), lineno, function)
    if innermost is None or innermost[:2] == _script_frame(frames, script):
        return None
    path, line, function = innermost
    marker = next((m for m in ("site-packages" + os.sep, "dist-packages" + os.sep) if m in path), None)
    short = path.split(marker, 1)[1] if marker else os.path.basename(path)
    return f"{short}:{line} in {function}"


def _value_read(exc):
    """The read a FakeValueNeeded stands for: a comparison of values, or a number's."""
    if str(exc) in ("aten.equal.default", "aten.allclose.default"):
        return f"{exc} (torch.equal, torch.allclose: a bool read from the values)"
    return "aten._local_scalar_dense (.item(), bool(), float(), .tolist() of a tensor)"


def _fake_data_message(exc, script, fake_cpu=False):
    """The one-line message for a read of fake data; ``fake_cpu``: a --device cpu capture without
    --real, where every CPU tensor is fake."""
    where, text = _where(exc, script)
    code = f" `{text}`" if text else ""
    name = type(exc).__name__
    library = _library_frame(_failing_frames(exc), script)
    inside = f" (the read is in {library})" if library else ""
    inside += _origin(exc, script)
    if isinstance(exc, FakeValueNeeded) and str(exc) == "Tensor.numpy()":
        op = "Tensor.numpy()"
        fix = ("drop or guard the read (`if not allocbench_capture.fake():`), drop --strict-values to answer it with a "
               "stand-in (--scalar-value V: V in every element), or capture with --real on a GPU")
    elif isinstance(exc, FakeValueNeeded) and library:
        op = _value_read(exc)
        fix = ("drop --strict-values to answer such reads with a stand-in, --scalar-value V (a library's read steers its "
               "control flow: V decides which branch it takes), or capture with --real on a GPU")
    elif isinstance(exc, FakeValueNeeded):
        op = _value_read(exc)
        fix = ("drop or guard the read (`if not allocbench_capture.fake():`), drop --strict-values to answer such "
               "reads with a stand-in (0, or --scalar-value V), or capture with --real on a GPU")
    else:
        op = getattr(exc, "func", None) or str(exc).split("\n")[0][:120]
        fix = "this op's output shape depends on tensor values; capture with --real on a GPU"
    if fake_cpu:
        # --device cpu without --real: every CPU tensor is fake, whatever its size or origin.
        op += "; with --device cpu and no --real every CPU tensor is fake"
        fix = "capture with --real --device cpu to record real CPU tensors, or " + fix
    elif getattr(exc, "on_cpu", False):
        op += ("; the tensor is on the CPU but fake: a copy of a fake CUDA tensor, made by a CPU factory (torch.empty, "
               f"randn, zeros, ...) with over {_REAL_CPU_BYTES >> 20} MiB of floating-point output (those run on fake "
               "tensors too, so that a model built on the CPU need not fit this machine), or computed from such a tensor")
    return f"{where}:{code} needs real tensor data, but the capture runs on fake tensors ({name}: {op}){inside}; fix: {fix}"


def _is_driver_error(exc):
    """An error from the CUDA driver or runtime: on fake CUDA, a call that has no stand-in."""
    text = str(exc)
    return isinstance(exc, NeedsDriver) or type(exc).__name__ == "AcceleratorError" or any(
        m in text for m in ("CUDA driver version is insufficient", "Found no NVIDIA driver", "no CUDA GPUs are available",
                            "libcuda.so")
    )


def _driver_message(exc, script):
    where, text = _where(exc, script)
    code = f" `{text}`" if text else ""
    library = _library_frame(_failing_frames(exc), script)
    inside = (f" in {library}" if library else "") + _origin(exc, script)
    first = str(exc) if isinstance(exc, NeedsDriver) else str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    if getattr(exc, "fix", None):
        return f"{where}:{code} {first}{inside}; fix: {exc.fix}"
    hint = "; or, for an RNN, torch.backends.cudnn.enabled = False (records the non-cuDNN kernels)" if library and "rnn.py" in library else ""
    return (f"{where}:{code} reached the CUDA driver{inside}, which fake CUDA has no stand-in for ({first}); "
            f"fix: capture with --real on a GPU{hint}")


def _is_fake_data_error(exc):
    if isinstance(exc, FakeValueNeeded):
        return True
    try:
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    except ImportError:
        return False
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (DataDependentOutputException, DynamicOutputShapeException, FakeValueNeeded)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _from_the_script(tb):
    """``tb`` from the script's first frame on, as ``python script.py`` prints it: the frames
    that ran it (the capture's main, runpy's) left out, and those of a fake op's dispatch (the
    capture's wrappers, FakeTensorMode, meta kernels and decompositions: on a GPU the op fails in
    C++, so the traceback ends at the frame that called it). None when the script has no frame (a
    SyntaxError raised compiling it: its own lines say where)."""
    runpy_file = os.path.abspath(runpy.__file__)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen ") or state.is_ours(os.path.abspath(name)) or os.path.abspath(name) == runpy_file):
            break
        tb = tb.tb_next
    torch = sys.modules.get("torch")
    internal = [state.HERE]
    if torch is not None and getattr(torch, "__file__", None):
        package = os.path.dirname(os.path.abspath(torch.__file__))
        internal += [os.path.join(package, *p.split("/")) for p in (
            "_subclasses/", "_ops.py", "_meta_registrations.py", "_decomp/", "_refs/", "_prims", "_compile.py",
            "_dynamo/", "utils/_stats.py", "utils/_python_dispatch.py")]
    prev, node = tb, tb.tb_next if tb is not None else None
    while node is not None:
        if os.path.abspath(node.tb_frame.f_code.co_filename).startswith(tuple(internal)):
            prev.tb_next = None
            break
        prev, node = node, node.tb_next
    return tb


class SaysOnce:
    """say_once for a recorder of either backend: its ``skipped_calls`` (a set) and its sink's
    ``comment(text)`` (a trace line)."""

    def say_once(self, what, message, trace_note=None):
        """Tells the user ``what`` ``message`` once per capture (and the trace ``trace_note``)."""
        if what in self.skipped_calls:
            return
        self.skipped_calls.add(what)
        if trace_note:
            self.sink.comment(f"{what}: {trace_note}")
        print(f"allocbench capture: {what} {message}", file=sys.stderr)
