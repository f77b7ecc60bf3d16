#!/usr/bin/env python3
"""Capture the CUDA caching-allocator trace of an unmodified PyTorch script, with or without a GPU.

Every new CUDA storage becomes one ``alloc`` row of an allocbench v1 trace (bytes = the storage's
``nbytes``; views and in-place ops add nothing; a storage resize is an alloc of the new size then a
free of the old), its ``free`` row is written when the storage dies, and a ``step`` row follows
every ``optimizer.step()`` (a global optimizer hook) or an explicit ``allocbench_capture.step()``.

Allocation sites ride in the trace as comment lines every v1 reader skips: ``#site N FILE:LINE
FUNCTION`` defines site N (0, 1, 2... in order of first use), ``#at N`` returns to an earlier
one and ``#at -`` to none (an alloc with no frame to name); each ``alloc`` row was made at the
site most recently defined or returned to. A site is the
innermost Python frame outside torch, the standard library and this module (the frame a user
reads in their own code), its file relative to the script's directory when under it.

Without a GPU (the default) tensors on ``"cuda"`` are fake (``FakeTensorMode``: shapes, no data,
no compute) yet take CUDA's paths: CUDA's autocast policy, the CUDA branches of composite ops and
the real autograd engine. ``--real`` records real tensors instead (a GPU, or ``--device cpu``).

As a program (what ``allocbench capture`` runs)::

    python3 allocbench_capture.py -o trace.csv [--steps N] [--real] [--cublas-workspace-mib M] -- train.py [ARGS...]

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
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import functools
import gc
import hashlib
import itertools
import json
import linecache
import math
import os
import re
import runpy
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import types
import warnings
import weakref

FORMAT_HEADER = "op,id,bytes,stream"
EXIT_SETUP_ERROR = 2
EXIT_SCRIPT_ERROR = 1

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


def _ctc_use_cudnn(torch, args, kwargs):
    """_use_cudnn_ctc_loss (aten/src/ATen/native/cudnn/LossCTC.cpp) on fake CUDA: cuDNN's CTC loss
    takes float32 log-probs on the GPU, blank 0, 1-D int32 targets on the CPU (any device for the
    Tensor overload, with int32 lengths), every input length T (IntArrayRef overload) and target
    lengths under 256, none above its input's."""
    log_probs, targets, input_lengths, target_lengths = args[:4]
    blank = kwargs.get("blank", args[4] if len(args) > 4 else 0)
    tensor_lengths = isinstance(input_lengths, torch.Tensor)
    if tensor_lengths:
        if input_lengths.dtype != torch.int32 or target_lengths.dtype != torch.int32:
            return False
        if any(t.device.type != "cpu" for t in (input_lengths, target_lengths)):
            return None  # the lengths' values are on the fake device: unknown here
        input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
    ok = (torch.backends.cudnn.enabled and blank == 0 and targets.dim() == 1 and targets.dtype == torch.int32
          and (tensor_lengths or targets.device.type == "cpu") and targets.is_contiguous()
          and log_probs.dtype == torch.float32 and log_probs.device.type == "cuda" and log_probs.dim() == 3)
    if not ok:
        return False
    T = log_probs.shape[0]
    if not tensor_lengths and any(length != T for length in input_lengths):
        return False
    return all(t < 256 and t <= i for t, i in zip(target_lengths, input_lengths))


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


_active = None  # the Recorder of the capture in progress, if any

# The matrix operands of the cuBLAS ops whose CUDA kernels take one dtype (Blas.cpp:
# "expected mat1 and mat2 to have the same dtype"); _scaled_mm and _int_mm mix by design.
_SAME_DTYPE_OPERANDS = {
    **{op: (0, 1) for op in "mm bmm mv dot vdot".split()},
    **{op: (1, 2) for op in "addmm baddbmm addbmm addmv _addmm_activation".split()},
}
# C++'s names of dtypes, as the kernels' messages print them.
_CPP_DTYPE = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
              "int32": "int", "int64": "long int", "int16": "short int", "int8": "signed char", "uint8": "unsigned char"}
# ScalarType names (toString), as AT_DISPATCH's "not implemented for" prints them.
_SCALAR_TYPE = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int32": "Int",
                "int16": "Short", "int8": "Char", "bool": "Bool", "uint8": "Byte", "int64": "Long"}


# Ops whose CUDA kernel is their composite one (CompositeExplicitAutograd, no CUDA kernel of their
# own) and allocates more than the output on the way, which the meta kernel a fake run takes
# skips: run as composites on fake CUDA (Recorder._composite_on_cuda). BCEWithLogitsLoss makes
# log_sigmoid(input) and (1 - target) * input, SoftMarginLoss its elementwise loss (kept as the
# output's storage) and the mean, its backward exp(-target * input), logsumexp the shifted
# exp(self - max), dist self - other, isinf abs(self) (Loss.cpp, ReduceOps.cpp, TensorCompare.cpp).
# The window functions (TensorFactories.cpp) compute a periodic window of N as N + 1 points and
# narrow it: a meta kernel answers the view's N, and FakeTensor's dispatch cache answers it so
# from the second call on, where the composite keeps the N + 1 storage.
_COMPOSITES_ON_CUDA = frozenset({
    "binary_cross_entropy_with_logits", "soft_margin_loss", "soft_margin_loss_backward", "logsumexp", "dist", "isinf",
    "hann_window", "hamming_window", "blackman_window", "bartlett_window"})
# Loss kernels that reduce into or through an elementwise loss the meta kernel does not make
# (Loss.cpp, Loss.cu): name -> (position of `reduction`, whether the output keeps the elementwise
# storage, the kernel's buffer). mse_loss and smooth_l1_loss are structured: the meta step makes
# the elementwise output and resize_({}) keeps its storage, then the kernel computes the
# elementwise loss into a temporary ("elementwise", after the output) and reduces it into the
# output. binary_cross_entropy writes the loss into empty_like(input), reduces it into a 0-dim
# temporary ("scalar") and resize_as_ keeps the storage. huber_loss computes the elementwise loss
# into a temporary first ("before") and reduces it into a fresh output. Without a reduction
# (Reduction::None) each writes the elementwise loss as its output, and nothing more.
# soft_margin_loss runs as its composite on fake CUDA (_COMPOSITES_ON_CUDA), which keeps the
# storage itself; its entry gives fake CPU tensors the storage a CPU run keeps.
_LOSS_KERNELS = {
    "soft_margin_loss": (2, True, "scalar"),
    "mse_loss": (2, True, "elementwise"),
    "smooth_l1_loss": (2, True, "elementwise"),
    "binary_cross_entropy": (3, True, "scalar"),
    "huber_loss": (2, False, "before"),
}


def _refuse_as_cuda_kernels_do(name, args, tensor_type):
    """What a fake op's meta kernel lets through but its CUDA kernel refuses, refused as there:
    a matmul of mixed dtypes (the CPU kernel refuses it too), and nll_loss with a target that is
    not Long or Byte (AT_DISPATCH_NLL_LOSS_INDEX_TYPES; cross_entropy's int32 targets)."""
    positions = _SAME_DTYPE_OPERANDS.get(name)
    if positions is not None and len(args) > max(positions):
        first, second = (args[p] for p in positions)
        if isinstance(first, tensor_type) and isinstance(second, tensor_type) and first.dtype != second.dtype \
                and first.device.type == "cuda":
            names = [_CPP_DTYPE.get(str(t.dtype).replace("torch.", ""), str(t.dtype)) for t in (first, second)]
            raise RuntimeError(f"expected mat1 and mat2 to have the same dtype, but got: {names[0]} != {names[1]}")
    if name == "convolution" and len(args) > 1 and all(isinstance(t, tensor_type) and t.device.type == "cuda" for t in args[:2]) \
            and args[0].dtype != args[1].dtype:
        # check_input_same_type_as_parameters (Convolution.cpp); FakeTensor's own check is off when
        # it allows real inputs, as the capture's mode does (the bias check stays).
        legacy = [f"torch.cuda.{_SCALAR_TYPE.get(str(t.dtype).replace('torch.', ''), str(t.dtype))}Tensor" for t in args[:2]]
        raise RuntimeError(f"Input type ({legacy[0]}) and weight type ({legacy[1]}) should be the same")
    if name in ("nll_loss_forward", "nll_loss2d_forward") and len(args) > 1:
        target = args[1]
        if isinstance(target, tensor_type) and target.device.type == "cuda" and str(target.dtype) not in ("torch.int64", "torch.uint8"):
            kernel = "nll_loss_forward_reduce_cuda_kernel_2d_index" if name == "nll_loss_forward" else "nll_loss2d_forward_kernel"
            raise NotImplementedError(f'"{kernel}" not implemented for \'{_SCALAR_TYPE.get(str(target.dtype).replace("torch.", ""), str(target.dtype))}\'')


def _fresh_lock_after_fork():
    # A forked child (a DataLoader worker) gets the recorder's lock as its parent's threads left
    # it, maybe held by a thread that does not exist there: a fresh one.
    if _active is not None:
        _active.lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


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
        if _active is not None:
            _active.value_reads.append(self)


class NeedsDriver(RuntimeError):
    """The script called something fake CUDA has no stand-in for (it would reach the CUDA driver).
    ``fix``: what to do instead, where a GPU would not help either."""

    def __init__(self, message, fix=None):
        super().__init__(message)
        self.fix = fix


class SetupError(RuntimeError):
    """The capture could not start (no torch, no compiler, an unsupported torch ABI...)."""


# Run as a program this file is __main__: a script's `import allocbench_capture` must find this
# module (and its capture in progress), not load a second copy. These classes are pickled by that
# name, as the script's own __main__ replaces this one (a DataLoader worker sends its error to the
# main process pickled, and a class pickle cannot find would leave that process waiting for ever).
sys.modules.setdefault("allocbench_capture", sys.modules[__name__])
for _exception in (StopCapture, FakeValueNeeded, NeedsDriver, SetupError):
    _exception.__module__ = "allocbench_capture"


def step():
    """Marks an iteration boundary (for loops without an optimizer: serving, eval). A no-op when no
    capture is running, so scripts may call it unconditionally."""
    if _active is not None:
        _active.step()


def fake():
    """True while a fake-tensor capture runs: guard code that needs real values with it."""
    return _active is not None and _active.fake


# CUDACachingAllocator.cpp: kMinBlockSize (every block a multiple of 512 B) and kSmallSize
# (requests up to 1 MiB, rounded, are served from the small pool).
_MIN_BLOCK_SIZE = 512
_SMALL_SIZE = 1 << 20
_STAT_POOLS = ("all", "small_pool", "large_pool")


