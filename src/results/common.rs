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

/// NCCL's buffers on a rank's card, outside the caching allocator: for each communicator the
/// rank is in, channels × the buffers of one connection × peers, where its collectives (rings)
/// connect it to its two neighbours (one in a group of two) and all-to-all or send/recv to the
/// peers they name besides. A connection holds each protocol's buffer: `NCCL_BUFFSIZE` (SIMPLE,
/// 4 MiB), `NCCL_LL128_BUFFSIZE` (4.69 MiB) and `NCCL_LL_BUFFSIZE` (512 KiB), NCCL's defaults
/// (src/include/comm.h: DEFAULT_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_LL_BUFFSIZE), 9.19 MiB
/// in all; 32 channels (NCCL's MAXCHANNELS, what it opens between NVLink-connected H100s). The
/// environment's `NCCL_*` settings at capture time replace them. An estimate (docs/capture.md,
/// "Sharded jobs"): a ring of 8 comes to 588 MiB a rank and all-to-all among 8 to 2.58 GiB,
/// where NVIDIA/nccl #1685 measured 1.06 to 4.34 GB per GPU on 8 × H100 and #864 1.6 GB for one
/// communicator (the tree's connections and NVLS buffers are not counted).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NcclBudget {
    /// (ranks, peers reached by all-to-all or send/recv) per communicator.
    pub communicators: Vec<(u32, u32)>,
    /// One connection's buffers, every protocol's.
    pub connection_bytes: u64,
    pub channels: u64,
}

/// NCCL's defaults, per connection and channel: DEFAULT_BUFFSIZE (SIMPLE), DEFAULT_LL128_BUFFSIZE
/// (120 elements × 640 threads × 8 steps × 8 bytes), DEFAULT_LL_BUFFSIZE (8 lines × 512 threads
/// × 8 steps × 16 bytes).
pub const NCCL_DEFAULT_BUFFSIZE: u64 = 4 * crate::units::MIB;
pub const NCCL_DEFAULT_LL128_BUFFSIZE: u64 = 120 * 640 * 8 * 8;
pub const NCCL_DEFAULT_LL_BUFFSIZE: u64 = 8 * 512 * 8 * 16;
/// NCCL's MAXCHANNELS (src/include/device.h).
pub const NCCL_DEFAULT_CHANNELS: u64 = 32;

impl NcclBudget {
    /// Communicators of (ranks, point-to-point peers) with NCCL's default buffers and channels.
    pub fn with_defaults(communicators: Vec<(u32, u32)>) -> NcclBudget {
        NcclBudget {
            communicators,
            connection_bytes: NCCL_DEFAULT_BUFFSIZE + NCCL_DEFAULT_LL128_BUFFSIZE + NCCL_DEFAULT_LL_BUFFSIZE,
            channels: NCCL_DEFAULT_CHANNELS,
        }
    }

    /// From a capture's closing lines (`# nccl communicator: ranks=8 p2p_peers=0`, `# nccl
    /// settings: NCCL_BUFFSIZE=...`); `None` when it names no communicator (one process).
    pub fn from_capture(tail: &str) -> Option<NcclBudget> {
        let mut communicators = Vec::new();
        let (mut simple, mut ll128, mut ll, mut channels) =
            (NCCL_DEFAULT_BUFFSIZE, NCCL_DEFAULT_LL128_BUFFSIZE, NCCL_DEFAULT_LL_BUFFSIZE, NCCL_DEFAULT_CHANNELS);
        for line in tail.lines() {
            if let Some(rest) = line.strip_prefix("# nccl communicator: ") {
                let field = |k: &str| rest.split(' ').find_map(|f| f.strip_prefix(k))?.parse::<u32>().ok();
                communicators.push((field("ranks=")?, field("p2p_peers=").unwrap_or(0)));
            } else if let Some(rest) = line.strip_prefix("# nccl settings: ") {
                for (k, v) in rest.split(' ').filter_map(|kv| kv.split_once('=')) {
                    let Ok(n) = v.parse::<u64>() else { continue };
                    match k {
                        "NCCL_BUFFSIZE" if n > 0 => simple = n,
                        "NCCL_LL128_BUFFSIZE" if n > 0 => ll128 = n,
                        "NCCL_LL_BUFFSIZE" if n > 0 => ll = n,
                        "NCCL_MAX_NCHANNELS" if n > 0 => channels = n.min(NCCL_DEFAULT_CHANNELS * 2),
                        _ => {}
                    }
                }
            }
        }
        (!communicators.is_empty()).then_some(NcclBudget { communicators, connection_bytes: simple + ll128 + ll, channels })
    }

    /// The peers a rank keeps buffers for in a communicator of `ranks`: its ring's neighbours and
    /// those it reached point to point.
    fn peers(ranks: u32, p2p_peers: u32) -> u64 {
        u64::from(ranks.saturating_sub(1).min(2)) + u64::from(p2p_peers.min(ranks.saturating_sub(1)))
    }

    pub fn bytes(&self) -> u64 {
        self.communicators.iter().map(|&(ranks, p2p)| self.channels * self.connection_bytes * Self::peers(ranks, p2p)).sum()
    }

    /// "2 communicators (8 ranks, 2 ranks + 1 peer point to point) × 32 channels × 9.19 MiB ...".
    pub fn describe(&self) -> String {
        let each: Vec<String> = self
            .communicators
            .iter()
            .map(|&(r, p2p)| format!("{r} ranks{}", if p2p > 0 { format!(" + {} point to point", crate::units::count(p2p, "peer")) } else { String::new() }))
            .collect();
        format!(
            "{} ({}) × {} channels × {} a connection × peers",
            crate::units::count(self.communicators.len() as u64, "communicator"),
            each.join(", "),
            self.channels,
            crate::units::format_bytes(self.connection_bytes)
        )
    }
}

#[cfg(test)]
mod nccl_tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn nccls_budget_is_channels_times_a_connections_buffers_times_peers() {
        let connection = 4 * MIB + 4_915_200 + 524_288;
        let tail = "free,3,,\n# nccl communicator: ranks=8 p2p_peers=0\n# nccl communicator: ranks=2 p2p_peers=0\n# capture complete: 3 steps\n";
        let b = NcclBudget::from_capture(tail).unwrap();
        // A ring of 8: two neighbours; a group of 2: one.
        assert_eq!(b.bytes(), 32 * connection * 3);
        assert_eq!(NcclBudget::from_capture("# nccl communicator: ranks=8 p2p_peers=0\n").unwrap().bytes() / MIB, 588);
        let a2a = NcclBudget::from_capture("# nccl communicator: ranks=8 p2p_peers=7\n").unwrap();
        assert_eq!(a2a.bytes(), 9 * 32 * connection, "the ring's two and seven peers");
        assert!(a2a.describe().contains("8 ranks + 7 peers point to point"), "{}", a2a.describe());
        let set = NcclBudget::from_capture(
            "# nccl communicator: ranks=8 p2p_peers=0\n# nccl settings: NCCL_BUFFSIZE=1048576 NCCL_LL128_BUFFSIZE=1048576 NCCL_LL_BUFFSIZE=1048576 NCCL_MAX_NCHANNELS=8\n",
        )
        .unwrap();
        assert_eq!(set.bytes(), 8 * 3 * MIB * 2);
        assert!(set.describe().starts_with("1 communicator (8 ranks) × 8 channels × 3.00 MiB a connection"), "{}", set.describe());
        assert_eq!(NcclBudget::from_capture("# capture complete: 3 steps\n"), None);
    }
}
