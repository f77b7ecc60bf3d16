//! The CPU side: real allocators (in-process or interposed with LD_PRELOAD) driven with the
//! workloads' event streams, measuring throughput, latency percentiles, RSS over time and its
//! drift, and memory retained after everything is freed.
//!
//! Definitions (also in docs/cpu.md):
//! - **ops/s**: (mallocs + frees) ÷ wall time of the run (event generation, the replay loop and
//!   page touching included); **replay ops/s**: per thread, ÷ the time in the replay of compiled
//!   ops (allocator calls, page touching and a loop of a few ns per op; `--no-touch` leaves the
//!   allocator alone).
//! - **peak RSS**: the highest RSS during the run (VmHWM, reset before the run where the kernel
//!   allows, else the sampled maximum).
//! - **drift**: the least-squares slope over the steady-state part of the run (after its first
//!   quarter) of RSS minus live bytes per 1,000 iterations (`drift_overhead_mib_per_1k`: what
//!   the allocator adds), beside the slope of raw RSS per 1,000 iterations and per minute.
//! - **retained**: RSS after every block is freed minus RSS before the workload started, right
//!   away and at 0.1 / 1 / 10 s into the drain (`--drain`); **retained after trim**: the same
//!   after the allocator's own trim call at the end of the drain (glibc `malloc_trim(0)`,
//!   jemalloc `arena.<all>.purge`, tcmalloc `MallocExtension_ReleaseFreeMemory`, mimalloc
//!   `mi_collect(true)`), in-process or under LD_PRELOAD.

pub mod advise;
pub mod allocators;
pub mod driver;
pub mod exec;
pub mod harness_alloc;
pub mod preload;
pub mod record;
pub mod recorded;
pub mod replay;
pub mod rss;
pub mod settings;

use std::time::Duration;

use crate::error::InputError;
use crate::input::Source;
use crate::results::{CpuMode, CpuRunResult, Latency, LiveMalloc, MachineInfo, RetainedAt, WorkDone, SCHEMA_VERSION};
use allocators::CpuAllocator;
use driver::{drive_holding, DriverOptions};
use rss::RssSampler;

/// How to run.
pub struct CpuRunOptions {
    pub driver: DriverOptions,
    pub sample_interval: Duration,
    /// How long to keep sampling RSS after the last free, before the trim call.
    pub drain: Duration,
}

/// When retained memory is read during the drain, in seconds after the last free.
pub const DRAIN_CHECKPOINTS_S: [f64; 3] = [0.1, 1.0, 10.0];

