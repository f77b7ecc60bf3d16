//! The command line: one module per command, each parsing its flags, calling the library and
//! writing through the one shared output path ([`output`]). Progress bars ([`progress`]) and
//! Ctrl-C belong here, never to the library.
//!
//! | module | command |
//! |---|---|
//! | [`demo`] | `allocbench` / `allocbench demo` |
//! | [`trace`] | `allocbench trace` |
//! | [`replay`] | `allocbench replay` |
//! | [`run`] | `allocbench run` (the comparison table) |
//! | [`cpu`] | `allocbench cpu`, `allocbench malloc-info` |
//! | [`report`] | `allocbench report` |
//! | [`devprobe`] | `allocbench devprobe` |
//! | [`fidelity`] | `allocbench fidelity` |
//! | [`diagnose`] | `allocbench diagnose` |
//! | [`advise`] | `allocbench advise` |

pub mod advise;
pub mod cpu;
pub mod demo;
pub mod devprobe;
pub mod diagnose;
pub mod fidelity;
pub mod output;
pub mod progress;
pub mod replay;
pub mod report;
pub mod run;
pub mod trace;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::error::InputError;
use crate::gpu::build::DeviceSpec;
use crate::gpu::replay::{OnOom, ReplayOptions};
use crate::input::Source;
use crate::results::Backend;
use crate::units::parse_bytes;

const ABOUT: &str = "Benchmarks CPU and GPU memory allocators on the allocation patterns of real ML jobs, and explains fragmentation.

Inputs are workload definitions (workloads/*.toml: transformer training, model switching, serving,
textbook scenarios) or event traces (CSV: op,id,bytes,stream). GPU replays run PyTorch's CUDA
caching-allocator policy on a simulated device, so no GPU is needed.

Run with no arguments for the demo: the embedded GPT-3 XL (1.3B) training workload replayed under
PyTorch's default allocator settings, expandable segments, a tuned max_split_size_mb, no caching,
and the ideal bound.";

#[derive(Parser, Debug)]
#[command(name = "allocbench", version, about = ABOUT, long_about = ABOUT)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the default job: the embedded 1.3B transformer workload under several GPU allocator configurations.
    Demo(demo::DemoArgs),
    /// Write a workload's (or trace's) events as a CSV trace.
    Trace(trace::TraceArgs),
    /// Replay a trace or workload through one GPU allocator and print what happened.
    Replay(replay::ReplayArgs),
    /// Replay a workload through every allocator x conf and print a comparison table.
    Run(run::RunArgs),
    /// Drive real CPU allocators (glibc, jemalloc, mimalloc; tcmalloc via --preload) with a workload.
    Cpu(cpu::CpuArgs),
    /// Print which malloc really serves this process (JSON), e.g. under LD_PRELOAD.
    MallocInfo,
    /// Render SVG charts and an index (README.md, index.html) from results files.
    Report(report::ReportArgs),
    /// Measure cuMemAlloc/cuMemFree latency by size (512 B ... 8 GiB) and a warm cuMemAllocAsync pool on a real GPU.
    Devprobe(devprobe::DevprobeArgs),
    /// Compare the simulator's memory_stats() with PyTorch's on the same trace (from scripts/torch_replay.py).
    Fidelity(fidelity::FidelityArgs),
    /// Explain an OOM (or the headroom): fragmentation or exhaustion, what pins free memory, the smallest device that fits.
    Diagnose(diagnose::DiagnoseArgs),
    /// Search PYTORCH_CUDA_ALLOC_CONF settings for the one that minimises peak reserved memory without an OOM.
    Advise(advise::AdviseArgs),
}

#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Device memory, e.g. 80GiB, 24GB, 81559MiB (default: an H100 80 GB card, 81,559 MiB).
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// What to do at an out-of-memory: stop the replay, or skip the allocation and continue.
    #[arg(long, value_enum, default_value = "stop")]
    pub on_oom: OnOom,
    /// Also sample the memory timeline every N events (it is always sampled at every step).
    #[arg(long)]
    pub sample_every: Option<u64>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Where device memory comes from: the simulated device, or a real GPU (CUDA driver).
    #[arg(long, value_enum, default_value = "sim")]
    pub device: Backend,
    /// Account simulated device time with latencies measured by `allocbench devprobe` (its results file).
    #[arg(long)]
    pub sim_latency: Option<PathBuf>,
}

impl DeviceArgs {
    /// The device these flags name (`--sim-latency` read now).
    pub fn spec(&self) -> anyhow::Result<DeviceSpec> {
        let latency = self.sim_latency.as_deref().map(crate::gpu::devprobe::LatencyModel::load).transpose()?;
        Ok(DeviceSpec { backend: self.device, capacity: self.capacity, addresses: Vec::new(), latency })
    }

    pub fn replay_options(&self) -> ReplayOptions {
        ReplayOptions { on_oom: self.on_oom, sample_every_events: self.sample_every, ..Default::default() }
    }
}

pub fn parse_capacity(s: &str) -> Result<u64, String> {
    let b = parse_bytes(s)?;
    if b == 0 {
        return Err("capacity must be > 0".into());
    }
    if b > crate::units::MAX_SANE_BYTES {
        return Err("capacity over 1 PiB is not a device".into());
    }
    Ok(b)
}

/// Runs the CLI and returns the process exit code: 0, 2 for bad input, 1 for other failures.
pub fn main_with(cli: Cli) -> i32 {
    // Ctrl-C stops a run, which still writes what it measured (once; later calls are no-ops).
    let _ = ctrlc::set_handler(crate::interrupt::request);
    let result = match cli.command.unwrap_or(Command::Demo(demo::DemoArgs { jsonl: PathBuf::from("results/demo.jsonl") })) {
        Command::Demo(a) => demo::main(&a),
        Command::Trace(a) => trace::main(&a),
        Command::Replay(a) => replay::main(&a),
        Command::Run(a) => run::main(&a),
        Command::Cpu(a) => cpu::main(&a),
        Command::MallocInfo => cpu::malloc_info(),
        Command::Report(a) => report::main(&a),
        Command::Devprobe(a) => devprobe::main(&a),
        Command::Fidelity(a) => fidelity::main(&a),
        Command::Diagnose(a) => diagnose::main(&a),
        Command::Advise(a) => advise::main(&a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            if e.downcast_ref::<InputError>().is_some() {
                2
            } else {
                1
            }
        }
    }
}

/// Says what an imported trace left out (on standard error).
pub fn print_notes(source: &Source) {
    if let Source::Imported(t, p) = source {
        for n in &t.notes {
            eprintln!("note: {}: {n}", p.display());
        }
    }
}
