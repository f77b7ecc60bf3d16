//! `allocbench cpu` (real CPU allocators driven with a workload, or `--exec`: a real program under
//! each LD_PRELOAD allocator) and `allocbench malloc-info`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::output::{self, Jsonl};
use crate::input::Source;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct CpuArgs {
    #[command(subcommand)]
    pub sub: Option<CpuCommand>,
    /// A workload (.toml), trace (.csv) or recorded CPU trace (from --record); not with --exec.
    #[arg(required_unless_present_any = ["exec", "record"])]
    pub input: Option<PathBuf>,
    /// Record every malloc-family call of the program after `--` and of every process it starts
    /// (LD_PRELOAD recorder) into a trace (-o), with the tree's RSS over time.
    #[arg(long, requires_all = ["command", "output"], conflicts_with_all = ["input", "exec", "threads", "cross_thread", "scale", "duration", "iterations", "no_touch", "preload", "expect_malloc", "drain", "reps"])]
    pub record: bool,
    /// A config to run besides each allocator's defaults (repeatable), with a recorded trace or
    /// --exec: ALLOCATOR:key=value[,key=value...] — glibc tunables (glibc:arena_max=4), jemalloc
    /// MALLOC_CONF (jemalloc:narenas=4,dirty_decay_ms=0), tcmalloc and mimalloc options
    /// (tcmalloc:release_rate=10, mimalloc:purge_delay=0), or python:pythonmalloc=malloc (--exec).
    #[arg(long, conflicts_with = "record")]
    pub settings: Vec<String>,
    /// With a recorded trace or --exec: also run the usual settings `cpu advise` tries (glibc
    /// arena_max=2, …; docs/cpu.md).
    #[arg(long, conflicts_with = "record")]
    pub grid: bool,
    /// A recorded trace's pace: full (each thread's calls as fast as they go) or recorded (no call
    /// before its time in the recording, so time-based purging runs as in the program).
    #[arg(long, default_value = "full", value_parser = ["full", "recorded"])]
    pub pace: String,
    /// Where --record writes its trace.
    #[arg(short = 'o', long, requires = "record")]
    pub output: Option<PathBuf>,
    /// Run the program given after `--` under each allocator instead of a workload.
    #[arg(long, requires = "command", conflicts_with_all = ["input", "threads", "cross_thread", "scale", "duration", "iterations", "no_touch", "preload", "expect_malloc", "drain"])]
    pub exec: bool,
    /// In-process: system (the process's malloc: glibc, or what LD_PRELOAD put there), jemalloc,
    /// mimalloc, or all (each in its own child process). With --exec: glibc, jemalloc, tcmalloc,
    /// mimalloc (LD_PRELOAD; glibc = none), a path to a .so, or all.
    #[arg(long, default_value = "all")]
    pub allocator: String,
    /// Repetitions of every allocator, interleaved (a, b, c, a, b, c, …), each in its own process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Keep sampling RSS this many seconds after the last free (retained at 0.1 / 1 / 10 s),
    /// then trim.
    #[arg(long, default_value_t = 0.0, value_parser = parse_drain)]
    pub drain: f64,
    /// The program and its arguments, after `--` (with --exec).
    #[arg(last = true)]
    pub command: Vec<String>,
    /// Worker threads, each replaying the workload; with a recorded trace, copies of the recording
    /// replayed side by side (each with its own blocks and threads: N workers like the recorded
    /// one).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Producer/consumer: each worker's frees are done by the next worker (larson-style).
    #[arg(long)]
    pub cross_thread: bool,
    /// Multiply every size by this (e.g. 1/256 to fit GPU-sized workloads in host memory).
    #[arg(long, default_value = "1", value_parser = parse_scale)]
    pub scale: f64,
    /// Run for this many seconds, repeating the workload.
    #[arg(long, conflicts_with = "iterations", value_parser = parse_duration)]
    pub duration: Option<f64>,
    /// Run this many iterations (steps), repeating the workload.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// RSS sampling period in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub sample_ms: u64,
    /// Do not write to the blocks: times the allocator alone (RSS then shows only what it maps).
    #[arg(long)]
    pub no_touch: bool,
    /// Run under LD_PRELOAD of this allocator (jemalloc, tcmalloc, mimalloc, or a .so path).
    #[arg(long)]
    pub preload: Option<String>,
    /// Refuse to run unless this allocator (glibc, jemalloc, tcmalloc, mimalloc) serves malloc.
    #[arg(long, value_parser = ["glibc", "jemalloc", "tcmalloc", "mimalloc"])]
    pub expect_malloc: Option<String>,
    /// Write results: one JSON document for one allocator, JSON Lines for several ('-' = stdout).
    #[arg(long)]
    pub json: Option<String>,
    /// Append each run's results to this JSON Lines file as it finishes.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub enum CpuCommand {
    /// Rank allocators x settings for a recorded trace (replays) or a program (after `--`, runs)
    /// by steady RSS, peak and retained memory at a throughput cost, and print the line to use.
    Advise(Box<CpuAdviseArgs>),
}

