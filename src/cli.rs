//! Command-line parsing (clap) and dispatch. Logic lives in the library modules.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::error::InputError;
use crate::gpu::config::AllocatorConfig;
use crate::gpu::replay::OnOom;
use crate::gpu_run::{self, build_allocator, Backend, GPU_ALLOCATORS};
use crate::input::Source;
use crate::results::{write_jsonl, ResultRecord};
use crate::trace::TraceWriter;
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
    Demo(DemoArgs),
    /// Write a workload's (or trace's) events as a CSV trace.
    Trace(TraceArgs),
    /// Replay a trace or workload through one GPU allocator and print what happened.
    Replay(ReplayArgs),
    /// Replay a workload through every allocator x conf and print a comparison table.
    Run(RunArgs),
    /// Drive real CPU allocators (glibc, jemalloc, mimalloc; tcmalloc via --preload) with a workload.
    Cpu(CpuArgs),
    /// Print which malloc really serves this process (JSON), e.g. under LD_PRELOAD.
    MallocInfo,
    /// Render SVG charts and an index (README.md, index.html) from results files.
    Report(ReportArgs),
    /// Measure cuMemAlloc/cuMemFree latency by size (512 B ... 8 GiB) and a warm cuMemAllocAsync pool on a real GPU.
    Devprobe(DevprobeArgs),
    /// Compare the simulator's memory_stats() with PyTorch's on the same trace (from scripts/torch_replay.py).
    Fidelity(FidelityArgs),
    /// Explain an OOM (or the headroom): fragmentation or exhaustion, what pins free memory, the smallest device that fits.
    Diagnose(DiagnoseArgs),
    /// Search PYTORCH_CUDA_ALLOC_CONF settings for the one that minimises peak reserved memory without an OOM.
    Advise(AdviseArgs),
}

#[derive(Args, Debug)]
pub struct DiagnoseArgs {
    /// A trace (.csv), RMM log (.csv), PyTorch snapshot (.pickle) or workload (.toml).
    pub input: PathBuf,
    /// Device memory (default: an H100 80 GB card, 81,559 MiB).
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// PYTORCH_CUDA_ALLOC_CONF string (default: the environment variable, else PyTorch's defaults).
    #[arg(long)]
    pub conf: Option<String>,
    /// Write the diagnosis as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
    /// Also write the replay's results (JSON Lines) for `allocbench report`.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
}

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

#[derive(Args, Debug)]
pub struct DevprobeArgs {
    /// Timings per size (fewer for sizes of 1 GiB and more).
    #[arg(long, default_value_t = 50)]
    pub reps: usize,
    /// Write the results as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
}

#[derive(Args, Debug)]
pub struct FidelityArgs {
    /// The trace (.csv) that torch_replay.py replayed.
    pub trace: PathBuf,
    /// torch_replay.py's JSON output.
    #[arg(long)]
    pub torch_json: PathBuf,
    /// Override the conf (default: the one PyTorch ran with).
    #[arg(long)]
    pub conf: Option<String>,
    /// Write the comparison as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Results files (JSON or JSON Lines) written by replay, run, demo or cpu.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Output folder, e.g. reports/NAME/.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Title of the report.
    #[arg(long, default_value = "allocbench report")]
    pub title: String,
}

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

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where to write the results (JSON Lines).
    #[arg(long, default_value = "results/demo.jsonl")]
    pub jsonl: PathBuf,
}

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A workload (.toml) or trace (.csv).
    pub input: PathBuf,
    /// Output CSV file ('-' = standard output).
    #[arg(short, long, default_value = "-")]
    pub output: String,
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
    fn latency_model(&self) -> anyhow::Result<Option<crate::gpu::devprobe::LatencyModel>> {
        self.sim_latency.as_deref().map(crate::gpu::devprobe::LatencyModel::load).transpose()
    }
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A trace (.csv) or workload (.toml).
    pub input: PathBuf,
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
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A trace (.csv) or workload (.toml); default: the embedded 1.3B transformer workload.
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