def _format_bytes(n):
    """As PyTorch's OOM message writes sizes (format_size in CUDACachingAllocator.cpp)."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, size, top in (("KiB", 1 << 10, 1 << 20), ("MiB", 1 << 20, 1 << 30)):
        if n <= top:
            return f"{n / size:.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


def _block_bytes(nbytes):
    """The bytes a request holds in allocated_bytes: rounded up to 512 (round_size, small requests)."""
    return max(_MIN_BLOCK_SIZE, (nbytes + _MIN_BLOCK_SIZE - 1) // _MIN_BLOCK_SIZE * _MIN_BLOCK_SIZE)


class _MemoryStats:
    """What ``torch.cuda.memory_stats()`` would count from the allocations alone, with its key
    names: ``allocation`` (blocks), ``allocated_bytes`` (each request rounded as round_size does by
    default: up to a multiple of 512 B), ``requested_bytes`` (the bytes asked for), per pool (small:
    rounded size up to 1 MiB). Segments, cached and split blocks need the allocator itself, which
    the capture does not run: ``reserved_bytes`` and ``segment`` answer as an allocator without a
    cache would (equal to the allocated ones); replay the trace for the real caching figures."""

    KINDS = ("allocation", "allocated_bytes", "requested_bytes")

    def __init__(self):
        # kind -> pool -> [current, peak, allocated, freed], as c10::CachingAllocator::Stat
        self.stats = {kind: {pool: [0, 0, 0, 0] for pool in _STAT_POOLS} for kind in self.KINDS}
        self.num_ooms = 0

    def _update(self, nbytes, sign):
        rounded = _block_bytes(nbytes)
        pool = "small_pool" if rounded <= _SMALL_SIZE else "large_pool"
        for kind, amount in (("allocation", 1), ("allocated_bytes", rounded), ("requested_bytes", nbytes)):
            for stat in (self.stats[kind]["all"], self.stats[kind][pool]):
                stat[0] += sign * amount
                if sign > 0:
                    stat[2] += amount
                    stat[1] = max(stat[1], stat[0])
                else:
                    stat[3] += amount

    def alloc(self, nbytes):
        self._update(nbytes, 1)

    def free(self, nbytes):
        self._update(nbytes, -1)

    def current(self, kind="allocated_bytes"):
        return self.stats[kind]["all"][0]

    def peak(self, kind="allocated_bytes"):
        return self.stats[kind]["all"][1]

    def reset_peak(self):
        for pools in self.stats.values():
            for stat in pools.values():
                stat[1] = stat[0]

    def reset_accumulated(self):
        for pools in self.stats.values():
            for stat in pools.values():
                stat[2] = stat[3] = 0

    def nested(self):
        """The nested dict ``torch._C._cuda_memoryStats`` returns (memory_stats() flattens it)."""
        as_dict = lambda pools: {  # noqa: E731
            pool: dict(zip(("current", "peak", "allocated", "freed"), stat)) for pool, stat in pools.items()
        }
        zero = {pool: dict(current=0, peak=0, allocated=0, freed=0) for pool in _STAT_POOLS}
        allocation, allocated = as_dict(self.stats["allocation"]), as_dict(self.stats["allocated_bytes"])
        return {
            "num_alloc_retries": 0, "num_ooms": self.num_ooms, "num_sync_all_streams": 0,
            "num_device_alloc": self.stats["allocation"]["all"][2], "num_device_free": self.stats["allocation"]["all"][3],
            "max_split_size": -1,
            "allocation": allocation, "active": allocation, "segment": allocation,
            "allocated_bytes": allocated, "active_bytes": allocated, "reserved_bytes": allocated,
            "requested_bytes": as_dict(self.stats["requested_bytes"]),
            "inactive_split": zero, "inactive_split_bytes": zero,
            "oversize_allocations": dict(current=0, peak=0, allocated=0, freed=0),
            "oversize_segments": dict(current=0, peak=0, allocated=0, freed=0),
        }


class _TraceSink:
    """Writes trace rows as they happen; flushed at every step so a killed run keeps its rows."""

    def __init__(self, path, comments):
        self.path = path
        if str(path).endswith(".gz"):
            import gzip

            self.file = gzip.open(path, "wt", compresslevel=6)
        else:
            self.file = open(path, "w", buffering=1 << 16)
        for c in comments:
            self.file.write(f"# {c}\n")
        self.file.write(FORMAT_HEADER + "\n")
        self.file.flush()  # a readable trace even if the interpreter dies before the first step
        self.allocs = self.frees = self.steps = 0
        self.live_bytes = self.peak_live_bytes = 0
        self.memory_stats = _MemoryStats()
        self.site = None  # the site the next alloc row is at (the last '#site' or '#at')
        self.side_stream_of = {}  # live trace id -> its stream, when not the default stream
        self.used_by = {}  # live trace id -> the other streams that used it (record_stream)
        self.waiting = set()  # streams whose work a freed block waits for (no sync since)
        # The fake card's memory and the error a request past it raises (None: no limit here,
        # as for real tensors, whose own allocator raises).
        self.capacity = None
        self.oom_error = None
        self.fraction = 1.0  # per_process_memory_fraction the script set
        self.refused = None  # (id, bytes, stream, site index, message) of the last request refused
        self.deferred_frees = None  # inside frees_in_id_order: the frees to write, sorted, at its end

    def _at_site(self, site):
        """The next row is made at ``site`` ((index, '#site' text when new) or None)."""
        if site is not None:
            index, definition = site
            if definition is not None:
                self.file.write(f"#site {index} {definition}\n")
            elif index != self.site:
                self.file.write(f"#at {index}\n")
            self.site = index
        elif self.site is not None:
            self.file.write("#at -\n")  # no frame to name: not the previous alloc's site
            self.site = None

    def alloc(self, trace_id, nbytes, stream, site=None):
        self._at_site(site)
        self.file.write(f"alloc,{trace_id},{nbytes},{stream}\n")
        if stream:
            self.side_stream_of[trace_id] = stream
        self.allocs += 1
        self.live_bytes += nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        self.memory_stats.alloc(nbytes)

    def limit(self):
        """What the fake card lets the process hold: its memory, or under
        per_process_memory_fraction its allowed_memory_maximum (floor(fraction × total))."""
        if self.fraction < 1:
            return int(self.fraction * self.capacity)
        return self.capacity

    def check_fits(self, trace_id, nbytes, stream, site):
        """Live tensors past the fake card's limit: torch.cuda.OutOfMemoryError, as any allocator
        would raise (the caching allocator may fail sooner: the replay tells when). The request
        is not a row; a comment at its site marks it, so a script that catches it (a batch-size
        search) leaves a trace that says so, and one that does not ends on it (``refused``)."""
        in_use, limit = self.memory_stats.current(), self.limit()
        if in_use + _block_bytes(nbytes) <= limit:
            return
        self.memory_stats.num_ooms += 1
        self._at_site(site)
        self.file.write(f"# OutOfMemoryError: {nbytes} bytes requested with {in_use} allocated on the fake card's {limit} bytes\n")
        capped = f" (per_process_memory_fraction {self.fraction:g} allows {_format_bytes(limit)})" if limit < self.capacity else ""
        message = (
            f"CUDA out of memory. Tried to allocate {_format_bytes(_block_bytes(nbytes))}. GPU 0 has a total capacity of "
            f"{_format_bytes(self.capacity)} of which {_format_bytes(max(0, self.capacity - in_use))} is free{capped}. "
            f"Of the allocated memory {_format_bytes(in_use)} is allocated by PyTorch. (allocbench capture: live "
            "tensors would pass the fake card's memory; --device-memory sets it)"
        )
        # The message, not the error: an error held here (even in a local) would, through its
        # traceback, keep the op's tensors alive after the script let go of them.
        self.refused = (trace_id, nbytes, stream, site[0] if site else None, message)
        raise self.oom_error(message)

    def end_on_refused(self, error):
        """The script stopped on the fake card's OOM ``error``: its request ends the trace as a row,
        so a replay on that card fails where the script did, at its site."""
        if self.refused is None or not isinstance(error, self.oom_error) or str(error) != self.refused[4]:
            return
        trace_id, nbytes, stream, site, _ = self.refused
        self.comment("the request the script stopped on (torch.cuda.OutOfMemoryError, uncaught)")
        self._at_site(None if site is None else (site, None))
        self.file.write(f"alloc,{trace_id},{nbytes},{stream}\n")
        self.allocs += 1

    @contextlib.contextmanager
    def frees_in_id_order(self):
        """Frees inside the block are written in allocation order, not in the order they come:
        a C++ container keyed by address (autocast's cast cache) frees in an order that changes
        from run to run, and a trace should not."""
        if self.deferred_frees is not None:
            yield
            return
        self.deferred_frees = []
        try:
            yield
        finally:
            deferred, self.deferred_frees = self.deferred_frees, None
            for trace_id, nbytes in sorted(deferred):
                self.free(trace_id, nbytes)

    def free(self, trace_id, nbytes):
        if self.deferred_frees is not None:
            self.deferred_frees.append((trace_id, nbytes))
            return
        self.file.write(f"free,{trace_id},,\n")
        if self.side_stream_of:
            self.side_stream_of.pop(trace_id, None)
        if self.used_by:
            # The free records an event on each using stream (insert_events): the block waits for them.
            self.waiting.update(self.used_by.pop(trace_id, ()))
        self.frees += 1
        self.live_bytes -= nbytes
        self.memory_stats.free(nbytes)

    def record_stream(self, trace_id, stream):
        """Stream ``stream`` uses the live block ``trace_id``; its own stream's use is ignored (recordStream)."""
        if stream == self.side_stream_of.get(trace_id, 0) or stream in self.used_by.get(trace_id, ()):
            return
        self.used_by.setdefault(trace_id, set()).add(stream)
        self.file.write(f"record_stream,{trace_id},,{stream}\n")

    def sync(self, stream):
        """The script knows ``stream``'s work done (None: every stream's). Written only when a freed
        block waits for that stream: the one thing a sync changes in a replay."""
        if stream is None and self.waiting:
            self.file.write("sync,,,\n")
            self.waiting.clear()
        elif stream in self.waiting:
            self.file.write(f"sync,,,{stream}\n")
            self.waiting.discard(stream)

    def step(self, n):
        self.file.write(f"step,{n},,\n")
        self.steps = n
        self.file.flush()

    def empty_cache(self):
        self.file.write("empty_cache,,,\n")

    def pool_begin(self, pool, stream):
        self.file.write(f"pool_begin,{pool},,{'' if stream is None else stream}\n")

    def pool_end(self, pool):
        self.file.write(f"pool_end,{pool},,\n")

    def pool_join(self, pool, stream):
        self.file.write(f"pool_join,{pool},,{stream}\n")

    def pool_release(self, pool):
        self.file.write(f"pool_release,{pool},,\n")

    def empty_pool_cache(self, pool):
        self.file.write(f"empty_cache,{pool},,\n")

    def comment(self, text):
        self.file.write(f"# {text}\n")

    def close(self, outcome):
        if self.file.closed:
            return
        self.file.write(f"# capture {outcome}\n")
        self.file.close()


_SITE, _LIBRARY, _OURS = 0, 1, 2


class _Sites:
    """Allocation sites: the innermost Python frame outside torch, the standard library and this
    module. Cheap enough for a million allocs: whether a code object is skipped is decided once,
    and each (code object, line) becomes a site index once."""

    def __init__(self, torch, root):
        self.root = os.path.abspath(root) + os.sep
        paths = sysconfig.get_paths()
        self.libraries = tuple({os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib")})
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.stdlib_dir = os.path.abspath(paths["stdlib"]) + os.sep
        self.here = os.path.abspath(__file__)
        self.kind = {}  # code object -> _SITE, _LIBRARY or _OURS
        self.index = {}  # (code object, line) -> site index
        self.count = 0

    def _kind(self, filename):
        """SITE for a user's frame, LIBRARY for torch's and the standard library's, OURS for this module's."""
        name = os.path.abspath(filename)
        if name == self.here:
            return _OURS
        if filename.startswith("<frozen") or name.startswith(self.torch_dir):
            return _LIBRARY  # the frozen standard library (runpy, importlib), torch
        # Third-party libraries may live under the standard library's directory (on Debian, say).
        if name.startswith(self.stdlib_dir) and not name.startswith(self.libraries):
            return _LIBRARY
        if os.path.basename(name) == "typing_extensions.py":
            return _LIBRARY  # the standard library's backport: @deprecated wraps torch's own calls
        return _SITE

    def _name(self, code, line):
        name = os.path.abspath(code.co_filename)
        if name.startswith(self.root):
            name = name[len(self.root):]
        else:
            under = next((lib for lib in self.libraries if name.startswith(lib)), None)
            name = name[len(under):] if under else code.co_filename
        return f"{name}:{line} {getattr(code, 'co_qualname', code.co_name)}"

    def here_frame(self):
        """(site index, its '#site' text when new, else None) of the caller's allocation."""
        frame = sys._getframe(1)
        fallback = None
        kinds = self.kind
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = self._kind(code.co_filename)
            if kind == _SITE:
                break
            if fallback is None and kind == _LIBRARY:
                fallback = frame  # no user frame at all: the innermost one, as a snapshot's site
            frame = frame.f_back
        frame = frame or fallback
        if frame is None:
            return None
        key = (frame.f_code, frame.f_lineno)
        index = self.index.get(key)
        if index is not None:
            return index, None
        index = self.index[key] = self.count
        self.count += 1
        return index, self._name(*key)


KNOWN_VALUES_SAID = "answer reads of fake tensors where they can (Note [Known values]): isnan/isinf are all False, isfinite all True, isin finds nothing (a generation runs to its max length)"


def _make_recorder_class(torch):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    aten = torch.ops.aten
    flash_backward = aten._scaled_dot_product_flash_attention_backward.default
    local_scalar = aten._local_scalar_dense.default
    fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor
    is_pinned = aten.is_pinned.default
    pin_ops = {aten._pin_memory.default, is_pinned}
    rng_state_ops = {aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default}
    add_tensor = aten.add.Tensor
    implicit_key = torch._C.DispatchKey.CompositeImplicitAutograd
    explicit_key = torch._C.DispatchKey.CompositeExplicitAutograd
    explicit_keys = (explicit_key, torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional)
    pack_padded = aten._pack_padded_sequence.default
    multinomial = aten.multinomial.default
    value_comparisons = {aten.equal.default, aten.allclose.default}  # Python bools read from the data
    ctc_forward, ctc_backward = aten._ctc_loss.default, aten._ctc_loss_backward.default
    ctc_with_length_tensors = {aten._ctc_loss.Tensor: ctc_forward, aten._ctc_loss_backward.Tensor: ctc_backward}
    ctc_cudnn_checks = {getattr(aten, "_use_cudnn_ctc_loss").default, getattr(aten, "_use_cudnn_ctc_loss").Tensor}
    ctc_miopen_checks = {getattr(getattr(aten, "_use_miopen_ctc_loss", None), o, None) for o in ("default", "Tensor")} - {None}

    # Note [Known values]: fake tensors have no data, but some values are known and libraries
    # steer by them, so the capture follows them: a tensor filled with one Python number (full,
    # ones, zeros, their _like forms, scalar_tensor, fill_) holds it in every element, and two
    # assumptions give the rest. A healthy run has no NaN or Inf, so isnan/isinf tests are all
    # False, as GradScaler's found_inf is taken to be 0 (see _fake_tensor_fixes): transformers'
    # Trainer filters NaN losses with `torch.isnan(loss) or torch.isinf(loss)`, clip_grad_norm_
    # has error_if_nonfinite. And isin finds nothing: generate()'s end-of-sequence test
    # (EosTokenCriteria) never fires, so a generation runs to its max length, the longest and the
    # most memory, instead of stopping wherever --scalar-value steers it. Such a value follows the
    # ops that compare, combine, reduce, copy or view it, and elementwise arithmetic with another
    # known value or a number (cast to the result's dtype), and answers reads of it without
    # --scalar-value; any other write to the tensor forgets it. Pointwise ops (torch.Tag.pointwise:
    # arithmetic, compares, logical and bitwise ops, where, clamp, rounding division) of known
    # values are evaluated on one-element CPU tensors of the same dtypes and dimensions, so
    # torch's own type promotion and rounding give the value; where/masked_fill with a known
    # condition take the chosen side's value. Small tensors (token ids from the CPU, a mask made
    # from them, arange's positions) are followed whole: an op whose tensor operands are all
    # known and small, and whose outputs are small, runs on their contents on the CPU (not ops
    # that draw random numbers or leave memory uninitialised), so `(input_ids < 0).any()` and
    # `.tolist()` of them read as a real run reads them. A number is held as its tensor's dtype
    # holds it (_in_dtype). The NaN/Inf assumption is for unknown values only (a causal mask's
    # known -inf is tested as it is). A tensor that takes another storage (`t.data = other`,
    # swap_tensors: no op this mode sees) is unknown: each entry keeps the storage it was known in.
    assumed_false = {"isnan", "isinf", "isposinf", "isneginf", "isin"}
    contents_elements = 1 << 12  # a tensor followed whole (or checked for one value throughout), at most
    nondeterministic_tag = torch.Tag.nondeterministic_seeded
    # Their outputs' contents are not the op's to say: uninitialised memory, or strides that
    # address the fake storage, which the contents do not mirror.
    contents_excluded = {"set", "resize", "resize_as", "_reshape_alias", "_local_scalar_dense"}
    contents_excluded_parts = ("empty", "as_strided", "philox")  # (philox: random, untagged)
    fills = {"full": 1, "full_like": 1, "new_full": 2, "fill": 1, "scalar_tensor": 0}  # op -> position of the value
    constants = {"ones": 1, "ones_like": 1, "new_ones": 1, "zeros": 0, "zeros_like": 0, "new_zeros": 0}
    keeps_value = {"amax", "amin", "clone", "_to_copy", "detach", "alias", "view", "_unsafe_view", "reshape",
                   "squeeze", "unsqueeze", "expand", "select", "slice", "lift_fresh", "copy"}
    # (_is_any_true/_is_all_true: the autograd engine's anomaly check, isnan(out)._is_any_true().)
    reductions = {"any": bool, "all": bool, "_is_any_true": bool, "_is_all_true": bool}
    pointwise_untagged = {"floor_divide"}  # elementwise, but without the tag
    pointwise_tag = torch.Tag.pointwise
    full_reductions = {aten.max.default, aten.min.default}
    view_dtype = aten.view.dtype  # (reinterprets the bits: not the same value)
    disable_modes = torch.utils._python_dispatch._disable_current_modes
    # What can know a value with nothing known yet (a real tensor's moves included).
    # x == x and x != ±inf are True for an unknown value (no NaN, no Inf): isfinite decomposes so.
    no_nan_no_inf = {"eq", "ne"}
    value_sources = assumed_false | no_nan_no_inf | set(fills) | set(constants) | {
        "_to_copy", "copy", "lift_fresh", "arange", "eye", "linspace", "logspace", "tril_indices", "triu_indices"}

    class Recorder(TorchDispatchMode):
        """Sees every aten op below autograd and autocast, and records the storages of its outputs."""

        def __init__(self, sink, device_type, fake, blas_workspaces, scalar_value, sites=None):
            super().__init__()
            self.sink = sink
            self.sites = sites
            self.device_type = device_type
            self.fake = fake
            self.blas = blas_workspaces  # _CublasWorkspaces, or None when none are modelled
            self.scalar_value = scalar_value
            self.closed = False
            self.storages = {}  # StorageImpl address -> [trace id or None, nbytes]
            self.next_id = 1
            self.step_no = 0
            self.max_steps = None
            self.stream_ids = {}
            self.fake_streams = None  # _FakeStreams on fake CUDA
            self.written_args = {}
            self.probing = None
            self.fake_mode = None  # set for fake CUDA: CPU ops run for real where cheap
            self.exclusive_use_count = None
            self.annotate = bool(os.environ.get("ALLOCBENCH_CAPTURE_OPS"))
            self.pointwise_ops = {}  # op -> whether it is elementwise (Note [Known values])
            self.known_by_storage = {}  # storage -> {id: weak reference} of the known tensors viewing it
            self.known_stores = 0
            self.current_op = ""
            self.implicit_ops = {}  # OpOverload -> has a C++ CompositeImplicitAutograd kernel
            self.explicit_ops = {}  # OpOverload -> the composite key CUDA runs it by (_COMPOSITES_ON_CUDA), or None
            self.backend_ops = {}  # (OpOverload, device type) -> has a kernel of that backend
            self.linear_bias_add = False  # F.linear with a bias is running (Note [linear's bias add])
            self.script_conf = {}  # allocator settings the script made itself (key -> value)
            self.skipped_calls = set()  # torch.cuda calls answered without a driver, said once each
            self.from_data = threading.local()  # depth of CPU constructors from data on this thread
            self.dispatch_error = None  # the last error raised out of an op (type, message, id, on_cpu, fix)
            self.value_reads = []  # every FakeValueNeeded raised (the capture's own catches marked `handled`)
            self.on_hard_exit = None  # called with the code when the script calls os._exit
            self.known_values = torch.utils.weak.WeakIdKeyDictionary()  # Note [Known values]
            self.pinned = torch.utils.weak.WeakIdKeyDictionary()  # the storages of pinned tensors (mark_pinned)
            # Threads the script starts are recorded too (_recorded_threads): one event at a time.
            self.lock = threading.RLock()
            # An error that stopped a recorded thread, handed to the main thread.
            self.thread_error = None
            # The thread the capture runs on (where a recorded thread's stop is raised), and the
            # signal that wakes it for that, when it is the main thread (see capture()).
            self.owner = threading.current_thread()
            self.wake_signal = None

        def raise_thread_error(self):
            """On the capture's own thread: a recorded thread's stop (_recorded_threads), raised here."""
            error = self.thread_error
            if error is not None and not self.closed and threading.current_thread() is self.owner:
                raise error

        def say_once(self, what, message, trace_note=None):
            """Tells the user ``what`` ``message`` once per capture (and the trace ``trace_note``)."""
            if what in self.skipped_calls:
                return
            self.skipped_calls.add(what)
            if trace_note:
                self.sink.comment(f"{what}: {trace_note}")
            print(f"allocbench capture: {what} {message}", file=sys.stderr)

        # --- events -------------------------------------------------------------------------
        def _new_id(self):
            with self.lock:
                i = self.next_id
                self.next_id += 1
                return i

        def step(self):
            if self.closed:
                return
            self.raise_thread_error()
            with self.lock:
                self.step_no += 1
                self.sink.step(self.step_no)
            if self.max_steps is not None and self.step_no >= self.max_steps:
                raise StopCapture()

        def optimizer_stepped(self, optimizer):
            # Every optimizer.step() is a step (with two optimizers, as in a GAN, two per iteration).
            self.step()

        def _stream_of(self, tensor):
            if tensor.device.type != "cuda":
                return 0
            return self._current_stream_id(tensor.device)

        def _current_stream_id(self, device):
            """The trace's id of the current stream (what CUDACachingAllocator's malloc takes)."""
            if self.fake:
                return self.fake_streams.current().stream_id if self.fake_streams else 0
            if device.type != "cuda":
                return 0
            raw = torch.cuda.current_stream(device).cuda_stream
            return self.stream_ids.setdefault(raw, len(self.stream_ids))

        def _observe(self, t):
            if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                return
            if self.fake and t.device.type == "cuda" and (t.device.index or 0) > 0:
                raise NeedsDriver(_NO_SUCH_DEVICE.format(device=t.device), fix=_NO_SUCH_DEVICE_FIX)
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                # Sparse, nested or functional wrappers have no single storage.
                if self.fake and t.layout != torch.strided:
                    # A fake sparse tensor's nnz is data (a sparse Embedding's gradient comes out
                    # empty): its indices and values are not what the GPU would hold.
                    self.say_once(
                        f"{t.layout} tensors",
                        "have data-dependent sizes on fake CUDA: their indices and values are not recorded",
                        "not recorded (their sizes are data)",
                    )
                return
            key = st._cdata
            nbytes = st.nbytes()
            entry = self.storages.get(key)
            if entry is None:
                # A zero-byte storage is a null pointer: no allocator call (CUDACachingAllocator
                # returns nullptr for size 0), but it may be resized later.
                trace_id = self._alloc(nbytes, t) if nbytes else None
                self.storages[key] = [trace_id, nbytes]
                weakref.finalize(st, self._storage_died, key)
            elif entry[1] != nbytes:
                # resize_ reallocates: the new block is allocated before the old one is freed.
                new_id = self._alloc(nbytes, t) if nbytes else None
                if entry[0] is not None:
                    self.sink.free(entry[0], entry[1])
                entry[0], entry[1] = new_id, nbytes

        def _inherit_allocation(self, new, old):
            """``new``'s storage takes over ``old``'s allocation: in an untraced run they are one
            buffer (an in-place op there), and ``old``'s storage dies without a free."""
            if not isinstance(new, torch.Tensor) or not isinstance(old, torch.Tensor) or new.device.type != self.device_type:
                return
            entry = self.storages.get(old.untyped_storage()._cdata)
            storage = new.untyped_storage()
            key = storage._cdata
            if entry is None or key in self.storages or entry[1] != storage.nbytes():
                return
            self.storages[key] = [entry[0], entry[1]]
            weakref.finalize(storage, self._storage_died, key)
            entry[0] = None

        def _alloc(self, nbytes, t):
            if self.annotate:
                self.sink.comment(f"op {self.current_op}")
            trace_id = self._new_id()
            self.record_alloc(trace_id, nbytes, self._stream_of(t))
            return trace_id

        def record_alloc(self, trace_id, nbytes, stream, comment=None):
            """One alloc row at the user's frame (after ``comment``); a request past the fake
            card's memory raises torch.cuda.OutOfMemoryError instead."""
            site = self.sites.here_frame() if self.sites else None
            if self.sink.capacity is not None:
                self.sink.check_fits(trace_id, nbytes, stream, site)
            if comment:
                self.sink.comment(comment)
            self.sink.alloc(trace_id, nbytes, stream, site)

        def record_stream(self, tensor, stream):
            """``tensor.record_stream(stream)``: stream uses the tensor's block."""
            try:
                entry = self.storages.get(tensor.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):
                return
            if entry is not None and entry[0] is not None and not self.closed:
                self.sink.record_stream(entry[0], stream)

        def _storage_died(self, key):
            # (A finalizer: it runs on whichever thread drops the storage's last reference.)
            with self.lock:
                entry = self.storages.pop(key, None)
                if entry is not None and entry[0] is not None and not self.closed:
                    self.sink.free(entry[0], entry[1])

        def _blas_workspace(self, name, args, kwargs, out):
            """A BLAS op's CUDA kernel, after its output: the determinism check, then its workspace
            (one per addmm_ for addbmm); none when the kernel returns before calling the library."""
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None or first.device.type != "cuda" or _blas_short_circuits(torch, name, args, out):
                return
            self.blas.check_deterministic(name)
            calls = args[1].shape[0] if name in _ADDBMM_OPS else 1
            for _ in range(calls):
                self.blas.take(self, self.blas.library(name, args, kwargs), self._stream_of(first))

        def clear_cublas_workspace(self, stream):
            """clearCublasWorkspacesForStream: the stream's kept workspaces are freed (a CUDA graph's
            reset does it for its capture stream, so a workspace no longer pins the graph's pool)."""
            if self.blas is not None:
                self.blas.clear_stream(self, stream)

        def _written_arg_positions(self, func):
            positions = self.written_args.get(func)
            if positions is None:
                positions = [
                    (i, a.name)
                    for i, a in enumerate(func._schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write
                ]
                self.written_args[func] = positions
            return positions

        # --- dispatch -----------------------------------------------------------------------
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # Threads the script starts run with this mode too (_recorded_threads): one op at a
            # time (reentrant: an op's parts dispatch here again on the same thread).
            if self.closed:
                return func(*args, **(kwargs or {}))
            if self.thread_error is not None:
                self.raise_thread_error()
            try:
                with self.lock:
                    return self._dispatch(func, types, args, kwargs)
            except BaseException as e:
                # TorchScript's interpreter turns a Python error into a RuntimeError with an
                # empty message: what it was is kept for that message (_torchscript_error).
                # Not the exception itself: its frames would keep the op's tensors alive.
                self.dispatch_error = (type(e), str(e), id(e), getattr(e, "on_cpu", False), getattr(e, "fix", None))
                raise

        def resize_storage(self, storage, nbytes, resize):
            """UntypedStorage.resize_ to ``nbytes`` (FSDP frees a parameter's storage with
            resize_(0) and brings it back) is no op the mode sees: the allocation follows here, as
            in _observe. The new block is allocated (and checked against the fake card) before the
            storage changes, and the old one freed after, as the device allocator does."""
            with self.lock:
                entry = None if self.closed else self.storages.get(storage._cdata)
                if entry is None or entry[1] == nbytes:
                    return resize()
                new_id = None
                if nbytes:
                    new_id = self._new_id()
                    self.record_alloc(new_id, nbytes, self._current_stream_id(storage.device))
                try:
                    out = resize()
                except BaseException:
                    if new_id is not None:
                        self.sink.free(new_id, nbytes)  # the resize failed: its block never was
                    raise
                if entry[0] is not None:
                    self.sink.free(entry[0], entry[1])
                entry[0], entry[1] = new_id, nbytes
                self.forget_storage(storage._cdata)  # (new memory: its values are not the old ones)
                return out

        def _dispatch(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.closed:
                return func(*args, **kwargs)
            if self._decomposes(func, args, kwargs):
                # Note [CompositeImplicitAutograd under inference_mode]: the op reached this mode
                # whole because the Autograd keys were skipped (inference_mode); the device's own
                # kernel is the CompositeImplicit one, which runs its parts below this mode unseen.
                # Running it here with the mode pushed records its parts (linear's addmm and cuBLAS
                # workspace, native_layer_norm's mean and rstd), as ProxyTorchDispatchMode and
                # FakeTensorMode do with func.decompose(). The C++ kernel, not decompose(): that
                # prefers Python decompositions (torch/_decomp), which eager never runs.
                with self:
                    return func._op_dk(implicit_key, *args, **kwargs)
            if func is local_scalar and self.fake:
                return self._scalar(func, args)
            if func in value_comparisons and self.fake and any(isinstance(a, fake_tensor_type) for a in args[:2]):
                return self._compare_values(func, args, kwargs)
            if func is pack_padded and self.fake and not isinstance(args[1], fake_tensor_type):
                # pack_padded_sequence takes its lengths on the CPU (nn.utils.rnn), real here: its
                # kernel (PackedSequence.cpp, CompositeExplicitAutograd) reads them and slices,
                # copies and concatenates the fake input, each part recorded as it runs. A fake
                # run would have no lengths to read.
                with self:
                    return func._op_dk(explicit_key, *args, **kwargs)
            composite = self._composite_on_cuda(func, args, kwargs)
            if composite is not None:
                # Its CUDA kernel is the composite one (_COMPOSITES_ON_CUDA), whose parts a meta
                # kernel skips: run here with the mode pushed, each part is recorded as it runs.
                with self:
                    return func._op_dk(composite, *args, **kwargs)
            if self.fake and (func in ctc_cudnn_checks or func in ctc_miopen_checks):
                return self._ctc_uses_library(func, args, kwargs)
            if self.fake and func in ctc_with_length_tensors and not any(isinstance(a, fake_tensor_type) for a in args[2:4]):
                # ctc_loss_tensor (LossCTC.cpp) reads its CPU lengths and calls the IntArrayRef
                # kernel, as does its backward: recorded as that runs.
                lengths = [a.tolist() if isinstance(a, torch.Tensor) else a for a in args[2:4]]
                with self:
                    return ctc_with_length_tensors[func](*args[:2], *lengths, *args[4:], **kwargs)
            if self.fake:
                _refuse_as_cuda_kernels_do(func.overloadpacket.__name__, args, torch.Tensor)
            ctc = (func is ctc_forward or func is ctc_backward) and self.device_type == "cuda" and self.fake
            ctc_lengths = self._ctc_lengths(args, func is ctc_backward) if ctc else []
            if self.probing is not None:
                if func is add_tensor and torch._C._current_autograd_node() is not None:
                    self.probing.append(args[0]._use_count())
                return self._run(func, args, kwargs)
            if _engine_add(torch, func is add_tensor, args, kwargs, self.exclusive_use_count):
                out = args[0].add_(args[1])
            else:
                out = self._run(func, args, kwargs)
            if _in_place_in_an_untraced_backward(torch, func, args, out):
                self._inherit_allocation(out, args[0])  # Note [Out-of-place backward formulas]
            if func is add_tensor and self.linear_bias_add:
                # Note [linear's bias add]: an untraced run adds the bias in place.
                self.linear_bias_add = False
                self._inherit_allocation(out, args[0])
            if self.annotate:
                self.current_op = func.__name__
            if func is ctc_forward and ctc:
                out_seen = (out[1], out[0])  # ctc_loss_gpu_template: log_alpha, then neg_log_likelihood
            elif func in rng_state_ops and isinstance(out, tuple) and not _dropout(func, args, kwargs):
                # Without dropout the fused attention kernels return their RNG state as CPU
                # tensors (flash_api.cpp, mem_eff_attention); the meta kernels say CUDA.
                out_seen = [o for o, r in zip(out, func._schema.returns) if r.name not in _RNG_OUTPUTS]
            else:
                out_seen = out
            scratch_before, loss_scratch_after = [], []
            if self.fake and func.overloadpacket.__name__ in _LOSS_KERNELS and func._overloadname == "default" and isinstance(out, torch.Tensor):
                scratch_before, loss_scratch_after = self._loss_kernel(func.overloadpacket.__name__, args, kwargs, out)
            for leaf in tree_leaves(out_seen):
                self._observe(leaf)
            for pos, name in self._written_arg_positions(func):
                arg = args[pos] if pos < len(args) else kwargs.get(name)
                for leaf in tree_leaves(arg):
                    self._observe(leaf)
            if self.blas is not None and func.overloadpacket.__name__ in _BLAS_OPS:
                # After the output (the structured kernel allocates it before calling cuBLAS).
                self._blas_workspace(func.overloadpacket.__name__, args, kwargs, out)
            if self.fake:
                self._follow_known_value(func, args, kwargs, out)
            if func is flash_backward and self.device_type == "cuda":
                self._kernel_scratch(_flash_backward_scratch(torch, args), args[1])
            for trace_id, n in scratch_before:
                self.sink.free(trace_id, n)
            if func is multinomial and self.device_type == "cuda" and self.fake and isinstance(out, torch.Tensor) and out.numel():
                self._multinomial_buffers(args, kwargs)
            if loss_scratch_after:
                self._kernel_scratch(loss_scratch_after, out)
            if ctc:
                if func is ctc_backward:
                    self._ctc_backward_blank_gradient(args)
                for trace_id, n in reversed(ctc_lengths):
                    self.sink.free(trace_id, n)
            return out

        def _composite_on_cuda(self, func, args, kwargs):
            """The composite dispatch key whose kernel a GPU runs for ``func`` on fake CUDA operands,
            when it is one of _COMPOSITES_ON_CUDA and has no CUDA kernel of its own; else None."""
            if not self.fake or self.device_type != "cuda" or func.overloadpacket.__name__ not in _COMPOSITES_ON_CUDA:
                return None
            if func not in self.explicit_ops:
                has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)  # noqa: E731
                own = has(torch._C.DispatchKey.CUDA)
                self.explicit_ops[func] = None if own else next((key for key in explicit_keys if has(key)), None)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None:  # a factory: its device argument says
                return self.explicit_ops[func] if torch.device(kwargs.get("device") or "cpu").type == "cuda" else None
            return self.explicit_ops[func] if isinstance(first, fake_tensor_type) and first.device.type == "cuda" else None

        def _loss_kernel(self, name, args, kwargs, out):
            """_LOSS_KERNELS: the output's storage as the kernel leaves it (elementwise-sized, on any
            device: the CPU kernels share the code), and on CUDA the kernel's own buffers:
            (buffers allocated before the output, as (trace id, bytes), to free after it; sizes of
            the buffers allocated and freed after it)."""
            position, elementwise_output, scratch = _LOSS_KERNELS[name]
            reduction = kwargs.get("reduction", args[position] if len(args) > position else 1)
            if reduction == 0:  # Reduction::None: the elementwise loss is the output
                return [], []
            shape = torch.broadcast_shapes(args[0].shape, args[1].shape) if name != "binary_cross_entropy" else args[0].shape
            elementwise = math.prod(shape) * out.element_size()
            if elementwise_output:
                storage = out.untyped_storage()
                if storage.nbytes() < elementwise and storage._cdata not in self.storages:
                    storage.resize_(elementwise)
            if self.device_type != "cuda":
                return [], []
            if scratch == "before":
                return [(self._alloc(elementwise, out), elementwise)], []
            return [], [elementwise if scratch == "elementwise" else out.element_size()]

        def _multinomial_buffers(self, args, kwargs):
            """multinomial_out (Distributions.cpp, shared by CPU and CUDA) after its result: one sample
            or none replaced runs on the device's ops, checking the probabilities (aminmax, the
            compares, row sums) with _assert_async, then q = empty_like(self) for argmax(self / q)
            or topk's values; more samples with replacement run MultinomialKernel.cu, which copies,
            renormalises and prefix-sums the distribution in three buffers. Each freed when it
            goes out of scope (temporaries at the end of their statement, the last made first)."""
            probs, n_sample = args[0], args[1]
            replacement = kwargs.get("replacement", args[2] if len(args) > 2 else False)
            e, whole = probs.element_size(), probs.numel() * probs.element_size()
            rows = probs.shape[0] if probs.dim() == 2 else 1
            alloc = lambda n: (self._alloc(n, probs), n)  # noqa: E731
            free = lambda *buffers: [self.sink.free(*b) for b in buffers]  # noqa: E731
            if replacement and n_sample > 1:
                dists = [alloc(whole) for _ in range(3)]  # origDist, normDist, prefixSum
                free(*reversed(dists))
                return
            low, high = alloc(e), alloc(e)  # auto [self_min, self_max] = self.aminmax()
            at_least_zero, below_inf = alloc(1), alloc(1)  # (the right operand of & first)
            is_valid = alloc(1)
            free(below_inf, at_least_zero)
            if probs.dim() == 1:
                total = alloc(e)
                zero_prob = alloc(1)
                free(total)
            else:
                totals = alloc(rows * e)
                zero_rows = alloc(rows)
                zero_prob = alloc(1)  # .any()
                free(zero_rows, totals)
            free(alloc(1))  # ~zero_prob_condition, for _assert_async
            q = alloc(whole)  # exponential_ and div_out in place
            values = [alloc(rows * n_sample * e)] if n_sample > 1 else []  # topk_out's values
            free(*values, q, zero_prob, is_valid, low, high)

        def _ctc_uses_library(self, func, args, kwargs):
            """_use_cudnn_ctc_loss / _use_miopen_ctc_loss on fake CUDA: PyTorch's own kernel runs. cuDNN's
            (its inputs qualify) sizes a workspace by its own heuristics, so it is said once and
            replaced by the native kernel's allocations; MIOpen is ROCm's."""
            if func in ctc_cudnn_checks and _ctc_use_cudnn(torch, args, kwargs) is not False:
                self.say_once("F.ctc_loss", "runs PyTorch's CUDA kernel on fake CUDA where a GPU may run cuDNN's (int32 targets on the CPU, "
                              "blank 0): cuDNN's workspace is its own choice", "PyTorch's CTC kernel in place of cuDNN's")
            return False

        def _ctc_lengths(self, args, backward):
            """The native CTC kernels' first buffers (aten/src/ATen/native/cuda/LossCTC.cu): the target
            and input lengths and the targets' batch offsets on the device (B int64 each), and in
            the backward log_beta (like log_alpha); freed when the kernel returns."""
            log_probs = args[1] if backward else args[0]
            batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
            sizes = [batch * 8] * 3 + ([args[6].numel() * args[6].element_size()] if backward else [])
            return [(self._alloc(n, log_probs), n) for n in sizes]

        def _ctc_backward_blank_gradient(self, args):
            """ctc_loss_backward_gpu_template with many time steps or classes (2T + 24B/10 + 2C/10 > 450):
            the blank gradient's log-sum-exp over log_alpha + log_beta (every other s), after the
            gradient: the sum, then logsumexp's max, |max| and its isinf mask (freed), the shifted
            copy, the reduced sum (the copy freed), the max freed; the sum and its result freed last."""
            log_probs, log_alpha = args[1], args[6]
            T, B, C = log_probs.shape if log_probs.dim() == 3 else (log_probs.shape[0], 1, log_probs.shape[1])
            if 2 * T + (24 * B) // 10 + (2 * C) // 10 <= 450:
                return
            e, S = log_probs.element_size(), (log_alpha.shape[-1] - 1) // 2
            pair, row = B * T * (S + 1) * e, B * T * e
            summed = self._alloc(pair, log_probs)
            maxes = self._alloc(row, log_probs)
            magnitude, infinite = self._alloc(row, log_probs), self._alloc(B * T, log_probs)
            self.sink.free(infinite, B * T)
            self.sink.free(magnitude, row)
            shifted = self._alloc(pair, log_probs)
            result = self._alloc(row, log_probs)
            self.sink.free(shifted, pair)
            self.sink.free(maxes, row)
            self.sink.free(result, row)
            self.sink.free(summed, pair)

        def _decomposes(self, func, args, kwargs):
            """True when the device runs this op's CompositeImplicitAutograd kernel: it has one and
            the device's backend has no kernel of its own (autograd_would_have_decomposed in
            torch/utils/_python_dispatch.py; e.g. _fused_rms_norm has a CUDA kernel). Under
            no_grad such ops are decomposed at the Autograd key and never reach this mode."""
            implicit = self.implicit_ops.get(func)
            if implicit is None:
                try:
                    implicit = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), implicit_key)
                except RuntimeError:
                    implicit = False  # a TorchScript prim (prim::device): not a dispatcher op
                self.implicit_ops[func] = implicit
            if not implicit:
                return False
            first = next((t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
            device = first.device.type if first is not None else torch.device(kwargs.get("device") or "cpu").type
            own = self.backend_ops.get((func, device))
            if own is None:
                backend = torch._C._parse_dispatch_key(torch._C._dispatch_key_for_device(device))
                own = backend is not None and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), backend)
                self.backend_ops[(func, device)] = own
            return not own

        def _kernel_scratch(self, sizes, like):
            """Buffers a CUDA kernel allocates and frees inside one op, after its outputs."""
            ids = [self._alloc(n, like) for n in sizes if n]
            for trace_id, n in reversed(list(zip(ids, [n for n in sizes if n]))):
                self.sink.free(trace_id, n)

        def _run(self, func, args, kwargs):
            """Runs the op: on fake tensors when it touches CUDA, for real when it is a small CPU op."""
            fake_mode = self.fake_mode
            if fake_mode is None:
                return func(*args, **kwargs)
            if func is ctc_forward and isinstance(args[0], fake_tensor_type):
                # FakeTensor takes _ctc_loss's shape for data-dependent, but its lengths are ints:
                # neg_log_likelihood (B), log_alpha (B, T, 2·max target length + 1) (LossCTC.cu).
                log_probs, target_lengths = args[0], args[3]
                like = {"dtype": log_probs.dtype, "device": log_probs.device}
                with fake_mode:
                    return (torch.empty((log_probs.shape[1],), **like),
                            torch.empty((log_probs.shape[1], log_probs.shape[0], 2 * max(target_lengths, default=0) + 1), **like))
            if func in pin_ops:
                # Pinned host memory needs the driver; it is host memory, and not what is measured:
                # a copy, whose storage is_pinned() then answers True for (and for its views).
                if func is is_pinned:
                    return self.is_pinned(args[0])
                if isinstance(args[0], fake_tensor_type):
                    with fake_mode:
                        copy = aten.clone.default(args[0])
                else:
                    copy = args[0].clone()
                return self.mark_pinned(copy)
            leaves = tree_leaves((args, kwargs))
            if any(isinstance(x, fake_tensor_type) or (isinstance(x, torch.device) and x.type == "cuda") for x in leaves):
                try:
                    with fake_mode:
                        return func(*args, **kwargs)
                except (DynamicOutputShapeException, DataDependentOutputException):
                    shaped = self._shaped_by_contents(func, args, kwargs, leaves)
                    if shaped is None:
                        raise
                    return shaped
            if any(isinstance(x, (torch.UntypedStorage, torch.storage.TypedStorage)) for x in leaves):
                # set_ onto a real storage (torch.load rebuilding CPU tensors): its memory exists
                # already, and a fake run would render the whole storage into an error message.
                return func(*args, **kwargs)
            if kwargs.get("pin_memory"):
                # torch.empty(..., pin_memory=True): host memory the same, made without the driver;
                # is_pinned() answers True for it, as on a GPU machine.
                kwargs = {**kwargs, "pin_memory": False}
                return self.mark_pinned(self._run(func, args, kwargs))
            # Note [Real CPU, fake CUDA]: CPU work stays real, so scripts can read its values (data
            # loading, sampler weights, statistics, token ids), except large floating tensors that
            # come from nothing (a factory: a model built on the CPU before .cuda() is torch.empty
            # and an init), which are fake, since this machine need not hold them; every op on a
            # fake tensor is fake. An op on real data makes real data up to a far larger bound (the
            # data it works from is here already), and a constructor from Python or NumPy data
            # holds that data. The fake run tells what the op would make.
            if getattr(self.from_data, "depth", 0):
                return func(*args, **kwargs)
            try:
                with fake_mode:
                    predicted = func(*args, **kwargs)
            except Exception:
                return func(*args, **kwargs)
            made = [t for t in tree_leaves(predicted) if isinstance(t, torch.Tensor)]
            floating = sum(t.numel() * t.element_size() for t in made if t.is_floating_point() or t.is_complex())
            from_real_data = any(isinstance(x, torch.Tensor) for x in leaves)
            return func(*args, **kwargs) if floating <= (_REAL_CPU_DERIVED_BYTES if from_real_data else _REAL_CPU_BYTES) else predicted

        def _follow_known_value(self, func, args, kwargs, out):
            """Note [Known values]: what every element of ``out`` is known to be, if anything."""
            name = func.overloadpacket.__name__
            known = self.known_values
            base = name[:-1] if name.endswith("_") and not name.endswith("__") else name  # in-place forms
            if not len(known) and base not in value_sources:
                return
            try:
                if base == "_amp_foreach_non_finite_check_and_unscale" and len(args) > 1:
                    # A healthy run finds no Inf or NaN: found_inf keeps its value (0), so
                    # _amp_update_scale_ then grows the scale as on the device.
                    outputs = [(args[1], self.known_of(args[1]))]
                elif base not in value_sources and not self._any_operand_known(args, kwargs):
                    outputs = []  # (the usual op: nothing it reads is known, so neither is its output)
                else:
                    value = self._known_result(func, base, args, kwargs, out)
                    outputs = [(out, value)] if value is not None else self._known_contents(func, base, args, kwargs, out)
            except Exception:  # noqa: BLE001 - (an op this bookkeeping cannot follow: unknown)
                outputs = []
            # (_forget_storage_of and _know raise nothing: a tensor they cannot place is unknown)
            for pos, arg_name in self._written_arg_positions(func):
                arg = args[pos] if pos < len(args) else kwargs.get(arg_name)
                for leaf in tree_leaves(arg):
                    if isinstance(leaf, torch.Tensor):
                        self._forget_storage_of(leaf)
            for leaf, value in outputs:
                if value is not None and isinstance(leaf, fake_tensor_type):
                    self._know(leaf, value)

        def _any_operand_known(self, args, kwargs):
            """Whether an operand (a tensor argument, or one in a list of them) may have a known value."""
            known = self.known_values
            for arg in itertools.chain(args, kwargs.values()):
                for x in (arg if isinstance(arg, (list, tuple)) else (arg,)):
                    if isinstance(x, fake_tensor_type):
                        if x in known:
                            return True
                    elif isinstance(x, torch.Tensor) and x.numel() <= contents_elements:
                        return True  # a small real tensor: its data is there
            return False

        def _know(self, tensor, value):
            """``tensor`` holds ``value`` (a number throughout, as its dtype holds it, or its
            contents), until its storage is written or it takes another storage."""
            try:
                key = tensor.untyped_storage()._cdata
            except Exception:  # noqa: BLE001 - (a sparse tensor has none: forgotten by itself only)
                key = None
            if not isinstance(value, torch.Tensor):
                try:
                    with disable_modes():
                        value = _in_dtype(torch, tensor.dtype, value)
                except Exception:  # noqa: BLE001 - (NaN cast to an integer, a dtype torch cannot fill: unknown)
                    return
            self.known_values[tensor] = (value, key)
            if key is None:
                return
            # The reference first: making it may collect garbage, and a holder of this storage
            # dying then must not drop the index entry between its lookup and this insert.
            ref = weakref.ref(tensor, lambda _, key=key, ident=id(tensor): self._drop_holder(key, ident))
            self.known_by_storage.setdefault(key, {})[id(tensor)] = ref
            self.known_stores += 1
            if not self.known_stores % 4096:
                for emptied in [k for k, holders in self.known_by_storage.items() if not holders]:
                    self.known_by_storage.pop(emptied, None)

        def _drop_holder(self, key, ident):
            # (A weak reference's callback: it runs on whichever thread drops the tensor, without
            # the lock, so it only removes its own entry; emptied storages are pruned in _know.)
            holders = self.known_by_storage.get(key)
            if holders is not None:
                holders.pop(ident, None)

        def _forget_storage_of(self, tensor):
            """A write to ``tensor``: it, and every view of its storage (`t[i] = v` writes t; t2 =
            t.view(...) changes with t), are no longer known."""
            self.known_values.pop(tensor, None)
            try:
                key = tensor.untyped_storage()._cdata
            except Exception:  # noqa: BLE001 - (a sparse tensor: no storage to share)
                return
            self.forget_storage(key)

        def forget_storage(self, key):
            """Every known tensor viewing the storage ``key`` is unknown (it was written or resized)."""
            for ref in list(self.known_by_storage.pop(key, {}).values()):
                held = ref()
                if held is not None:
                    self.known_values.pop(held, None)

        def _known_contents(self, func, base, args, kwargs, out):
            """[(output, its known value or contents)] when the op can run on its operands'
            contents (Note [Known values]); [] otherwise."""
            written = []
            for pos, arg_name in self._written_arg_positions(func):
                arg = args[pos] if pos < len(args) else kwargs.get(arg_name)
                written += [t for t in tree_leaves(arg) if isinstance(t, torch.Tensor)]
            if any(not isinstance(t, fake_tensor_type) for t in written):
                return []  # (a real tensor written: its data is the script's, left alone)
            outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
            # Written operands that are not returned (_foreach_add_, _amp_update_scale_'s growth
            # tracker) are outputs too: their contents after the op, run in place.
            returned = len(outs)
            outs += [t for t in written if not any(t is o for o in outs)]
            if (not outs or not all(isinstance(o, fake_tensor_type) and o.numel() <= contents_elements for o in outs)
                    or nondeterministic_tag in func.tags or base in contents_excluded
                    or any(part in base for part in contents_excluded_parts)):
                return []
            reals, used = [], {}
            try:
                if base == "copy" and len(args) > 1:
                    # copy_(self, src): self becomes src, broadcast and cast.
                    source = self._contents_of(args[1]) if isinstance(args[1], torch.Tensor) else None
                    if source is None:
                        return []
                    with disable_modes():
                        computed = source.to(args[0].dtype).expand(args[0].shape).clone()
                else:
                    computed = self._on_contents(func, args, kwargs, reals, used)
            except LookupError:
                return []
            results = [r for r in tree_leaves(computed) if isinstance(r, torch.Tensor)][:returned]
            results += [used[id(t)] for t in outs[returned:]]  # (their contents, written in place)
            if len(results) != len(outs):
                return []
            followed = []
            with disable_modes():
                for fake, real in zip(outs, results):
                    if real.shape != fake.shape or real.dtype != fake.dtype:
                        followed.append((fake, None))  # (a kernel of another shape: not followed)
                        continue
                    if real._is_view() and reals:
                        real = real.clone()  # (never an alias of the script's own tensors)
                    followed.append((fake, _one_value_or_contents(real)))
            return followed

        def _shaped_by_contents(self, func, args, kwargs, leaves):
            """Outputs whose shape depends on values (nonzero, a boolean mask's indexing, unique)
            of operands followed whole (Note [Known values]): the op runs on their contents and
            its outputs are fake tensors of the shapes it gave, on the operands' device; None
            when an operand is unknown."""
            fakes = [x for x in leaves if isinstance(x, fake_tensor_type)]
            if not fakes or nondeterministic_tag in func.tags:
                return None
            device = fakes[0].device
            try:
                computed = self._on_contents(func, args, kwargs)
            except LookupError:
                return self._shaped_by_mask(func, args, kwargs, device)
            except Exception:  # noqa: BLE001 - (no CPU kernel for this dtype: the shape stays unknown)
                return None

            def fake_like(t):
                if not isinstance(t, torch.Tensor):
                    return t
                with self.fake_mode:
                    return torch.empty(tuple(t.shape), dtype=t.dtype, device=device)

            return tree_map(fake_like, computed)

        def _shaped_by_mask(self, func, args, kwargs, device):
            """``x[mask]`` and ``masked_select(x, mask)`` of an unknown ``x``: their shapes need
            only the mask's contents. None when the mask is unknown too. And bincount of unknown
            values with a minlength (a mixture of experts' load count): its values are taken to be
            below minlength, so it has minlength bins."""
            if func is aten.bincount.default and args:
                weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
                minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0)
                if not minlength:
                    return None
                self.say_once("bincount", "of values the capture does not know has minlength bins (its values are taken to be below minlength)",
                              trace_note="of unknown values: minlength bins")
                with disable_modes():
                    made = torch.bincount(torch.zeros(0, dtype=torch.long, device="cpu"),
                                          None if weights is None else torch.zeros(0, dtype=weights.dtype, device="cpu"),
                                          minlength=minlength)
                with self.fake_mode:
                    return torch.empty(tuple(made.shape), dtype=made.dtype, device=device)
            def mask_contents(m):
                if isinstance(m, torch.Tensor) and m.dtype in (torch.bool, torch.uint8):
                    return self._contents_of(m)
                return None

            if func is aten.masked_select.default and len(args) == 2:
                mask = mask_contents(args[1])
                if mask is None:
                    return None
                with disable_modes():
                    count = int(mask.bool().expand(torch.broadcast_shapes(args[0].shape, mask.shape)).sum())
                with self.fake_mode:
                    return torch.empty((count,), dtype=args[0].dtype, device=device)
            if func is aten.index.Tensor and len(args) == 2:
                indices = []
                for index in args[1]:
                    if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                        mask = mask_contents(index)
                        if mask is None:
                            return None
                        with disable_modes():
                            positions = mask.nonzero().unbind(1)  # (a mask indexes as its nonzero positions)
                        with self.fake_mode:
                            indices.extend(torch.empty(tuple(p.shape), dtype=torch.long, device=device) for p in positions)
                    else:
                        indices.append(index)
                with self.fake_mode:
                    return func(args[0], indices)
            return None

        def _on_contents(self, func, args, kwargs, reals=None, used=None):
            """``func`` run on the CPU on its operands' contents; LookupError when one is unknown.
            ``reals`` collects the script's real tensors among them, ``used`` the contents of
            each fake operand by id."""

            def operand(x):
                if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("cuda")):
                    return torch.device("cpu")
                if not isinstance(x, torch.Tensor):
                    return x
                contents = self._contents_of(x)
                if contents is None:
                    raise LookupError  # (an unknown operand: the outputs are unknown)
                if reals is not None and not isinstance(x, fake_tensor_type):
                    reals.append(contents)
                if used is not None and isinstance(x, fake_tensor_type):
                    used[id(x)] = contents
                return contents

            tree_args, tree_kwargs = tree_map(operand, (list(args), dict(kwargs)))
            if tree_kwargs.get("pin_memory"):
                tree_kwargs["pin_memory"] = False
            with disable_modes(), torch.no_grad():
                return func(*tree_args, **tree_kwargs)

        def mark_pinned(self, tensor):
            """``tensor`` (a CPU tensor made pinned on a GPU machine), answered pinned from now on."""
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                self.pinned[tensor.untyped_storage()] = True
            return tensor

        def is_pinned(self, tensor):
            return tensor.device.type == "cpu" and tensor.untyped_storage() in self.pinned

        def known_of(self, tensor):
            """What ``tensor`` is known to hold (a number, or its contents), or None. A tensor that
            took another storage since (``t.data = other``, swap_tensors: no op the mode sees) is
            unknown."""
            entry = self.known_values.get(tensor)
            if entry is None:
                return None
            value, key = entry
            if key is not None:
                try:
                    moved = tensor.untyped_storage()._cdata != key
                except Exception:  # noqa: BLE001
                    moved = True
                if moved:
                    self.known_values.pop(tensor, None)
                    return None
            return value

        def _contents_of(self, x):
            """All of ``x``'s elements as a CPU tensor of its shape and dtype, if known and small."""
            if x.is_sparse or x.numel() > contents_elements:
                return None
            if not isinstance(x, fake_tensor_type):
                return x  # a real tensor: its own data
            known = self.known_of(x)
            if known is None or isinstance(known, torch.Tensor):
                return known
            with disable_modes():
                return torch.full(tuple(x.shape), known, dtype=x.dtype, device="cpu")

        def _known_result(self, func, base, args, kwargs, out):
            def value_of(x):
                if isinstance(x, fake_tensor_type):
                    known = self.known_of(x)
                    return None if isinstance(known, torch.Tensor) else known  # (contents: not one value)
                if isinstance(x, torch.Tensor):
                    # A real tensor (token ids made with torch.tensor, moved to fake CUDA): known
                    # when small and every element is the same.
                    if x.is_sparse or x.numel() > contents_elements:
                        return None
                    with disable_modes():  # read the real data, past this mode and fake ones
                        value = _one_value_or_contents(x)
                    return None if isinstance(value, torch.Tensor) else value
                return x if isinstance(x, (bool, int, float)) else None

            if base in ("where", "masked_fill") and len(args) == 3 and isinstance(out, torch.Tensor):
                # where(condition, self, other), masked_fill(self, mask, value): a known
                # condition picks a side, and two equal sides need no condition.
                if base == "where":
                    condition, chosen, other = (value_of(a) for a in args)
                else:
                    chosen, condition, other = (value_of(a) for a in (args[2], args[1], args[0]))
                if condition is not None:
                    chosen = chosen if condition else other
                elif chosen != other:
                    return None
                return None if chosen is None else self._as_dtype_of(out, chosen)
            if base == "isin":
                # Both sides known: compute it; otherwise nothing is found (the assumption).
                invert = bool(kwargs.get("invert", args[3] if len(args) > 3 else False))
                whole = len(args) > 1 and all(
                    not isinstance(a, torch.Tensor) or self._contents_of(a) is not None for a in args[:2])
                # (both known: computed on their contents, as torch computes it)
                return None if whole else invert
            if base in assumed_false and value_of(args[0]) is None and self._contents_of(args[0]) is None:
                return False  # (known values are tested as they are: a causal mask's -inf)
            if base in no_nan_no_inf and len(args) > 1 and isinstance(args[0], torch.Tensor) and value_of(args[0]) is None \
                    and self._contents_of(args[0]) is None:
                # The assumption above, as isfinite(x) (x == x) * (x.abs() != inf) and `x != x`
                # ask it: an unknown value equals itself and is no infinity.
                itself = args[1] is args[0]
                infinity = isinstance(args[1], float) and args[1] in (float("inf"), float("-inf"))
                if itself or infinity:
                    return (base == "eq") == itself
            if base in constants:
                return constants[base]
            if base in fills:
                pos = fills[base]
                return value_of(args[pos]) if pos < len(args) else None
            first = value_of(args[1] if base == "copy" else args[0])  # copy(self, src): src's value
            if first is None:
                return None
            if (base in keeps_value and func is not view_dtype) or func in full_reductions:
                return first
            if base in reductions:
                return reductions[base](first) if args[0].numel() else None
            if base == "sum":
                # Each output element sums (input elements / output elements) equal values.
                return first * (int(args[0].numel()) // int(out.numel())) if out.numel() else None
            if base == "count_nonzero":
                # ... and counts them all, or none.
                return (int(args[0].numel()) // int(out.numel()) if first else 0) if out.numel() else None
            if base == "mean":
                return first if args[0].numel() else None
            if not isinstance(out, torch.Tensor) or not self._pointwise(func, base):
                return None

            def one_element(x):
                # A known tensor as one element of its dtype and dimensions: 0-dim ones still
                # promote as scalars do, and the rest as tensors.
                if not isinstance(x, torch.Tensor):
                    return x
                value = value_of(x)
                if value is None:
                    raise LookupError  # (an unknown operand: the result is unknown)
                return torch.full((1,) * x.dim(), value, dtype=x.dtype, device="cpu")

            try:
                with disable_modes():
                    result = func(*[one_element(a) for a in args], **{k: one_element(v) for k, v in kwargs.items()})
                    return result.reshape(-1)[0].item()
            except LookupError:
                return None

        def _pointwise(self, func, base):
            """True for an elementwise op (tagged so, or its out-of-place form is)."""
            pointwise = self.pointwise_ops.get(func)
            if pointwise is None:
                functional = getattr(getattr(aten, base, None), func._overloadname, None)
                pointwise = nondeterministic_tag not in func.tags and (base in pointwise_untagged or any(
                    pointwise_tag in op.tags for op in (func, functional) if op is not None))
                self.pointwise_ops[func] = pointwise
            return pointwise

        def learn_contents(self, fake, real):
            """``fake`` holds ``real``'s values (a checkpoint's tensor loaded onto fake CUDA)."""
            if not self.fake or real.is_sparse or not 0 < real.numel() <= contents_elements:
                return
            with self.lock, disable_modes():
                self._know(fake, _one_value_or_contents(real.detach().clone()))

        def copy_known(self, source, copy):
            """``copy`` holds what ``source`` is known to hold (a deep copy)."""
            with self.lock:
                known = self.known_of(source)
                if known is not None:
                    with disable_modes():
                        self._know(copy, known.clone() if isinstance(known, torch.Tensor) else known)

        def known_contents(self, tensor):
            """A fake tensor's contents as a real CPU tensor, when known (Note [Known values])."""
            with self.lock:
                if self.known_of(tensor) is None:
                    return None
                self.say_once("known values", KNOWN_VALUES_SAID)
                return self._contents_of(tensor)

        def _scalar(self, func, args):
            value = self.known_of(args[0]) if isinstance(args[0], fake_tensor_type) else None
            if isinstance(value, torch.Tensor):
                with disable_modes():
                    value = value.item()  # (followed whole: a one-element tensor's element)
            if value is not None:
                self.say_once("known values", KNOWN_VALUES_SAID)
                return self._as_dtype_of(args[0], value)
            # FakeTensorMode knows the value of small tensors made from Python numbers and kept up
            # through in-place ops (an optimizer's step count); anything else has no value.
            try:
                return func(*args)
            except DataDependentOutputException as e:
                if self.scalar_value is None:
                    raise FakeValueNeeded("aten._local_scalar_dense", on_cpu=args[0].device.type == "cpu") from e
            return self._as_dtype_of(args[0], self.scalar_value)

        def _compare_values(self, func, args, kwargs):
            """torch.equal / torch.allclose of fake tensors: a read of both operands' values. Known
            contents are compared as torch compares them; with --scalar-value every element holds
            that value (equal when the shapes are, allclose when they broadcast); else the read
            stops the capture as .item() does."""
            a, b = args[0], args[1]
            contents = [self._contents_of(x) if isinstance(x, torch.Tensor) else None for x in (a, b)]
            if all(c is not None for c in contents):
                with disable_modes():
                    return func(*contents, *args[2:], **kwargs)
            if self.scalar_value is None:
                raise FakeValueNeeded(str(func), on_cpu=a.device.type == "cpu")
            if func is aten.equal.default:
                return tuple(a.shape) == tuple(b.shape)
            try:
                torch.broadcast_shapes(a.shape, b.shape)
            except RuntimeError:
                return func(*args, **kwargs)  # (torch's own error for shapes that do not broadcast)
            return True

        @staticmethod
        def _as_dtype_of(tensor, value):
            """``value`` as the Python number a read of ``tensor`` gives."""
            if tensor.dtype == torch.bool:
                return bool(value)
            if tensor.dtype.is_complex:
                return complex(value)
            if tensor.dtype.is_floating_point:
                return float(value)
            return int(value)

    return Recorder


# Note [Gradient accumulation under a dispatch mode]: the autograd engine sums gradients in place
# when it may: AccumulateGrad adds a new gradient into an existing .grad (`variable_grad +=
# new_grad`) and InputBuffer::accumulate adds into a buffered gradient it holds the only reference
# to (torch/csrc/autograd/functions/accumulate_grad.h, input_buffer.cpp). Both fall back to an
# out-of-place `a + b` for "subclass-like" tensors, and isTensorSubclassLike() is true for fake
# tensors and whenever a dispatch mode is active: under a capture every such sum would allocate a
# gradient-sized tensor that a plain run never allocates. The recorder does these sums in place
# instead, under the engine's own conditions; the reference count the engine tests (1) is seen
# from inside a dispatch mode with a constant offset, measured once per capture by a probe.


def _engine_add(torch, func_is_add, args, kwargs, exclusive_use_count):
    """True when this add.Tensor is the engine summing two gradients, which an untraced run does in place."""
    if not func_is_add or torch.is_grad_enabled() or len(args) < 2 or kwargs.get("alpha", 1) != 1:
        return False
    node = torch._C._current_autograd_node()
    if node is None:
        return False
    old, new = args[0], args[1]
    if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
        return False
    if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
        return False
    if node.name().endswith("AccumulateGrad"):
        return True  # `variable_grad += new_grad` does not depend on reference counts
    if exclusive_use_count is None or old._use_count() > exclusive_use_count or not _non_overlapping_and_dense(old):
        return False
    return torch._C._storage_Use_Count(old.untyped_storage()._cdata) <= 2


# Note [linear's bias add]: at::linear (aten/src/ATen/native/Linear.cpp), when it cannot fuse the
# bias into addmm (an input of 3 or more dims that is not contiguous, as nn.MultiheadAttention's
# batch_first input is), computes matmul(input, weight.t()) and then adds the bias in place,
# `output.add_(bias)`, unless isTensorSubclassLike(bias) -- "for composite compliance" it then
# uses an out-of-place `at::add`. isTensorSubclassLike() is true whenever a dispatch mode is
# active, so under a capture the add would allocate a second output-sized tensor that an untraced
# run never allocates. The recorder lets the add's output take over the matmul output's
# allocation instead: one buffer, as in the untraced run (forward-mode AD, the other reason for
# the out-of-place add, is not taken into account).


# Note [Out-of-place backward formulas]: isTensorSubclassLike() is true whenever a dispatch mode is
# active (as for linear's bias add above), so under a capture these backward formulas
# (torch/csrc/autograd/FunctionsManual.cpp) take their branch "for composite compliance": out of
# place on a fresh temporary (gather_backward's new_zeros(...).scatter_add, index_backward's
# zeros.index_put, value_selecting_reduction_backward's zeros.scatter for topk, sort, max/min
# over a dim..., binary_cross_entropy_with_logits_backward's sigmoid().sub(target).mul(grad)),
# where an untraced run (grad mode off) writes the same temporary in place. The out-of-place
# result takes over the temporary's allocation: one buffer, as in the untraced run.
_VALUE_SELECTING = {"aten.scatter.src"}
_IN_PLACE_IN_UNTRACED_BACKWARD = {
    "GatherBackward0": {"aten.scatter_add.default"},
    "IndexBackward0": {"aten.index_put.default"},
    "IndexSelectBackward0": {"aten.index_add.default"},
    "TakeBackward0": {"aten.put.default"},
    "BinaryCrossEntropyWithLogitsBackward0": {"aten.sub.Tensor", "aten.mul.Tensor"},
    **{node: _VALUE_SELECTING for node in (
        "TopkBackward0", "SortBackward0", "SortBackward1", "KthvalueBackward0", "MaxBackward0", "MinBackward0",
        "MedianBackward1", "NanmedianBackward1", "ModeBackward0", "CummaxBackward0", "CumminBackward0")},
}


_IN_PLACE_OPS = frozenset(op for ops in _IN_PLACE_IN_UNTRACED_BACKWARD.values() for op in ops)


def _in_place_in_an_untraced_backward(torch, func, args, out):
    """Whether this op, in the backward formula running now, writes its first operand in place in
    an untraced run: an operand only the formula holds (a temporary), of the result's layout. (The
    running node is asked last: only for the few ops that qualify.)"""
    if torch.is_grad_enabled() or not args or str(func) not in _IN_PLACE_OPS:
        return False
    old = args[0]
    if not isinstance(old, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if old.shape != out.shape or old.dtype != out.dtype or not _non_overlapping_and_dense(old):
        return False
    if torch._C._storage_Use_Count(old.untyped_storage()._cdata) > 2:
        return False
    node = torch._C._current_autograd_node()
    return node is not None and str(func) in _IN_PLACE_IN_UNTRACED_BACKWARD.get(node.name(), ())


def _linear_bias_add_in_place(torch, patches, recorder):
    functional = torch.nn.functional
    original = functional.linear

    def linear(input, weight, bias=None):
        if bias is None or recorder.closed:
            return original(input, weight, bias)
        recorder.linear_bias_add = True
        try:
            return original(input, weight, bias)
        finally:
            recorder.linear_bias_add = False

    patches.set(functional, "linear", linear)


# CPU factories making at most this many bytes of floating tensors run for real under fake CUDA,
# and CPU ops on real tensors up to the second bound (Note [Real CPU, fake CUDA]).
_REAL_CPU_BYTES = 1 << 20
_REAL_CPU_DERIVED_BYTES = 1 << 30
_RNG_OUTPUTS = frozenset({"rng_state", "unused", "philox_seed", "philox_offset"})


def _dropout(func, args, kwargs):
    for i, a in enumerate(func._schema.arguments):
        if a.name == "dropout_p":
            return (args[i] if i < len(args) else kwargs.get("dropout_p", 0.0)) > 0.0
    return False


def _view_of_buffer(buffer, like):
    """A tensor of ``like``'s dtype, shape, strides and offset over the byte buffer ``buffer``
    (one allocation standing for ``like``'s storage)."""
    whole = buffer[: buffer.numel() - buffer.numel() % like.element_size()]
    return whole.view(like.dtype).as_strided(like.shape, like.stride(), like.storage_offset())


def _one_value_or_contents(real):
    """A real tensor's known value: its one number when every element is it, else the tensor."""
    flat = real.reshape(-1)
    if real.numel() and not real.is_complex() and bool((flat == flat[0]).all()):
        return flat[0].item()
    return real


def _in_dtype(torch, dtype, value):
    """``value`` as an element of ``dtype`` holds it: rounded to a float's precision (0.1 in
    float32, 257 in bfloat16, past the range inf), an integer truncated and wrapped as a cast
    wraps it (400 in int8 is -112)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(torch.tensor(complex(value), dtype=dtype, device="cpu").item())
    if dtype.is_floating_point:
        return torch.tensor(float(value), dtype=torch.float64, device="cpu").to(dtype).item()
    bits = torch.iinfo(dtype).bits
    number = int(value)
    if torch.iinfo(dtype).min == 0:
        return number % (1 << bits)
    return (number + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _round_up(x, m):
    return (x + m - 1) // m * m


# An H100 SXM's streaming multiprocessors (the fake device's multi_processor_count).
H100_SMS = 132


def flash_backward_scratch(batch, heads, seq_q, seq_k, head_dim, heads_k=None, elem_bytes=2, deterministic=False):
    """Bytes FlashAttention-2's backward allocates through the caching allocator besides its
    outputs, in order (mha_bwd in aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp;
    freed in reverse): softmax_d [B, H, S_q rounded to 128] fp32; the dq accumulator [B, S_q
    rounded, H, D rounded to 32 (64 past 128)] fp32, always (`bool loop = true`), split
    ceil(SMs / (B·H)) ways when deterministic; and for grouped-query attention (fewer key heads)
    dk and dv expanded to every query head, [B, S_k, H, D] in the inputs' dtype, summed into dk
    and dv after the kernel."""
    s_q_rounded = _round_up(seq_q, 128)
    d_rounded = _round_up(head_dim, 32 if head_dim <= 128 else 64)
    softmax_d = batch * heads * s_q_rounded * 4
    splits = -(-H100_SMS // (batch * heads)) if deterministic else 1
    dq_accum = splits * batch * s_q_rounded * heads * d_rounded * 4
    expanded = batch * seq_k * heads * head_dim * elem_bytes if heads_k not in (None, heads) else 0
    return [softmax_d, dq_accum, expanded, expanded]


def _flash_backward_scratch(torch, args):
    q, k = args[1], args[2]  # query [B, H, S_q, D], key [B, H_k, S_k, D]
    b, h, s_q, d = q.shape
    # _flash_attention_backward: deterministic unless deterministic algorithms only warn.
    deterministic = torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    return flash_backward_scratch(b, h, s_q, k.shape[2], d, heads_k=k.shape[1], elem_bytes=q.element_size(), deterministic=deterministic)


def _non_overlapping_and_dense(t):
    """TensorImpl::is_non_overlapping_and_dense: some permutation of the dims is contiguous."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _probe_exclusive_use_count(torch, recorder, device):
    """The reference count, seen from inside the recorder, of a gradient the engine alone holds."""
    recorder.probing = []
    try:
        leaf = torch.ones(4, device=device, requires_grad=True)
        y = leaf * 2
        (y.sin() + y.cos()).sum().backward()  # y's gradient: SinBackward's, then CosBackward's added to it
    finally:
        seen, recorder.probing = recorder.probing, None
    return max(seen) if seen else None


# --- fake CUDA ------------------------------------------------------------------------------

_SHIM_SOURCE = r"""
// allocbench capture: lets autograd run on fake CUDA tensors on a machine without a GPU.
// - Autograd asks the device guard of each input's device for its current stream
//   (InputMetadata, the engine's stream bookkeeping); CUDA's own guard would call the driver,
//   so a guard that reports one device with one default stream replaces it.
// - The engine stashes the caller's streams on devices that have a primary context
//   (GraphTask::stash_current_streams); CUDA's hooks check the index against the driver's device
//   count (0 here) and throw, so hasPrimaryContext answers "no context" instead.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace {
using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

Device cuda0() { return Device(DeviceType::CUDA, 0); }
Stream default_stream() { return Stream(Stream::DEFAULT, cuda0()); }

struct FakeCudaGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::CUDA; }
  Device exchangeDevice(Device) const override { return cuda0(); }
  Device getDevice() const override { return cuda0(); }
  void setDevice(Device) const override {}
  void uncheckedSetDevice(Device) const noexcept override {}
  Stream getStream(Device) const noexcept override { return default_stream(); }
  Stream getDefaultStream(Device) const override { return default_stream(); }
  Stream getStreamFromGlobalPool(Device, bool) const override { return default_stream(); }
  Stream getNewStream(Device, int) const override { return default_stream(); }
  Stream exchangeStream(Stream) const noexcept override { return default_stream(); }
  DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
};

bool no_primary_context(const at::AcceleratorHooksInterface*, DeviceIndex) { return false; }
}  // namespace

// 0 on success; 1: not an Itanium-ABI virtual member pointer; 2: mprotect failed.
extern "C" int allocbench_install_fake_cuda() {
  static FakeCudaGuard guard;
  c10::impl::DeviceGuardImplRegistrar replace(DeviceType::CUDA, &guard);

  const at::AcceleratorHooksInterface& hooks = at::detail::getCUDAHooks();
  bool (at::AcceleratorHooksInterface::*member)(DeviceIndex) const = &at::AcceleratorHooksInterface::hasPrimaryContext;
  struct { std::ptrdiff_t ptr, adj; } raw;
  static_assert(sizeof(raw) == sizeof(member));
  std::memcpy(&raw, &member, sizeof(raw));
  // Itanium C++ ABI: a pointer to a virtual member function holds 1 + its byte offset in the vtable.
  if ((raw.ptr & 1) == 0) return 1;
  void** vtable = *reinterpret_cast<void** const*>(&hooks);
  void** slot = vtable + (raw.ptr - 1) / static_cast<std::ptrdiff_t>(sizeof(void*));
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  auto* start = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(slot) & ~(page - 1));
  if (mprotect(start, 2 * page, PROT_READ | PROT_WRITE) != 0) return 2;
  *slot = reinterpret_cast<void*>(&no_primary_context);
  mprotect(start, 2 * page, PROT_READ);
  return 0;
}
"""

_shim_installed = False


def _cache_dir():
    base = os.environ.get("ALLOCBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "allocbench"
    )
    os.makedirs(base, exist_ok=True)
    return base


def _build_shim(torch):
    """Compiles the fake-CUDA shim against this torch's headers once; cached by version and source."""
    torch_dir = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    digest = hashlib.sha256(f"{_SHIM_SOURCE}{torch.__version__}{abi}{torch_dir}".encode()).hexdigest()[:16]
    lib = os.path.join(_cache_dir(), f"fake-cuda-guard-{torch.__version__.replace('+', '_')}-{digest}.so")
    if os.path.exists(lib):
        return lib
    compiler = os.environ.get("CXX") or "g++"
    src = lib[:-3] + ".cpp"
    with open(src, "w") as f:
        f.write(_SHIM_SOURCE)
    tmp = f"{lib}.{os.getpid()}.tmp"
    cmd = [
        compiler, "-shared", "-fPIC", "-O1", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-I", os.path.join(torch_dir, "include"), src, "-L", os.path.join(torch_dir, "lib"),
        "-lc10", "-ltorch_cpu", "-Wl,-rpath," + os.path.join(torch_dir, "lib"), "-o", tmp,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise SetupError(
            f"a fake-CUDA capture compiles a small C++ shim against torch's headers, and no C++ compiler "
            f"'{compiler}' was found: install one (apt-get install g++) or set CXX, or capture with --real on a GPU"
        ) from None
    if done.returncode != 0:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:300])
        raise SetupError(
            f"the fake-CUDA shim does not build against torch {torch.__version__} (an ABI this capture does not "
            f"support): {first.strip()}; capture with --real on a GPU, or use a torch >= 2.4"
        )
    os.replace(tmp, lib)
    return lib


def _install_fake_cuda_guard(torch):
    global _shim_installed
    if _shim_installed:
        return
    lib = ctypes.CDLL(_build_shim(torch), mode=ctypes.RTLD_GLOBAL)
    code = lib.allocbench_install_fake_cuda()
    if code != 0:
        raise SetupError(
            f"the fake-CUDA device guard could not be installed in torch {torch.__version__} (code {code}): "
            "this platform's C++ ABI is not supported; capture with --real on a GPU"
        )
    _shim_installed = True


class _Patches:
    """Attribute replacements undone in reverse order when the capture ends."""

    def __init__(self):
        self.saved = []

    def set(self, obj, name, value):
        # A class's own attribute as stored (a staticmethod stays one), or none: an inherited
        # one is restored by deleting the override.
        old = vars(obj).get(name, _MISSING) if isinstance(obj, type) else getattr(obj, name, _MISSING)
        op = _builtin_op(old)  # (asked before the replacement is in place: torch builds its table lazily)
        self.saved.append((obj, name, old))
        setattr(obj, name, value)
        if op is not None:
            _script_as_builtin(value, op)

    def undo(self):
        for obj, name, old in reversed(self.saved):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.saved.clear()


_MISSING = object()
# A device past the fake machine's one GPU (torch.cuda.device_count() answers 1), as CUDA says it.
_NO_SUCH_DEVICE = "CUDA error: invalid device ordinal ({device}: the fake machine has one GPU, cuda:0)"
_NO_SUCH_DEVICE_FIX = ("capture one device's share on cuda:0 (a model split over GPUs: each part in a capture of "
                       "its own), or capture with --real on a machine with that GPU")
_KEPT_FOR_BUILTIN_IDS = []
# A new generator's seed (default_rng_seed_val in c10/core/GeneratorImpl.h), CUDA's included.
_DEFAULT_RNG_SEED = 67280421310721


# TorchScript compiles a call to F.linear, torch.tensor... as the aten op it maps the original
# function to; a replacement it does not know it would try to compile from its Python source
# (torch.jit.script of any module with an nn.Linear failed on the wrapper's `try`). A replacement
# is mapped to the original's op: scripted code calls the op, as it does without a capture.
def _builtin_op(original):
    """The aten op TorchScript maps `original` to, or None."""
    if original is _MISSING or not callable(original):
        return None
    try:
        from torch.jit._builtins import _find_builtin

        return _find_builtin(original)
    except Exception:  # noqa: BLE001 - a torch without these internals: scripting is as before
        return None


def _script_as_builtin(replacement, op):
    try:
        from torch.jit._builtins import _register_builtin

        _register_builtin(replacement, op)
        _KEPT_FOR_BUILTIN_IDS.append(replacement)  # (the table goes by id: never freed and reused)
    except Exception:  # noqa: BLE001 - as in _builtin_op
        pass

def _fake_tensor_fixes(torch, patches):
    """What scripts do that fake tensors would otherwise refuse."""
    # GradScaler reads found_inf with .item() before optimizer.step(); fake tensors have no value,
    # and a finite step is what a healthy run takes.
    from torch.amp import grad_scaler

    def maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    patches.set(grad_scaler.GradScaler, "_maybe_opt_step", maybe_opt_step)
    # f"{loss:.4f}": Tensor.__format__ formats a 0-d tensor as its value only when its type is
    # exactly Tensor; a fake one is a subclass, so formatted as an object, which takes no spec.
    fake_tensor_type = torch._subclasses.fake_tensor.FakeTensor

    def format_value(self, spec):
        if self.dim() == 0:
            try:
                return self.item().__format__(spec)  # the value as .item() answers it (--scalar-value)
            except FakeValueNeeded as e:
                if spec:
                    raise
                e.handled = True
                # f"{loss}": formatted as the tensor it is (its repr), as before, not a stop.
        return object.__format__(self, spec)

    patches.set(fake_tensor_type, "__format__", format_value)
    # Module.cuda() swaps parameters with torch.utils.swap_tensors, which refuses tensors with
    # weak references, and FakeTensorMode keeps one to every fake tensor it makes.
    original_swap = torch.utils.swap_tensors
    fake_type = torch._subclasses.fake_tensor.FakeTensor

    def swap_tensors(t1, t2):
        if isinstance(t1, fake_type) or isinstance(t2, fake_type):
            real_weakref = torch.utils.weakref
            shim = types.SimpleNamespace(getweakrefs=lambda obj: [])
            try:
                torch.utils.weakref = shim
                return original_swap(t1, t2)
            finally:
                torch.utils.weakref = real_weakref
        return original_swap(t1, t2)

    patches.set(torch.utils, "swap_tensors", swap_tensors)
    patches.set(torch.nn.Module, "_apply", _module_apply_as_on_a_device(torch, torch.nn.Module._apply, swap_tensors))
    _lazy_placeholders(torch, patches, swap_tensors)
    # Optimizers and clip_grad_norm_ take their foreach paths only for plain tensor types; on CUDA a
    # script's default AdamW is foreach (whole-list temporaries), and fake tensors must take it too.
    import importlib

    for name in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        module = importlib.import_module(name)
        types_list = getattr(module, "_foreach_supported_types", None)
        if isinstance(types_list, list) and fake_type not in types_list:
            patches.set(module, "_foreach_supported_types", [*types_list, fake_type])


def _module_apply_as_on_a_device(torch, original, swap_tensors):
    """Module._apply (``.cuda()``, ``.half()``, ``.to(...)``, ``to_empty``) with fake parameters as it
    runs on real ones. Module._apply swaps a fake parameter's tensors (it cannot ``param.data =``
    one), and its loop variable then holds the old data until the next parameter is converted: one
    parameter more is live than on a GPU, where ``param.data = new`` frees the old data at once. And
    a meta parameter (``with torch.device("meta")``, then ``to_empty``) gets a new Parameter per
    module on a GPU, which unties tied weights, while the swap kept them tied. And a real CPU
    parameter (a small model's) moved to fake CUDA got a new Parameter per module, untying tied
    weights that ``.cuda()`` keeps tied on a GPU. Here the parameter keeps its identity (as
    ``param.data = new`` does) and the old data dies at once, or a meta one is replaced, as on the
    device. (torch's own _apply runs where it swaps anyway: the swap-on-conversion flag, tensor
    subclasses such as DTensor.)"""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    fake_type = torch._subclasses.fake_tensor.FakeTensor
    Parameter = torch.nn.Parameter
    is_lazy = torch.nn.parameter.is_lazy

    def retarget_lazy(placeholder, fn):
        """A lazy module's placeholder moves or converts without data (see _lazy_placeholders)."""
        # An empty tensor where the placeholder will materialize shows where fn takes it.
        probe = convert(fn, torch.empty(0, dtype=placeholder.dtype, device=vars(placeholder).get(LAZY_DEVICE, "cpu")))
        if isinstance(probe, fake_type):
            placeholder.data = torch.empty(0, dtype=probe.dtype, device="cpu")
            vars(placeholder)[LAZY_DEVICE] = probe.device
        else:
            placeholder.data = probe
            vars(placeholder).pop(LAZY_DEVICE, None)

    def convert(fn, tensor):
        with torch.no_grad():
            return fn(tensor)

    def apply(self, fn, recurse=True):
        if torch.__future__.get_swap_module_params_on_conversion() or any(
                is_traceable_wrapper_subclass(p) and not isinstance(p, fake_type) for p in self._parameters.values() if p is not None):
            return original(self, fn, recurse)
        if recurse:
            for module in self.children():
                module._apply(fn)
        for key, param in self._parameters.items():
            if param is None:
                continue
            if is_lazy(param):
                retarget_lazy(param, fn)
                continue
            applied = convert(fn, param)
            grad = param.grad
            # compute_should_use_set_data: a meta tensor's data cannot be set to a dense one's.
            if param.is_meta != applied.is_meta or torch.__future__.get_overwrite_module_params_on_conversion():
                out = Parameter(applied, param.requires_grad)
                self._parameters[key] = out
                if grad is not None:
                    out.grad = convert(fn, grad).requires_grad_(grad.requires_grad)
                continue
            if applied is param:
                pass
            elif not isinstance(param, fake_type) and not isinstance(applied, fake_type):
                param.data = applied  # real tensors: what torch does
            else:
                replaced = Parameter(applied, requires_grad=param.requires_grad)
                # The swap trades __dict__ too: the script's attributes on the parameter stay.
                for name, value in vars(param).items():
                    vars(replaced).setdefault(name, value)
                try:
                    param.grad = None
                    swap_tensors(param, replaced)
                except RuntimeError:
                    # A tensor others hold (a view of it, weight_norm's, a live graph) cannot be
                    # swapped: a new Parameter then, as torch does when it cannot set the data.
                    param.grad = grad
                    out = Parameter(applied, param.requires_grad)
                    self._parameters[key] = out
                    if grad is not None:
                        out.grad = convert(fn, grad).requires_grad_(grad.requires_grad)
                    continue
                del applied, replaced  # the old data, dead now unless the script holds it (param.data = new)
            if grad is not None:
                grad_applied = convert(fn, grad)
                if not isinstance(grad, fake_type) and not isinstance(grad_applied, fake_type):
                    param.grad = grad
                    param.grad.data = grad_applied
                elif grad_applied is not grad:
                    grad_applied.requires_grad_(grad.requires_grad)
                    swap_tensors(grad, grad_applied)
                    del grad_applied
                param.grad = grad
        for key, buf in self._buffers.items():
            if buf is not None and is_lazy(buf):
                retarget_lazy(buf, fn)
            elif buf is not None:
                self._buffers[key] = fn(buf)
        return self

    return apply


# Where a lazy module's CPU placeholder will materialize (a fake CUDA device).
LAZY_DEVICE = "_allocbench_lazy_device"


def _lazy_placeholders(torch, patches, swap_tensors):
    """Lazy modules (nn.LazyLinear, LazyConv2d, LazyBatchNorm2d) hold empty uninitialized
    placeholders until their first forward materializes them. A fake CUDA tensor cannot be one
    (dispatch refuses the subclass), so a CUDA placeholder stays an empty CPU tensor that remembers
    its device (``.cuda()`` included, see _module_apply_as_on_a_device), and materialize makes the
    fake CUDA tensor there: one allocation of the inferred shape, as on the device."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, UninitializedTensorMixin

    def is_cuda(device):
        return device is not None and torch.device(device).type == "cuda"

    for cls in (UninitializedParameter, UninitializedBuffer):
        def new(cls_, requires_grad=cls is UninitializedParameter, device=None, dtype=None, _original=cls.__new__):
            if device is None:
                device = torch.utils._device.CURRENT_DEVICE  # `with torch.device("cuda")`
            if not is_cuda(device):
                return _original(cls_, requires_grad, device, dtype)
            placeholder = _original(cls_, requires_grad, "cpu", dtype)
            vars(placeholder)[LAZY_DEVICE] = torch.device(device)
            return placeholder

        patches.set(cls, "__new__", staticmethod(new))
    original_materialize = UninitializedTensorMixin.materialize

    def materialize(self, shape, device=None, dtype=None):
        if device is None:
            device = vars(self).get(LAZY_DEVICE)
        if not is_cuda(device):
            return original_materialize(self, shape, device, dtype)
        data = torch.empty(shape, device=device, dtype=self.data.dtype if dtype is None else dtype)
        made = torch.nn.Parameter(data, self.requires_grad) if self.cls_to_become is torch.nn.Parameter else data
        for name, value in vars(self).items():
            if name != LAZY_DEVICE:
                vars(made).setdefault(name, value)
        swap_tensors(self, made)  # the placeholder becomes the tensor, as ``self.data =`` makes it

    patches.set(UninitializedTensorMixin, "materialize", materialize)
    for cls in (UninitializedParameter, UninitializedBuffer):
        if "__deepcopy__" not in vars(cls):
            continue  # Tensor's own deep copy keeps the instance's attributes

        def deepcopy(self, memo, _original=vars(cls)["__deepcopy__"]):
            # torch's copy is made on the placeholder's (CPU) device: keep where it materializes.
            copied = _original(self, memo)
            if LAZY_DEVICE in vars(self):
                vars(copied)[LAZY_DEVICE] = vars(self)[LAZY_DEVICE]
            return copied

        patches.set(cls, "__deepcopy__", deepcopy)


@contextlib.contextmanager
def _real_cpu_from_data():
    """A CPU tensor built from Python or NumPy data stays real, however large (Note [Real CPU, fake
    CUDA]): its values are the script's, already in memory."""
    local = _active.from_data if _active is not None else None
    if local is not None:
        local.depth = getattr(local, "depth", 0) + 1
    try:
        yield
    finally:
        if local is not None:
            local.depth -= 1


def _constructor_via_cpu(torch, original, takes_requires_grad=True, shares=False):
    """``original`` (torch.tensor, as_tensor, asarray) for a CUDA device, made on the CPU and copied
    into one fake CUDA tensor. ``shares``: a CUDA tensor of the right dtype is returned as it is
    (as_tensor and asarray share storage; torch.tensor copies)."""

    def construct(data, *args, device=None, **kwargs):
        if device is None:
            # torch.set_default_device("cuda") and `with torch.device("cuda")` (DeviceContext) give
            # factory calls their device; the mode does not see this wrapper, so it asks.
            device = torch.utils._device.CURRENT_DEVICE
        if device is None or torch.device(device).type != "cuda":
            with _real_cpu_from_data():
                if kwargs.get("pin_memory") and _active is not None and _active.fake:
                    # Pinned in C++ below the dispatcher (the driver's host allocator): the same
                    # host memory made unpinned, then answered pinned as on a GPU machine.
                    return _active.mark_pinned(original(data, *args, device=device, **{**kwargs, "pin_memory": False}))
                return original(data, *args, device=device, **kwargs)
        requires_grad = kwargs.pop("requires_grad", False) if takes_requires_grad else False
        if isinstance(data, torch.Tensor) and data.device.type == "cuda":
            dtype = kwargs.get("dtype", args[0] if args else None)
            if dtype in (None, data.dtype):
                out = data if shares and not kwargs.get("copy") else data.detach().clone()
            else:
                out = data.detach().to(dtype)
            return out.requires_grad_() if requires_grad else out
        host = original(data, *args, device="cpu", **kwargs)
        # Not host.to(device): FakeTensorMode runs ops on small constant tensors for real.
        moved = torch.empty(host.shape, dtype=host.dtype, device=device).copy_(host)
        return moved.requires_grad_() if requires_grad else moved

    return construct


def _quiet_meta_failures(patches):
    """FakeTensorMode logs "failed while attempting to run meta for OP" with a traceback each time a
    meta kernel raises (a shape error the script may even catch); on a GPU the op raises and nothing
    is logged, so the records are dropped (the error itself still reaches the script)."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")

    def keep(record):
        return not str(record.msg).startswith("failed while attempting to run meta")

    patches.set(logger, "filters", [*logger.filters, keep])


def _fake_deep_copies(torch, patches, recorder):
    """``copy.deepcopy`` of a fake CUDA tensor (``best = deepcopy(model.state_dict())``). torch's
    copies the storage and ``set_``s a ``new_empty([])`` onto it; on fake tensors FakeTensorMode's
    dispatch cache keys that set_ on the storage and keeps it alive for good (each copy leaked),
    and freeing such storages crashes the interpreter. The copy here makes what a device run
    allocates without set_: one buffer of the storage's size per storage copied (tensors sharing
    one share the copy), then the new_empty that set_ frees, with the tensor a view of the buffer."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original = torch.Tensor.__deepcopy__

    def deepcopy(self, memo):
        if (type(self) is not fake_type or self.device.type != "cuda" or id(self) in memo or not self.is_leaf
                or self.is_sparse or self.is_quantized or self.is_conj() or self.is_neg()):
            return original(self, memo)
        if getattr(self, "_is_param", False):
            # A parameter on fake CUDA is a FakeTensor marked _is_param (Parameter.__new__'s way
            # for subclasses), so Parameter.__deepcopy__ is not the one Python finds. As it does
            # (torch/nn/parameter.py): a Parameter of a clone of the data, no grad, no attributes.
            with torch.no_grad():
                data = self.data.clone(memory_format=torch.preserve_format)
            recorder.copy_known(self, data)
            copied = memo[id(self)] = torch.nn.Parameter(data, self.requires_grad)
            return copied
        with torch.no_grad():
            storage = self.untyped_storage()
            key = ("allocbench deep copy of storage", storage._cdata)
            buffer = memo.get(key)
            if buffer is None:
                buffer = memo[key] = torch.empty(storage.nbytes(), dtype=torch.uint8, device=self.device)
            torch.empty((), dtype=self.dtype, device=self.device)  # new_empty([]), freed by set_
            copied = _view_of_buffer(buffer, self).detach()
            recorder.copy_known(self, copied)
        if self.requires_grad:
            copied.requires_grad_()
        if self.grad is not None:
            copied.grad = copy.deepcopy(self.grad, memo)
        for name, value in vars(self).items():
            if name not in vars(copied):  # the script's own attributes; the fake tensor's are the copy's
                vars(copied)[name] = copy.deepcopy(value, memo)
        memo[id(self)] = copied
        return copied

    patches.set(torch.Tensor, "__deepcopy__", deepcopy)


def _sequence_indices(torch, patches, tensor):
    """``x[[0, 2]]``, ``x[0, [1, 2]]``, ``v[:, [-1]]`` on fake CUDA. PyTorch turns a Python
    sequence index into a CUDA tensor inside its C++ indexing (indexing_tensor_from_data in
    python_variable_indexing.cpp), below the dispatcher, so it would reach the driver: the
    sequence becomes that one small tensor here, through ``tensor`` (torch.tensor on fake CUDA),
    and lives as long as the indexing, as on the device."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original_getitem, original_setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def holds_tensors(item):
        return isinstance(item, torch.Tensor) or (
            isinstance(item, (list, tuple)) and any(holds_tensors(v) for v in item))

    def index_tensor(item, device):
        if not isinstance(item, (list, range)) or holds_tensors(item):
            return item  # (tensors in a list: PyTorch's own path stacks them on their device)
        try:
            host = torch.tensor(item, device="cpu")  # numbers, numpy scalars, nested lists
        except (TypeError, ValueError, RuntimeError):
            return item  # (what PyTorch refuses, it refuses with its own error)
        # Bool and Byte stay masks, anything else becomes Long, as indexing_tensor_from_data makes it.
        dtype = host.dtype if host.dtype in (torch.bool, torch.uint8) else torch.long
        return tensor(host.to(dtype), device=device)

    def on_device(self, index):
        if not isinstance(self, fake_type) or self.device.type != "cuda":
            return index
        if isinstance(index, list) and len(index) < 32 and any(
                isinstance(v, (torch.Tensor, list, tuple, range, slice)) or v is None or v is Ellipsis for v in index):
            index = tuple(index)  # treatSequenceAsTuple: such a list indexes as a tuple does
        if isinstance(index, tuple):
            return tuple(index_tensor(item, self.device) for item in index)
        return index_tensor(index, self.device)

    def getitem(self, index):
        return original_getitem(self, on_device(self, index))

    def setitem(self, index, value):
        return original_setitem(self, on_device(self, index), value)

    patches.set(torch.Tensor, "__getitem__", getitem)
    patches.set(torch.Tensor, "__setitem__", setitem)


def _rnns_without_cudnn(torch, patches, recorder):
    """nn.RNN/LSTM/GRU on fake CUDA run PyTorch's non-cuDNN kernels (cuDNN's RNN needs the
    driver), as under ``torch.backends.cudnn.enabled = False``, said once: their allocations are
    those kernels' (per-layer gate buffers), not cuDNN's workspace and reserve. Convolutions
    keep cuDNN's path."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    # The flag is the process's: RNNs running at once (on threads) turn it off once, and the
    # last to finish restores what it was.
    lock, running, before = threading.Lock(), [0], [True]

    for cls in (torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU):

        def forward(self, *args, _original=cls.forward, **kwargs):
            weight = next(iter(self._flat_weights), None) if getattr(self, "_flat_weights", None) else None
            if not isinstance(weight, fake_type) or weight.device.type != "cuda":
                return _original(self, *args, **kwargs)
            recorder.say_once("RNNs", "run PyTorch's non-cuDNN kernels on fake CUDA (cuDNN's RNN needs the driver): their buffers are those kernels'",
                              trace_note="PyTorch's non-cuDNN kernels (cuDNN's RNN needs the driver)")
            with lock:
                if not running[0]:
                    before[0] = torch.backends.cudnn.enabled
                    torch.backends.cudnn.enabled = False
                running[0] += 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                with lock:
                    running[0] -= 1
                    if not running[0]:
                        torch.backends.cudnn.enabled = before[0]

        patches.set(cls, "forward", forward)