#[derive(Args, Debug)]
pub struct CpuAdviseArgs {
    /// A recorded trace (allocbench cpu --record); or give the program after `--`.
    #[arg(required_unless_present = "command")]
    pub input: Option<PathBuf>,
    /// The allocators: glibc, jemalloc, tcmalloc, mimalloc (a list), a .so, or all (those installed).
    #[arg(long, default_value = "all")]
    pub allocator: String,
    /// More configs to try besides each allocator's defaults and the usual settings (repeatable;
    /// as `allocbench cpu --settings`).
    #[arg(long)]
    pub settings: Vec<String>,
    /// Only each allocator's defaults and --settings, not the usual settings.
    #[arg(long)]
    pub no_grid: bool,
    /// memory (least steady RSS), balanced (least steady RSS within 10 % of glibc's throughput),
    /// or time (most throughput).
    #[arg(long, default_value = "balanced", value_parser = crate::cpu::advise::OBJECTIVES)]
    pub objective: String,
    /// Repetitions of every config, interleaved; medians are compared.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Replays: seconds of drain after the last free before retained memory is read.
    #[arg(long, default_value_t = 1.0, value_parser = parse_drain)]
    pub drain: f64,
    /// Replays: at the recorded pace (what the program's RSS over time was; default), or full
    /// speed.
    #[arg(long, default_value = "recorded", value_parser = ["full", "recorded"])]
    pub pace: String,
    /// RSS sampling period in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub sample_ms: u64,
    /// Write the ranking as JSON ('-' = stdout).
    #[arg(long)]
    pub json: Option<String>,
    /// Append every run's record to this JSON Lines file as it finishes (and the ranking at the end).
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
    /// The program and its arguments, after `--` (instead of a recorded trace).
    #[arg(last = true)]
    pub command: Vec<String>,
}

fn parse_drain(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("bad drain '{s}': seconds between 0 and 3600, e.g. 12")),
    }
}

/// A run's length: positive and finite (a Duration cannot hold NaN, infinity or a negative).
fn parse_duration(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1e9 => Ok(v),
        _ => Err(format!("bad duration '{s}': seconds greater than 0, e.g. 30")),
    }
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

/// Set in a child that runs one allocator of a multi-allocator in-process run: the allocator's
/// name; the child appends its record to the file named by [`CHILD_RESULT_ENV`].
const CHILD_ALLOCATOR_ENV: &str = "ALLOCBENCH_CPU_CHILD_ALLOCATOR";
const CHILD_RESULT_ENV: &str = "ALLOCBENCH_CPU_CHILD_RESULT";
/// The settings a child runs with (`K=V` lines), for its record.
const CHILD_SETTINGS_ENV: &str = "ALLOCBENCH_CPU_CHILD_SETTINGS";

