//! Diagnosis records (`"type": "diagnose"`) and the configurations `advise` ranks.

use serde::{Deserialize, Serialize};

use super::common::WorkloadInfo;
use super::gpu::{OomRecord, SegmentType};

/// One segment's waste at the peak.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentWaste {
    pub address: u64,
    pub segment_type: SegmentType,
    pub total_size: u64,
    pub free_bytes: u64,
    pub live_blocks: usize,
    pub free_pieces: usize,
}

/// Live blocks of one size class that pin free space (they sit in segments with free pieces).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinningClass {
    /// Smallest size of the log2 class.
    pub size_class: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// Free bytes in the segments these blocks share.
    pub pinned_free_bytes: u64,
}

/// What `allocbench diagnose --json` writes (`"type": "diagnose"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagnoseResult {
    pub schema_version: u32,
    pub workload: WorkloadInfo,
    pub capacity: u64,
    pub conf: String,
    /// The same object as `replay`'s: event, step, requested, cause, ...
    pub oom: Option<OomRecord>,
    /// capacity − peak reserved when there is no OOM.
    pub headroom: Option<u64>,
    pub peak_reserved: u64,
    pub allocated_at_peak: u64,
    pub peak_live_bytes: u64,
    /// Free bytes inside segments that hold a live block, at the OOM (else at the peak).
    pub pinned_free_bytes: u64,
    /// Free bytes in wholly free cached segments, at the peak.
    pub cached_free_segments_bytes: u64,
    /// Bytes of blocks freed but still used by another stream's queued work (`record_stream`):
    /// neither allocated nor reusable (PyTorch's `active_pending_free`). allocated + this +
    /// pinned free + cached free = reserved.
    #[serde(default)]
    pub pending_free_bytes: u64,
    pub largest_free_block: u64,
    pub top_segments: Vec<SegmentWaste>,
    pub pinning_size_classes: Vec<PinningClass>,
    /// (site, bytes requested) for imported snapshots with stacks, largest first.
    pub top_sites: Vec<(String, u64)>,
    /// The smallest device capacity on which the workload runs without an OOM (2 MiB precision).
    pub min_capacity: Option<u64>,
    pub summary: Vec<String>,
}

/// One configuration evaluated by `allocbench advise` (its `--json` is a list of these).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub conf: String,
    pub peak_reserved: u64,
    pub overhead: f64,
    pub device_mallocs: i64,
    pub retries: i64,
    pub oom_step: Option<u64>,
}

impl Candidate {
    /// The ranking numbers of a full replay (a sweep's row).
    pub fn from_run(r: &super::gpu::GpuRunResult) -> Self {
        Candidate {
            conf: r.conf.clone(),
            peak_reserved: r.summary.peak_reserved,
            overhead: r.summary.overhead,
            device_mallocs: r.summary.device_mallocs,
            retries: r.stats.get("num_alloc_retries").copied().unwrap_or(0),
            oom_step: r.oom.as_ref().map(|o| o.step),
        }
    }
}
