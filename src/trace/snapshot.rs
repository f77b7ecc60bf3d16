//! Imports of other tools' memory histories into our event stream: PyTorch memory snapshots
//! (`torch.cuda.memory._dump_snapshot()` after `_record_memory_history()`, or the same dict saved
//! as JSON) and RMM's
//! `logging_resource_adaptor` CSV logs.
//!
//! Snapshot trace actions map as: `alloc` → alloc (its `size` is the user's request);
//! `free_requested` directly followed by its `free_completed` → free; a `free_requested` whose
//! `free_completed` comes later (the block was used by another stream, recordStream, and waited
//! for its events) → `record_stream` on a side stream of its own, then free, and the later
//! `free_completed` → `sync` of that side stream (the free lands at the next malloc's
//! process_events, where PyTorch records it); a `free_completed` with no `free_requested` (older
//! histories) → free; a run of `segment_free`/`segment_unmap` that no `segment_alloc`/`segment_map` of the
//! same malloc follows → `empty_cache` (a malloc's own retry path releases segments and then
//! allocates one, recording both with the malloc's context: where both carry frames, a release
//! whose frames differ from the next allocation's, or that names empty_cache, is an empty_cache);
//! `oom` → the failed request, allocated and freed at once (PyTorch records a failed malloc only
//! as `oom`, with the rounded size: the script went on without it, or stopped there); `snapshot`,
//! annotations and the other segment actions are the allocator's decisions or markers, which the
//! replay re-makes or skips. Streams are kept. A history whose first entries free blocks it never
//! allocated was truncated (the ring buffer was full): those blocks are allocated at the start,
//! as are the blocks the snapshot's segments hold that the history never allocated (allocated
//! before recording began: often the model's weights; MemoryViz's `initially_allocated`), and the
//! import says so.

use std::path::Path;

use rustc_hash::{FxHashMap, FxHashSet};

use super::pickle::{self, Value};
use super::Sites;
use crate::error::InputError;
use crate::event::Event;

/// An imported history, in memory (snapshots are bounded by their ring buffer).
#[derive(Debug, Clone, Default)]
pub struct ImportedTrace {
    pub format: &'static str,
    pub events: Vec<Event>,
    /// The allocation site of each allocated id (from the entry's frames).
    pub sites: Sites,
    pub truncated: bool,
    /// Things the import noticed and said (one line each).
    pub notes: Vec<String>,
    /// (address, size) of each `segment_alloc`, in order: replaying them makes best-fit ties
    /// between equal-size blocks break as they did on the GPU.
    pub segment_addresses: Vec<(u64, u64)>,
    /// The device imported, when the snapshot recorded several: each is a workload of its own.
    pub device_of_several: Option<usize>,
    /// Every device the snapshot holds a history for (a sweep replays each).
    pub recorded_devices: Vec<usize>,
}

const MAX_SNAPSHOT_BYTES: u64 = 2 << 30;

/// Stream ids standing for the unknown streams that used a block whose free waited (a snapshot
/// does not say which stream used it): one per such block, far from any real stream handle.
pub const SIDE_STREAM_BASE: u64 = 1 << 62;

fn err(path: &Path, msg: impl Into<String>) -> InputError {
    InputError::new(path.display().to_string(), msg)
}

fn int(v: &Value, key: &str) -> Option<i128> {
    v.get(key).and_then(|x| x.as_int())
}

/// Entry `i`'s integer field `key`: a missing field and one of another type are told apart.
fn required_int(e: &Value, key: &str, i: usize, action: &str) -> Result<i128, String> {
    match e.get(key) {
        None => Err(format!("trace entry {i} ({action}) has no '{key}'")),
        Some(v) => v.as_int().ok_or_else(|| format!("trace entry {i} ({action}): '{key}' is {}, not an integer", v.type_name())),
    }
}

/// Entry `i`'s stream (`stream`, 0 when absent): a handle is a non-negative integer, and another
/// value is a corrupt entry, not the default stream.
fn stream_of(e: &Value, i: usize, action: &str) -> Result<u64, String> {
    stream_field(e, || format!("trace entry {i} ({action})"))
}

/// The `stream` of an entry or segment that `what` names (for the error only).
fn stream_field(e: &Value, what: impl Fn() -> String) -> Result<u64, String> {
    match e.get("stream") {
        None => Ok(0),
        Some(v) => match v.as_int() {
            Some(s) => u64::try_from(s).map_err(|_| format!("{}: 'stream' is {s}, not a stream handle", what())),
            None => Err(format!("{}: 'stream' is {}, not an integer", what(), v.type_name())),
        },
    }
}

/// Frames examined for a site: the user's code is near the top of a stack, and a hostile pickle
/// can share one huge frame list among every entry.
const SITE_FRAMES: usize = 256;

/// The allocation site of a trace entry: its first Python frame outside torch's own files (with
/// `stacks="all"`, the default of `_record_memory_history`, C++ frames of the allocator come
/// first), else its first frame outside torch, else its first frame.
fn site_of(entry: &Value) -> Option<String> {
    let frames = entry.get("frames")?.items_prefix(SITE_FRAMES)?;
    let file_of = |f: &Value| f.get("filename").and_then(|x| x.as_str().map(str::to_string));
    let outside_torch = |name: &str| !name.contains("/torch/") && !name.starts_with("torch/");
    let pick = frames
        .iter()
        .find(|f| file_of(f).is_some_and(|n| n.ends_with(".py") && outside_torch(&n)))
        .or_else(|| frames.iter().find(|f| file_of(f).is_some_and(|n| outside_torch(&n) && n != "??" && !n.is_empty())))
        .or(frames.first())?;
    let file = pick.get("filename")?.as_str()?.rsplit('/').next()?.to_string();
    let line = pick.get("line").and_then(|l| l.as_int()).unwrap_or(0);
    let name = pick.get("name").and_then(|n| n.as_str().map(str::to_string)).unwrap_or_default();
    Some(Sites::name(&file, line.max(0) as u64, &name))
}

