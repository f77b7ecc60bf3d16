//! `allocbench advise`: the `PYTORCH_CUDA_ALLOC_CONF` for an objective (memory, time, balanced),
//! every configuration priced in modelled allocator time.

use std::path::{Path, PathBuf};

use clap::Args;

use super::args::print_notes;
use super::output::{self, Jsonl};
use super::progress;
use crate::error::InputError;
use crate::gpu::devprobe::LatencyModel;
use crate::results::{read_results, GpuPolicy, Objective, ResultRecord, SweepRow};

#[derive(Args, Debug)]
pub struct AdviseArgs {
    #[command(flatten)]
    pub torch: super::args::TorchVersionArg,
    /// A trace (.csv), RMM log (.csv), PyTorch snapshot (.pickle or .json) or workload (.toml); a
    /// sharded job's folder of per-rank traces (its worst rank advised on, the pick checked on
    /// each); or a merged sweep (`sweep merge`'s .jsonl): the best conf per input and capacity.
    pub input: PathBuf,
    #[command(flatten)]
    pub snapshot: super::args::SnapshotDeviceArg,
    /// The card (with a merged sweep, --capacity picks its rows of that capacity).
    #[command(flatten)]
    pub card: super::args::CardArgs,
    /// What the recommendation minimises: memory; time (modelled allocator time); balanced (the
    /// least memory whose extra modelled allocator time over the defaults' stays under 1 % of the
    /// step time, or 1 ms per step without --step-time).
    #[arg(long, value_enum, default_value = "balanced")]
    pub objective: Objective,
    /// The job's time per step (e.g. 350ms, 1.2s; measured on a GPU): the balanced objective allows
    /// 1 % of it in extra allocator time, and the table gives each config's share of it.
    #[arg(long, value_parser = parse_duration_s, value_name = "TIME")]
    pub step_time: Option<f64>,
    /// Price device calls with another GPU's `allocbench devprobe --json` file (default: the
    /// embedded H100 80GB table, reports/gpu-h100/data/devprobe.json).
    #[arg(long)]
    pub latency: Option<PathBuf>,
    /// How many of the best configurations to print.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Worker threads, 1 to 1024 (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Write every configuration searched and the recommendation as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
    /// Write the default and the recommended configuration's full results and the search (JSON
    /// Lines) for `allocbench report`.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// A duration in seconds: `350ms`, `1.2s`, `2` (seconds), `90us`.
fn parse_duration_s(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() || c == 'µ').unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.trim().parse().map_err(|_| format!("'{s}' is not a time: write it like 350ms or 1.2s"))?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        other => return Err(format!("unknown unit '{other}' in '{s}' (use s, ms or us)")),
    };
    let seconds = value * scale;
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!("'{s}': a step takes some time (more than 0)"));
    }
    Ok(seconds)
}

pub fn main(a: &AdviseArgs) -> anyhow::Result<()> {
    output::check_outputs(&[a.json.as_deref().map(Path::new), a.jsonl.as_deref()], &[Some(&a.input), a.latency.as_deref()])?;
    if a.input.extension().is_some_and(|e| e == "jsonl") {
        if a.snapshot.snapshot_device.is_some() {
            return Err(InputError::new("--snapshot-device", "reads a PyTorch snapshot; a sweep's results (.jsonl) hold replays already").into());
        }
        return from_sweep(a);
    }
    if a.input.is_dir() {
        return advise_ranks(a);
    }
    let source = a.snapshot.open(&a.input)?;
    advise_source(a, &source).map(|_| ())
}

/// A sharded job's folder: the rank that decides the job under PyTorch's defaults (`diagnose
/// DIR`'s: the first to OOM, else the least headroom) is advised on, and the pick is checked on
/// every other rank's trace (a table of each rank's peak with the defaults and with the pick).
fn advise_ranks(a: &AdviseArgs) -> anyhow::Result<()> {
    if a.snapshot.snapshot_device.is_some() {
        return Err(InputError::new("--snapshot-device", "reads a PyTorch snapshot, not a folder of ranks' traces").into());
    }
    let defaults = crate::gpu::config::AllocatorConfig::default();
    let mut diagnosed = Vec::new();
    for trace in crate::trace::ranks::read_folder(&a.input)? {
        let source = crate::input::Source::open(Some(&trace.path))?;
        let target = a.card.target(&source)?;
        let (d, _) = crate::diagnose::diagnose(&source, &defaults, target.capacity, target.outside)?;
        diagnosed.push((trace, d));
    }
    let decided = crate::diagnose::decide_by_rank(diagnosed.clone()).expect("a folder has a trace");
    let (worst, _) = diagnosed.iter().find(|(t, _)| Some(t.rank) == decided.decided_by_rank).expect("the deciding rank is one of them");
    eprintln!("advising on {}, the job's worst with PyTorch's defaults ({})", worst.label(), worst.path.display());
    let source = crate::input::Source::open(Some(&worst.path))?;
    let result = advise_source(a, &source)?;
    let Some(pick) = result.recommended.as_ref().filter(|c| !c.conf.is_empty()) else { return Ok(()) };
    // The pick on every rank: the job fits only where each of its ranks does.
    let conf = crate::gpu::config::AllocatorConfig::parse(&pick.conf)?;
    if a.json.as_deref() != Some("-") {
        println!("\n'{}' on each rank:\n{:<26} {:>22} {:>22}  verdict", pick.conf, "ranks", "device total, defaults", "device total, the pick");
    }
    for (trace, with_defaults) in &diagnosed {
        let source = crate::input::Source::open(Some(&trace.path))?;
        let target = a.card.target(&source)?;
        let (d, _) = crate::diagnose::diagnose(&source, &conf, target.capacity, target.outside)?;
        if a.json.as_deref() != Some("-") {
            println!(
                "{:<26} {:>22} {:>22}  {}",
                crate::trace::ranks::ranges(&trace.ranks()),
                crate::units::format_bytes(with_defaults.device_total),
                crate::units::format_bytes(d.device_total),
                match &d.oom {
                    Some(o) => format!("OOM at step {}", o.step),
                    None => "fits".into(),
                }
            );
        }
    }
    Ok(())
}

