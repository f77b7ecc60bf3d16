// allocbench's fake CUDA runtime (libcudart.so.12 or .13, after the headers it is built with): the calls libc10_cuda makes, answered
// without a GPU so that PyTorch's own caching allocator runs on a CPU-only machine.
// Memory is never touched: cudaMalloc hands out addresses placed as the simulator's
// SimDevice places them (AddressOrder::Lowest: the lowest free 2 MiB-aligned range of a
// large virtual space, freed ranges coalesced and reused), and accounts capacity on bytes.
// With ALLOCBENCH_FAKE_ADDRESS_ORDER=driver, allocations over 2 MiB are placed as
// AddressOrder::Driver places them (top-down next fit below a cursor, wrapping once).
// The card is a parameter: ALLOCBENCH_FAKE_CAPACITY (bytes), ALLOCBENCH_FAKE_REPORTED_MEMORY,
// ALLOCBENCH_FAKE_NAME,
// ALLOCBENCH_FAKE_COMPUTE_CAPABILITY ("9.0" by default).
// Streams are pointer-like handles; an event completes once its stream is synchronized after
// the record, at a device synchronize, or at cudaEventSynchronize.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

constexpr uint64_t kAlign = 2ull << 20;
constexpr uint64_t kVaBase = 0x7f0000000000ull;

struct Card {
  uint64_t capacity = 81559ull << 20;
  // What the card says it has (cudaGetDeviceProperties, cudaMemGetInfo): its capacity, unless
  // ALLOCBENCH_FAKE_REPORTED_MEMORY names a card the unbounded one answers as (the driver backend).
  uint64_t reported = capacity;
  // Bytes in use on each device (ALLOCBENCH_FAKE_DEVICES of them, 1 by default: the driver
  // backend's several fake GPUs share one address space, each with its own capacity).
  static constexpr int kMaxDevices = 16;
  int devices = 1;
  uint64_t used_on[kMaxDevices] = {};
  std::map<uint64_t, int> device_of;  // a live allocation's device (absent: device 0)
  std::map<uint64_t, uint64_t> free_ranges;  // start -> length
  std::map<uint64_t, uint64_t> live;         // address -> bytes asked
  std::map<uintptr_t, uint64_t> stream_seq;     // records made on a stream
  std::map<uintptr_t, uint64_t> stream_synced;  // records completed on a stream
  std::mutex mu;
  const char* name = "allocbench fake GPU";
  int cc_major = 9, cc_minor = 0;
  bool driver_order = false;
  uint64_t cursor = 0;  // AddressOrder::Driver: large allocations go below it
  uint64_t va_end = 0;

  Card() {
    if (const char* c = std::getenv("ALLOCBENCH_FAKE_CAPACITY")) capacity = std::strtoull(c, nullptr, 10);
    reported = capacity;
    if (const char* r = std::getenv("ALLOCBENCH_FAKE_REPORTED_MEMORY")) reported = std::strtoull(r, nullptr, 10);
    if (const char* n = std::getenv("ALLOCBENCH_FAKE_NAME")) name = n;
    if (const char* cc = std::getenv("ALLOCBENCH_FAKE_COMPUTE_CAPABILITY")) std::sscanf(cc, "%d.%d", &cc_major, &cc_minor);
    // The simulator's span: 64 TiB, or 1024 times the next power of two of the capacity, at
    // most 2^60 bytes.
    uint64_t p = 1;
    while (p < capacity && p < (1ull << 63)) p <<= 1;
    uint64_t span = p >= (1ull << 50) ? (1ull << 60) : p * 1024;
    if (span < (1ull << 46)) span = 1ull << 46;
    free_ranges[kVaBase] = span;
    va_end = cursor = kVaBase + span;
    if (const char* o = std::getenv("ALLOCBENCH_FAKE_ADDRESS_ORDER")) driver_order = std::strcmp(o, "driver") == 0;
    if (const char* n = std::getenv("ALLOCBENCH_FAKE_DEVICES")) devices = std::max(1, std::min(kMaxDevices, std::atoi(n)));
  }