/// Reads a PyTorch memory snapshot: the pickle `torch.cuda.memory._dump_snapshot()` writes, or
/// the same dict saved as JSON (`json.dump(torch.cuda.memory._snapshot(), f)`), told apart by
/// their first byte (a pickle opens with its PROTO opcode, JSON with `{` or `[`), whatever the name.
pub fn import_snapshot(path: &Path) -> Result<ImportedTrace, InputError> {
    import_snapshot_of_device(path, None)
}

/// [`import_snapshot`], of device `device`'s history (`None`: the first device that has one).
pub fn import_snapshot_of_device(path: &Path, device: Option<usize>) -> Result<ImportedTrace, InputError> {
    let data = crate::files::read_bytes_at_most(path, MAX_SNAPSHOT_BYTES, "a snapshot")?;
    if data.starts_with(b"PK\x03\x04") {
        return Err(err(path, "a zip archive (what torch.save writes), not a snapshot: write it with torch.cuda.memory._dump_snapshot(path), or pickle.dump(torch.cuda.memory._snapshot(), f)"));
    }
    // (A JSON file some editors saved with a byte-order mark is JSON all the same.)
    let text = data.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&data);
    if text.iter().all(u8::is_ascii_whitespace) {
        return Err(err(path, "is empty: not a snapshot"));
    }
    let root = if text.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|b| matches!(b, b'{' | b'[')) {
        let json: serde_json::Value = serde_json::from_slice(text).map_err(|e| err(path, format!("not readable JSON: {e}")))?;
        Value::from_json(&json)
    } else {
        pickle::parse(&data).map_err(|m| err(path, format!("not a readable pickle: {m}")))?
    };
    from_snapshot_value_of_device(&root, device).map_err(|m| err(path, m))
}

/// Segments of private pools (`segment_pool_id` not (0, 0): CUDA graphs, MemPools) on `device` at the
/// snapshot: the trace does not say when allocations were routed to a pool, so they replay in the
/// allocator's own pools, and the import says so.
fn private_pool_note(root: &Value, device: usize, notes: &mut Vec<String>) {
    let Some(segments) = root.get("segments").and_then(|s| s.items()) else { return };
    let private: Vec<&Value> = segments
        .iter()
        .filter(|s| int(s, "device").is_none_or(|d| d == device as i128))
        .filter(|s| s.get("segment_pool_id").and_then(|p| p.items()).is_some_and(|p| p.iter().any(|x| x.as_int().is_some_and(|v| v != 0))))
        .collect();
    if private.is_empty() {
        return;
    }
    let bytes: i128 = private.iter().filter_map(|s| int(s, "total_size")).sum();
    notes.push(format!(
        "{} segments ({} bytes) were in private pools (CUDA graphs, MemPools) at the snapshot: the history does not say when allocations went to a pool, so they replay in the allocator's own pools (capture the script with `allocbench capture` to keep them apart)",
        private.len(),
        bytes.max(0)
    ));
}

/// Says how much the snapshot's segments on `device` held in segments reserved before the history
/// began (a warm-up, or recording started late): no `segment_alloc` made them and none of the
/// blocks the replay allocates at the start (`at_start`, sorted) was in them, so the replay
/// reserves only what the history needs, and can read lower than the snapshot. (Private-pool
/// segments are said apart.)
fn preexisting_segments_note(root: &Value, device: usize, allocated: &[(u64, u64)], at_start: &[i128], notes: &mut Vec<String>) {
    let Some(segments) = root.get("segments").and_then(|s| s.items()) else { return };
    let made: FxHashSet<u64> = allocated.iter().map(|a| a.0).collect();
    let (mut n, mut bytes) = (0u64, 0i128);
    for seg in &segments {
        let private = seg.get("segment_pool_id").and_then(|p| p.items()).is_some_and(|p| p.iter().any(|x| x.as_int().is_some_and(|v| v != 0)));
        let expandable = matches!(seg.get("is_expandable"), Some(Value::Bool(true)));
        let (Some(address), Some(size)) = (int(seg, "address"), int(seg, "total_size")) else { continue };
        if private || expandable || int(seg, "device").is_some_and(|d| d != device as i128) || made.contains(&(address.max(0) as u64)) {
            continue;
        }
        let first_inside = at_start.partition_point(|&a| a < address);
        if at_start.get(first_inside).is_none_or(|&a| a >= address + size) {
            n += 1;
            bytes += size.max(0);
        }
    }
    if n > 0 {
        notes.push(format!(
            "{} ({bytes} bytes) the snapshot holds {} reserved before the history began and {} not replayed: the replay reserves what the history needs, so its reserved can read lower than the snapshot's",
            crate::units::count(n, "segment"),
            if n == 1 { "was" } else { "were" },
            if n == 1 { "is" } else { "are" }
        ));
    }
}

/// Trace actions that neither allocate nor free: markers and annotations (`snapshot`,
/// `user_defined`, and `annotate` from torch.cuda.memory._record_annotation).
const MARKER_ACTIONS: [&str; 3] = ["snapshot", "user_defined", "annotate"];

