//! The oracle: PyTorch's own CUDA caching allocator (`libc10_cuda.so` of a given torch) run over
//! a trace on a fake CUDA runtime, on any machine with `g++` and a torch wheel (no GPU).
//!
//! Three native helpers, built at first use against that torch and cached (see [`build`]):
//! `fake_cudart.cpp` (a `libcudart.so.12` or `.13`, as the torch links, with the driver's VMM
//! calls behind `cudaGetDriverEntryPoint*`, that places segments and reservations as
//! [`SimDevice`] with [`AddressOrder::Lowest`] does, so placement is never a difference),
//! `fake_nvml.cpp` (a `libnvidia-ml.so.1` that reports no fabric memory) and `driver.cpp` (reads
//! events on standard input, drives `c10::cuda::CUDACachingAllocator`, writes JSON). A release
//! not installed here is fetched by `fetch_torch.py`; [`fuzz`] is the differential fuzz.
//!
//! [`SimDevice`]: super::device::SimDevice
//! [`AddressOrder::Lowest`]: super::device::AddressOrder::Lowest

pub mod fuzz;

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::Deserialize;

use super::torch_version::TorchVersion;
use crate::error::InputError;
use crate::event::{Event, PoolOp};
use crate::results::{BlockSnapshot, BlockState, OracleComparison, OracleOom, OracleResult, Parting, SegmentSnapshot, SegmentType};

const FAKE_CUDART_CPP: &str = include_str!("fake_cudart.cpp");
const FAKE_NVML_CPP: &str = include_str!("fake_nvml.cpp");
const DRIVER_CPP: &str = include_str!("driver.cpp");
const FETCH_TORCH_PY: &str = include_str!("fetch_torch.py");

/// Where the real allocator comes from, and how it is set up.
#[derive(Debug, Clone, Default)]
pub struct OracleOptions {
    /// The interpreter whose torch is used (`None`: `$ALLOCBENCH_PYTHON`, else `python3`).
    pub python: Option<String>,
    /// A torch/lib folder (holding `libc10_cuda.so`), instead of asking Python.
    pub libc10: Option<PathBuf>,
    /// A torch release to fetch (its c10 libraries and headers only) and cache, instead of
    /// asking Python.
    pub torch_version: Option<String>,
    /// `PYTORCH_CUDA_ALLOC_CONF` for the real allocator.
    pub conf: String,
    /// The fake card's memory in bytes.
    pub capacity: u64,
    /// Where the fake runtime (and the simulator compared with it) places segments.
    pub address_order: super::device::AddressOrder,
    /// The release whose rules the simulator follows in a comparison (default: the oracle's).
    pub simulate: Option<TorchVersion>,
}

/// A torch found on this machine: its libraries, headers and version.
#[derive(Debug, Clone)]
pub struct Torch {
    pub lib: PathBuf,
    pub include: PathBuf,
    /// A folder holding `cuda_runtime_api.h`.
    pub cuda_include: PathBuf,
    pub version: String,
    /// The CUDA runtime its `libc10_cuda.so` links (`libcudart.so.12`, `libcudart.so.13`).
    pub cudart: &'static str,
}

#[derive(Deserialize)]
struct DriverOutput {
    format: String,
    events: u64,
    stats: BTreeMap<String, i64>,
    #[serde(default)]
    peak_event: Option<u64>,
    oom: Option<DriverOom>,
    segments: Vec<DriverSegment>,
}

#[derive(Deserialize)]
struct DriverOom {
    event: u64,
    bytes: u64,
    stream: u64,
    message: String,
}

#[derive(Deserialize)]
struct DriverSegment {
    address: u64,
    total_size: u64,
    stream: u64,
    is_large: bool,
    #[serde(default)]
    is_expandable: bool,
    pool: (u64, u64),
    blocks: Vec<DriverBlock>,
}

#[derive(Deserialize)]
struct DriverBlock {
    size: u64,
    requested_size: u64,
    allocated: bool,
    active: bool,
}

/// The stream handles the driver makes: 0 is the null stream, stream `n` is `BASE + n * 0x100`.
const STREAM_HANDLE_BASE: u64 = 0x5f00_0000_0000;

fn stream_number(handle: u64) -> u64 {
    if handle == 0 {
        0
    } else {
        (handle - STREAM_HANDLE_BASE) / 0x100
    }
}

