"""The native half of ``capture --backend driver``, built with g++ at first use and cached: a
fake CUDA runtime (libcudart), driver (libcuda.so.1), cuBLAS and cuBLASLt, and NVML, which let
the user's own torch run its real CUDA path on a machine without a GPU (kernels do nothing), and
the tracker that records PyTorch's own caching allocator (allocation_tracker.cpp).

The libraries take the sonames and symbol versions the torch in use links against (read from
its libraries with ``nm``), so a process started with them preloaded finds them first and never
loads NVIDIA's. Everything is found without importing torch: the preload must be in place before
the interpreter that imports it starts."""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import re
import subprocess

from .errors import SetupError

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver")
# The fake runtime's allocator half and the fake NVML are the oracle's (src/gpu/oracle/): the
# package carries copies when allocbench extracts it, the repository has them there.
_ORACLE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "gpu", "oracle"))
FALLBACK = "--backend fake-tensors"


def _source(name):
    for folder in (_HERE, _ORACLE):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    raise SetupError(f"the driver backend's source {name} is missing from {_HERE}: reinstall allocbench, or use {FALLBACK}")


def _torch_dirs():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("no torch here: the driver backend runs the script on the torch it imports")
    root = list(spec.submodule_search_locations)[0]
    version = ""
    try:
        with open(os.path.join(root, "version.py")) as f:
            version = re.search(r"__version__ = '([^']+)'", f.read()).group(1)
    except (OSError, AttributeError):
        pass
    return root, os.path.join(root, "lib"), os.path.join(root, "include"), version


def _imports(lib_dir):
    """The versioned CUDA symbols torch's libraries import: {library tag: {symbol names}}."""
    try:
        out = subprocess.run(["nm", "-D", "--undefined-only", *sorted(glob.glob(os.path.join(lib_dir, "*.so")))],
                             capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        raise SetupError(f"nm not found: the driver backend reads torch's CUDA imports with it (install binutils), or use {FALLBACK}") from None
    wanted = {}
    for name, tag in re.findall(r"\b((?:cuda|__cuda|cublas|cudnn)\w*)@(lib(?:cudart|cublas|cublasLt|cudnn)\.so\.\d+)", out):
        wanted.setdefault(tag, set()).add(name)
    return wanted


def _cuda_headers(root, major):
    """CUDA headers of the runtime's major version: the triton wheel's (complete), else the
    nvidia runtime wheel's."""
    site = os.path.dirname(root)
    for folder in (os.path.join(site, "triton", "backends", "nvidia", "include"), os.path.join(site, "nvidia", f"cu{major}", "include"),
                   os.path.join(site, "nvidia", "cuda_runtime", "include")):
        header = os.path.join(folder, "cuda_runtime_api.h")
        if os.path.isfile(header) and os.path.isfile(os.path.join(folder, "crt", "host_defines.h")):
            with open(os.path.join(folder, "cuda.h")) as f:
                found = re.search(r"#define CUDA_VERSION (\d+)", f.read())
            if found and int(found.group(1)) // 1000 == int(major):
                return folder
    raise SetupError(f"no CUDA {major} headers beside this torch (the triton wheel brings them): the driver backend builds its fakes "
                     f"against them; use {FALLBACK}")


def _cudnn_headers(root):
    """cuDNN's headers (cudnn.h and the graph API's), from the nvidia-cudnn wheel beside this torch
    or the system's; None when there are none (the capture then runs without cuDNN)."""
    site = os.path.dirname(root)
    for folder in (os.path.join(site, "nvidia", "cudnn", "include"), "/usr/include", "/usr/local/cuda/include"):
        if os.path.isfile(os.path.join(folder, "cudnn.h")) and os.path.isfile(os.path.join(folder, "cudnn_graph.h")):
            return folder
    return None


def _cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "allocbench", "driver")


def _gxx(args, what):
    try:
        done = subprocess.run(["g++", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise SetupError(f"g++ not found: the driver backend builds its fake CUDA libraries with it (install g++), or use {FALLBACK}") from None
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:300])
        raise SetupError(f"g++ could not build the driver backend's {what}: {first.strip()}; use {FALLBACK}")


