//! Opens what the user names (a workload `.toml`, a trace `.csv`) as a re-playable event source.

use std::borrow::Cow;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::InputError;
use crate::event::{infallible, EventStream};
use crate::files::{sha256_file, sha256_hex};
use crate::results::WorkloadInfo;
use crate::trace::{read_trace, Sites};
use crate::workload::Workload;

/// Where events come from. Each call of [`Source::events`] starts the stream afresh, so every
/// allocator in a comparison replays the identical events.
pub enum Source {
    Workload(Box<Workload>),
    Trace(PathBuf),
    /// A PyTorch snapshot or an RMM log, converted in memory.
    Imported(Box<crate::trace::snapshot::ImportedTrace>, PathBuf),
    /// The default input: GPT-3 XL (1.3B) training captured from real PyTorch, in the binary.
    Embedded,
}

/// `workloads/captured/gpt3-xl-1.3b.csv.gz` (`scripts/capture_workloads.sh`): the demo's input, so
/// that it shows what PyTorch really allocates rather than a model of it.
const EMBEDDED_TRACE_GZ: &[u8] = include_bytes!("../workloads/captured/gpt3-xl-1.3b.csv.gz");
const EMBEDDED_TRACE_ORIGIN: &str = "(embedded) workloads/captured/gpt3-xl-1.3b.csv.gz";

fn embedded_trace() -> impl BufRead + Send {
    BufReader::new(flate2::read::MultiGzDecoder::new(EMBEDDED_TRACE_GZ))
}

/// What a capture's header says about where the trace came from ("" for other traces).
fn capture_description(trace: impl BufRead) -> String {
    let (mut torch, mut script) = (None, None);
    for line in trace.lines().take(32).map_while(Result::ok) {
        let Some(comment) = line.strip_prefix("# ") else { break };
        if comment.starts_with("torch ") {
            torch = Some(comment.split(',').next().unwrap_or(comment).to_string());
        } else if let Some(s) = comment.strip_prefix("script: ") {
            script = Some(s.to_string());
        }
    }
    match (torch, script) {
        (Some(torch), Some(script)) => format!("captured from {torch}: {script}"),
        _ => String::new(),
    }
}

/// How much of a plain trace's end is read for a capture's closing marker.
const CAPTURE_MARKER_TAIL_BYTES: u64 = 64 * 1024;
/// How much of a file's start is read to find its header comments.
const HEADER_SNIFF_BYTES: u64 = 64 * 1024;

/// The first header line of a capture (`allocbench trace` keeps it in its copies' headers).
const CAPTURE_HEADER: &str = "allocbench capture v1";

/// The comment lines (without `# `) that open a plain trace, before its CSV header (64 at most:
/// room for a capture's header and a few generations of `allocbench trace` copies).
fn header_comments(path: &Path) -> Vec<String> {
    let Ok(reader) = read_trace(path) else { return Vec::new() };
    // (Bounded: a file whose first "line" is gigabytes long must not be read whole to sniff it.)
    std::io::BufRead::lines(std::io::Read::take(reader.into_inner(), HEADER_SNIFF_BYTES))
        .take(64)
        .map_while(Result::ok)
        .map_while(|l| l.strip_prefix("# ").map(str::to_string))
        .collect()
}

/// The end of a capture's trace (header `# allocbench capture v1`), where its closing lines are:
/// `None` for other files. A gzip one is decoded to its end (a stream cut short, up to the cut).
fn capture_tail(path: &Path) -> Option<String> {
    use std::io::{Seek, SeekFrom};
    if !header_comments(path).iter().any(|c| c.starts_with(CAPTURE_HEADER)) {
        return None;
    }
    let mut tail = Vec::new();
    if crate::trace::csv::is_gzip_name(path) {
        tail = gzip_tail(std::fs::File::open(path).ok()?);
    } else {
        let mut file = std::fs::File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(CAPTURE_MARKER_TAIL_BYTES))).ok()?;
        file.read_to_end(&mut tail).ok()?;
    }
    Some(String::from_utf8_lossy(&tail).into_owned())
}

/// The last [`CAPTURE_MARKER_TAIL_BYTES`] of a gzip stream, decoded to its end (a stream cut
/// short, up to the cut) keeping only those (a large capture, or a gzip bomb with a capture
/// header, must not be held whole).
fn gzip_tail(compressed: impl Read) -> Vec<u8> {
    let mut gz = flate2::read::MultiGzDecoder::new(compressed);
    let (mut tail, mut chunk) = (Vec::new(), vec![0u8; 1 << 16]);
    let keep = CAPTURE_MARKER_TAIL_BYTES as usize;
    while let Ok(n) = gz.read(&mut chunk) {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > 4 * keep {
            tail.drain(..tail.len() - keep);
        }
    }
    tail.drain(..tail.len().saturating_sub(keep));
    tail
}

