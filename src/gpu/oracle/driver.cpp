// allocbench's oracle driver: runs PyTorch's own CUDA caching allocator (libc10_cuda, on the
// fake CUDA runtime preloaded beside it) over an event list read from standard input, and
// writes memory_stats(), the segment map at the end and the OOM (the allocator's own text) as
// JSON on standard output. PYTORCH_CUDA_ALLOC_CONF is read by the allocator itself.
// With ALLOCBENCH_ORACLE_TRACK=FILE, after every event it appends to FILE the state the
// simulator is compared with event by event (7 little-endian u64: the address an alloc returned
// or 0, then allocated, reserved, active, inactive_split bytes, inactive_split blocks and
// segments, "all" pools): how `fidelity --oracle` finds the first event where the two part,
// and the moment of the peak.
// One source for every torch version verified: where their C++ APIs differ, C++20 `requires`
// picks the call the headers have, and a statistic a version lacks is left out.
//
// Input, one event a line (written by src/gpu/oracle/mod.rs):
//   a ID BYTES STREAM   alloc          f ID          free
//   r ID STREAM         record_stream  s STREAM|-    sync (a stream, or the device)
//   e                   empty_cache    t N           step
//   b POOL STREAM|-     pool_begin     j POOL STREAM pool_join
//   n POOL              pool_end       l POOL        pool_release
//   p POOL              empty_cache of a pool
//   u POOL              pool_use_on_oom (MemPool(use_on_oom=True))
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#if __has_include(<c10/cuda/PeerToPeerAccess.h>)
#include <c10/cuda/PeerToPeerAccess.h>  // torch >= 2.14: the allocator asks its cache
#define ALLOCBENCH_HAS_P2P_CACHE 1
#endif
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace c10::cuda::_internal {
void setHasPrimaryContext(bool (*func)(c10::DeviceIndex));
}

namespace alloc = c10::cuda::CUDACachingAllocator;

// In the fake runtime (not a CUDA call): marks a stream as capturing into a capture (0: not).
extern "C" void allocbench_fake_set_capture(cudaStream_t s, unsigned long long id);

