//! `allocbench fit`: the largest batch size (or any script argument) that fits a card.

use std::path::PathBuf;

use clap::Args;

use crate::fit::FitParam;
use crate::results::Objective;

#[derive(Args, Debug)]
#[command(after_help = "Example: allocbench fit --param batch=1..64 --card A100-40GB -- train.py --batch-size {batch}")]
pub struct FitArgs {
    /// The argument to search, NAME=LO..HI (whole numbers); `{NAME}` in the script's arguments is
    /// replaced by each value tried.
    #[arg(long, value_name = "NAME=LO..HI")]
    pub param: FitParam,
    #[command(flatten)]
    pub card: super::args::CardArgs,
    /// Steps captured per value (optimizer.step() calls, or allocbench_capture.step() markers):
    /// enough to reach the steady state (the optimizer's state exists after the first).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// What the advised configuration minimises (as `advise --objective`).
    #[arg(long, value_enum, default_value = "balanced")]
    pub objective: Objective,
    /// The Python that has torch (default: $ALLOCBENCH_PYTHON, else python3).
    #[arg(long)]
    pub python: Option<String>,
    /// The cuBLAS workspace modelled, in MiB (as `capture --cublas-workspace-mib`).
    #[arg(long)]
    pub cublas_workspace_mib: Option<u64>,
    /// The stand-in for reads of fake values (as `capture --scalar-value`) [default: 0].
    #[arg(long, conflicts_with = "strict_values")]
    pub scalar_value: Option<f64>,
    /// Stop at the first read of a fake value (as `capture --strict-values`).
    #[arg(long)]
    pub strict_values: bool,
    /// Keep each value's trace in this folder (NAME-VALUE.csv).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Worker threads for the advice (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Write the search as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
    /// A sharded job: each value captures the script as `torchrun --nproc-per-node N` would run
    /// it (`capture --nproc-per-node`, driver backend, `--ranks distinct`); a value fits when every
    /// rank does, each with its NCCL buffers; the worst rank's numbers are its row.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nproc_per_node: Option<u32>,
    /// Nodes of the sharded job (with --nproc-per-node).
    #[arg(long, default_value_t = 1, requires = "nproc_per_node", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub nnodes: u32,
    /// SCRIPT.py [ARGS...] with {NAME} where the value goes, after `--`.
    #[arg(required = true, last = true, value_name = "SCRIPT.py [ARGS]")]
    pub command: Vec<std::ffi::OsString>,
}

pub fn main(a: FitArgs) -> anyhow::Result<()> {
    let mut command = a.command.into_iter();
    let script = PathBuf::from(command.next().unwrap_or_default());
    super::output::check_outputs(&[a.json.as_deref().map(std::path::Path::new)], &[Some(&script)])?;
    // The card comes from the flags alone (no trace yet to read a fake card from).
    let target = a.card.target(&crate::input::Source::Embedded)?;
    let capture = crate::capture::CaptureOptions {
        python: a.python,
        output: PathBuf::new(),
        steps: Some(a.steps),
        real: false,
        device: "cuda".into(),
        backend: if a.nproc_per_node.is_some() { "driver" } else { "fake-tensors" }.into(),
        gpus: 1,
        cublas_workspace_mib: a.cublas_workspace_mib,
        scalar_value: a.scalar_value,
        strict_values: a.strict_values,
        progress: false,
        sites: false,
        device_memory: None,
        card_memory: Some(target.capacity),
        script_output: None,
        script,
        args: command.collect(),
        env: Vec::new(),
    };
    let threads = a.threads.map(usize::from).unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let job = a.nproc_per_node.map(|n| crate::capture::RankJob { nproc_per_node: n, nnodes: a.nnodes, ranks: "distinct".into() });
    let opts = crate::fit::FitOptions {
        param: a.param,
        capture,
        capacity: target.capacity,
        outside: target.outside,
        objective: a.objective,
        threads,
        keep: a.keep,
        job,
        nccl_from_capture: a.card.nccl.is_none(),
    };
    let to_stdout = a.json.as_deref() == Some("-");
    let quiet = a.quiet || to_stdout;
    let result = crate::fit::fit(&opts, &mut |t| {
        if !quiet {
            let advice = match (&t.advised_conf, t.fits_advised) {
                (Some(c), Some(f)) => format!("; advised '{c}': {}", if f { "fits" } else { "OOM" }),
                _ => String::new(),
            };
            eprintln!(
                "{}={}{}: peak reserved {} with the defaults: {}{advice}",
                opts.param.name,
                t.value,
                t.rank.map(|r| format!(" (rank {r}, the worst)")).unwrap_or_default(),
                crate::units::format_bytes(t.peak_reserved),
                if t.fits { "fits" } else { "OOM" }
            );
        }
    })?;
    if !to_stdout {
        print!("{}", crate::fit::describe(&result));
    }
    if let Some(path) = &a.json {
        super::output::write_json(path, &result)?;
    }
    Ok(())
}
