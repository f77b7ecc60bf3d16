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
//! allocates one); `oom`, `snapshot` and the other segment actions are the allocator's decisions,
//! which the replay re-makes. Streams are kept. A history whose first entries free blocks it never
//! allocated was truncated (the ring buffer was full): those blocks are allocated at the start, and
//! the import says so.

use std::path::Path;

use rustc_hash::FxHashMap;

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

/// The allocation site of a trace entry: its first frame outside torch's own files.
fn site_of(entry: &Value) -> Option<String> {
    let frames = entry.get("frames")?.items()?;
    let pick = frames.iter().find(|f| f.get("filename").and_then(|x| x.as_str().map(|s| !s.contains("/torch/"))).unwrap_or(false)).or(frames.first())?;
    let file = pick.get("filename")?.as_str()?.rsplit('/').next()?.to_string();
    let line = pick.get("line").and_then(|l| l.as_int()).unwrap_or(0);
    let name = pick.get("name").and_then(|n| n.as_str().map(str::to_string)).unwrap_or_default();
    Some(Sites::name(&file, line.max(0) as u64, &name))
}

/// Reads a PyTorch memory snapshot: the pickle `torch.cuda.memory._dump_snapshot()` writes, or
/// the same dict saved as JSON (`json.dump(torch.cuda.memory._snapshot(), f)`), told apart by
/// their first byte (a pickle opens with its PROTO opcode, JSON with `{` or `[`), whatever the name.
pub fn import_snapshot(path: &Path) -> Result<ImportedTrace, InputError> {
    let meta = std::fs::metadata(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    if meta.len() > MAX_SNAPSHOT_BYTES {
        return Err(err(path, format!("{} bytes: larger than any snapshot this importer accepts (2 GiB)", meta.len())));
    }
    let data = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let root = if data.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|b| matches!(b, b'{' | b'[')) {
        let json: serde_json::Value = serde_json::from_slice(&data).map_err(|e| err(path, format!("not readable JSON: {e}")))?;
        Value::from_json(&json)
    } else {
        pickle::parse(&data).map_err(|m| err(path, format!("not a readable pickle: {m}")))?
    };
    from_snapshot_value(&root).map_err(|m| err(path, m))
}

