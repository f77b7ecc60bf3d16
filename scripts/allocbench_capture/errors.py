"""The exceptions a capture raises or tells apart, and its exit codes.

StopCapture ends a capture at --steps; FakeValueNeeded is a read of a fake tensor's value;
NeedsDriver a call fake CUDA has no stand-in for; SetupError a capture that could not start. They
are pickled as ``allocbench_capture.NAME`` (the package exports them): a DataLoader worker sends
its error to the main process pickled, and a class pickle cannot find would leave that process
waiting for ever."""
from __future__ import annotations

from . import state

EXIT_SETUP_ERROR = 2
EXIT_SCRIPT_ERROR = 1


class StopCapture(BaseException):
    """Raised from the optimizer hook once --steps steps are captured (a BaseException, so a
    script's ``except Exception`` does not swallow it)."""


class FakeValueNeeded(RuntimeError):
    """The script read the value of a fake tensor (``.item()``, ``bool()``, ``.tolist()``...).
    ``on_cpu``: the tensor was a CPU one (Note [Real CPU, fake CUDA]: large ones are fake)."""

    def __init__(self, message, on_cpu=False):
        super().__init__(message)
        self.on_cpu = on_cpu
        # Kept, so that a read the script catches and goes on from can be told at the end.
        if state.active is not None:
            state.active.value_reads.append(self)


class NeedsDriver(RuntimeError):
    """The script called something fake CUDA has no stand-in for (it would reach the CUDA driver).
    ``fix``: what to do instead, where a GPU would not help either."""

    def __init__(self, message, fix=None):
        super().__init__(message)
        self.fix = fix


class SetupError(RuntimeError):
    """The capture could not start (no torch, no compiler, an unsupported torch ABI...)."""


for _exception in (StopCapture, FakeValueNeeded, NeedsDriver, SetupError):
    _exception.__module__ = "allocbench_capture"

# A device past the fake machine's one GPU (torch.cuda.device_count() answers 1), as CUDA says it.
_NO_SUCH_DEVICE = "CUDA error: invalid device ordinal ({device}: the fake machine has one GPU, cuda:0)"
_NO_SUCH_DEVICE_FIX = ("capture one device's share on cuda:0 (a model split over GPUs: each part in a capture of "
                       "its own), or capture with --real on a machine with that GPU")