fn parse_capacity(s: &str) -> Result<u64, String> {
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
    crate::interrupt::install();
    let result = match cli.command.unwrap_or(Command::Demo(DemoArgs { jsonl: PathBuf::from("results/demo.jsonl") })) {
        Command::Demo(a) => demo(&a),
        Command::Trace(a) => trace(&a),
        Command::Replay(a) => replay(&a),
        Command::Run(a) => run(&a),
        Command::Cpu(a) => cpu(&a),
        Command::MallocInfo => malloc_info(),
        Command::Report(a) => report(&a),
        Command::Devprobe(a) => devprobe(&a),
        Command::Fidelity(a) => fidelity(&a),
        Command::Diagnose(a) => diagnose(&a),
        Command::Advise(a) => advise(&a),
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

fn progress(quiet: bool, label: &str) -> Option<indicatif::ProgressBar> {
    if quiet {
        return None;
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} events ({per_sec}) {elapsed}").expect("valid template"));
    pb.set_message(label.to_string());
    Some(pb)
}

fn open_output(path: &str) -> anyhow::Result<Box<dyn Write>> {
    if path == "-" {
        return Ok(Box::new(std::io::BufWriter::new(std::io::stdout().lock())));
    }
    if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| InputError::new(path, format!("cannot create folder: {e}")))?;
    }
    let f = std::fs::File::create(path).map_err(|e| InputError::new(path, format!("cannot create: {e}")))?;
    Ok(Box::new(std::io::BufWriter::new(f)))
}

fn trace(a: &TraceArgs) -> anyhow::Result<()> {
    let source = Source::open(Some(&a.input))?;
    let info = source.info()?;
    let comments = vec![
        "allocbench trace v1".to_string(),
        format!("source: {} ({}), sha256 {}", info.origin, info.kind, info.sha256),
        format!("workload: {}{}", info.name, if info.description.is_empty() { String::new() } else { format!(" - {}", info.description) }),
    ];
    let mut w = TraceWriter::new(open_output(&a.output)?, &comments)?;
    let mut n = 0u64;
    for ev in source.events()? {
        w.write(&ev?)?;
        n += 1;
    }
    w.finish()?;
    if a.output != "-" {
        eprintln!("wrote {n} events to {}", a.output);
    }
    Ok(())
}

fn replay(a: &ReplayArgs) -> anyhow::Result<()> {
    let source = Source::open(Some(&a.input))?;
    print_notes(&source);
    let conf = AllocatorConfig::from_arg(a.conf.as_deref())?;
    let latency = a.device.latency_model()?;
    let (mut alloc, backend, capacity) = build_allocator(&a.allocator, &conf, a.device.device, a.device.capacity, latency.as_ref(), source.address_script())?;
    let pb = progress(a.device.quiet || a.json.as_deref() == Some("-"), &format!("replaying through {}", a.allocator));
    let opts = gpu_run::replay_options(a.device.on_oom, a.device.sample_every, pb.clone());
    let result = gpu_run::run_one(source.events()?, source.info()?, alloc.as_mut(), &conf, capacity, &opts, backend)?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    match a.json.as_deref() {
        Some("-") => {
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &ResultRecord::GpuReplay(Box::new(result)))?;
            writeln!(out)?;
        }
        Some(path) => {
            let mut out = open_output(path)?;
            serde_json::to_writer_pretty(&mut out, &ResultRecord::GpuReplay(Box::new(result.clone())))?;
            writeln!(out)?;
            out.flush()?;
            print!("{}", gpu_run::describe(&result));
            print_histogram(&result.size_histogram);
            eprintln!("results written to {path}");
        }
        None => {
            print!("{}", gpu_run::describe(&result));
            print_histogram(&result.size_histogram);
        }
    }
    Ok(())
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

fn run(a: &RunArgs) -> anyhow::Result<()> {
    let source = Source::open(a.input.as_deref())?;
    run_comparison(&source, &a.allocators, &a.confs, &a.device, a.jsonl.as_deref())
}

