//! Sweep records: the rows of a plan (`allocbench sweep plan`, one [`PlanRow`] per replay) and
//! the finished rows that its shards append and `sweep merge` gathers (`"type": "sweep_row"`).

use serde::{Deserialize, Serialize};

use super::gpu::GpuRunResult;

/// One replay of a sweep: which input (and its sha256), allocator, conf and capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRow {
    pub schema_version: u32,
    /// Position in the plan (0-based); shard I of N takes the rows with index ≡ I (mod N).
    pub index: u64,
    /// The input file; a relative path is relative to the plan file's folder (`--bundle`).
    pub input: String,
    /// sha256 of the input file's bytes when the plan was made.
    pub sha256: String,
    /// A [`super::GpuPolicy`]'s name, checked when the plan is read (`Plan::read`).
    pub allocator: String,
    /// The PYTORCH_CUDA_ALLOC_CONF string ("" = defaults; always "" for nocache and ideal).
    pub conf: String,
    pub capacity: u64,
    /// The device whose history a PyTorch snapshot of several GPUs gives (absent: the input
    /// holds one history, or is no snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_device: Option<usize>,
    /// The PyTorch release whose allocator rules the replay follows (`--torch-version`; absent:
    /// the newest verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
}

/// Whether a plan row's replay ran (`"status"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowStatus {
    /// Replayed: `result` holds it (an OOM is a result too).
    Ok,
    /// Not replayed: `error` says why (e.g. the input is missing on the node).
    Failed,
}

names!(RowStatus { Ok => "ok", Failed => "failed" });

/// A finished plan row (`"type": "sweep_row"`): the plan row and its replay result. Timelines and
/// segment maps are left empty, so that a fleet's sweep stays small; `allocbench replay` on the
/// row's input, allocator, conf and capacity gives them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    pub schema_version: u32,
    /// sha256 of the plan file: the sweep this row belongs to.
    pub plan: String,
    pub row: PlanRow,
    pub status: RowStatus,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub result: Option<GpuRunResult>,
}
