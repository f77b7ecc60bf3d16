"""The fake device itself: torch.cuda's device, memory and stream functions answered as a
one-GPU H100 machine would (``_fake_cuda_api``, which installs every part of fake CUDA), its
properties, and torch.compile / torch.jit / torch.profiler / determinism as they run without a GPU."""
from __future__ import annotations

import functools
import types

from ..card import FAKE_TOTAL_MEMORY, _alloc_conf_items, _conf_fraction
from ..errors import _NO_SUCH_DEVICE, _NO_SUCH_DEVICE_FIX, FakeValueNeeded, NeedsDriver
from ..fake_tensors import _quiet_meta_failures
from ..ops.ctc import _ctc_loss_with_host_lengths
from ..ops.sdpa import H100_SMS, _fake_cuda_sdpa
from ..threads import _worker_errors_keep_their_frames
from .constructors import _constructor_via_cpu, _fake_cuda_legacy_types, _sequence_indices
from .generators import _fake_cuda_generators
from .graphs import _fake_cuda_graphs_and_raw_blocks
from .modules import _padding_kept, _rnns_without_cudnn
from .processes import _fake_cuda_processes
from .save_load import _fake_cuda_serialization
from .streams import _FakeStream, _FakeStreams
from .tensors import _fake_data_pointers, _fake_deep_copies

# What the fake device reports: an H100 SXM 80 GB, the card the replay defaults to.
FAKE_DEVICE_NAME = "NVIDIA H100 80GB HBM3 (allocbench fake CUDA)"
FAKE_DEVICE_UUID = "00000000-0000-0000-0000-000000000000"


class _FakeDeviceProperties(types.SimpleNamespace):
    """torch.cuda.get_device_properties() of the fake card: _CudaDeviceProperties' fields and repr."""

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory >> 20}MB, multi_processor_count={self.multi_processor_count}, "
                f"uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id}, L2_cache_size={self.L2_cache_size >> 20}MB)")


def _profiler_without_cuda(torch, patches, recorder):
    """torch.profiler on fake CUDA profiles the CPU side only: no kernel runs, and its CUDA activity
    would ask the driver for an event at every op (a warning with a C++ stack each). PyTorch turns
    CUDA profiling off the same way when CUDA is not available (autograd.profiler.profile); said once."""
    from torch.autograd.profiler import ProfilerActivity, ProfilerState

    original = torch.autograd.profiler.profile.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if getattr(self, "use_device", None) != "cuda":
            return
        self.use_device = None
        self.kineto_activities.discard(ProfilerActivity.CUDA)
        if self.profiler_kind == ProfilerState.KINETO_GPU_FALLBACK:
            self.profiler_kind = ProfilerState.KINETO
        if not self.kineto_activities:
            self.kineto_activities.add(ProfilerActivity.CPU)  # (CUDA alone asked: the CPU side, not nothing)
        recorder.say_once("torch.profiler", "records CPU activity only on fake CUDA (no kernel runs): its CUDA activity is off",
                          "the profiler's CUDA activity off (no kernel runs)")

    functools.update_wrapper(__init__, original)
    patches.set(torch.autograd.profiler.profile, "__init__", __init__)


def _eager_optimized_module(torch, model):
    """What torch.compile(model) answers, an OptimizedModule around ``model`` (its ``_orig_mod``; its
    state_dict keys start "_orig_mod."), whose forward runs ``model`` eagerly (dynamo disabled)."""
    try:
        from torch._dynamo.eval_frame import DisableContext, OptimizedModule
    except ImportError:  # (a torch without dynamo: the module itself)
        return model
    return OptimizedModule(model, DisableContext())


