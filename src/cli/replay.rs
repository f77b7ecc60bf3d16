//! `allocbench replay`: one replay, a printed summary and size histogram, and the results as JSON.

use std::path::{Path, PathBuf};

use clap::Args;

use super::args::{print_notes, DeviceArgs};
use super::{output, progress};
use crate::error::InputError;
use crate::gpu::build::{build, DeviceSpec};
use crate::gpu::config::AllocatorConfig;
use crate::gpu::replay::OnOom;
use crate::gpu_run;
use crate::input::Source;
use crate::report::memory_view::{self, BlockSites, ViewRun};
use crate::results::{Backend, GpuPolicy, GpuRunResult, ResultRecord};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub torch: super::args::TorchVersionArg,
    /// A trace (.csv), RMM log (.csv), PyTorch snapshot (.pickle or .json), workload (.toml), or
    /// a sharded job's folder of per-rank traces (`capture --nproc-per-node -o DIR`).
    pub input: PathBuf,
    #[command(flatten)]
    pub snapshot: super::args::SnapshotDeviceArg,
    /// GPU allocator policy: pytorch, nocache, ideal, or async (CUDA's pool; --device cuda).
    #[arg(long, default_value = "pytorch")]
    pub allocator: String,
    /// PYTORCH_CUDA_ALLOC_CONF string (default: the environment variable, else PyTorch's defaults).
    #[arg(long)]
    pub conf: Option<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Write the results as JSON to this file ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
    /// Write the interactive memory view (timeline, segment map at the peak or the OOM, hover
    /// for blocks and, for snapshots and captures, allocation sites) to this HTML file.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
}

pub fn main(a: &ReplayArgs) -> anyhow::Result<()> {
    output::check_outputs(&[a.json.as_deref().map(Path::new), a.html.as_deref()], &[Some(&a.input)])?;
    // Only PyTorch's caching allocator reads the conf: another one would be replayed as if the
    // setting had been tried.
    let policy = GpuPolicy::parse(&a.allocator)?;
    if !policy.takes_conf() && a.conf.as_deref().is_some_and(|c| !c.trim().is_empty()) {
        return Err(InputError::new(
            "--conf",
            format!("sets PyTorch's caching allocator, which --allocator {policy} is not: drop --conf, or use --allocator pytorch"),
        )
        .into());
    }
    let conf = AllocatorConfig::from_arg(a.conf.as_deref())?;
    if a.input.is_dir() {
        return replay_ranks(a, policy, &conf);
    }
    let source = a.snapshot.open(&a.input)?;
    let (spec, mut result) = replay_one(a, policy, &conf, &source)?;
    let sites = match &a.html {
        Some(_) => exact_segments_and_sites(&source, policy, &conf, &spec, &mut result, a.device.replay_options().on_oom)?,
        None => None,
    };
    let json = a.json.as_deref();
    if let Some(path) = json {
        output::write_json(path, &ResultRecord::GpuReplay(Box::new(result.clone())))?;
    }
    if json != Some("-") {
        print!("{}", gpu_run::describe(&result));
        print_histogram(&result.size_histogram);
    }
    if let Some(path) = json.filter(|p| *p != "-") {
        eprintln!("results written to {path}");
    }
    // After the results, so a page that cannot be written loses none of them.
    if let Some(out) = &a.html {
        let (sites, names) = sites.unzip();
        let page = memory_view::page(
            &format!("{}: memory view ({})", result.workload.name, result.label()),
            &[ViewRun { run: &result, sites }],
            &names.unwrap_or_default(),
        );
        std::fs::write(out, page).map_err(|e| InputError::new(out.display().to_string(), format!("cannot write the memory view: {e}")))?;
        eprintln!("memory view written to {}", out.display());
    }
    if result.summary.interrupted {
        crate::interrupt::exit_interrupted(&format!(
            "the results cover the {} replayed before it (marked \"interrupted\")",
            crate::units::count(result.work.events, "event")
        ));
    }
    Ok(())
}

/// One input's replay, its notes said first.
fn replay_one(a: &ReplayArgs, policy: GpuPolicy, conf: &AllocatorConfig, source: &Source) -> anyhow::Result<(DeviceSpec, GpuRunResult)> {
    print_notes(source);
    let mut spec = DeviceSpec { addresses: source.address_script(), ..a.device.spec()? };
    if spec.backend == crate::results::Backend::Sim {
        spec.capacity = super::args::capacity_for(spec.capacity, source)?;
    }
    let mut built = build(policy, conf, &spec)?;
    let pb = progress::events(a.device.quiet || a.json.as_deref() == Some("-"), &format!("replaying through {policy}"));
    let result = gpu_run::run_hashing_alongside(&mut built, conf, source, &a.device.replay_options(), &mut progress::watch(&pb))?;
    progress::finish(pb);
    Ok((spec, result))
}

