//! Device-probe records (`"type": "devprobe"`): allocation latency by size on a real GPU.

use serde::{Deserialize, Serialize};

use super::common::MachineInfo;

/// Latency of one operation at one size, from repeated timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeLatency {
    pub bytes: u64,
    pub samples: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// A devprobe results record (`"type": "devprobe"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevprobeResult {
    pub schema_version: u32,
    pub device: String,
    pub capacity: u64,
    pub machine: MachineInfo,
    /// `cuMemAlloc` (cudaMalloc) by size.
    pub malloc: Vec<SizeLatency>,
    /// `cuMemFree` (cudaFree) by size.
    pub free: Vec<SizeLatency>,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` from a warm pool, by size.
    pub async_pool_alloc_free: Vec<SizeLatency>,
}