pub fn main(a: &CpuArgs) -> anyhow::Result<()> {
    // From here on the harness's own allocations come from its private arena, never from the
    // malloc under test.
    crate::cpu::harness_alloc::isolate();
    if let Some(CpuCommand::Advise(adv)) = &a.sub {
        return advise_main(adv);
    }
    output::check_outputs(&[a.json.as_deref().map(Path::new), a.jsonl.as_deref(), a.output.as_deref()], &[a.input.as_deref()])?;
    if a.record {
        return record_main(a);
    }
    if a.exec {
        return exec_main(a);
    }
    if let Some(input) = a.input.as_deref().filter(|p| crate::cpu::recorded::is_recorded_trace(p)) {
        return recorded_main(a, input);
    }
    if !a.settings.is_empty() || a.grid {
        return Err(crate::error::InputError::new(
            if a.grid { "--grid" } else { "--settings" },
            "applies to runs under LD_PRELOAD: a recorded trace (allocbench cpu --record) or --exec; in process, use --preload with the allocator's own environment",
        )
        .into());
    }
    if a.cross_thread && a.threads < 2 {
        // One worker frees what it allocated itself: nothing would cross a thread.
        return Err(crate::error::InputError::new("--cross-thread", "needs --threads 2 or more (each worker's frees go to the next worker)").into());
    }
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
    let source = Source::open(a.input.as_deref())?;
    let child_allocator = std::env::var(CHILD_ALLOCATOR_ENV).ok();
    let names: Vec<&str> = match &child_allocator {
        Some(one) => vec![one.as_str()],
        None if a.allocator == "all" => crate::cpu::allocators::CPU_ALLOCATORS.iter().map(|(n, _)| *n).collect(),
        None => a.allocator.split(',').collect(),
    };
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
        sample_interval: std::time::Duration::from_millis(a.sample_ms),
        drain: std::time::Duration::from_secs_f64(a.drain),
    };
    if let Some(result) = std::env::var_os(CHILD_RESULT_ENV).filter(|_| child_allocator.is_some()) {
        // A child of a multi-allocator run: one run, its record for the parent.
        let r = running(allocs[0].name, a.drain, || crate::cpu::run(&source, allocs[0], &opts))?;
        if a.json.as_deref() != Some("-") {
            print!("{}", crate::cpu::describe(&r));
        }
        return output::write_json(&result.to_string_lossy(), &ResultRecord::CpuRun(Box::new(r)));
    }
    let mut jsonl = Jsonl::append(a.jsonl.as_deref())?;
    let mut records = Vec::new();
    // Runs whose child died or failed: (why, its exit code).
    let mut failures: Vec<(String, i32)> = Vec::new();
    if allocs.len() == 1 && a.reps == 1 {
        let r = running(allocs[0].name, a.drain, || crate::cpu::run(&source, allocs[0], &opts))?;
        if a.json.as_deref() != Some("-") {
            print!("{}", crate::cpu::describe(&r));
        }
        let rec = ResultRecord::CpuRun(Box::new(r));
        jsonl.write(&rec)?;
        records.push(rec);
    } else {
        // Every allocator in its own process, repetitions interleaved: what one allocator keeps
        // mapped never shows in another's peak.
        'reps: for _ in 0..a.reps {
            for al in &allocs {
                let rec = match run_in_child(al.name)? {
                    Ok(rec) => rec,
                    Err(failure) => {
                        // Bad input (exit 2) fails every allocator alike; anything else (a crash,
                        // the OOM killer) is this allocator's, and the others still run.
                        let bad_input = failure.1 == 2;
                        if bad_input && records.is_empty() {
                            // The child's one line said what is wrong with the input; nothing ran.
                            drop(jsonl);
                            std::process::exit(2);
                        }
                        eprintln!("error: {}", failure.0);
                        failures.push(failure);
                        if bad_input || crate::interrupt::interrupted() {
                            break 'reps;
                        }
                        continue;
                    }
                };
                jsonl.write(&rec)?;
                let interrupted = matches!(&rec, ResultRecord::CpuRun(r) if r.interrupted);
                records.push(rec);
                if interrupted || crate::interrupt::interrupted() {
                    break 'reps;
                }
            }
        }
    }
    if records.len() > 1 {
        output::say(a.json.as_deref(), &drift_summary(&records));
    }
    // (Nothing finished: an existing --json file is left as it was.)
    if let Some(path) = a.json.as_ref().filter(|_| !records.is_empty()) {
        if records.len() == 1 && failures.is_empty() {
            output::write_json(path, &records[0])?;
        } else {
            let mut out = Jsonl::open(Some(Path::new(path)))?;
            for r in &records {
                out.write(r)?;
            }
        }
    }
    let stopped = records.iter().any(|r| matches!(r, ResultRecord::CpuRun(r) if r.interrupted));
    if stopped || crate::interrupt::interrupted() {
        // As `--exec` and compare.sh expect: the finished runs are written, the exit says stopped.
        let marked = if stopped { " (the stopped one marked \"interrupted\")" } else { "" };
        drop(jsonl);
        crate::interrupt::exit_interrupted(&format!("{} kept{marked}", crate::units::count(records.len() as u64, "run")));
    }
    if let Some((_, code)) = failures.first() {
        eprintln!("{} of the runs failed; the {} finished kept", failures.len(), records.len());
        drop(jsonl);
        std::process::exit(*code);
    }
    Ok(())
}

/// The runs of `--allocator` (installed ones; a skipped one is said), each with its defaults,
/// then the usual settings of those allocators when `grid` is set, then `--settings`; every
/// preloaded library checked once to load and serve malloc.
fn run_configs(allocator: &str, settings: &[String], grid: bool, program: Option<&[String]>) -> anyhow::Result<Vec<RunConfig>> {
    let (allocs, notes) = crate::cpu::exec::resolve_allocators(allocator)?;
    for n in &notes {
        eprintln!("{n}");
    }
    let mut specs: Vec<String> = if grid {
        crate::cpu::advise::GRID.iter().filter(|g| allocs.iter().any(|al| g.starts_with(&format!("{}:", al.name)))).map(|g| g.to_string()).collect()
    } else {
        Vec::new()
    };
    specs.extend(settings.iter().cloned());
    let configs = configs(&allocs, &specs, program)?;
    let probe = std::env::current_exe()?;
    let mut checked = Vec::new();
    for lib in configs.iter().filter_map(|(al, _)| al.library.as_ref()) {
        if !checked.contains(&lib) {
            crate::cpu::preload::check_serves_malloc(&probe, lib)?;
            checked.push(lib);
        }
    }
    Ok(configs)
}

/// An allocator and the environment its settings set.
type RunConfig = (crate::cpu::exec::ExecAllocator, Vec<(String, String)>);

