// allocbench's fake CUDA driver (libcuda.so.1), for `capture --backend driver`: what torch's
// `_cuda_init`, its lazily bound driver calls (ATen/cuda/nvrtc_stub: module loading, launches,
// occupancy) and Triton's launcher resolve by name. One device, one context; modules load
// without code and their functions launch without running. The memory calls go to the fake
// runtime's (the same card, one account): torch asks it for them by entry point.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include "fake_handles.h"

#include <cstdint>
#include <string>
#include <cstring>

// The runtime's account of what device memory holds (fake_cudart.cpp).
extern "C" {
void allocbench_fake_kernel_ran();
void allocbench_fake_copied_to_device(uintptr_t dst, const void* src, size_t n);
void allocbench_fake_read_from_device(void* dst, uintptr_t src, size_t n);
}
#include <mutex>

namespace {
template <typename T>
T next_handle() {
  return next_fake_handle<T, 0x6b0000>();
}
CUcontext the_context() { return reinterpret_cast<CUcontext>(0x6a0000); }

// A memory call of the runtime's driver entry points (fake_cudart.cpp's driver_entry).
template <typename Fn>
Fn runtime_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st;
  cudaGetDriverEntryPointByVersion(name, &fn, 12000, 0, &st);
  return reinterpret_cast<Fn>(fn);
}
}  // namespace

extern "C" {

cudaError_t allocbench_fake_unsupported(const char* call);  // (the fake runtime's)
const char* allocbench_fake_unsupported_text();

CUresult cuInit(unsigned int) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int* v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (ordinal < 0 || ordinal >= n) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* n) { return cudaGetDeviceCount(n) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN; }
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  std::strncpy(name, p.name, len);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(CUuuid* u, CUdevice) {
  std::memset(u, 0, sizeof(*u));
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice) {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  *bytes = p.totalGlobalMem;
  return CUDA_SUCCESS;
}
// The runtime's attribute table (the driver's enum has the same values for the shared ones);
// the memory-management capabilities expandable segments ask for, answered here.
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice d) {
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *v = 1;
      return CUDA_SUCCESS;
    default:
      return cudaDeviceGetAttribute(v, static_cast<cudaDeviceAttr>(attr), d) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice) {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  *major = p.major;
  *minor = p.minor;
  return CUDA_SUCCESS;
}

// One primary context, always current.
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned int* flags, int* active) {
  *flags = 0;
  *active = 1;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = the_context();
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice) { return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = the_context();
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext* c) {
  if (c) *c = the_context();
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  int current = 0;
  cudaGetDevice(&current);
  *d = current;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetLimit(size_t* v, CUlimit) {
  *v = 1024;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetLimit(CUlimit, size_t) { return CUDA_SUCCESS; }
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(s), &status);
  *st = static_cast<CUstreamCaptureStatus>(status);  // (the same values)
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveClusters(int* n, CUfunction, const CUlaunchConfig*) {
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap* m, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const int*, const int*, cuuint32_t,
                                 cuuint32_t, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(m, 0, sizeof(*m));
  return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) { return cudaDeviceSynchronize() == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN; }
CUresult cuStreamGetCtx(CUstream, CUcontext* c) {
  *c = the_context();
  return CUDA_SUCCESS;
}

// Modules (Triton's cubins, NVRTC's jitted kernels) load without code; launches do nothing.
CUresult cuModuleLoadData(CUmodule* m, const void*) {
  *m = next_handle<CUmodule>();
  return CUDA_SUCCESS;
}
CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned int, CUjit_option*, void**) { return cuModuleLoadData(m, image); }
CUresult cuModuleLoad(CUmodule* m, const char*) { return cuModuleLoadData(m, nullptr); }
CUresult cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char*) {
  *f = next_handle<CUfunction>();
  return CUDA_SUCCESS;
}
CUresult cuModuleGetGlobal(CUdeviceptr* p, size_t* bytes, CUmodule, const char*) {
  if (p) *p = reinterpret_cast<CUdeviceptr>(next_handle<void*>());
  if (bytes) *bytes = 8;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**) { return allocbench_fake_kernel_ran(), CUDA_SUCCESS; }
CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void**, void**) { return allocbench_fake_kernel_ran(), CUDA_SUCCESS; }
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**) { return allocbench_fake_kernel_ran(), CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int* v, CUfunction_attribute attr, CUfunction) {
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = 90; break;
    default: *v = 0;
  }
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) { return CUDA_SUCCESS; }
CUresult cuKernelGetAttribute(int* v, CUfunction_attribute attr, CUkernel, CUdevice) { return cuFuncGetAttribute(v, attr, nullptr); }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction, int, size_t) {
  *n = 2;
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, CUfunction, int, size_t, unsigned int) {
  *n = 2;
  return CUDA_SUCCESS;
}
CUresult cuLinkCreate(unsigned int, CUjit_option*, void**, CUlinkState* s) {
  *s = next_handle<CUlinkState>();
  return CUDA_SUCCESS;
}
CUresult cuLinkAddData(CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned int, CUjit_option*, void**) { return CUDA_SUCCESS; }
CUresult cuLinkComplete(CUlinkState, void** cubin, size_t* bytes) {
  static char empty[16];
  *cubin = empty;
  *bytes = sizeof(empty);
  return CUDA_SUCCESS;
}
CUresult cuLinkDestroy(CUlinkState) { return CUDA_SUCCESS; }
CUresult cuTensorMapEncodeTiled(CUtensorMap* m, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(m, 0, sizeof(*m));
  return CUDA_SUCCESS;
}
CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr p) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = p; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = the_context(); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = 0; break;
    default:
      allocbench_fake_unsupported("cuPointerGetAttribute");
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(size_t* free, size_t* total) { return cudaMemGetInfo(free, total) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN; }
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream) { return allocbench_fake_kernel_ran(), CUDA_SUCCESS; }
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream) { return allocbench_fake_kernel_ran(), CUDA_SUCCESS; }
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream) { return allocbench_fake_copied_to_device(dst, src, n), CUDA_SUCCESS; }
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream) {
  allocbench_fake_read_from_device(dst, src, n);
  return CUDA_SUCCESS;
}
CUresult cuStreamWriteValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) { return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult, const char** s) {
  *s = allocbench_fake_unsupported_text();
  return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult, const char** s) {
  *s = "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}
// Everything else by name, as the runtime answers it (the memory calls of expandable segments).
CUresult cuGetProcAddress(const char* name, void** fn, int, cuuint64_t, CUdriverProcAddressQueryResult* st) {
  *fn = runtime_entry<void*>(name);
  if (*fn == nullptr) {
    // This library's own calls (Triton asks for cuOccupancyMaxActiveClusters this way), by their
    // name or its _v2 version.
    static void* self = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (self != nullptr) {
      *fn = dlsym(self, name);
      if (*fn == nullptr) *fn = dlsym(self, (std::string(name) + "_v2").c_str());
    }
  }
  if (st) *st = *fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (*fn == nullptr) allocbench_fake_unsupported(name);
  return *fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  if (base) *base = p;
  if (size) *size = 0;
  return CUDA_SUCCESS;
}

}  // extern "C"