/// Finds the torch to use: `--libc10 DIR`, else `--torch-version V` (fetched once), else the
/// one the interpreter imports, else the newest verified release (fetched once).
pub fn find_torch(opts: &OracleOptions) -> Result<Torch, InputError> {
    let python = || opts.python.clone().or_else(|| std::env::var("ALLOCBENCH_PYTHON").ok().filter(|p| !p.is_empty())).unwrap_or_else(|| "python3".into());
    let lib = match (&opts.libc10, &opts.torch_version) {
        (Some(dir), _) => dir.clone(),
        (None, Some(version)) => fetch_torch(version, &python())?,
        (None, None) => match python_torch_lib(&python()) {
            Some(lib) if lib.join("libc10_cuda.so").is_file() => lib,
            found => {
                let newest = TorchVersion::NEWEST.release();
                let why = if found.is_some() { "has no CUDA build of torch" } else { "cannot import torch" };
                eprintln!("oracle: '{}' {why}; using torch {newest} (its c10 libraries, fetched once into {})", python(), cache_root().display());
                fetch_torch(newest, &python())?
            }
        },
    };
    let version = std::fs::read_to_string(lib.join("../version.py"))
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim_matches(['\'', '"', ' ']).to_string())))
        .unwrap_or_else(|| "unknown".into());
    let name = lib.display().to_string();
    let c10_cuda = lib.join("libc10_cuda.so");
    let bytes = std::fs::read(&c10_cuda).map_err(|e| InputError::new(&name, format!("no libc10_cuda.so there ({e}): a CUDA build of torch is needed")))?;
    let cudart = ["libcudart.so.13", "libcudart.so.12"].into_iter().find(|soname| contains(&bytes, soname.as_bytes())).ok_or_else(|| {
        InputError::new(
            &name,
            "its libc10_cuda.so links neither libcudart.so.12 nor libcudart.so.13: the oracle's fake runtime covers CUDA 12 and 13 builds of torch",
        )
    })?;
    let torch_dir = lib.parent().unwrap_or(&lib).to_path_buf();
    let include = torch_dir.join("include");
    if !include.join("c10/cuda/CUDACachingAllocator.h").is_file() {
        return Err(InputError::new(&name, format!("no C++ headers at {} (c10/cuda/CUDACachingAllocator.h)", include.display())));
    }
    // CUDA headers of the runtime's major: beside the torch when they are, else fetched once.
    let major = &cudart["libcudart.so.".len()..];
    let site = torch_dir.parent().unwrap_or(&torch_dir).to_path_buf();
    let local = [site.join("triton/backends/nvidia/include"), site.join(format!("nvidia/cu{major}/include")), PathBuf::from("/usr/local/cuda/include")]
        .into_iter()
        .find(|d| d.join("crt/host_defines.h").is_file() && cuda_headers_major(d).as_deref() == Some(major));
    let cuda_include = match local {
        Some(dir) => dir,
        None => fetch(&python(), "cuda-headers", major, &cache_root().join(format!("cuda-{major}-headers")), "--torch-version")?.join("include"),
    };
    Ok(Torch { lib, include, cuda_include, version, cudart })
}

/// The torch/lib folder of the torch `python` imports, if it imports one.
fn python_torch_lib(python: &str) -> Option<PathBuf> {
    let out = Command::new(python)
        .args(["-c", "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(PathBuf::from)
}

/// torch `version`'s c10 libraries and headers, fetched from the package index by range
/// requests into the cache on first use (`fetch_torch.py`).
fn fetch_torch(version: &str, python: &str) -> Result<PathBuf, InputError> {
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_')) {
        return Err(InputError::new("--torch-version", format!("'{version}' is not a torch version (say e.g. 2.11.0)")));
    }
    // `2.12` names the release 2.12.0.
    let version = if version.split('.').count() == 2 { format!("{version}.0") } else { version.to_string() };
    Ok(fetch(python, "torch", &version, &cache_root().join(format!("torch-{version}")), "--torch-version")?.join("torch/lib"))
}

/// The major version of the CUDA runtime headers in `dir` (`CUDART_VERSION / 1000`).
fn cuda_headers_major(dir: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("cuda_runtime_api.h")).ok()?;
    let v: u32 = text.lines().find_map(|l| l.trim().strip_prefix("#define CUDART_VERSION"))?.trim().parse().ok()?;
    Some((v / 1000).to_string())
}

