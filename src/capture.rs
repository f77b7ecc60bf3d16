//! `allocbench capture`: runs an unmodified PyTorch script under the `scripts/allocbench_capture/`
//! package (embedded in this binary, so only a Python with torch is needed) and writes its allocation
//! trace. The Python side records storages; this side finds the interpreter, passes the script's
//! exit code through, and reports the outcome the capture wrote to a status file.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::error::InputError;

/// The capture package, as shipped in `scripts/allocbench_capture/`: each file's path inside the
/// package and its text (tests/capture.rs checks that every `.py` file there is listed).
pub const CAPTURE_PACKAGE: &[(&str, &str)] = &[
    ("__init__.py", include_str!("../scripts/allocbench_capture/__init__.py")),
    ("__main__.py", include_str!("../scripts/allocbench_capture/__main__.py")),
    ("autograd.py", include_str!("../scripts/allocbench_capture/autograd.py")),
    ("capture.py", include_str!("../scripts/allocbench_capture/capture.py")),
    ("card.py", include_str!("../scripts/allocbench_capture/card.py")),
    ("cli.py", include_str!("../scripts/allocbench_capture/cli.py")),
    ("driver/allocation_tracker.cpp", include_str!("../scripts/allocbench_capture/driver/allocation_tracker.cpp")),
    ("driver/fake_cublas.cpp", include_str!("../scripts/allocbench_capture/driver/fake_cublas.cpp")),
    ("driver/fake_cudnn.cpp", include_str!("../scripts/allocbench_capture/driver/fake_cudnn.cpp")),
    ("driver/fake_cudart_kernels.cpp", include_str!("../scripts/allocbench_capture/driver/fake_cudart_kernels.cpp")),
    ("driver/fake_handles.h", include_str!("../scripts/allocbench_capture/driver/fake_handles.h")),
    ("driver/flop_counter.cpp", include_str!("../scripts/allocbench_capture/driver/flop_counter.cpp")),
    ("driver/fake_libcuda.cpp", include_str!("../scripts/allocbench_capture/driver/fake_libcuda.cpp")),
    // The oracle's fake runtime and NVML are the driver backend's too (one fake CUDA stack).
    ("driver/fake_cudart.cpp", include_str!("gpu/oracle/fake_cudart.cpp")),
    ("driver/fake_nvml.cpp", include_str!("gpu/oracle/fake_nvml.cpp")),
    ("driver_build.py", include_str!("../scripts/allocbench_capture/driver_build.py")),
    ("driver_capture.py", include_str!("../scripts/allocbench_capture/driver_capture.py")),
    ("errors.py", include_str!("../scripts/allocbench_capture/errors.py")),
    ("fake_cuda/__init__.py", include_str!("../scripts/allocbench_capture/fake_cuda/__init__.py")),
    ("fake_cuda/constructors.py", include_str!("../scripts/allocbench_capture/fake_cuda/constructors.py")),
    ("fake_cuda/device.py", include_str!("../scripts/allocbench_capture/fake_cuda/device.py")),
    ("fake_cuda/generators.py", include_str!("../scripts/allocbench_capture/fake_cuda/generators.py")),
    ("fake_cuda/graphs.py", include_str!("../scripts/allocbench_capture/fake_cuda/graphs.py")),
    ("fake_cuda/modules.py", include_str!("../scripts/allocbench_capture/fake_cuda/modules.py")),
    ("fake_cuda/processes.py", include_str!("../scripts/allocbench_capture/fake_cuda/processes.py")),
    ("fake_cuda/save_load.py", include_str!("../scripts/allocbench_capture/fake_cuda/save_load.py")),
    ("fake_cuda/streams.py", include_str!("../scripts/allocbench_capture/fake_cuda/streams.py")),
    ("fake_cuda/tensors.py", include_str!("../scripts/allocbench_capture/fake_cuda/tensors.py")),
    ("fake_tensors.py", include_str!("../scripts/allocbench_capture/fake_tensors.py")),
    ("known_values.py", include_str!("../scripts/allocbench_capture/known_values.py")),
    ("messages.py", include_str!("../scripts/allocbench_capture/messages.py")),
    ("ops/__init__.py", include_str!("../scripts/allocbench_capture/ops/__init__.py")),
    ("ops/blas.py", include_str!("../scripts/allocbench_capture/ops/blas.py")),
    ("ops/composites.py", include_str!("../scripts/allocbench_capture/ops/composites.py")),
    ("ops/convolution.py", include_str!("../scripts/allocbench_capture/ops/convolution.py")),
    ("ops/ctc.py", include_str!("../scripts/allocbench_capture/ops/ctc.py")),
    ("ops/dtype_names.py", include_str!("../scripts/allocbench_capture/ops/dtype_names.py")),
    ("ops/losses.py", include_str!("../scripts/allocbench_capture/ops/losses.py")),
    ("ops/meta_kernels.py", include_str!("../scripts/allocbench_capture/ops/meta_kernels.py")),
    ("ops/normalization.py", include_str!("../scripts/allocbench_capture/ops/normalization.py")),
    ("ops/pinned.py", include_str!("../scripts/allocbench_capture/ops/pinned.py")),
    ("ops/registry.py", include_str!("../scripts/allocbench_capture/ops/registry.py")),
    ("ops/sampling.py", include_str!("../scripts/allocbench_capture/ops/sampling.py")),
    ("ops/sdpa.py", include_str!("../scripts/allocbench_capture/ops/sdpa.py")),
    ("patches.py", include_str!("../scripts/allocbench_capture/patches.py")),
    ("progress.py", include_str!("../scripts/allocbench_capture/progress.py")),
    ("ranks.py", include_str!("../scripts/allocbench_capture/ranks.py")),
    ("recorder.py", include_str!("../scripts/allocbench_capture/recorder.py")),
    ("shim.py", include_str!("../scripts/allocbench_capture/shim.py")),
    ("sites.py", include_str!("../scripts/allocbench_capture/sites.py")),
    ("state.py", include_str!("../scripts/allocbench_capture/state.py")),
    ("threads.py", include_str!("../scripts/allocbench_capture/threads.py")),
    ("trace.py", include_str!("../scripts/allocbench_capture/trace.py")),
];

