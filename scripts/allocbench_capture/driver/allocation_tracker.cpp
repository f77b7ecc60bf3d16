// allocbench's recorder for `capture --backend driver`: PyTorch's own caching allocator reports
// every allocation and free to its trace trackers (attachAllocatorTraceTracker; record_trace in
// c10/cuda/CUDACachingAllocator.cpp calls them with or without _record_memory_history), and this
// writes them as trace v1 rows: `alloc,ID,BYTES,STREAM` at ALLOC (the size asked for, before
// rounding) and `free,ID,,` at FREE_REQUESTED (the user's free; the allocator completes it once
// the streams that used the block are done). The Python side adds its rows (steps, streams the
// script recorded, syncs) through the same lock, so the file is one ordered history.
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace {
namespace cca = c10::cuda::CUDACachingAllocator;

struct Tracker {
  std::mutex mu;
  FILE* out = nullptr;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> live;  // address -> (id, bytes)
  std::unordered_map<void*, uint64_t> streams;                        // handle -> trace stream id
  uint64_t allocs = 0, frees = 0, rows = 0, live_bytes = 0, peak_live_bytes = 0, ooms = 0;
  bool attached = false;

  // The default stream is 0 (its handle is null); the others are numbered as they appear.
  uint64_t stream_id(void* s) {
    if (s == nullptr) return 0;
    auto it = streams.find(s);
    if (it != streams.end()) return it->second;
    uint64_t id = streams.size() + 1;
    streams.emplace(s, id);
    return id;
  }

  void on_entry(const cca::TraceEntry& te) {
    std::lock_guard<std::mutex> g(mu);
    if (out == nullptr || te.device_ != 0) return;
    switch (te.action_) {
      case cca::TraceEntry::ALLOC: {
        uint64_t id = next_id++;
        live[te.addr_] = {id, te.size_};
        std::fprintf(out, "alloc,%llu,%llu,%llu\n", (unsigned long long)id, (unsigned long long)te.size_,
                     (unsigned long long)stream_id(te.stream_));
        allocs++, rows++;
        live_bytes += te.size_;
        if (live_bytes > peak_live_bytes) peak_live_bytes = live_bytes;
        break;
      }
      case cca::TraceEntry::FREE_REQUESTED: {
        auto it = live.find(te.addr_);
        if (it == live.end()) return;  // allocated before the tracker was attached
        std::fprintf(out, "free,%llu,,\n", (unsigned long long)it->second.first);
        live_bytes -= it->second.second;
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

// Starts writing rows to `path` (appended: the Python side wrote the header).
int allocbench_tracker_open(const char* path) {
  Tracker& t = tracker();
  {
    std::lock_guard<std::mutex> g(t.mu);
    t.out = std::fopen(path, "a");
    if (t.out == nullptr) return -1;
    if (t.attached) return 0;
    t.attached = true;
  }
  cca::attachAllocatorTraceTracker([](const cca::TraceEntry& te) { tracker().on_entry(te); });
  return 0;
}

// A row or comment line of the Python side's (a step, a record_stream, a sync), in order.
void allocbench_tracker_line(const char* line) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  if (t.out == nullptr) return;
  std::fputs(line, t.out);
  std::fputc('\n', t.out);
  if (line[0] != '#') t.rows++;
}

// `tensor.record_stream(s)` on the block at `address`: its row, before its free's.
void allocbench_tracker_record_stream(uint64_t address, void* stream) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.live.find(address);
  if (t.out == nullptr || it == t.live.end()) return;
  std::fprintf(t.out, "record_stream,%llu,,%llu\n", (unsigned long long)it->second.first, (unsigned long long)t.stream_id(stream));
  t.rows++;
}

// The trace stream id of a stream handle (for the Python side's sync rows).
uint64_t allocbench_tracker_stream_id(void* stream) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  return t.stream_id(stream);
}

// Counters for the capture's summary: allocs, frees, rows, live bytes, their peak, OOMs.
void allocbench_tracker_counts(uint64_t* counts) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  counts[0] = t.allocs, counts[1] = t.frees, counts[2] = t.rows, counts[3] = t.live_bytes, counts[4] = t.peak_live_bytes, counts[5] = t.ooms;
}

// Stops recording and closes the file (the Python side writes its closing lines after).
void allocbench_tracker_close(void) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  if (t.out != nullptr) std::fclose(t.out);
  t.out = nullptr;
}

}  // extern "C"
