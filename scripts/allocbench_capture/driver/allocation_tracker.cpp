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
#include <torch/csrc/profiler/combined_traceback.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {
namespace cca = c10::cuda::CUDACachingAllocator;

struct Live {
  uint64_t id, bytes;
  int device;
};

// A row on its way to a trace (device -1: every open trace); an alloc's with the Python stack
// PyTorch gathered for it (_record_memory_history(stacks="python")) when sites are recorded.
struct Row {
  int device;
  std::string text;
  std::shared_ptr<c10::GatheredContext> context;
  std::string fallback;  // the site of an alloc whose stack has no Python frame (autograd's thread)
};

// Which frame of a stack is an allocation's site: the innermost outside torch, the standard
// library and the capture's package (sites.py's rule), else the innermost library frame.
struct SiteRules {
  std::string root, torch_dir, stdlib_dir, package_dir;
  std::vector<std::string> libraries;

  static bool under(const std::string& path, const std::string& dir) { return !dir.empty() && path.rfind(dir, 0) == 0; }

  bool library(const std::string& file) const {
    if (under(file, package_dir) || under(file, torch_dir) || file.rfind("<frozen", 0) == 0) return true;
    bool third_party = false;
    for (auto& l : libraries) third_party |= under(file, l);
    if (under(file, stdlib_dir) && !third_party) return true;
    return file.size() >= 20 && file.compare(file.size() - 20, 20, "typing_extensions.py") == 0;
  }

  std::string relative(const std::string& file) const {
    if (under(file, root)) return file.substr(root.size());
    for (auto& l : libraries)
      if (under(file, l)) return file.substr(l.size());
    return file;
  }

  // "FILE:LINE FUNCTION" of the site in `frames` (innermost first), or "" when it has none.
  std::string site(const torch::SymbolizedTracebacks& s, const std::vector<uint64_t>& frames) const {
    const torch::unwind::Frame* fallback = nullptr;
    for (uint64_t i : frames) {
      const auto& f = s.all_frames.at(i);
      if (under(f.filename, package_dir)) continue;
      if (!library(f.filename)) return relative(f.filename) + ":" + std::to_string(f.lineno) + " " + f.funcname;
      if (fallback == nullptr) fallback = &f;
    }
    return fallback ? relative(fallback->filename) + ":" + std::to_string(fallback->lineno) + " " + fallback->funcname : "";
  }
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
  // Sites: rows wait in `pending` until the Python side flushes them (with the GIL, which naming
  // a stack's frames needs), then go out with `#site`/`#at` lines, per device trace.
  bool sites = false;
  SiteRules rules;
  std::vector<Row> pending;
  std::map<int, std::unordered_map<std::string, int>> site_ids;
  std::map<int, int> current_site;  // device -> the site the next alloc is at (-1: none)
  std::string backward_site;         // the backward() call running: the site of autograd's allocs
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

  // A row now, or after the next flush when sites are recorded (every row waits, so the order holds).
  void emit(Row row) {
    if (sites) return pending.push_back(std::move(row));
    write(row, "");
  }

  // Writes a row, after its site's line; a `step,N,,` row is remembered for the traces opened later.
  void write(const Row& row, const std::string& site) {
    unsigned long long s = 0;
    bool is_step = std::sscanf(row.text.c_str(), "step,%llu,", &s) == 1;
    if (is_step) step = s;
    if (row.device < 0) {
      for (auto& [d, f] : outs) {
        std::fputs(row.text.c_str(), f);
        std::fputc('\n', f);
        if (is_step) std::fflush(f);  // (each step on disk: a crash keeps the rows of the steps before it)
      }
      return;
    }
    FILE* f = out(row.device);
    if (f == nullptr) return;
    if (row.context != nullptr || !site.empty() || !row.fallback.empty()) {
      int& current = current_site.try_emplace(row.device, -1).first->second;
      auto& ids = site_ids[row.device];
      if (site.empty()) {
        if (current != -1) std::fputs("#at -\n", f), current = -1;
      } else if (auto it = ids.find(site); it == ids.end()) {
        current = int(ids.size());
        ids.emplace(site, current);
        std::fprintf(f, "#site %d %s\n", current, site.c_str());
      } else if (it->second != current) {
        current = it->second;
        std::fprintf(f, "#at %d\n", current);
      }
    }
    std::fputs(row.text.c_str(), f);
    std::fputc('\n', f);
  }

