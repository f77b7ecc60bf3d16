//! `allocbench sweep plan|run|merge`: a sweep of inputs × confs × capacities × allocators, sharded
//! over a Slurm job array or a Kubernetes Indexed Job (see [`crate::sweep`]).

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::args::parse_capacity;
use super::output::{self, Jsonl};
use super::progress;
use crate::error::InputError;
use crate::results::{GpuPolicy, ResultRecord, RowStatus};
use crate::sweep::{Plan, PlanRequest, Shard};
use crate::units::format_bytes;

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub command: SweepCommand,
}

#[derive(Subcommand, Debug)]
pub enum SweepCommand {
    /// Write one row per replay (input and sha256, allocator, conf, capacity) in a stable order.
    Plan(PlanArgs),
    /// Replay one shard of a plan (rows i ≡ I mod N) on every core, appending each row to DIR/shard-I-of-N.jsonl.
    Run(RunArgs),
    /// Gather every plan row once from DIR's shard files into one results file.
    Merge(MergeArgs),
}

#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    #[command(flatten)]
    pub torch: super::args::TorchVersionArg,
    /// Traces (.csv, .csv.gz), RMM logs, PyTorch snapshots (.pickle or .json), workloads (.toml),
    /// or sharded jobs' folders (`capture --nproc-per-node -o DIR`: each rank's trace an input).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// PYTORCH_CUDA_ALLOC_CONF strings for pytorch: `advise` (advise's search space) or a file with
    /// one per line (`default` = PyTorch's defaults; blank and # lines skipped). Default: the defaults only.
    #[arg(long)]
    pub confs: Option<String>,
    /// Device sizes, e.g. 40GiB,80GiB,141GiB (default: the H100-80GB card's 85,017,493,504 bytes).
    #[arg(long, value_delimiter = ',', value_parser = parse_capacity)]
    pub capacities: Vec<u64>,
    /// GPU allocators: pytorch, nocache, ideal.
    #[arg(long, value_delimiter = ',', default_value = "pytorch")]
    pub allocators: Vec<String>,
    /// Copy the inputs into this folder (for a shared filesystem); the plan names them relative to its own folder when inside it.
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    /// The plan file (JSON Lines).
    #[arg(short, long)]
    pub output: PathBuf,
    /// A PyTorch snapshot of several GPUs: replay device N's history only (default: every
    /// recorded device's, each a workload of its own).
    #[arg(long, value_name = "N")]
    pub snapshot_device: Option<usize>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The plan written by `sweep plan`.
    pub plan: PathBuf,
    /// Output folder, shared by all shards: DIR/shard-I-of-N.jsonl and a copy of the plan.
    #[arg(long)]
    pub out: PathBuf,
    /// This task's shard: I/N (0-based). Default: SLURM_ARRAY_TASK_ID/COUNT, or JOB_COMPLETION_INDEX with --shards, or the whole plan.
    #[arg(long, conflicts_with = "shards")]
    pub shard: Option<String>,
    /// The shard count, the index coming from JOB_COMPLETION_INDEX (Kubernetes) or SLURM_ARRAY_TASK_ID.
    #[arg(long)]
    pub shards: Option<u64>,
    /// Worker threads (default: SLURM_CPUS_PER_TASK inside a Slurm job, else every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The output folder of `sweep run`.
    pub dir: PathBuf,
    /// The merged results file (JSON Lines; `allocbench report` and `allocbench advise` read it).
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn main(a: &SweepArgs) -> anyhow::Result<()> {
    match &a.command {
        SweepCommand::Plan(p) => plan(p),
        SweepCommand::Run(r) => run(r),
        SweepCommand::Merge(m) => merge(m),
    }
}

/// `--confs`: `advise`'s space, or one conf per line of a file.
fn read_confs(arg: Option<&str>) -> anyhow::Result<Vec<String>> {
    let Some(arg) = arg else { return Ok(vec![String::new()]) };
    if arg == "advise" {
        return Ok(crate::advise::search_space());
    }
    let text = crate::files::read_text_at_most(std::path::Path::new(arg), 16 << 20, "a confs file (one PYTORCH_CUDA_ALLOC_CONF string per line, or 'advise')")?;
    let mut confs: Vec<String> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let conf = if line == "default" { "" } else { line };
        crate::gpu::config::AllocatorConfig::parse(conf).map_err(|e| InputError::new(format!("{arg}:{}", i + 1), e.message))?;
        if !confs.iter().any(|c| c == conf) {
            confs.push(conf.to_string());
        }
    }
    if confs.is_empty() {
        return Err(InputError::new(arg, "no conf in the file (one PYTORCH_CUDA_ALLOC_CONF string per line; `default` for the defaults)").into());
    }
    Ok(confs)
}

