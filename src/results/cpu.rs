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
    /// Bytes the workload held when the sample was taken (all workers).
    #[serde(default)]
    pub live_bytes: i64,
}

fn touched() -> bool {
    true
}

/// `allocator` followed by its settings, if any.
pub fn with_settings(allocator: &str, settings: &[String]) -> String {
    if settings.is_empty() {
        allocator.to_string()
    } else {
        format!("{allocator} {}", settings.join(" "))
    }
}

impl CpuRunResult {
    /// The allocator and its settings, as tables and legends name a run.
    pub fn label(&self) -> String {
        with_settings(&self.allocator, &self.settings)
    }

    /// What the run kept at the end of its drain (the last checkpoint the drain reached), else
    /// right after its last free (`retained`, a run without a drain).
    pub fn retained_at_drain_end(&self) -> i64 {
        self.retained_after_drain.last().map_or(self.retained, |d| d.retained)
    }
}

/// Retained memory a while after the last free (`"retained_after_drain"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetainedAt {
    /// Seconds after the last free.
    pub after_s: f64,
    /// RSS then minus RSS before the workload.
    pub retained: i64,
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
    /// Whether each allocation's pages were written (false with `--no-touch`: RSS then shows
    /// only what the allocator itself touched). Records before this field always touched.
    #[serde(default = "touched")]
    pub touch: bool,
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
    /// Slope of raw RSS per 1,000 iterations (includes the workload's own growth).
    pub drift_mib_per_1k_iterations: Option<f64>,
    pub drift_mib_per_minute: Option<f64>,
    /// Slope of RSS minus live bytes per 1,000 iterations: the allocator's own drift.
    #[serde(default)]
    pub drift_overhead_mib_per_1k: Option<f64>,
    /// Seconds RSS was sampled after the last free (`--drain`).
    #[serde(default)]
    pub drain_s: f64,
    /// Retained at 0.1, 1 and 10 s after the last free, those the drain reached.
    #[serde(default)]
    pub retained_after_drain: Vec<RetainedAt>,
    pub rss_timeline: Vec<RssSample>,
    pub native_stats: BTreeMap<String, u64>,
    pub interrupted: bool,
    /// The process that ran it (each allocator of a multi-allocator run has its own).
    #[serde(default)]
    pub pid: u32,
    /// The allocator settings in force (`--settings`), as the environment set them: `K=V` each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
    /// CPU time (user + system) of the process over the run, drain excluded: what the allocator
    /// cost, idle time not counted (a paced replay sleeps between calls).
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// A recorded trace replayed at its recorded pace (`--pace recorded`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paced: bool,
}

/// One run of a program under one allocator (`allocbench cpu --exec`, `"type": "cpu_exec"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuExecResult {
    pub schema_version: u32,
    /// The allocator asked for: glibc, jemalloc, tcmalloc, mimalloc, or a preloaded `.so`'s name.
    pub allocator: String,
    /// What the process tree's mappings proved served malloc (the preloaded library was mapped;
    /// glibc when libc and no other allocator was); None when nothing proved it, and then the run
    /// is not labelled with `allocator` in reports.
    pub served_by: Option<String>,
    /// The library that proved it (the preloaded `.so`, or libc).
    pub served_by_library: Option<String>,
    /// LD_PRELOAD as given to the program (None for glibc).
    pub ld_preload: Option<String>,
    pub command: Vec<String>,
    /// A short name for the program: the script (`*.py`) or the executable's file name.
    pub name: String,
    /// 1-based repetition; repetitions are interleaved across allocators.
    pub rep: u32,
    /// The exit status (128 + signal when killed by one; 127 when the command was not found).
    pub exit_code: i32,
    /// Why the program did not run or finish, if it did not.
    pub error: Option<String>,
    pub wall_s: f64,
    /// CPU time of the program and its waited-for descendants (`wait4`'s rusage).
    pub user_s: f64,
    pub sys_s: f64,
    pub minor_faults: u64,
    pub major_faults: u64,
    /// The largest sampled RSS of the whole process tree, or the largest process's own peak
    /// (`ru_maxrss`) if that is higher.
    pub peak_rss_bytes: u64,
    /// The most processes the tree had at one sample.
    pub max_processes: u32,
    /// RSS of the process tree over time: `[t_s, bytes]`, every `--sample-ms`; a program that
    /// exited before any sample has one point at its exit, of its `ru_maxrss` (the peak).
    pub rss: Vec<(f64, u64)>,
    pub machine: MachineInfo,
    /// Stopped by Ctrl-C before it finished.
    pub interrupted: bool,
    /// The allocator settings in force (`--settings`), as the environment set them: `K=V` each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
}

impl CpuExecResult {
    /// The allocator and its settings, as tables and legends name a run.
    pub fn label(&self) -> String {
        with_settings(&self.allocator, &self.settings)
    }

    /// The run ran to its end and its allocator is proven.
    pub fn verified(&self) -> bool {
        self.served_by.as_deref() == Some(self.allocator.as_str()) && !self.interrupted
    }
}

/// One allocator × settings of `allocbench cpu advise`, its repetitions folded to medians.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuCandidate {
    /// The allocator and its settings, as tables name it.
    pub label: String,
    pub allocator: String,
    pub settings: Vec<String>,
    /// What to set to run a program this way (`LD_PRELOAD=… K=V …`).
    pub line: String,
    pub runs: u32,
    /// Time-weighted mean RSS while it ran, and its peak: above the replay's start for a recorded
    /// trace, the whole process tree's for a program.
    pub steady_rss_bytes: f64,
    pub peak_rss_bytes: f64,
    /// Kept after the drain (replays only).
    pub retained_bytes: Option<f64>,
    /// CPU seconds (user + system) of a run: the replay process's, or the program tree's.
    pub cpu_s: f64,
    /// How much more CPU time than glibc's defaults: this one's / the baseline's − 1.
    pub time_cost: f64,
    /// Another candidate no worse on every column and better on one, if any.
    pub dominated_by: Option<String>,
}

/// `allocbench cpu advise` (`"type": "cpu_advise"`): the candidates, the recommendation first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuAdviseResult {
    pub schema_version: u32,
    /// The recorded trace, or the command.
    pub input: String,
    /// memory, balanced or time.
    pub objective: String,
    pub candidates: Vec<CpuCandidate>,
    /// The recommendation, ready to paste.
    pub line: String,
    pub reason: String,
}
