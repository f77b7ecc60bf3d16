"""BLAS ops (mm, bmm, addmm, mv, dot, _scaled_mm...): the cuBLAS and cuBLASLt workspaces their CUDA
kernels take, the determinism check they make, and the mixed dtypes they refuse.

The workspaces are modelled as the torch running the capture takes them (see the note below);
``_patch_blas_workspace_sizes`` follows the sizes a script sets. The rules: ``after_outputs``
takes a call's workspace after its output, ``refuse`` raises on mixed-dtype operands."""
from __future__ import annotations

import ctypes
import functools
import os
import re
import warnings

from .dtype_names import _CPP_DTYPE
from .registry import rule

# --- cuBLAS workspaces -----------------------------------------------------------------------
# A cuBLAS call (gemm, bgemm, gemv: CUDABlas.cpp; dot, vdot) takes a workspace of
# getChosenWorkspaceSize() bytes through the caching allocator, a cuBLASLt call (addmm's fused-bias
# path, _scaled_mm: CublasLtWorkspace) one of getCUDABlasLtWorkspaceSize()
# (aten/src/ATen/cuda/CublasHandlePool.cpp). Torch builds that have isCUDABlasWorkspaceCachingEnabled
# (torch 2.15) take it per call ("eager": getCurrentCUDABlasHandleWithWorkspace), after the op's
# output, and free it when the call returns; with TORCH_CUBLAS_WORKSPACE_CACHE=1, and in builds
# without that switch, the workspace is kept per (handle, stream) from the stream's first call on.
_CUBLAS_GEMM_OPS = frozenset("mm bmm baddbmm baddbmm_".split())
# addbmm has no CUDA kernel of its own: addbmm_impl_ runs addmm_ once per batch (each a cuBLAS call).
_ADDBMM_OPS = frozenset("addbmm addbmm_".split())
_CUBLAS_GEMV_OPS = frozenset("mv addmv addmv_".split())
_CUBLAS_DOT_OPS = frozenset("dot vdot".split())  # dot_cuda/vdot_cuda: no determinism alert
_ADDMM_OPS = frozenset("addmm addmm_ _addmm_activation".split())  # Lt when isInputCompliesAddmmCudaLt
# scaled_gemm's CublasLtWorkspace (_int_mm's int8_gemm passes cuBLASLt no workspace).
_CUBLASLT_OPS = frozenset("_scaled_mm _scaled_mm_v2".split())
_BLAS_OPS = _CUBLAS_GEMM_OPS | _ADDBMM_OPS | _CUBLAS_GEMV_OPS | _CUBLAS_DOT_OPS | _ADDMM_OPS | _CUBLASLT_OPS
HOPPER_CUBLAS_WORKSPACE_BYTES = 4096 * 8 * 1024  # parseChosenWorkspaceSize on sm90 and later
DEFAULT_CUBLASLT_WORKSPACE_KIB = 1024  # parseCUDABlasLtWorkspaceSize's default
# Context::checkCuBLASConfigDeterministic: the CUBLAS_WORKSPACE_CONFIG values deterministic runs need.
_DETERMINISTIC_CUBLAS_CONFIGS = (":4096:8", ":16:8")
_CUBLAS_NOT_DETERMINISTIC = (
    "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
    "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic because "
    "it uses CuBLAS and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must "
    "set an environment variable before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 "
    "or CUBLAS_WORKSPACE_CONFIG=:16:8. For more information, go to "
    "https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility"
)


def cublas_workspace_bytes(config, warn=None):
    """parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG's ``:SIZE:COUNT`` pairs (SIZE in KiB), summed;
    unset or unparseable (``warn`` is told): Hopper's 32 MiB."""
    if config is None:
        return HOPPER_CUBLAS_WORKSPACE_BYTES
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        if warn:
            warn(f"Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of {HOPPER_CUBLAS_WORKSPACE_BYTES} bytes.")
        return HOPPER_CUBLAS_WORKSPACE_BYTES
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublaslt_workspace_bytes(value, warn=None):
    """parseCUDABlasLtWorkspaceSize: CUBLASLT_WORKSPACE_SIZE in KiB (std::stoi: a leading integer),
    1 MiB when unset or invalid (``warn`` is told)."""
    kib = DEFAULT_CUBLASLT_WORKSPACE_KIB
    if value is not None:
        m = re.match(r"\s*([+-]?[0-9]+)", value)
        if m is None or int(m.group(1)) < 0:
            if warn:
                warn(f"invalid CUBLASLT_WORKSPACE_SIZE, using default workspace size of {kib} KiB.")
        elif int(m.group(1)) > 2**31 - 1:
            if warn:
                warn(f"CUBLASLT_WORKSPACE_SIZE out of range, using default workspace size of {kib} KiB.")
        else:
            kib = int(m.group(1))
    return kib * 1024