def _padding_kept(torch, patches, recorder):
    """nn.TransformerEncoder in inference with a src_key_padding_mask drops the padded tokens on
    a GPU (its fast path packs the rest into a nested tensor, whose size depends on the mask's
    values); the capture runs the unfused path (fast path off), which keeps them: said once, as
    the trace's activations are then an upper bound."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original = torch.nn.TransformerEncoder.forward

    def forward(self, src, *args, **kwargs):
        padding_mask = kwargs.get("src_key_padding_mask", args[1] if len(args) > 1 else None)
        if (padding_mask is not None and not self.training and not torch.is_grad_enabled() and getattr(self, "use_nested_tensor", False)
                and isinstance(src, fake_type) and src.device.type == "cuda"):
            recorder.say_once("nn.TransformerEncoder", "keeps padded tokens on fake CUDA: with a src_key_padding_mask in inference a GPU run "
                              "drops them (nested tensors sized by the mask's values), so the trace's activations are an upper bound",
                              "padded tokens kept (a GPU's inference fast path drops them)")
        return original(self, src, *args, **kwargs)

    functools.update_wrapper(forward, original)
    patches.set(torch.nn.TransformerEncoder, "forward", forward)


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


def _no_device_init(fake_mode_type):
    """FakeTensorMode that never runs a device copy for real: it asks torch.cuda.is_available(),
    which the fake CUDA API answers True."""

    class NoDeviceInit(fake_mode_type):
        @property
        def avoid_device_init(self):
            return True

    return NoDeviceInit


def _sdp_backend(torch, q, k, v, attn_mask, enable_gqa, is_causal):
    """The backend PyTorch's SDPA picks on an H100 (sm90) for these inputs, in its priority order
    flash, memory-efficient, math (select_sdp_backend, aten/src/ATen/native/transformers/cuda/
    sdp_utils.cpp; the main checks only): on fake CUDA tensors the real selection asks the driver
    for the GPU's capability and falls back to math, which materialises B·H·S² scores."""
    cuda_backends = torch.backends.cuda
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not (q.dtype == k.dtype == v.dtype):
        return "math"
    d, heads_q, heads_k = q.shape[-1], q.shape[1], k.shape[1]
    same_heads = heads_q == heads_k and k.shape[1] == v.shape[1]
    half = q.dtype in (torch.float16, torch.bfloat16)
    # check_flash_causal_non_square_seqlens: FlashAttention-2's causal mask is aligned to the lower
    # right, so a causal call whose query and key lengths differ is refused.
    causal_non_square = is_causal and q.shape[-2] != k.shape[-2]
    if (cuda_backends.flash_sdp_enabled() and half and attn_mask is None and d <= 256 and d % 8 == 0 and not causal_non_square
            and k.shape[-1] == d and v.shape[-1] == d and (same_heads or (enable_gqa and heads_q % heads_k == 0))):
        return "flash"
    if (cuda_backends.mem_efficient_sdp_enabled() and same_heads and (half or q.dtype == torch.float32)
            and d % (8 if half else 4) == 0 and k.shape[-1] == d):
        return "efficient"
    return "math"


