//! The fidelity check's documents: what `scripts/torch_replay.py` writes (PyTorch's real
//! `memory_stats()` on a trace), what `allocbench fidelity --json` writes, and the oracle's
//! answers (`allocbench oracle`, `fidelity --oracle`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::gpu::SegmentSnapshot;

/// What `scripts/torch_replay.py` writes.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TorchReplay {
    pub format: String,
    pub torch_version: String,
    pub device: String,
    /// `torch.cuda.get_device_properties(0).total_memory`.
    pub total_memory: u64,
    /// `torch.cuda.mem_get_info()` free bytes before the replay: the CUDA context (and any other
    /// process) holds the rest, which the simulated device then withholds too.
    #[serde(default)]
    pub free_memory_at_start: Option<u64>,
    /// (address, size) of every cudaMalloc PyTorch made, in order (from its memory history).
    #[serde(default)]
    pub segment_addresses: Vec<(u64, u64)>,
    /// The PYTORCH_CUDA_ALLOC_CONF it ran with.
    pub conf: String,
    pub events: u64,
    pub oom: Option<TorchOom>,
    /// memory_stats() at each `step` row (before it), in order.
    pub steps: Vec<TorchStep>,
    /// memory_stats() at the end.
    pub r#final: BTreeMap<String, i64>,
    /// The file it was read from (for messages), set by `gpu::fidelity::load_torch`.
    #[serde(skip)]
    pub path: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TorchOom {
    pub event: u64,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TorchStep {
    pub step: u64,
    pub event: u64,
    pub stats: BTreeMap<String, i64>,
}

/// One disagreement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    /// "step N" or "final".
    pub at: String,
    pub key: String,
    pub sim: i64,
    pub torch: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FidelityReport {
    pub conf: String,
    pub torch_version: String,
    pub device: String,
    pub keys_compared: usize,
    pub snapshots_compared: usize,
    pub mismatches: Vec<Mismatch>,
    /// Every target key identical at the end.
    pub target_identical: bool,
    /// How segments were placed: `replay` (the GPU's own addresses), `lowest` or `driver`.
    #[serde(default)]
    pub address_order: String,
    /// cudaMalloc addresses replayed from PyTorch's history, and mallocs that could not follow them.
    pub addresses_replayed: usize,
    pub address_misses: u64,
}

/// The real allocator's answer, in the shape `replay --json` writes where it can.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OracleResult {
    pub format: String,
    pub torch_version: String,
    pub torch_lib: String,
    pub conf: String,
    pub device: String,
    pub capacity: u64,
    /// Events the real allocator was given (up to and including an OOM's).
    pub events: u64,
    /// Keyed exactly like `torch.cuda.memory_stats()`.
    pub stats: BTreeMap<String, i64>,
    pub oom: Option<OracleOom>,
    /// The segment map at the end (at the OOM, when one stopped the run).
    pub segments: Vec<SegmentSnapshot>,
    /// The peak: the allocation after which reserved was highest (with the most allocated, of
    /// equal ones; the first such), 0-based; absent when nothing was allocated.
    #[serde(default)]
    pub peak_event: Option<u64>,
    /// The segment map right after `peak_event`.
    #[serde(default)]
    pub segments_at_peak: Vec<SegmentSnapshot>,
}

/// The first OOM: where, and PyTorch's own error text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OracleOom {
    /// 0-based index of the event in the converted list (steps and syncs count).
    pub event: u64,
    pub bytes: u64,
    pub stream: u64,
    pub message: String,
}

/// The simulator against the real allocator on one trace: every `memory_stats()` key at the
/// end, and the segment map at the end.
#[derive(Debug, Clone, Serialize)]
pub struct OracleComparison {
    pub oracle: OracleResult,
    pub sim_stats: BTreeMap<String, i64>,
    /// Keys both sides have.
    pub keys_compared: usize,
    pub mismatches: Vec<Mismatch>,
    /// The two segment maps at the end, and at the peak (addresses, sizes, blocks), are the same.
    pub segments_equal: bool,
    pub sim_segments: Vec<SegmentSnapshot>,
    /// The simulator's map at its peak (the same moment, when the two agree).
    #[serde(default)]
    pub sim_segments_at_peak: Vec<SegmentSnapshot>,
    /// The first event after which the two differ in what was compared there (the address an
    /// allocation got, allocated, reserved, active and inactive-split bytes, inactive-split
    /// blocks, segments), 0-based; `None` when they agree after every event.
    #[serde(default)]
    pub first_parting: Option<u64>,
    /// At `first_parting`: what was compared there, on each side, by name.
    #[serde(default)]
    pub parting_state: Vec<Mismatch>,
}

impl OracleComparison {
    /// Every key at the end, the maps at the peak and the end, and the state after every event.
    pub fn identical(&self) -> bool {
        self.mismatches.is_empty() && self.segments_equal && self.first_parting.is_none()
    }
}

/// Where the simulator and the real allocator first part on a trace they end apart on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Parting {
    /// 0-based index of the event (every event counts: steps and syncs too): the trace's first
    /// `event` events leave both sides equal, one more does not.
    pub event: u64,
    /// The event, as the trace names it.
    pub what: String,
    /// The keys that differ just after it (the segment map may differ alone).
    pub mismatches: Vec<Mismatch>,
    pub segments_equal: bool,
}