/// Replays `source` under each allocator (and each conf for pytorch), writing each result as it
/// finishes, then prints the comparison table.
fn run_comparison(source: &Source, allocators: &[String], confs: &[String], dev: &DeviceArgs, jsonl: Option<&Path>) -> anyhow::Result<()> {
    let latency = dev.latency_model()?;
    let confs: Vec<AllocatorConfig> =
        if confs.is_empty() { vec![AllocatorConfig::from_env()?] } else { confs.iter().map(|c| AllocatorConfig::parse(c)).collect::<Result<_, _>>()? };
    for name in allocators {
        if !GPU_ALLOCATORS.iter().any(|(n, _)| n == name) {
            return Err(gpu_run::unknown_allocator(name).into());
        }
    }
    let mut out = match jsonl {
        Some(p) => Some(open_output(&p.display().to_string())?),
        None => None,
    };
    // Hashing a large trace takes a pass over it: once, for every row.
    let info = source.info()?;
    let mut rows = Vec::new();
    for name in allocators {
        let confs_for: Vec<&AllocatorConfig> = if name == "pytorch" { confs.iter().collect() } else { vec![&confs[0]] };
        for conf in confs_for {
            let (mut alloc, backend, capacity) = build_allocator(name, conf, dev.device, dev.capacity, latency.as_ref(), source.address_script())?;
            let label = format!("{name} {}", if name == "pytorch" { conf.to_string() } else { String::new() });
            let pb = progress(dev.quiet, &label);
            let opts = gpu_run::replay_options(dev.on_oom, dev.sample_every, pb.clone());
            let r = gpu_run::run_one(source.events()?, info.clone(), alloc.as_mut(), conf, capacity, &opts, backend)?;
            if let Some(pb) = pb {
                pb.finish_and_clear();
            }
            if let Some(o) = out.as_mut() {
                write_jsonl(o.as_mut(), &ResultRecord::GpuReplay(Box::new(r.clone())))?;
            }
            let interrupted = r.summary.interrupted;
            rows.push(r);
            if interrupted {
                break;
            }
        }
    }
    println!(
        "{} ({}), {} events, {}",
        info.name,
        info.kind,
        rows.first().map(|r| r.work.events).unwrap_or(0),
        rows.first().map(|r| r.device.clone()).unwrap_or_default()
    );
    print!("{}", gpu_run::comparison_table(&rows));
    if let Some(p) = jsonl {
        eprintln!("results written to {}", p.display());
    }
    Ok(())
}

fn demo(a: &DemoArgs) -> anyhow::Result<()> {
    let source = Source::open(None)?;
    let confs = vec![
        String::new(),
        "expandable_segments:True".to_string(),
        "max_split_size_mb:512,roundup_power2_divisions:[256:1,512:2,>:4]".to_string(),
        "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95".to_string(),
    ];
    println!("allocbench demo: {} (embedded default workload)\n", Source::open(None)?.info()?.description);
    let dev = DeviceArgs { capacity: None, on_oom: OnOom::Stop, sample_every: None, quiet: false, device: Backend::Sim, sim_latency: None };
    run_comparison(&source, &["pytorch".into(), "nocache".into(), "ideal".into()], &confs, &dev, Some(&a.jsonl))?;
    println!("\nNext: `allocbench replay workloads/<name>.toml --conf ...` for one run in detail, `allocbench --help` for the rest.");
    Ok(())
}

fn malloc_info() -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&crate::cpu::preload::live_malloc())?);
    Ok(())
}

const PRELOAD_CHILD_ENV: &str = "ALLOCBENCH_PRELOAD_CHILD";