  void on_entry(const cca::TraceEntry& te) {
    std::lock_guard<std::mutex> g(mu);
    switch (te.action_) {
      case cca::TraceEntry::ALLOC: {
        if (!open) return;
        uint64_t id = next_id++;
        live[te.addr_] = {id, te.size_, te.device_};
        emit({te.device_, "alloc," + std::to_string(id) + "," + std::to_string(te.size_) + "," + std::to_string(stream_id(te.stream_)),
              sites ? te.context_ : nullptr, sites ? backward_site : std::string()});
        allocs++, rows++;
        mix('a'), mix(te.size_), mix(stream_id(te.stream_)), mix(uint64_t(te.device_ - primary));
        live_bytes += te.size_;
        if (live_bytes > peak_live_bytes) peak_live_bytes = live_bytes;
        break;
      }
      case cca::TraceEntry::FREE_REQUESTED: {
        auto it = live.find(te.addr_);
        if (it == live.end()) return;  // allocated before the tracker was attached
        emit({it->second.device, "free," + std::to_string(it->second.id) + ",,", nullptr});
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
// on every open one (device -1).
void allocbench_tracker_line(int device, const char* line) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  if (!t.open) return;
  if (line[0] != '#') t.rows += device >= 0 ? 1 : t.outs.size();
  t.emit({device, line, nullptr});
}

// Records each allocation's site from the Python stack PyTorch gathers for it (the Python side
// turned on _record_memory_history(context="alloc", stacks="python")); the rules name the
// script's folder, torch's, the standard library's, the capture package's and the third-party
// library folders (separated by '\n').
void allocbench_tracker_sites(const char* root, const char* torch_dir, const char* stdlib_dir, const char* package_dir, const char* libraries) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  t.sites = true;
  t.rules = {root, torch_dir, stdlib_dir, package_dir, {}};
  std::string all = libraries;
  for (size_t at = 0; at < all.size();) {
    size_t end = all.find('\n', at);
    if (end == std::string::npos) end = all.size();
    if (end > at) t.rules.libraries.push_back(all.substr(at, end - at));
    at = end + 1;
  }
}

// Writes the rows waiting for their sites. Called with the GIL held (ctypes.PyDLL): naming the
// Python frames of a stack reads their code objects. The rows are taken under the lock and the
// stacks named outside it, as a free during the naming (a collection) takes the lock again.
void allocbench_tracker_flush(void) {
  Tracker& t = tracker();
  std::vector<Row> batch;
  {
    std::lock_guard<std::mutex> g(t.mu);
    batch.swap(t.pending);
  }
  std::vector<torch::CapturedTraceback*> stacks;
  std::vector<size_t> of;
  for (size_t i = 0; i < batch.size(); i++) {
    if (auto* tb = dynamic_cast<torch::CapturedTraceback*>(batch[i].context.get())) stacks.push_back(tb), of.push_back(i);
  }
  std::vector<std::string> names(batch.size());
  if (!stacks.empty()) {
    torch::SymbolizedTracebacks named = torch::symbolize(stacks);
    for (size_t k = 0; k < of.size(); k++) names[of[k]] = t.rules.site(named, named.tracebacks.at(k));
  }
  std::lock_guard<std::mutex> g(t.mu);
  for (size_t i = 0; i < batch.size(); i++) t.write(batch[i], names[i].empty() ? batch[i].fallback : names[i]);
}

// The site of the backward() (or autograd.grad()) call now running, "" when it returns: the
// allocations autograd makes on its device thread, where no Python frame is, are made there.
void allocbench_tracker_backward_site(const char* site) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  t.backward_site = site;
}

// `tensor.record_stream(s)` on the block at `address`: its row, before its free's.
void allocbench_tracker_record_stream(uint64_t address, void* stream) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.live.find(address);
  if (it == t.live.end()) return;
  t.emit({it->second.device, "record_stream," + std::to_string(it->second.id) + ",," + std::to_string(t.stream_id(stream)), nullptr});
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

// Stops recording and closes the files (the Python side writes its closing lines after, and
// flushes the rows waiting for their sites before: any left go out without one).
void allocbench_tracker_close(void) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> g(t.mu);
  for (auto& row : t.pending) t.write(row, "");
  t.pending.clear();
  t.sites = false;
  for (auto& [d, f] : t.outs) std::fclose(f);
  t.outs.clear();
  t.open = false;
}

}  // extern "C"
