"""The fake-CUDA shim: a small C++ library, compiled once against the running torch's headers
(cached by torch version, ABI, install folder and the shim's own source) and loaded before a
fake-CUDA capture, that lets autograd run on fake CUDA tensors without a GPU."""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess

from .errors import SetupError

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