fn cpu(a: &CpuArgs) -> anyhow::Result<()> {
    use crate::cpu::{allocators::CpuAllocator, driver::DriverOptions, preload, CpuRunOptions};
    // --preload re-runs this command with LD_PRELOAD set, so the allocator serves every malloc.
    if let Some(spec) = &a.preload {
        if std::env::var_os(PRELOAD_CHILD_ENV).is_none() {
            let lib = preload::resolve_preload(spec)?;
            let exe = std::env::current_exe()?;
            let status = std::process::Command::new(exe).args(std::env::args_os().skip(1)).env("LD_PRELOAD", &lib).env(PRELOAD_CHILD_ENV, "1").status()?;
            std::process::exit(status.code().unwrap_or(1));
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
    let mut jsonl = match &a.jsonl {
        Some(p) => Some(open_output(&p.display().to_string())?),
        None => None,
    };
    let mut records = Vec::new();
    for al in allocs {
        let r = crate::cpu::run(&source, al, &opts)?;
        if a.json.as_deref() != Some("-") {
            print!("{}", crate::cpu::describe(&r));
        }
        let rec = ResultRecord::CpuRun(Box::new(r));
        if let Some(o) = jsonl.as_mut() {
            write_jsonl(o.as_mut(), &rec)?;
        }
        let interrupted = matches!(&rec, ResultRecord::CpuRun(r) if r.interrupted);
        records.push(rec);
        if interrupted {
            break;
        }
    }
    if let Some(path) = &a.json {
        let mut out = open_output(path)?;
        if records.len() == 1 {
            serde_json::to_writer_pretty(&mut out, &records[0])?;
            writeln!(out)?;
        } else {
            for r in &records {
                write_jsonl(out.as_mut(), r)?;
            }
        }
        out.flush()?;
    }
    Ok(())
}

fn report(a: &ReportArgs) -> anyhow::Result<()> {
    let records = crate::report::load(&a.results)?;
    let charts = crate::report::render(&records, &a.output, &a.title)?;
    println!("wrote {} charts, README.md and index.html to {}", charts.len(), a.output.display());
    Ok(())
}

fn devprobe(a: &DevprobeArgs) -> anyhow::Result<()> {
    let device = crate::gpu::cuda::CudaDevice::open(0)?;
    eprintln!("probing {} ...", crate::gpu::device::Device::describe(&device));
    let r = crate::gpu::cuda::devprobe(device, a.reps.max(3)).map_err(|e| anyhow::anyhow!("devprobe failed: {e}"))?;
    println!("{:>10} {:>12} {:>12} {:>12} {:>12} {:>14}", "size", "malloc p50", "malloc p99", "free p50", "free p99", "async pool p50");
    for (i, m) in r.malloc.iter().enumerate() {
        let f = &r.free[i];
        let p = r.async_pool_alloc_free.get(i).map(|s| s.p50_ns).unwrap_or(0);
        println!(
            "{:>10} {:>10.1}us {:>10.1}us {:>10.1}us {:>10.1}us {:>12.2}us",
            crate::units::format_bytes(m.bytes),
            m.p50_ns as f64 / 1e3,
            m.p99_ns as f64 / 1e3,
            f.p50_ns as f64 / 1e3,
            f.p99_ns as f64 / 1e3,
            p as f64 / 1e3
        );
    }
    if let Some(path) = &a.json {
        let mut out = open_output(path)?;
        serde_json::to_writer_pretty(&mut out, &ResultRecord::Devprobe(Box::new(r)))?;
        writeln!(out)?;
        out.flush()?;
    }
    Ok(())
}

fn fidelity(a: &FidelityArgs) -> anyhow::Result<()> {
    use crate::gpu::fidelity;
    let torch = fidelity::load_torch(&a.torch_json)?;
    let r = fidelity::check(&a.trace, &torch, a.conf.as_deref())?;
    println!(
        "fidelity of {} against PyTorch {} on {} [conf: {}]: {} snapshots x {} keys compared, {} mismatches",
        a.trace.display(),
        r.torch_version,
        r.device,
        if r.conf.is_empty() { "default" } else { &r.conf },
        r.snapshots_compared,
        r.keys_compared,
        r.mismatches.len()
    );
    for m in &r.mismatches {
        println!("  {:<10} {:<40} sim {:>16}  torch {:>16}", m.at, m.key, m.sim, m.torch);
    }
    println!("target keys ({}) at the end: {}", fidelity::TARGET_KEYS.join(", "), if r.target_identical { "identical" } else { "DIFFERENT" });
    if let Some(path) = &a.json {
        let mut out = open_output(path)?;
        serde_json::to_writer_pretty(&mut out, &r)?;
        writeln!(out)?;
        out.flush()?;
    }
    if !r.target_identical {
        anyhow::bail!("the simulator disagrees with PyTorch on a target key");
    }
    Ok(())
}

fn print_notes(source: &Source) {
    if let Source::Imported(t, p) = source {
        for n in &t.notes {
            eprintln!("note: {}: {n}", p.display());
        }
    }
}

fn diagnose(a: &DiagnoseArgs) -> anyhow::Result<()> {
    let source = Source::open(Some(&a.input))?;
    print_notes(&source);
    let conf = AllocatorConfig::from_arg(a.conf.as_deref())?;
    let capacity = a.capacity.unwrap_or(crate::gpu::device::H100_CAPACITY_BYTES);
    let (d, run) = crate::diagnose::diagnose(&source, &conf, capacity)?;
    if a.json.as_deref() != Some("-") {
        print!("{}", crate::diagnose::describe(&d));
    }
    if let Some(path) = &a.json {
        let mut out = open_output(path)?;
        serde_json::to_writer_pretty(&mut out, &ResultRecord::Diagnose(Box::new(d.clone())))?;
        writeln!(out)?;
        out.flush()?;
    }
    if let Some(p) = &a.jsonl {
        let mut out = open_output(&p.display().to_string())?;
        write_jsonl(out.as_mut(), &ResultRecord::GpuReplay(Box::new(run)))?;
        write_jsonl(out.as_mut(), &ResultRecord::Diagnose(Box::new(d)))?;
    }
    Ok(())
}

fn advise(a: &AdviseArgs) -> anyhow::Result<()> {
    let source = Source::open(Some(&a.input))?;
    print_notes(&source);
    let capacity = a.capacity.unwrap_or(crate::gpu::device::H100_CAPACITY_BYTES);
    let events = crate::diagnose::load_events(&source)?;
    let confs = crate::diagnose::search_space();
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let pb = (!a.quiet).then(|| {
        let pb = indicatif::ProgressBar::new(confs.len() as u64);
        pb.set_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} configurations ({per_sec}, eta {eta})").expect("valid template"));
        pb
    });
    let start = std::time::Instant::now();
    let ranked = crate::diagnose::advise(&events, capacity, &confs, threads, pb.as_ref())?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let default = ranked.iter().find(|c| c.conf.is_empty());
    let info = source.info()?;
    println!(
        "{} ({}): {} configurations replayed on a {} device in {:.1} s ({} threads)",
        info.name,
        info.kind,
        ranked.len(),
        crate::units::format_bytes(capacity),
        elapsed,
        threads
    );
    let row = |c: &crate::results::Candidate| {
        format!(
            "{:>12} {:>9.3} {:>8} {:>7} {:>10}",
            crate::units::format_bytes(c.peak_reserved),
            c.overhead,
            c.device_mallocs,
            c.retries,
            c.oom_step.map(|s| format!("step {s}")).unwrap_or_else(|| "-".into())
        )
    };
    println!("{:<4} {:>12} {:>9} {:>8} {:>7} {:>10}  conf", "rank", "peak rsvd", "rsvd/live", "mallocs", "retries", "OOM");
    if let Some(d) = default {
        println!("{:<4} {}  (PyTorch defaults)", "base", row(d));
    }
    for (i, c) in ranked.iter().take(a.top).enumerate() {
        println!("{:<4} {}  {}", i + 1, row(c), if c.conf.is_empty() { "(defaults)" } else { &c.conf });
    }
    if let Some(best) = ranked.first() {
        if best.oom_step.is_some() {
            println!("\nNo configuration avoids the OOM on this device; the least bad one is first.");
        }
        println!("\nexport PYTORCH_CUDA_ALLOC_CONF={}", if best.conf.is_empty() { "''".to_string() } else { format!("'{}'", best.conf) });
    }
    if let Some(path) = &a.json {
        let mut out = open_output(path)?;
        serde_json::to_writer_pretty(&mut out, &ranked)?;
        writeln!(out)?;
        out.flush()?;
    }
    if let (Some(p), Some(best)) = (&a.jsonl, ranked.first()) {
        let mut out = open_output(&p.display().to_string())?;
        for conf in ["", best.conf.as_str()] {
            let cfg = AllocatorConfig::parse(conf)?;
            let mut alloc = crate::gpu::caching::CachingAllocator::new(cfg.clone(), crate::gpu::device::SimDevice::new(capacity));
            let opts = gpu_run::replay_options(OnOom::Stop, None, None);
            let r = gpu_run::run_one(Box::new(events.iter().copied().map(Ok)), info.clone(), &mut alloc, &cfg, capacity, &opts, Backend::Sim)?;
            write_jsonl(out.as_mut(), &ResultRecord::GpuReplay(Box::new(r)))?;
            if best.conf.is_empty() {
                break;
            }
        }
    }
    Ok(())
}