/// `fetch_torch.py WHAT VERSION DEST` (nothing when DEST is there): DEST.
fn fetch(python: &str, what: &str, version: &str, dest: &std::path::Path, flag: &str) -> Result<PathBuf, InputError> {
    if dest.is_dir() {
        return Ok(dest.to_path_buf());
    }
    let err = |m: String| InputError::new(flag, m);
    std::fs::create_dir_all(cache_root()).map_err(|e| err(format!("cannot create {}: {e}", cache_root().display())))?;
    // Named by its content and put in place whole: concurrent fetches never read a half-written one.
    let script = cache_root().join(format!("fetch_torch-{:016x}.py", crate::files::build_key(&[FETCH_TORCH_PY.as_bytes()])));
    if !script.is_file() {
        let tmp = tempfile::NamedTempFile::new_in(cache_root()).map_err(|e| err(format!("cannot write in {}: {e}", cache_root().display())))?;
        std::fs::write(tmp.path(), FETCH_TORCH_PY).map_err(|e| err(format!("cannot write {}: {e}", tmp.path().display())))?;
        tmp.persist(&script).map_err(|e| err(format!("cannot write {}: {e}", script.display())))?;
    }
    let out = Command::new(python)
        .arg(&script)
        .args([what, version])
        .arg(dest)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| err(format!("cannot run '{python}' to fetch {what} {version}: {e}")))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        return Err(err(last.to_string()));
    }
    Ok(dest.to_path_buf())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn cache_root() -> PathBuf {
    crate::files::cache_dir("oracle")
}

/// The built helpers: what to preload (the fake libcudart and libnvidia-ml) and the driver,
/// compiled once per sources and torch.
pub fn build(torch: &Torch) -> Result<(String, PathBuf), InputError> {
    let lib = torch.lib.display().to_string();
    let key = crate::files::build_key(&[
        FAKE_CUDART_CPP.as_bytes(),
        FAKE_NVML_CPP.as_bytes(),
        DRIVER_CPP.as_bytes(),
        lib.as_bytes(),
        torch.version.as_bytes(),
        torch.cudart.as_bytes(),
    ]);
    let dir = cache_root().join(format!("{}-{key:016x}", torch.version.replace(['/', ' '], "_")));
    let fake = dir.join(torch.cudart);
    let nvml = dir.join("libnvidia-ml.so.1");
    let driver = dir.join("oracle-driver");
    // libc10_cuda dlopens libnvidia-ml.so.1 by that name: a preloaded one of that soname is it.
    let preload = format!("{}:{}", fake.display(), nvml.display());
    if fake.is_file() && nvml.is_file() && driver.is_file() {
        return Ok((preload, driver));
    }
    let err = |m: String| InputError::new("oracle", m);
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create the cache folder {}: {e}", dir.display())))?;
    let work = tempfile::Builder::new().prefix("build-").tempdir_in(&dir).map_err(|e| err(format!("cannot write in {}: {e}", dir.display())))?;
    // The version script names the runtime's symbol version, which libc10_cuda asks for.
    let map = format!("{} {{\n  global: cuda*; allocbench_fake_*;\n  local: *;\n}};\n", torch.cudart);
    for (name, text) in [("fake_cudart.cpp", FAKE_CUDART_CPP), ("fake_cudart.map", map.as_str()), ("fake_nvml.cpp", FAKE_NVML_CPP), ("driver.cpp", DRIVER_CPP)]
    {
        std::fs::write(work.path().join(name), text).map_err(|e| err(format!("cannot write {name}: {e}")))?;
    }
    let w = |n: &str| work.path().join(n);
    let cuda_inc = format!("-I{}", torch.cuda_include.display());
    let gxx = |args: Vec<std::ffi::OsString>, what: &str| crate::files::run_gxx(args, &format!("the oracle's {what} against {lib}")).map_err(err);
    let os = |s: &str| std::ffi::OsString::from(s);
    let mut args = vec![os("-std=c++20"), os("-O2"), os("-shared"), os("-fPIC"), os(&cuda_inc), format!("-Wl,-soname,{}", torch.cudart).into()];
    args.push(format!("-Wl,--version-script={}", w("fake_cudart.map").display()).into());
    args.extend([w("fake_cudart.cpp").into_os_string(), os("-o"), w(torch.cudart).into_os_string()]);
    gxx(args, "fake CUDA runtime")?;
    let args = vec![
        os("-O2"),
        os("-shared"),
        os("-fPIC"),
        os("-Wl,-soname,libnvidia-ml.so.1"),
        w("fake_nvml.cpp").into_os_string(),
        os("-o"),
        w("libnvidia-ml.so.1").into_os_string(),
    ];
    gxx(args, "fake NVML")?;
    let mut args = vec![os("-std=c++20"), os("-O1"), format!("-I{}", torch.include.display()).into(), os(&cuda_inc)];
    args.extend([w("driver.cpp").into_os_string(), os("-o"), w("oracle-driver").into_os_string()]);
    args.extend([format!("-L{}", torch.lib.display()).into(), os("-lc10_cuda"), os("-lc10"), format!("-Wl,-rpath,{}", torch.lib.display()).into()]);
    args.extend([format!("-L{}", work.path().display()).into(), format!("-l:{}", torch.cudart).into()]);
    gxx(args, "driver")?;
    // The libraries first: a driver present means all three are.
    std::fs::rename(w(torch.cudart), &fake).map_err(|e| err(format!("cannot keep the build: {e}")))?;
    std::fs::rename(w("libnvidia-ml.so.1"), &nvml).map_err(|e| err(format!("cannot keep the build: {e}")))?;
    std::fs::rename(w("oracle-driver"), &driver).map_err(|e| err(format!("cannot keep the build: {e}")))?;
    Ok((preload, driver))
}

