//! The fidelity check's two documents: what `scripts/torch_replay.py` writes (PyTorch's real
//! `memory_stats()` on a trace) and what `allocbench fidelity --json` writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
