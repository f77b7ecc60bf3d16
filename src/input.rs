//! Opens what the user names (a workload `.toml`, a trace `.csv`) as a re-playable event source.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::InputError;
use crate::event::{infallible, EventStream};
use crate::results::WorkloadInfo;
use crate::trace::read_trace;
use crate::workload::Workload;

/// Where events come from. Each call of [`Source::events`] starts the stream afresh, so every
/// allocator in a comparison replays the identical events.
pub enum Source {
    Workload(Box<Workload>),
    Trace(PathBuf),
    /// A PyTorch snapshot or an RMM log, converted in memory.
    Imported(Box<crate::trace::snapshot::ImportedTrace>, PathBuf),
}

impl Source {
    /// `None` means the embedded default workload.
    pub fn open(path: Option<&Path>) -> anyhow::Result<Source> {
        let Some(path) = path else {
            return Ok(Source::Workload(Box::new(Workload::default_embedded())));
        };
        if !path.exists() {
            return Err(InputError::new(path.display().to_string(), "no such file").into());
        }
        // `trace.csv.gz` is a CSV trace read through gzip.
        let named = if crate::trace::csv::is_gzip_name(path) { path.with_extension("") } else { path.to_path_buf() };
        let ext = named.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match ext.as_str() {
            "toml" => Ok(Source::Workload(Box::new(Workload::load(path)?))),
            "pickle" | "pkl" => {
                let t = crate::trace::snapshot::import_snapshot(path)?;
                Ok(Source::Imported(Box::new(t), path.to_path_buf()))
            }
            "csv" if !crate::trace::csv::is_gzip_name(path) && crate::trace::snapshot::is_rmm_log(path) => {
                let t = crate::trace::snapshot::import_rmm_log(path)?;
                Ok(Source::Imported(Box::new(t), path.to_path_buf()))
            }
            "csv" => {
                // Read the first line now, so that a wrong file fails before any work starts.
                let mut probe = read_trace(path)?;
                if let Some(Err(e)) = probe.next() {
                    return Err(e);
                }
                Ok(Source::Trace(path.to_path_buf()))
            }
            _ => Err(InputError::new(
                path.display().to_string(),
                "unknown input type: expected a workload (.toml), a trace (.csv or .csv.gz) or RMM log (.csv), or a PyTorch snapshot (.pickle)",
            )
            .into()),
        }
    }

    pub fn events(&self) -> anyhow::Result<EventStream<'_>> {
        match self {
            Source::Workload(w) => Ok(infallible(w.events())),
            Source::Trace(p) => Ok(Box::new(read_trace(p)?)),
            Source::Imported(t, _) => Ok(Box::new(t.events.iter().copied().map(Ok))),
        }
    }

    pub fn info(&self) -> anyhow::Result<WorkloadInfo> {
        Ok(match self {
            Source::Workload(w) => WorkloadInfo {
                name: w.file.name.clone(),
                kind: w.kind().to_string(),
                origin: w.origin.clone(),
                sha256: sha256_hex(w.source.as_bytes()),
                seed: Some(w.file.seed),
                description: w.file.description.clone(),
            },
            Source::Imported(t, p) => WorkloadInfo {
                name: p.file_stem().and_then(|s| s.to_str()).unwrap_or("snapshot").to_string(),
                kind: t.format.to_string(),
                origin: p.display().to_string(),
                sha256: sha256_hex(&std::fs::read(p).unwrap_or_default()),
                seed: None,
                description: t.notes.join("; "),
            },
            Source::Trace(p) => {
                let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
                let mut f = std::fs::File::open(p).map_err(|e| InputError::new(p.display().to_string(), e.to_string()))?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    sha2::Digest::update(&mut hasher, &buf[..n]);
                }
                WorkloadInfo {
                    name: trace_name(p),
                    kind: "trace".into(),
                    origin: p.display().to_string(),
                    sha256: hex(&sha2::Digest::finalize(hasher)),
                    seed: None,
                    description: String::new(),
                }
            }
        })
    }

    /// cudaMalloc addresses recorded with the history (PyTorch snapshots), for the simulated device.
    pub fn address_script(&self) -> Vec<(u64, u64)> {
        match self {
            Source::Imported(t, _) => t.segment_addresses.clone(),
            _ => Vec::new(),
        }
    }

    /// The device size the workload says it is sized for, if any.
    pub fn sized_for(&self) -> Option<u64> {
        match self {
            Source::Workload(w) => w.file.sized_for.map(|b| b.0),
            Source::Trace(_) | Source::Imported(..) => None,
        }
    }
}

/// A trace's name: its file name without `.csv` or `.csv.gz`.
fn trace_name(path: &Path) -> String {
    let file = path.file_name().and_then(|s| s.to_str()).unwrap_or("trace");
    let lower = file.to_ascii_lowercase();
    let cut = [".csv.gz", ".gz", ".csv"].iter().find(|ext| lower.ends_with(*ext)).map_or(0, |ext| ext.len());
    file[..file.len() - cut].to_string()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&<sha2::Sha256 as sha2::Digest>::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