def _mem_efficient_mask(torch, mask, query, key):
    """The mask scaled_dot_product_attention hands the memory-efficient kernel (aten/src/ATen/
    native/transformers/attention.cpp): convert_boolean_attn_mask turns a boolean mask into an
    additive one of the query's dtype (where(mask, 0, -inf), -inf a scalar tensor on the device),
    and preprocess_mask pads one that is not aligned_tensor<8> (strides but the last a multiple of
    8, the last 1) to a multiple of 8 columns (pad_bias: padded, then sliced back), then expands
    it to (B, H, L, S)."""
    if mask.dtype == torch.bool:
        neg_inf = torch.scalar_tensor(float("-inf"), dtype=query.dtype, device=mask.device)
        mask = torch.where(mask, 0.0, neg_inf)
        del neg_inf
    if not (all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1):
        columns = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, 8 - columns % 8))[..., :columns]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _ctc_loss_with_host_lengths(torch, original):
    """torch.ctc_loss of fake CUDA log-probs with lengths in CPU tensors: ctc_loss (LossCTC.cpp) copies
    them to lists and runs the IntArrayRef overload, but takes the Tensor one for a tensor subclass,
    which a fake tensor is (and whose 'mean' would divide by the CPU lengths): lists here too."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor

    def ctc_loss(log_probs, targets, input_lengths, target_lengths, *args, **kwargs):
        lengths = (input_lengths, target_lengths)
        if isinstance(log_probs, fake_type) and all(isinstance(t, torch.Tensor) and not isinstance(t, fake_type) and t.device.type == "cpu" for t in lengths):
            input_lengths, target_lengths = (t.tolist() for t in lengths)
        return original(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)

    functools.update_wrapper(ctc_loss, original)
    return ctc_loss


def _fake_cuda_sdpa(torch, original):
    """scaled_dot_product_attention that dispatches to the fused kernel a GPU would run."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention.default
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention.default

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if query.device.type != "cuda":
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if torch.is_autocast_enabled("cuda"):
            # SDPA is on CUDA autocast's lower-precision list: floating inputs are cast first.
            low = torch.get_autocast_dtype("cuda")
            query, key, value = (t.to(low) if t.is_floating_point() and t.dtype != low else t for t in (query, key, value))
            if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != low:
                attn_mask = attn_mask.to(low)
        backend = _sdp_backend(torch, query, key, value, attn_mask, enable_gqa, is_causal)
        if backend == "flash":
            return flash(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if backend == "efficient":
            need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            if attn_mask is not None:
                attn_mask = _mem_efficient_mask(torch, attn_mask, query, key)
            return efficient(query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    return sdpa


class _FakeStreams:
    """The streams of the fake device: the default stream (id 0) and each ``torch.cuda.Stream()``
    the script makes (ids 1, 2, ... in order). No work is ever queued; what a replay needs is which
    stream each allocation is made on (the thread's current stream: CUDACachingAllocator's malloc
    takes getCurrentCUDAStream()), which other streams use a block (record_stream) and when the
    script learns a stream's work is done (synchronize, or a query that answers True)."""

    def __init__(self, sink):
        self.sink = sink
        self.count = 0
        self.capturing = {}  # stream id -> the CUDA graph capturing on it (Note [Private pools])
        self.local = threading.local()  # the current stream is per thread, as in PyTorch
        streams = self

        class Stream(_FakeStream):
            def __init__(self, device=None, priority=0, **kwargs):
                self.stream_id = self.cuda_stream = streams.count
                streams.count += 1
                self.priority = priority
                self.streams = streams
                self.entered = []

        class Event(_FakeEvent):
            def record(self, stream=None):
                self.stream = stream if stream is not None else streams.current()

        self.Stream, self.Event = Stream, Event
        self.default = Stream()

    def current(self):
        return getattr(self.local, "stream", self.default)

    def join_capture(self, stream, waited_on):
        """``stream`` waits on ``waited_on``: if that one is being captured and this one is not,
        it joins the capture (a `pool_join` row) until the graph's capture_end."""
        graph = self.capturing.get(getattr(waited_on, "stream_id", None))
        if graph is None or stream.stream_id in self.capturing or stream.stream_id == 0:
            return
        self.capturing[stream.stream_id] = graph
        graph._joined.append(stream.stream_id)
        self.sink.pool_join(graph._capture[0], stream.stream_id)

    def exchange(self, stream):
        """Makes ``stream`` current (None: no change, as torch.cuda.stream(None)); returns the previous one."""
        previous = self.current()
        if stream is not None:
            self.local.stream = stream
        return previous

    def set_current(self, stream):
        """``torch.cuda.set_stream(s)``."""
        self.exchange(stream)

    def context(self, stream=None):
        """``torch.cuda.stream(s)``: ``s`` is current inside the block."""

        @contextlib.contextmanager
        def current_inside():
            previous = self.exchange(stream)
            try:
                yield stream
            finally:
                self.exchange(previous)

        return current_inside()


class _FakeStream:
    """A stream of the fake device (made by ``_FakeStreams``): work is never queued, so it is
    always complete; saying so (synchronize, query) lets the blocks it used be reused."""

    cuda_stream = 0
    stream_id = 0
    priority = 0
    # torch.Stream's attributes (FSDP2 reads them off its streams).
    device_index = 0
    device_type = 1  # DeviceType::CUDA, as torch.cuda.Stream answers

    @property
    def device(self):
        import torch

        return torch.device("cuda", 0)

    @staticmethod
    def priority_range():
        """(least, greatest) stream priority, as an H100's driver answers it."""
        return (0, -5)

    def is_capturing(self):
        return self.stream_id in self.streams.capturing

    def query(self):
        self.streams.sink.sync(self.stream_id)
        return True

    def synchronize(self):
        self.streams.sink.sync(self.stream_id)

    def wait_stream(self, other):
        # A device-side wait completes nothing on the host; on a capturing stream's work it joins
        # this stream to the capture (CUDA's fork), whose pool its allocations then go to.
        self.streams.join_capture(self, other)

    def wait_event(self, event):
        if event.stream is not None:
            self.streams.join_capture(self, event.stream)

    def record_event(self, event=None):
        event = event if event is not None else self.streams.Event()
        event.record(self)
        return event

    def __enter__(self):
        # `with stream:` makes it current, as torch.Stream's context manager does.
        self.entered.append(self.streams.exchange(self))
        return self

    def __exit__(self, *exc):
        self.streams.exchange(self.entered.pop())
        return False


class _FakeEvent:
    """A CUDA event on the fake device: recorded work is always complete, and takes no time."""

    stream = None

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        self.stream = stream

    def wait(self, stream=None):
        pass

    def query(self):
        self.synchronize()
        return True

    def synchronize(self):
        # The work recorded before the event is done: its stream's, in this model.
        if self.stream is not None:
            self.stream.synchronize()

    def elapsed_time(self, end_event):
        # No kernel runs: a script that divides by the time must not stop on a zero.
        if _active is not None:
            _active.say_once("torch.cuda.Event.elapsed_time", f"is not measured on fake CUDA: it answers {FAKE_ELAPSED_MS} ms")
        return FAKE_ELAPSED_MS


# What torch.cuda.Event.elapsed_time answers on the fake device (milliseconds; nothing runs).
FAKE_ELAPSED_MS = 1.0

# What the fake device reports: an H100 SXM 80 GB, the card the replay defaults to.
FAKE_DEVICE_NAME = "NVIDIA H100 80GB HBM3 (allocbench fake CUDA)"
FAKE_TOTAL_MEMORY = 81559 * 1024 * 1024
FAKE_DEVICE_UUID = "00000000-0000-0000-0000-000000000000"


class _FakeDeviceProperties(types.SimpleNamespace):
    """torch.cuda.get_device_properties() of the fake card: _CudaDeviceProperties' fields and repr."""

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory >> 20}MB, multi_processor_count={self.multi_processor_count}, "
                f"uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id}, L2_cache_size={self.L2_cache_size >> 20}MB)")