def _torch_warn(source, message):
    """A TORCH_WARN from PyTorch's C++ ``source``: a UserWarning, as the warning handler turns it."""
    warnings.warn_explicit(f"{message} (Triggered internally at {source}.)", UserWarning, source, 0)


def _env_flag(name):
    """c10::utils::check_env: True for "1", False for "0", None otherwise."""
    return {"1": True, "0": False}.get(os.environ.get(name))


@functools.lru_cache(maxsize=None)
def _torch_has_eager_cublas_workspaces(torch):
    """Whether this torch build takes cuBLAS workspaces per call unless TORCH_CUBLAS_WORKSPACE_CACHE=1
    (it exports at::cuda::isCUDABlasWorkspaceCachingEnabled; ROCm builds cache by default)."""
    if getattr(torch.version, "hip", None):
        return False
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    try:
        ctypes.CDLL(library)["_ZN2at4cuda33isCUDABlasWorkspaceCachingEnabledEv"]
        return True
    except (OSError, AttributeError):
        pass
    # A build without its CUDA library (CPU-only): by version, torch 2.15 having the switch.
    release = tuple(int(p) for p in re.findall(r"\d+", torch.__version__.split("+")[0])[:2])
    return release >= (2, 15)


def _cublas_workspaces_kept(torch):
    """Why this run keeps its workspaces per handle and stream, or None when it takes them per call
    (isCUDABlasWorkspaceCachingEnabled: TORCH_CUBLAS_WORKSPACE_CACHE=1)."""
    if not _torch_has_eager_cublas_workspaces(torch):
        return "this torch has no per-call workspaces"
    if _env_flag("TORCH_CUBLAS_WORKSPACE_CACHE") is True:
        return "TORCH_CUBLAS_WORKSPACE_CACHE=1"
    return None


def _blas_short_circuits(torch, name, args, out):
    """Whether the op's CUDA kernel returns before the BLAS call: an empty result, or an empty
    reduction (addmm_out_cuda_impl, baddbmm_out_cuda_impl, addmv_out_cuda, dot_cuda)."""
    result = next((t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)), None)
    if result is not None and result.numel() == 0:
        return True
    operand = args[0] if name in ("mm", "bmm", "mv", "dot", "vdot", "_scaled_mm", "_scaled_mm_v2") else args[1] if len(args) > 1 else None
    if not isinstance(operand, torch.Tensor):
        return False
    reduced = operand.numel() if name in _CUBLAS_DOT_OPS else operand.shape[-1] if operand.dim() else 1
    return reduced == 0 or (name in _ADDBMM_OPS and operand.shape[0] == 0)


def _is_expandable_to(shape, desired):
    """at::is_expandable_to: ``shape`` broadcasts to ``desired``."""
    if len(shape) > len(desired):
        return False
    return all(s == 1 or s == d for s, d in zip(reversed(shape), reversed(desired)))


