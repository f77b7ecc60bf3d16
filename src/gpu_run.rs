//! GPU runs: one replay turned into a results record ([`run_one`]), the plan of a comparison,
//! and their text ([`describe`], [`comparison_table`]). Policies come from `gpu::build`.

use crate::event::{Event, EventStream};
use crate::gpu::build::{build, pytorch_on_sim, Built, DeviceSpec};
use crate::gpu::caching::CachingAllocator;
use crate::gpu::config::AllocatorConfig;
use crate::gpu::device::address_replay::AddressReplay;
use crate::gpu::device::latency::WithLatency;
use crate::gpu::device::withheld::Withheld;
use crate::gpu::devprobe::LatencyModel;
use crate::gpu::replay::{replay_observed, replay_watched, BlockOwners, Observer, OnOom, ReplayOptions, ReplayOutcome, StopWhen};
use crate::gpu::GpuAllocator;
use crate::input::Source;
use crate::results::{Backend, GpuPolicy, GpuRunResult, GpuSummary, MachineInfo, WorkDone, WorkloadInfo, SCHEMA_VERSION};
use crate::units::format_bytes;

/// One replay of a comparison: a registered allocator and the conf it runs with.
pub struct Planned {
    pub allocator: GpuPolicy,
    pub conf: AllocatorConfig,
}

impl Planned {
    /// The progress label: the allocator, and the conf for pytorch.
    pub fn label(&self) -> String {
        self.allocator.label(&self.conf.to_string())
    }
}

/// The replays of `allocbench run`: every conf for pytorch, the first conf for the others
/// (whose policy ignores it).
pub fn plan(policies: &[GpuPolicy], confs: &[AllocatorConfig]) -> Vec<Planned> {
    let mut out = Vec::new();
    for &policy in policies {
        let confs_for = if policy.takes_conf() { confs } else { &confs[..1] };
        out.extend(confs_for.iter().map(|conf| Planned { allocator: policy, conf: conf.clone() }));
    }
    out
}

/// Builds `allocator` on `device` (with the addresses `source` recorded) and replays `source`.
pub fn run_source(
    source: &Source,
    info: &WorkloadInfo,
    allocator: GpuPolicy,
    conf: &AllocatorConfig,
    device: &DeviceSpec,
    opts: &ReplayOptions,
    watch: &mut dyn Observer<dyn GpuAllocator>,
) -> anyhow::Result<GpuRunResult> {
    let spec = DeviceSpec { addresses: source.address_script(), ..device.clone() };
    let mut built = build(allocator, conf, &spec)?;
    run_one(&mut built, conf, source.events()?, info.clone(), opts, watch)
}

/// The segment maps at exactly the peak and at the first OOM with the trace id of every live
/// block ([`BlockOwners`]), from a replay of their own on a fresh allocator (deterministic: the
/// record's replay passed through the same states): what the memory view needs to name
/// allocation sites.
pub fn segment_owners(
    allocator: GpuPolicy,
    conf: &AllocatorConfig,
    device: &DeviceSpec,
    events: EventStream<'_>,
    on_oom: OnOom,
) -> anyhow::Result<BlockOwners> {
    let mut built = build(allocator, conf, device)?;
    let mut owners = BlockOwners::default();
    replay_observed(built.alloc.as_mut(), events, on_oom, &mut owners)?;
    Ok(owners)
}

