//! CPU run records (`"type": "cpu_run"`): the malloc that served the run, latency percentiles,
//! the RSS timeline, drift and retained memory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{MachineInfo, WorkDone, WorkloadInfo};

names!(CpuMode { InProcess => "in-process", Preload => "preload" });

/// Latency percentiles in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean: f64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Latency {
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The live malloc: a short name (glibc, jemalloc, tcmalloc, mimalloc, or the file name) and
/// the library path that serves `malloc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveMalloc {
    pub name: String,
    pub library: String,
    /// Allocator libraries mapped into the process (from /proc/self/maps).
    pub mapped: Vec<String>,
    pub ld_preload: Option<String>,
}

/// How the measured allocator was reached (`"mode"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuMode {
    /// Called through `GlobalAlloc` in this process.
    #[serde(rename = "in-process")]
    InProcess,
    /// The process's malloc, put in front by LD_PRELOAD.
    #[serde(rename = "preload")]
    Preload,
}

/// One RSS sample of a CPU run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RssSample {
    pub t_s: f64,
    pub iteration: u64,
    pub rss: u64,
}

/// One CPU run (`allocbench cpu`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuRunResult {
    pub schema_version: u32,
    /// The allocator this run measured, by what really served it: for `system` under LD_PRELOAD
    /// that is the preloaded allocator's name.
    pub allocator: String,
    pub mode: CpuMode,
    pub live_malloc: LiveMalloc,
    pub workload: WorkloadInfo,
    pub machine: MachineInfo,
    pub work: WorkDone,
    pub threads: usize,
    pub cross_thread: bool,
    pub scale: f64,
    pub iterations: u64,
    pub passes: u64,
    pub bytes_allocated: u64,
    pub bytes_freed: u64,
    pub wall_s: f64,
    pub ops_per_s: f64,
    /// Ops per second per thread inside the replay of compiled ops (no event generation).
    pub replay_ops_per_s: f64,
    pub alloc_ns: Latency,
    pub free_ns: Latency,
    pub rss_before: u64,
    pub peak_rss: u64,
    pub rss_after_free: u64,
    pub retained: i64,
    pub trim_call: Option<String>,
    pub retained_after_trim: Option<i64>,
    pub drift_mib_per_1k_iterations: Option<f64>,
    pub drift_mib_per_minute: Option<f64>,
    pub rss_timeline: Vec<RssSample>,
    pub native_stats: BTreeMap<String, u64>,
    pub interrupted: bool,
}