/// The driver's input line for one event, `None` for one it does not take.
fn line(e: &Event) -> String {
    let opt = |s: &Option<u64>| s.map_or_else(|| "-".to_string(), |s| s.to_string());
    match e {
        Event::Alloc { id, bytes, stream } => format!("a {id} {bytes} {stream}\n"),
        Event::Free { id } => format!("f {id}\n"),
        Event::RecordStream { id, stream } => format!("r {id} {stream}\n"),
        Event::Sync { stream } => format!("s {}\n", opt(stream)),
        Event::EmptyCache => "e\n".into(),
        Event::Step { n } => format!("t {n}\n"),
        Event::Pool(PoolOp::Begin { pool, stream }) => format!("b {pool} {}\n", opt(stream)),
        Event::Pool(PoolOp::Join { pool, stream }) => format!("j {pool} {stream}\n"),
        Event::Pool(PoolOp::End { pool }) => format!("n {pool}\n"),
        Event::Pool(PoolOp::Release { pool }) => format!("l {pool}\n"),
        Event::Pool(PoolOp::EmptyCache { pool }) => format!("p {pool}\n"),
        Event::Pool(PoolOp::UseOnOom { pool }) => format!("u {pool}\n"),
    }
}

/// Runs `events` through the real allocator of `opts`' torch (the map at the end only).
pub fn run(events: impl Iterator<Item = anyhow::Result<Event>>, opts: &OracleOptions) -> anyhow::Result<OracleResult> {
    Ok(run_driver(events, opts, None)?.0)
}

/// The state after each event, as the driver writes it with ALLOCBENCH_ORACLE_TRACK: the
/// address an allocation got (or 0), then allocated, reserved, active and inactive-split bytes,
/// inactive-split blocks and segments.
pub type EventState = [u64; 7];

/// What each place of an [`EventState`] is.
const STATE_NAMES: [&str; 7] = [
    "address of the allocation",
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "inactive_split.all.current",
    "segment.all.current",
];

/// Runs the first `limit` events of `trace` through the real allocator, with its state after
/// each event when `states` (7 × 8 bytes an event, in a temporary file), and again up to its
/// peak for the map there.
pub fn run_trace(trace: &std::path::Path, opts: &OracleOptions, limit: usize, states: bool) -> anyhow::Result<(OracleResult, Vec<EventState>)> {
    let source = crate::input::Source::open(Some(trace))?;
    let dir = tempfile::tempdir()?;
    let track = dir.path().join("track.bin");
    let (mut result, states) = run_driver(source.events()?.take(limit), opts, states.then_some(track.as_path()))?;
    let states = states.unwrap_or_default();
    if let Some(peak) = result.peak_event {
        let opts = OracleOptions { libc10: Some(PathBuf::from(&result.torch_lib)), torch_version: None, ..opts.clone() };
        result.segments_at_peak = run_driver(source.events()?.take(peak as usize + 1), &opts, None)?.0.segments;
    }
    Ok((result, states))
}