  // The lowest free range that fits (AddressOrder::Lowest, and every VA reservation).
  bool take_lowest(uint64_t len, uint64_t* out) {
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
      if (it->second >= len) {
        uint64_t start = it->first, have = it->second;
        free_ranges.erase(it);
        if (have > len) free_ranges[start + len] = have - len;
        *out = start;
        return true;
      }
    }
    return false;
  }

  // A range given back, coalesced with its free neighbours.
  void give_back(uint64_t start, uint64_t len) {
    auto next = free_ranges.find(start + len);
    if (next != free_ranges.end()) {
      len += next->second;
      free_ranges.erase(next);
    }
    auto prev = free_ranges.lower_bound(start);
    if (prev != free_ranges.begin()) {
      --prev;
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_ranges.erase(prev);
      }
    }
    free_ranges[start] = len;
  }

  // AddressOrder::Driver for an allocation over 2 MiB: the highest fitting range below the
  // cursor, placed at its top; when none is left below, wrap to the top of the space.
  bool take_downward(uint64_t len, uint64_t* out) {
    for (int pass = 0; pass < 2; pass++) {
      auto it = free_ranges.lower_bound(cursor);
      while (it != free_ranges.begin()) {
        --it;
        uint64_t start = it->first, have = it->second;
        uint64_t top = start + have < cursor ? start + have : cursor;
        if (top - start >= len) {
          uint64_t addr = top - len;
          free_ranges.erase(it);
          if (addr > start) free_ranges[start] = addr - start;
          if (start + have > addr + len) free_ranges[addr + len] = start + have - addr - len;
          cursor = addr;
          *out = addr;
          return true;
        }
      }
      cursor = va_end;
    }
    return false;
  }
};

Card& card() {
  static Card c;
  return c;
}

struct FakeEvent {
  uintptr_t stream = 0;
  uint64_t seq = 0;
  bool done = true;
  unsigned long long capture = 0;  // the graph capture its stream was in when recorded
};

thread_local cudaError_t last_error = cudaSuccess;
// The last call this fake does not answer, for the error's text (one line naming the call).
std::mutex unsupported_mu;
std::string unsupported_call;
uintptr_t next_stream = 0x5e0000001000ull;

uint64_t rounded(uint64_t bytes) {
  uint64_t len = (bytes + kAlign - 1) / kAlign * kAlign;
  return len == 0 ? kAlign : len;
}

thread_local int current_device = 0;

// Bytes copied to the device since the last kernel: [address, address + size) -> the bytes.
// Small copies only (control data, not weights); a kernel, a fill or too much forgets them all.
struct DeviceValues {
  std::mutex mu;
  std::map<uintptr_t, std::string> copies;
  size_t bytes = 0;
  static constexpr size_t kMaxCopy = 1 << 20, kMaxBytes = 64 << 20;

  void erase_overlapping(uintptr_t at, size_t n) {
    auto it = copies.upper_bound(at);
    if (it != copies.begin()) --it;
    while (it != copies.end() && it->first < at + n) {
      if (it->first + it->second.size() > at) {
        bytes -= it->second.size();
        it = copies.erase(it);
      } else {
        ++it;
      }
    }
  }
  void put(uintptr_t at, const void* from, size_t n) {
    erase_overlapping(at, n);
    if (n == 0 || n > kMaxCopy || from == nullptr) return;
    if (bytes + n > kMaxBytes) copies.clear(), bytes = 0;
    copies.emplace(at, std::string(static_cast<const char*>(from), n));
    bytes += n;
  }
  // The bytes at [at, at + n) if one copy holds them all.
  const char* get(uintptr_t at, size_t n) {
    auto it = copies.upper_bound(at);
    if (it == copies.begin()) return nullptr;
    --it;
    if (at + n > it->first + it->second.size()) return nullptr;
    return it->second.data() + (at - it->first);
  }
};
DeviceValues& device_values() {
  static DeviceValues* v = new DeviceValues();
  return *v;
}
// Copies to the host of bytes nothing copied to the device (they read zeros): what PyTorch's C++
// code reads on its own (a data-dependent shape: nonzero, a boolean mask), as the reads the
// capture's Python side answers and counts itself say so around them.
std::atomic<uint64_t> unknown_reads{0};
thread_local int reads_counted_elsewhere = 0;
}  // namespace