/// A capture's `# flops: N ...` line, the device's math over the run.
fn capture_flops(tail: &str) -> Option<f64> {
    let said = tail.lines().rev().find_map(|l| l.strip_prefix("# flops: "))?;
    said.split(' ').next()?.parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0)
}

/// Why a capture's trace is incomplete: its last marker says `# capture incomplete: WHY` (a
/// script that raised or exited non-zero, or an interpreter that died), or it has no closing
/// marker at all (cut short: copied while the capture ran, or truncated). `None` for a complete
/// capture and for other traces.
fn capture_incomplete(tail: &str) -> Option<String> {
    match tail.lines().rev().find(|l| l.starts_with("# capture ")) {
        Some(marker) => marker.strip_prefix("# capture incomplete: ").map(str::to_string),
        None => Some("cut short: no closing line, so it was truncated or copied while the capture ran".into()),
    }
}

/// The allocator settings the captured script made itself (`# allocator settings made by the
/// script: CONF`), which a replay applies only when given as `--conf`.
fn capture_script_conf(tail: &str) -> Option<String> {
    tail.lines().rev().find_map(|l| l.strip_prefix("# allocator settings made by the script: ")).map(str::to_string)
}

/// Whether a plain (not gzip) file's last row has no line end: it may have been cut (a file
/// that ends on its CSV header has no row to cut).
fn ends_mid_row(path: &Path) -> bool {
    use std::io::{Seek, SeekFrom};
    if crate::trace::csv::is_gzip_name(path) {
        return false; // a cut gzip stream fails to decode, with its line
    }
    let Ok(mut file) = std::fs::File::open(path) else { return false };
    let mut tail = Vec::new();
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file.seek(SeekFrom::Start(len.saturating_sub(256))).is_err() || file.read_to_end(&mut tail).is_err() {
        return false;
    }
    let last_row = tail.rsplit(|&b| b == b'\n').next().unwrap_or(&[]);
    !last_row.is_empty() && !last_row.starts_with(b"#") && last_row.trim_ascii() != crate::trace::csv::HEADER.as_bytes()
}

/// The fake card a capture ran on (`# fake card memory: N bytes`, `capture --device-memory`); a
/// header that says no device (0 bytes, not a number: edited by hand) is an error naming the file.
fn capture_device_memory(path: &Path) -> Result<Option<u64>, InputError> {
    let Some(said) = header_comments(path).into_iter().find_map(|c| c.strip_prefix("fake card memory: ").map(str::to_owned)) else {
        return Ok(None);
    };
    if said.starts_with("unbounded") {
        return Ok(None); // (the capture raised no OOM: the trace is the whole run, for any card)
    }
    let bytes = said.split(' ').next().and_then(|n| n.parse::<u64>().ok());
    let checked = bytes.ok_or_else(|| "not a number of bytes".to_string()).and_then(crate::units::check_capacity);
    checked.map(Some).map_err(|m| InputError::new(path.display().to_string(), format!("its header '# fake card memory: {said}': {m}")))
}

impl Source {
    /// For a capture's trace, the comment lines a copy keeps: its header (provenance, what was
    /// modelled) and its closing lines (the settings the script made, whether it completed; a
    /// capture cut short gets an `incomplete` marker).
    pub fn capture_comments(&self) -> Option<(Vec<String>, Vec<String>)> {
        let Source::Trace(p) = self else { return None };
        let tail = capture_tail(p)?;
        let mut closing: Vec<String> = capture_script_conf(&tail).map(|c| format!("allocator settings made by the script: {c}")).into_iter().collect();
        closing.push(match capture_incomplete(&tail) {
            Some(why) if ends_mid_row(p) => format!("capture incomplete: {why}; its last row was cut"),
            Some(why) => format!("capture incomplete: {why}"),
            None => tail.lines().rev().find_map(|l| l.strip_prefix("# ").filter(|c| c.starts_with("capture "))).unwrap_or("capture complete").to_string(),
        });
        Some((header_comments(p), closing))
    }

    /// The math the device does over the whole input, as `torch.utils.flop_counter` counts it: a
    /// capture's `# flops:` line, a transformer workload's model; `None` where nothing says.
    pub fn flops(&self) -> Option<f64> {
        match self {
            Source::Trace(p) => capture_flops(&capture_tail(p)?),
            Source::Embedded => capture_flops(&String::from_utf8_lossy(&gzip_tail(EMBEDDED_TRACE_GZ))),
            Source::Workload(w) => w.flops(),
            Source::Imported(..) => None,
        }
    }