/// Where a run of segment releases (`segment_free`/`segment_unmap`) came from, as far as its
/// entries tell: the frames of its first entry, whether any entry names empty_cache, and whether
/// the first carries the frames its segment was allocated with.
struct ReleaseRun {
    frames: Option<Value>,
    names_empty_cache: bool,
    frames_of_its_segment: bool,
    /// (stream, size) of each segment the run cudaFree'd.
    freed: Vec<(i128, i128)>,
}

impl ReleaseRun {
    /// Whether one of the freed segments, wholly free in the cache, would have served `next`'s
    /// cudaMalloc (a `segment_alloc` on the same stream, no larger, in the same pool: 2 MiB
    /// segments are the small pool's): then that malloc never called cudaMalloc, so it never
    /// failed and retried, and the run was an empty_cache. Only under an unlimited
    /// max_split_size, where get_free_block takes any large enough block of the pool
    /// (c10/cuda/CUDACachingAllocator.cpp; a max_split_size leaves oversize blocks unused).
    fn could_have_served(&self, next: &Value, max_split_set: bool) -> bool {
        const SMALL_SEGMENT: i128 = 2 << 20;
        if max_split_set || action_of(next) != "segment_alloc" {
            return false;
        }
        let (Some(size), stream) = (int(next, "size"), int(next, "stream").unwrap_or(0)) else { return false };
        self.freed.iter().any(|&(s, freed)| s == stream && freed >= size && (freed == SMALL_SEGMENT) == (size == SMALL_SEGMENT))
    }
}

/// A frame as (file, line, function).
type FrameKey = (Option<String>, Option<i128>, Option<String>);

/// The first frames of a frame list.
fn frame_keys(frames: &Value) -> Option<Vec<FrameKey>> {
    let items = frames.items_prefix(SITE_FRAMES)?;
    let text = |f: &Value, k: &str| f.get(k).and_then(|v| v.as_str().map(str::to_string));
    Some(items.iter().map(|f| (text(f, "filename"), int(f, "line"), text(f, "name"))).collect())
}

/// Whether a release run and the allocation after it can be one malloc's: PyTorch records both
/// with that malloc's context, so where both carry frames they are the same frames.
/// `context_below_all`: recorded with context="alloc" (see [`recorded_below_all`]): a malloc's
/// retry still carries that malloc's frames, but empty_cache gathers no context, so c10's
/// release_block records the segment's own allocation frames (or none, for a segment allocated
/// before recording).
fn same_malloc(run: &ReleaseRun, next: &Value, context_below_all: bool) -> bool {
    if run.names_empty_cache || (context_below_all && (run.frames_of_its_segment || frames_of(run.frames.as_ref()).is_none())) {
        return false;
    }
    match (frames_of(run.frames.as_ref()), frames_of(next.get("frames").as_ref())) {
        (Some(a), Some(b)) => a == b,
        _ => true, // no frames to tell by: a release right before an allocation is taken for its retry
    }
}

/// A trace entry's action ("" when it has none, or not a string).
fn action_of(e: &Value) -> String {
    e.get("action").and_then(|a| a.as_str().map(str::to_string)).unwrap_or_default()
}

/// Whether the history was recorded with context below "all": frees carry no frames of their own.
/// With context="alloc", c10's free() records the block's allocation context, so every free that
/// has frames has exactly those of its block's allocation; with "all", the free's own.
fn recorded_below_all(trace: &[Value]) -> bool {
    let mut alloc_frames: FxHashMap<i128, Option<u64>> = FxHashMap::default();
    let (mut allocs_with_frames, mut frees_with_own_frames) = (false, false);
    for e in trace {
        let frames = frames_digest(e.get("frames").as_ref());
        match action_of(e).as_str() {
            "alloc" => {
                allocs_with_frames |= frames.is_some();
                if let Some(addr) = int(e, "addr") {
                    alloc_frames.insert(addr, frames);
                }
            }
            "free_requested" | "free_completed" if frames.is_some() => {
                let allocated_with = int(e, "addr").and_then(|a| alloc_frames.get(&a).cloned().flatten());
                // (A block allocated before the history tells nothing.)
                frees_with_own_frames |= allocated_with.is_some_and(|a| Some(a) != frames);
            }
            _ => {}
        }
    }
    allocs_with_frames && !frees_with_own_frames
}

/// A digest of an entry's frames (what [`frames_of`] compares), when it has any, without copying
/// them: the history holds one per allocation, and copies of deep stacks (`stacks="all"`) were
/// most of an import's memory and time.
fn frames_digest(frames: Option<&Value>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let items = frames?.items_prefix(SITE_FRAMES)?;
    if items.is_empty() {
        return None;
    }
    let mut h = rustc_hash::FxHasher::default();
    for f in &items {
        f.get("filename").as_ref().and_then(Value::as_str).hash(&mut h);
        f.get("line").as_ref().and_then(Value::as_int).hash(&mut h);
        f.get("name").as_ref().and_then(Value::as_str).hash(&mut h);
    }
    Some(h.finish())
}

/// An entry's frames, when it has any.
fn frames_of(v: Option<&Value>) -> Option<Vec<FrameKey>> {
    v.and_then(frame_keys).filter(|k| !k.is_empty())
}

fn names_empty_cache(entry: &Value) -> bool {
    entry.get("frames").and_then(|f| f.items_prefix(SITE_FRAMES)).is_some_and(|frames| {
        frames.iter().any(|f| f.get("name").and_then(|n| n.as_str().map(|n| n.contains("empty_cache") || n.contains("emptyCache"))).unwrap_or(false))
    })
}