/// Sleeps until `until`, in short naps so Ctrl-C ends the wait; returns false if interrupted.
fn sleep_until(until: std::time::Instant) -> bool {
    loop {
        if crate::interrupt::interrupted() {
            return false;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

/// The label a run gets: an in-process allocator's own name, or what really serves malloc.
pub fn label(alloc: &CpuAllocator, live: &LiveMalloc) -> (String, CpuMode) {
    if alloc.name == "system" {
        (live.name.clone(), if live.ld_preload.is_some() { CpuMode::Preload } else { CpuMode::InProcess })
    } else {
        (alloc.name.to_string(), CpuMode::InProcess)
    }
}

/// Refuses a run whose label would lie: `expect` names the allocator the caller promised.
pub fn check_expected(expect: Option<&str>, actual: &str, live: &LiveMalloc) -> Result<(), InputError> {
    match expect {
        Some(e) if e != actual => Err(InputError::new(
            "--expect-malloc",
            format!(
                "expected {e} to serve malloc, but {actual} does ({}; LD_PRELOAD={}): refusing to label this run {e}",
                live.library,
                live.ld_preload.as_deref().unwrap_or("unset")
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks before starting that the scaled workload fits in this machine's memory; returns the
/// scaled peak live bytes of one pass (one worker).
pub fn check_fits(source: &Source, opts: &DriverOptions) -> anyhow::Result<u64> {
    let per_pass = crate::event::peak_live_bytes(source.events()?, |b| driver::scaled(b, opts.scale) as u64)?;
    let peak = per_pass.saturating_mul(opts.threads as u64);
    let available = rss::mem_available_bytes();
    if peak as f64 > available as f64 * 0.8 {
        let needed_scale = (available as f64 * 0.5 / peak as f64 * opts.scale).max(1e-9);
        return Err(InputError::new(
            "--scale",
            format!(
                "this run needs about {} (peak live bytes x scale x threads), more than 80 % of the {} available (the rest is room for the allocator's own overhead and the system): try --scale 1/{}",
                crate::units::format_bytes(peak),
                crate::units::format_bytes(available),
                (1.0 / needed_scale).ceil() as u64
            ),
        )
        .into());
    }
    Ok(per_pass)
}

/// What a run reads at its end while its workers are held (see [`drive_holding`]).
struct Held {
    /// CPU seconds of the process when the workers had made their last free.
    cpu_s_at_end: f64,
    rss_after_free: u64,
    peak_rss: u64,
    retained_after_drain: Vec<RetainedAt>,
    drain_s: f64,
    native_stats: std::collections::BTreeMap<String, u64>,
    trim_call: Option<&'static str>,
    retained_after_trim: Option<i64>,
}

/// Runs one allocator over the workload and measures it.
pub fn run(source: &Source, alloc: CpuAllocator, opts: &CpuRunOptions) -> anyhow::Result<CpuRunResult> {
    let peak_live_bytes = check_fits(source, &opts.driver)?;
    let workload = source.info()?;
    let what =
        RunShape { threads: opts.driver.threads, cross_thread: opts.driver.cross_thread, touch: opts.driver.touch, scale: opts.driver.scale, peak_live_bytes };
    measure(alloc, opts.sample_interval, opts.drain, workload, what, |progress, while_held| drive_holding(source, alloc, &opts.driver, progress, while_held))
}

/// Replays a recorded trace with the process's malloc (`system`: glibc or the preloaded one) and
/// measures it as [`run`] does.
pub fn run_recorded(
    trace: &recorded::RecordedTrace,
    copies: usize,
    workload: crate::results::WorkloadInfo,
    replay_opts: &replay::ReplayOptions,
    sample_interval: Duration,
    drain: Duration,
) -> anyhow::Result<CpuRunResult> {
    let compiled = replay::compile(trace, copies)?;
    let what = RunShape {
        threads: compiled.threads(),
        cross_thread: compiled.cross_thread_calls > 0,
        touch: replay_opts.touch,
        scale: 1.0,
        peak_live_bytes: compiled.peak_live_bytes,
    };
    let alloc = CpuAllocator::by_name("system")?;
    let mut r = measure(alloc, sample_interval, drain, workload, what, |progress, while_held| {
        replay::drive_holding(&compiled, replay::ReplayAllocator::Libc, replay_opts, progress, &driver::Tsc::calibrated(), while_held)
    })?;
    r.paced = replay_opts.pace;
    Ok(r)
}

/// What a run was, for its record.
struct RunShape {
    threads: usize,
    cross_thread: bool,
    touch: bool,
    scale: f64,
    peak_live_bytes: u64,
}

/// What is read while a run's workers are held.
type WhileHeld<'a> = Box<dyn FnOnce(bool, &driver::HeldWorkers) -> Held + 'a>;

/// Measures one run that `drive` makes: RSS sampled throughout, retained memory read during the
/// drain while the workers live, then the allocator's trim.
fn measure(
    alloc: CpuAllocator,
    sample_interval: Duration,
    drain: Duration,
    workload: crate::results::WorkloadInfo,
    what: RunShape,
    drive: impl FnOnce(&rss::RunProgress, WhileHeld) -> anyhow::Result<(driver::DriverOutcome, Held)>,
) -> anyhow::Result<CpuRunResult> {
    let live = preload::live_malloc();
    let (name, mode) = label(&alloc, &live);
    let peak_live_bytes = what.peak_live_bytes;
    let rss_before = rss::rss_bytes();
    let vmhwm_reset = rss::reset_peak_rss();
    let sampler = RssSampler::start(sample_interval);
    let progress = sampler.progress.clone();
    // What is retained is read while the workers live, parked after their last free (a thread's
    // exit would hand its allocator caches back, which a serving thread never does).
    let live_for_held = live.clone();
    let cpu_s_before = rss::process_cpu_s();
    let driven = drive(
        &progress,
        Box::new(move |all_ok, workers| {
            let cpu_s_at_end = rss::process_cpu_s();
            let live = live_for_held;
            let last_free = std::time::Instant::now();
            let rss_after_free = rss::rss_bytes();
            let peak_rss = if vmhwm_reset { rss::peak_rss_bytes() } else { 0 };
            // The drain: the allocator's decay and purge timers run while nothing is allocated.
            let mut retained_after_drain = Vec::new();
            if all_ok {
                for after_s in DRAIN_CHECKPOINTS_S.into_iter().filter(|&c| c <= drain.as_secs_f64()) {
                    if !sleep_until(last_free + Duration::from_secs_f64(after_s)) {
                        break;
                    }
                    retained_after_drain.push(RetainedAt { after_s, retained: rss::rss_bytes() as i64 - rss_before as i64 });
                }
                sleep_until(last_free + drain);
            }
            let drain_s = last_free.elapsed().as_secs_f64();
            let native_stats = alloc.native_stats(&live.name);
            // The trim on every worker thread, then on this one: mimalloc's collects the calling
            // thread's heap alone (a preloaded mimalloc 2.0 called from here gave back nothing of
            // a worker's 55 MiB); the others' calls are process-wide, and a second one finds nothing.
            let live_name = live.name.clone();
            workers.run_on_each(std::sync::Arc::new(move || {
                alloc.trim(&live_name);
            }));
            let trim_call = alloc.trim(&live.name);
            let retained_after_trim = trim_call.map(|_| rss::rss_bytes() as i64 - rss_before as i64);
            Held { cpu_s_at_end, rss_after_free, peak_rss, retained_after_drain, drain_s, native_stats, trim_call, retained_after_trim }
        }),
    );
    let samples = sampler.finish();
    let (out, held) = driven?;
    let Held { cpu_s_at_end, rss_after_free, peak_rss, retained_after_drain, drain_s, native_stats, trim_call, retained_after_trim } = held;
    let sampled_peak = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    let peak_rss = peak_rss.max(sampled_peak);
    let drift = rss::drift(&samples);
    let ops = (out.allocs + out.frees) as f64;
    Ok(CpuRunResult {
        schema_version: SCHEMA_VERSION,
        allocator: name,
        mode,
        live_malloc: live,
        workload,
        machine: MachineInfo::current(),
        work: WorkDone {
            events: out.events,
            allocs: out.allocs,
            frees: out.frees,
            steps: out.iterations,
            bytes_requested: out.bytes_allocated,
            live_bytes_end: out.bytes_allocated - out.bytes_freed,
            peak_live_bytes,
        },
        threads: what.threads,
        cross_thread: what.cross_thread,
        touch: what.touch,
        scale: what.scale,
        iterations: out.iterations,
        passes: out.passes,
        bytes_allocated: out.bytes_allocated,
        bytes_freed: out.bytes_freed,
        wall_s: out.wall_s,
        ops_per_s: if out.wall_s > 0.0 { ops / out.wall_s } else { 0.0 },
        replay_ops_per_s: if out.replay_ns > 0 { ops * 1e9 / out.replay_ns as f64 / what.threads.max(1) as f64 } else { 0.0 },
        alloc_ns: Latency::of(&out.alloc_ns),
        free_ns: Latency::of(&out.free_ns),
        rss_before,
        peak_rss,
        rss_after_free,
        retained: rss_after_free as i64 - rss_before as i64,
        trim_call: trim_call.map(str::to_string),
        retained_after_trim,
        drift_mib_per_1k_iterations: drift.rss_per_1k,
        drift_mib_per_minute: drift.rss_per_minute,
        drift_overhead_mib_per_1k: drift.overhead_per_1k,
        drain_s,
        retained_after_drain,
        rss_timeline: samples,
        native_stats,
        interrupted: out.interrupted || crate::interrupt::interrupted(),
        pid: std::process::id(),
        settings: Vec::new(),
        cpu_s: Some(cpu_s_at_end - cpu_s_before),
        paced: false,
    })
}

/// A human summary of one CPU run.
pub fn describe(r: &CpuRunResult) -> String {
    use crate::units::{format_bytes, format_bytes_signed};
    let opt = |v: Option<f64>| v.map(|x| format!("{x:+.3}")).unwrap_or_else(|| "n/a".into());
    let mut s = format!(
        "{:<9} ({}; malloc from {}) {} thread(s){} scale {} on {} ({})\n",
        r.label(),
        r.mode,
        r.live_malloc.library,
        r.threads,
        if r.cross_thread { ", cross-thread frees" } else { "" },
        r.scale,
        r.workload.name,
        r.workload.kind
    );
    s += &format!(
        "  {} mallocs, {} frees, {} iterations in {:.2} s: {:.2} M ops/s wall, {:.2} M ops/s per thread in the replay loop\n",
        r.work.allocs,
        r.work.frees,
        r.iterations,
        r.wall_s,
        r.ops_per_s / 1e6,
        r.replay_ops_per_s / 1e6
    );
    let latency = |l: &crate::results::Latency| {
        if l.count == 0 {
            "n/a (no operation sampled)".to_string()
        } else {
            format!("p50 {} p99 {} p99.9 {}", l.p50, l.p99, l.p999)
        }
    };
    s += &format!("  malloc ns {}; free ns {}\n", latency(&r.alloc_ns), latency(&r.free_ns));
    s += &format!(
        "  RSS before {}, peak {}, after free {}: retained {}{}\n",
        format_bytes(r.rss_before),
        format_bytes(r.peak_rss),
        format_bytes(r.rss_after_free),
        format_bytes_signed(r.retained as i128),
        match (r.trim_call.as_deref(), r.retained_after_trim) {
            (Some(c), Some(t)) => format!(", after {c} {}", format_bytes_signed(t as i128)),
            _ => String::new(),
        }
    );
    if !r.retained_after_drain.is_empty() {
        let at: Vec<String> = r.retained_after_drain.iter().map(|d| format!("{} s {}", d.after_s, format_bytes_signed(d.retained as i128))).collect();
        s += &format!("  retained into the drain: {}\n", at.join(", "));
    }
    if r.drift_overhead_mib_per_1k.is_none() && r.drift_mib_per_1k_iterations.is_none() && r.drift_mib_per_minute.is_none() {
        s += &format!(
            "  drift: none measured (its steady part needs {} iterations and {} RSS samples: run longer, e.g. --duration 10)\n",
            crate::cpu::rss::MIN_DRIFT_ITERATIONS,
            crate::cpu::rss::MIN_DRIFT_SAMPLES
        );
    } else {
        s += &format!(
            "  drift (RSS - live) {} MiB per 1,000 iterations; raw RSS {} MiB per 1,000 iterations, {} MiB per minute ({} MiB per hour)\n",
            opt(r.drift_overhead_mib_per_1k),
            opt(r.drift_mib_per_1k_iterations),
            opt(r.drift_mib_per_minute),
            opt(r.drift_mib_per_minute.map(|m| m * 60.0))
        );
    }
    if r.interrupted {
        s += "  interrupted (Ctrl-C): numbers cover the part that ran\n";
    }
    s
}