class _CublasWorkspaces:
    """The workspaces PyTorch's BLAS calls take (see the note above), for one capture.

    ``chosen_bytes``: --cublas-workspace-mib's size, or None for CUBLAS_WORKSPACE_CONFIG's (read,
    as PyTorch does once, at the first call)."""

    def __init__(self, torch, chosen_bytes):
        self.torch = torch
        self.flag_bytes = chosen_bytes
        self.settings = None  # resolved at the first BLAS call: the environment is read then
        self.kept = {}  # kept mode: (map, stream, handle) -> (trace id, bytes)
        # setChosenWorkspaceSize / setCUDABlasLtWorkspaceSize (torch.backends.cuda.
        # cublas_workspace_size, cublaslt_workspace_size): "cublas"/"cublaslt" -> bytes.
        self.override = {}

    def size(self, library):
        """getChosenWorkspaceSize (library "cublas") or getCUDABlasLtWorkspaceSize ("cublaslt"):
        --cublas-workspace-mib, else the script's setting, else the environment's."""
        s = self._resolve()
        chosen = self.flag_bytes if self.flag_bytes is not None else self.override.get("cublas", s["chosen"])
        if library == "cublas":
            return chosen
        lt = self.override.get("cublaslt", s["lt"])
        return min(lt, chosen) if s["unified"] else lt

    def describe(self):
        size = f"{self.flag_bytes >> 20} MiB (--cublas-workspace-mib)" if self.flag_bytes is not None else (
            "CUBLAS_WORKSPACE_CONFIG's size (32 MiB when unset)")
        kept = _cublas_workspaces_kept(self.torch)
        if kept:
            mode = f"one per cuBLAS handle and stream, kept ({kept})"
        else:
            mode = "per call, freed when it returns (TORCH_CUBLAS_WORKSPACE_CACHE=1 keeps one per handle and stream)"
        return f"cuBLAS workspace modelled: {size}, {mode}; cuBLASLt's: CUBLASLT_WORKSPACE_SIZE (1 MiB when unset)"

    def _resolve(self):
        if self.settings is None:
            warn = functools.partial(_torch_warn, "aten/src/ATen/cuda/CublasHandlePool.cpp")
            has_switch = _torch_has_eager_cublas_workspaces(self.torch)
            eager = _cublas_workspaces_kept(self.torch) is None
            unified_flag = _env_flag("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
            # (With --cublas-workspace-mib the environment's size is not PyTorch's to parse here.)
            chosen = None if self.flag_bytes is not None else cublas_workspace_bytes(os.environ.get("CUBLAS_WORKSPACE_CONFIG"), warn)
            lt = cublaslt_workspace_bytes(os.environ.get("CUBLASLT_WORKSPACE_SIZE"), warn)
            # unified_cublas_and_lt_workspaces: cached mode, unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0
            # (builds before the switch: only with =1). Unified, the Lt workspace is capped at the
            # cuBLAS one's size (getCUDABlasLtWorkspaceSize) and shares its per-stream entry.
            unified = not eager and (unified_flag is not False if has_switch else unified_flag is True)
            self.settings = {
                "eager": eager, "unified": unified, "chosen": chosen, "lt": lt,
                "deterministic_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG") in _DETERMINISTIC_CUBLAS_CONFIGS,
                # alertCuBLASConfigNotDeterministic went with PR #161749 (torch 2.15 has none); the
                # builds that check say so in use_deterministic_algorithms' documentation.
                "deterministic_check": "CUBLAS_WORKSPACE_CONFIG" in (self.torch.use_deterministic_algorithms.__doc__ or ""),
                "addmm_lt_disabled": os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1",
            }
        return self.settings

    def library(self, name, args, kwargs):
        """Which library the op's CUDA kernel calls: "cublas", "cublaslt" or None."""
        if name in _CUBLASLT_OPS:
            return "cublaslt"
        if name in _ADDMM_OPS and self._addmm_takes_lt(name, args, kwargs):
            return "cublaslt"
        # gemm_internal / bgemm_internal: cuBLASLt when it is the preferred BLAS library
        # (torch.backends.cuda.preferred_blas_library); half and bfloat16 gemv goes through gemm.
        first = next((a for a in args if isinstance(a, self.torch.Tensor)), None)
        via_gemm = name in _CUBLAS_GEMM_OPS or name in _ADDMM_OPS or name in _ADDBMM_OPS or (
            name in _CUBLAS_GEMV_OPS and first is not None and first.dtype in (self.torch.float16, self.torch.bfloat16))
        if via_gemm and self._preferred_is_lt():
            return "cublaslt"
        return "cublas"

    def _preferred_is_lt(self):
        try:
            return self.torch._C._get_blas_preferred_backend() == self.torch._C._BlasBackend.Cublaslt
        except (AttributeError, RuntimeError):
            return False

    def _addmm_takes_lt(self, name, args, kwargs):
        """isInputCompliesAddmmCudaLt (Blas.cpp), and DISABLE_ADDMM_CUDA_LT unset."""
        if self._resolve()["addmm_lt_disabled"] or len(args) < 3:
            return False
        torch = self.torch
        bias, mat1, mat2 = args[0], args[1], args[2]
        if not all(isinstance(t, torch.Tensor) for t in (bias, mat1, mat2)) or mat1.dim() != 2 or mat2.dim() != 2:
            return False
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        result = bias if name == "addmm_" else kwargs.get("out")
        if result is not None and not (result.dim() == 2 and result.is_contiguous()):
            return False
        squeezed_dims = sum(1 for s in bias.shape if s != 1)
        m, n = mat1.shape[0], mat2.shape[1]
        fused_bias = bias.is_contiguous() and (bias.dim() == 1 or squeezed_dims == 1) and bias.dim() >= 1 and bias.shape[-1] == n
        activation_bias = name == "_addmm_activation" and bias.dim() == 2 and _is_expandable_to(tuple(bias.shape), (m, n))
        if (beta == 1 and (fused_bias or activation_bias) and mat1.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
                and min(mat2.shape) > 1):
            return True
        # A full 2-D half-precision input (issue #153590): row-major (a valid leading dimension),
        # one dtype for all three, not written in place, beta and alpha non-zero, no activation.
        alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        half = (torch.float16, torch.bfloat16)
        return (name == "addmm" and result is not bias and beta != 0 and alpha != 0 and bias.dim() == 2 and tuple(bias.shape) == (m, n)
                and bias.stride(1) == 1 and bias.stride(0) >= max(1, n) and bias.dtype in half and bias.dtype == mat1.dtype == mat2.dtype
                and m > 1 and min(mat2.shape) > 1)

    def check_deterministic(self, name):
        """Context::alertCuBLASConfigNotDeterministic, which the cuBLAS and cuBLASLt gemm, bgemm and
        gemv wrappers of torch builds before PR #161749 call before taking their handle (dot and
        vdot do not)."""
        if name in _CUBLAS_DOT_OPS or not self.torch.are_deterministic_algorithms_enabled():
            return
        settings = self._resolve()
        if settings["deterministic_config"] or not settings["deterministic_check"]:
            return
        if self.torch.is_deterministic_algorithms_warn_only_enabled():
            _torch_warn("aten/src/ATen/Context.cpp", _CUBLAS_NOT_DETERMINISTIC)
        else:
            raise RuntimeError(_CUBLAS_NOT_DETERMINISTIC)

    def take(self, recorder, library, stream):
        """The workspace of one call on ``stream``: allocated and freed (eager), or the stream's
        kept one allocated at its first call (cached)."""
        s = self._resolve()
        nbytes = self.size(library)
        if not nbytes:
            return
        label = "cuBLAS" if library == "cublas" else "cuBLASLt"
        if s["eager"]:
            trace_id = recorder._new_id()
            recorder.record_alloc(trace_id, nbytes, stream)
            recorder.sink.free(trace_id, nbytes)
            return
        # Cached: one per (handle, stream) in each map, replaced when a larger size is asked
        # (the new one allocated before the old goes); unified, cuBLASLt's shares cuBLAS's entry,
        # allocated at max(lt, chosen) when Lt comes first (getCUDABlasLtWorkspace). Handles are
        # per thread (a PoolWindow each): the backward runs on autograd's CUDA device thread, so
        # its calls have a handle, and workspaces, of their own.
        handle = "autograd" if self.torch._C._current_autograd_node() is not None else "script"
        key = ("cublas" if library == "cublas" or s["unified"] else "cublaslt", stream, handle)
        old = self.kept.get(key)
        if old is not None and old[1] >= nbytes:
            return
        if library == "cublaslt" and key[0] == "cublas":
            nbytes = max(nbytes, self.size("cublas"))
        trace_id = recorder._new_id()
        recorder.record_alloc(trace_id, nbytes, stream, f"{label} workspace of stream {stream} (modelled, kept per handle and stream)")
        self.kept[key] = (trace_id, nbytes)
        if old is not None:
            recorder.sink.free(*old)

    def clear_stream(self, recorder, stream=None):
        """clearCublasWorkspacesForStream: the stream's kept workspaces (every handle's) are freed;
        clearCublasWorkspaces (``stream`` None): every one."""
        for key in [k for k in self.kept if stream is None or k[1] == stream]:
            trace_id, nbytes = self.kept.pop(key)
            if not recorder.closed:
                recorder.sink.free(trace_id, nbytes)