/// Exit code for a capture that could not start (no torch, no compiler, a bad flag).
pub const EXIT_SETUP_ERROR: i32 = 2;

/// What to capture and how.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The interpreter; `None` = `$ALLOCBENCH_PYTHON`, else `python3`.
    pub python: Option<String>,
    pub output: PathBuf,
    pub steps: Option<u64>,
    /// Record real tensors (a GPU, or `device` cpu) instead of fake CUDA tensors.
    pub real: bool,
    /// The device whose storages are recorded: `cuda`, or `cpu` for validation runs.
    pub device: String,
    /// `auto`, `fake-tensors` or `driver` (`capture --backend`).
    pub backend: String,
    /// Fake GPUs in the process (`capture --gpus`, driver backend).
    pub gpus: u32,
    /// The modelled cuBLAS workspace in MiB; `None`: CUBLAS_WORKSPACE_CONFIG's, as PyTorch sizes it.
    pub cublas_workspace_mib: Option<u64>,
    /// The stand-in for reads of fake values (`None`: the capture's, 0).
    pub scalar_value: Option<f64>,
    /// Stop at the first read of a fake value instead of answering it.
    pub strict_values: bool,
    /// Have the capture write its progress (what [`run_watched`]'s watcher is given).
    pub progress: bool,
    /// Record each alloc's site (the innermost frame of the user's code) as `#site`/`#at` lines.
    pub sites: bool,
    /// The fake card's memory in bytes (`None`: unbounded).
    pub device_memory: Option<u64>,
    /// What the unbounded fake card reports as its memory (`None`: an H100 80 GB's).
    pub card_memory: Option<u64>,
    /// Where the script's own output goes (`None`: this process's standard output and error).
    pub script_output: Option<PathBuf>,
    pub script: PathBuf,
    pub args: Vec<OsString>,
    /// Variables set for the script (a rank's RANK, WORLD_SIZE, ...: `capture --nproc-per-node`).
    pub env: Vec<(String, String)>,
}

