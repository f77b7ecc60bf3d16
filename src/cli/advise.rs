//! `allocbench advise`: the `PYTORCH_CUDA_ALLOC_CONF` that minimises peak reserved memory.

use std::path::PathBuf;

use clap::Args;

use super::args::{parse_capacity, print_notes};
use super::output::{self, Jsonl};
use super::progress;
use crate::input::Source;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct AdviseArgs {
    /// A trace (.csv), RMM log (.csv), PyTorch snapshot (.pickle) or workload (.toml).
    pub input: PathBuf,
    /// Device memory (default: an H100 80 GB card, 81,559 MiB).
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
