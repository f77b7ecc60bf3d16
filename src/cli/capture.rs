//! `allocbench capture`: runs an unmodified PyTorch script and writes its CUDA allocation trace.

use std::path::PathBuf;

use clap::Args;

use crate::error::InputError;

#[derive(Args, Debug, Clone)]
#[command(after_help = "Example: allocbench capture -o trace.csv -- train.py --batch 4, then allocbench diagnose trace.csv")]
pub struct CaptureArgs {
    /// The Python that has torch (default: $ALLOCBENCH_PYTHON, else python3).
    #[arg(long)]
    pub python: Option<String>,
    /// Stop after this many steps (optimizer.step() calls, or allocbench_capture.step() markers).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
    /// Record real tensors (needs a GPU) instead of fake CUDA tensors.
    #[arg(long)]
    pub real: bool,
    /// The cuBLAS workspace modelled, in MiB (default: CUBLAS_WORKSPACE_CONFIG's size, 32 MiB,
    /// Hopper's, when unset; 0: none). Taken per call, or kept per stream with
    /// TORCH_CUBLAS_WORKSPACE_CACHE=1, as the torch running the capture does.
    #[arg(long)]
    pub cublas_workspace_mib: Option<u64>,
    /// The device whose storages are recorded (cpu: for checking the capture against real CPU runs).
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
    pub device: String,
    /// How CUDA is emulated: `driver` (PyTorch's own CUDA path on a fake CUDA runtime, driver,
    /// cuBLAS, cuDNN and NVML built at first use with g++; its caching allocator's own events;
    /// kernels skipped) or `fake-tensors` (FakeTensorMode and rules for what a GPU does). `auto`:
    /// the driver backend where the torch in use is a CUDA build and the fake stack builds, else
    /// fake tensors (said); `--real`, `--device cpu` and `--cublas-workspace-mib` are fake-tensor
    /// options and choose it.
    #[arg(long, default_value = "auto", value_parser = ["auto", "fake-tensors", "driver"])]
    pub backend: String,
    /// Fake GPUs in the process (driver backend; `.to("cuda:1")`, `device_map="auto"`): each
    /// device used gets its own trace, `TRACE.cudaN.csv` beside the one named (cuda:0's).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub gpus: u32,
    /// The stand-in a read of a fake value gets (`.item()`, `bool()`, `.tolist()`; `.numpy()` in
    /// every element) [default: 0]. Each read is counted by site, in the trace and the summary.
    #[arg(long, conflicts_with = "strict_values")]
    pub scalar_value: Option<f64>,
    /// Stop at the first read of a fake value, naming it, instead of answering it with a stand-in.
    #[arg(long)]
    pub strict_values: bool,
    /// The fake card's memory (e.g. 24GiB): live tensors past it raise
    /// torch.cuda.OutOfMemoryError, as on a real card, so a script's OOM handling runs. Default:
    /// unbounded (the card answers as an H100 80 GB; the replay decides where the run fits).
    #[arg(long, value_parser = crate::cli::args::parse_capacity)]
    pub device_memory: Option<u64>,
    /// The card the unbounded fake card reports itself as (its memory: `allocbench cards`), for a
    /// script that sizes its work by torch.cuda.get_device_properties().total_memory.
    #[arg(long, conflicts_with = "device_memory")]
    pub card: Option<String>,
    /// Draw the progress line even when standard error is not a terminal.
    #[arg(long, conflicts_with = "quiet")]
    pub progress: bool,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Leave out the allocation sites (the trace's `#site`/`#at` lines; they cost little).
    #[arg(long)]
    pub no_sites: bool,
    /// The trace to write (v1 CSV); with --nproc-per-node, the folder of the ranks' traces
    /// (`DIR/rank-R.csv`).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Run the script as each rank of a `torchrun --nproc-per-node N` job would (RANK,
    /// LOCAL_RANK, WORLD_SIZE, ...), one process a rank, with `init_process_group` answered by
    /// PyTorch's fake process group; one trace per rank. Driver backend: N fake GPUs, each rank
    /// recording its LOCAL_RANK's; or `--real --device cpu`: real CPU tensors (to check the fake
    /// group against the same ranks with real collectives).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nproc_per_node: Option<u32>,
    /// Nodes of the job (with --nproc-per-node): WORLD_SIZE = nodes x processes per node.
    #[arg(long, default_value_t = 1, requires = "nproc_per_node", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub nnodes: u32,
    /// Which ranks to capture (with --nproc-per-node): `all`, a list `0,3,7`, or `distinct`:
    /// each rank stops at its first step when its allocations so far equal an earlier rank's
    /// (uniform SPMD: one trace stands for them; DIR/ranks.json says which).
    #[arg(long, default_value = "all", requires = "nproc_per_node")]
    pub ranks: String,
    /// SCRIPT.py [ARGS...], after `--`.
    #[arg(required = true, last = true, value_name = "SCRIPT.py [ARGS]")]
    pub command: Vec<std::ffi::OsString>,
}

/// Returns the script's exit code (2 when the capture could not start).
pub fn main(mut a: CaptureArgs) -> i32 {
    let Some(per_node) = a.nproc_per_node else {
        return match options(&a) {
            Ok(opts) => capture_one(&opts).0,
            Err(code) => code,
        };
    };
    // The driver backend, or real CPU tensors (to check the fake group against real collectives).
    let cpu_check = a.real && a.device == "cpu";
    if a.backend == "auto" && !cpu_check {
        a.backend = "driver".into(); // (ranks run on PyTorch's own CUDA path)
    }
    if a.backend != "driver" && !cpu_check {
        eprintln!("error: --nproc-per-node runs each rank on PyTorch's own CUDA path with its fake process group: add --backend driver");
        return crate::capture::EXIT_SETUP_ERROR;
    }
    if a.ranks == "distinct" && a.backend != "driver" {
        eprintln!("error: --ranks distinct compares the ranks' allocations on the driver backend: add --backend driver, or give --ranks all");
        return crate::capture::EXIT_SETUP_ERROR;
    }
    // One capture a rank, as torchrun would start them, each to DIR/rank-R.csv.
    let job = crate::capture::RankJob { nproc_per_node: per_node, nnodes: a.nnodes, ranks: a.ranks.clone() };
    if let Err(e) = job.ranks() {
        eprintln!("error: {e}");
        return crate::capture::EXIT_SETUP_ERROR;
    }
    let dir = a.output.clone();
    if dir.extension().is_some_and(|e| e == "csv" || e == "gz") || dir.is_file() {
        eprintln!("error: -o {}: with --nproc-per-node, -o names a folder for the ranks' traces (rank-R.csv)", dir.display());
        return crate::capture::EXIT_SETUP_ERROR;
    }
    let opts = match options(&a) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match crate::capture::capture_ranks(&opts, &job, &dir, &mut capture_one, &mut |line| eprintln!("{line}")) {
        Ok((code, _)) => code,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            2
        }
    }
}