/// The outcome the capture module writes (its `--status` file).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CaptureOutcome {
    /// `complete`, `script_error`, `fake_data`, `setup_error` or `interrupted` (here also `killed`).
    pub state: String,
    /// The backend that ran: `driver` or `fake-tensors` (`--backend auto` resolved).
    #[serde(default)]
    pub backend: String,
    pub exit_code: i32,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub steps: u64,
    #[serde(default)]
    pub allocs: u64,
    #[serde(default)]
    pub frees: u64,
    #[serde(default)]
    pub peak_live_bytes: u64,
    #[serde(default)]
    pub live_bytes_at_end: u64,
    /// torch.cuda.OutOfMemoryErrors raised on the fake card (see `--device-memory`).
    #[serde(default)]
    pub ooms: u64,
    /// The fake card's memory (none for real tensors, or an unbounded fake card).
    #[serde(default)]
    pub device_memory: Option<u64>,
    /// Every row written (allocs, frees, steps, streams, pools).
    #[serde(default)]
    pub rows: u64,
    /// Reads of fake values answered with the stand-in, per site, most first.
    #[serde(default)]
    pub values_made_up: Vec<MadeUpValue>,
    /// The stand-in those reads got (`None` with --strict-values).
    #[serde(default)]
    pub stand_in: Option<f64>,
    /// Seconds inside the capture's op dispatch (fake kernels and recording) ...
    #[serde(default)]
    pub dispatch_seconds: f64,
    /// ... of the seconds from the capture's start to its end.
    #[serde(default)]
    pub capture_seconds: f64,
    /// The traces of the other fake GPUs the script used (`--gpus`, driver backend): one a device.
    #[serde(default)]
    pub device_traces: Vec<String>,
    /// A rank's role (`capture --nproc-per-node`): the fingerprint of its alloc and free rows
    /// through step 1, or through its end when it has no steps.
    #[serde(default)]
    pub role: Option<String>,
    /// The earlier rank whose role this one had, where `--ranks distinct` stopped it at step 1.
    #[serde(default)]
    pub same_role_as: Option<u32>,
    /// Inductor's GPU benchmarks during the capture (autotuning; driver backend): every choice
    /// timed alike, as no kernel runs on the fake card.
    #[serde(default)]
    pub gpu_benchmarks: u64,
}

/// One site where the capture made a value up (`# value made up:` in the trace).
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
pub struct MadeUpValue {
    /// FILE:LINE `code` of the read.
    pub site: String,
    /// `.item()`, `.numpy()`, `torch.equal`, `torch.allclose`.
    pub read: String,
    pub count: u64,
}

/// What a running capture says twice a second (its `--progress` file).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CaptureProgress {
    /// `first_step` (before the first optimizer step), `steps`, `no_grad` (evaluation,
    /// inference), `closing`.
    pub phase: String,
    pub steps: u64,
    pub rows: u64,
    pub allocs: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub dispatch_seconds: f64,
    pub values_made_up: u64,
}

impl CaptureOutcome {
    pub fn complete(&self) -> bool {
        self.state == "complete"
    }
}

/// A job `torchrun` would start (`capture --nproc-per-node`, `fit --nproc-per-node`): each rank
/// a capture of its own, on the driver backend, with PyTorch's fake process group.
#[derive(Debug, Clone, PartialEq)]
pub struct RankJob {
    pub nproc_per_node: u32,
    pub nnodes: u32,
    /// `all`, `distinct` (each rank stopped at step 1 when an earlier one had its role) or a list.
    pub ranks: String,
}