# The matrix operands of the cuBLAS ops whose CUDA kernels take one dtype (Blas.cpp:
# "expected mat1 and mat2 to have the same dtype"); _scaled_mm and _int_mm mix by design.
_SAME_DTYPE_OPERANDS = {
    **{op: (0, 1) for op in "mm bmm mv dot vdot".split()},
    **{op: (1, 2) for op in "addmm baddbmm addbmm addmv _addmm_activation".split()},
}


@rule("refuse", *_SAME_DTYPE_OPERANDS)
def _mixed_dtypes(recorder, func, args):
    """A matmul of mixed dtypes, which a fake op's meta kernel lets through and its CUDA kernel
    refuses (the CPU kernel refuses it too), refused as there."""
    import torch

    tensor_type = torch.Tensor
    name = func.overloadpacket.__name__
    positions = _SAME_DTYPE_OPERANDS.get(name)
    if positions is not None and len(args) > max(positions):
        first, second = (args[p] for p in positions)
        if isinstance(first, tensor_type) and isinstance(second, tensor_type) and first.dtype != second.dtype \
                and first.device.type == "cuda":
            names = [_CPP_DTYPE.get(str(t.dtype).replace("torch.", ""), str(t.dtype)) for t in (first, second)]
            raise RuntimeError(f"expected mat1 and mat2 to have the same dtype, but got: {names[0]} != {names[1]}")