/// Replays `events` through a built policy and returns the results record; `watch` sees the
/// replay too (progress, Ctrl-C).
pub fn run_one(
    built: &mut Built,
    conf: &AllocatorConfig,
    events: EventStream<'_>,
    info: WorkloadInfo,
    opts: &ReplayOptions,
    watch: &mut dyn Observer<dyn GpuAllocator>,
) -> anyhow::Result<GpuRunResult> {
    let alloc = built.alloc.as_mut();
    // A record holds the segment map at exactly the peak.
    let opts = &ReplayOptions { time_model: built.time_model.clone(), exact_peak_map: true, ..opts.clone() };
    let outcome = replay_watched(alloc, events, opts, watch)?;
    let stats = alloc.stats();
    let conf_str = if alloc.policy().takes_conf() { conf.source.clone() } else { String::new() };
    Ok(GpuRunResult {
        schema_version: SCHEMA_VERSION,
        allocator: alloc.policy(),
        conf: conf_str,
        backend: built.backend,
        device: alloc.device_description(),
        capacity: built.capacity,
        on_oom: opts.on_oom,
        workload: info,
        machine: MachineInfo::current(),
        work: WorkDone {
            events: outcome.events,
            allocs: outcome.allocs,
            frees: outcome.frees,
            steps: outcome.steps,
            bytes_requested: outcome.bytes_requested,
            live_bytes_end: outcome.live_bytes_end,
            peak_live_bytes: outcome.peak_live_bytes,
        },
        stats: stats.to_torch_map(),
        oom: outcome.oom.clone(),
        summary: GpuSummary {
            peak_reserved: outcome.peak_reserved,
            peak_allocated: stats.all().allocated_bytes.peak as u64,
            allocated_at_peak_reserved: outcome.allocated_at_peak_reserved,
            fragmentation_at_peak: outcome.fragmentation_at_peak(),
            utilization: if outcome.peak_reserved > 0 { stats.all().allocated_bytes.peak as f64 / outcome.peak_reserved as f64 } else { 0.0 },
            overhead: outcome.overhead(),
            largest_free_block_end: alloc.largest_free_block(),
            device_mallocs: stats.num_device_alloc,
            device_frees: stats.num_device_free,
            ooms: outcome.ooms,
            last_step: outcome.last_step,
            interrupted: outcome.interrupted,
            elapsed_s: outcome.elapsed_s,
            events_per_s: outcome.events_per_s(),
            device_time_s: alloc.device_time_ns().filter(|_| built.reports_device_time).map(|ns| ns as f64 / 1e9),
            syncs: crate::gpu::devprobe::syncs(stats),
            modelled_alloc_time_s: built.time_model.as_ref().map(|m| m.alloc_time_ns(alloc.device_time_ns().unwrap_or(0), stats) as f64 / 1e9),
        },
        timeline: outcome.timeline,
        segments_at_peak: outcome.segments_at_peak,
        segments_at_oom: outcome.segments_at_oom,
        size_histogram: outcome.size_histogram,
    })
}

/// [`run_one`] on a source, as `allocbench replay` runs it: the input's sha256 (the record's
/// `workload`) is computed on another thread while the events replay, so hashing a large trace
/// adds nothing to the replay's time.
pub fn run_hashing_alongside(
    built: &mut Built,
    conf: &AllocatorConfig,
    source: &Source,
    opts: &ReplayOptions,
    watch: &mut dyn Observer<dyn GpuAllocator>,
) -> anyhow::Result<GpuRunResult> {
    let events = source.events()?;
    std::thread::scope(|scope| {
        let info = scope.spawn(|| source.info());
        let pending =
            WorkloadInfo { name: String::new(), kind: String::new(), origin: String::new(), sha256: String::new(), seed: None, description: String::new() };
        let replayed = run_one(built, conf, events, pending, opts, watch);
        let info = info.join().map_err(|_| anyhow::anyhow!("hashing the input failed"))?;
        let mut result = replayed?;
        result.workload = info?;
        Ok(result)
    })
}

