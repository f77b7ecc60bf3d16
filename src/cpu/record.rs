//! `allocbench cpu --record -o TRACE -- CMD`: runs a program with the malloc recorder
//! (`recorder.cpp`, built with g++ at first use and cached) preloaded in its whole process tree,
//! samples the tree's RSS as `--exec` does, and turns the recorder's spool files into a recorded
//! trace ([`super::recorded`]).

use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;

use super::exec::{self, ExecAllocator, ExecOptions};
use super::recorded::{Call, ProcessInfo, Recorded, RecordedTrace, RecordingInfo};
use crate::error::InputError;
use crate::results::CpuExecResult;

/// The recorder's source, compiled at first use.
pub const RECORDER_CPP: &str = include_str!("recorder.cpp");
/// The environment variable that tells the recorder where to spool.
const SPOOL_ENV: &str = "ALLOCBENCH_RECORD_DIR";

/// Builds the recorder once per source (cached under `~/.cache/allocbench/recorder/`).
pub fn build_recorder() -> Result<PathBuf, InputError> {
    let key = crate::files::build_key(&[RECORDER_CPP.as_bytes()]);
    let dir = crate::files::cache_dir("recorder").join(format!("{key:016x}"));
    let lib = dir.join("liballocbench_recorder.so");
    if lib.is_file() {
        return Ok(lib);
    }
    let err = |m: String| InputError::new("--record", m);
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create the cache folder {}: {e}", dir.display())))?;
    let work = tempfile::Builder::new().prefix("build-").tempdir_in(&dir).map_err(|e| err(format!("cannot write in {}: {e}", dir.display())))?;
    let src = work.path().join("recorder.cpp");
    std::fs::write(&src, RECORDER_CPP).map_err(|e| err(format!("cannot write {}: {e}", src.display())))?;
    let built = work.path().join("liballocbench_recorder.so");
    // No C++ runtime: the recorder uses none, and libstdc++ would load (and allocate) in every
    // recorded process.
    let flags = ["-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-fno-exceptions", "-fno-rtti", "-fno-threadsafe-statics", "-nodefaultlibs"];
    let args = flags
        .iter()
        .map(std::ffi::OsStr::new)
        .chain([src.as_os_str(), "-o".as_ref(), built.as_os_str()])
        .chain(["-lc", "-lgcc", "-ldl", "-lpthread"].map(std::ffi::OsStr::new));
    crate::files::run_gxx(args, "the malloc recorder").map_err(err)?;
    std::fs::rename(&built, &lib).map_err(|e| err(format!("cannot keep the build: {e}")))?;
    Ok(lib)
}

/// CLOCK_MONOTONIC in ns: the recorder's clock (and `Instant`'s).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, a live local here.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What a recording gave: the trace written and the run as `--exec` measures one.
pub struct Recording {
    pub trace: RecordedTrace,
    pub run: CpuExecResult,
}

/// Records `command` into `out`. The trace is written whatever the program's end (its exit status
/// and any signal are in the header); only a program that could not start is an error.
pub fn record(command: &[String], out: &Path, sample_interval: std::time::Duration, program_stdout_to_stderr: bool) -> anyhow::Result<Recording> {
    let lib = build_recorder()?;
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // The spool sits beside the output (same file system, and kept if allocbench itself dies).
    let spool = tempfile::Builder::new()
        .prefix(".allocbench-record-")
        .tempdir_in(dir)
        .map_err(|e| InputError::new(out.display().to_string(), format!("cannot write beside it: {e}")))?;
    let opts = ExecOptions { sample_interval, program_stdout_to_stderr, env: vec![(SPOOL_ENV.to_string(), spool.path().display().to_string())] };
    let recorder = ExecAllocator { name: "glibc".into(), library: Some(lib) };
    let t0 = monotonic_ns();
    let run = exec::run_once(command, &recorder, 1, &opts);
    if run.exit_code >= 126 && run.wall_s == 0.0 {
        return Err(InputError::new(&command[0], run.error.clone().unwrap_or_else(|| "cannot run it".into())).into());
    }
    let trace = from_spool(spool.path(), t0, command, &run)?;
    super::recorded::write(out, &trace)?;
    Ok(Recording { trace, run })
}

