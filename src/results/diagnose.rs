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
    /// The room left at the peak when there is no OOM: capacity (or the memory-fraction cap,
    /// `allowed`) − peak reserved.
    pub headroom: Option<u64>,
    /// `per_process_memory_fraction`'s cap on reserved bytes (fraction × capacity), when set.
    #[serde(default)]
    pub allowed: Option<u64>,
    pub peak_reserved: u64,
    /// Allocated bytes at the peak of reserved (at an OOM the breakdown below is of the OOM:
    /// oom.allocated + pending + pinned free + cached free = oom.reserved).
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
    /// Reserved bytes in private pools (CUDA graphs, MemPools) at the OOM (else at the peak),
    /// and the free bytes among them: only the pool's own allocations can use those.
    #[serde(default)]
    pub private_pool_bytes: u64,
    #[serde(default)]
    pub private_pool_free_bytes: u64,
    pub largest_free_block: u64,
    pub top_segments: Vec<SegmentWaste>,
    pub pinning_size_classes: Vec<PinningClass>,
    /// (site, bytes requested) for imported snapshots with stacks, largest first.
    pub top_sites: Vec<(String, u64)>,
    /// (site, bytes live) at the OOM, else at the peak: what each site held then, largest first.
    #[serde(default)]
    pub top_sites_live: Vec<(String, u64)>,
    /// The site of the request that failed (when the trace records sites).
    #[serde(default)]
    pub oom_site: Option<String>,
    /// The smallest device capacity on which the workload runs without an OOM (2 MiB precision),
    /// what lives outside the allocator included; `None` when none does, or when the trace is
    /// not the whole run (`not_whole_run`).
    pub min_capacity: Option<u64>,
    /// What the job holds on the card outside the caching allocator (the CUDA context, NCCL).
    #[serde(default = "crate::results::Outside::none")]
    pub outside: crate::results::Outside,
    /// The device's total at the peak of reserved (up to the OOM, with one): `peak_reserved`
    /// plus `outside`, the figure nvidia-smi would show.
    #[serde(default)]
    pub device_total: u64,
    /// Why the trace is not the whole run (a capture that ended early, at its fake card's OOM or
    /// an error): no card is then named as fitting.
    #[serde(default)]
    pub not_whole_run: Option<String>,
    /// The smallest card of the table (`allocbench cards`) the workload runs on without an OOM.
    #[serde(default)]
    pub smallest_card: Option<String>,
    /// The conf's settings that conflict or that PyTorch ignores (`AllocatorConfig::conflicts`).
    #[serde(default)]
    pub conflicts: Vec<String>,
    pub summary: Vec<String>,
    /// A sharded job's folder (`diagnose DIR`): every rank's verdict; this diagnosis is the rank
    /// that decides the job's (`decided_by_rank`: the first to OOM, else the least headroom).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by_rank: Option<u32>,
}

/// One trace of a sharded job's folder: a rank, or ranks of one role (`capture --ranks distinct`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankVerdict {
    /// The ranks the trace stands for, in order (the captured one, the least of its role, first).
    pub ranks: Vec<u32>,
    pub trace: String,
    pub peak_reserved: u64,
    /// Reserved at the peak plus what is outside the allocator (its NCCL buffers included).
    pub device_total: u64,
    pub nccl: u64,
    /// The step of its first OOM, if it has one.
    pub oom_step: Option<u64>,
    pub headroom: Option<u64>,
    pub min_capacity: Option<u64>,
}

/// One configuration evaluated by `allocbench advise` (the `configs` of its `--json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string ("" = PyTorch's defaults).
    pub conf: String,
    pub peak_reserved: u64,
    pub overhead: f64,
    pub device_mallocs: i64,
    #[serde(default)]
    pub device_frees: i64,
    /// Device synchronisations (`devprobe::syncs`).
    #[serde(default)]
    pub syncs: u64,
    /// The modelled allocator time of the replay (`devprobe::LatencyModel::alloc_time_ns`).
    #[serde(default)]
    pub modelled_alloc_time_s: f64,
    pub retries: i64,
    /// Whether the replay hit an OOM (it stops there).
    #[serde(default)]
    pub oom: bool,
    pub oom_step: Option<u64>,
    /// The event index of that OOM: how far the replay got (steps tie where a trace has few).
    #[serde(default)]
    pub oom_event: Option<u64>,
    /// Stopped early because a finished configuration already beat it (see `advise::Pruner`):
    /// the numbers are those at the stop, lower bounds of the full replay's.
    #[serde(default)]
    pub pruned: bool,
    /// Replays identically to this configuration on the trace (same rounded sizes, same
    /// effective settings): replayed once, numbers shared.
    #[serde(default)]
    pub equivalent_to: Option<String>,
    /// Settings that conflict or that PyTorch ignores (`AllocatorConfig::conflicts`).
    #[serde(default)]
    pub conflicts: Vec<String>,
}

