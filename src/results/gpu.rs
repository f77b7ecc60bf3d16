//! GPU replay records: one replay (`"type": "gpu_replay"`), its OOM, timeline and segment maps.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{MachineInfo, WorkDone, WorkloadInfo};
use crate::error::InputError;
use crate::units::format_bytes;

names!(Backend { Sim => "sim", Cuda => "cuda" });
names!(OomCause { Fragmentation => "fragmentation", Capacity => "capacity", SegmentSize => "segment_size", FractionLimit => "fraction_limit", PrivatePools => "private_pools", Rejected => "rejected" });
names!(SegmentType { Small => "small", Large => "large" });
names!(BlockState { ActiveAllocated => "active_allocated", Inactive => "inactive", ActivePendingFree => "active_pending_free" });

/// What a replay does at an out-of-memory (`--on-oom`, `"on_oom"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOom {
    /// Stop at the first OOM (what a training job does).
    Stop,
    /// Record the OOM, skip the allocation (and its free) and go on.
    Continue,
}

/// A registered GPU policy (`--allocator`, `"allocator"`): names are parsed once, into this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuPolicy {
    /// PyTorch's CUDA caching allocator policy.
    Pytorch,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING`: a device malloc/free per tensor.
    Nocache,
    /// Reserves exactly the live bytes: the physical lower bound.
    Ideal,
    /// CUDA's stream-ordered pool (`cuMemAllocAsync`), on a real GPU only.
    Async,
}

impl GpuPolicy {
    /// Every policy, in the order `--help` and error messages list them.
    pub const ALL: [GpuPolicy; 4] = [GpuPolicy::Pytorch, GpuPolicy::Nocache, GpuPolicy::Ideal, GpuPolicy::Async];

    pub fn name(self) -> &'static str {
        match self {
            GpuPolicy::Pytorch => "pytorch",
            GpuPolicy::Nocache => "nocache",
            GpuPolicy::Ideal => "ideal",
            GpuPolicy::Async => "async",
        }
    }

    /// Whether a PYTORCH_CUDA_ALLOC_CONF string means anything to it (the others ignore one).
    pub fn takes_conf(self) -> bool {
        self == GpuPolicy::Pytorch
    }

    /// The policy called `name`, or an error listing the known ones.
    pub fn parse(name: &str) -> Result<GpuPolicy, InputError> {
        GpuPolicy::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<&str> = GpuPolicy::ALL.iter().map(|p| p.name()).collect();
            InputError::new("--allocator", format!("unknown GPU allocator '{name}' (known: {})", names.join(", ")))
        })
    }

    /// The conf a run of this policy shows: `conf`, or `default` for PyTorch's defaults ("").
    pub fn conf_or<'a>(self, conf: &'a str, default: &'a str) -> &'a str {
        if self.takes_conf() && conf.is_empty() {
            default
        } else {
            conf
        }
    }

    /// A run's label: the policy, and its conf when it has one (`pytorch expandable_segments:True`).
    pub fn label(self, conf: &str) -> String {
        if self.takes_conf() && !conf.is_empty() {
            format!("{} {conf}", self.name())
        } else {
            self.name().to_string()
        }
    }
}

impl std::fmt::Display for GpuPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Where the policy's device memory comes from (`--device`, `"backend"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The deterministic simulated device (every machine).
    Sim,
    /// A real GPU through the CUDA driver.
    Cuda,
}

/// Why an allocation failed (`"cause"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// Cached free plus device free would have covered the request, but no block fits and no
    /// segment could be made.
    Fragmentation,
    /// Live bytes plus the request exceed what the device can give this process.
    Capacity,
    /// The device had room for the request but not for the segment the allocator must create.
    SegmentSize,
    /// `per_process_memory_fraction`'s allowed bytes stopped it while the device had room.
    FractionLimit,
    /// The free bytes that would have covered it sit in pools the request cannot use: private
    /// pools (CUDA graphs, MemPools), or the allocator's own pools for a capture's request.
    PrivatePools,
    /// `throw_on_cudamalloc_oom`: the segment it needed exceeded the device's free memory, and
    /// the allocator refused it before any device call, without flushing its cache and retrying.
    Rejected,
}

/// The first OOM of a run (`"oom"` in the JSON results; a contract).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    /// 0-based index of the trace's data row (of the generated event).
    pub event: u64,
    /// The step the event belongs to (0 = before the first step marker).
    pub step: u64,
    /// The user's byte count.
    pub requested: u64,
    pub rounded: u64,
    pub alloc_size: u64,
    /// Free bytes inside the allocator's segments.
    pub cached_free: u64,
    /// Device memory free below the memory-fraction cap when one is set (else free on the device).
    pub device_free: u64,
    /// Device memory free regardless of the cap.
    #[serde(default)]
    pub device_free_uncapped: u64,
    /// `per_process_memory_fraction`'s allowed bytes (fraction × capacity), when set.
    #[serde(default)]
    pub allowed: Option<u64>,
    pub largest_free_block: u64,
    /// Of `cached_free`, the bytes in pools the request cannot use (see `OomCause::PrivatePools`).
    #[serde(default)]
    pub other_pools_free: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub cause: OomCause,
}

impl OomRecord {
    /// The device's free memory as the policy saw it ([`device_free_phrase`]).
    pub fn device_free_phrase(&self) -> String {
        device_free_phrase(self.device_free, self.device_free_uncapped, self.allowed)
    }
}