impl RankJob {
    pub fn world(&self) -> u32 {
        self.nproc_per_node * self.nnodes
    }

    /// The ranks `ranks` names (`distinct`: every rank).
    pub fn ranks(&self) -> Result<Vec<u32>, String> {
        let world = self.world();
        match self.ranks.as_str() {
            "all" | "distinct" => Ok((0..world).collect()),
            list => list
                .split(',')
                .map(|r| match r.trim().parse::<u32>() {
                    Ok(n) if n < world => Ok(n),
                    Ok(n) => Err(format!("--ranks {list}: rank {n} is not in a job of {world} (ranks 0..{})", world - 1)),
                    Err(_) => Err(format!("--ranks {list}: '{r}' is not a rank (all, distinct, or a list such as 0,3,7)")),
                })
                .collect(),
        }
    }

    /// The variables `torchrun` sets for `rank`.
    fn env(&self, rank: u32) -> Vec<(String, String)> {
        let per_node = self.nproc_per_node;
        [
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", (rank % per_node).to_string()),
            ("GROUP_RANK", (rank / per_node).to_string()),
            ("NODE_RANK", (rank / per_node).to_string()),
            ("WORLD_SIZE", self.world().to_string()),
            ("LOCAL_WORLD_SIZE", per_node.to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", "29500".to_string()),
            ("ALLOCBENCH_RANK", rank.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Captures each rank of `job` into `dir` (`rank-R.csv`, and `ranks.json` rewritten after each):
/// `run` captures one rank (its options: the output, torchrun's variables, the GPUs of a node)
/// and `say` hears what is decided (a rank of an earlier one's role). Returns the first non-zero
/// exit code of a rank (0 when every rank completed) and the manifest.
pub fn capture_ranks(
    opts: &CaptureOptions,
    job: &RankJob,
    dir: &Path,
    run: &mut dyn FnMut(&CaptureOptions) -> (i32, Option<CaptureOutcome>),
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<(i32, crate::trace::ranks::RankManifest)> {
    use crate::trace::ranks::{RankEntry, RankManifest};
    let ranks = job.ranks().map_err(|e| InputError::new("--ranks", e))?;
    fs::create_dir_all(dir).map_err(|e| InputError::new(dir.display().to_string(), format!("cannot create the folder: {e}")))?;
    let distinct = job.ranks == "distinct";
    let mut manifest =
        RankManifest { world_size: job.world(), nproc_per_node: job.nproc_per_node, nnodes: job.nnodes, ranks_asked: job.ranks.clone(), ranks: Vec::new() };
    let mut code = 0;
    for rank in ranks {
        let trace = format!("rank-{rank}.csv");
        let mut one = opts.clone();
        one.output = dir.join(&trace);
        if one.backend == "driver" {
            one.gpus = one.gpus.max(job.nproc_per_node); // (the node's GPUs, each rank on its LOCAL_RANK's)
        }
        one.env.extend(job.env(rank));
        if distinct {
            let known: Vec<String> = manifest.ranks.iter().filter_map(|e| Some(format!("{}={}", e.role.as_ref()?, e.rank))).collect();
            one.env.push(("ALLOCBENCH_KNOWN_ROLES".into(), known.join(",")));
        }
        say(&format!("rank {rank} of {}:", job.world()));
        let (ran, outcome) = run(&one);
        let outcome = outcome.unwrap_or_default();
        // A role seen at the end of a script without steps is compared here (no step stopped it).
        let same_as = outcome.same_role_as.or_else(|| {
            let role = outcome.role.as_ref().filter(|_| distinct && outcome.complete() && outcome.steps == 0)?;
            manifest.ranks.iter().find(|e| e.role.as_ref() == Some(role) && e.trace.is_some()).map(|e| e.rank)
        });
        let mut entry = RankEntry {
            rank,
            role: outcome.role.clone(),
            state: if outcome.state.is_empty() { "failed".into() } else { outcome.state.clone() },
            ..Default::default()
        };
        match same_as {
            Some(of) => {
                let _ = fs::remove_file(dir.join(&trace));
                entry.same_as = Some(of);
                say(&format!(
                    "rank {rank}: the same allocations and communicators as rank {of} through step 1: rank-{of}.csv stands for it (--ranks all captures each)"
                ));
            }
            None => entry.trace = Some(trace),
        }
        manifest.ranks.push(entry);
        manifest.write(dir)?;
        if ran != 0 && code == 0 {
            code = ran;
        }
    }
    Ok((code, manifest))
}

/// The interpreter a capture runs: the flag, else `$ALLOCBENCH_PYTHON`, else `python3`.
pub fn python_for(flag: Option<&str>) -> String {
    flag.map(str::to_string).or_else(|| std::env::var("ALLOCBENCH_PYTHON").ok().filter(|p| !p.is_empty())).unwrap_or_else(|| "python3".to_string())
}

/// Runs the script under the capture module and waits for it. Setup problems the Python side
/// finds (no torch, say) come back as an outcome with state `setup_error`; problems found here
/// (no interpreter, no script) are input errors.
pub fn run(opts: &CaptureOptions) -> anyhow::Result<CaptureOutcome> {
    run_watched(opts, &mut |_| {})
}

/// [`run`], giving `watch` the capture's progress about every 200 ms (`None` until the script's
/// first op: Python, torch and the script's imports are starting) when `opts.progress` is set.
pub fn run_watched(opts: &CaptureOptions, watch: &mut dyn FnMut(Option<&CaptureProgress>)) -> anyhow::Result<CaptureOutcome> {
    if opts.script.is_dir() {
        return Err(InputError::new(opts.script.display().to_string(), "is a directory, not a script").into());
    }
    if !opts.script.is_file() {
        return Err(InputError::new(opts.script.display().to_string(), "no such script").into());
    }
    if let Some(parent) = opts.output.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| InputError::new(parent.display().to_string(), format!("cannot create the output folder: {e}")))?;
    }
    let work = tempfile::Builder::new().prefix("allocbench-capture-").tempdir()?;
    let package = work.path().join("allocbench_capture");
    for (path, text) in CAPTURE_PACKAGE {
        let file = package.join(path);
        if let Some(folder) = file.parent() {
            fs::create_dir_all(folder)?;
        }
        fs::write(&file, text)?;
    }
    let status = work.path().join("status.json");
    let python = python_for(opts.python.as_deref());

    let mut cmd = Command::new(&python);
    // The package's __main__.py run by its path, not `python -m allocbench_capture`: `-m` would look
    // for the package in the working directory first (a copy there would run instead of this
    // one); __main__.py puts the temporary folder first on sys.path, as the script's own folder
    // would be, and starts the package's main.
    cmd.arg(package.join("__main__.py")).arg("-o").arg(&opts.output).arg("--status").arg(&status);
    cmd.arg("--device").arg(&opts.device).arg("--backend").arg(&opts.backend).arg("--gpus").arg(opts.gpus.to_string());
    if let Some(mib) = opts.cublas_workspace_mib {
        cmd.arg("--cublas-workspace-mib").arg(mib.to_string());
    }
    if let Some(n) = opts.steps {
        cmd.arg("--steps").arg(n.to_string());
    }
    if opts.real {
        cmd.arg("--real");
    }
    if !opts.sites {
        cmd.arg("--no-sites");
    }
    if let Some(v) = opts.scalar_value {
        cmd.arg("--scalar-value").arg(v.to_string());
    }
    if opts.strict_values {
        cmd.arg("--strict-values");
    }
    let progress = work.path().join("progress.json");
    if opts.progress {
        cmd.arg("--progress").arg(&progress);
    }
    if let Some(bytes) = opts.device_memory {
        cmd.arg("--device-memory").arg(bytes.to_string());
    }
    if let Some(bytes) = opts.card_memory {
        cmd.arg("--card-memory").arg(bytes.to_string());
    }
    if let Some(log) = &opts.script_output {
        let file = fs::File::create(log).map_err(|e| InputError::new(log.display().to_string(), format!("cannot write the script's output there: {e}")))?;
        cmd.stdout(file.try_clone()?).stderr(file);
    }
    cmd.arg("--").arg(&opts.script).args(&opts.args);
    // The script's own `import allocbench_capture` (for step() markers) finds the embedded copy,
    // the package the capture runs in (with the capture in progress).
    let path = std::env::var_os("PYTHONPATH")
        .map(|p| std::env::join_paths(std::iter::once(work.path().to_path_buf()).chain(std::env::split_paths(&p))))
        .transpose()?;
    cmd.env("PYTHONPATH", path.unwrap_or_else(|| work.path().as_os_str().to_owned()));
    cmd.env("PYTHONUNBUFFERED", "1");
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));

    // SIGTERM is the capture's own stop (the script's rows so far kept, marked interrupted).
    let mut last_read = std::time::Instant::now();
    let mut seen: Option<CaptureProgress> = None;
    let mut tick = || {
        if opts.progress && last_read.elapsed() >= std::time::Duration::from_millis(200) {
            last_read = std::time::Instant::now();
            // (A file being replaced may be missing for a moment: the last state stands.)
            if let Some(p) = fs::read(&progress).ok().and_then(|b| serde_json::from_slice::<CaptureProgress>(&b).ok()) {
                seen = Some(p);
            }
            watch(seen.as_ref());
        }
    };
    let waited = cmd.spawn().and_then(|c| crate::interrupt::wait_passing_on_ticking(c, libc::SIGTERM, std::time::Duration::from_secs(2), &mut tick));
    let child_status = match waited {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(InputError::new(
                "--python",
                format!("no Python interpreter '{python}' found: install python3 with torch, or name one with --python or ALLOCBENCH_PYTHON"),
            )
            .into())
        }
        Err(e) => return Err(InputError::new("--python", format!("cannot run '{python}': {e}")).into()),
    };
    match fs::read_to_string(&status) {
        Ok(text) => Ok(serde_json::from_str(&text)?),
        Err(_) => {
            // The interpreter died without a word (a signal, an abort in native code): keep the
            // trace and say it is incomplete.
            use std::os::unix::process::ExitStatusExt;
            let (how, exit_code) = match (child_status.code(), child_status.signal()) {
                (Some(code), _) => (format!("exit status {code}"), code),
                // A shell reports death by signal N as status 128 + N.
                (None, signal) => (format!("signal {}", signal.unwrap_or(0)), 128 + signal.unwrap_or(0)),
            };
            mark_incomplete(&opts.output, &how);
            Ok(CaptureOutcome {
                state: "killed".into(),
                exit_code,
                message: format!("{python} ended without finishing the capture ({how})"),
                ..Default::default()
            })
        }
    }
}

/// Ends a trace whose writer died: a torn last row is cut (it would stop the reader), then the
/// marker is added. A gzip trace is decoded as far as it goes and written again.
fn mark_incomplete(trace: &Path, why: &str) {
    let Ok(raw) = fs::read(trace) else { return };
    let gz = crate::trace::csv::is_gzip_name(trace);
    let mut text = Vec::new();
    if gz {
        // A stream cut short decodes up to the cut; the error there is expected.
        let _ = std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&raw[..]), &mut text);
    } else {
        text = raw;
    }
    let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    text.truncate(keep);
    text.extend_from_slice(format!("# capture incomplete: {why}\n").as_bytes());
    let written = if gz {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&text).and_then(|_| enc.finish()).and_then(|bytes| fs::write(trace, bytes))
    } else {
        fs::write(trace, &text)
    };
    if let Err(e) = written {
        eprintln!("warning: could not mark {} incomplete: {e}", trace.display());
    }
}