@rule("after_outputs", *sorted(_BLAS_OPS))
def _blas_workspace(recorder, func, args, kwargs, out):
    """A BLAS op's CUDA kernel, after its output (the structured kernel allocates it before calling
    cuBLAS): the determinism check, then its workspace (one per addmm_ for addbmm); none when the
    kernel returns before calling the library, or when no workspace is modelled."""
    import torch

    name = func.overloadpacket.__name__
    if recorder.blas is None:
        return
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None or first.device.type != "cuda" or _blas_short_circuits(torch, name, args, out):
        return
    recorder.blas.check_deterministic(name)
    calls = args[1].shape[0] if name in _ADDBMM_OPS else 1
    for _ in range(calls):
        recorder.blas.take(recorder, recorder.blas.library(name, args, kwargs), recorder._stream_of(first))


def _patch_blas_workspace_sizes(torch, recorder, patches, fake):
    """torch.backends.cuda.cublas_workspace_size / cublaslt_workspace_size: the modelled workspaces
    take the sizes a script sets (setChosenWorkspaceSize, setCUDABlasLtWorkspaceSize), and on fake
    CUDA a query answers the modelled size (PyTorch's reads the device's properties).
    torch._C._cuda_clearCublasWorkspaces (inductor's CUDA graph trees call it) frees the kept ones."""
    workspaces = recorder.blas
    clear_all = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_all is not None:

        def clear_cublas_workspaces():
            clear_all()
            workspaces.clear_stream(recorder)

        patches.set(torch._C, "_cuda_clearCublasWorkspaces", clear_cublas_workspaces)
    for name, library in (("Cublas", "cublas"), ("CublasLt", "cublaslt")):
        setter, getter, resetter = (getattr(torch._C, f"_cuda_{verb}{name}WorkspaceSize", None) for verb in ("set", "get", "reset"))
        if setter is None or getter is None or resetter is None:
            continue  # a torch without the setting

        def set_size(size, library=library, setter=setter):
            setter(size)
            workspaces.override[library] = int(size)

        def reset_size(library=library, resetter=resetter):
            resetter()
            workspaces.override.pop(library, None)

        def get_size(library=library, getter=getter):
            return workspaces.size(library) if fake else getter()

        patches.set(torch._C, f"_cuda_set{name}WorkspaceSize", set_size)
        patches.set(torch._C, f"_cuda_reset{name}WorkspaceSize", reset_size)
        patches.set(torch._C, f"_cuda_get{name}WorkspaceSize", get_size)