namespace {

bool has_primary_context(c10::DeviceIndex) { return true; }

cudaStream_t handle_of(uint64_t stream) {
  // Stream 0 is the default (null) stream; the others look like pointers, as c10 wants them.
  return stream == 0 ? nullptr : reinterpret_cast<cudaStream_t>(0x5f0000000000ull + stream * 0x100);
}

c10::cuda::CUDAStream stream_of(uint64_t stream) {
  return stream == 0 ? c10::cuda::getDefaultCUDAStream(0) : c10::cuda::getStreamFromExternal(handle_of(stream), 0);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Templates, so that the branch a version's headers lack is never instantiated.
template <class Pool>
alloc::SnapshotInfo take_snapshot(Pool pool) {
  // torch 2.15 added an argument (whether to include trace entries); older ones take the pool only.
  if constexpr (requires { alloc::snapshot(pool, false); }) {
    return alloc::snapshot(pool, false);
  } else {
    return alloc::snapshot(pool);
  }
}

// A graph capture as CUDAGraph::capture_begin/capture_end make it: the capture stream (and the
// streams that join it) capture, and from torch 2.13 the allocator is told (markCaptureBegin/
// End, which decide whether empty_cache may free the default pools meanwhile).
template <class Allocator>
void mark_capture(Allocator* a, bool begin) {
  if constexpr (requires { a->markCaptureBegin(c10::DeviceIndex{0}); }) {
    if (begin) {
      a->markCaptureBegin(0);
    } else {
      a->markCaptureEnd(0);
    }
  }
}

// setUseOnOOM: torch 2.10+ takes whether to (as MemPool(use_on_oom=...) says), 2.9 only sets it
// (and cannot unset it, which MemPool's destructor does before releasing the pool on 2.10+).
template <class Allocator>
void use_on_oom(Allocator* a, c10::MempoolId_t pool, bool on) {
  if constexpr (requires { a->setUseOnOOM(c10::DeviceIndex{0}, pool, true); }) {
    a->setUseOnOOM(0, pool, on);
  } else if (on) {
    a->setUseOnOOM(0, pool);
  }
}

template <class Stats>
void put_newer_counts(std::string& out, const Stats& st) {
  if constexpr (requires { st.num_oom_rejections; }) {  // torch >= 2.12 (throw_on_cudamalloc_oom)
    out += ",\"num_oom_rejections\":" + std::to_string(st.num_oom_rejections);
  }
}

void put_stat(std::string& out, const std::string& name, const c10::CachingAllocator::Stat& s) {
  out += "\"" + name + ".current\":" + std::to_string(s.current) + ",";
  out += "\"" + name + ".peak\":" + std::to_string(s.peak) + ",";
  out += "\"" + name + ".allocated\":" + std::to_string(s.allocated) + ",";
  out += "\"" + name + ".freed\":" + std::to_string(s.freed) + ",";
}

std::string stats_json() {
  auto st = alloc::getDeviceStats(0);
  std::string out = "{";
  const char* types[3] = {"all", "small_pool", "large_pool"};
  struct Named {
    const char* name;
    const c10::CachingAllocator::StatArray* arr;
  } named[] = {{"allocation", &st.allocation},         {"segment", &st.segment},
               {"active", &st.active},                 {"inactive_split", &st.inactive_split},
               {"allocated_bytes", &st.allocated_bytes}, {"reserved_bytes", &st.reserved_bytes},
               {"active_bytes", &st.active_bytes},     {"inactive_split_bytes", &st.inactive_split_bytes},
               {"requested_bytes", &st.requested_bytes}};
  for (auto& n : named)
    for (int t = 0; t < 3; t++) put_stat(out, std::string(n.name) + "." + types[t], (*n.arr)[t]);
  put_stat(out, "oversize_allocations", st.oversize_allocations);
  put_stat(out, "oversize_segments", st.oversize_segments);
  out += "\"num_alloc_retries\":" + std::to_string(st.num_alloc_retries) + ",";
  out += "\"num_ooms\":" + std::to_string(st.num_ooms) + ",";
  out += "\"max_split_size\":" + std::to_string(st.max_split_size) + ",";
  out += "\"num_sync_all_streams\":" + std::to_string(st.num_sync_all_streams) + ",";
  out += "\"num_device_alloc\":" + std::to_string(st.num_device_alloc) + ",";
  out += "\"num_device_free\":" + std::to_string(st.num_device_free);
  put_newer_counts(out, st);
  return out + "}";
}

std::string segments_json() {
  auto snap = take_snapshot(c10::MempoolId_t{0, 0});
  std::string out = "[";
  bool first = true;
  for (auto& seg : snap.segments) {
    if (!first) out += ",";
    first = false;
    out += "{\"address\":" + std::to_string(seg.address) + ",\"total_size\":" + std::to_string(seg.total_size) +
           ",\"allocated_size\":" + std::to_string(seg.allocated_size) + ",\"active_size\":" + std::to_string(seg.active_size) +
           ",\"requested_size\":" + std::to_string(seg.requested_size) +
           ",\"stream\":" + std::to_string(reinterpret_cast<uintptr_t>(seg.stream)) + ",\"is_large\":" + (seg.is_large ? "true" : "false") +
           ",\"is_expandable\":" + (seg.is_expandable ? "true" : "false") +
           ",\"pool\":[" + std::to_string(seg.owner_private_pool_id.first) + "," + std::to_string(seg.owner_private_pool_id.second) +
           "],\"blocks\":[";
    bool bfirst = true;
    for (auto& b : seg.blocks) {
      if (!bfirst) out += ",";
      bfirst = false;
      out += "{\"size\":" + std::to_string(b.size) + ",\"requested_size\":" + std::to_string(b.requested_size) +
             ",\"allocated\":" + (b.allocated ? "true" : "false") + ",\"active\":" + (b.active ? "true" : "false") + "}";
    }
    out += "]}";
  }
  return out + "]";
}

// A pool as the trace names it: graph captures (a stream) get {pool, 0}, MemPools (every
// stream) {0, pool}, as PyTorch numbers them.
struct Pool {
  c10::MempoolId_t id;
  std::shared_ptr<std::set<cudaStream_t>> streams;  // null: every stream
  bool capturing = false;                            // a graph capture, until its end
  bool use_on_oom = false;                           // pool_use_on_oom, until its first release
};

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  c10::cuda::_internal::setHasPrimaryContext(has_primary_context);
  try {
    alloc::init(1);  // reads PYTORCH_CUDA_ALLOC_CONF
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::cerr << "oracle driver: PyTorch refused the conf: " << msg.substr(0, msg.find('\n')) << "\n";
    return 4;
  }
#ifdef ALLOCBENCH_HAS_P2P_CACHE
  c10::cuda::detail::init_p2p_access_cache(1);
#endif
  auto* a = alloc::get();

  std::unordered_map<uint64_t, c10::DataPtr> live;
  std::unordered_map<uint64_t, Pool> pools;
  uint64_t events = 0;
  std::string oom;
  bool stopped = false;
  std::string op;
  uint64_t x = 0, y = 0, z = 0;
  std::string sy;
  int64_t peak_reserved = 0, peak_allocated = 0;
  uint64_t peak_event = 0;  // 1-based; 0: none
  FILE* track = nullptr;
  if (const char* t = std::getenv("ALLOCBENCH_ORACLE_TRACK")) track = std::fopen(t, "wb");
  while (!stopped && (std::cin >> op)) {
    events++;
    uint64_t placed = 0;
    try {
      switch (op[0]) {
        case 'a': {
          std::cin >> x >> y >> z;
          c10::cuda::setCurrentCUDAStream(stream_of(z));
          live[x] = a->allocate(y);
          placed = reinterpret_cast<uint64_t>(live[x].get());
          break;
        }
        case 'f':
          std::cin >> x;
          live.erase(x);
          break;
        case 'r':
          std::cin >> x >> y;
          if (auto it = live.find(x); it != live.end() && it->second.get() != nullptr) alloc::recordStream(it->second, stream_of(y));
          break;
        case 's':
          std::cin >> sy;
          if (sy == "-") {
            cudaDeviceSynchronize();
          } else {
            cudaStreamSynchronize(handle_of(std::stoull(sy)));
          }
          break;
        case 'e': {
          // The trace does not say which stream called it: during a graph capture, the
          // capture's (torch 2.13+ frees the default pools unless the calling stream captures;
          // the simulator takes any capture underway as the caller's).
          for (auto& [id, p] : pools) {
            if (p.streams && p.capturing && !p.streams->empty()) {
              c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromExternal(*p.streams->begin(), 0));
              break;
            }
          }
          alloc::emptyCache();
          break;
        }
        case 't':
          std::cin >> x;
          break;
        case 'b': {
          std::cin >> x >> sy;
          Pool p;
          if (sy == "-") {
            p.id = {0, static_cast<c10::CaptureId_t>(x)};
          } else {
            p.id = {static_cast<c10::CaptureId_t>(x), 0};
            p.streams = std::make_shared<std::set<cudaStream_t>>();
            p.streams->insert(handle_of(std::stoull(sy)));
            allocbench_fake_set_capture(handle_of(std::stoull(sy)), x);
            mark_capture(a, true);
            p.capturing = true;
          }
          pools[x] = p;
          auto streams = p.streams;
          a->beginAllocateToPool(0, p.id, [streams](cudaStream_t s) { return !streams || streams->count(s) > 0; });
          break;
        }
        case 'j':
          std::cin >> x >> y;
          if (auto it = pools.find(x); it != pools.end() && it->second.streams) {
            it->second.streams->insert(handle_of(y));
            allocbench_fake_set_capture(handle_of(y), x);
          }
          break;
        case 'n':
          std::cin >> x;
          a->endAllocateToPool(0, pools.at(x).id);
          if (auto& p = pools.at(x); p.capturing) {
            for (auto s : *p.streams) allocbench_fake_set_capture(s, 0);
            mark_capture(a, false);
            p.capturing = false;
          }
          break;
        case 'l':
          std::cin >> x;
          // A MemPool's destructor: no longer used on OOM, then released.
          if (auto& p = pools.at(x); p.use_on_oom) {
            use_on_oom(a, p.id, false);
            p.use_on_oom = false;
          }
          a->releasePool(0, pools.at(x).id);
          break;
        case 'p':
          std::cin >> x;
          alloc::emptyCache(pools.at(x).id);
          break;
        case 'u':
          std::cin >> x;
          use_on_oom(a, pools.at(x).id, true);
          pools.at(x).use_on_oom = true;
          break;
        default:
          std::cerr << "oracle driver: unknown event '" << op << "' at event " << events << "\n";
          return 2;
      }
    } catch (const c10::OutOfMemoryError& e) {
      oom = "{\"event\":" + std::to_string(events) + ",\"bytes\":" + std::to_string(y) + ",\"stream\":" + std::to_string(z) +
            ",\"message\":" + json_string(e.what_without_backtrace()) + "}";
      stopped = true;
    } catch (const c10::Error& e) {
      std::cerr << "oracle driver: PyTorch's allocator refused event " << events << " ('" << op << "'): " << e.what_without_backtrace()
                << "\n";
      return 3;
    }
    // The peak, as the simulator's Peak observer takes it: after an allocation, reserved above
    // every earlier one, or equal to the highest with more allocated.
    if (placed != 0 && !stopped) {
      auto st = alloc::getDeviceStats(0);
      int64_t reserved = st.reserved_bytes[0].current, allocated = st.allocated_bytes[0].current;
      if (reserved > peak_reserved || (reserved == peak_reserved && allocated > peak_allocated)) {
        peak_reserved = reserved;
        peak_allocated = allocated;
        peak_event = events;
      }
    }
    if (track && !stopped) {
      auto st = alloc::getDeviceStats(0);
      uint64_t row[7] = {placed,
                         static_cast<uint64_t>(st.allocated_bytes[0].current),
                         static_cast<uint64_t>(st.reserved_bytes[0].current),
                         static_cast<uint64_t>(st.active_bytes[0].current),
                         static_cast<uint64_t>(st.inactive_split_bytes[0].current),
                         static_cast<uint64_t>(st.inactive_split[0].current),
                         static_cast<uint64_t>(st.segment[0].current)};
      std::fwrite(row, sizeof row, 1, track);
    }
  }
  if (track) std::fclose(track);
  std::string out = "{\"format\":\"allocbench-oracle-v1\",\"events\":" + std::to_string(events) + ",\"stats\":" + stats_json() +
                    ",\"peak_event\":" + (peak_event ? std::to_string(peak_event - 1) : std::string("null")) +
                    ",\"oom\":" + (oom.empty() ? std::string("null") : oom) + ",\"segments\":" + segments_json() + "}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  // Live allocations are dropped without tearing the allocator down (its destructor order with
  // the fake runtime does not matter here).
  std::_Exit(0);
}
