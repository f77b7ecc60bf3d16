//! `allocbench advise`: replays a space of `PYTORCH_CUDA_ALLOC_CONF` settings on every core and
//! ranks them (no OOM first, then the lowest peak reserved memory); [`describe`] renders the
//! ranking.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::event::Event;
use crate::gpu::build::{build, DeviceSpec};
use crate::gpu::config::AllocatorConfig;
use crate::gpu::replay::{ReplayOptions, StopWhen};
use crate::gpu::GpuAllocator;
use crate::gpu_run::{replay_sim, run_one};
use crate::results::{Candidate, GpuRunResult, OnOom, WorkloadInfo};
use crate::units::format_bytes;

/// The space `advise` searches: expandable × max_split_size_mb × roundup_power2_divisions × GC.
pub fn search_space() -> Vec<String> {
    let expandable = ["", "expandable_segments:True"];
    let split = [
        "",
        "max_split_size_mb:32",
        "max_split_size_mb:64",
        "max_split_size_mb:128",
        "max_split_size_mb:256",
        "max_split_size_mb:512",
        "max_split_size_mb:1024",
    ];
    let roundup = [
        "",
        "roundup_power2_divisions:2",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:8",
        "roundup_power2_divisions:[256:1,512:2,>:4]",
        "roundup_power2_divisions:[64:8,256:4,1024:2,>:1]",
    ];
    let gc = ["", "garbage_collection_threshold:0.6,per_process_memory_fraction:0.99", "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99"];
    let mut out = Vec::new();
    for e in expandable {
        for s in split {
            for r in roundup {
                for g in gc {
                    let parts: Vec<&str> = [s, r, g, e].into_iter().filter(|p| !p.is_empty()).collect();
                    out.push(parts.join(","));
                }
            }
        }
    }
    out
}

/// Replays every configuration on `threads` threads; results sorted best first (no OOM, then
/// lowest peak reserved, then fewest device mallocs). `done` is called as each one finishes (the
/// command's progress bar).
pub fn advise(events: &[Event], capacity: u64, confs: &[String], threads: usize, done: Option<&(dyn Fn() + Sync)>) -> anyhow::Result<Vec<Candidate>> {
    let parsed: Vec<AllocatorConfig> = confs.iter().map(|c| AllocatorConfig::parse(c)).collect::<Result<_, _>>()?;
    let next = AtomicUsize::new(0);
    let results: Vec<anyhow::Result<Vec<Candidate>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<Vec<Candidate>> {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= parsed.len() || crate::interrupt::interrupted() {
                            return Ok(mine);
                        }
                        let (out, a) = replay_sim(events, &parsed[i], capacity, OnOom::Stop)?;
                        let st = a.stats();
                        mine.push(Candidate {
                            conf: confs[i].clone(),
                            peak_reserved: out.peak_reserved,
                            overhead: out.overhead(),
                            device_mallocs: st.num_device_alloc,
                            retries: st.num_alloc_retries,
                            oom_step: out.oom.as_ref().map(|o| o.step),
                        });
                        if let Some(done) = done {
                            done();
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("an advise worker panicked")))).collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(rank(all))
}

/// Sorts candidates best first: no OOM, then the lowest peak reserved, then fewest device mallocs
/// (`advise`'s own replays, and the rows of a merged sweep).
pub fn rank(mut all: Vec<Candidate>) -> Vec<Candidate> {
    // Peak reserved decides, but within half a percent of each other the configuration with fewer
    // device mallocs wins (each costs tens of µs to ms on a real GPU: see `allocbench devprobe`).
    let best = all.iter().filter(|c| c.oom_step.is_none()).map(|c| c.peak_reserved).min().unwrap_or(1).max(1);
    let bucket = |c: &Candidate| c.peak_reserved / (best / 200).max(1);
    all.sort_by(|a, b| (a.oom_step.is_some(), bucket(a), a.device_mallocs, &a.conf).cmp(&(b.oom_step.is_some(), bucket(b), b.device_mallocs, &b.conf)));
    all
}

/// The full results of the default configuration and of the best one (once when they are the
/// same), each handed to `each` as it finishes: what `advise --jsonl` writes for the report.
pub fn full_runs(
    events: &[Event],
    info: &WorkloadInfo,
    capacity: u64,
    best: &Candidate,
    mut each: impl FnMut(GpuRunResult) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for conf in ["", best.conf.as_str()] {
        let cfg = AllocatorConfig::parse(conf)?;
        let mut built = build("pytorch", &cfg, &DeviceSpec::sim(capacity))?;
        let opts = ReplayOptions { on_oom: OnOom::Stop, ..Default::default() };
        each(run_one(&mut built, &cfg, Box::new(events.iter().copied().map(Ok)), info.clone(), &opts, &mut StopWhen(crate::interrupt::interrupted))?)?;
        if best.conf.is_empty() {
            break;
        }
    }
    Ok(())
}

/// The ranking for people: the default, the best `top`, and the line to `export`.
pub fn describe(info: &WorkloadInfo, ranked: &[Candidate], capacity: u64, elapsed_s: f64, threads: usize, top: usize) -> String {
    let s = format!(
        "{} ({}): {} configurations replayed on a {} device in {:.1} s ({} threads)\n",
        info.name,
        info.kind,
        ranked.len(),
        format_bytes(capacity),
        elapsed_s,
        threads
    );
    s + &ranking(ranked, top)
}

/// The ranking table (the default, the best `top`) and the line to `export`.
pub fn ranking(ranked: &[Candidate], top: usize) -> String {
    let mut s = String::new();
    let row = |c: &Candidate| {
        format!(
            "{:>12} {:>9.3} {:>8} {:>7} {:>10}",
            format_bytes(c.peak_reserved),
            c.overhead,
            c.device_mallocs,
            c.retries,
            c.oom_step.map(|s| format!("step {s}")).unwrap_or_else(|| "-".into())
        )
    };
    s += &format!("{:<4} {:>12} {:>9} {:>8} {:>7} {:>10}  conf\n", "rank", "peak rsvd", "rsvd/live", "mallocs", "retries", "OOM");
    if let Some(d) = ranked.iter().find(|c| c.conf.is_empty()) {
        s += &format!("{:<4} {}  (PyTorch defaults)\n", "base", row(d));
    }
    for (i, c) in ranked.iter().take(top).enumerate() {
        s += &format!("{:<4} {}  {}\n", i + 1, row(c), if c.conf.is_empty() { "(defaults)" } else { &c.conf });
    }
    if let Some(best) = ranked.first() {
        if best.oom_step.is_some() {
            s += "\nNo configuration avoids the OOM on this device; the least bad one is first.\n";
        }
        s += &format!("\nexport PYTORCH_CUDA_ALLOC_CONF={}\n", if best.conf.is_empty() { "''".to_string() } else { format!("'{}'", best.conf) });
    }
    s
}
