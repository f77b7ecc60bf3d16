//! `allocbench cpu` (real CPU allocators driven with a workload) and `allocbench malloc-info`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::output::{self, Jsonl};
use crate::input::Source;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct CpuArgs {
    /// A workload (.toml) or trace (.csv).
    pub input: PathBuf,
    /// system (the process's malloc: glibc, or what LD_PRELOAD put there), jemalloc, mimalloc, or all.
    #[arg(long, default_value = "all")]
    pub allocator: String,
    /// Worker threads, each replaying the workload.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Producer/consumer: each worker's frees are done by the next worker (larson-style).
    #[arg(long)]
    pub cross_thread: bool,
    /// Multiply every size by this (e.g. 1/256 to fit GPU-sized workloads in host memory).
    #[arg(long, default_value = "1", value_parser = parse_scale)]
    pub scale: f64,
    /// Run for this many seconds, repeating the workload.
    #[arg(long, conflicts_with = "iterations")]
    pub duration: Option<f64>,
    /// Run this many iterations (steps), repeating the workload.
    #[arg(long)]
    pub iterations: Option<u64>,
    /// RSS sampling period in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub sample_ms: u64,
    /// Do not write to the blocks: times the allocator alone (RSS then shows only what it maps).
    #[arg(long)]
    pub no_touch: bool,
    /// Run under LD_PRELOAD of this allocator (jemalloc, tcmalloc, mimalloc, or a .so path).
    #[arg(long)]
    pub preload: Option<String>,
    /// Refuse to run unless this allocator (glibc, jemalloc, tcmalloc, mimalloc) serves malloc.
    #[arg(long)]
    pub expect_malloc: Option<String>,
    /// Write results: one JSON document for one allocator, JSON Lines for several ('-' = stdout).
    #[arg(long)]
    pub json: Option<String>,
    /// Append each run's results to this JSON Lines file as it finishes.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
}

fn parse_scale(s: &str) -> Result<f64, String> {
    let v = match s.split_once('/') {
        Some((a, b)) => {
            let a: f64 = a.trim().parse().map_err(|_| format!("bad scale '{s}'"))?;
            let b: f64 = b.trim().parse().map_err(|_| format!("bad scale '{s}'"))?;
            a / b
        }
        None => s.trim().parse().map_err(|_| format!("bad scale '{s}': use a number such as 0.5 or a fraction such as 1/256"))?,
    };
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!("scale {s} must be in (0, 1]"));
    }
    Ok(v)
}

pub fn malloc_info() -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&crate::cpu::preload::live_malloc())?);
    Ok(())
}

pub fn main(a: &CpuArgs) -> anyhow::Result<()> {
    use crate::cpu::{allocators::CpuAllocator, driver::DriverOptions, preload, CpuRunOptions};
    // --preload re-runs this command with LD_PRELOAD set, so the allocator serves every malloc.
    if let Some(spec) = &a.preload {
        if let Some(code) = preload::rerun_preloaded(spec)? {
            std::process::exit(code);
        }
    }
    let expect = a
        .expect_malloc
        .clone()
        .or_else(|| a.preload.as_deref().and_then(|p| preload::resolve_preload(p).ok()).map(|p| preload::classify(&p.display().to_string())));
    let source = Source::open(Some(&a.input))?;
    let names: Vec<&str> =
        if a.allocator == "all" { crate::cpu::allocators::CPU_ALLOCATORS.iter().map(|(n, _)| *n).collect() } else { a.allocator.split(',').collect() };
    let allocs: Vec<CpuAllocator> = names.iter().map(|n| CpuAllocator::by_name(n)).collect::<Result<_, _>>()?;
    let live = preload::live_malloc();
    if let Some(e) = expect.as_deref() {
        // Under a preload, "system" must be the promised allocator.
        if allocs.iter().any(|al| al.name == "system") {
            crate::cpu::check_expected(Some(e), &live.name, &live)?;
        }
    }
    let opts = CpuRunOptions {
        driver: DriverOptions {
            threads: a.threads,
            cross_thread: a.cross_thread,
            scale: a.scale,
            iterations: a.iterations,
            duration: a.duration.map(std::time::Duration::from_secs_f64),
            touch: !a.no_touch,
        },
        sample_interval: std::time::Duration::from_millis(a.sample_ms.max(1)),
    };
    let mut jsonl = Jsonl::open(a.jsonl.as_deref())?;
    let mut records = Vec::new();
    for al in allocs {
        let r = crate::cpu::run(&source, al, &opts)?;
        if a.json.as_deref() != Some("-") {
            print!("{}", crate::cpu::describe(&r));
        }
        let rec = ResultRecord::CpuRun(Box::new(r));
        jsonl.write(&rec)?;
        let interrupted = matches!(&rec, ResultRecord::CpuRun(r) if r.interrupted);
        records.push(rec);
        if interrupted {
            break;
        }
    }
    if let Some(path) = &a.json {
        if records.len() == 1 {
            output::write_json(path, &records[0])?;
        } else {
            let mut out = Jsonl::open(Some(Path::new(path)))?;
            for r in &records {
                out.write(r)?;
            }
        }
    }
    Ok(())
}