extern "C" {

void allocbench_fake_unknown_read();
void allocbench_fake_copied_to_device(uintptr_t dst, const void* src, size_t n) {
  DeviceValues& v = device_values();
  std::lock_guard<std::mutex> g(v.mu);
  v.put(dst, src, n);
}
void allocbench_fake_read_from_device(void* dst, uintptr_t src, size_t n) {
  DeviceValues& v = device_values();
  std::lock_guard<std::mutex> g(v.mu);
  const char* held = v.get(src, n);
  if (held != nullptr) return (void)std::memcpy(dst, held, n);
  std::memset(dst, 0, n);
  allocbench_fake_unknown_read();
}
void allocbench_fake_unknown_read() {
  if (reads_counted_elsewhere == 0) unknown_reads++;
}
// The reads of device bytes that read zeros, but for those counted elsewhere.
uint64_t allocbench_fake_unknown_reads() { return unknown_reads.load(); }
// +1 before a read the caller counts itself (the capture's `.cpu()`), -1 after.
void allocbench_fake_reads_counted_elsewhere(int delta) { reads_counted_elsewhere += delta; }
void allocbench_fake_copied_on_device(uintptr_t dst, uintptr_t src, size_t n) {
  DeviceValues& v = device_values();
  std::lock_guard<std::mutex> g(v.mu);
  const char* held = v.get(src, n);
  if (held == nullptr) return v.erase_overlapping(dst, n);
  std::string bytes(held, n);
  v.put(dst, bytes.data(), n);
}
// A kernel or a fill ran: what it wrote is unknown, so nothing copied before it is kept.
void allocbench_fake_kernel_ran() {
  DeviceValues& v = device_values();
  if (v.bytes == 0) return;  // (racy read: a launch with nothing held costs no lock)
  std::lock_guard<std::mutex> g(v.mu);
  v.copies.clear(), v.bytes = 0;
}


// Marks `call` as one this fake cannot answer: the error's text names it and the way out.
cudaError_t allocbench_fake_unsupported(const char* call) {
  std::lock_guard<std::mutex> g(unsupported_mu);
  unsupported_call = call;
  return cudaErrorNotSupported;
}
const char* allocbench_fake_unsupported_text() {
  static thread_local std::string text;
  std::lock_guard<std::mutex> g(unsupported_mu);
  text = "allocbench's fake CUDA runtime does not answer " + (unsupported_call.empty() ? std::string("this call") : unsupported_call) +
         " (the driver backend's fakes cover what PyTorch's CUDA path needs; --backend fake-tensors captures without them)";
  return text.c_str();
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  uint64_t& used = c.used_on[current_device];
  if (size > c.capacity - used) {
    last_error = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  uint64_t len = rounded(size);
  uint64_t addr = 0;
  bool placed = c.driver_order && size > kAlign ? c.take_downward(len, &addr) : c.take_lowest(len, &addr);
  if (!placed) {
    last_error = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  used += size;
  c.live[addr] = size;
  if (current_device != 0) c.device_of[addr] = current_device;
  *ptr = reinterpret_cast<void*>(addr);
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  auto it = c.live.find(reinterpret_cast<uint64_t>(ptr));
  if (it == c.live.end()) return cudaErrorInvalidValue;
  uint64_t start = it->first, len = rounded(it->second);
  auto dev = c.device_of.find(start);
  c.used_on[dev == c.device_of.end() ? 0 : dev->second] -= it->second;
  if (dev != c.device_of.end()) c.device_of.erase(dev);
  c.live.erase(it);
  c.give_back(start, len);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  *total = c.reported;
  uint64_t used = c.used_on[current_device];
  *free = used < c.reported ? c.reported - used : 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = card().devices;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= card().devices) return cudaErrorInvalidDevice;
  current_device = d;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof(*p));
  Card& c = card();
  std::strncpy(p->name, c.name, sizeof(p->name) - 1);
  p->totalGlobalMem = c.reported;
  p->major = c.cc_major;
  p->minor = c.cc_minor;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->maxThreadsPerBlock = 1024;
  p->warpSize = 32;
  p->sharedMemPerBlock = 49152;
  p->regsPerBlock = 65536;
  p->l2CacheSize = 50 << 20;
  // An H100's limits (kernels' launch checks read them: grid and block dimensions, shared memory).
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerMultiprocessor = 65536;
  p->totalConstMem = 64 << 10;
  p->memoryBusWidth = 5120;
  p->maxBlocksPerMultiProcessor = 32;
  p->persistingL2CacheMaxSize = 30 << 20;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 2;
  p->canMapHostMemory = 1;
  p->memPitch = 2147483647;
  p->textureAlignment = 512;
  p->unifiedAddressing = 1;
  p->managedMemory = 1;
  p->concurrentManagedAccess = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned int) { return cudaSuccess; }
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  for (auto& [s, seq] : c.stream_seq) c.stream_synced[s] = seq;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int, int) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  *s = reinterpret_cast<cudaStream_t>(next_stream);
  next_stream += 0x100;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  auto k = reinterpret_cast<uintptr_t>(s);
  c.stream_synced[k] = c.stream_seq[k];
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  auto k = reinterpret_cast<uintptr_t>(s);
  return c.stream_synced[k] >= c.stream_seq[k] ? cudaSuccess : cudaErrorNotReady;
}

