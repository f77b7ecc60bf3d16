//! `allocbench advise`: the `PYTORCH_CUDA_ALLOC_CONF` that minimises peak reserved memory.

use std::path::PathBuf;

use clap::Args;

use super::args::{parse_capacity, print_notes};
use super::output::{self, Jsonl};
use super::progress;
use crate::error::InputError;
use crate::input::Source;
use crate::results::{read_results, ResultRecord, SweepRow};
use crate::units::format_bytes;

#[derive(Args, Debug)]
pub struct AdviseArgs {
    /// A trace (.csv), RMM log (.csv), PyTorch snapshot (.pickle) or workload (.toml); or a merged
    /// sweep (`sweep merge`'s .jsonl): the best conf per input and capacity from its rows.
    pub input: PathBuf,
    /// Device memory (default: an H100 80 GB card, 81,559 MiB); with a merged sweep, only its rows of this capacity.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// How many of the best configurations to print.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write every evaluated configuration as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
    /// Write the default and the best configuration's full results (JSON Lines) for `allocbench report`.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn main(a: &AdviseArgs) -> anyhow::Result<()> {
    if a.input.extension().is_some_and(|e| e == "jsonl") {
        return from_sweep(a);
    }
    let source = Source::open(Some(&a.input))?;
    print_notes(&source);
    let capacity = a.capacity.unwrap_or(crate::gpu::device::H100_CAPACITY_BYTES);
    let events = crate::diagnose::load_events(&source)?;
    let confs = crate::advise::search_space();
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let pb = progress::configurations(a.quiet, confs.len());
    let start = std::time::Instant::now();
    let tick = || {
        if let Some(pb) = &pb {
            pb.inc(1);
        }
    };
    let ranked = crate::advise::advise(&events, capacity, &confs, threads, Some(&tick))?;
    progress::finish(pb);
    let elapsed = start.elapsed().as_secs_f64();
    let info = source.info()?;
    print!("{}", crate::advise::describe(&info, &ranked, capacity, elapsed, threads, a.top));
    if let Some(path) = &a.json {
        output::write_json(path, &ranked)?;
    }
    if let (Some(p), Some(best)) = (&a.jsonl, ranked.first()) {
        let mut out = Jsonl::open(Some(p))?;
        crate::advise::full_runs(&events, &info, capacity, best, |r| out.write(&ResultRecord::GpuReplay(Box::new(r))))?;
    }
    Ok(())
}

/// The ranking of every input × capacity of a merged sweep, from its rows (nothing replayed).
fn from_sweep(a: &AdviseArgs) -> anyhow::Result<()> {
    let name = a.input.display().to_string();
    if a.json.is_some() {
        return Err(InputError::new("--json", "is for an input advise replays; with a merged sweep use --jsonl").into());
    }
    let rows: Vec<SweepRow> = read_results(&a.input)?
        .into_iter()
        .filter_map(|r| if let ResultRecord::SweepRow(s) = r { Some(*s) } else { None })
        .filter(|s| a.capacity.is_none_or(|c| s.row.capacity == c))
        .collect();
    let groups = crate::sweep::advice(&rows);
    if groups.is_empty() {
        return Err(InputError::new(&name, "no replayed pytorch rows of a sweep (of this --capacity) to rank: give `sweep merge`'s output").into());
    }
    let mut out = Jsonl::open(a.jsonl.as_deref())?;
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!(
            "{} ({}): {} configurations on a {} device, from the sweep {}",
            g.workload.name,
            g.workload.kind,
            g.ranked.len(),
            format_bytes(g.capacity),
            name
        );
        print!("{}", crate::advise::ranking(&g.ranked, a.top));
        // The full rows of the defaults and the best, as advise --jsonl writes them for the report.
        let Some(best) = g.ranked.first() else { continue };
        for conf in ["", best.conf.as_str()] {
            let row = rows.iter().filter_map(|s| s.result.as_ref()).find(|r| {
                r.allocator == "pytorch"
                    && r.conf == conf
                    && r.capacity == g.capacity
                    && r.workload.sha256 == g.workload.sha256
                    && r.workload.origin == g.workload.origin
            });
            if let Some(r) = row {
                out.write(&ResultRecord::GpuReplay(Box::new(r.clone())))?;
            }
            if best.conf.is_empty() {
                break;
            }
        }
    }
    Ok(())
}
