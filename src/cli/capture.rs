//! `allocbench capture`: runs an unmodified PyTorch script and writes its CUDA allocation trace.

use std::path::PathBuf;

use clap::Args;

use crate::error::InputError;

#[derive(Args, Debug)]
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
    /// Answer `.item()` of a fake tensor with this value (and `.numpy()` with it in every element)
    /// instead of stopping (for logging code).
    #[arg(long)]
    pub scalar_value: Option<f64>,
    /// The fake card's memory (e.g. 24GiB; default an H100 80 GB's, 79.6 GiB): live tensors past
    /// it raise torch.cuda.OutOfMemoryError, as on a real card, so a script's OOM handling runs.
    #[arg(long, value_parser = crate::cli::args::parse_capacity)]
    pub device_memory: Option<u64>,
    /// Leave out the allocation sites (the trace's `#site`/`#at` lines; they cost little).
    #[arg(long)]
    pub no_sites: bool,
    /// The trace to write (v1 CSV).
    #[arg(short, long)]
    pub output: PathBuf,
    /// SCRIPT.py [ARGS...], after `--`.
    #[arg(required = true, last = true, value_name = "SCRIPT.py [ARGS]")]
    pub command: Vec<std::ffi::OsString>,
}

/// Returns the script's exit code (2 when the capture could not start).
pub fn main(a: CaptureArgs) -> i32 {
    let mut command = a.command.into_iter();
    let script = PathBuf::from(command.next().unwrap_or_default());
    if let Err(e) = super::output::check_outputs(&[Some(&a.output)], &[Some(&script)]) {
        eprintln!("error: {e}");
        return crate::capture::EXIT_SETUP_ERROR;
    }
    let opts = crate::capture::CaptureOptions {
        python: a.python,
        output: a.output,
        steps: a.steps,
        real: a.real,
        device: a.device,
        cublas_workspace_mib: a.cublas_workspace_mib,
        scalar_value: a.scalar_value,
        sites: !a.no_sites,
        device_memory: a.device_memory,
        script,
        args: command.collect(),
    };
    match crate::capture::run(&opts) {
        Ok(outcome) if outcome.state == "setup_error" => {
            eprintln!("error: {}", outcome.message);
            crate::capture::EXIT_SETUP_ERROR
        }
        Ok(outcome) => {
            let line = crate::capture::describe(&opts, &outcome);
            if outcome.complete() {
                eprintln!("{line}");
            } else {
                eprintln!("error: {line}");
            }
            outcome.exit_code
        }
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            if e.downcast_ref::<InputError>().is_some() {
                2
            } else {
                1
            }
        }
    }
}
