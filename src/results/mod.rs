//! The results schema: every type allocbench serialises, one versioned record per kind of run,
//! written as JSON (one file per run) or JSON Lines (sweeps). Reports and comparisons read only
//! these files.
//!
//! This is layer 2: it imports only `error` (and external crates), never the code that fills
//! the records, so everything above can depend on it without a circle. Closed sets are enums
//! (`OomCause`, `BlockState`, `SegmentType`, `Backend`, `OnOom`, `CpuMode`) serialised to the
//! same strings as before. One file per kind of record:
//! - [`gpu`]: `GpuRunResult` and what it holds (OOM, timeline, segment maps);
//! - [`cpu`]: `CpuRunResult` (latency, live malloc, RSS samples);
//! - [`devprobe`]: `DevprobeResult`; [`diagnose`]: `DiagnoseResult` and advise's `Candidate`;
//! - [`fidelity`]: torch_replay.py's document and the fidelity report.

pub mod cpu;
pub mod devprobe;
pub mod diagnose;
pub mod fidelity;
pub mod gpu;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::InputError;

pub use cpu::{CpuMode, CpuRunResult, Latency, LiveMalloc, RssSample};
pub use devprobe::{DevprobeResult, SizeLatency};
pub use diagnose::{Candidate, DiagnoseResult, PinningClass, SegmentWaste};
pub use fidelity::{FidelityReport, Mismatch, TorchOom, TorchReplay, TorchStep};
pub use gpu::{Backend, BlockSnapshot, BlockState, GpuRunResult, GpuSummary, OnOom, OomCause, OomRecord, SegmentSnapshot, SegmentType, TimelinePoint};

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

/// Any results record, tagged by `"type"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultRecord {
    GpuReplay(Box<GpuRunResult>),
    CpuRun(Box<CpuRunResult>),
    Devprobe(Box<DevprobeResult>),
    Diagnose(Box<DiagnoseResult>),
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

/// Writes one document as pretty-printed JSON with a final newline, and flushes.
pub fn write_json_pretty<T: Serialize + ?Sized>(mut out: &mut dyn Write, value: &T) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
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