/// Each allocator with its defaults, then each `--settings` config: (allocator, environment).
/// `python:` configs apply under every allocator and only to a program (`program`, with --exec),
/// whose interpreter is asked first whether it takes the value.
fn configs(allocs: &[crate::cpu::exec::ExecAllocator], specs: &[String], program: Option<&[String]>) -> Result<Vec<RunConfig>, crate::error::InputError> {
    use crate::cpu::{exec, settings};
    use crate::error::InputError;
    let mut out: Vec<_> = allocs.iter().map(|a| (a.clone(), Vec::new())).collect();
    let mut python = Vec::new();
    for spec in specs {
        let s = settings::parse(spec)?;
        if s.allocator == "python" {
            let Some(command) = program else {
                return Err(InputError::new(
                    "--settings",
                    "python:pythonmalloc=... is for a program run with --exec: a recorded trace's calls already went through the interpreter's allocator (record with PYTHONMALLOC set instead)",
                ));
            };
            let env = settings::environment(&s, None)?;
            let ok = std::process::Command::new(&command[0])
                .args(["-c", ""])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|st| st.success());
            if !ok {
                return Err(InputError::new(
                    "--settings",
                    format!("{} does not start with {} (PYTHONMALLOC=mimalloc needs CPython 3.13 or newer)", command[0], settings::describe(&env).join(" ")),
                ));
            }
            python.push(env);
            continue;
        }
        let al = match allocs.iter().find(|a| a.name == s.allocator) {
            Some(a) => a.clone(),
            None => exec::resolve_allocators(&s.allocator)?.0.remove(0),
        };
        let env = settings::environment(&s, al.library.as_deref())?;
        out.push((al, env));
    }
    let base = out.clone();
    for env in python {
        for (a, e) in &base {
            out.push((a.clone(), e.iter().chain(&env).cloned().collect()));
        }
    }
    Ok(out)
}

/// Re-runs this command for one allocator in a child process and reads back its record. Ctrl-C
/// (or SIGTERM) is passed on, and the child still writes what it measured. A child that failed gives why
/// (naming the allocator) and the exit code to pass on.
fn run_in_child(allocator: &str) -> anyhow::Result<Result<ResultRecord, (String, i32)>> {
    run_in_child_with(allocator, None, &[], std::env::args_os().skip(1).collect())
}

/// [`run_in_child`], the child started with `preload` in LD_PRELOAD (`Some(None)`: none at all;
/// `None`: this process's environment as it is).
/// `args` are the child's command line (this command's, for a run of it).
fn run_in_child_with(
    allocator: &str,
    preload: Option<Option<&Path>>,
    settings: &[(String, String)],
    args: Vec<std::ffi::OsString>,
) -> anyhow::Result<Result<ResultRecord, (String, i32)>> {
    let dir = tempfile::tempdir()?;
    let result = dir.path().join("run.json");
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(args).env(CHILD_ALLOCATOR_ENV, allocator).env(CHILD_RESULT_ENV, &result);
    cmd.envs(settings.iter().map(|(k, v)| (k, v)));
    cmd.env(CHILD_SETTINGS_ENV, crate::cpu::settings::describe(settings).join("\n"));
    match preload {
        Some(Some(lib)) => {
            cmd.env("LD_PRELOAD", lib);
        }
        Some(None) => {
            cmd.env_remove("LD_PRELOAD");
        }
        None => {}
    }
    let child = cmd.spawn()?;
    let status = crate::interrupt::wait_passing_on(child, libc::SIGINT, std::time::Duration::ZERO)?;
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => {}
        // The child said why on stderr; its exit code (2 for bad input) passes through.
        (Some(code), _) => return Ok(Err((format!("the {allocator} run failed (exit status {code}); its result is missing"), code))),
        (None, signal) => {
            let signal = signal.unwrap_or(0);
            let hint = if signal == libc::SIGKILL { ": the kernel's OOM killer sends it" } else { "" };
            // A shell reports death by signal N as status 128 + N.
            return Ok(Err((format!("the {allocator} run was killed by signal {signal}{hint}; its result is missing"), 128 + signal)));
        }
    }
    let mut recs = crate::results::read_results(&result)?;
    Ok(Ok(recs.pop().ok_or_else(|| anyhow::anyhow!("the {allocator} child wrote no result"))?))
}