/// The allocator settings the snapshot was recorded under (`allocator_settings`, torch ≥ 2.5),
/// as a PYTORCH_CUDA_ALLOC_CONF string, when they are not PyTorch's defaults.
fn recorded_settings(root: &Value) -> Option<String> {
    let settings = root.get("allocator_settings")?;
    if let Some(conf) = settings.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|c| c.as_str().map(|c| c.trim().to_string())) {
        if !conf.is_empty() {
            return Some(conf);
        }
    }
    let mut parts = Vec::new();
    if settings.get("expandable_segments").and_then(|v| v.as_int()) == Some(1) {
        parts.push("expandable_segments:True".to_string());
    }
    // max_split_size is SIZE_MAX (or −1 as Python shows it) when unset.
    if let Some(m) = int(&settings, "max_split_size").filter(|&m| m > 0 && m < u64::MAX as i128) {
        parts.push(format!("max_split_size_mb:{}", m / (1 << 20)));
    }
    if let Some(Value::Float(t)) = settings.get("garbage_collection_threshold") {
        if t > 0.0 {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The blocks the snapshot's segments on `device` hold allocated (or waiting for their events)
/// that the history never allocated: (address, requested bytes, stream, the block).
fn allocated_before_history(root: &Value, device: usize, seen: &FxHashMap<i128, ()>) -> Result<Vec<(i128, i128, u64, Value)>, String> {
    let Some(segments) = root.get("segments").and_then(|s| s.items()) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (k, seg) in segments.into_iter().enumerate() {
        if int(&seg, "device").is_some_and(|d| d != device as i128) {
            continue;
        }
        let stream = stream_field(&seg, || format!("segment {k}"))?;
        // Blocks tile their segment in address order: before torch 2.1 they carried no address
        // (MemoryViz adds up the sizes from the segment's), and their request and frames were in
        // `history[0]` (`real_size`, `frames`; _memory_viz._block_extra_legacy).
        let mut next_address = int(&seg, "address");
        for b in seg.get("blocks").and_then(|b| b.items()).unwrap_or_default() {
            let size = int(&b, "size");
            let legacy = b.get("history").and_then(|h| h.items()).and_then(|h| h.into_iter().next());
            let address = int(&b, "address").or_else(|| legacy.as_ref().and_then(|h| int(h, "addr"))).or(next_address);
            next_address = address.zip(size).map(|(a, s)| a + s);
            let state = b.get("state").and_then(|s| s.as_str().map(str::to_string)).unwrap_or_default();
            if !matches!(state.as_str(), "active_allocated" | "active_pending_free") {
                continue;
            }
            let (Some(addr), Some(size)) = (address, size) else { continue };
            if seen.contains_key(&addr) {
                continue;
            }
            let requested = int(&b, "requested_size").or_else(|| legacy.as_ref().and_then(|h| int(h, "real_size")));
            let requested = requested.filter(|&r| r > 0 && r <= size).unwrap_or(size);
            if requested > 0 && requested < crate::units::MAX_REQUEST_BYTES as i128 {
                out.push((addr, requested, stream, if b.get("frames").is_none() { legacy.unwrap_or(b) } else { b }));
            }
        }
    }
    Ok(out)
}

pub fn from_snapshot_value(root: &Value) -> Result<ImportedTrace, String> {
    from_snapshot_value_of_device(root, None)
}

/// [`from_snapshot_value`] of device `chosen`'s history (`None`: the first device that has one).
pub fn from_snapshot_value_of_device(root: &Value, chosen: Option<usize>) -> Result<ImportedTrace, String> {
    if let Some(items) = root.items() {
        if !items.is_empty() && items.iter().all(|s| s.get("total_size").is_some() || s.get("blocks").is_some()) {
            return Err("an older snapshot layout (a bare list of segments, before torch 2.1) has no allocation trace: re-record it with torch.cuda.memory._record_memory_history()".into());
        }
        return Err(format!(
            "not a PyTorch memory snapshot: the file holds a {}-item {}, not the dict torch.cuda.memory._snapshot() returns",
            items.len(),
            if matches!(root, Value::Tuple(_)) { "tuple" } else { "list" }
        ));
    }
    if !matches!(root, Value::Dict(_)) {
        return Err(format!("not a PyTorch memory snapshot: the file holds {}, not the dict torch.cuda.memory._snapshot() returns", root.type_name()));
    }
    let traces = match root.get("device_traces") {
        None => return Err("not a PyTorch memory snapshot: no 'device_traces' (expected the pickle written by torch.cuda.memory._dump_snapshot())".into()),
        Some(t) => t.items().ok_or_else(|| format!("'device_traces' is {}, not the list of one history per device torch writes", t.type_name()))?,
    };
    if let Some((i, t)) = traces.iter().enumerate().find(|(_, t)| t.items().is_none()) {
        return Err(format!("device_traces[{i}] is {}, not a list of trace entries", t.type_name()));
    }
    // (A look at each history's first entry: not a copy of every device's history.)
    let recorded: Vec<usize> = (0..traces.len()).filter(|&i| traces[i].items_prefix(1).is_some_and(|v| !v.is_empty())).collect();
    let device = match chosen {
        None => *recorded
            .first()
            .ok_or("the snapshot's device_traces are empty: record with torch.cuda.memory._record_memory_history(enabled='all') before dumping")?,
        Some(d) if recorded.contains(&d) => d,
        Some(d) => {
            let with = recorded.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
            return Err(format!(
                "--snapshot-device {d}: the snapshot has no history for device {d} (devices with one: {})",
                if with.is_empty() { "none".to_string() } else { with }
            ));
        }
    };
    let trace = traces[device].items().unwrap_or_default();
    if let Some((i, e)) = trace.iter().enumerate().find(|(_, e)| !matches!(e, Value::Dict(_))) {
        return Err(format!("trace entry {i} is {}, not a dict", e.type_name()));
    }
    let mut out = ImportedTrace { format: "pytorch-snapshot", ..Default::default() };
    private_pool_note(root, device, &mut out.notes);
    let with_history = recorded.len();
    out.device_of_several = (with_history > 1).then_some(device);
    out.recorded_devices = recorded.clone();
    if chosen.is_some() {
        out.notes.push(format!("imported device {device}'s history (--snapshot-device)"));
    } else if with_history > 1 {
        out.notes.push(format!(
            "{with_history} devices have histories: imported device {device}'s, the first (the others are not replayed; --snapshot-device N picks another)"
        ));
    } else if device > 0 {
        out.notes.push(format!("imported device {device}'s history (the only one recorded)"));
    }
    if let Some(conf) = recorded_settings(root) {
        out.notes.push(format!("the snapshot was recorded under the allocator settings {conf}; replays use PyTorch's defaults unless given --conf '{conf}'"));
    }
    // Blocks freed before the trace allocated them: the ring buffer dropped their alloc.
    let mut seen: FxHashMap<i128, ()> = FxHashMap::default();
    let mut prelude: Vec<(i128, i128, u64)> = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        let action = action_of(e);
        let Some(addr) = int(e, "addr") else { continue };
        match action.as_str() {
            "alloc" => {
                seen.insert(addr, ());
            }
            "free_requested" | "free_completed" if !seen.contains_key(&addr) => {
                seen.insert(addr, ());
                let size = int(e, "size").unwrap_or(512).max(1);
                // The same bound as an alloc's (a size of 2^70 once wrapped to 0 bytes here).
                if size >= crate::units::MAX_REQUEST_BYTES as i128 {
                    return Err(format!("trace entry {i}: {action} of a {size}-byte block"));
                }
                prelude.push((addr, size, stream_of(e, i, &action)?));
            }
            _ => {}
        }
    }
    let mut next_id: u64 = 0;
    let mut live: FxHashMap<i128, u64> = FxHashMap::default();
    let mut site_ids: FxHashMap<String, u32> = FxHashMap::default();
    // Blocks live at the snapshot that the history never allocated or freed: allocated before it.
    let before = allocated_before_history(root, device, &seen)?;
    // Blocks the replay allocates at the start: the segments that held them are replayed then.
    let mut at_start: Vec<i128> = before.iter().map(|b| b.0).chain(prelude.iter().map(|p| p.0)).collect();
    at_start.sort_unstable();
    if !before.is_empty() {
        let bytes: i128 = before.iter().map(|b| b.1).sum();
        out.notes.push(format!(
            "{} ({} bytes) the snapshot holds {} allocated before the history began (the model's weights, often): allocated at the start",
            crate::units::count(before.len() as u64, "block"),
            bytes,
            if before.len() == 1 { "was" } else { "were" }
        ));
        for (addr, size, stream, block) in before {
            live.insert(addr, next_id);
            if let Some(site) = site_of(&block) {
                let sid = out.sites.intern(site, &mut site_ids);
                out.sites.of_id.insert(next_id, sid);
            }
            out.events.push(Event::Alloc { id: next_id, bytes: size as u64, stream });
            next_id += 1;
        }
    }
    if !prelude.is_empty() {
        out.truncated = true;
        out.notes.push(format!(
            "the history is truncated (the ring buffer was full): {} blocks freed in it were allocated before its first entry; they are allocated at the start",
            prelude.len()
        ));
        for (addr, size, stream) in prelude {
            live.insert(addr, next_id);
            out.events.push(Event::Alloc { id: next_id, bytes: size as u64, stream });
            next_id += 1;
        }
    }
    let context_below_all = recorded_below_all(&trace);
    let max_split_set = recorded_settings(root).is_some_and(|conf| conf.contains("max_split_size_mb"));
    // _record_memory_history(skip_actions=["free_completed"]) records frees only as requested:
    // each then completes where it was requested (a wait for another stream is not seen).
    let no_free_completed = trace.iter().any(|e| action_of(e) == "free_requested") && !trace.iter().any(|e| action_of(e) == "free_completed");
    if no_free_completed {
        out.notes.push(
            "the history records no free_completed (recorded with skip_actions=[\"free_completed\"]?): each free completes where it was requested, so frees that waited for another stream's work (record_stream) are not seen".into(),
        );
    }
    // An OOM after which nothing is allocated ended the run (or was dumped as it happened); one
    // followed by allocations was caught, and the script went on without it.
    let last_alloc = trace.iter().rposition(|e| action_of(e) == "alloc");
    // The frames each segment was allocated (or mapped) with, by address.
    let mut segment_frames: FxHashMap<i128, Vec<FrameKey>> = FxHashMap::default();
    let mut release: Option<ReleaseRun> = None;
    let mut skipped_unknown = 0usize;
    // Allocations at the address of a live one: the earlier one's free is not in the history.
    let mut freed_unseen = 0usize;
    let mut unknown_actions: Vec<(String, usize)> = Vec::new();
    // (entry, rounded size, device_free) of each recorded out-of-memory error.
    let mut ooms: Vec<(usize, i128, Option<i128>)> = Vec::new();
    // Blocks whose free waits for another stream: address → the side stream standing for it.
    let mut waiting: FxHashMap<i128, u64> = FxHashMap::default();
    let mut next_side_stream = SIDE_STREAM_BASE;
    // free_completed entries already replayed with their free_requested.
    let mut completed_inline: FxHashMap<i128, ()> = FxHashMap::default();
    // Blocks whose waiting free completed since the last allocating entry: a malloc's retry
    // (release_cached_blocks) first completes such frees (synchronize_and_free_events), so their
    // segments were not free when get_free_block looked (see ReleaseRun::could_have_served).
    let mut completed_late: Vec<i128> = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        let action = match e.get("action") {
            None => return Err(format!("trace entry {i} has no 'action'")),
            Some(a) => a.as_str().map(str::to_string).ok_or_else(|| format!("trace entry {i}: 'action' is {}, not a str", a.type_name()))?,
        };
        let is_segment_release = matches!(action.as_str(), "segment_free" | "segment_unmap");
        let allocating = matches!(action.as_str(), "alloc" | "segment_alloc" | "segment_map" | "oom");
        // Whether a release run ends here as this entry's malloc retrying (its cache flush).
        let mut retry_flushed_here = false;
        if let Some(run) = release.as_ref().filter(|_| !is_segment_release) {
            let allocates = matches!(action.as_str(), "segment_alloc" | "segment_map" | "oom");
            retry_flushed_here = allocates && !run.could_have_served(e, max_split_set) && same_malloc(run, e, context_below_all);
            if !retry_flushed_here {
                out.events.push(Event::EmptyCache);
            }
            release = None;
        }
        if allocating {
            completed_late.clear();
        }
        match action.as_str() {
            "alloc" => {
                let addr = required_int(e, "addr", i, &action)?;
                let size = required_int(e, "size", i, &action)?;
                // Requests under 1 EiB are the allocator's to refuse (units::MAX_REQUEST_BYTES).
                if size <= 0 || size >= crate::units::MAX_REQUEST_BYTES as i128 {
                    let why = if size <= 0 { "a size must be positive" } else { "1 EiB or more, larger than any request a device allocator serves" };
                    return Err(format!("trace entry {i}: alloc of {size} bytes: {why}"));
                }
                let stream = stream_of(e, i, &action)?;
                if let Some(side) = waiting.remove(&addr) {
                    // Allocated again: its free completed (its free_completed was not recorded).
                    out.events.push(Event::Sync { stream: Some(side) });
                }
                if let Some(old) = live.insert(addr, next_id) {
                    // Allocated twice without a free_completed in between (a free still pending
                    // when recording stopped, or an entry lost): free the old one first.
                    out.events.push(Event::Free { id: old });
                    freed_unseen += 1;
                }
                if let Some(site) = site_of(e) {
                    let sid = out.sites.intern(site, &mut site_ids);
                    out.sites.of_id.insert(next_id, sid);
                }
                out.events.push(Event::Alloc { id: next_id, bytes: size as u64, stream });
                next_id += 1;
            }
            "free_requested" => {
                let addr = required_int(e, "addr", i, &action)?;
                let Some(id) = live.remove(&addr) else {
                    skipped_unknown += 1;
                    continue;
                };
                let next = trace.get(i + 1);
                let completes_now = next
                    .is_some_and(|n| n.get("action").and_then(|a| a.as_str().map(|a| a == "free_completed")).unwrap_or(false) && int(n, "addr") == Some(addr));
                if no_free_completed {
                    // Completes here (see no_free_completed).
                } else if completes_now {
                    completed_inline.insert(addr, ());
                } else {
                    // free → insert_events: the block waits for an event on a stream that used it.
                    out.events.push(Event::RecordStream { id, stream: next_side_stream });
                    waiting.insert(addr, next_side_stream);
                    next_side_stream += 1;
                }
                out.events.push(Event::Free { id });
            }
            "free_completed" => {
                let addr = required_int(e, "addr", i, &action)?;
                if completed_inline.remove(&addr).is_some() {
                    continue;
                }
                if let Some(side) = waiting.remove(&addr) {
                    out.events.push(Event::Sync { stream: Some(side) });
                    completed_late.push(addr);
                    continue;
                }
                match live.remove(&addr) {
                    Some(id) => out.events.push(Event::Free { id }),
                    None => skipped_unknown += 1,
                }
            }
            _ if is_segment_release => {
                let names = names_empty_cache(e);
                match release.as_mut() {
                    Some(run) => run.names_empty_cache |= names,
                    None => {
                        let own = int(e, "addr").and_then(|a| segment_frames.get(&a));
                        let frames_of_its_segment = own.is_some_and(|own| frames_of(e.get("frames").as_ref()).as_ref() == Some(own));
                        release = Some(ReleaseRun { frames: e.get("frames"), names_empty_cache: names, frames_of_its_segment, freed: Vec::new() })
                    }
                }
                if let (Some(run), "segment_free", Some(size)) = (release.as_mut(), action.as_str(), int(e, "size")) {
                    let start = int(e, "addr").unwrap_or(-1);
                    if !completed_late.iter().any(|&a| a >= start && a < start + size) {
                        run.freed.push((int(e, "stream").unwrap_or(0), size));
                    }
                }
            }
            "segment_alloc" | "segment_map" => {
                if let (Some(addr), Some(frames)) = (int(e, "addr"), frames_of(e.get("frames").as_ref())) {
                    segment_frames.insert(addr, frames);
                }
                if let (true, Some(addr), Some(size)) = (action == "segment_alloc", int(e, "addr"), int(e, "size")) {
                    out.segment_addresses.push((addr.max(0) as u64, size.max(0) as u64));
                }
            }
            "oom" => {
                // TraceEntry::OOM: `size` is the rounded request, `addr` (or `device_free`) what
                // cudaMemGetInfo said was free.
                let size = required_int(e, "size", i, &action)?;
                if size <= 0 || size >= crate::units::MAX_REQUEST_BYTES as i128 {
                    return Err(format!("trace entry {i}: out-of-memory error of a {size}-byte request"));
                }
                ooms.push((i, size, int(e, "device_free").or_else(|| int(e, "addr"))));
                if last_alloc.is_some_and(|last| last > i) {
                    // Caught: noted below, not replayed; but its retry's cache flush happened.
                    if retry_flushed_here {
                        out.events.push(Event::EmptyCache);
                    }
                    continue;
                }
                if let Some(site) = site_of(e) {
                    let sid = out.sites.intern(site, &mut site_ids);
                    out.sites.of_id.insert(next_id, sid);
                }
                out.events.push(Event::Alloc { id: next_id, bytes: size as u64, stream: stream_of(e, i, &action)? });
                out.events.push(Event::Free { id: next_id });
                next_id += 1;
            }
            a if MARKER_ACTIONS.contains(&a) => {}
            other => match unknown_actions.iter_mut().find(|(a, _)| a == other) {
                Some((_, n)) => *n += 1,
                None => unknown_actions.push((other.to_string(), 1)),
            },
        }
    }
    if release.is_some() {
        out.events.push(Event::EmptyCache);
    }
    preexisting_segments_note(root, device, &out.segment_addresses, &at_start, &mut out.notes);
    let (ended, caught): (Vec<_>, Vec<_>) = ooms.iter().partition(|(entry, ..)| last_alloc.is_none_or(|last| last <= *entry));
    if let Some((entry, size, free)) = ended.first() {
        let free = free.map(|f| format!(", with {f} bytes free on the device")).unwrap_or_default();
        let (what, each) = if ended.len() == 1 {
            ("an out-of-memory error".to_string(), "the failed request is")
        } else {
            (format!("{} out-of-memory errors", ended.len()), "each failed request is")
        };
        out.notes.push(format!(
            "the history ends with {what} (trace entry {entry}: a {size}-byte request{free}): {each} replayed where it was made, allocated and freed at once"
        ));
    }
    if let Some((entry, size, _)) = caught.first() {
        out.notes.push(format!(
            "{} the script caught (allocations follow; the first at trace entry {entry}, a {size}-byte request) {} not replayed",
            crate::units::count(caught.len() as u64, "out-of-memory error"),
            if caught.len() == 1 { "is" } else { "are" }
        ));
    }
    for (action, n) in unknown_actions {
        out.notes.push(format!("{n} trace entr{} with the unknown action '{action}' skipped", if n == 1 { "y" } else { "ies" }));
    }
    if skipped_unknown > 0 {
        out.notes.push(format!("{} of unknown blocks skipped", crate::units::count(skipped_unknown as u64, "free")));
    }
    if freed_unseen > 0 {
        out.notes.push(format!(
            "{} at the address of a live block: the history lacks the earlier block's free, so it is freed just before",
            crate::units::count(freed_unseen as u64, "alloc")
        ));
    }
    if !live.is_empty() {
        out.notes.push(format!("{} still allocated when the snapshot was taken", crate::units::count(live.len() as u64, "block")));
    }
    out.notes.dedup();
    Ok(out)
}