/// Segments of private pools (`segment_pool_id` not (0, 0): CUDA graphs, MemPools) at the
/// snapshot: the trace does not say when allocations were routed to a pool, so they replay in the
/// allocator's own pools, and the import says so.
fn private_pool_note(root: &Value, notes: &mut Vec<String>) {
    let Some(segments) = root.get("segments").and_then(|s| s.items()) else { return };
    let private: Vec<&Value> = segments
        .iter()
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

pub fn from_snapshot_value(root: &Value) -> Result<ImportedTrace, String> {
    if let Value::List(_) = root {
        return Err("an older snapshot layout (a bare list of segments, before torch 2.1) has no allocation trace: re-record it with torch.cuda.memory._record_memory_history()".into());
    }
    let traces = root
        .get("device_traces")
        .and_then(|t| t.items())
        .ok_or("not a PyTorch memory snapshot: no 'device_traces' (expected the pickle written by torch.cuda.memory._dump_snapshot())")?;
    let (device, trace) = traces
        .iter()
        .enumerate()
        .find_map(|(i, t)| t.items().filter(|v| !v.is_empty()).map(|v| (i, v)))
        .ok_or("the snapshot's device_traces are empty: record with torch.cuda.memory._record_memory_history(enabled='all') before dumping")?;
    let mut out = ImportedTrace { format: "pytorch-snapshot", ..Default::default() };
    private_pool_note(root, &mut out.notes);
    if traces.iter().filter(|t| t.items().is_some_and(|v| !v.is_empty())).count() > 1 {
        out.notes.push(format!("several devices have traces: imported device {device}"));
    }
    // Blocks freed before the trace allocated them: the ring buffer dropped their alloc.
    let mut seen: FxHashMap<i128, ()> = FxHashMap::default();
    let mut prelude: Vec<(i128, i128, i128)> = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        let action = e.get("action").and_then(|a| a.as_str().map(str::to_string)).unwrap_or_default();
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
                prelude.push((addr, size, int(e, "stream").unwrap_or(0)));
            }
            _ => {}
        }
    }
    let mut next_id: u64 = 0;
    let mut live: FxHashMap<i128, u64> = FxHashMap::default();
    let mut site_ids: FxHashMap<String, u32> = FxHashMap::default();
    if !prelude.is_empty() {
        out.truncated = true;
        out.notes.push(format!(
            "the history is truncated (the ring buffer was full): {} blocks freed in it were allocated before its first entry; they are allocated at the start",
            prelude.len()
        ));
        for (addr, size, stream) in prelude {
            live.insert(addr, next_id);
            out.events.push(Event::Alloc { id: next_id, bytes: size as u64, stream: stream.max(0) as u64 });
            next_id += 1;
        }
    }
    let mut releasing = false;
    let mut skipped_unknown = 0usize;
    // Blocks whose free waits for another stream: address → the side stream standing for it.
    let mut waiting: FxHashMap<i128, u64> = FxHashMap::default();
    let mut next_side_stream = SIDE_STREAM_BASE;
    // free_completed entries already replayed with their free_requested.
    let mut completed_inline: FxHashMap<i128, ()> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate() {
        let action = e.get("action").and_then(|a| a.as_str().map(str::to_string)).ok_or(format!("trace entry {i} has no 'action'"))?;
        let is_segment_release = matches!(action.as_str(), "segment_free" | "segment_unmap");
        if releasing && !is_segment_release {
            if !matches!(action.as_str(), "segment_alloc" | "segment_map" | "oom") {
                out.events.push(Event::EmptyCache);
            }
            releasing = false;
        }
        match action.as_str() {
            "alloc" => {
                let addr = int(e, "addr").ok_or(format!("trace entry {i} (alloc) has no 'addr'"))?;
                let size = int(e, "size").ok_or(format!("trace entry {i} (alloc) has no 'size'"))?;
                // Requests under 1 EiB are the allocator's to refuse (units::MAX_REQUEST_BYTES).
                if size <= 0 || size >= crate::units::MAX_REQUEST_BYTES as i128 {
                    return Err(format!("trace entry {i}: alloc of {size} bytes"));
                }
                let stream = int(e, "stream").unwrap_or(0).max(0) as u64;
                if let Some(old) = live.insert(addr, next_id) {
                    // Allocated twice without a free_completed in between (a free still pending
                    // when recording stopped): free the old one first.
                    out.events.push(Event::Free { id: old });
                }
                if let Some(site) = site_of(e) {
                    let sid = out.sites.intern(site, &mut site_ids);
                    out.sites.of_id.insert(next_id, sid);
                }
                out.events.push(Event::Alloc { id: next_id, bytes: size as u64, stream });
                next_id += 1;
            }
            "free_requested" => {
                let addr = int(e, "addr").ok_or(format!("trace entry {i} (free_requested) has no 'addr'"))?;
                let Some(id) = live.remove(&addr) else {
                    skipped_unknown += 1;
                    continue;
                };
                let next = trace.get(i + 1);
                let completes_now = next
                    .is_some_and(|n| n.get("action").and_then(|a| a.as_str().map(|a| a == "free_completed")).unwrap_or(false) && int(n, "addr") == Some(addr));
                if completes_now {
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
                let addr = int(e, "addr").ok_or(format!("trace entry {i} (free_completed) has no 'addr'"))?;
                if completed_inline.remove(&addr).is_some() {
                    continue;
                }
                if let Some(side) = waiting.remove(&addr) {
                    out.events.push(Event::Sync { stream: Some(side) });
                    continue;
                }
                match live.remove(&addr) {
                    Some(id) => out.events.push(Event::Free { id }),
                    None => skipped_unknown += 1,
                }
            }
            _ if is_segment_release => releasing = true,
            "segment_alloc" => {
                if let (Some(addr), Some(size)) = (int(e, "addr"), int(e, "size")) {
                    out.segment_addresses.push((addr.max(0) as u64, size.max(0) as u64));
                }
            }
            "segment_map" | "oom" | "snapshot" => {}
            other => out.notes.push(format!("trace entry {i}: unknown action '{other}' skipped")),
        }
    }
    if releasing {
        out.events.push(Event::EmptyCache);
    }
    if skipped_unknown > 0 {
        out.notes.push(format!("{skipped_unknown} frees of unknown blocks were skipped"));
    }
    if !live.is_empty() {
        out.notes.push(format!("{} blocks were still allocated when the snapshot was taken", live.len()));
    }
    out.notes.dedup();
    Ok(out)
}