/// Mean overhead drift per allocator and workload with its 95 % CI over repetitions.
fn drift_summary(records: &[ResultRecord]) -> String {
    use std::collections::BTreeMap;
    let mut by: BTreeMap<(String, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in records {
        if let ResultRecord::CpuRun(r) = r {
            let e = by.entry((r.workload.name.clone(), r.allocator.clone())).or_default();
            e.0.extend(r.drift_overhead_mib_per_1k);
            e.1.extend(r.drift_mib_per_1k_iterations);
        }
    }
    let fmt = |v: &[f64]| match crate::cpu::rss::mean_ci95(v) {
        Some((m, Some(h))) => format!("{m:+.3} ± {h:.3}"),
        Some((m, None)) => format!("{m:+.3}"),
        None => "n/a".into(),
    };
    let mut s = String::from("drift, MiB per 1,000 iterations (mean ± 95 % CI over repetitions):\n");
    for ((w, al), (overhead, raw)) in by {
        s += &format!("  {w} {al:<9} RSS - live {}  (raw RSS {}), {} run(s)\n", fmt(&overhead), fmt(&raw), overhead.len().max(raw.len()));
    }
    s
}

/// `allocbench cpu --exec [--allocator ...] [--reps N] [--sample-ms MS] [--jsonl OUT] -- CMD ...`
fn exec_main(a: &CpuArgs) -> anyhow::Result<()> {
    use crate::cpu::exec;
    use crate::error::InputError;
    if a.command.is_empty() {
        return Err(InputError::new("--exec", "needs a command after `--`, e.g. allocbench cpu --exec -- python3 script.py").into());
    }
    // A program that cannot start is bad input, found before any run (as execvp would look).
    exec::find_program(&a.command[0]).map_err(|why| InputError::new(&a.command[0], why))?;
    // LD_PRELOAD needs the dynamic loader: said once, before the runs that cannot be proven.
    let static_exe = exec::static_executable(&a.command);
    if let Some(exe) = &static_exe {
        eprintln!(
            "{} is statically linked: LD_PRELOAD cannot put an allocator in front of its malloc, so no run can be proven (runs are kept with served_by null and left out of reports)",
            exe.display()
        );
    }
    let configs = run_configs(&a.allocator, &a.settings, a.grid, Some(&a.command))?;
    // With `--json -` stdout carries the records only: the program's output and the run lines
    // go to stderr.
    let json_on_stdout = a.json.as_deref() == Some("-");
    let opts = exec::ExecOptions { sample_interval: std::time::Duration::from_millis(a.sample_ms), program_stdout_to_stderr: json_on_stdout, env: Vec::new() };
    let mut jsonl = Jsonl::append(a.jsonl.as_deref())?;
    let mut records = Vec::new();
    let total = a.reps as u64 * configs.len() as u64;
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs {msg} {elapsed}").expect("valid template"));
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut unproven = 0;
    let mut stopped = false;
    let mut failed_to_start: Option<String> = None;
    'reps: for rep in 1..=a.reps {
        for (al, env) in &configs {
            pb.set_message(format!("{} (repetition {rep}/{})", crate::results::cpu::with_settings(&al.name, &crate::cpu::settings::describe(env)), a.reps));
            let opts = exec::ExecOptions { env: env.to_vec(), ..opts.clone() };
            let r = exec::run_once(&a.command, al, rep, &opts);
            if r.interrupted {
                // The stopped run is not a result; every finished one is already written.
                stopped = true;
                break 'reps;
            }
            pb.suspend(|| {
                if json_on_stdout {
                    eprintln!("{}", describe_exec(&r));
                } else {
                    println!("{}", describe_exec(&r));
                }
                if r.served_by.as_deref() != Some(r.allocator.as_str()) && r.error.is_none() {
                    eprintln!(
                        "not labelled {}: {}",
                        r.allocator,
                        match &r.served_by {
                            Some(other) => format!("the process tree mapped {other} ({})", r.served_by_library.as_deref().unwrap_or("?")),
                            None => match &static_exe {
                                Some(exe) => format!("{} is statically linked (no dynamic loader to preload it)", exe.display()),
                                None => format!(
                                    "no process of the run was seen mapping it: the program exited after {:.1} ms, before its mappings could be read",
                                    r.wall_s * 1e3
                                ),
                            },
                        }
                    );
                }
            });
            if let Some(e) = r.error.as_ref().filter(|_| r.exit_code >= 126 && r.wall_s == 0.0) {
                // Never started (not found, not executable): no allocator to prove.
                failed_to_start.get_or_insert_with(|| e.clone());
            } else if r.served_by.as_deref() != Some(r.allocator.as_str()) {
                unproven += 1;
            }
            let rec = ResultRecord::CpuExec(Box::new(r));
            jsonl.write(&rec)?;
            records.push(rec);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if let Some(path) = &a.json {
        let mut out = Jsonl::open(Some(Path::new(path)))?;
        for r in &records {
            out.write(r)?;
        }
    }
    if stopped || crate::interrupt::interrupted() {
        crate::interrupt::exit_interrupted(&format!("{} finished run(s) kept", records.len()));
    }
    if let Some(e) = failed_to_start {
        eprintln!("the program did not start: {e}");
    }
    if unproven > 0 {
        eprintln!("{unproven} run(s) not labelled: their allocator was not proven");
    }
    // A program that failed is a result (recorded with its exit code), and a failure to report.
    let failed: Vec<&crate::results::CpuExecResult> =
        records.iter().filter_map(|r| if let ResultRecord::CpuExec(r) = r { Some(r.as_ref()) } else { None }).filter(|r| r.exit_code != 0).collect();
    if let Some(first) = failed.first() {
        eprintln!(
            "{} of {} exited with a non-zero status (the first: exit {} under {}); {} kept with {}",
            failed.len(),
            crate::units::count(records.len() as u64, "run"),
            first.exit_code,
            first.allocator,
            if failed.len() == 1 { "it is" } else { "they are" },
            if failed.len() == 1 { "its exit code" } else { "their exit codes" }
        );
        drop(jsonl);
        std::process::exit(1);
    }
    Ok(())
}

/// `allocbench cpu TRACE` for a recorded trace: the recorded calls replayed under each allocator
/// (LD_PRELOAD of Debian's libraries; glibc = none), each run in its own process.
fn recorded_main(a: &CpuArgs, input: &Path) -> anyhow::Result<()> {
    use crate::cpu::{exec, recorded::RecordedTrace, replay::ReplayOptions};
    use crate::error::InputError;
    for (set, flag) in [
        (a.cross_thread, "--cross-thread"),
        (a.scale != 1.0, "--scale"),
        (a.iterations.is_some(), "--iterations"),
        (a.preload.is_some(), "--preload"),
        (a.expect_malloc.is_some(), "--expect-malloc"),
    ] {
        if set {
            return Err(InputError::new(
                flag,
                "not with a recorded trace: it replays the recorded threads and sizes as they were, under --allocator (glibc, jemalloc, tcmalloc, mimalloc, a .so, or all)",
            )
            .into());
        }
    }
    if a.threads == 0 || a.threads > 1024 {
        return Err(InputError::new("--threads", "copies of the recording: between 1 and 1024").into());
    }
    let trace = RecordedTrace::read(input)?;
    let replay_opts = ReplayOptions { touch: !a.no_touch, duration: a.duration.map(std::time::Duration::from_secs_f64), pace: a.pace == "recorded" };
    if let (Ok(name), Some(result)) = (std::env::var(CHILD_ALLOCATOR_ENV), std::env::var_os(CHILD_RESULT_ENV)) {
        // One run, in this child started under the allocator's preload.
        let live = crate::cpu::preload::live_malloc();
        crate::cpu::check_expected(Some(&name), &live.name, &live)?;
        // Named by its file (the name it was recorded under), else by the program it ran.
        let file = input.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = file.strip_suffix(".gz").unwrap_or(&file).strip_suffix(".abt").filter(|s| !s.is_empty()).map(str::to_string);
        let workload = crate::results::WorkloadInfo {
            name: stem.unwrap_or_else(|| exec::program_name(&trace.info.command)),
            kind: "recorded".into(),
            origin: input.display().to_string(),
            sha256: crate::files::sha256_file(input)?,
            seed: None,
            description: trace.info.command.join(" "),
        };
        let sample = std::time::Duration::from_millis(a.sample_ms);
        let drain = std::time::Duration::from_secs_f64(a.drain);
        let mut r = running(&name, a.drain, || crate::cpu::run_recorded(&trace, a.threads, workload, &replay_opts, sample, drain))?;
        r.settings = std::env::var(CHILD_SETTINGS_ENV).unwrap_or_default().lines().map(str::to_string).collect();
        if a.json.as_deref() != Some("-") {
            print!("{}", crate::cpu::describe(&r));
        }
        return output::write_json(&result.to_string_lossy(), &ResultRecord::CpuRun(Box::new(r)));
    }
    if let Some(why) = &trace.info.incomplete {
        eprintln!("note: {} was recorded from a run that did not finish cleanly ({why})", input.display());
    }
    let configs = run_configs(&a.allocator, &a.settings, a.grid, None)?;
    let mut jsonl = Jsonl::append(a.jsonl.as_deref())?;
    let mut records = Vec::new();
    let mut failures: Vec<(String, i32)> = Vec::new();
    'reps: for _ in 0..a.reps {
        for (al, env) in &configs {
            match run_in_child_with(&al.name, Some(al.library.as_deref()), env, std::env::args_os().skip(1).collect())? {
                Ok(rec) => {
                    jsonl.write(&rec)?;
                    records.push(rec);
                }
                Err(failure) => {
                    eprintln!("error: {}", failure.0);
                    let bad_input = failure.1 == 2;
                    failures.push(failure);
                    if bad_input || crate::interrupt::interrupted() {
                        break 'reps;
                    }
                }
            }
            if crate::interrupt::interrupted() {
                break 'reps;
            }
        }
    }
    if let Some(path) = a.json.as_ref().filter(|_| !records.is_empty()) {
        if records.len() == 1 && failures.is_empty() {
            output::write_json(path, &records[0])?;
        } else {
            let mut out = Jsonl::open(Some(Path::new(path)))?;
            for r in &records {
                out.write(r)?;
            }
        }
    }
    if crate::interrupt::interrupted() {
        drop(jsonl);
        crate::interrupt::exit_interrupted(&format!("{} kept", crate::units::count(records.len() as u64, "run")));
    }
    if let Some((_, code)) = failures.first() {
        eprintln!("{} of the runs failed; the {} finished kept", failures.len(), records.len());
        drop(jsonl);
        std::process::exit(*code);
    }
    Ok(())
}

/// `allocbench cpu advise TRACE | -- CMD`: every config (each allocator's defaults, the usual
/// settings, `--settings`) × repetitions, interleaved, each in its own process; then the ranking.
fn advise_main(a: &CpuAdviseArgs) -> anyhow::Result<()> {
    use crate::cpu::{advise, exec};
    use crate::error::InputError;
    output::check_outputs(&[a.json.as_deref().map(Path::new), a.jsonl.as_deref()], &[a.input.as_deref()])?;
    let (input_name, trace) = match (&a.input, a.command.is_empty()) {
        (Some(_), false) => return Err(InputError::new("cpu advise", "a recorded trace or a program after `--`, not both").into()),
        (Some(p), true) => {
            crate::cpu::recorded::RecordedTrace::read(p)?;
            (p.display().to_string(), Some(p.clone()))
        }
        (None, _) => {
            exec::find_program(&a.command[0]).map_err(|why| InputError::new(&a.command[0], why))?;
            (a.command.join(" "), None)
        }
    };
    let configs = run_configs(&a.allocator, &a.settings, !a.no_grid, trace.is_none().then_some(a.command.as_slice()))?;
    let mut jsonl = Jsonl::append(a.jsonl.as_deref())?;
    let mut measured = Vec::new();
    let total = a.reps as usize * configs.len();
    let mut failed = 0;
    eprintln!("{} configs x {} repetitions on {input_name}", configs.len(), a.reps);
    'reps: for rep in 1..=a.reps {
        for (i, (al, env)) in configs.iter().enumerate() {
            let label = crate::results::cpu::with_settings(&al.name, &crate::cpu::settings::describe(env));
            let n = (rep as usize - 1) * configs.len() + i + 1;
            let rec = match &trace {
                Some(path) => {
                    let args: Vec<std::ffi::OsString> =
                        // (`--json -`: the child's record goes to the parent, nothing to the terminal.)
                        vec!["cpu", "--drain", &a.drain.to_string(), "--sample-ms", &a.sample_ms.to_string(), "--pace", &a.pace, "--json", "-"]
                            .into_iter()
                            .map(std::ffi::OsString::from)
                            .chain([path.clone().into_os_string()])
                            .collect();
                    match run_in_child_with(&al.name, Some(al.library.as_deref()), env, args)? {
                        Ok(rec) => Some(rec),
                        Err((why, _)) => {
                            eprintln!("error: {why}");
                            None
                        }
                    }
                }
                None => {
                    let opts =
                        exec::ExecOptions { sample_interval: std::time::Duration::from_millis(a.sample_ms), program_stdout_to_stderr: true, env: env.clone() };
                    let r = exec::run_once(&a.command, al, rep, &opts);
                    if r.exit_code != 0 {
                        eprintln!("error: {label} exited with status {}", r.exit_code);
                        None
                    } else {
                        Some(ResultRecord::CpuExec(Box::new(r)))
                    }
                }
            };
            match rec {
                Some(rec) => {
                    jsonl.write(&rec)?;
                    let m = match &rec {
                        ResultRecord::CpuRun(r) => advise::Measured::of_replay(r),
                        ResultRecord::CpuExec(r) => advise::Measured::of_exec(r),
                        _ => unreachable!("runs are cpu_run or cpu_exec records"),
                    };
                    eprintln!(
                        "[{n}/{total}] {label}: steady RSS {}, peak {}",
                        crate::units::format_bytes(m.steady.max(0.0) as u64),
                        crate::units::format_bytes(m.peak.max(0.0) as u64)
                    );
                    measured.push(m);
                }
                None => failed += 1,
            }
            if crate::interrupt::interrupted() {
                break 'reps;
            }
        }
    }
    if measured.is_empty() {
        anyhow::bail!("no run finished: nothing to rank");
    }
    let result = advise::rank(&measured, &a.objective, &input_name);
    output::say(a.json.as_deref(), &describe_cpu_advise(&result));
    let rec = ResultRecord::CpuAdvise(Box::new(result));
    jsonl.write(&rec)?;
    if let Some(path) = &a.json {
        output::write_json(path, &rec)?;
    }
    if crate::interrupt::interrupted() {
        drop(jsonl);
        crate::interrupt::exit_interrupted("the ranking covers the runs that finished");
    }
    if failed > 0 {
        eprintln!("{failed} run(s) failed and are left out of the ranking");
        drop(jsonl);
        std::process::exit(1);
    }
    Ok(())
}