/// Reads an RMM `logging_resource_adaptor` CSV log (`Thread,Time,Action,Pointer,Size,Stream`),
/// plain or gzip-compressed. A failed allocation (`allocate failure`, whose pointer RMM prints
/// as `(nil)` or `0x0`) is skipped and counted.
pub fn import_rmm_log(path: &Path) -> Result<ImportedTrace, InputError> {
    let text = crate::files::read_bytes_at_most(path, MAX_SNAPSHOT_BYTES, "an RMM log")?;
    let text = String::from_utf8(text).map_err(|_| err(path, "not valid UTF-8 text"))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // RMM buffers its log (auto_flush is off by default): a process that died leaves a cut row.
    let cut_last = (!text.ends_with('\n')).then(|| text.lines().count());
    let mut out = ImportedTrace { format: "rmm-log", ..Default::default() };
    // Pointers of 0-byte allocations (nothing to replay): their frees are not unknown.
    let mut empty: FxHashSet<u64> = FxHashSet::default();
    let mut cols: Option<(FxHashMap<String, usize>, usize)> = None;
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let mut next_id = 0u64;
    let (mut failures, mut unknown_frees, mut double_frees, mut reallocated, mut null_allocs) = (0u64, 0u64, 0u64, 0u64, 0u64);
    // Pointers freed and not allocated again: a second free of one is a double free.
    let mut freed: FxHashSet<u64> = FxHashSet::default();
    for (n, line) in text.lines().enumerate() {
        let loc = || format!("{}:{}", path.display(), n + 1);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let Some((c, width)) = &cols else {
            let map: FxHashMap<String, usize> = fields.iter().enumerate().map(|(i, f)| (f.to_ascii_lowercase(), i)).collect();
            for need in ["action", "pointer", "size"] {
                if !map.contains_key(need) {
                    return Err(InputError::new(loc(), format!("an RMM log header needs a '{need}' column (Thread,Time,Action,Pointer,Size,Stream)")));
                }
            }
            cols = Some((map, fields.len()));
            continue;
        };
        if cut_last == Some(n + 1) {
            // RMM ends every row with a line end: one without was cut, wherever (a stream cut to
            // "0x7f" would parse, as another stream).
            out.notes.push(format!("the last row ({}) has no line end (the log was cut): skipped", loc()));
            break;
        }
        if fields.len() != *width {
            return Err(InputError::new(loc(), format!("{} fields where the header has {width}", fields.len())));
        }
        let get = |k: &str| c.get(k).and_then(|&i| fields.get(i)).copied().unwrap_or("");
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x").trim_start_matches("0X"), 16);
        let ptr_s = get("pointer");
        // glibc's printf prints a null %p as "(nil)" (RMM's failed allocations).
        let ptr = if ptr_s == "(nil)" { Ok(0) } else { hex(ptr_s) }.map_err(|_| InputError::new(loc(), format!("bad pointer '{ptr_s}'")))?;
        let size: u64 = get("size").parse().map_err(|_| InputError::new(loc(), format!("bad size '{}'", get("size"))))?;
        let stream = match get("stream") {
            "" if !c.contains_key("stream") => 0,
            s => hex(s).map_err(|_| InputError::new(loc(), format!("bad stream '{s}' (expected a hexadecimal handle such as 0x0)")))?,
        };
        match get("action").to_ascii_lowercase().as_str() {
            "allocate" => {
                if size == 0 {
                    empty.insert(ptr);
                    continue;
                }
                // A null pointer holds nothing (no upstream hands one out for a served request):
                // replayed, each would look like a reuse of the last one.
                if ptr == 0 {
                    null_allocs += 1;
                    continue;
                }
                // (A failed allocation may log any size: a negative one cast to size_t.)
                if size >= crate::units::MAX_REQUEST_BYTES {
                    return Err(InputError::new(loc(), format!("size {size}: 1 EiB or more, larger than any request a device allocator serves")));
                }
                freed.remove(&ptr);
                if let Some(old) = live.insert(ptr, next_id) {
                    reallocated += 1;
                    out.events.push(Event::Free { id: old });
                }
                out.events.push(Event::Alloc { id: next_id, bytes: size, stream });
                next_id += 1;
            }
            "free" => match live.remove(&ptr) {
                Some(id) => {
                    freed.insert(ptr);
                    out.events.push(Event::Free { id });
                }
                // free(nullptr) does nothing, nor does freeing a 0-byte allocation here.
                None if ptr == 0 || empty.remove(&ptr) => {}
                None if freed.contains(&ptr) => double_frees += 1,
                None => unknown_frees += 1,
            },
            "allocate failure" => failures += 1,
            other => return Err(InputError::new(loc(), format!("unknown RMM action '{other}' (expected allocate, free or allocate failure)"))),
        }
    }
    if cols.is_none() {
        return Err(err(path, "empty RMM log"));
    }
    if failures > 0 {
        out.notes.push(format!("{} in the log skipped", crate::units::count(failures, "failed allocation")));
    }
    if null_allocs > 0 {
        out.notes.push(format!("{} with a null pointer skipped (nothing was allocated)", crate::units::count(null_allocs, "allocation")));
    }
    if unknown_frees > 0 {
        out.notes.push(format!(
            "{} skipped: {} never allocated in the log (allocated before it began)",
            crate::units::count(unknown_frees, "free"),
            if unknown_frees == 1 { "its pointer was" } else { "their pointers were" }
        ));
    }
    if double_frees > 0 {
        out.notes.push(format!("{} skipped: a second free of a pointer already freed (a double free in the log)", crate::units::count(double_frees, "free")));
    }
    if reallocated > 0 {
        out.notes.push(format!(
            "{} reused a pointer still live in the log (no free logged in between): the earlier allocation is taken as freed there",
            crate::units::count(reallocated, "allocation")
        ));
    }
    if next_id == 0 {
        out.notes.push("the log holds no allocations".into());
    }
    Ok(out)
}

