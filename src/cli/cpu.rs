//! `allocbench cpu` (real CPU allocators driven with a workload, or `--exec`: a real program under
//! each LD_PRELOAD allocator) and `allocbench malloc-info`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::output::{self, Jsonl};
use crate::input::Source;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct CpuArgs {
    /// A workload (.toml) or trace (.csv); not with --exec.
    #[arg(required_unless_present = "exec")]
    pub input: Option<PathBuf>,
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

pub fn main(a: &CpuArgs) -> anyhow::Result<()> {
    // From here on the harness's own allocations come from its private arena, never from the
    // malloc under test.
    crate::cpu::harness_alloc::isolate();
    output::check_outputs(&[a.json.as_deref().map(Path::new), a.jsonl.as_deref()], &[a.input.as_deref()])?;
    if a.exec {
        return exec_main(a);
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

/// Re-runs this command for one allocator in a child process and reads back its record. Ctrl-C
/// (or SIGTERM) is passed on, and the child still writes what it measured. A child that failed gives why
/// (naming the allocator) and the exit code to pass on.
fn run_in_child(allocator: &str) -> anyhow::Result<Result<ResultRecord, (String, i32)>> {
    let dir = tempfile::tempdir()?;
    let result = dir.path().join("run.json");
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(CHILD_ALLOCATOR_ENV, allocator)
        .env(CHILD_RESULT_ENV, &result)
        .spawn()?;
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
    let (allocs, notes) = exec::resolve_allocators(&a.allocator)?;
    for n in &notes {
        eprintln!("{n}");
    }
    // LD_PRELOAD needs the dynamic loader: said once, before the runs that cannot be proven.
    let static_exe = exec::static_executable(&a.command);
    if let Some(exe) = &static_exe {
        eprintln!(
            "{} is statically linked: LD_PRELOAD cannot put an allocator in front of its malloc, so no run can be proven (runs are kept with served_by null and left out of reports)",
            exe.display()
        );
    }
    let probe = std::env::current_exe()?;
    for al in &allocs {
        if let Some(lib) = &al.library {
            crate::cpu::preload::check_serves_malloc(&probe, lib)?;
        }
    }
    // With `--json -` stdout carries the records only: the program's output and the run lines
    // go to stderr.
    let json_on_stdout = a.json.as_deref() == Some("-");
    let opts = exec::ExecOptions { sample_interval: std::time::Duration::from_millis(a.sample_ms), program_stdout_to_stderr: json_on_stdout };
    let mut jsonl = Jsonl::append(a.jsonl.as_deref())?;
    let mut records = Vec::new();
    let total = a.reps as u64 * allocs.len() as u64;
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs {msg} {elapsed}").expect("valid template"));
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut unproven = 0;
    let mut stopped = false;
    let mut failed_to_start: Option<String> = None;
    'reps: for rep in 1..=a.reps {
        for al in &allocs {
            pb.set_message(format!("{} (repetition {rep}/{})", al.name, a.reps));
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

/// One line per exec run.
fn describe_exec(r: &crate::results::CpuExecResult) -> String {
    use crate::units::format_bytes;
    format!(
        "{:<9} rep {} {}: exit {}{}, wall {:.2} s, user {:.2} s, sys {:.2} s, peak RSS {}, faults {} minor / {} major, served by {}",
        r.allocator,
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