/// One line for the terminal.
pub fn describe(opts: &CaptureOptions, o: &CaptureOutcome) -> String {
    use crate::units::count;
    let mut counts = format!(
        "{}, {}, {}, peak live {}",
        count(o.allocs, "alloc"),
        count(o.frees, "free"),
        count(o.steps, "step"),
        crate::units::format_bytes(o.peak_live_bytes)
    );
    if o.ooms > 0 {
        // The script caught them (else it stopped on the first): its OOM handling took a path.
        counts += &format!(
            "; {} raised: live tensors passed what the fake card ({}, --device-memory) allows",
            crate::units::count(o.ooms, "torch.cuda.OutOfMemoryError"),
            o.device_memory.map(crate::units::format_bytes).unwrap_or_else(|| "memory".into())
        );
    }
    if let Some(n) = opts.steps.filter(|_| o.steps == 0 && o.complete()) {
        // Steps are optimizer.step() calls (or allocbench_capture.step()): a loop with neither
        // ran to its end. (A script stopped by an error says nothing of its steps.)
        counts += &format!("; --steps {n} stopped nothing: no optimizer.step() ran (mark an inference loop's steps with allocbench_capture.step())");
    }
    if !o.device_traces.is_empty() {
        // (The counts are every device's together.)
        counts += &format!(" on {} devices; cuda:0's rows in the trace named, the others' in {}", o.device_traces.len() + 1, o.device_traces.join(", "));
    }
    let mut lines = vec![if o.complete() {
        format!("captured {counts} -> {}", opts.output.display())
    } else {
        format!("{}; the trace so far ({counts}) is kept in {}, marked incomplete", o.message, opts.output.display())
    }];
    if !o.complete() {
        return lines.remove(0); // (a stop is said in one line)
    }
    lines.extend(made_up_line(o));
    if o.gpu_benchmarks > 0 {
        lines.push(format!(
            "autotuning: {} of Inductor's timed every choice alike (no kernel runs on the fake card): where it chose by time, it kept its first (default) choice",
            crate::units::count(o.gpu_benchmarks, "GPU benchmark")
        ));
    }
    if o.capture_seconds > 0.0 && (o.backend == "driver" || opts.backend == "driver") {
        // (No Python dispatch to split off: PyTorch's own ops run in C++, the kernels skipped.)
        lines.push(format!("time: {:.1} s on PyTorch's own CUDA path (the script's work, its ops with kernels skipped, the recording)", o.capture_seconds));
    } else if o.capture_seconds > 0.0 {
        let own = (o.capture_seconds - o.dispatch_seconds).max(0.0);
        lines.push(format!(
            "time: {:.1} s, {:.1} s of it in the capture's op dispatch (fake kernels, recording) and {:.1} s in the script's own work (its Python, data loading, I/O)",
            o.capture_seconds, o.dispatch_seconds, own
        ));
    }
    lines.join("\n")
}

/// "3 values made up (...): train.py:225 `loss.item()` ×3, ..." or nothing.
fn made_up_line(o: &CaptureOutcome) -> Option<String> {
    let total: u64 = o.values_made_up.iter().map(|v| v.count).sum();
    if total == 0 {
        return None;
    }
    const SHOWN: usize = 3;
    let mut sites: Vec<String> = o.values_made_up.iter().take(SHOWN).map(|v| format!("{} {} ×{}", v.site, v.read, v.count)).collect();
    if o.values_made_up.len() > SHOWN {
        sites.push(format!("and {} more (each in the trace)", crate::units::count((o.values_made_up.len() - SHOWN) as u64, "site")));
    }
    Some(format!(
        "{} made up (answered {}; the script's control flow there followed the stand-in, not its data; --strict-values stops at the first): {}",
        crate::units::count(total, "value"),
        o.stand_in.unwrap_or(0.0),
        sites.join(", ")
    ))
}
