//! `allocbench run`: every allocator x conf on one input, each result appended to the JSON Lines
//! file as it finishes, then the comparison table.

use std::path::{Path, PathBuf};

use clap::Args;

use super::args::DeviceArgs;
use super::{output::Jsonl, progress};
use crate::gpu::config::AllocatorConfig;
use crate::gpu_run;
use crate::input::Source;
use crate::results::{GpuPolicy, GpuRunResult, OnOom, ResultRecord};
use crate::units::count;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub torch: super::args::TorchVersionArg,
    /// A trace (.csv, .csv.gz) or workload (.toml); default: the embedded captured 1.3B training trace.
    pub input: Option<PathBuf>,
    /// Comma-separated GPU allocators.
    #[arg(long, default_value = "pytorch,nocache,ideal", value_delimiter = ',')]
    pub allocators: Vec<String>,
    /// PYTORCH_CUDA_ALLOC_CONF strings to try with the pytorch allocator (repeatable; "" = defaults).
    #[arg(long = "conf")]
    pub confs: Vec<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Append every run's results to this JSON Lines file as it finishes.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
}

pub fn main(a: &RunArgs) -> anyhow::Result<()> {
    super::output::check_outputs(&[a.jsonl.as_deref()], &[a.input.as_deref()])?;
    let source = Source::open(a.input.as_deref())?;
    let policies = a.allocators.iter().map(|name| GpuPolicy::parse(name)).collect::<Result<Vec<_>, _>>()?;
    compare(&source, &policies, &a.confs, &a.device, a.jsonl.as_deref())
}

/// Replays `source` under each allocator (and each conf for pytorch), writing each result as it
/// finishes, then prints the comparison table.
pub fn compare(source: &Source, policies: &[GpuPolicy], confs: &[String], dev: &DeviceArgs, jsonl: Option<&Path>) -> anyhow::Result<()> {
    let device = dev.spec()?;
    if !confs.is_empty() && !policies.iter().any(|p| p.takes_conf()) {
        let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
        eprintln!("warning: --conf applies to the pytorch allocator only, which is not among --allocators {}", names.join(","));
    }
    let confs: Vec<AllocatorConfig> =
        if confs.is_empty() { vec![AllocatorConfig::from_env()?] } else { confs.iter().map(|c| AllocatorConfig::parse(c)).collect::<Result<_, _>>()? };
    let plan = gpu_run::plan(policies, &confs);
    let opts = dev.replay_options();
    let mut out = Jsonl::append(jsonl)?;
    // Hashing a large trace takes a pass over it: once, for every row.
    let info = source.info()?;
    let mut rows = Vec::new();
    for p in &plan {
        let pb = progress::events(dev.quiet, &p.label());
        let r = gpu_run::run_source(source, &info, p.allocator, &p.conf, &device, &opts, &mut progress::watch(&pb))?;
        progress::finish(pb);
        out.write(&ResultRecord::GpuReplay(Box::new(r.clone())))?;
        let interrupted = r.summary.interrupted;
        rows.push(r);
        if interrupted {
            break;
        }
    }
    // The input's events: a row that stopped at an OOM replayed fewer. The device: the one a
    // policy ran on (the ideal bound describes itself).
    let events = rows.iter().map(|r| r.work.events).max().unwrap_or(0);
    // (With --on-oom continue an OOM is counted and the run goes on to the end.)
    let stopped = |r: &GpuRunResult| r.summary.interrupted || (r.oom.is_some() && opts.on_oom == OnOom::Stop);
    let all_stopped = !rows.is_empty() && rows.iter().all(stopped);
    println!(
        "{} ({}), {}, {}",
        info.name,
        info.kind,
        if all_stopped { format!("{} replayed before every run stopped", count(events, "event")) } else { count(events, "event") },
        rows.iter().find(|r| r.allocator != GpuPolicy::Ideal).or(rows.first()).map(|r| r.device.clone()).unwrap_or_default()
    );
    print!("{}", gpu_run::comparison_table(&rows));
    if let Some(p) = jsonl {
        eprintln!("results written to {}", p.display());
    }
    if rows.iter().any(|r| r.summary.interrupted) {
        crate::interrupt::exit_interrupted("the rows cover what was replayed before it (marked \"interrupted\")");
    }
    Ok(())
}