    /// NCCL's buffers for a rank of a sharded capture (`capture --nproc-per-node`: its
    /// communicators) or workload (`[transformer.fsdp]`); `None` for one process and any other
    /// input.
    pub fn nccl_budget(&self) -> Option<crate::results::NcclBudget> {
        match self {
            Source::Trace(p) => crate::results::NcclBudget::from_capture(&capture_tail(p)?),
            Source::Workload(w) => w.nccl_budget(),
            _ => None,
        }
    }

    /// The memory of the fake card a capture ran on, when the trace says (`capture
    /// --device-memory`): the device its script's OOM handling was sized for.
    pub fn capture_device_memory(&self) -> Result<Option<u64>, InputError> {
        match self {
            Source::Trace(p) => capture_device_memory(p),
            _ => Ok(None),
        }
    }

    /// Why a capture's trace is not its whole run (it ended at an error, an OOM of its fake card,
    /// an interrupt, or was cut), or `None` for a complete capture or any other input.
    pub fn capture_incomplete(&self) -> Option<String> {
        let Source::Trace(p) = self else { return None };
        capture_incomplete(&capture_tail(p)?)
    }

    /// What a reader should be told about the input before its numbers (on standard error): what
    /// an import left out, a capture that did not finish, settings the captured script made, a
    /// last row without its line end.
    pub fn notes(&self) -> Vec<String> {
        match self {
            Source::Imported(t, p) => t.notes.iter().map(|n| format!("note: {}: {n}", p.display())).collect(),
            Source::Trace(p) => {
                let mut out = Vec::new();
                if let Some(tail) = capture_tail(p) {
                    if let Some(why) = capture_incomplete(&tail) {
                        out.push(format!(
                            "warning: {} is an incomplete capture ({why}): its numbers cover only what ran before the script stopped",
                            p.display()
                        ));
                    }
                    let made_up: Vec<&str> = tail.lines().filter_map(|l| l.strip_prefix("# value made up: ")).collect();
                    if let Some(first) = made_up.first() {
                        let count: u64 = made_up.iter().filter_map(|l| l.split_once(" ×").and_then(|(_, n)| n.split(' ').next()?.parse::<u64>().ok())).sum();
                        out.push(format!(
                            "note: {}: the capture made up {} at {} (first: {first}); the script's control flow there followed the stand-in, not data (docs/capture.md, 'Values')",
                            p.display(),
                            crate::units::count(count, "value"),
                            crate::units::count(made_up.len() as u64, "site")
                        ));
                    }
                    if let Some(conf) = capture_script_conf(&tail) {
                        out.push(format!(
                            "note: {}: the captured script set the allocator's settings ({conf}); replays use PyTorch's defaults unless given --conf '{conf}'",
                            p.display()
                        ));
                    }
                }
                if ends_mid_row(p) {
                    out.push(format!("warning: {}: the last row has no line end: the file may have been cut short inside it", p.display()));
                }
                out
            }
            _ => Vec::new(),
        }
    }

    /// `None` means the embedded default input: the captured GPT-3 XL training trace.
    pub fn open(path: Option<&Path>) -> anyhow::Result<Source> {
        Source::open_snapshot_device(path, None)
    }

