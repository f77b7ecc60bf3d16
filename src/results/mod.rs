//! The results schema: every type allocbench serialises, one versioned record per kind of run,
//! written as JSON (one file per run) or JSON Lines (sweeps). Reports and comparisons read only
//! these files.
//!
//! This is layer 2: it imports only `error` (and external crates), never the code that fills
//! the records, so everything above can depend on it without a circle. Closed sets are enums
//! (`OomCause`, `BlockState`, `SegmentType`, `Backend`, `OnOom`, `CpuMode`) serialised to the
//! same strings as before. One file per kind of record:
//! - [`common`]: what every record carries (machine, workload, work done);
//! - [`gpu`]: `GpuRunResult` and what it holds (OOM, timeline, segment maps);
//! - [`cpu`]: `CpuRunResult` (latency, live malloc, RSS samples);
//! - [`devprobe`]: `DevprobeResult`; [`diagnose`]: `DiagnoseResult`, and `AdviseResult` with its `Candidate`s;
//! - [`fidelity`]: torch_replay.py's document and the fidelity report;
//! - [`sweep`]: a sweep's plan rows and finished rows (`SweepRow`).

/// `as_str` (the serialised name) and `Display` (the same, padded as asked) for a closed set.
macro_rules! names {
    ($t:ty { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$v => $s),+
                }
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

pub mod common;
pub mod cpu;
pub mod devprobe;
pub mod diagnose;
pub mod fidelity;
pub mod gpu;
pub mod sweep;

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::InputError;

pub use common::{MachineInfo, NcclBudget, Outside, WorkDone, WorkloadInfo, CUDA_CONTEXT_BYTES};
pub use cpu::{CpuAdviseResult, CpuCandidate, CpuExecResult, CpuMode, CpuRunResult, Latency, LiveMalloc, RetainedAt, RssSample};
pub use devprobe::{DevprobeResult, SizeLatency};
pub use diagnose::{AdviseResult, Candidate, DiagnoseResult, Objective, PinningClass, SegmentWaste};
pub use fidelity::{FidelityReport, Mismatch, OracleComparison, OracleOom, OracleResult, Parting, TorchOom, TorchReplay, TorchStep};
pub use gpu::{
    Backend, BlockSnapshot, BlockState, GpuPolicy, GpuRunResult, GpuSummary, OnOom, OomCause, OomRecord, SegmentSnapshot, SegmentType, TimelinePoint,
};
pub use sweep::{PlanRow, RowStatus, SweepRow};

/// Bumped whenever a field changes meaning or is removed; readers refuse other versions.
pub const SCHEMA_VERSION: u32 = 1;

/// The largest results file (or sweep plan) read: 2 GiB of text.
pub const MAX_RESULTS_BYTES: u64 = 2 << 30;

/// Any results record, tagged by `"type"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultRecord {
    GpuReplay(Box<GpuRunResult>),
    CpuRun(Box<CpuRunResult>),
    CpuExec(Box<CpuExecResult>),
    Devprobe(Box<DevprobeResult>),
    Diagnose(Box<DiagnoseResult>),
    SweepRow(Box<SweepRow>),
    Advise(Box<AdviseResult>),
    CpuAdvise(Box<CpuAdviseResult>),
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

/// One record of this schema version from its JSON (`kind` names it in errors: "results", "sweep
/// plan"); another version, none, or a malformed record is an error naming `loc` and the `fix`.
pub fn from_versioned<T: serde::de::DeserializeOwned>(v: serde_json::Value, loc: &str, kind: &str, fix: &str) -> Result<T, InputError> {
    match v.get("schema_version").and_then(|x| x.as_u64()) {
        Some(x) if x == SCHEMA_VERSION as u64 => {}
        Some(x) => return Err(InputError::new(loc, format!("{kind} schema version {x}, but this allocbench reads version {SCHEMA_VERSION}: {fix}"))),
        None => return Err(InputError::new(loc, format!("not an allocbench {kind} record (no schema_version)"))),
    }
    serde_json::from_value(v).map_err(|e| InputError::new(loc, format!("malformed {kind} record: {e}")))
}

/// Reads a results file: one JSON document, or JSON Lines, gzip-compressed when its name ends in
/// `.gz`. Errors name the file and line and refuse other schema versions instead of drawing
/// broken charts.
pub fn read_results(path: &Path) -> anyhow::Result<Vec<ResultRecord>> {
    read_results_at_most(path, MAX_RESULTS_BYTES)
}

/// [`read_results`] of a file that holds at most `limit` bytes of text.
pub fn read_results_at_most(path: &Path, limit: u64) -> anyhow::Result<Vec<ResultRecord>> {
    let name = path.display().to_string();
    // `.gz`: the results a published report keeps beside it, compressed. (A fleet's merged sweep
    // is a few hundred MiB; a file past the bound is no results file to load whole.)
    let text = crate::files::read_text_at_most(path, limit, "a results file")?;
    const FIX: &str = "re-run the benchmark with this version";
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(InputError::new(&name, "empty results file").into());
    }
    // A whole-file JSON document (pretty-printed single run), else JSON Lines.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(trimmed) {
        return Ok(vec![from_versioned(v, &name, "results", FIX)?]);
    }
    Ok(versioned_lines(&name, &text, "results", FIX)?.into_iter().map(|(_, r)| r).collect())
}

/// The records of a JSON Lines text, each with its `file:line` and of this schema version (else
/// an error naming the file and line).
pub fn versioned_lines<T: serde::de::DeserializeOwned>(name: &str, text: &str, kind: &str, fix: &str) -> Result<Vec<(String, T)>, InputError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let loc = format!("{name}:{}", i + 1);
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| InputError::new(&loc, format!("not JSON: {e}")))?;
        let record = from_versioned(v, &loc, kind, fix)?;
        out.push((loc, record));
    }
    Ok(out)
}
