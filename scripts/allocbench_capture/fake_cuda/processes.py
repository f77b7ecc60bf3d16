"""What would start other processes or reach NCCL on fake CUDA: init_process_group, DDP and
torch.multiprocessing's spawn end the capture with the fix (a NeedsDriver); torch.distributions'
argument checks (which read values) are off by default."""
from __future__ import annotations

from ..errors import NeedsDriver


def _fake_cuda_processes(torch, patches):
    """NCCL, DDP and worker processes on fake CUDA, and torch.distributions' argument checks."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    # NCCL needs the driver, and would abort the interpreter (no Python error) at its first call.
    distributed = torch.distributed
    if distributed.is_available():
        original_init = distributed.init_process_group

        def init_process_group(backend=None, *args, **kwargs):
            device = kwargs.get("device_id")
            if backend is None or "nccl" in str(backend).lower() or (device is not None and "cuda" in str(device)):
                raise NeedsDriver(
                    f"torch.distributed.init_process_group(backend={backend!r}) starts NCCL; capture one rank without "
                    "the process group (each rank allocates what one process does, apart from DDP's buckets)"
                )
            return original_init(backend, *args, **kwargs)

        patches.set(distributed, "init_process_group", init_process_group)
        ddp = torch.nn.parallel.DistributedDataParallel
        original_ddp_init = ddp.__init__

        def ddp_init(self, module, *args, **kwargs):
            # DDP checks and broadcasts the parameters' values across ranks (gloo too): fake
            # tensors have none.
            if any(isinstance(p, fake_type) and p.device.type == "cuda" for p in module.parameters()):
                raise NeedsDriver(
                    "DistributedDataParallel exchanges the parameters' values between ranks, which fake CUDA tensors do not have",
                    fix="capture one rank without DDP (wrap the model only `if not allocbench_capture.fake()`): each rank "
                    "allocates what one process does, apart from DDP's gradient buckets (about the parameters' size)",
                )
            return original_ddp_init(self, module, *args, **kwargs)

        patches.set(ddp, "__init__", ddp_init)
    # Worker processes start without the capture (a new interpreter): their allocations would go unrecorded.
    import torch.multiprocessing as torch_mp

    def not_followed(what):
        def refuse(*args, **kwargs):
            raise NeedsDriver(
                f"{what} starts worker processes, which the capture does not follow",
                fix="call the worker in the script's own process (e.g. worker(0, ...)) to capture one rank",
            )
        return refuse

    for name in ("spawn", "start_processes"):
        if hasattr(torch_mp, name):
            patches.set(torch_mp, name, not_followed(f"torch.multiprocessing.{name}"))
    # torch.distributions validates its arguments by reading them (bool(constraint.check(x).all())):
    # by default off on fake CUDA, as `python -O` has it (a script's validate_args=True still reads).
    patches.set(torch.distributions.Distribution, "_validate_args", False)

