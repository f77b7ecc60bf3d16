// The rest of allocbench's fake CUDA runtime, for `capture --backend driver`: what PyTorch's CUDA
// path calls beyond the caching allocator (src/gpu/oracle/fake_cudart.cpp has the allocator's
// part; both are linked into one libcudart). Kernels are registered and launched without running;
// copies from the device give zeros (the value every read then sees) but for bytes copied there
// since the last kernel (fake_cudart.cpp);
// host memory (pinned, registered) is real host memory; callbacks run at once.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "fake_handles.h"

extern "C" void allocbench_fake_kernel_ran();  // (fake_cudart.cpp: nothing copied before it is kept)
extern "C" void allocbench_fake_unknown_read();  // (fake_cudart.cpp: a read of zeros, counted)
extern "C" void allocbench_fake_set_capture(cudaStream_t s, unsigned long long id);  // (fake_cudart.cpp: streams in a capture)
extern "C" unsigned long long allocbench_fake_end_capture(cudaStream_t s);

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace {
std::mutex host_mu;
std::set<void*>& pinned() {
  static std::set<void*> s;
  return s;
}
void* host_alloc(size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size ? size : 1) != 0) return nullptr;
  std::lock_guard<std::mutex> g(host_mu);
  pinned().insert(p);
  return p;
}
template <typename T>
T next_handle() {
  return next_fake_handle<T, 0x5a0000>();
}
}  // namespace

extern "C" {

cudaError_t allocbench_fake_unsupported(const char* call);  // (fake_cudart.cpp)

// The nvcc-generated registration of every kernel in torch's libraries: a module handle, then
// nothing to do (kernels never run).
void** __cudaRegisterFatBinary(void*) { return next_handle<void**>(); }
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*, dim3*, int*) {}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
unsigned __cudaPushCallConfiguration(dim3, dim3, size_t, void*) { return 0; }
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  if (grid) *grid = dim3(1, 1, 1);
  if (block) *block = dim3(1, 1, 1);
  if (shared) *shared = 0;
  if (stream) *static_cast<cudaStream_t*>(stream) = nullptr;
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t __cudaGetKernel(cudaKernel_t* k, const void*) {
  *k = next_handle<cudaKernel_t>();
  return cudaSuccess;
}
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t cudaLaunchCooperativeKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t cudaGetKernel(cudaKernel_t* k, const void*) {
  *k = next_handle<cudaKernel_t>();
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  fn(data);
  return cudaSuccess;
}
cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void* data, unsigned int) {
  cb(s, cudaSuccess, data);
  return cudaSuccess;
}

// What a kernel's attributes and occupancy queries ask: an sm_90 binary (flash attention's
// backward checks binaryVersion against the device), room for a block per multiprocessor.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) {
  std::memset(a, 0, sizeof(*a));
  a->maxThreadsPerBlock = 1024;
  a->binaryVersion = a->ptxVersion = 90;
  a->maxDynamicSharedSizeBytes = 48 << 10;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t, cudaFuncAttribute, int, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int, size_t) {
  *n = 2;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int, size_t, unsigned int) {
  *n = 2;
  return cudaSuccess;
}
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int) {
  std::strncpy(id, "0000:00:00.0", len);
  return cudaSuccess;
}

// Streams and events beyond the allocator's: the same handles as cudaStreamCreateWithPriority's.
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithPriority(s, 0, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamGetPriority(cudaStream_t, int* p) {
  *p = 0;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int) { return cudaEventRecord(e, s); }
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t*, cudaEvent_t) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t*, cudaIpcEventHandle_t) { return allocbench_fake_unsupported(__func__); }

// Copies and fills: nothing on the device; a copy to the host writes zeros (2-D copies) or what
// fake_cudart.cpp kept of a copy to the device since the last kernel.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void*, size_t, size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t) {
  if (kind == cudaMemcpyDeviceToHost) {
    for (size_t r = 0; r < height; r++) std::memset(static_cast<char*>(dst) + r * dpitch, 0, width);
    allocbench_fake_unknown_read();
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbol(const void*, const void*, size_t, size_t, cudaMemcpyKind) { return cudaSuccess; }
cudaError_t cudaMemset(void*, int, size_t) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t cudaGetSymbolAddress(void** p, const void*) {
  *p = next_handle<void*>();
  return cudaSuccess;
}

// Host memory: real, page-aligned.
cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int) {
  *p = host_alloc(size);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void** p, size_t size) { return cudaHostAlloc(p, size, 0); }