fn run_driver(
    events: impl Iterator<Item = anyhow::Result<Event>>,
    opts: &OracleOptions,
    track: Option<&std::path::Path>,
) -> anyhow::Result<(OracleResult, Option<Vec<EventState>>)> {
    crate::units::check_capacity(opts.capacity).map_err(|m| InputError::new("--capacity", m))?;
    // The conf is the real allocator's to parse (and refuse, in its own words).
    let torch = find_torch(opts)?;
    let (preload, driver) = build(&torch)?;
    let mut command = Command::new(&driver);
    if let Some(track) = track {
        command.env("ALLOCBENCH_ORACLE_TRACK", track);
    }
    let mut child = command
        .env("LD_PRELOAD", &preload)
        .env("PYTORCH_CUDA_ALLOC_CONF", &opts.conf)
        .env_remove("PYTORCH_ALLOC_CONF")
        .env("ALLOCBENCH_FAKE_CAPACITY", opts.capacity.to_string())
        .env("ALLOCBENCH_FAKE_ADDRESS_ORDER", if opts.address_order == super::device::AddressOrder::Driver { "driver" } else { "lowest" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| InputError::new("oracle", format!("cannot start {}: {e}", driver.display())))?;
    let stdin = child.stdin.take().expect("piped");
    // The driver's output is read on a thread of its own while the events go in here; the
    // driver stops reading at an OOM (a broken pipe then ends the writing, which is no error).
    let reader = std::thread::spawn(move || child.wait_with_output());
    let mut input = BufWriter::with_capacity(1 << 16, stdin);
    for e in events {
        if input.write_all(line(&e?).as_bytes()).is_err() {
            break;
        }
    }
    let _ = input.flush();
    drop(input);
    let out = reader.join().map_err(|_| anyhow::anyhow!("the oracle's output reader panicked"))??;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        if out.status.code() == Some(4) {
            // PyTorch refused the conf: its message is the answer.
            let why = last.strip_prefix("oracle driver: PyTorch refused the conf: ").unwrap_or(last);
            return Err(InputError::new("--conf", format!("torch {} refuses it: {why}", torch.version)).into());
        }
        anyhow::bail!("the oracle driver failed ({}): {last}", out.status);
    }
    let d: DriverOutput = serde_json::from_slice(&out.stdout).map_err(|e| anyhow::anyhow!("the oracle driver wrote no valid JSON: {e}"))?;
    anyhow::ensure!(d.format == "allocbench-oracle-v1", "the oracle driver wrote format '{}'", d.format);
    let states = match track {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("the oracle driver's state file {}: {e}", path.display()))?;
            Some(bytes.chunks_exact(56).map(|row| std::array::from_fn(|k| u64::from_le_bytes(row[k * 8..k * 8 + 8].try_into().expect("8 bytes")))).collect())
        }
        None => None,
    };
    let result = OracleResult {
        format: d.format,
        torch_version: torch.version.clone(),
        torch_lib: torch.lib.display().to_string(),
        conf: opts.conf.clone(),
        device: format!("fake CUDA runtime, {} capacity", crate::units::format_bytes(opts.capacity)),
        capacity: opts.capacity,
        events: d.events,
        stats: d.stats,
        oom: d.oom.map(|o| OracleOom { event: o.event.saturating_sub(1), bytes: o.bytes, stream: o.stream, message: o.message }),
        segments: d.segments.into_iter().map(segment).collect(),
        peak_event: d.peak_event,
        segments_at_peak: Vec::new(),
    };
    Ok((result, states))
}

fn segment(s: DriverSegment) -> SegmentSnapshot {
    let private_pool = match s.pool {
        (0, 0) => None,
        (0, p) | (p, _) => Some(p),
    };
    SegmentSnapshot {
        address: s.address,
        total_size: s.total_size,
        stream: stream_number(s.stream),
        segment_type: if s.is_large { SegmentType::Large } else { SegmentType::Small },
        is_expandable: s.is_expandable,
        blocks: s
            .blocks
            .into_iter()
            .map(|b| BlockSnapshot {
                size: b.size,
                requested_size: b.requested_size,
                state: match (b.allocated, b.active) {
                    (true, _) => BlockState::ActiveAllocated,
                    (false, true) => BlockState::ActivePendingFree,
                    (false, false) => BlockState::Inactive,
                },
            })
            .collect(),
        private_pool,
    }
}