/// One 32-byte spool record (recorder.cpp's `Rec`).
#[derive(Clone, Copy)]
struct SpoolRec {
    op: u8,
    align_log2: u8,
    seq: u64,
    t_ns: u64,
    ptr: u64,
    bytes: u64,
}

/// A spool file: one process image.
struct Spool {
    pid: u32,
    ppid: u32,
    start_ns: u64,
    cmdline: Vec<String>,
    /// (thread id, record), in each thread's own order.
    recs: Vec<(u32, SpoolRec)>,
}

const SPOOL_HEADER: usize = 32;
const CHUNK_MAGIC: u32 = 0x4352_4241;

fn read_spool(path: &Path) -> Result<Spool, InputError> {
    let name = path.display().to_string();
    let data = std::fs::read(path).map_err(|e| InputError::new(&name, format!("cannot read the recorder's spool: {e}")))?;
    if data.len() < SPOOL_HEADER || &data[..8] != b"ABRSPOOL" {
        return Err(InputError::new(&name, "not a recorder spool file"));
    }
    let u32_at = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().expect("8 bytes"));
    let (pid, ppid, cmd_len, start_ns) = (u32_at(12), u32_at(16), u32_at(20) as usize, u64_at(24));
    let cmd_end = (SPOOL_HEADER + cmd_len).min(data.len());
    let cmdline = data[SPOOL_HEADER..cmd_end].split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    let mut recs = Vec::new();
    let mut at = cmd_end;
    // A chunk cut short (a full disk) ends the file's usable part.
    while at + 16 <= data.len() && u32_at(at) == CHUNK_MAGIC {
        let (tid, count) = (u32_at(at + 4), u32_at(at + 8) as usize);
        at += 16;
        if at + count * 32 > data.len() {
            break;
        }
        for _ in 0..count {
            let op_seq = u64_at(at);
            recs.push((
                tid,
                SpoolRec {
                    op: (op_seq >> 56) as u8,
                    align_log2: ((op_seq >> 48) & 0xff) as u8,
                    seq: op_seq & ((1 << 48) - 1),
                    t_ns: u64_at(at + 8),
                    ptr: u64_at(at + 16),
                    bytes: u64_at(at + 24),
                },
            ));
            at += 32;
        }
    }
    Ok(Spool { pid, ppid, start_ns, cmdline, recs })
}

/// A spool record placed in the process's call order.
#[derive(Clone, Copy)]
enum Step {
    /// A block handed out (malloc, calloc, aligned; a realloc's new block with the pair index).
    Out { tid: u32, rec: SpoolRec, realloc: Option<u32> },
    /// A block given back by free.
    Back { tid: u32, rec: SpoolRec },
    /// A realloc's old block given back (numbered before the call).
    ReallocBack { ptr: u64, pair: u32 },
}

