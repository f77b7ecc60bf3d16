//! The command line: one module per command, each parsing its flags, calling the library and
//! writing through the one shared output path ([`output`]). Progress bars ([`progress`]) and
//! Ctrl-C belong here, never to the library; flags several commands share are in [`args`].
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
//! | [`oracle`] | `allocbench oracle` |
//! | [`diagnose`] | `allocbench diagnose` |
//! | [`advise`] | `allocbench advise` |
//! | [`capture`] | `allocbench capture` |
//! | [`fit`] | `allocbench fit` |
//! | (here) | `allocbench cards` |
//! | [`sweep`] | `allocbench sweep plan\|run\|merge` |

pub mod advise;
pub mod args;
pub mod capture;
pub mod cpu;
pub mod demo;
pub mod devprobe;
pub mod diagnose;
pub mod fidelity;
pub mod fit;
pub mod oracle;
pub mod output;
pub mod progress;
pub mod replay;
pub mod report;
pub mod run;
pub mod sweep;
pub mod trace;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::error::InputError;

const ABOUT: &str = "Benchmarks CPU and GPU memory allocators on the allocation patterns of real ML jobs, and explains fragmentation.

Inputs are workload definitions (workloads/*.toml: transformer training, model switching, serving,
textbook scenarios) or event traces (CSV: op,id,bytes,stream). GPU replays run PyTorch's CUDA
caching-allocator policy on a simulated device, so no GPU is needed.

Run with no arguments for the demo: the embedded GPT-3 XL (1.3B) training trace, captured from real
PyTorch (autograd, CUDA autocast, AdamW) on variable sequence lengths, replayed under
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
    /// Run the default job: the embedded 1.3B training trace (captured from PyTorch) under several GPU allocator configurations.
    Demo(demo::DemoArgs),
    /// Write a workload's (or trace's) events as a CSV trace.
    Trace(trace::TraceArgs),
    /// Replay a trace or workload through one GPU allocator and print what happened.
    Replay(replay::ReplayArgs),
    /// Replay a workload through every allocator x conf and print a comparison table.
    Run(run::RunArgs),
    /// Drive real CPU allocators (glibc, jemalloc, mimalloc; tcmalloc via --preload) with a
    /// workload, run a program under each (--exec), record one (--record) and replay the recording;
    /// `cpu advise` ranks allocators and settings for it.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Cpu(cpu::CpuArgs),
    /// Print which malloc really serves this process (JSON), e.g. under LD_PRELOAD.
    MallocInfo,
    /// Render SVG charts and an index (README.md, index.html) from results files.
    Report(report::ReportArgs),
    /// Measure cuMemAlloc/cuMemFree latency by size (512 B ... 8 GiB) and a warm cuMemAllocAsync pool on a real GPU.
    Devprobe(devprobe::DevprobeArgs),
    /// Compare the simulator's memory_stats() with PyTorch's on the same trace (from scripts/torch_replay.py).
    Fidelity(fidelity::FidelityArgs),
    /// Run a trace through PyTorch's own caching allocator (libc10_cuda of a local torch) on a fake CUDA runtime: no GPU needed.
    Oracle(oracle::OracleArgs),
    /// Explain an OOM (or the headroom): fragmentation or exhaustion, what pins free memory, the smallest device that fits.
    Diagnose(diagnose::DiagnoseArgs),
    /// Search PYTORCH_CUDA_ALLOC_CONF settings for the one that minimises peak reserved memory without an OOM.
    Advise(advise::AdviseArgs),
    /// Run an unmodified PyTorch script and write its CUDA allocation trace (fake CUDA tensors: no GPU needed).
    Capture(capture::CaptureArgs),
    /// The largest value of a script argument (batch size, sequence length) whose run fits a card, with PyTorch's defaults and the advised conf.
    Fit(fit::FitArgs),
    /// List the cards --card knows: their memory as torch reports it, and where each figure was read.
    Cards(CardsArgs),
    /// Sweep inputs x confs x capacities sharded over a Slurm job array or a Kubernetes Indexed Job: plan, run a shard, merge.
    Sweep(sweep::SweepArgs),
}

#[derive(clap::Args, Debug)]
pub struct CardsArgs {
    /// As a Markdown table (docs/cards.md embeds it).
    #[arg(long)]
    pub markdown: bool,
}

fn cards(a: &CardsArgs) -> anyhow::Result<()> {
    use crate::gpu::card::DEFAULT_CARD;
    if a.markdown {
        print!("{}", crate::gpu::card::markdown_table());
        return Ok(());
    }
    println!("{:<16} {:<24} {:>16} {:>9}  source", "--card", "torch's name", "total_memory", "GiB");
    for c in crate::gpu::card::by_size() {
        let default = if c.name == DEFAULT_CARD { " (default)" } else { "" };
        println!("{:<16} {:<24} {:>16} {:>9.1}  {}{default}", c.name, c.torch_name, c.total_memory, c.total_memory as f64 / (1u64 << 30) as f64, c.source);
    }
    println!(
        "\nOutside the allocator, counted by diagnose, advise and fit: {} by default (--cuda-context, --nccl; docs/cards.md).",
        crate::gpu::card::Outside::default().describe()
    );
    Ok(())
}

/// The command line, parsed; a usage error is said in one line (exit 2), as every other error is.
/// Help and version are printed as clap prints them.
pub fn parse_or_exit() -> Cli {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) => e.exit(),
        Err(e) => {
            eprintln!("{}", one_line_usage_error(&e.render().to_string()));
            std::process::exit(e.exit_code());
        }
    }
}

/// clap's several-line usage error as one line: its message, tips and usage joined, without the
/// "For more information" line (the line says `see --help` instead).
pub fn one_line_usage_error(rendered: &str) -> String {
    let parts: Vec<String> = rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .map(|l| match l.strip_prefix("Usage:") {
            Some(usage) => format!("usage:{usage}"),
            None => l.to_string(),
        })
        .collect();
    let mut line = String::new();
    for (i, part) in parts.iter().enumerate() {
        // A message ending in ':' continues on the next line (the missing arguments' names).
        let sep = if i == 0 {
            ""
        } else if line.ends_with(':') {
            " "
        } else {
            "; "
        };
        line.push_str(sep);
        line.push_str(part);
    }
    line.push_str(" (see --help)");
    line
}

/// Runs the CLI and returns the process exit code: 0, 2 for bad input, 1 for other failures.
pub fn main_with(cli: Cli) -> i32 {
    // Ctrl-C stops a run, which still writes what it measured (once; later calls are no-ops).
    let _ = ctrlc::set_handler(crate::interrupt::request);
    let command = cli.command.unwrap_or(Command::Demo(demo::DemoArgs { jsonl: PathBuf::from("results/demo.jsonl") }));
    let torch = match &command {
        Command::Replay(a) => Some(&a.torch),
        Command::Run(a) => Some(&a.torch),
        Command::Diagnose(a) => Some(&a.torch),
        Command::Advise(a) => Some(&a.torch),
        Command::Sweep(sweep::SweepArgs { command: sweep::SweepCommand::Plan(a) }) => Some(&a.torch),
        _ => None,
    };
    if let Some(Err(e)) = torch.map(|t| t.select()) {
        eprintln!("error: {e}");
        return 2;
    }
    let result = match command {
        Command::Demo(a) => demo::main(&a),
        Command::Trace(a) => trace::main(&a),
        Command::Replay(a) => replay::main(&a),
        Command::Run(a) => run::main(&a),
        Command::Cpu(a) => cpu::main(&a),
        Command::MallocInfo => cpu::malloc_info(),
        Command::Report(a) => report::main(&a),
        Command::Devprobe(a) => devprobe::main(&a),
        Command::Fidelity(a) => fidelity::main(&a),
        Command::Oracle(a) => oracle::main(&a),
        Command::Diagnose(a) => diagnose::main(&a),
        Command::Advise(a) => advise::main(&a),
        Command::Capture(a) => return capture::main(a),
        Command::Fit(a) => fit::main(a),
        Command::Cards(a) => cards(&a),
        Command::Sweep(a) => sweep::main(&a),
    };
    match result {
        Ok(()) => 0,
        Err(e) if e.downcast_ref::<crate::interrupt::Interrupted>().is_some() => {
            eprintln!("interrupted: {e:#}");
            130
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_fit_on_one_line() {
        for args in [
            &["allocbench", "replay"][..],
            &["allocbench", "replay", "x.csv", "--capacity", "12Q"],
            &["allocbench", "replai"],
            &["allocbench", "advise", "x", "--objective", "fast"],
        ] {
            let rendered = Cli::try_parse_from(args).unwrap_err().render().to_string();
            let line = one_line_usage_error(&rendered);
            assert!(!line.contains('\n'), "{args:?}: {line}");
            assert!(line.starts_with("error: ") && line.ends_with("(see --help)"), "{args:?}: {line}");
            // Nothing clap said is lost but the pointer to --help.
            let first = rendered.lines().next().unwrap();
            assert!(line.contains(first), "{args:?}: {line}");
        }
        let missing = one_line_usage_error(&Cli::try_parse_from(["allocbench", "replay"]).unwrap_err().render().to_string());
        assert_eq!(missing, "error: the following required arguments were not provided: <INPUT>; usage: allocbench replay <INPUT> (see --help)");
    }
}