def _fake_cuda_generators_graphs_and_raw_blocks(torch, patches, recorder, streams):
    """torch.Generator(device="cuda"), CUDA graphs and caching_allocator_alloc on fake CUDA."""
    cuda = torch.cuda
    real_generator = torch.Generator

    class Generator(real_generator):
        """A CUDA generator draws on the CPU (fake CUDA ops take one); it still says it is CUDA's,
        and its state is CUDA's: the Philox seed and offset, 16 bytes (CUDAGeneratorImpl::get_state
        in aten/src/ATen/cuda/CUDAGeneratorImpl.cpp), not the CPU's Mersenne Twister (5,056).
        The offset moves only when set: no kernel draws on fake CUDA."""

        def __new__(cls, device="cpu"):
            generator = super().__new__(cls, "cpu")
            generator.wanted = torch.device(device)
            if generator.wanted.type == "cuda" and generator.wanted.index is None:
                generator.wanted = torch.device("cuda", 0)
            generator.philox = [_DEFAULT_RNG_SEED, 0]  # (seed, offset), as a new CUDAGeneratorImpl
            return generator

        def __init__(self, device="cpu"):
            pass

        @property
        def device(self):
            return self.wanted

        def _cuda(self):
            return self.wanted.type == "cuda"

        def get_state(self):
            if not self._cuda():
                return super().get_state()
            seed, offset = self.philox
            return torch.frombuffer(bytearray(seed.to_bytes(8, "little") + offset.to_bytes(8, "little", signed=True)), dtype=torch.uint8)

        def set_state(self, new_state):
            if not self._cuda():
                return super().set_state(new_state)
            if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.device.type != "cpu":
                raise TypeError("RNG state must be a torch.ByteTensor")
            data = bytes(new_state.contiguous().tolist())
            if len(data) not in (8, 16):  # (8: a seed alone, offset 0)
                raise RuntimeError("RNG state is wrong size")
            offset = int.from_bytes(data[8:] or bytes(8), "little", signed=True)
            if offset % 4:
                raise RuntimeError("offset must be a multiple of 4")
            self.philox = [int.from_bytes(data[:8], "little"), offset]
            return self

        def manual_seed(self, seed):
            super().manual_seed(seed)
            if self._cuda():
                self.philox = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0]
            return self

        def seed(self):
            seed = super().seed()
            if self._cuda():
                self.philox = [seed, 0]
            return seed

        def initial_seed(self):
            return self.philox[0] if self._cuda() else super().initial_seed()

        def get_offset(self):
            return self.philox[1] if self._cuda() else super().get_offset()

        def set_offset(self, offset):
            if not self._cuda():
                return super().set_offset(offset)
            self.philox[1] = int(offset)
            return self

    patches.set(torch, "Generator", Generator)
    # torch.cuda's default generator (one device), its module functions going through it as
    # torch/cuda/random.py's do; torch.manual_seed and torch.seed reach it by manual_seed_all.
    default = Generator("cuda")
    # (seeded at random, as getDefaultCUDAGenerator seeds it: the CPU's seed, which is so too)
    default.manual_seed(torch.initial_seed())
    patches.set(cuda, "default_generators", (default,))

    def default_of(device="cuda"):
        index = torch.cuda._utils._get_device_index(device, optional=True) if not isinstance(device, int) else device
        if index not in (0, -1):
            raise NeedsDriver(_NO_SUCH_DEVICE.format(device=f"cuda:{index}"), fix=_NO_SUCH_DEVICE_FIX)
        return default

    def set_states(states):
        for state in states[:1]:
            default.set_state(state)

    def set_rng_state(new_state, device="cuda"):
        default_of(device).set_state(new_state)

    def reseed(seed=None):
        # (torch.cuda's seeding functions answer None)
        if seed is None:
            default.seed()
        else:
            default.manual_seed(int(seed))

    rng = dict(
        get_rng_state=lambda device="cuda": default_of(device).get_state(),
        set_rng_state=set_rng_state,
        get_rng_state_all=lambda: [default.get_state()],
        set_rng_state_all=set_states,
        manual_seed=reseed,
        manual_seed_all=reseed,
        seed=lambda: reseed(),
        seed_all=lambda: reseed(),
        initial_seed=lambda: default.initial_seed(),
    )
    for module in (cuda, cuda.random):
        for name, fn in rng.items():
            if hasattr(module, name):
                patches.set(module, name, fn)

    # Note [Private pools]: a CUDA graph capture runs the captured region eagerly once (replay()
    # runs nothing) with its allocations routed to the graph's private pool, as
    # CUDACachingAllocator's beginAllocateToPool does: `pool_begin,P,,STREAM` at capture_begin,
    # `pool_end,P,,` at capture_end and `pool_release,P,,` when the graph is reset or destroyed
    # (releasePool). A MemPool is a pool of its own: made with one use (begin and end with nothing
    # between), `use_mem_pool` routes every stream of the thread to it, and deleting it releases
    # that use and empties the pool's cache (`empty_cache,P,,`). Pool handles ((0, n) from graph_pool_handle or a MemPool, (n, 0) a graph's own)
    # name trace pool n. torch.cuda.make_graphed_callables runs unpatched on these: its warmup
    # iterations eagerly on its side stream, its forward and backward graphs captured into one
    # shared pool, and each later call only copies inputs and replays (no allocation of its own).
    pool_numbers = itertools.count(1)

    def trace_pool(handle):
        """The trace pool of a pool handle (a tuple, or a MemPool), made on first sight."""
        handle = tuple(getattr(handle, "id", handle))
        number = handle[0] or handle[1]
        if not number:
            raise RuntimeError(f"{handle} is the default pool, not a private one")
        return number

    def graph_pool_handle():
        return (0, next(pool_numbers))

    def capture_stream_check(stream):
        if stream.stream_id == 0:
            # CUDAGraph::capture_begin.
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok to replay them on the default stream.)")

    class CUDAGraph:
        """A CUDA graph on fake CUDA: the captured region runs eagerly once into the graph's
        private pool; replay() runs nothing."""

        def __init__(self, keep_graph=False):
            self._handle = None
            self._capture = None  # (trace pool, stream) while capturing
            self._held = []  # trace pools this graph holds until reset (releasePool)
            self._stream = None  # the capture stream, once captured
            self._joined = []  # streams that joined the capture (waited on its stream)

        def capture_begin(self, pool=None, capture_error_mode="global", check_input_liveness=False):
            if self._capture is not None:
                raise RuntimeError("capture_begin: this graph is already capturing")
            stream = streams.current()
            capture_stream_check(stream)
            handle = tuple(getattr(pool, "id", pool)) if pool is not None else (0, 0)
            if handle == (0, 0):
                handle = (next(pool_numbers), 0)
            number = trace_pool(handle)
            if not recorder.closed:
                recorder.sink.pool_begin(number, stream.stream_id)
            streams.capturing[stream.stream_id] = self
            self._handle, self._capture, self._stream = handle, (number, stream), stream
            self._held.append(number)

        def capture_end(self):
            if self._capture is None:
                raise RuntimeError("capture_end: this graph is not capturing")
            number, stream = self._capture
            if not recorder.closed:
                recorder.sink.pool_end(number)
            streams.capturing.pop(stream.stream_id, None)
            for joined in self._joined:
                streams.capturing.pop(joined, None)
            self._joined = []
            self._capture = None

        capture_end_pre = capture_end

        def capture_end_post(self):
            pass

        def instantiate(self):
            pass

        def replay(self):
            pass

        def reset(self):
            # CUDAGraph::reset: a capture left open is ended first (endAllocateToPool), the capture
            # stream's cuBLAS workspace is freed (it would pin the pool), then the pools released.
            if self._capture is not None:
                self.capture_end()
            if self._stream is not None:
                recorder.clear_cublas_workspace(self._stream.stream_id)
                self._stream = None
            held, self._held = self._held, []
            for number in held:
                if not recorder.closed:
                    recorder.sink.pool_release(number)

        def __del__(self):
            try:
                self.reset()
            except Exception:
                pass  # interpreter shutdown: the trace is closed

        def pool(self):
            if self._handle is None:
                raise RuntimeError("pool(): the graph has not been captured")
            return self._handle

        def pools(self):
            return [self._handle] if self._handle is not None else []

        def enable_debug_mode(self):
            pass

        def debug_dump(self, path, *args, **kwargs):
            pass

        def register_capture_start_hook(self, *args, **kwargs):
            pass

        register_capture_end_hook = register_post_instantiate_hook = register_capture_start_hook
        register_replay_start_hook = register_replay_end_hook = register_destroy_callback = register_capture_start_hook

    class graph:
        """torch.cuda.graph: synchronize, empty the cache, then capture on the capture stream (by
        default one side stream shared by every graph), as torch.cuda.graphs.graph.__enter__ does."""

        default_capture_stream = None

        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
            if stream is None and self.__class__.default_capture_stream is None:
                self.__class__.default_capture_stream = streams.Stream()
            self.pool = () if pool is None else (pool,)
            self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
            self.cuda_graph = cuda_graph
            self.capture_error_mode = capture_error_mode

        def __enter__(self):
            torch.cuda.synchronize()
            if getattr(torch.compiler.config, "force_cudagraph_gc", False):
                gc.collect()
            torch.cuda.empty_cache()
            self.previous = streams.exchange(self.capture_stream)
            try:
                self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
            except BaseException:
                streams.exchange(self.previous)
                raise

        def __exit__(self, *exc):
            try:
                self.cuda_graph.capture_end()
            finally:
                streams.exchange(self.previous)
            return False

    class MemPool:
        """torch.cuda.MemPool: a private pool made with one use (createOrIncrefPool), which its
        deletion releases."""

        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            self._id = graph_pool_handle()
            self.allocator = allocator
            self._uses = 1
            if not recorder.closed:
                recorder.sink.pool_begin(self._id[1], None)
                recorder.sink.pool_end(self._id[1])

        @property
        def id(self):
            return self._id

        def use_count(self):
            return self._uses

        def snapshot(self, include_traces=True):
            return []

        def __del__(self):
            # ~MemPool: releasePool, then emptyCache(id) gives its free segments back at once.
            try:
                if not recorder.closed:
                    recorder.sink.pool_release(self._id[1])
                    recorder.sink.empty_pool_cache(self._id[1])
            except Exception:
                pass

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        """The thread's allocations (every stream) go to ``pool``: a begin, an end and a release.
        Inside a capture the graph also keeps the pool until its reset (graph._retain_pool): one
        more use, taken as the routing ends (a pool cannot be begun while it is routed to)."""
        number = trace_pool(pool)
        graph = streams.capturing.get(streams.current().stream_id)
        if not recorder.closed:
            recorder.sink.pool_begin(number, None)
        pool._uses += 1
        try:
            yield
        finally:
            pool._uses -= 1
            if not recorder.closed:
                recorder.sink.pool_end(number)
                if graph is not None:
                    recorder.sink.pool_begin(number, None)
                    recorder.sink.pool_end(number)
                    graph._held.append(number)
                recorder.sink.pool_release(number)

    # caching_allocator_alloc/delete: a raw block of the caching allocator, a row each; the pointer
    # handed back is a made-up address that names the row's id.
    raw_blocks = {}

    def caching_allocator_alloc(size, device=None, stream=None):
        trace_id = recorder._new_id()
        stream_id = stream.stream_id if isinstance(stream, _FakeStream) else streams.current().stream_id
        if size:
            recorder.record_alloc(trace_id, size, stream_id)
        pointer = (1 << 47) + (trace_id << 9)
        raw_blocks[pointer] = (trace_id, size)
        return pointer

    def caching_allocator_delete(pointer):
        block = raw_blocks.pop(pointer, None)
        if block is None:
            if pointer:
                raise RuntimeError(f"caching_allocator_delete: {pointer:#x} is not a block caching_allocator_alloc returned")
            return
        if block[1]:
            recorder.sink.free(*block)

    for name, fn in dict(
        CUDAGraph=CUDAGraph, graph=graph, graph_pool_handle=graph_pool_handle,
        MemPool=MemPool, use_mem_pool=use_mem_pool,
        caching_allocator_alloc=caching_allocator_alloc, caching_allocator_delete=caching_allocator_delete,
    ).items():
        for module in (cuda, cuda.memory, getattr(cuda, "graphs", None)):
            if module is not None and hasattr(module, name):
                patches.set(module, name, fn)


