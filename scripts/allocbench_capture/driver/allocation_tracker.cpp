// allocbench's recorder for `capture --backend driver`: PyTorch's own caching allocator reports
// every allocation and free to its trace trackers (attachAllocatorTraceTracker; record_trace in
// c10/cuda/CUDACachingAllocator.cpp calls them with or without _record_memory_history), and this
// writes them as trace v1 rows: `alloc,ID,BYTES,STREAM` at ALLOC (the size asked for, before
// rounding) and `free,ID,,` at FREE_REQUESTED (the user's free; the allocator completes it once
// the streams that used the block are done). The Python side adds its rows (steps, streams the
// script recorded, syncs) through the same lock, so the file is one ordered history. Device 0
// writes to the trace named; another device D to its own, `NAME.cudaD.csv`, opened at its first
// allocation with the same header and the step it is in.
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {
namespace cca = c10::cuda::CUDACachingAllocator;

struct Live {
  uint64_t id, bytes;
  int device;
};

struct Tracker {
  std::mutex mu;
  std::string path, header;  // device 0's trace, and the header every device's trace starts with
  std::map<int, FILE*> outs;  // device -> its trace (opened at its first allocation)
  int primary = 0;            // the device whose rows go to the trace named (a rank's LOCAL_RANK)
  bool open = false;
  uint64_t next_id = 1, step = 0;
  std::unordered_map<uint64_t, Live> live;     // address -> the allocation
  std::unordered_map<void*, uint64_t> streams;  // handle -> trace stream id
  uint64_t allocs = 0, frees = 0, rows = 0, live_bytes = 0, peak_live_bytes = 0, ooms = 0;
  bool attached = false;
  // FNV-1a over the alloc and free rows (sizes, streams, ids, device relative to the primary):
  // two ranks with equal fingerprints made the same allocations (`capture --ranks distinct`).
  uint64_t fingerprint = 14695981039346656037ull;

  void mix(uint64_t v) {
    for (int i = 0; i < 8; i++) fingerprint = (fingerprint ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  }

  // The default stream is 0 (its handle is null); the others are numbered as they appear.
  uint64_t stream_id(void* s) {
    if (s == nullptr) return 0;
    auto it = streams.find(s);
    if (it != streams.end()) return it->second;
    uint64_t id = streams.size() + 1;
    streams.emplace(s, id);
    return id;
  }

  static std::string device_path(const std::string& path, int device) {
    size_t dot = path.rfind(".csv");
    std::string tag = ".cuda" + std::to_string(device);
    return dot == std::string::npos ? path + tag + ".csv" : path.substr(0, dot) + tag + path.substr(dot);
  }

  FILE* out(int device) {
    auto it = outs.find(device);
    if (it != outs.end()) return it->second;
    if (!open) return nullptr;
    FILE* f = std::fopen(device == primary ? path.c_str() : device_path(path, device).c_str(), "w");
    if (f == nullptr) return nullptr;
    std::fprintf(f, "%s# device: cuda:%d of a capture of several (cuda:%d: %s)\nop,id,bytes,stream\n", header.c_str(), device, primary, path.c_str());
    if (step > 0) std::fprintf(f, "step,%llu,,\n", (unsigned long long)step);
    outs[device] = f;
    return f;
  }

  void on_entry(const cca::TraceEntry& te) {
    std::lock_guard<std::mutex> g(mu);
    switch (te.action_) {
      case cca::TraceEntry::ALLOC: {
        FILE* f = out(te.device_);
        if (f == nullptr) return;
        uint64_t id = next_id++;
        live[te.addr_] = {id, te.size_, te.device_};
        std::fprintf(f, "alloc,%llu,%llu,%llu\n", (unsigned long long)id, (unsigned long long)te.size_, (unsigned long long)stream_id(te.stream_));
        allocs++, rows++;
        mix('a'), mix(te.size_), mix(stream_id(te.stream_)), mix(uint64_t(te.device_ - primary));
        live_bytes += te.size_;
        if (live_bytes > peak_live_bytes) peak_live_bytes = live_bytes;
        break;
      }
      case cca::TraceEntry::FREE_REQUESTED: {
        auto it = live.find(te.addr_);
        if (it == live.end()) return;  // allocated before the tracker was attached
        FILE* f = out(it->second.device);
        if (f != nullptr) std::fprintf(f, "free,%llu,,\n", (unsigned long long)it->second.id);
        live_bytes -= it->second.bytes;
        mix('f'), mix(it->second.id);
        live.erase(it);
        frees++, rows++;
        break;
      }
      case cca::TraceEntry::OOM:
        ooms++;
        break;
      default:
        break;
    }
  }
};

Tracker& tracker() {
  static Tracker* t = new Tracker();  // (never destroyed: the allocator may call it at exit)
  return *t;
}
}  // namespace

extern "C" {

// Starts writing rows to `path` (device `primary`'s trace, whose header the Python side wrote;
// the header text is repeated atop every other device's).
int allocbench_tracker_open(const char* path, const char* header, int primary) {
  Tracker& t = tracker();
  {
    std::lock_guard<std::mutex> g(t.mu);
    FILE* f = std::fopen(path, "a");
    if (f == nullptr) return -1;
    t.path = path, t.header = header, t.open = true, t.primary = primary;
    t.outs[primary] = f;
    if (t.attached) return 0;
    t.attached = true;
  }
  cca::attachAllocatorTraceTracker([](const cca::TraceEntry& te) { tracker().on_entry(te); });
  return 0;
}

// A row or comment line of the Python side's (a step, a sync), in order: on `device`'s trace, or
// on every open one (device -1). A `step,N,,` row is remembered for the traces opened later.
void allocbench_tracker_line(int device, const char* line) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  unsigned long long step = 0;
  if (std::sscanf(line, "step,%llu,", &step) == 1) t.step = step;
  for (auto& [d, f] : t.outs) {
    if (device >= 0 && d != device) continue;
    std::fputs(line, f);
    std::fputc('\n', f);
    if (step != 0) std::fflush(f);  // (each step on disk: a crash keeps the rows of the steps before it)
    if (line[0] != '#') t.rows++;
  }
}

// `tensor.record_stream(s)` on the block at `address`: its row, before its free's.
void allocbench_tracker_record_stream(uint64_t address, void* stream) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.live.find(address);
  if (it == t.live.end()) return;
  FILE* f = t.out(it->second.device);
  if (f == nullptr) return;
  std::fprintf(f, "record_stream,%llu,,%llu\n", (unsigned long long)it->second.id, (unsigned long long)t.stream_id(stream));
  t.rows++;
}

// The trace stream id of a stream handle (for the Python side's sync rows).
uint64_t allocbench_tracker_stream_id(void* stream) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  return t.stream_id(stream);
}

// Counters for the capture's summary: allocs, frees, rows, live bytes, their peak, OOMs, a mask
// of the devices with a trace, and the rows' fingerprint.
void allocbench_tracker_counts(uint64_t* counts) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  counts[0] = t.allocs, counts[1] = t.frees, counts[2] = t.rows, counts[3] = t.live_bytes, counts[4] = t.peak_live_bytes, counts[5] = t.ooms;
  counts[6] = 0;
  for (auto& [d, f] : t.outs) counts[6] |= 1ull << d;
  counts[7] = t.fingerprint;
}

// Stops recording and closes the files (the Python side writes its closing lines after).
void allocbench_tracker_close(void) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  for (auto& [d, f] : t.outs) std::fclose(f);
  t.outs.clear();
  t.open = false;
}

}  // extern "C"