cudaError_t cudaFreeHost(void* p) {
  {
    std::lock_guard<std::mutex> g(host_mu);
    pinned().erase(p);
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void*, size_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }
cudaError_t cudaMallocManaged(void**, size_t, unsigned int) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof(*a));
  bool host;
  {
    std::lock_guard<std::mutex> g(host_mu);
    host = pinned().count(const_cast<void*>(p)) > 0;
  }
  a->type = host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  a->device = 0;
  a->devicePointer = host ? nullptr : const_cast<void*>(p);
  a->hostPointer = host ? const_cast<void*>(p) : nullptr;
  return cudaSuccess;
}

// CUDA graphs (torch.cuda.graphs, reduce-overhead): capture begins and ends; nothing replays.
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t, unsigned long long) {
  *e = next_handle<cudaGraphExec_t>();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long f) { return cudaGraphInstantiate(e, g, f); }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return allocbench_fake_kernel_ran(), cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
// One node: what was captured ran already, but the graph is not empty (torch warns of an empty one).
cudaError_t cudaGraphGetNodes(cudaGraph_t, cudaGraphNode_t* nodes, size_t* n) {
  if (nodes != nullptr && *n > 0) nodes[0] = next_handle<cudaGraphNode_t>();
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaUserObjectCreate(cudaUserObject_t* o, void*, cudaHostFn_t, unsigned int, unsigned int) {
  *o = next_handle<cudaUserObject_t>();
  return cudaSuccess;
}
cudaError_t cudaUserObjectRelease(cudaUserObject_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaGraphRetainUserObject(cudaGraph_t, cudaUserObject_t, unsigned int, unsigned int) { return cudaSuccess; }

// A capture: the stream (and the streams that join it) capturing until it ends; what is
// "captured" ran already (launches do nothing), and the graph is a handle.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  static std::atomic<unsigned long long> next_capture{0};
  if (s == nullptr) return cudaErrorStreamCaptureUnsupported;  // (the legacy default stream)
  cudaStreamCaptureStatus status;
  cudaStreamIsCapturing(s, &status);
  if (status != cudaStreamCaptureStatusNone) return cudaErrorIllegalState;
  allocbench_fake_set_capture(s, ++next_capture);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  unsigned long long id = allocbench_fake_end_capture(s);
  if (id == 0) return cudaErrorIllegalState;
  *graph = reinterpret_cast<cudaGraph_t>(0x6a0000000000ull + id * 0x100);  // (cudaStreamGetCaptureInfo's handle)
  return cudaSuccess;
}
#if CUDART_VERSION >= 13000
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*, const cudaGraphEdgeData*, size_t, cudaStreamCaptureMode) {
  return allocbench_fake_unsupported(__func__);
}
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t, cudaGraphNode_t*, const cudaGraphEdgeData*, size_t, unsigned int) {
  return allocbench_fake_unsupported(__func__);
}
cudaError_t cudaGraphAddNode(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*, const cudaGraphEdgeData*, size_t, cudaGraphNodeParams*) {
  return allocbench_fake_unsupported(__func__);
}
cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle*, cudaGraph_t, unsigned int, unsigned int) { return allocbench_fake_unsupported(__func__); }
#endif

// Libraries loaded at run time (cudaLibrary*: jitted or embedded modules): none load.
cudaError_t cudaLibraryLoadData(cudaLibrary_t*, const void*, cudaJitOption*, void**, unsigned int, cudaLibraryOption*, void**, unsigned int) {
  return allocbench_fake_unsupported(__func__);
}
cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t*, const char*, cudaJitOption*, void**, unsigned int, cudaLibraryOption*, void**, unsigned int) {
  return allocbench_fake_unsupported(__func__);
}
cudaError_t cudaLibraryUnload(cudaLibrary_t) { return cudaSuccess; }
cudaError_t cudaLibraryGetKernel(cudaKernel_t*, cudaLibrary_t, const char*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaLibraryGetKernelCount(unsigned int* n, cudaLibrary_t) {
  *n = 0;
  return cudaSuccess;
}
cudaError_t cudaLibraryGetGlobal(void**, size_t*, cudaLibrary_t, const char*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaLibraryGetManaged(void**, size_t*, cudaLibrary_t, const char*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaLibraryGetUnifiedFunction(void**, cudaLibrary_t, const char*) { return allocbench_fake_unsupported(__func__); }

// Device attributes, from the same card cudaGetDeviceProperties describes; one where a
// attribute has no field here (a zero divides: `maxThreadsPerMultiProcessor` 0 is a SIGFPE).
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *v = 64; break;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 227 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 228 << 10; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMaxRegistersPerBlock: case cudaDevAttrMaxRegistersPerMultiprocessor: *v = p.regsPerBlock; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrClockRate: *v = 1980000; break;
    case cudaDevAttrMemoryClockRate: *v = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *v = 5120; break;
    case cudaDevAttrIntegrated: case cudaDevAttrTccDriver: case cudaDevAttrComputeMode: *v = 0; break;
    default: *v = 1;
  }
  return cudaSuccess;
}

}  // extern "C"