def _fake_cuda_api(torch, patches, recorder):
    """Makes torch.cuda answer as a one-GPU machine would, without touching a driver."""
    cuda = torch.cuda
    # (Unbounded: answers as the --card's memory, else an H100's.)
    total_memory = recorder.sink.capacity or recorder.sink.reported_memory or FAKE_TOTAL_MEMORY
    props = _FakeDeviceProperties(
        name=FAKE_DEVICE_NAME, total_memory=total_memory, major=9, minor=0,
        multi_processor_count=H100_SMS, is_integrated=False, is_multi_gpu_board=False,
        L2_cache_size=50 * 1024 * 1024, warp_size=32, gcnArchName="",
        # An H100 SXM5's cudaDeviceProp (clock rates in kHz, as CUDA gives them).
        max_threads_per_block=1024, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
        shared_memory_per_block=48 * 1024, shared_memory_per_block_optin=227 * 1024,
        shared_memory_per_multiprocessor=228 * 1024, clock_rate=1980000, memory_clock_rate=2619000,
        memory_bus_width=5120, pci_bus_id=0, pci_device_id=0, pci_domain_id=0, uuid=FAKE_DEVICE_UUID,
    )
    stats = recorder.sink.memory_stats
    allocated = lambda *a, **k: stats.current()  # noqa: E731
    peak = lambda *a, **k: stats.peak()  # noqa: E731
    fraction = [1.0]

    def set_per_process_memory_fraction(value, device=None):
        # The replay's cap, not the capture's: say so in the trace and on the terminal.
        if not 0 <= value <= 1:
            raise ValueError(f"Invalid fraction value: {value}. Allowed range: 0~1")
        fraction[0] = recorder.sink.fraction = float(value)
        recorder.script_conf["per_process_memory_fraction"] = f"{float(value):g}"

    def set_allocator_settings(env):
        # torch.cuda.memory._set_allocator_settings: the replay's settings (said in the trace); a
        # memory fraction among them also caps the fake card, as set_per_process_memory_fraction.
        items = _alloc_conf_items(env)
        recorder.script_conf.update(items)
        value = _conf_fraction(items)
        if value is not None:
            fraction[0] = recorder.sink.fraction = value

    def not_on_fake_cuda(what, result=None):
        def skipped(*args, **kwargs):
            recorder.say_once(what, "is skipped on fake CUDA (the trace records the allocations)")
            return result
        return skipped

    def set_device(device):
        index = torch.cuda._utils._get_device_index(device, optional=True)
        if index > 0:
            raise NeedsDriver(_NO_SUCH_DEVICE.format(device=f"cuda:{index}"), fix=_NO_SUCH_DEVICE_FIX)

    answers = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": set_device,
        "init": lambda: None,
        "_lazy_init": lambda: None,
        "is_bf16_supported": lambda including_emulation=True: True,
        "get_device_name": lambda device=None: FAKE_DEVICE_NAME,
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": lambda device=None: props,
        "get_arch_list": lambda: ["sm_90"],
        "memory_allocated": allocated,
        "max_memory_allocated": peak,
        "memory_reserved": allocated,
        "max_memory_reserved": peak,
        "memory_stats_as_nested_dict": lambda device=None: stats.nested(),
        "reset_peak_memory_stats": lambda device=None: stats.reset_peak(),
        "reset_max_memory_allocated": lambda device=None: stats.reset_peak(),
        "reset_max_memory_cached": lambda device=None: stats.reset_peak(),
        "reset_accumulated_memory_stats": lambda device=None: stats.reset_accumulated(),
        "mem_get_info": lambda device=None: (max(0, total_memory - stats.current()), total_memory),
        "set_per_process_memory_fraction": set_per_process_memory_fraction,
        "get_per_process_memory_fraction": lambda device=None: fraction[0],
        # torch.cuda.device(i) swaps the current device through the driver; there is one device.
        "_exchange_device": lambda device: 0 if device >= 0 else -1,
        "_maybe_exchange_device": lambda device: 0 if device >= 0 else -1,
        # Memory snapshots need the driver's allocator: the trace is this capture's snapshot.
        "_record_memory_history": not_on_fake_cuda("torch.cuda.memory._record_memory_history"),
        "_dump_snapshot": not_on_fake_cuda("torch.cuda.memory._dump_snapshot"),
        "_set_allocator_settings": set_allocator_settings,
    }
    streams = _FakeStreams(recorder.sink)
    recorder.fake_streams = streams
    answers.update(
        current_stream=lambda device=None: streams.current(),
        default_stream=lambda device=None: streams.default,
        set_stream=streams.set_current,
        synchronize=lambda device=None: recorder.sink.sync(None),
        Stream=streams.Stream,
        Event=streams.Event,
        stream=streams.context,
        StreamContext=streams.context,
        is_current_stream_capturing=lambda: streams.current().stream_id in streams.capturing,
    )
    for name, fn in answers.items():
        if hasattr(cuda, name):
            patches.set(cuda, name, fn)
    # torch.tensor(data, device="cuda") copies the data to the device inside its C++ constructor,
    # below the dispatcher, so it would reach the driver: build on the CPU, then copy into one
    # dispatched (fake) CUDA tensor, the one allocation the real constructor makes.
    tensor = _constructor_via_cpu(torch, torch.tensor)
    patches.set(torch, "tensor", tensor)
    patches.set(torch, "as_tensor", _constructor_via_cpu(torch, torch.as_tensor, takes_requires_grad=False, shares=True))
    patches.set(torch, "asarray", _constructor_via_cpu(torch, torch.asarray, shares=True))
    original_new_tensor = torch.Tensor.new_tensor

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False, **kwargs):
        # t.new_tensor(data): torch.tensor with t's dtype and device unless given.
        device = self.device if device is None else device
        if torch.device(device).type != "cuda" or kwargs:
            return original_new_tensor(self, data, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        return tensor(data, dtype=self.dtype if dtype is None else dtype, device=device, requires_grad=requires_grad)

    patches.set(torch.Tensor, "new_tensor", new_tensor)
    _sequence_indices(torch, patches, tensor)
    _fake_deep_copies(torch, patches, recorder)
    _quiet_meta_failures(patches)
    # nn.MultiheadAttention and TransformerEncoderLayer in inference take a fused fast path whose
    # kernels allocate their intermediates inside, where a fake run sees only the outputs: run
    # their unfused ops, the same maths with its buffers recorded (and no nested tensors).
    mha = getattr(torch.backends, "mha", None)
    if mha is not None and hasattr(mha, "get_fastpath_enabled"):
        patches.set(mha, "get_fastpath_enabled", lambda: False)
    _padding_kept(torch, patches, recorder)
    _profiler_without_cuda(torch, patches, recorder)
    # Data pointers: a fake storage has none (0 for all), and libraries tell storages apart by
    # them (transformers' save_pretrained finds shared tensors so): each recorded allocation gets
    # an address of its own, as on the device.
    _fake_data_pointers(torch, patches, recorder)
    # An RNN packs its cuDNN weights (flatten_parameters) when their data pointers differ, as they
    # now do, through a cuDNN call that needs the driver: left as it was with the pointers all 0
    # (unpacked; the forward says what to do about cuDNN).
    patches.set(torch.nn.modules.rnn.RNNBase, "flatten_parameters", lambda self: None)
    _rnns_without_cudnn(torch, patches, recorder)
    # torch.compile would trace and compile for a GPU that is not there: run the model eagerly and
    # say so in the trace (eager mode allocates more temporaries than fused kernels do).
    def compile_eagerly(model=None, *args, **kwargs):
        recorder.say_once("torch.compile", "is ignored on fake CUDA (CUDA graphs of mode=\"reduce-overhead\" too); the trace "
                          "records eager mode", "ignored: eager allocations recorded (compiled kernels fuse some temporaries)")
        if model is None:
            return lambda fn: fn
        return _eager_optimized_module(torch, model) if isinstance(model, torch.nn.Module) else model

    patches.set(torch, "compile", compile_eagerly)
    # The CUDA kernels' alertNotDeterministic checks are not modelled (nor the deterministic
    # variants some ops switch to): said once, when the script turns determinism on.
    original_use_deterministic = torch.use_deterministic_algorithms

    def use_deterministic_algorithms(mode, *args, **kwargs):
        original_use_deterministic(mode, *args, **kwargs)
        if mode:
            recorder.say_once("torch.use_deterministic_algorithms(True)", "is not enforced on fake CUDA: an op whose CUDA kernel "
                              "has no deterministic implementation (bilinear interpolate's backward, histc...) runs and is recorded "
                              "where a GPU raises, and the deterministic variants of index_put, scatter_add_ and cumsum are not "
                              "modelled", "not enforced (ops a GPU refuses are recorded)")

    functools.update_wrapper(use_deterministic_algorithms, original_use_deterministic)  # (its __doc__ is read: _CublasWorkspaces)
    patches.set(torch, "use_deterministic_algorithms", use_deterministic_algorithms)
    # torch.jit.trace checks its trace (check_trace, on by default) by comparing output values,
    # which fake tensors do not have: the trace is taken and its check skipped.
    original_jit_trace = torch.jit.trace

    def jit_trace(func, *args, **kwargs):
        args = list(args)
        if len(args) >= 3:  # trace(func, example_inputs, optimize, check_trace, ...)
            args[2] = False
        else:
            kwargs["check_trace"] = False
        recorder.say_once("torch.jit.trace", "skips its output check on fake CUDA (it compares values)", "its check_trace skipped")
        return original_jit_trace(func, *args, **kwargs)

    patches.set(torch.jit, "trace", jit_trace)
    original_jit_script = torch.jit.script

    def jit_script(obj, *args, **kwargs):
        recorder.say_once("torch.jit.script", "runs unfused on fake CUDA (TorchScript's GPU fuser compiles kernels "
                          "with the driver): a fused kernel's intermediates are recorded as separate allocations",
                          "GPU fusion off (fused intermediates recorded)")
        return original_jit_script(obj, *args, **kwargs)

    functools.update_wrapper(jit_script, original_jit_script)
    patches.set(torch.jit, "script", jit_script)
    # nn.init.trunc_normal_ redraws until no sample falls outside [a, b], reading `mask.any()` each
    # time: on fake tensors the draws have no values. Every sample is taken as accepted on the
    # first draw (with the default bounds, ±2 around a small std, the real loop ends there too):
    # one pass of the loop, its temporaries recorded.
    init = torch.nn.init
    original_trunc_normal = getattr(init, "_no_grad_trunc_normal_", None)

    def trunc_normal(tensor, *args, **kwargs):
        if not isinstance(tensor, torch._subclasses.fake_tensor.FakeTensor):
            return original_trunc_normal(tensor, *args, **kwargs)
        recorder.say_once("nn.init.trunc_normal_", "takes every sample as accepted on its first draw on fake CUDA (one pass of its rejection loop is recorded)",
                          "every sample accepted on its first draw")
        # (The capture's own choice, not a value made up for the script: not counted as one.)
        saved, recorder.scalar_value = recorder.scalar_value, 0
        recorder.quiet_values += 1
        try:
            return original_trunc_normal(tensor, *args, **kwargs)
        finally:
            recorder.scalar_value = saved
            recorder.quiet_values -= 1

    if original_trunc_normal is not None:
        patches.set(init, "_no_grad_trunc_normal_", trunc_normal)
    _fake_cuda_generators(torch, patches)
    _fake_cuda_graphs_and_raw_blocks(torch, patches, recorder, streams)
    _fake_cuda_serialization(torch, patches, recorder)
    _fake_cuda_processes(torch, patches)
    _fake_cuda_legacy_types(torch, patches)
    # DataLoader(pin_memory=True) pins batches, on a thread of its own with num_workers > 0
    # (dispatch modes are per thread): pinned host memory needs the driver and is not measured.
    import torch.utils.data._utils.pin_memory as pinning

    from torch.utils._pytree import tree_leaves

    def pin_batch(data, device=None):
        # The batch's host memory as it is, answered pinned (is_pinned()) as on a GPU machine.
        with recorder.lock:
            for leaf in tree_leaves(data):
                recorder.mark_pinned(leaf)
        return data

    patches.set(pinning, "pin_memory", pin_batch)
    _worker_errors_keep_their_frames(patches)
    functional = torch.nn.functional
    patches.set(functional, "scaled_dot_product_attention", _fake_cuda_sdpa(torch, functional.scaled_dot_product_attention))
    patches.set(torch, "ctc_loss", _ctc_loss_with_host_lengths(torch, torch.ctc_loss))
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        for name, fn in dict(
            device_count=lambda: 1, is_available=lambda: True, current_device_index=lambda: 0,
            current_device_idx=lambda: 0, set_device_index=lambda device: None, set_device_idx=lambda device: None,
            current_stream=lambda device=None: streams.current(), set_stream=streams.set_current,
            synchronize=lambda device=None: recorder.sink.sync(None),
            current_accelerator=lambda check_available=False: torch.device("cuda"),
            # The device-generic memory API answers as torch.cuda's stand-ins do (looked up at
            # the call: they are patched below).
            empty_cache=lambda: cuda.empty_cache(),
            memory_stats=lambda *device: cuda.memory_stats(),
            memory_allocated=lambda *device: cuda.memory_allocated(),
            max_memory_allocated=lambda *device: cuda.max_memory_allocated(),
            memory_reserved=lambda *device: cuda.memory_reserved(),
            max_memory_reserved=lambda *device: cuda.max_memory_reserved(),
            reset_peak_memory_stats=lambda *device: cuda.reset_peak_memory_stats(),
            reset_accumulated_memory_stats=lambda *device: cuda.reset_accumulated_memory_stats(),
            get_memory_info=lambda *device: cuda.mem_get_info(),
        ).items():
            if hasattr(accelerator, name):
                patches.set(accelerator, name, fn)
    # The accelerator torch's device-generic code asks for (FSDP2 without a mesh, for one).
    patches.set(torch._C, "_get_accelerator", lambda check_available=False: torch.device("cuda"))
    # torch.cuda.memory's own functions (memory_stats, memory_summary) call these by their names there.
    for module in (cuda.memory, getattr(cuda, "random", None)):
        for name, fn in answers.items():
            if module is not None and hasattr(module, name):
                patches.set(module, name, fn)
    # tensor.record_stream(s): a row, unless s is the block's own stream (CUDACachingAllocator
    # recordStream ignores that use).
    original_record_stream = torch.Tensor.record_stream

    def record_stream(self, stream):
        if isinstance(stream, _FakeStream):
            return recorder.record_stream(self, stream.stream_id)
        return original_record_stream(self, stream)

    patches.set(torch.Tensor, "record_stream", record_stream)
    # .numpy() of a fake tensor: the values are not there (as for .item()), unless the capture
    # knows them (Note [Known values]).
    original_numpy = torch.Tensor.numpy
    fake_type = torch._subclasses.fake_tensor.FakeTensor

    def numpy(self, *args, **kwargs):
        if isinstance(self, fake_type):
            force = kwargs.get("force", args[0] if args else False)
            if self.device.type != "cpu" and not force:
                raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
            if self.requires_grad and not force:
                raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
            contents = recorder.known_contents(self)
            if contents is None and recorder.scalar_value is not None:
                # A read of values (`loss.detach().cpu().numpy()`, logging) is answered as .item()
                # is: every element the stand-in.
                recorder.made_up_value(".numpy()")
                with torch.utils._python_dispatch._disable_current_modes():
                    contents = torch.full(tuple(self.shape), recorder.scalar_value, dtype=self.dtype, device="cpu")
            if contents is None:
                raise FakeValueNeeded("Tensor.numpy()", on_cpu=self.device.type == "cpu")
            return original_numpy(contents.clone())
        return original_numpy(self, *args, **kwargs)

    patches.set(torch.Tensor, "numpy", numpy)