/// The capture the flags ask for (an error said, with its exit code).
fn options(a: &CaptureArgs) -> Result<crate::capture::CaptureOptions, i32> {
    let a = a.clone();
    let mut command = a.command.into_iter();
    let script = PathBuf::from(command.next().unwrap_or_default());
    if let Err(e) = super::output::check_outputs(&[Some(&a.output)], &[Some(&script)]) {
        eprintln!("error: {e}");
        return Err(crate::capture::EXIT_SETUP_ERROR);
    }
    Ok(crate::capture::CaptureOptions {
        python: a.python,
        output: a.output,
        steps: a.steps,
        real: a.real,
        device: a.device,
        backend: a.backend,
        gpus: a.gpus,
        cublas_workspace_mib: a.cublas_workspace_mib,
        scalar_value: a.scalar_value,
        strict_values: a.strict_values,
        progress: if a.quiet { false } else { a.progress || std::io::IsTerminal::is_terminal(&std::io::stderr()) },
        sites: !a.no_sites,
        device_memory: a.device_memory,
        card_memory: match a.card.as_deref().map(crate::gpu::card::find).transpose() {
            Ok(card) => card.map(|c| c.total_memory),
            Err(e) => {
                eprintln!("error: --card: {e}");
                return Err(crate::capture::EXIT_SETUP_ERROR);
            }
        },
        script_output: None,
        script,
        args: command.collect(),
        env: Vec::new(),
    })
}

/// One capture, its progress drawn and its outcome said.
fn capture_one(opts: &crate::capture::CaptureOptions) -> (i32, Option<crate::capture::CaptureOutcome>) {
    // A terminal gets one line redrawn; a log (--progress) a plain line every 10 s.
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = (opts.progress && terminal).then(super::progress::capture);
    let started = std::time::Instant::now();
    let mut rate = super::progress::RowRate::default();
    let mut logged = std::time::Duration::ZERO;
    let ran = crate::capture::run_watched(opts, &mut |p| {
        let now = started.elapsed();
        let message = super::progress::capture_message(p, now, &mut rate);
        if let Some(bar) = &bar {
            bar.set_message(message);
            bar.tick();
        } else if now >= logged + std::time::Duration::from_secs(10) {
            logged = now;
            eprintln!("allocbench capture: {} {message}", indicatif::HumanDuration(now));
        }
    });
    super::progress::finish(bar);
    match ran {
        Ok(outcome) if outcome.state == "setup_error" => {
            eprintln!("error: {}", outcome.message);
            (crate::capture::EXIT_SETUP_ERROR, Some(outcome))
        }
        Ok(outcome) => {
            // (A rank stopped for having an earlier rank's role is said by the caller.)
            if outcome.same_role_as.is_none() {
                let text = crate::capture::describe(opts, &outcome);
                if outcome.complete() {
                    eprintln!("{text}");
                } else {
                    eprintln!("error: {text}");
                }
            }
            (outcome.exit_code, Some(outcome))
        }
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            (if e.downcast_ref::<InputError>().is_some() { 2 } else { 1 }, None)
        }
    }
}