/// Turns one spool into its calls in order: blocks get ids by the order they were handed out,
/// matched to their frees by address in sequence order.
fn calls_of(spool: &Spool, t0: u64) -> (ProcessInfo, Vec<Recorded>) {
    let mut steps: Vec<(u64, Step)> = Vec::with_capacity(spool.recs.len());
    let mut pairs = 0u32;
    let mut i = 0;
    while i < spool.recs.len() {
        let (tid, rec) = spool.recs[i];
        match rec.op {
            1..=3 => steps.push((rec.seq, Step::Out { tid, rec, realloc: None })),
            4 => steps.push((rec.seq, Step::Back { tid, rec })),
            // REALLOC_FROM is always followed by its REALLOC_TO (written together).
            5 if i + 1 < spool.recs.len() && spool.recs[i + 1].1.op == 6 && spool.recs[i + 1].0 == tid => {
                steps.push((rec.seq, Step::ReallocBack { ptr: rec.ptr, pair: pairs }));
                let to = spool.recs[i + 1].1;
                steps.push((to.seq, Step::Out { tid, rec: to, realloc: Some(pairs) }));
                pairs += 1;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    steps.sort_unstable_by_key(|&(seq, _)| seq);
    let mut live: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
    let mut realloc_old: Vec<Option<(u64, u64)>> = vec![None; pairs as usize];
    let mut threads: FxHashMap<u32, u32> = FxHashMap::default();
    let mut calls = Vec::with_capacity(steps.len());
    let (mut next_id, mut live_bytes, mut peak, mut unmatched, mut unseen) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for (_, step) in steps {
        match step {
            Step::ReallocBack { ptr, pair } => {
                if ptr != 0 {
                    match live.remove(&ptr) {
                        Some(b) => realloc_old[pair as usize] = Some(b),
                        None => unmatched += 1,
                    }
                }
            }
            Step::Back { tid, rec } => {
                let Some((id, bytes)) = live.remove(&rec.ptr) else {
                    unmatched += 1;
                    continue;
                };
                live_bytes -= bytes;
                let n = threads.len() as u32;
                let thread = *threads.entry(tid).or_insert(n);
                calls.push(Recorded { thread, t_ns: rec.t_ns.saturating_sub(t0), call: Call::Free { id } });
            }
            Step::Out { tid, rec, realloc } => {
                let n = threads.len() as u32;
                let thread = *threads.entry(tid).or_insert(n);
                let t_ns = rec.t_ns.saturating_sub(t0);
                if let Some((old, bytes)) = live.remove(&rec.ptr) {
                    // Handed out again while live: its free was not seen (made inside glibc).
                    unseen += 1;
                    live_bytes -= bytes;
                    calls.push(Recorded { thread, t_ns, call: Call::Free { id: old } });
                }
                let call = match (rec.op, realloc) {
                    (_, Some(pair)) => {
                        let old = realloc_old[pair as usize];
                        if let Some((_, b)) = old {
                            live_bytes -= b;
                        }
                        Call::Realloc { old: old.map(|(id, _)| id), bytes: rec.bytes }
                    }
                    (1, None) => Call::Malloc { bytes: rec.bytes },
                    (2, None) => Call::Calloc { bytes: rec.bytes },
                    (_, None) => Call::Aligned { align_log2: rec.align_log2, bytes: rec.bytes },
                };
                live.insert(rec.ptr, (next_id, rec.bytes));
                next_id += 1;
                live_bytes += rec.bytes;
                peak = peak.max(live_bytes);
                calls.push(Recorded { thread, t_ns, call });
            }
        }
    }
    let info = ProcessInfo {
        pid: spool.pid,
        ppid: spool.ppid,
        cmdline: spool.cmdline.clone(),
        start_s: spool.start_ns.saturating_sub(t0) as f64 / 1e9,
        threads: threads.len() as u32,
        calls: calls.len() as u64,
        unmatched_frees: unmatched,
        unseen_frees: unseen,
        peak_live_bytes: peak,
        live_bytes_end: live_bytes,
    };
    (info, calls)
}

/// Reads every spool file in `dir` into a trace: the processes with calls, by start time.
fn from_spool(dir: &Path, t0: u64, command: &[String], run: &CpuExecResult) -> anyhow::Result<RecordedTrace> {
    let mut spools = Vec::new();
    // A spool without its header (a process killed between creating and heading it, a full
    // disk) is left out and said so; the others are the trace.
    let mut unreadable = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "spool") {
            match read_spool(&path) {
                Ok(s) => spools.push(s),
                Err(e) => unreadable.push(e.to_string()),
            }
        }
    }
    spools.sort_by_key(|s| (s.start_ns, s.pid));
    let mut processes = Vec::new();
    let mut calls = Vec::new();
    for s in &spools {
        let (info, c) = calls_of(s, t0);
        if !c.is_empty() {
            processes.push(info);
            calls.push(c);
        }
    }
    let mut incomplete = match (run.exit_code, &run.error) {
        (0, None) => None,
        (_, Some(e)) => Some(format!("{e}: calls still in a thread's buffer were lost")),
        (code, None) => Some(format!("exited with status {code}")),
    };
    if let Some(first) = unreadable.first() {
        let why = format!("{} process(es) left out, their recording unreadable ({first})", unreadable.len());
        incomplete = Some(match incomplete {
            Some(i) => format!("{i}; {why}"),
            None => why,
        });
    }
    let info = RecordingInfo {
        command: command.to_vec(),
        exit_code: run.exit_code,
        incomplete,
        wall_s: run.wall_s,
        rss: run.rss.clone(),
        peak_rss_bytes: run.peak_rss_bytes,
        recorder: format!("allocbench {}", env!("CARGO_PKG_VERSION")),
        processes,
    };
    Ok(RecordedTrace { info, calls })
}