/// Reads an RMM `logging_resource_adaptor` CSV log (`Thread,Time,Action,Pointer,Size,Stream`).
pub fn import_rmm_log(path: &Path) -> Result<ImportedTrace, InputError> {
    let text = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let text = String::from_utf8(text).map_err(|_| err(path, "not valid UTF-8 text"))?;
    let mut out = ImportedTrace { format: "rmm-log", ..Default::default() };
    let mut cols: Option<FxHashMap<String, usize>> = None;
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let mut next_id = 0u64;
    let mut failures = 0;
    for (n, line) in text.lines().enumerate() {
        let loc = || format!("{}:{}", path.display(), n + 1);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let Some(c) = &cols else {
            let map: FxHashMap<String, usize> = fields.iter().enumerate().map(|(i, f)| (f.to_ascii_lowercase(), i)).collect();
            for need in ["action", "pointer", "size"] {
                if !map.contains_key(need) {
                    return Err(InputError::new(loc(), format!("an RMM log header needs a '{need}' column (Thread,Time,Action,Pointer,Size,Stream)")));
                }
            }
            cols = Some(map);
            continue;
        };
        let get = |k: &str| c.get(k).and_then(|&i| fields.get(i)).copied().unwrap_or("");
        let ptr_s = get("pointer");
        let ptr = u64::from_str_radix(ptr_s.trim_start_matches("0x").trim_start_matches("0X"), 16)
            .map_err(|_| InputError::new(loc(), format!("bad pointer '{ptr_s}'")))?;
        let size: u64 = get("size").parse().map_err(|_| InputError::new(loc(), format!("bad size '{}'", get("size"))))?;
        let stream_s = get("stream");
        let stream = u64::from_str_radix(stream_s.trim_start_matches("0x"), 16).unwrap_or(0);
        match get("action").to_ascii_lowercase().as_str() {
            "allocate" => {
                if size == 0 {
                    continue;
                }
                if let Some(old) = live.insert(ptr, next_id) {
                    out.events.push(Event::Free { id: old });
                }
                out.events.push(Event::Alloc { id: next_id, bytes: size, stream });
                next_id += 1;
            }
            "free" => {
                if let Some(id) = live.remove(&ptr) {
                    out.events.push(Event::Free { id });
                }
            }
            "allocate failure" => failures += 1,
            other => return Err(InputError::new(loc(), format!("unknown RMM action '{other}'"))),
        }
    }
    if cols.is_none() {
        return Err(err(path, "empty RMM log"));
    }
    if failures > 0 {
        out.notes.push(format!("{failures} failed allocations in the log were skipped"));
    }
    Ok(out)
}

/// Whether a CSV file is an RMM log (by its header) rather than our trace format.
pub fn is_rmm_log(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else { return false };
    let mut first = String::new();
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(f);
    while r.read_line(&mut first).unwrap_or(0) > 0 {
        let t = first.trim();
        if t.is_empty() || t.starts_with('#') {
            first.clear();
            continue;
        }
        return t.to_ascii_lowercase().starts_with("thread,time,action");
    }
    false
}