def _fake_cuda_legacy_types(torch, patches):
    """torch.cuda.FloatTensor and its kin, the legacy typed constructors older scripts still use
    (``Tensor = torch.cuda.FloatTensor``; ``LongTensor(labels)``; ``x.type(Tensor)``): given data,
    or as the target of ``Tensor.type``, they copy to the device inside C++, below the dispatcher,
    and would reach the driver. Each type is replaced by a stand-in that makes the one CUDA
    allocation the real constructor makes, and is still what ``isinstance`` and ``Tensor.type``
    accept."""
    tensortype = type(torch.FloatTensor)
    cuda = torch.cuda
    sizes_only = lambda args: (len(args) == 1 and isinstance(args[0], torch.Size)) or (
        bool(args) and all(isinstance(a, int) and not isinstance(a, bool) for a in args))

    class LegacyCudaType(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, cls.original)

        def __call__(cls, *args, **kwargs):
            device = kwargs.get("device")
            if set(kwargs) - {"device"} or (device is not None and torch.device(device).type != "cuda") or any(
                    isinstance(a, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)) for a in args):
                # An alias of a tensor or storage (no copy), or a call the original refuses.
                return cls.original(*args, **kwargs)
            if sizes_only(args):
                return torch.empty(*args, dtype=cls.dtype, device="cuda")
            # Data (a sequence, an array, nothing): made on the CPU by the CPU type of the same
            # name, then copied into one fake CUDA tensor, as _constructor_via_cpu does.
            host = cls.host(*args)
            return torch.empty(host.shape, dtype=cls.dtype, device="cuda").copy_(host)

    stand_ins = {}
    for name in dir(cuda):
        original = getattr(cuda, name)
        if name.endswith("Tensor") and isinstance(original, tensortype) and hasattr(torch, name):
            stand_in = LegacyCudaType(name, (), {
                "original": original, "host": getattr(torch, name), "dtype": original.dtype,
                "is_cuda": True, "is_sparse": False, "layout": original.layout, "__module__": "torch.cuda",
            })
            stand_ins[f"torch.cuda.{name}"] = stand_in
            patches.set(cuda, name, stand_in)
    if not stand_ins:
        return

    def cuda_type_of(target):
        """The stand-in a Tensor.type target names, or None for any other target."""
        if isinstance(target, str):
            return stand_ins.get(target)
        if isinstance(target, LegacyCudaType):
            return target
        if isinstance(target, tensortype) and target.is_cuda and not target.is_sparse:
            return stand_ins.get(f"torch.cuda.{target.__name__}")
        return None

    original_type = torch.Tensor.type

    def tensor_type(self, dtype=None, non_blocking=False, **kwargs):
        target = cuda_type_of(dtype)
        if target is None:
            return original_type(self, dtype, non_blocking, **kwargs)
        # "If this is already of the correct type, no copy is performed."
        if self.is_cuda and self.dtype == target.dtype and self.layout == torch.strided:
            return self
        return self.to(device="cuda", dtype=target.dtype, non_blocking=non_blocking)

    patches.set(torch.Tensor, "type", tensor_type)
    original_set_default = torch.set_default_tensor_type

    def set_default_tensor_type(t):
        target = cuda_type_of(t)
        return original_set_default(target.original if target is not None else t)

    patches.set(torch, "set_default_tensor_type", set_default_tensor_type)
    original_new = torch.Tensor.new

    def new(self, *args, **kwargs):
        # x.new(data) of a CUDA x: the legacy constructor again (sizes and aliases dispatch).
        if (args and not kwargs and self.is_cuda and not sizes_only(args)
                and not any(isinstance(a, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)) for a in args)):
            host = original_new(torch.empty(0, dtype=self.dtype, device="cpu"), *args)
            return torch.empty(host.shape, dtype=self.dtype, device="cuda").copy_(host)
        return original_new(self, *args, **kwargs)

    patches.set(torch.Tensor, "new", new)