/// What `--objective` minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The least peak reserved memory, whatever the device calls cost.
    Memory,
    /// The least memory among configurations whose modelled allocator time stays within 10 %
    /// of the defaults' (of the fastest configuration's when the defaults OOM).
    Balanced,
    /// The least modelled allocator time.
    Time,
}
names!(Objective { Memory => "memory", Balanced => "balanced", Time => "time" });

/// What `allocbench advise --json` writes (`"type": "advise"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdviseResult {
    pub schema_version: u32,
    pub workload: WorkloadInfo,
    pub capacity: u64,
    pub objective: Objective,
    /// The device whose devprobe prices the time (`--latency`, else the embedded H100's).
    pub latency_table: String,
    /// The balanced objective's limit on modelled allocator time.
    pub time_budget_s: Option<f64>,
    /// Distinct replays run (configurations equivalent on the trace share one).
    pub replays: usize,
    pub elapsed_s: f64,
    pub threads: usize,
    /// The pick for `objective`, never a conflicting configuration; `None` only when nothing ran.
    pub recommended: Option<Candidate>,
    /// Every configuration searched, best first for `objective`; PyTorch's defaults among them.
    pub configs: Vec<Candidate>,
    /// What the job holds on the card outside the allocator (withheld from every replay).
    #[serde(default = "crate::results::Outside::none")]
    pub outside: crate::results::Outside,
    /// When no configuration fits: the smallest device the recommended one runs on without an
    /// OOM (outside included), and the smallest card of the table it runs on.
    #[serde(default)]
    pub fits_from: Option<u64>,
    #[serde(default)]
    pub smallest_card: Option<String>,
    /// Why the trace is not the whole run (a capture that ended early): then no card is named.
    #[serde(default)]
    pub not_whole_run: Option<String>,
    /// Steps in the trace (at least 1): what per-step allocator time is per.
    #[serde(default)]
    pub steps: u64,
    /// The job's step time (`--step-time`), when given.
    #[serde(default)]
    pub step_time_s: Option<f64>,
    /// The balanced objective's allowance of extra allocator time per step over the reference.
    #[serde(default)]
    pub step_budget_s: f64,
    /// Without `--step-time`: the step's floor estimated from the bytes the trace allocates a
    /// step and its math (`advise::estimated_step_time_s`), which sizes the allowance.
    #[serde(default)]
    pub step_time_estimated_s: Option<f64>,
    /// The device's math a step (FLOPs as `torch.utils.flop_counter` counts them), where the input
    /// says: a capture's count, a transformer workload's model.
    #[serde(default)]
    pub step_flops: Option<f64>,
    /// Under the balanced objective: the memory objective's pick, replayed whole (a config the
    /// balanced search stopped early for its time has no full numbers of its own), to say what
    /// the balance turned down.
    #[serde(default)]
    pub memory_best: Option<Candidate>,
}

impl Candidate {
    /// The ranking numbers of a full replay (a sweep's row).
    pub fn from_run(r: &super::gpu::GpuRunResult) -> Self {
        Candidate {
            conf: r.conf.clone(),
            peak_reserved: r.summary.peak_reserved,
            overhead: r.summary.overhead,
            device_mallocs: r.summary.device_mallocs,
            device_frees: r.summary.device_frees,
            syncs: r.summary.syncs,
            modelled_alloc_time_s: r.summary.modelled_alloc_time_s.unwrap_or(0.0),
            retries: r.stats.get("num_alloc_retries").copied().unwrap_or(0),
            oom: r.oom.is_some(),
            oom_step: r.oom.as_ref().map(|o| o.step),
            oom_event: r.oom.as_ref().map(|o| o.event),
            pruned: false,
            equivalent_to: None,
            // Filled by the caller, which knows the policy's rules (`AllocatorConfig::conflicts`).
            conflicts: Vec::new(),
        }
    }
}