/// Whether a CSV file (plain or gzip) is an RMM log (by its header) rather than our trace format.
pub fn is_rmm_log(path: &Path) -> bool {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open(path) else { return false };
    let mut r = std::io::BufReader::new(f);
    let gzip = r.fill_buf().is_ok_and(|b| b.starts_with(&[0x1f, 0x8b]));
    let r: Box<dyn BufRead> = if gzip { Box::new(std::io::BufReader::new(flate2::read::MultiGzDecoder::new(r))) } else { Box::new(r) };
    // The sniff reads at most the file's first 64 KiB: a first "line" of gigabytes (a file of
    // NUL bytes) is no RMM log, and must not be read whole to say so.
    let mut r = std::io::Read::take(r, 64 << 10);
    let mut first = String::new();
    while r.read_line(&mut first).unwrap_or(0) > 0 {
        let t = first.trim().trim_start_matches('\u{feff}');
        if t.is_empty() || t.starts_with('#') {
            first.clear();
            continue;
        }
        // A header naming RMM's columns, in any order, case or spacing (as the importer reads it).
        let columns: Vec<String> = t.split(',').map(|c| c.trim().to_ascii_lowercase()).collect();
        return ["action", "pointer", "size"].iter().all(|need| columns.iter().any(|c| c == need));
    }
    false
}