// Streams under a graph capture, as the driver says (allocbench_fake_set_capture) or a capture
// began (cudaStreamBeginCapture): the allocator asks, as it would a real runtime, whether a
// stream is capturing and in which capture.
std::map<uintptr_t, unsigned long long>& captures() {
  static std::map<uintptr_t, unsigned long long> m;
  return m;
}

// A stream that waits on an event recorded in a capture joins that capture (CUDA's rule for
// cross-stream capture), until it ends.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  if (ev != nullptr && ev->capture != 0) {
    for (const auto& [stream, id] : captures()) {
      if (id == ev->capture) {
        captures()[reinterpret_cast<uintptr_t>(s)] = id;
        break;
      }
    }
  }
  return cudaSuccess;
}

cudaStreamCaptureStatus capture_of(cudaStream_t s, unsigned long long* id) {
  auto& m = captures();
  auto it = m.find(reinterpret_cast<uintptr_t>(s));
  if (id) *id = it == m.end() ? 0 : it->second;
  return it == m.end() ? cudaStreamCaptureStatusNone : cudaStreamCaptureStatusActive;
}

// Not a CUDA call: the oracle driver marks `stream` as capturing into capture `id` (0: not).
__attribute__((visibility("default"))) void allocbench_fake_set_capture(cudaStream_t s, unsigned long long id) {
  if (id == 0) {
    captures().erase(reinterpret_cast<uintptr_t>(s));
  } else {
    captures()[reinterpret_cast<uintptr_t>(s)] = id;
  }
}

// Not a CUDA call: the capture `s` is in ends, for every stream in it (cudaStreamEndCapture);
// returns its id (0: `s` was not capturing).
__attribute__((visibility("default"))) unsigned long long allocbench_fake_end_capture(cudaStream_t s) {
  unsigned long long id = 0;
  capture_of(s, &id);
  if (id == 0) return 0;
  for (auto it = captures().begin(); it != captures().end();) it = it->second == id ? captures().erase(it) : std::next(it);
  return id;
}