    /// [`Source::open`]; a PyTorch snapshot gives device `snapshot_device`'s history (`None`: the
    /// first recorded), and any other input refuses a device.
    pub fn open_snapshot_device(path: Option<&Path>, snapshot_device: Option<usize>) -> anyhow::Result<Source> {
        let Some(path) = path else {
            return Ok(Source::Embedded);
        };
        if !path.exists() {
            return Err(InputError::new(path.display().to_string(), "no such file").into());
        }
        // `trace.csv.gz` is a CSV trace read through gzip.
        let named = if crate::trace::csv::is_gzip_name(path) { path.with_extension("") } else { path.to_path_buf() };
        let ext = named.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match ext.as_str() {
            _ if snapshot_device.is_some() && !matches!(ext.as_str(), "pickle" | "pkl" | "json") => Err(InputError::new(
                "--snapshot-device",
                format!("{} is not a PyTorch memory snapshot (.pickle or .json): only a snapshot holds several devices' histories", path.display()),
            )
            .into()),
            "toml" => Ok(Source::Workload(Box::new(Workload::load(path)?))),
            "pickle" | "pkl" | "json" => {
                let t = crate::trace::snapshot::import_snapshot_of_device(path, snapshot_device)?;
                Ok(Source::Imported(Box::new(t), path.to_path_buf()))
            }
            "csv" if crate::trace::snapshot::is_rmm_log(path) => {
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
                "unknown input type: expected a workload (.toml), a trace (.csv or .csv.gz) or RMM log (.csv), or a PyTorch snapshot (.pickle, or .json)",
            )
            .into()),
        }
    }

    pub fn events(&self) -> anyhow::Result<EventStream<'_>> {
        match self {
            Source::Workload(w) => Ok(infallible(w.events())),
            Source::Trace(p) => Ok(Box::new(crate::trace::ReadAhead::spawn(read_trace(p)?))),
            Source::Imported(t, _) => Ok(Box::new(t.events.iter().copied().map(Ok))),
            Source::Embedded => Ok(Box::new(crate::trace::ReadAhead::spawn(crate::trace::TraceReader::new(embedded_trace(), EMBEDDED_TRACE_ORIGIN)))),
        }
    }

    /// Where the events come from, as errors name it: the file, or the embedded trace's origin.
    pub fn origin(&self) -> String {
        match self {
            Source::Workload(w) => w.origin.clone(),
            Source::Trace(p) | Source::Imported(_, p) => p.display().to_string(),
            Source::Embedded => EMBEDDED_TRACE_ORIGIN.into(),
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
                // One device's history of a snapshot of several is named for it: reports would
                // take two devices' replays for repetitions of one workload.
                name: {
                    let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("snapshot");
                    t.device_of_several.map_or_else(|| stem.to_string(), |d| format!("{stem}-device{d}"))
                },
                kind: t.format.to_string(),
                origin: p.display().to_string(),
                sha256: sha256_hex(&std::fs::read(p).unwrap_or_default()),
                seed: None,
                description: t.notes.join("; "),
            },
            Source::Trace(p) => {
                let sha256 = sha256_file(p)?;
                let description = read_trace(p).map(|r| capture_description(r.into_inner())).unwrap_or_default();
                WorkloadInfo { name: trace_name(p), kind: "trace".into(), origin: p.display().to_string(), sha256, seed: None, description }
            }
            Source::Embedded => WorkloadInfo {
                name: trace_name(Path::new(EMBEDDED_TRACE_ORIGIN)),
                kind: "trace".into(),
                origin: EMBEDDED_TRACE_ORIGIN.into(),
                sha256: sha256_hex(EMBEDDED_TRACE_GZ),
                seed: None,
                description: capture_description(embedded_trace()),
            },
        })
    }

    /// The trace a results record replayed, found again by its sha256 (the record's `workload`):
    /// at its `origin`, among the shipped captures (`workloads/captured/`, from the working
    /// directory), or the embedded demo trace. `None` when no file here has those bytes.
    pub fn find_recorded(info: &WorkloadInfo) -> Option<Source> {
        if info.kind != "trace" {
            return None;
        }
        if info.origin == EMBEDDED_TRACE_ORIGIN && info.sha256 == sha256_hex(EMBEDDED_TRACE_GZ) {
            return Some(Source::Embedded);
        }
        let shipped = std::fs::read_dir("workloads/captured").into_iter().flatten().filter_map(|e| e.ok().map(|e| e.path()));
        let mut candidates = std::iter::once(PathBuf::from(&info.origin)).chain(shipped);
        candidates
            .find(|p| {
                let name = p.to_string_lossy().to_ascii_lowercase();
                (name.ends_with(".csv") || name.ends_with(".csv.gz")) && p.is_file() && sha256_file(p).is_ok_and(|sha| sha == info.sha256)
            })
            .map(Source::Trace)
    }

    /// Where the input says each allocation was made: a snapshot's frames, a capture's `#site`
    /// lines (one more pass over a trace); `None` when it says nothing.
    pub fn sites(&self) -> anyhow::Result<Option<Cow<'_, Sites>>> {
        let sites = match self {
            Source::Imported(t, _) => Cow::Borrowed(&t.sites),
            Source::Trace(p) => Cow::Owned(read_trace(p)?.read_sites()?),
            Source::Embedded => Cow::Owned(crate::trace::TraceReader::new(embedded_trace(), EMBEDDED_TRACE_ORIGIN).read_sites()?),
            Source::Workload(_) => return Ok(None),
        };
        Ok(Some(sites).filter(|s| !s.is_empty()))
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
            Source::Trace(_) | Source::Imported(..) | Source::Embedded => None,
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
