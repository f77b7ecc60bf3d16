//! The results schema: one versioned serde type per kind of run, written as JSON (one file per
//! run) or JSON Lines (sweeps). Reports and comparisons read only these files.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::InputError;
use crate::gpu::replay::{OomRecord, TimelinePoint};
use crate::gpu::SegmentSnapshot;
use crate::input::WorkloadInfo;

/// Bumped whenever a field changes meaning or is removed; readers refuse other versions.
pub const SCHEMA_VERSION: u32 = 1;

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
}

/// One GPU replay (`allocbench replay`, one row of `allocbench run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRunResult {
    pub schema_version: u32,
    pub allocator: String,
    /// The PYTORCH_CUDA_ALLOC_CONF string ("" = defaults).
    pub conf: String,
    /// "sim" or "cuda".
    pub backend: String,
    pub device: String,
    pub capacity: u64,
    pub on_oom: String,
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

/// Any results record, tagged by `"type"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultRecord {
    GpuReplay(Box<GpuRunResult>),
    CpuRun(Box<crate::cpu::CpuRunResult>),
    Devprobe(Box<crate::gpu::devprobe::DevprobeResult>),
    Diagnose(Box<crate::diagnose::DiagnoseResult>),
}

impl ResultRecord {
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("results serialize")
    }
}

/// Appends one record to a JSON Lines stream (flushed, so a killed sweep keeps what it wrote).
pub fn write_jsonl(out: &mut dyn Write, rec: &ResultRecord) -> std::io::Result<()> {
    writeln!(out, "{}", rec.to_json_line())?;
    out.flush()
}

/// Reads a results file: one JSON document, or JSON Lines. Errors name the file and line and
/// refuse other schema versions instead of drawing broken charts.
pub fn read_results(path: &Path) -> anyhow::Result<Vec<ResultRecord>> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| InputError::new(&name, format!("cannot read results: {e}")))?;
    let parse_one = |v: serde_json::Value, loc: String| -> anyhow::Result<ResultRecord> {
        let version = v.get("schema_version").and_then(|x| x.as_u64());
        match version {
            Some(x) if x == SCHEMA_VERSION as u64 => {}
            Some(x) => {
                return Err(InputError::new(
                    loc,
                    format!("results schema version {x}, but this allocbench reads version {SCHEMA_VERSION}: re-run the benchmark with this version"),
                )
                .into())
            }
            None => return Err(InputError::new(loc, "not an allocbench results record (no schema_version)").into()),
        }
        serde_json::from_value(v).map_err(|e| InputError::new(loc, format!("malformed results record: {e}")).into())
    };
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(InputError::new(&name, "empty results file").into());
    }
    // A whole-file JSON document (pretty-printed single run), else JSON Lines.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(trimmed) {
        return Ok(vec![parse_one(v, name)?]);
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let loc = format!("{name}:{}", i + 1);
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| InputError::new(&loc, format!("not JSON: {e}")))?;
        out.push(parse_one(v, loc)?);
    }
    Ok(out)
}

/// Log2 size buckets for the histogram: bucket k holds sizes in [2^k, 2^(k+1)).
#[derive(Debug, Clone)]
pub struct SizeHistogram {
    pub counts: [u64; 64],
}

impl Default for SizeHistogram {
    fn default() -> Self {
        SizeHistogram { counts: [0; 64] }
    }
}

impl SizeHistogram {
    #[inline]
    pub fn record(&mut self, bytes: u64) {
        self.counts[bytes.max(1).ilog2() as usize] += 1;
    }

    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(k, &c)| (1u64 << k, c)).collect()
    }
}