/// Runs `trace` through the simulator (its default address order) and the real allocator with
/// the same conf and capacity, and compares them.
pub fn compare(trace: &std::path::Path, opts: &OracleOptions) -> anyhow::Result<OracleComparison> {
    compare_prefix(trace, opts, usize::MAX)
}

/// [`compare`] on the first `events` events of `trace`: the stats at the end, the maps at the
/// end and at the peak, and the state after every event (for the first event where they part).
fn compare_prefix(trace: &std::path::Path, opts: &OracleOptions, events: usize) -> anyhow::Result<OracleComparison> {
    use super::replay::{replay_observed, OnOom, SegmentsAtPeak};
    use super::GpuAllocator as _;
    let (oracle, oracle_states) = run_trace(trace, opts, events, true)?;
    let simulate = opts.simulate.unwrap_or_else(|| simulated_version(&oracle.torch_version));
    let conf = super::config::AllocatorConfig::parse_for(&opts.conf, simulate)?;
    let source = crate::input::Source::open(Some(trace))?;
    let mut alloc = super::caching::CachingAllocator::new(conf, super::device::SimDevice::new(opts.capacity).with_address_order(opts.address_order));
    let (mut states, mut at_peak) = (StateTrack::default(), SegmentsAtPeak::exact());
    replay_observed(&mut alloc, source.events()?.take(events), OnOom::Stop, &mut (&mut at_peak, &mut states))?;
    let sim_stats = alloc.stats().to_torch_map();
    let mut mismatches = Vec::new();
    let keys_compared = super::fidelity::compare_stats("final", &sim_stats, &oracle.stats, &mut mismatches);
    let sim_segments = alloc.segments();
    let sim_segments_at_peak = if oracle.peak_event.is_some() { at_peak.segments } else { Vec::new() };
    let segments_equal = comparable(&sim_segments) == comparable(&oracle.segments) && comparable(&sim_segments_at_peak) == comparable(&oracle.segments_at_peak);
    let first_parting = states.states.iter().zip(&oracle_states).position(|(a, b)| a != b);
    let parting_state = match first_parting {
        Some(k) => (0..STATE_NAMES.len())
            .filter(|&j| states.states[k][j] != oracle_states[k][j])
            .map(|j| crate::results::Mismatch {
                at: format!("event {k}"),
                key: STATE_NAMES[j].into(),
                sim: states.states[k][j] as i64,
                torch: oracle_states[k][j] as i64,
            })
            .collect(),
        None => Vec::new(),
    };
    let first_parting = first_parting.map(|k| k as u64);
    Ok(OracleComparison { oracle, sim_stats, keys_compared, mismatches, segments_equal, sim_segments, sim_segments_at_peak, first_parting, parting_state })
}

/// The simulator's [`EventState`] after each event, as the driver writes the real allocator's.
#[derive(Default)]
struct StateTrack {
    states: Vec<EventState>,
    placed: u64,
}

impl<A: super::GpuAllocator + ?Sized> super::replay::Observer<A> for StateTrack {
    fn placed(&mut self, alloc: &A, _id: u64, handle: super::Handle) {
        self.placed = alloc.block_address(handle).unwrap_or(0);
    }
    fn after_event(&mut self, alloc: &A, _at: super::replay::At) {
        let all = alloc.stats().all();
        let n = |v: i64| v.max(0) as u64;
        self.states.push([
            std::mem::take(&mut self.placed),
            n(all.allocated_bytes.current),
            n(all.reserved_bytes.current),
            n(all.active_bytes.current),
            n(all.inactive_split_bytes.current),
            n(all.inactive_split.current),
            n(all.segment.current),
        ]);
    }
    fn after_event_due(&self, events: u64) -> u64 {
        events + 1
    }
}