/// A human summary of one replay.
pub fn describe(r: &GpuRunResult) -> String {
    let mut s = String::new();
    let w = &r.work;
    let sm = &r.summary;
    let st = |k: &str| r.stats.get(k).copied().unwrap_or(0);
    use crate::units::count;
    s += &format!(
        "workload    {} ({}), {}: {}, {}, {}\n",
        r.workload.name,
        r.workload.kind,
        count(w.events, "event"),
        count(w.allocs, "alloc"),
        count(w.frees, "free"),
        count(w.steps, "step")
    );
    s += &format!(
        "allocator   {}{}  on {}\n",
        r.allocator,
        if r.allocator.takes_conf() { format!(" [{}]", r.allocator.conf_or(&r.conf, "default conf")) } else { String::new() },
        r.device
    );
    s += &format!("peak live   {}   (what the workload holds at once)\n", format_bytes(w.peak_live_bytes));
    s += &format!("peak reserved {}  = {:.3} x peak live;  peak allocated {}\n", format_bytes(sm.peak_reserved), sm.overhead, format_bytes(sm.peak_allocated));
    s += &format!(
        "fragmentation at peak reserved {:.1} %  (1 - allocated/reserved); utilization {:.1} %\n",
        100.0 * sm.fragmentation_at_peak,
        100.0 * sm.utilization
    );
    s += &format!(
        "device mallocs {}  frees {}  retries {}  OOMs {}  largest free block at end {}\n",
        sm.device_mallocs,
        sm.device_frees,
        st("num_alloc_retries"),
        st("num_ooms"),
        format_bytes(sm.largest_free_block_end)
    );
    match &r.oom {
        Some(o) => {
            s += &format!(
                "OOM         at event {} (step {}): {} requested ({} rounded); cause: {}; {} free in the cache (largest block {}), {}\n",
                o.event,
                o.step,
                format_bytes(o.requested),
                format_bytes(o.rounded),
                o.cause,
                format_bytes(o.cached_free),
                format_bytes(o.largest_free_block),
                o.device_free_phrase()
            );
        }
        None => {
            // Under per_process_memory_fraction the allocator's limit is the cap, not the device.
            let cap = if r.allocator.takes_conf() { AllocatorConfig::parse(&r.conf).ok().and_then(|c| c.allowed_bytes(r.capacity)) } else { None };
            match cap {
                Some(cap) if sm.peak_reserved > cap => {
                    s += &format!(
                        "no OOM      peak reserved is {} over the {} cap of per_process_memory_fraction ({})\n",
                        format_bytes(sm.peak_reserved - cap),
                        format_bytes(cap),
                        crate::results::gpu::OVER_CAP_WHY
                    )
                }
                Some(cap) => {
                    s += &format!(
                        "no OOM      headroom at peak: {} under the {} cap of per_process_memory_fraction\n",
                        format_bytes(cap - sm.peak_reserved),
                        format_bytes(cap)
                    )
                }
                None => s += &format!("no OOM      headroom at peak: {}\n", format_bytes(r.capacity.saturating_sub(sm.peak_reserved))),
            }
        }
    }
    if sm.interrupted {
        s += "interrupted (Ctrl-C): the numbers cover the events replayed so far\n";
    }
    if let Some(t) = sm.device_time_s {
        let how = if r.backend == Backend::Cuda { "measured on the GPU" } else { "modelled from --sim-latency" };
        s += &format!("device time {t:.3} s in allocation calls ({how})\n");
    }
    if let Some(t) = sm.modelled_alloc_time_s {
        s += &format!("alloc time  {t:.3} s modelled: device calls by size, {} syncs, the cached path per malloc/free\n", sm.syncs);
    }
    s += &format!("speed       {:.2} M events/s ({:.3} s)\n", sm.events_per_s / 1e6, sm.elapsed_s);
    s
}

/// One line per allocator × conf, for `allocbench run` and the demo: the numbers first, the
/// conf whole at the end of the line, and a legend under the table.
pub fn comparison_table(rows: &[GpuRunResult]) -> String {
    let mut s = format!(
        "{:<10} {:>10} {:>10} {:>9} {:>11} {:>11} {:>7} {:>14}  {}\n",
        "allocator", "peak rsvd", "peak alloc", "rsvd/live", "free@peak", "dev mallocs", "retries", "OOM (step)", "conf"
    );
    for r in rows {
        let oom = match &r.oom {
            Some(o) => format!("{} ({})", o.cause, o.step),
            None => "-".into(),
        };
        let line = format!(
            "{:<10} {:>10} {:>10} {:>9.3} {:>11} {:>11} {:>7} {:>14}  {}",
            r.allocator.to_string(),
            format_bytes(r.summary.peak_reserved),
            format_bytes(r.summary.peak_allocated),
            r.summary.overhead,
            format_bytes(r.summary.peak_reserved.saturating_sub(r.summary.allocated_at_peak_reserved)),
            r.summary.device_mallocs,
            r.stats.get("num_alloc_retries").copied().unwrap_or(0),
            oom,
            r.allocator.conf_or(&r.conf, "(default)")
        );
        s += line.trim_end();
        s += "\n";
    }
    s += "peak rsvd: the most reserved (cudaMalloc'd) at once; peak alloc: the most in live blocks; rsvd/live: peak rsvd over \
          the live bytes' peak (1.000 = no overhead); free@peak: reserved but not allocated at the moment of peak rsvd (mostly \
          cached segments then, not lost); dev mallocs: cudaMalloc calls; retries: num_alloc_retries (cache freed to retry).\n";
    s
}

/// Replays materialised events through PyTorch's policy on a simulated device priced with the
/// default time table (the many replays of `diagnose`'s capacity search); Ctrl-C stops it.
pub fn replay_sim(
    events: &[Event],
    addresses: &[(u64, u64)],
    conf: &AllocatorConfig,
    capacity: u64,
    withheld: u64,
    on_oom: OnOom,
) -> anyhow::Result<(ReplayOutcome, CachingAllocator<WithLatency<Withheld<AddressReplay>>>)> {
    let mut a = pytorch_on_sim(conf, capacity, withheld, &LatencyModel::h100(), addresses);
    let out =
        replay_watched(&mut a, events.iter().copied().map(Ok), &ReplayOptions { on_oom, ..Default::default() }, &mut StopWhen(crate::interrupt::interrupted))?;
    Ok((out, a))
}