def _fake_cuda_serialization(torch, patches, recorder):
    """torch.load onto CUDA and torch.save of fake tensors, as fine-tuning and checkpointing
    scripts do. Loading puts each storage bound for CUDA (map_location, or where it was saved) in
    one fake CUDA allocation of its size, as the real load's storage copy does; saving writes
    zeros of each fake tensor's shape and dtype (the values are not there)."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original_load, original_save = torch.load, torch.save

    def on_cuda(where):
        return str(where).startswith("cuda")

    def load(f, map_location=None, *args, **kwargs):
        # Load on the CPU, noting the storages bound for CUDA; then give each of those one fake
        # CUDA allocation (tensors that shared a storage share it still).
        bound = set()

        def restore(storage, location):
            if callable(map_location):
                # map_location=lambda s, loc: s.cuda() (the idiom of torch.load's docs): the
                # storage stays on the CPU, noted as bound for CUDA, instead of reaching the driver.
                def to_cuda(s, device=None, non_blocking=False, **kwargs):
                    bound.add(s._cdata)
                    return s

                cuda_methods = [(cls, cls.cuda) for cls in (torch.UntypedStorage, torch.storage.TypedStorage)]
                for cls, _ in cuda_methods:
                    cls.cuda = to_cuda
                try:
                    return map_location(storage, location)
                finally:
                    for cls, method in cuda_methods:
                        cls.cuda = method
            target = map_location.get(location, location) if isinstance(map_location, dict) else location if map_location is None else map_location
            if on_cuda(target):
                bound.add(storage._cdata)
            return storage

        loaded = original_load(f, restore, *args, **kwargs)
        if not bound:
            return loaded
        moved = {}

        def to_fake_cuda(t):
            if not isinstance(t, torch.Tensor) or isinstance(t, fake_type) or t.untyped_storage()._cdata not in bound:
                return t
            storage = t.untyped_storage()
            base = moved.get(storage._cdata)
            if base is None:
                base = moved[storage._cdata] = torch.empty(storage.nbytes(), dtype=torch.uint8, device="cuda")
            # Views of the one allocation (set_ onto a fake storage would keep it alive for good).
            out = _view_of_buffer(base, t)
            out = torch.nn.Parameter(out, t.requires_grad) if isinstance(t, torch.nn.Parameter) else out
            # A small tensor keeps its values (an optimizer's step count mapped to CUDA, read by
            # the first step): Note [Known values].
            recorder.learn_contents(out, t)
            return out

        if isinstance(loaded, torch.nn.Module):
            return loaded._apply(to_fake_cuda)
        return torch.utils._pytree.tree_map(to_fake_cuda, loaded)

    # torch.save writes zeros in place of each fake storage (views of it stay views), tagged with
    # the device the storage was on, so that loading the file back allocates where a real load
    # would. Fake tensors the pytree does not reach (inside a module, a dataclass) pickle as those
    # zeros too: FakeTensor.__reduce_ex__ and location_tag are replaced for the whole capture and
    # act only inside a save, per thread (saves may overlap on threads).
    saving = threading.local()
    serialization = torch.serialization
    original_tag, original_reduce = serialization.location_tag, fake_type.__reduce_ex__

    def zeros_like_fake(t):
        if not isinstance(t, fake_type):
            return t
        zeros, device_of = saving.current
        key = t.untyped_storage()._cdata
        # Real CPU tensors, made below every mode (the recorder would fake large ones).
        with torch.utils._python_dispatch._disable_current_modes():
            base = zeros.get(key)
            if base is None:
                # A large one is fresh pages from the kernel (glibc mmaps anything past 32 MiB),
                # zeros already: left untouched, the save reads the shared zero page and the
                # capture's RSS does not grow by the size of the model.
                nbytes = t.untyped_storage().nbytes()
                make = torch.empty if nbytes >= 64 << 20 else torch.zeros
                # (On the CPU whatever torch.set_default_device says.)
                base = zeros[key] = make(nbytes, dtype=torch.uint8, device="cpu")
                device_of[base.untyped_storage()._cdata] = str(t.device)
            return _view_of_buffer(base, t)

    def reduce_fake(t, protocol):
        if getattr(saving, "current", None) is None:
            return original_reduce(t, protocol)
        zeros = zeros_like_fake(t)
        if isinstance(t, torch.nn.Parameter) or getattr(t, "_is_param", False):
            # A module's parameter must load back as one (register_parameter checks).
            with torch.utils._python_dispatch._disable_current_modes():
                zeros = torch.nn.Parameter(zeros, requires_grad=t.requires_grad)
        return zeros.__reduce_ex__(protocol)

    def location_tag(storage):
        current = getattr(saving, "current", None)
        tag = current and current[1].get(getattr(storage, "_untyped_storage", storage)._cdata)
        return tag or original_tag(storage)

    started = time.time()
    kept, written = set(), set()
    holds_zeros = set()  # files a save of fake tensors wrote (absolute paths)
    original_replace, original_rename = os.replace, os.rename

    def predates_capture(path):
        return os.path.isfile(path) and os.path.getmtime(path) < started

    def say_kept(path, why):
        if path not in kept:
            kept.add(path)
            print(f"allocbench capture: left {path} as it was: it predates the capture, and {why}", file=sys.stderr)

    def keep_original(src, dst):
        os.remove(src)
        say_kept(dst, "the file moved onto it holds zeros for fake CUDA tensors")

    def moving(original):
        # Saving to a temporary file and renaming it onto the checkpoint (an atomic save) would
        # replace the user's checkpoint with zeros as a save straight onto it would: kept too.
        def move(src, dst, *args, **kwargs):
            if not args and not kwargs and isinstance(src, (str, bytes, os.PathLike)) and isinstance(dst, (str, bytes, os.PathLike)):
                source, target = os.path.abspath(os.fsdecode(os.fspath(src))), os.fsdecode(os.fspath(dst))
                if source in holds_zeros and predates_capture(target):
                    holds_zeros.discard(source)
                    return keep_original(source, target)
            return original(src, dst, *args, **kwargs)

        return move

    def save(obj, f, *args, **kwargs):
        # A file that was there before the capture (the user's checkpoint) is not replaced by
        # one that holds zeros for its fake tensors: the save goes to a file beside it, which
        # replaces it only when no fake storage was written (said once per file). A file object
        # is the script's own to guard.
        path = os.fsdecode(os.fspath(f)) if isinstance(f, (str, bytes, os.PathLike)) else None
        guarded = path is not None and path not in written and predates_capture(path)
        target = f"{path}.allocbench-{os.getpid()}.tmp" if guarded else f
        outer = getattr(saving, "current", None)
        saving.current = ({}, {})
        try:
            result = original_save(torch.utils._pytree.tree_map(zeros_like_fake, obj), target, *args, **kwargs)
            if guarded and saving.current[0]:
                os.remove(target)
                say_kept(path, "a save of fake CUDA tensors holds zeros")
            elif guarded:
                original_replace(target, path)
            elif path is not None and saving.current[0]:
                holds_zeros.add(os.path.abspath(path))
            if path is not None and not (guarded and path in kept):
                written.add(path)
            return result
        except BaseException:
            if guarded and os.path.exists(target):
                os.remove(target)
            raise
        finally:
            saving.current = outer

    patches.set(fake_type, "__reduce_ex__", reduce_fake)
    patches.set(serialization, "location_tag", location_tag)
    patches.set(torch, "load", load)
    patches.set(torch, "save", save)
    patches.set(os, "replace", moving(original_replace))
    patches.set(os, "rename", moving(original_rename))
    # safetensors (transformers' save_pretrained) copies each tensor's bytes from its data
    # pointer: a fake tensor's are zeros of its size.
    try:
        import safetensors.torch as safetensors_torch
    except Exception:  # noqa: BLE001 - not installed, or broken: nothing to patch
        safetensors_torch = None
    original_tobytes = getattr(safetensors_torch, "_tobytes", None)  # safetensors < 0.6
    if original_tobytes is not None:

        def tobytes(tensor, name, *args, **kwargs):
            if isinstance(tensor, fake_type):
                return bytes(tensor.numel() * tensor.element_size())
            return original_tobytes(tensor, name, *args, **kwargs)

        patches.set(safetensors_torch, "_tobytes", tobytes)
    original_to_ndarray = getattr(safetensors_torch, "_to_ndarray", None)  # safetensors ≥ 0.6: (array, tensor)
    if original_to_ndarray is not None:

        def to_ndarray(tensor, *args, **kwargs):
            if isinstance(tensor, fake_type):
                import numpy

                return numpy.zeros(tensor.numel() * tensor.element_size(), dtype=numpy.uint8), tensor
            return original_to_ndarray(tensor, *args, **kwargs)

        patches.set(safetensors_torch, "_to_ndarray", to_ndarray)
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


# Where fake data pointers start (an address a CUDA allocation could have).
FAKE_ADDRESS_BASE = 0x7F0000000000


def _fake_data_pointers(torch, patches, recorder):
    """data_ptr() of recorded fake storages (and their tensors): one address per allocation,
    packed in allocation order, 512-byte aligned as the caching allocator's blocks are."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original_storage_ptr, original_tensor_ptr = torch.UntypedStorage.data_ptr, fake_type.data_ptr
    addresses, top = {}, [FAKE_ADDRESS_BASE]

    def address(storage):
        entry = recorder.storages.get(storage._cdata)
        if entry is None or entry[0] is None:
            return None
        at = addresses.get(entry[0])
        if at is None:
            at = addresses[entry[0]] = top[0]
            top[0] += _round_up(max(entry[1], 1), 512)
        return at

    def storage_data_ptr(self):
        at = address(self) if self.device.type == "meta" else None
        return original_storage_ptr(self) if at is None else at

    def tensor_data_ptr(self):
        at = address(self.untyped_storage())
        return original_tensor_ptr(self) if at is None else at + self.storage_offset() * self.element_size()

    patches.set(torch.UntypedStorage, "data_ptr", storage_data_ptr)
    patches.set(fake_type, "data_ptr", tensor_data_ptr)