/// The first event after which the two differ (`whole`, the run of all of `trace`, says where
/// their per-event states first differ: one more run of each side up to it gives what differs
/// there). Where every per-event state agrees yet the end differs, prefixes are bisected for the
/// shortest that differs (about log2(events) runs of each side). The torch is found once.
pub fn first_parting(trace: &std::path::Path, opts: &OracleOptions, whole: &OracleComparison) -> anyhow::Result<Option<Parting>> {
    if whole.identical() {
        return Ok(None);
    }
    // The torch and the simulated release found once, for every run below.
    let mut opts = opts.clone();
    if opts.libc10.is_none() {
        opts.libc10 = Some(PathBuf::from(&whole.oracle.torch_lib));
    }
    opts.torch_version = None;
    opts.simulate = Some(opts.simulate.unwrap_or_else(|| simulated_version(&whole.oracle.torch_version)));
    let what = |n: usize| -> anyhow::Result<String> {
        let source = crate::input::Source::open(Some(trace))?;
        let event = source.events()?.nth(n).transpose()?;
        Ok(match event {
            Some(e) => format!("{} {e:?}", e.op_name()),
            None => "?".into(),
        })
    };
    if let Some(k) = whole.first_parting {
        // What differs right there, then every key and the maps after that event.
        let c = compare_prefix(trace, &opts, k as usize + 1)?;
        let mut mismatches = whole.parting_state.clone();
        mismatches.extend(c.mismatches.into_iter().filter(|m| !whole.parting_state.iter().any(|p| p.key == m.key)));
        return Ok(Some(Parting { event: k, what: what(k as usize)?, mismatches, segments_equal: c.segments_equal }));
    }
    // Agreeing prefixes: `lo` events; differing: `hi` (the whole run's events at most).
    let (mut lo, mut hi) = (0usize, whole.oracle.events as usize);
    let mut at_hi: Option<OracleComparison> = None;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let c = compare_prefix(trace, &opts, mid)?;
        if c.identical() {
            lo = mid;
        } else {
            hi = mid;
            at_hi = Some(c);
        }
    }
    let c = match at_hi {
        Some(c) => c,
        None => compare_prefix(trace, &opts, hi)?,
    };
    Ok(Some(Parting { event: hi as u64 - 1, what: what(hi - 1)?, mismatches: c.mismatches, segments_equal: c.segments_equal }))
}

/// Segments sorted by address, with a free block's `requested_size` cleared: PyTorch keeps
/// the stale size of the block's last request there (the simulator another one), which no
/// statistic reads.
fn comparable(segments: &[SegmentSnapshot]) -> Vec<SegmentSnapshot> {
    let mut out = segments.to_vec();
    out.sort_by_key(|s| s.address);
    for b in out.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
        if b.state == BlockState::Inactive {
            b.requested_size = 0;
        }
    }
    out
}

/// The release whose rules the simulator follows beside a torch of `version`: that one when it
/// is verified, else the nearest verified (said on standard error).
pub fn simulated_version(version: &str) -> TorchVersion {
    match TorchVersion::parse(version) {
        Ok(v) => v,
        Err(_) => {
            let older = version.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()).is_some_and(|m| m < TorchVersion::OLDEST.minor);
            let nearest = if older { TorchVersion::OLDEST } else { TorchVersion::NEWEST };
            eprintln!("oracle: torch {version} is not a verified release; the simulator follows torch {nearest}'s rules beside it");
            nearest
        }
    }
}

/// Whether a torch and g++ are here for the oracle (tests skip without them): `Err` says why not.
pub fn available(opts: &OracleOptions) -> Result<(), String> {
    let torch = find_torch(opts).map_err(|e| e.to_string())?;
    build(&torch).map(|_| ()).map_err(|e| e.to_string())
}

/// The folder the helpers are cached in (for messages).
pub fn cache_dir() -> PathBuf {
    cache_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_name_every_event() {
        assert_eq!(line(&Event::Alloc { id: 3, bytes: 512, stream: 1 }), "a 3 512 1\n");
        assert_eq!(line(&Event::Sync { stream: None }), "s -\n");
        assert_eq!(line(&Event::Pool(PoolOp::Begin { pool: 2, stream: Some(4) })), "b 2 4\n");
        assert_eq!(stream_number(0), 0);
        assert_eq!(stream_number(STREAM_HANDLE_BASE + 3 * 0x100), 3);
    }

    #[test]
    fn the_build_key_changes_with_its_inputs() {
        assert_ne!(crate::files::build_key(&[b"a", b"bc"]), crate::files::build_key(&[b"ab", b"c"]));
    }
}
