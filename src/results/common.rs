//! What every record carries: the machine a run was made on, its input, and the work done.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where and with what a run was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub hostname: String,
    pub cpu: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub kernel: String,
    pub allocbench_version: String,
    pub git_rev: String,
    pub rustc: String,
    /// Allocator knobs in the environment (MALLOC_CONF, MIMALLOC_*, MALLOC_ARENA_MAX, LD_PRELOAD, PYTORCH_*).
    pub env: BTreeMap<String, String>,
    pub unix_time: u64,
}

impl MachineInfo {
    pub fn current() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let memory_bytes = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .unwrap_or(0);
        const KNOBS: [&str; 9] = [
            "MALLOC_CONF",
            "MALLOC_ARENA_MAX",
            "MALLOC_TRIM_THRESHOLD_",
            "MIMALLOC_PURGE_DELAY",
            "MIMALLOC_ARENA_EAGER_COMMIT",
            "TCMALLOC_RELEASE_RATE",
            "LD_PRELOAD",
            "PYTORCH_CUDA_ALLOC_CONF",
            "PYTORCH_ALLOC_CONF",
        ];
        let env = KNOBS.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
        MachineInfo {
            hostname: read("/proc/sys/kernel/hostname"),
            cpu,
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_bytes,
            kernel: read("/proc/sys/kernel/osrelease"),
            allocbench_version: env!("CARGO_PKG_VERSION").to_string(),
            git_rev: env!("ALLOCBENCH_GIT_REV").to_string(),
            rustc: env!("ALLOCBENCH_RUSTC").to_string(),
            env,
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        }
    }
}

/// Work-equivalence columns: a comparison proves every allocator did the same work.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkDone {
    pub events: u64,
    pub allocs: u64,
    pub frees: u64,
    pub steps: u64,
    pub bytes_requested: u64,
    pub live_bytes_end: u64,
    pub peak_live_bytes: u64,
}

/// What a results file says about its input (with a hash that proves identical input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadInfo {
    pub name: String,
    pub kind: String,
    pub origin: String,
    pub sha256: String,
    pub seed: Option<u64>,
    #[serde(default)]
    pub description: String,
}

/// The CUDA context a process holds on the card, outside the caching allocator: 426 MiB, what
/// `nvidia-smi` showed for a torch 2.10 / CUDA 13 process that had only created its context
/// (unsloth-zoo PR #1053). Kernels load into it lazily as the job first uses them (cuBLAS,
/// cuDNN, Triton), so a running job's is larger: a floor (docs/cards.md).
pub const CUDA_CONTEXT_BYTES: u64 = 426 * crate::units::MIB;

/// What a job holds on the card outside PyTorch's caching allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outside {
    /// The CUDA context (and the library modules loaded into it).
    pub cuda_context: u64,
    /// NCCL's buffers (none for one process).
    pub nccl: u64,
}

impl Default for Outside {
    fn default() -> Self {
        Outside { cuda_context: CUDA_CONTEXT_BYTES, nccl: 0 }
    }
}

impl Outside {
    /// Nothing outside the allocator (a replay of the allocator alone).
    pub const NONE: Outside = Outside { cuda_context: 0, nccl: 0 };

    /// [`Outside::NONE`] (results written before the outside was counted).
    pub fn none() -> Self {
        Self::NONE
    }

    pub fn total(&self) -> u64 {
        self.cuda_context.saturating_add(self.nccl)
    }

    /// What follows a card in a sentence: " (426 MiB of it outside the allocator: CUDA context
    /// 426 MiB)", or nothing when nothing is outside.
    pub fn of_the_card(&self) -> String {
        if self.total() == 0 {
            return String::new();
        }
        format!(" ({} of it outside the allocator: {})", crate::units::format_bytes(self.total()), self.describe())
    }

    /// "CUDA context 426 MiB" (+ ", NCCL 1.00 GiB").
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("CUDA context {}", crate::units::format_bytes(self.cuda_context))];
        if self.nccl > 0 {
            parts.push(format!("NCCL {}", crate::units::format_bytes(self.nccl)));
        }
        parts.join(", ")
    }
}