// Not a CUDA call: the capture `s` is in (0: none), for the capture's pool rows.
__attribute__((visibility("default"))) unsigned long long allocbench_fake_capture_id(cudaStream_t s) {
  unsigned long long id = 0;
  capture_of(s, &id);
  return id;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* st) {
  *st = capture_of(s, nullptr);
  return cudaSuccess;
}

#if CUDART_VERSION >= 13000
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* st, unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges, size_t* n) {
  if (edges) *edges = nullptr;
#else
// CUDA 12 names it cudaStreamGetCaptureInfo_v2 (the header's macro renames this definition).
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* st, unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** deps, size_t* n) {
#endif
  unsigned long long capture = 0;
  cudaStreamCaptureStatus status = capture_of(s, &capture);
  if (st) *st = status;
  if (id) *id = capture;
  // A capture's graph: a distinct non-null handle per capture (never dereferenced).
  if (graph) *graph = capture ? reinterpret_cast<cudaGraph_t>(0x6a0000000000ull + capture * 0x100) : nullptr;
  if (deps) *deps = nullptr;
  if (n) *n = 0;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new FakeEvent());
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<FakeEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  ev->stream = reinterpret_cast<uintptr_t>(s);
  ev->seq = ++c.stream_seq[ev->stream];
  ev->done = false;
  capture_of(s, &ev->capture);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  if (!ev->done && c.stream_synced[ev->stream] >= ev->seq) ev->done = true;
  return ev->done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  reinterpret_cast<FakeEvent*>(e)->done = true;
  return cudaSuccess;
}
// Every interval between two events takes the same 1 ms: no kernel runs, so any two choices an
// autotuner times tie (the first is kept) and no timing is 0 (Inductor divides by them).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1.0f;
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorFake";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    default: return allocbench_fake_unsupported_text();
  }
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

// The driver calls c10's DriverAPI looks up (c10/cuda/driver_api.h), for expandable segments:
// physical handles (cuMemCreate) take capacity as SimDevice::map_page does, a VA reservation is
// placed as SimDevice::reserve_address places it (the lowest free range of the same space).
struct Handle {
  uint64_t bytes;
  int device;
};

CUresult fake_cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= card().devices) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult fake_cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice) {
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 1; break;
    default: *v = 0;
  }
  return CUDA_SUCCESS;
}
CUresult fake_cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = kAlign;
  return CUDA_SUCCESS;
}
CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr, unsigned long long) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  uint64_t addr = 0;
  if (!c.take_lowest(rounded(size), &addr)) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = static_cast<CUdeviceptr>(addr);
  return CUDA_SUCCESS;
}
CUresult fake_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  c.give_back(static_cast<uint64_t>(ptr), rounded(size));
  return CUDA_SUCCESS;
}
CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop, unsigned long long) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  int device = prop != nullptr ? prop->location.id : 0;
  if (device < 0 || device >= c.devices) device = 0;
  if (size > c.capacity - c.used_on[device]) return CUDA_ERROR_OUT_OF_MEMORY;
  c.used_on[device] += size;
  *h = reinterpret_cast<CUmemGenericAllocationHandle>(new Handle{size, device});
  return CUDA_SUCCESS;
}
CUresult fake_cuMemRelease(CUmemGenericAllocationHandle h) {
  Card& c = card();
  std::lock_guard<std::mutex> g(c.mu);
  auto* handle = reinterpret_cast<Handle*>(h);
  c.used_on[handle->device] -= handle->bytes;
  delete handle;
  return CUDA_SUCCESS;
}
CUresult fake_cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) { return CUDA_SUCCESS; }
CUresult fake_cuMemUnmap(CUdeviceptr, size_t) { return CUDA_SUCCESS; }
CUresult fake_cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { return CUDA_SUCCESS; }
CUresult fake_cuGetErrorString(CUresult e, const char** s) {
  *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "unsupported call on allocbench's fake CUDA driver";
  return CUDA_SUCCESS;
}
CUresult fake_unsupported() {
  allocbench_fake_unsupported("a CUDA driver call");
  return CUDA_ERROR_NOT_SUPPORTED;
}