def build():
    """The built stack: {'preload': [paths], 'lib_dir': folder (libcuda.so.1), 'tracker': path,
    'torch': version, 'cuda': major}. Raises SetupError naming the fallback when it cannot be."""
    root, lib_dir, include, version = _torch_dirs()
    wanted = _imports(lib_dir)
    cudart = next((t for t in wanted if t.startswith("libcudart.so.")), None)
    if cudart is None:
        raise SetupError(f"torch {version or '(unknown version)'} is not a CUDA build (its libraries import no CUDA runtime): "
                         f"the driver backend runs PyTorch's CUDA path; use {FALLBACK}")
    major = cudart.rsplit(".", 1)[1]
    headers = _cuda_headers(root, major)
    sources = ["fake_cudart.cpp", "fake_cudart_kernels.cpp", "fake_libcuda.cpp", "fake_cublas.cpp", "fake_cudnn.cpp", "fake_nvml.cpp",
               "allocation_tracker.cpp", "flop_counter.cpp", "fake_handles.h"]
    paths = {name: _source(name) for name in sources}
    key = hashlib.sha256()
    for name in sources:
        with open(paths[name], "rb") as f:
            key.update(f.read())
    # cuDNN is faked when torch links it and its headers are here; else the capture turns it off.
    cudnn = next((t for t in wanted if t.startswith("libcudnn.so.")), None)
    cudnn_include = _cudnn_headers(root) if cudnn else None
    if cudnn_include is None:
        cudnn = None
    key.update(f"{root}|{version}|{cudnn_include}|{sorted((t, sorted(s)) for t, s in wanted.items())}".encode())
    out = os.path.join(_cache_root(), f"{version.replace('+', '_') or 'torch'}-{key.hexdigest()[:16]}")
    cublas = next((t for t in wanted if t.startswith("libcublas.so.")), f"libcublas.so.{major}")
    cublas_lt = next((t for t in wanted if t.startswith("libcublasLt.so.")), f"libcublasLt.so.{major}")
    libs = [cudart, "libcuda.so.1", cublas, cublas_lt, "libnvidia-ml.so.1", *([cudnn] if cudnn else [])]
    stack = {
        "preload": [os.path.join(out, name) for name in libs if name != "libcuda.so.1"],
        "lib_dir": out,
        "tracker": os.path.join(out, "allocation_tracker.so"),
        "torch": version,
        "cuda": major,
        "cudnn": cudnn is not None,
    }
    if all(os.path.isfile(os.path.join(out, name)) for name in [*libs, "allocation_tracker.so"]):
        return stack
    os.makedirs(out, exist_ok=True)
    work = os.path.join(out, f"build-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    w = lambda name: os.path.join(work, name)  # noqa: E731

    def version_script(name, tag, patterns):
        with open(w(name), "w") as f:
            f.write(f"{tag} {{\n  global: {' '.join(p + ';' for p in patterns)}\n  local: *;\n}};\n")
        return f"-Wl,--version-script={w(name)}"

    common = ["-std=c++20", "-O2", "-shared", "-fPIC", f"-I{headers}"]
    _gxx([*common, f"-Wl,-soname,{cudart}", version_script("cudart.map", cudart, ["cuda*", "__cuda*", "allocbench_fake_*"]),
          paths["fake_cudart.cpp"], paths["fake_cudart_kernels.cpp"], "-o", w(cudart)], "CUDA runtime")
    _gxx([*common, "-Wl,-soname,libcuda.so.1", paths["fake_libcuda.cpp"], "-o", w("libcuda.so.1"), f"-L{work}", f"-l:{cudart}"], "CUDA driver")
    _gxx(["-O2", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", paths["fake_nvml.cpp"], "-o", w("libnvidia-ml.so.1")], "NVML")
    # cuBLAS and cuBLASLt: the calls written out in fake_cublas.cpp, and a stub that succeeds for
    # every other one torch imports.
    for tag, define in ((cublas, None), (cublas_lt, "FAKE_CUBLASLT")):
        lt = define is not None
        names = sorted(n for n in wanted.get(tag, ()) if n.startswith("cublasLt") == lt)
        special = w(f"special-{tag}.o")
        _gxx([*common[:2], "-fPIC", "-c", *([f"-D{define}"] if define else []), paths["fake_cublas.cpp"], "-o", special], tag)
        defined = set(re.findall(r" [TW] (\w+)", subprocess.run(["nm", "--defined-only", special], capture_output=True, text=True).stdout))
        stubs = w(f"stubs-{tag}.cpp")
        with open(stubs, "w") as f:
            f.write('extern "C" {\n' + "".join(f"int {n}() {{ return 0; }}\n" for n in names if n not in defined) + "}\n")
        _gxx([*common, *([f"-D{define}"] if define else []), f"-Wl,-soname,{tag}",
              version_script(f"{tag}.map", tag, ["cublasLt*"] if lt else ["cublas*"]), paths["fake_cublas.cpp"], stubs, "-o", w(tag)], tag)
    if cudnn:
        # cuDNN: the calls written out in fake_cudnn.cpp, and a stub naming itself as not answered
        # (CUDNN_STATUS_NOT_SUPPORTED, 3000 since cuDNN 9) for every other one torch imports.
        special = w("special-cudnn.o")
        _gxx([*common[:2], "-fPIC", "-c", f"-I{cudnn_include}", f"-I{headers}", paths["fake_cudnn.cpp"], "-o", special], cudnn)
        defined = set(re.findall(r" [TW] (\w+)", subprocess.run(["nm", "--defined-only", special], capture_output=True, text=True).stdout))
        stubs = w("stubs-cudnn.cpp")
        with open(stubs, "w") as f:
            f.write('extern "C" {\nint allocbench_fake_cudnn_unsupported(const char*);\n'
                    + "".join(f'int {n}() {{ return allocbench_fake_cudnn_unsupported("{n} (cuDNN)"); }}\n'
                              for n in sorted(wanted[cudnn]) if n not in defined) + "}\n")
        _gxx([*common, f"-I{cudnn_include}", f"-Wl,-soname,{cudnn}", version_script("cudnn.map", cudnn, ["cudnn*"]), paths["fake_cudnn.cpp"], stubs,
              "-o", w(cudnn), f"-L{work}", f"-l:{cudart}"], cudnn)
    # (NDEBUG as torch's own build: its headers' debug-only checks read fields it never sets.)
    _gxx(["-std=c++20", "-O2", "-DNDEBUG", "-shared", "-fPIC", f"-I{include}", f"-I{os.path.join(include, 'torch', 'csrc', 'api', 'include')}", f"-I{headers}",
          paths["allocation_tracker.cpp"], paths["flop_counter.cpp"], "-o", w("allocation_tracker.so"),
          f"-L{lib_dir}", "-ltorch_cpu", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{lib_dir}"], "allocator tracker")
    # Moved in whole, the tracker last: its presence means the stack is complete.
    for name in [*libs, "allocation_tracker.so"]:
        os.replace(w(name), os.path.join(out, name))
    for leftover in glob.glob(os.path.join(work, "*")):
        os.remove(leftover)
    os.rmdir(work)
    return stack