fn plan(a: &PlanArgs) -> anyhow::Result<()> {
    let inputs: Vec<Option<&Path>> = a.inputs.iter().map(|p| Some(p.as_path())).chain([a.confs.as_deref().map(Path::new)]).collect();
    output::check_outputs(&[Some(&a.output)], &inputs)?;
    // A sharded job's folder is its ranks' traces, each an input (one per role under --ranks distinct).
    let mut expanded = Vec::new();
    for input in &a.inputs {
        if !input.is_dir() {
            expanded.push(input.clone());
            continue;
        }
        let traces = crate::trace::ranks::read_folder(input)?;
        eprintln!(
            "{}: {} planned as inputs ({})",
            input.display(),
            crate::units::count(traces.len() as u64, "rank trace"),
            traces.iter().map(|t| t.label()).collect::<Vec<_>>().join("; ")
        );
        expanded.extend(traces.into_iter().map(|t| t.path));
    }
    let a = &PlanArgs { inputs: expanded, ..a.clone() };
    let confs = read_confs(a.confs.as_deref())?;
    let capacities = if a.capacities.is_empty() { vec![crate::gpu::device::H100_CAPACITY_BYTES] } else { a.capacities.clone() };
    let rows = crate::sweep::make_plan(&PlanRequest {
        inputs: &a.inputs,
        allocators: &a.allocators,
        confs: &confs,
        capacities: &capacities,
        plan_path: &a.output,
        bundle: a.bundle.as_deref(),
        snapshot_device: a.snapshot_device,
    })?;
    crate::sweep::write_plan(output::open(&a.output.display().to_string())?.as_mut(), &rows)?;
    // A snapshot of several GPUs gives a workload per device.
    let workloads = rows.iter().map(|r| (&r.input, r.snapshot_device)).collect::<std::collections::HashSet<_>>().len();
    println!(
        "{} rows ({}{} × {} capacities × {} allocator/conf pairs) written to {}",
        rows.len(),
        crate::units::count(a.inputs.len() as u64, "input"),
        if workloads > a.inputs.len() { format!(", {workloads} workloads with each GPU of a snapshot's") } else { String::new() },
        capacities.len(),
        rows.len() / (workloads * capacities.len()).max(1),
        a.output.display()
    );
    Ok(())
}

fn run(a: &RunArgs) -> anyhow::Result<()> {
    // Checked here rather than by clap, so that a bad shard is one line like every input error.
    let flag = a.shard.as_deref().map(Shard::parse).transpose().map_err(|e| InputError::new("--shard", e))?;
    let shard = Shard::resolve(flag, a.shards, &|k| std::env::var(k).ok())?;
    let plan = Plan::read(&a.plan)?;
    // Every core this task may use: what Slurm granted (--cpus-per-task), else the machine's.
    let granted = std::env::var("SLURM_CPUS_PER_TASK").ok().and_then(|v| v.trim().parse::<usize>().ok());
    let threads = a.threads.map(usize::from).or(granted).unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    let start = std::time::Instant::now();
    // The bar learns its length once the shard knows which of its rows are left.
    let pb = progress::rows(a.quiet);
    let mut todo = |n: usize| {
        if let Some(pb) = &pb {
            pb.set_length(n as u64);
        }
    };
    let mut each = |r: &crate::results::SweepRow| {
        if let Some(pb) = &pb {
            pb.inc(1);
        }
        if let Some(e) = r.error.as_deref().filter(|_| r.status == RowStatus::Failed) {
            eprintln!("row {} failed: {e}", r.row.index);
        }
    };
    let summary = crate::sweep::run_shard(&plan, &a.out, shard, threads, &mut todo, &mut each)?;
    progress::finish(pb);
    println!(
        "shard {}/{}: {} of the plan's {} rows; {} already done, {} replayed ({} failed) in {:.1} s on {} threads -> {}",
        shard.index,
        shard.count,
        summary.rows,
        plan.rows.len(),
        summary.already_done,
        summary.replayed,
        summary.failed,
        start.elapsed().as_secs_f64(),
        threads,
        summary.file.display()
    );
    if summary.interrupted {
        // Not a success for the scheduler: the shard is incomplete.
        anyhow::bail!("interrupted: run the same command again to finish the shard");
    }
    Ok(())
}

fn merge(a: &MergeArgs) -> anyhow::Result<()> {
    // Its own inputs (the plan's copy, the shards) are never its output.
    let inputs = crate::sweep::merge_inputs(&a.dir)?;
    output::check_outputs(&[Some(&a.output)], &inputs.iter().map(|p| Some(p.as_path())).collect::<Vec<_>>())?;
    let merged = crate::sweep::merge(&a.dir)?;
    let mut out = Jsonl::open(Some(&a.output))?;
    for r in &merged.rows {
        out.write(&ResultRecord::SweepRow(Box::new(r.clone())))?;
    }
    drop(out);
    for r in merged.rows.iter().filter(|r| r.status == RowStatus::Failed) {
        eprintln!("failed row {} ({}): {}", r.row.index, describe_row(&r.row), r.error.as_deref().unwrap_or("no reason recorded"));
    }
    for r in &merged.missing {
        eprintln!("missing row {} ({})", r.index, describe_row(r));
    }
    let failed = merged.rows.iter().filter(|r| r.status == RowStatus::Failed).count();
    println!(
        "{} of {} plan rows ({} failed) from {} shard files, {} duplicates dropped -> {}",
        merged.rows.len(),
        merged.plan_rows,
        failed,
        merged.shard_files,
        merged.duplicates,
        a.output.display()
    );
    if !merged.missing.is_empty() {
        anyhow::bail!("{} of {} plan rows are missing (listed above): run their shards again, then merge", merged.missing.len(), merged.plan_rows);
    }
    if failed > 0 {
        // Written, but not a complete sweep: a scheduler's merge job shows it failed.
        anyhow::bail!(
            "{failed} of {} plan rows failed (listed above): mend their inputs, run their shards again (only failed rows replay), then merge",
            merged.plan_rows
        );
    }
    Ok(())
}

fn describe_row(r: &crate::results::PlanRow) -> String {
    let conf = GpuPolicy::parse(&r.allocator).map_or(r.conf.as_str(), |p| p.conf_or(&r.conf, "defaults"));
    format!("{}, {} {}, {}", Path::new(&r.input).display(), r.allocator, conf, format_bytes(r.capacity))
}