/// A sharded job's folder: each rank's trace replayed in turn, its summary under its ranks,
/// then one line a trace; the rank with the most reserved (or the first OOM) is named. `--json`
/// writes the replays as one JSON array, in rank order.
fn replay_ranks(a: &ReplayArgs, policy: GpuPolicy, conf: &AllocatorConfig) -> anyhow::Result<()> {
    if a.html.is_some() || a.snapshot.snapshot_device.is_some() {
        return Err(InputError::new(
            a.input.display().to_string(),
            "a folder of ranks' traces: --html and --snapshot-device take one trace (give DIR/rank-R.csv)",
        )
        .into());
    }
    let to_stdout = a.json.as_deref() == Some("-");
    let mut results = Vec::new();
    for trace in crate::trace::ranks::read_folder(&a.input)? {
        let source = Source::open(Some(&trace.path))?;
        let (_, mut result) = replay_one(a, policy, conf, &source)?;
        if !trace.same_role.is_empty() {
            result.workload.name = format!("{} (also {})", result.workload.name, crate::trace::ranks::ranges(&trace.same_role));
        }
        if !to_stdout {
            println!("== {} ({}) ==", trace.label(), trace.path.display());
            print!("{}", gpu_run::describe(&result));
        }
        let interrupted = result.summary.interrupted;
        results.push((trace, result));
        if interrupted {
            break;
        }
    }
    if let Some(path) = &a.json {
        let records: Vec<ResultRecord> = results.iter().map(|(_, r)| ResultRecord::GpuReplay(Box::new(r.clone()))).collect();
        output::write_json(path, &records)?;
    }
    if !to_stdout {
        println!("\n{:<26} {:>14} {:>16}  outcome", "ranks", "peak reserved", "peak allocated");
        for (t, r) in &results {
            let outcome = match &r.oom {
                Some(o) => format!("OOM at step {}", o.step),
                None => "no OOM".into(),
            };
            println!(
                "{:<26} {:>14} {:>16}  {outcome}",
                crate::trace::ranks::ranges(&t.ranks()),
                crate::units::format_bytes(r.summary.peak_reserved),
                crate::units::format_bytes(r.stats.get("allocated_bytes.all.peak").copied().unwrap_or(0) as u64)
            );
        }
        let worst = results.iter().min_by_key(|(_, r)| crate::trace::ranks::worst_first(r.oom.as_ref().map(|o| (o.step, o.event)), r.summary.peak_reserved));
        if let Some((t, r)) = worst {
            println!("the job's worst: {} ({})", t.label(), if r.oom.is_some() { "the first OOM" } else { "the most reserved" });
        }
    }
    if let Some(path) = a.json.as_deref().filter(|p| *p != "-") {
        eprintln!("results written to {path}");
    }
    if results.iter().any(|(_, r)| r.summary.interrupted) {
        crate::interrupt::exit_interrupted("the results cover the ranks replayed before it (the last marked \"interrupted\")");
    }
    Ok(())
}

/// What the memory view needs beyond the record. On the simulated device a second,
/// deterministic replay takes the segment maps at exactly the peak and at the OOM with each
/// block's allocation (the record keeps that peak map too, as `run` does); for snapshots and
/// captures, the allocation site of each block (`sites[segment][block]`) and the site names.
fn exact_segments_and_sites(
    source: &Source,
    allocator: GpuPolicy,
    conf: &AllocatorConfig,
    spec: &DeviceSpec,
    result: &mut GpuRunResult,
    on_oom: OnOom,
) -> anyhow::Result<Option<(BlockSites, Vec<String>)>> {
    if spec.backend != Backend::Sim || result.summary.interrupted {
        return Ok(None);
    }
    let owners = gpu_run::segment_owners(allocator, conf, spec, source.events()?, on_oom)?;
    // The peak map is exact here whatever happened after it (the record keeps it).
    result.segments_at_peak = owners.at_peak.segments;
    let ids = if result.oom.is_some() {
        result.segments_at_oom = owners.at_oom;
        owners.oom_owners
    } else {
        owners.at_peak.owners
    };
    Ok(source.sites()?.map(|sites| (memory_view::block_sites(&ids, &sites), sites.into_owned().names)))
}

fn print_histogram(h: &[(u64, u64)]) {
    let total: u64 = h.iter().map(|(_, c)| c).sum();
    if total == 0 {
        return;
    }
    println!("allocation sizes (log2 buckets):");
    let max = h.iter().map(|(_, c)| *c).max().unwrap_or(1);
    for (lo, c) in h {
        let bar = "#".repeat(((*c as f64 / max as f64) * 40.0).ceil() as usize);
        println!("  >= {:>10} {:>10} {:>5.1}% {bar}", crate::units::format_bytes(*lo), c, 100.0 * *c as f64 / total as f64);
    }
}