/// Why peak reserved can pass per_process_memory_fraction's cap: alloc_block checks the allocation
/// size against it, then an expandable segment maps whole pages for the request.
pub const OVER_CAP_WHY: &str = "expandable segments map whole pages after alloc_block checks the allocation size against the cap, as in PyTorch";

/// "X free on the device", or under a memory-fraction cap what the cap left and what the device
/// had: the cap, not the device, is what the policy's malloc saw.
pub fn device_free_phrase(free: u64, uncapped: u64, allowed: Option<u64>) -> String {
    match allowed {
        Some(allowed) => format!(
            "{} free below the {} cap of per_process_memory_fraction ({} on the device)",
            format_bytes(free),
            format_bytes(allowed),
            format_bytes(uncapped)
        ),
        None => format!("{} free on the device", format_bytes(free)),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub event: u64,
    pub step: u64,
    /// Values at the sample.
    pub allocated: u64,
    pub reserved: u64,
    pub active: u64,
    pub live: u64,
    /// The most allocated and reserved since the previous sample (the step's peak).
    pub allocated_max: u64,
    pub reserved_max: u64,
    /// Modelled allocator time since the previous sample (the step's; `devprobe::LatencyModel`).
    #[serde(default)]
    pub modelled_alloc_time_s: f64,
}

/// The pool a segment belongs to (`"segment_type"`, as `torch.cuda.memory_snapshot()` names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentType {
    /// Blocks of at most 1 MiB.
    Small,
    Large,
}

/// A block's state (`"state"`, as `torch.cuda.memory_snapshot()` names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Holds a live allocation.
    ActiveAllocated,
    /// Free (cached).
    Inactive,
    /// Freed by its tensor but still used by work queued on another stream (`record_stream`):
    /// neither allocated nor reusable until that stream's event completes.
    ActivePendingFree,
}

/// One segment as `torch.cuda.memory_snapshot()` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentSnapshot {
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub segment_type: SegmentType,
    pub is_expandable: bool,
    pub blocks: Vec<BlockSnapshot>,
    /// The private pool (a CUDA graph's or a MemPool's: the trace's `pool_begin` number) that
    /// owns the segment; absent for the allocator's own pools (PyTorch's `segment_pool_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_pool: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockSnapshot {
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
}

impl BlockSnapshot {
    pub fn is_allocated(&self) -> bool {
        self.state == BlockState::ActiveAllocated
    }
    /// Allocated, or pending free: not reusable (PyTorch's `active`).
    pub fn is_active(&self) -> bool {
        self.state != BlockState::Inactive
    }
}

impl SegmentSnapshot {
    pub fn allocated(&self) -> u64 {
        self.blocks.iter().filter(|b| b.is_allocated()).map(|b| b.size).sum()
    }
    /// Bytes not reusable: allocated plus pending free.
    pub fn active(&self) -> u64 {
        self.blocks.iter().filter(|b| b.is_active()).map(|b| b.size).sum()
    }
}

/// Headline numbers of a GPU replay.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub allocated_at_peak_reserved: u64,
    /// 1 − allocated/reserved at peak reserved.
    pub fragmentation_at_peak: f64,
    /// Peak allocated ÷ peak reserved.
    pub utilization: f64,
    /// Peak reserved ÷ peak live bytes (1.0 = ideal).
    pub overhead: f64,
    pub largest_free_block_end: u64,
    pub device_mallocs: i64,
    pub device_frees: i64,
    pub ooms: u64,
    pub last_step: u64,
    pub interrupted: bool,
    pub elapsed_s: f64,
    pub events_per_s: f64,
    /// Time in device calls: measured on a GPU, modelled with `--sim-latency`, else absent.
    #[serde(default)]
    pub device_time_s: Option<f64>,
    /// Device synchronisations: cudaFrees, unmaps and synchronize_and_free_events calls.
    #[serde(default)]
    pub syncs: u64,
    /// Modelled allocator time (simulated device): device calls by size, a stall per sync, the
    /// cached path per malloc/free, from the H100 devprobe table or `--latency FILE`.
    #[serde(default)]
    pub modelled_alloc_time_s: Option<f64>,
}

/// One GPU replay (`allocbench replay`, one row of `allocbench run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRunResult {
    pub schema_version: u32,
    pub allocator: GpuPolicy,
    /// The PYTORCH_CUDA_ALLOC_CONF string ("" = defaults).
    pub conf: String,
    pub backend: Backend,
    pub device: String,
    pub capacity: u64,
    pub on_oom: OnOom,
    pub workload: WorkloadInfo,
    pub machine: MachineInfo,
    pub work: WorkDone,
    /// Keyed exactly like `torch.cuda.memory_stats()`.
    pub stats: BTreeMap<String, i64>,
    pub oom: Option<OomRecord>,
    pub summary: GpuSummary,
    pub timeline: Vec<TimelinePoint>,
    pub segments_at_peak: Vec<SegmentSnapshot>,
    /// The segment map at the first OOM (empty without one).
    #[serde(default)]
    pub segments_at_oom: Vec<SegmentSnapshot>,
    /// (smallest size of the log2 bucket, allocations in it).
    pub size_histogram: Vec<(u64, u64)>,
}

impl GpuRunResult {
    /// The run's label: its policy, and its conf when it has one.
    pub fn label(&self) -> String {
        self.allocator.label(&self.conf)
    }
}