def _worker_errors_keep_their_frames(patches):
    """A DataLoader worker process sends its error to the main process as text
    (torch._utils.ExceptionWrapper), which raises it anew at the `for ... in loader` line: the
    worker's frames and what the capture knew of the error ride along, so that a fake-value read in
    a Dataset's __getitem__ is named at its own line (the main process's line given as context)."""
    from torch._utils import ExceptionWrapper

    original_init, original_reraise = ExceptionWrapper.__init__, ExceptionWrapper.reraise

    def init(self, exc_info=None, where="in background"):
        if exc_info is None:
            exc_info = sys.exc_info()
        original_init(self, exc_info, where)
        exc = exc_info[1]
        self.allocbench = dict(origin_frames=_frames(exc_info[2]), origin_where=where,
                               on_cpu=getattr(exc, "on_cpu", False), fix=getattr(exc, "fix", None))

    def reraise(self):
        try:
            original_reraise(self)
        except BaseException as exc:
            for name, value in getattr(self, "allocbench", {}).items():
                try:
                    setattr(exc, name, value)
                except (AttributeError, TypeError):
                    pass
            raise

    patches.set(ExceptionWrapper, "__init__", init)
    patches.set(ExceptionWrapper, "reraise", reraise)


def _recorded_threads(threading_module, patches, recorder):
    """torch's dispatch modes are per thread: a thread the script starts (a prefetch thread,
    generate() under TextIteratorStreamer) runs with the capture's mode pushed, as the main
    thread does, and its ops are recorded one at a time with the main thread's."""
    original = getattr(threading_module.Thread, "_bootstrap_inner", None)
    if original is None:
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    class ThreadMode(TorchDispatchMode):
        """The capture's mode on one thread (a mode keeps per-instance state as it is entered and
        left, so each thread gets its own); a pass-through once the capture has ended."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return recorder.__torch_dispatch__(func, types, args, kwargs)

    def run_recorded(thread):
        try:
            thread.run()
        except (StopCapture, FakeValueNeeded, NeedsDriver) as e:
            # What stops a capture (--steps, a fake value read, the driver) stops it from any
            # thread: the capture's thread raises it at its next op, step or end. If that is the
            # main thread with Python's own Ctrl-C handler, it is also interrupted (a real signal,
            # so that a wait on this thread wakes); a thread dying alone could leave it waiting.
            with recorder.lock:
                if recorder.thread_error is not None or recorder.closed:
                    return
                recorder.thread_error = e
            if recorder.wake_signal is not None:
                signal.pthread_kill(recorder.owner.ident, recorder.wake_signal)
        except BaseException:
            if not recorder.closed:
                raise
            # After the capture ended its patches are gone: what fails then is no script error.

    def bootstrap_inner(self):
        if recorder.closed:
            return original(self)
        run = self.run
        self.run = lambda: run_recorded(types.SimpleNamespace(run=run))
        with ThreadMode():
            return original(self)

    patches.set(threading_module.Thread, "_bootstrap_inner", bootstrap_inner)
    # A thread's uncaught exception is printed as on a GPU: threading's frames, then the script's
    # (not run_recorded's and bootstrap_inner's, nor a fake op's dispatch).
    original_hook = threading_module.excepthook

    def excepthook(args):
        if not recorder.closed and args.exc_traceback is not None:
            tb = _from_the_script(_without_thread_wrappers(args.exc_traceback, threading_module.__file__))
            args = threading_module.ExceptHookArgs((args.exc_type, args.exc_value, tb, args.thread))
        return original_hook(args)

    patches.set(threading_module, "excepthook", excepthook)


def _without_thread_wrappers(tb, threading_file):
    """``tb`` without this module's frames between threading's and the script's first."""
    here, threading_file = os.path.abspath(__file__), os.path.abspath(threading_file)
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept, in_script = [], False
    for entry in entries:
        name = os.path.abspath(entry.tb_frame.f_code.co_filename)
        in_script = in_script or name not in (here, threading_file)
        if in_script or name != here:
            kept.append(entry)
    for entry, following in zip(kept, kept[1:] + [None]):
        entry.tb_next = following
    return kept[0] if kept else None


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
    total_memory = recorder.sink.capacity or FAKE_TOTAL_MEMORY
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
        "mem_get_info": lambda device=None: (total_memory - stats.current(), total_memory),
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
        saved, recorder.scalar_value = recorder.scalar_value, 0
        try:
            return original_trunc_normal(tensor, *args, **kwargs)
        finally:
            recorder.scalar_value = saved

    if original_trunc_normal is not None:
        patches.set(init, "_no_grad_trunc_normal_", trunc_normal)
    _fake_cuda_generators_graphs_and_raw_blocks(torch, patches, recorder, streams)
    _fake_cuda_serialization(torch, patches, recorder)
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
                # --scalar-value answers a read of values (`loss.detach().cpu().numpy()`, logging)
                # as it answers .item(): every element that value.
                recorder.say_once("Tensor.numpy()", f"of unknown values answers {recorder.scalar_value:g} in every element (--scalar-value)")
                with torch.utils._python_dispatch._disable_current_modes():
                    contents = torch.full(tuple(self.shape), recorder.scalar_value, dtype=self.dtype, device="cpu")
            if contents is None:
                raise FakeValueNeeded("Tensor.numpy()", on_cpu=self.device.type == "cpu")
            return original_numpy(contents.clone())
        return original_numpy(self, *args, **kwargs)

    patches.set(torch.Tensor, "numpy", numpy)


# --- the capture ----------------------------------------------------------------------------


@contextlib.contextmanager
def capture(path, fake=None, device="cuda", steps=None, cublas_workspace_mib=None, scalar_value=None, comments=(), sites=True, site_root=None, device_memory=None):
    """Records the allocation trace of the code inside the block into ``path`` (a v1 trace).

    ``fake``: None picks fake tensors when ``device`` is cuda and no GPU is present.
    ``steps``: stop (raise StopCapture) after this many steps. ``scalar_value``: answer reads of
    fake values (``.item()``) with this number instead of raising FakeValueNeeded. ``sites``: record
    each alloc's site (``#site``/``#at`` lines), file names relative to ``site_root`` (default: the
    working directory) when under it. ``device_memory``: the fake card's bytes (default an H100
    80 GB's); live tensors past it raise torch.cuda.OutOfMemoryError.
    """
    global _active
    import torch

    if _active is not None:
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
        "allocbench capture v1: one alloc per new storage, free when it dies, step after optimizer.step()",
        f"torch {torch.__version__}, {'fake' if fake else 'real'} {device} tensors, python {sys.version.split()[0]}",
        workspaces.describe() if workspaces else "cuBLAS workspace: not modelled",
        "not seen: kernel-internal scratch (attention/embedding backward, cub), cuDNN and cuFFT workspaces, NCCL, the CUDA context",
        *comments,
    ]
    on_fake_card = fake and device == "cuda"
    if device_memory is not None and not on_fake_card:
        raise SetupError("--device-memory sizes the fake card: it has no effect with --real or --device cpu")
    if device_memory is not None and device_memory < 1:
        raise SetupError("--device-memory must be at least 1 byte")
    device_memory = device_memory or FAKE_TOTAL_MEMORY
    if on_fake_card:
        header.append(f"fake card memory: {device_memory} bytes (torch.cuda.OutOfMemoryError past it)")
    sink = _TraceSink(path, header)
    if on_fake_card:
        sink.capacity, sink.oom_error = device_memory, torch.cuda.OutOfMemoryError
        # A fraction in the allocator's settings caps the card as set_per_process_memory_fraction does.
        conf = next((os.environ[name] for name in _ALLOC_CONF_VARS if name in os.environ), "")
        value = _conf_fraction(_alloc_conf_items(conf))
        sink.fraction = 1.0 if value is None else value  # (a fraction of 0 is a cap, not unset)
    site_table = _Sites(torch, site_root or os.getcwd()) if sites else None
    recorder = _make_recorder_class(torch)(sink, device, fake, workspaces, scalar_value, site_table)
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
        _active = recorder
        _close_on_hard_exit(recorder, patches, sink)
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
            recorder.closed = True
        _active = None
        stack.close()
        hook.remove()
        if recorder.wake_signal is not None:
            signal.signal(recorder.wake_signal, woke_before)
        patches.undo()
        torch.autograd.set_multithreading_enabled(multithreading)
        with recorder.lock:
            _note_script_conf(sink, recorder.script_conf, conf_before)
            _note_caught_value_reads(recorder, sys.exc_info()[1])
            sink.close(outcome)
        recorder.outcome = outcome


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
          "work that needed the values may be missing from the trace; pass --scalar-value V to answer such reads, guard "
          "them (`if not allocbench_capture.fake():`), or capture with --real on a GPU", file=sys.stderr)


def _user_line(tb):
    """"file:line `code`" of the innermost frame of `tb` in the user's code (not this module, a
    library or Python's own), or None."""
    here, found = os.path.abspath(__file__), None
    for frame, lineno in traceback.walk_tb(tb):
        name = frame.f_code.co_filename
        if name.startswith("<") or os.path.abspath(name) == here or any(m in name for m in ("site-packages", "dist-packages", os.sep + "lib" + os.sep + "python")):
            continue
        found = (name, lineno)
    if found is None:
        return None
    text = linecache.getline(found[0], found[1]).strip()
    return f"{_shown_path(found[0])}:{found[1]}" + (f" `{text}`" if text else "")


# The variables PyTorch reads its allocator settings from, in priority order: torch 2.15 reads
# every key from the first one set (CUDAAllocatorConfig::instance() in c10/cuda/CUDAAllocatorConfig.h).
_ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _conf_fraction(items):
    """per_process_memory_fraction among allocator settings (at most 1), else None (unset or not a number)."""
    value = dict(items).get("per_process_memory_fraction")
    try:
        return None if value is None else min(1.0, float(value))
    except ValueError:
        return None


def _alloc_conf_items(conf):
    """``key:value`` pairs of a PYTORCH_CUDA_ALLOC_CONF string, in order (commas inside the
    brackets of roundup_power2_divisions:[256:1,512:2] do not separate pairs)."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(conf + ","):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            key, _, value = conf[start:i].strip().partition(":")
            if key:
                items.append((key.strip(), value.strip()))
            start = i + 1
    return items


def _note_script_conf(sink, script_conf, conf_before):
    """Allocator settings the script made itself (PYTORCH_CUDA_ALLOC_CONF set in os.environ,
    set_per_process_memory_fraction, _set_allocator_settings) shape what a GPU would do, yet the
    replay takes its settings from --conf: say them in the trace and on the terminal."""
    settings = {}
    read = next((name for name in _ALLOC_CONF_VARS if name in os.environ), None)
    if read is not None and os.environ[read] != conf_before.get(read):
        settings.update(_alloc_conf_items(os.environ[read]))
    settings.update(script_conf)
    if not settings:
        return
    conf = ",".join(f"{k}:{v}" for k, v in settings.items())
    sink.comment(f"allocator settings made by the script: {conf}")
    print(f"allocbench capture: the script set the allocator's settings; replay with --conf '{conf}' to apply them", file=sys.stderr)


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


# The fused optimizers' in-place steps (SGD, Adagrad, and Adam's/AdamW's tensor-lr forms): they
# update their lists in place and make nothing, but some have no Meta kernel to say so.
_FUSED_OPTIMIZER_STEPS = ("_fused_sgd_", "_fused_adagrad_", "_fused_adam_", "_fused_adamw_")


def _missing_meta_kernels(torch, stack):
    """Meta kernels for the CUDA ops scripts reach that have none (a fake run would otherwise call
    their CUDA kernels), for the capture's duration: ops whose outputs are shaped as an operand, as
    their CUDA kernels make them (contiguous; _ctc_loss_backward's gradient is full_like(log_probs,
    -inf, LEGACY_CONTIGUOUS_MEMORY_FORMAT) in LossCTC.cu; the fake-quantize masks are bool), geqrf's
    (a, tau), and the fused optimizer steps, which make nothing."""
    library = torch.library.Library("aten", "IMPL")
    has_meta = lambda name: torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")  # noqa: E731
    like = lambda t, **kwargs: torch.empty_like(t, memory_format=torch.contiguous_format, **kwargs)  # noqa: E731
    with_mask = lambda self, *rest, **kwargs: (like(self), like(self, dtype=torch.bool))  # noqa: E731
    kernels = {
        "_ctc_loss_backward": lambda grad, log_probs, *rest, **kwargs: like(log_probs),
        "_sample_dirichlet": lambda self, *rest, **kwargs: like(self),  # Beta/Dirichlet.rsample
        "_standard_gamma_grad": lambda self, output: like(self),  # Gamma.rsample's backward
        "_dirichlet_grad": lambda x, alpha, total: like(x),
        "multi_margin_loss_backward": lambda grad_output, self, *rest, **kwargs: like(self),
        "multilabel_margin_loss_backward": lambda grad_output, self, *rest, **kwargs: like(self),
        "fractional_max_pool3d_backward": lambda grad_output, self, *rest, **kwargs: like(self),
        "fake_quantize_per_tensor_affine_cachemask": with_mask,
        "fake_quantize_per_channel_affine_cachemask": with_mask,
        "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": with_mask,
        "_fake_quantize_learnable_per_tensor_affine": lambda self, *rest, **kwargs: like(self),
        "_fake_quantize_learnable_per_channel_affine": lambda self, *rest, **kwargs: like(self),
        "_fake_quantize_learnable_per_tensor_affine_backward": lambda grad, self, scale, zero_point, *rest, **kwargs: (
            like(self), like(scale), like(zero_point)),
        "_fake_quantize_learnable_per_channel_affine_backward": lambda grad, self, scale, zero_point, *rest, **kwargs: (
            like(self), like(scale), like(zero_point)),
        "geqrf": lambda self: (like(self), self.new_empty((*self.shape[:-2], min(self.shape[-2:])))),
    }
    for name, kernel in kernels.items():
        if hasattr(torch.ops.aten, name) and not has_meta(f"aten::{name}"):
            library.impl(name, kernel, "Meta")
    for name in _FUSED_OPTIMIZER_STEPS:
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if not has_meta(op.name()):
                library.impl(name if overload == "default" else f"{name}.{overload}", lambda *args, **kwargs: None, "Meta")
    stack.callback(library._destroy)


def _start(torch, recorder, stack, patches, fake, device):
    # Run backward on this thread: the op order is then the device thread's, deterministically.
    torch.autograd.set_multithreading_enabled(False)
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


# --- running a script -----------------------------------------------------------------------


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
    here = os.path.abspath(__file__)
    libraries = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    best = None
    for filename, lineno, _ in frames:
        name = os.path.abspath(filename)
        if name == here or name.startswith(libraries) or filename.startswith("<"):
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
    here = os.path.abspath(__file__)
    torch_private = (os.sep + "torch" + os.sep + "_", os.sep + "torch" + os.sep + "utils" + os.sep + "_")
    innermost = None
    for name, lineno, function in frames:
        if os.path.abspath(name) == here or name.startswith("<") or any(p in name for p in torch_private):
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


def _fake_data_message(exc, script):
    where, text = _where(exc, script)
    code = f" `{text}`" if text else ""
    name = type(exc).__name__
    library = _library_frame(_failing_frames(exc), script)
    inside = f" (the read is in {library})" if library else ""
    inside += _origin(exc, script)
    if isinstance(exc, FakeValueNeeded) and str(exc) == "Tensor.numpy()":
        op = "Tensor.numpy()"
        fix = ("drop or guard the read (`if not allocbench_capture.fake():`), pass --scalar-value V to answer it with V "
               "in every element, or capture with --real on a GPU")
    elif isinstance(exc, FakeValueNeeded) and library:
        op = _value_read(exc)
        fix = ("pass --scalar-value V to answer such reads with V (a library's read steers its control flow: V "
               "decides which branch it takes), or capture with --real on a GPU")
    elif isinstance(exc, FakeValueNeeded):
        op = _value_read(exc)
        fix = ("drop or guard the read (`if not allocbench_capture.fake():`), pass --scalar-value 0 to answer such "
               "reads with 0, or capture with --real on a GPU")
    else:
        op = getattr(exc, "func", None) or str(exc).split("\n")[0][:120]
        fix = "this op's output shape depends on tensor values; capture with --real on a GPU"
    if getattr(exc, "on_cpu", False):
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
    that ran it (this module's main, runpy's) left out, and those of a fake op's dispatch (this
    module's wrappers, FakeTensorMode, meta kernels and decompositions: on a GPU the op fails in
    C++, so the traceback ends at the frame that called it). None when the script has no frame (a
    SyntaxError raised compiling it: its own lines say where)."""
    here = os.path.abspath(__file__)
    running = {here, os.path.abspath(runpy.__file__)}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen ") or os.path.abspath(name) in running):
            break
        tb = tb.tb_next
    torch = sys.modules.get("torch")
    internal = [here]
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


def _write_status(path, **status):
    if not path:
        return
    with open(path, "w") as f:
        json.dump(status, f)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="allocbench_capture.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="the trace to write (v1 CSV)")
    parser.add_argument("--steps", type=int, help="stop after this many steps")
    parser.add_argument("--real", action="store_true", help="record real tensors (needs a GPU for cuda)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="the device whose storages are recorded")
    parser.add_argument("--cublas-workspace-mib", type=int, help="the modelled cuBLAS workspace (default: CUBLAS_WORKSPACE_CONFIG's, 32 MiB when unset; 0: none)")
    parser.add_argument("--scalar-value", type=float, help="answer .item() (and .numpy()) of fake tensors with this value")
    parser.add_argument("--no-sites", action="store_true", help="leave out the allocation sites (#site/#at lines)")
    parser.add_argument("--device-memory", type=int, help="the fake card's memory in bytes (default: an H100 80 GB's)")
    parser.add_argument("--status", help="write the outcome as JSON here (for allocbench capture)")
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
            fake=not opts.real, **status,
        )

    def hard_exit_status(code):
        # The script called os._exit(code): the process ends there, as the script asked.
        exit_code = code & 0xFF  # (as the shell sees it)
        write_status("complete" if exit_code == 0 else "script_error", exit_code,
                     f"the script exited with status {exit_code} (os._exit)" if exit_code else "")

    try:
        with capture(
            opts.output, fake=not opts.real, device=opts.device, steps=opts.steps,
            cublas_workspace_mib=opts.cublas_workspace_mib, scalar_value=opts.scalar_value,
            comments=[f"script: {' '.join([opts.script, *opts.args])}"],
            sites=not opts.no_sites, site_root=os.path.dirname(script), device_memory=opts.device_memory,
        ) as recorder:
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
        if lost is not None and (_is_fake_data_error(lost) or (not opts.real and _is_driver_error(lost))):
            e = lost
        if _is_fake_data_error(e):
            message = _fake_data_message(e, script)
            say(message)
            state = "fake_data"
        elif not opts.real and _is_driver_error(e):
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


if __name__ == "__main__":
    sys.exit(main())