/// Advises on one input; returns the result it printed and wrote.
fn advise_source(a: &AdviseArgs, source: &crate::input::Source) -> anyhow::Result<crate::results::AdviseResult> {
    print_notes(source);
    // advise compares configurations itself, PyTorch's defaults first: a conf in the environment
    // is not its baseline. Said, so nobody reads the table as relative to it.
    // (PyTorch reads the first variable set; an empty one is its defaults, advise's baseline.)
    if let Some((var, conf)) = crate::gpu::config::ENV_VARS.into_iter().find_map(|var| Some((var, std::env::var(var).ok()?))).filter(|(_, c)| !c.is_empty()) {
        eprintln!("note: advise searches the allocator settings itself and ignores {var}='{conf}'; its row is the configuration \"{conf}\" if searched, or `allocbench replay --conf '{conf}'`");
    }
    let target = a.card.target(source)?;
    let model = match &a.latency {
        Some(p) => LatencyModel::load(p)?,
        None => LatencyModel::h100(),
    };
    let events = crate::diagnose::load_events(source)?;
    let info = source.info()?;
    let confs = crate::advise::search_space();
    let threads = a.threads.map(usize::from).unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let to_stdout = a.json.as_deref() == Some("-");
    let pb = progress::configurations(a.quiet || to_stdout, confs.len());
    let tick = |n: u64| {
        if let Some(pb) = &pb {
            pb.inc(n);
        }
    };
    let opts = crate::advise::AdviseOptions {
        capacity: target.capacity,
        threads,
        objective: a.objective,
        model: model.clone(),
        addresses: source.address_script(),
        outside: target.outside,
        not_whole_run: source.capture_incomplete(),
        step_time_s: a.step_time,
        flops: source.flops(),
    };
    let result = crate::advise::advise(&events, &info, &confs, &opts, Some(&tick))?;
    progress::finish(pb);
    if !to_stdout {
        print!("{}", crate::advise::describe(&result, a.top));
    }
    if let Some(path) = &a.json {
        output::write_json(path, &ResultRecord::Advise(Box::new(result.clone())))?;
    }
    if let Some(p) = &a.jsonl {
        let mut out = Jsonl::open(Some(p))?;
        out.write(&ResultRecord::Advise(Box::new(result.clone())))?;
        if let Some(best) = &result.recommended {
            crate::advise::full_runs(&events, &info, &opts, best, |r| out.write(&ResultRecord::GpuReplay(Box::new(r))))?;
        }
    }
    Ok(result)
}

/// The ranking of every input × capacity of a merged sweep, from its rows (nothing replayed):
/// the rows' own modelled times, ranked for `--objective` as a search's are.
fn from_sweep(a: &AdviseArgs) -> anyhow::Result<()> {
    let name = a.input.display().to_string();
    if a.json.is_some() {
        return Err(InputError::new("--json", "is for an input advise replays; with a merged sweep use --jsonl").into());
    }
    if a.latency.is_some() {
        return Err(InputError::new("--latency", "a merged sweep's rows are already priced: re-run the sweep to reprice them").into());
    }
    let rows: Vec<SweepRow> = read_results(&a.input)?
        .into_iter()
        .filter_map(|r| if let ResultRecord::SweepRow(s) = r { Some(*s) } else { None })
        .filter(|s| a.card.capacity.is_none_or(|c| s.row.capacity == c))
        .collect();
    let failed = rows.iter().filter(|r| r.status == crate::results::RowStatus::Failed).count();
    if failed > 0 {
        eprintln!("warning: {failed} of the sweep's {} rows failed and are not ranked (`sweep merge` lists them)", rows.len());
    }
    let groups = crate::sweep::advice(&rows);
    if groups.is_empty() {
        return Err(InputError::new(&name, "no replayed pytorch rows of a sweep (of this --capacity) to rank: give `sweep merge`'s output").into());
    }
    let mut out = Jsonl::open(a.jsonl.as_deref())?;
    let table = LatencyModel::h100().device;
    for (i, g) in groups.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        if !g.candidates.iter().any(|c| c.conf.is_empty()) {
            eprintln!(
                "warning: {} on {}: no result with PyTorch's defaults (its row failed, or was not planned): nothing here is measured against them",
                g.workload.name,
                crate::units::format_bytes(g.capacity)
            );
        }
        let result = crate::advise::from_candidates(&g.workload, g.capacity, a.objective, &table, g.steps, a.step_time, g.candidates);
        print!("{}", crate::advise::describe(&result, a.top));
        out.write(&ResultRecord::Advise(Box::new(result.clone())))?;
        // The full rows of the defaults and the pick, as advise --jsonl writes them for the report.
        let pick = result.recommended.as_ref().map(|c| c.conf.as_str()).unwrap_or("");
        for conf in if pick.is_empty() { vec![""] } else { vec!["", pick] } {
            let row = rows.iter().filter_map(|s| s.result.as_ref()).find(|r| {
                r.allocator == GpuPolicy::Pytorch
                    && r.conf == conf
                    && r.capacity == g.capacity
                    && r.workload.sha256 == g.workload.sha256
                    && r.workload.origin == g.workload.origin
            });
            if let Some(r) = row {
                out.write(&ResultRecord::GpuReplay(Box::new(r.clone())))?;
            }
        }
    }
    Ok(())
}