/// The ranking as a table, then the recommendation.
fn describe_cpu_advise(r: &crate::results::CpuAdviseResult) -> String {
    use crate::units::{format_bytes, format_bytes_signed};
    let mut s =
        format!("{:<58} {:>11} {:>11} {:>11} {:>10} {:>9}  runs\n", "allocator and settings", "steady RSS", "peak RSS", "retained", "CPU s", "CPU cost");
    for c in &r.candidates {
        let tp = format!("{:.3}", c.cpu_s);
        s += &format!(
            "{:<58} {:>11} {:>11} {:>11} {:>10} {:>8.1}%  {}{}\n",
            c.label.chars().take(58).collect::<String>(),
            format_bytes(c.steady_rss_bytes.max(0.0) as u64),
            format_bytes(c.peak_rss_bytes.max(0.0) as u64),
            c.retained_bytes.map(|b| format_bytes_signed(b as i128)).unwrap_or_else(|| "-".into()),
            tp,
            c.time_cost * 100.0,
            c.runs,
            c.dominated_by.as_deref().map(|d| format!("  (beaten on every column by {d})")).unwrap_or_default()
        );
    }
    s += &format!("\nrecommended ({}): {}\n  {}\n", r.objective, r.reason, r.line);
    s
}

/// `allocbench cpu --record -o TRACE [--sample-ms MS] [--json OUT] -- CMD ...`
fn record_main(a: &CpuArgs) -> anyhow::Result<()> {
    use crate::cpu::exec;
    use crate::units::format_bytes;
    let out = a.output.as_deref().expect("clap requires -o with --record");
    exec::find_program(&a.command[0]).map_err(|why| crate::error::InputError::new(&a.command[0], why))?;
    if let Some(exe) = exec::static_executable(&a.command) {
        return Err(crate::error::InputError::new(
            exe.display().to_string(),
            "is statically linked: LD_PRELOAD cannot put the recorder in front of its malloc, so nothing would be recorded",
        )
        .into());
    }
    let json_on_stdout = a.json.as_deref() == Some("-");
    let rec = crate::cpu::record::record(&a.command, out, std::time::Duration::from_millis(a.sample_ms), json_on_stdout)?;
    let t = &rec.trace;
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    let calls = t.total_calls();
    let threads: u32 = t.info.processes.iter().map(|p| p.threads).sum();
    let mut text = format!(
        "recorded {} in {} ({} threads) over {:.2} s, peak RSS {} (the tree's): {} ({}, {:.1} bytes a call)\n",
        crate::units::count(calls, "call"),
        match t.info.processes.len() {
            1 => "1 process".to_string(),
            n => format!("{n} processes"),
        },
        threads,
        t.info.wall_s,
        format_bytes(t.info.peak_rss_bytes),
        out.display(),
        format_bytes(size),
        if calls > 0 { size as f64 / calls as f64 } else { 0.0 }
    );
    for p in &t.info.processes {
        let unmatched = if p.unmatched_frees + p.unseen_frees > 0 {
            format!(", {} of blocks allocated before the recorder started, {} free(s) unseen", p.unmatched_frees, p.unseen_frees)
        } else {
            String::new()
        };
        text += &format!(
            "  pid {} {}: {} on {} thread(s), peak live {}{unmatched}\n",
            p.pid,
            p.cmdline.iter().map(|s| s.replace('\n', " ")).collect::<Vec<_>>().join(" ").chars().take(60).collect::<String>(),
            crate::units::count(p.calls, "call"),
            p.threads,
            format_bytes(p.peak_live_bytes)
        );
    }
    output::say(a.json.as_deref(), &text);
    if let Some(path) = &a.json {
        output::write_json(path, &crate::results::ResultRecord::CpuExec(Box::new(rec.run.clone())))?;
    }
    if let Some(why) = &t.info.incomplete {
        eprintln!("the program did not finish cleanly ({why}); the trace so far is kept, marked incomplete");
        std::process::exit(if rec.run.interrupted { 130 } else { 1 });
    }
    Ok(())
}

/// One line per exec run.
fn describe_exec(r: &crate::results::CpuExecResult) -> String {
    use crate::units::format_bytes;
    format!(
        "{:<9} rep {} {}: exit {}{}, wall {:.2} s, user {:.2} s, sys {:.2} s, peak RSS {}, faults {} minor / {} major, served by {}",
        r.label(),
        r.rep,
        r.name,
        r.exit_code,
        r.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default(),
        r.wall_s,
        r.user_s,
        r.sys_s,
        format_bytes(r.peak_rss_bytes),
        r.minor_faults,
        r.major_faults,
        r.served_by_library.as_deref().unwrap_or("unproven")
    )
}

/// Runs `f` under a spinner on stderr (hidden when stderr is not a terminal): a run plus its
/// drain can take a while.
fn running<T>(allocator: &str, drain_s: f64, f: impl FnOnce() -> T) -> T {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"));
    pb.set_message(if drain_s > 0.0 { format!("{allocator}: running, then a {drain_s} s drain") } else { format!("{allocator}: running") });
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let out = f();
    pb.finish_and_clear();
    out
}