void* driver_entry(const char* name) {
  static const std::map<std::string, void*> entries = {
      {"cuDeviceGet", reinterpret_cast<void*>(&fake_cuDeviceGet)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&fake_cuDeviceGetAttribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&fake_cuMemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&fake_cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&fake_cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&fake_cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&fake_cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&fake_cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&fake_cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&fake_cuMemSetAccess)},
      {"cuGetErrorString", reinterpret_cast<void*>(&fake_cuGetErrorString)},
      // Required by DriverAPI's constructor, never called by the allocator's paths run here.
      {"cuMemGetAddressRange", reinterpret_cast<void*>(&fake_unsupported)},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&fake_unsupported)},
      {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&fake_unsupported)},
      {"cuMemRetainAllocationHandle", reinterpret_cast<void*>(&fake_unsupported)},
      {"cuMemGetAllocationPropertiesFromHandle", reinterpret_cast<void*>(&fake_unsupported)},
      {"cuMemsetD32Async", reinterpret_cast<void*>(&fake_unsupported)},
      {"cuStreamWriteValue32", reinterpret_cast<void*>(&fake_unsupported)},
  };
  auto it = entries.find(name);
  return it == entries.end() ? nullptr : it->second;
}

cudaError_t entry_point(const char* name, void** fn, cudaDriverEntryPointQueryResult* st) {
  void* f = name ? driver_entry(name) : nullptr;
  if (fn) *fn = f;
  if (st) *st = f ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return f ? cudaSuccess : cudaErrorSymbolNotFound;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* name, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* st) {
  return entry_point(name, fn, st);
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t*, int) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaDeviceGetGraphMemAttribute(int, cudaGraphMemAttributeType, void*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaDeviceSetGraphMemAttribute(int, cudaGraphMemAttributeType, void*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaFreeAsync(void*, cudaStream_t) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaMallocAsync(void**, size_t, cudaStream_t) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t, const cudaMemAccessDesc*, size_t) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return allocbench_fake_unsupported(__func__); }
#if CUDART_VERSION >= 13000
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*) { return allocbench_fake_unsupported(__func__); }
#else
// The CUDA 12 calls of the same paths (torch 2.9-2.10 builds link libcudart.so.12).
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, size_t*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*, size_t) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t, cudaGraphNodeType*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t, cudaGraphNode_t*, size_t, unsigned int) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaGetDriverEntryPoint(const char* name, void** fn, unsigned long long, cudaDriverEntryPointQueryResult* st) {
  return entry_point(name, fn, st);
}
#endif
cudaError_t cudaIpcCloseMemHandle(void*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*) { return allocbench_fake_unsupported(__func__); }
cudaError_t cudaIpcOpenMemHandle(void**, cudaIpcMemHandle_t, unsigned int) { return allocbench_fake_unsupported(__func__); }
// Device memory holds nothing the kernels wrote (they are skipped): a copy to the host reads
// zeros (`capture --backend driver`), except bytes copied to the device and read back before
// any kernel ran, which read back as written. DDP's reducer sends its bucket layout that way
// (Reducer::sync_bucket_indices: a host tensor to the device, a broadcast, back to the host).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice: allocbench_fake_copied_to_device(reinterpret_cast<uintptr_t>(dst), src, n); break;
    case cudaMemcpyDeviceToHost:
      if (dst != nullptr) allocbench_fake_read_from_device(dst, reinterpret_cast<uintptr_t>(src), n);
      break;
    case cudaMemcpyDeviceToDevice:
      allocbench_fake_copied_on_device(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), n);
      break;
    default: break;
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) { return cudaMemcpy(dst, src, n, kind); }
cudaError_t cudaMemcpyPeerAsync(void*, int, const void*, int, size_t, cudaStream_t) { return cudaSuccess; }

}  // extern "C"
