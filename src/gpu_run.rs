//! GPU runs: the allocator registry, one replay turned into a results record, and comparisons.

use crate::error::InputError;
use crate::gpu::baseline::{IdealAllocator, NoCacheAllocator};
use crate::gpu::caching::CachingAllocator;
use crate::gpu::config::AllocatorConfig;
use crate::gpu::device::SimDevice;
use crate::gpu::replay::{replay, OnOom, ReplayOptions};
use crate::gpu::GpuAllocator;
pub use crate::results::Backend;
use crate::results::{GpuRunResult, GpuSummary, MachineInfo, WorkDone, SCHEMA_VERSION};
use crate::units::format_bytes;

/// Registered GPU policies: name → what it is.
pub const GPU_ALLOCATORS: &[(&str, &str)] = &[
    ("pytorch", "PyTorch's CUDA caching allocator policy (honours --conf / PYTORCH_CUDA_ALLOC_CONF)"),
    ("nocache", "PYTORCH_NO_CUDA_MEMORY_CACHING: a device malloc/free per tensor"),
    ("ideal", "reserves exactly the live bytes: the physical lower bound"),
    ("async", "CUDA's stream-ordered pool, cuMemAllocAsync/cuMemFreeAsync (--device cuda only)"),
];

/// Builds a policy on the chosen backend; returns it with the backend's name and capacity.
pub fn build_allocator(
    name: &str,
    conf: &AllocatorConfig,
    backend: Backend,
    capacity: Option<u64>,
    sim_latency: Option<&crate::gpu::devprobe::LatencyModel>,
    address_script: Vec<(u64, u64)>,
) -> Result<(Box<dyn GpuAllocator>, Backend, u64), InputError> {
    use crate::gpu::cuda::{AsyncPoolAllocator, CudaDevice};
    use crate::gpu::device::{Device, H100_CAPACITY_BYTES};
    if !GPU_ALLOCATORS.iter().any(|(n, _)| *n == name) {
        return Err(unknown_allocator(name));
    }
    match backend {
        Backend::Sim => {
            if name == "async" {
                return Err(InputError::new("--allocator", "the async pool is CUDA's own allocator: it needs --device cuda"));
            }
            let capacity = capacity.unwrap_or(H100_CAPACITY_BYTES);
            let mut device = SimDevice::new(capacity).with_address_script(address_script);
            if let Some(m) = sim_latency {
                device = device.with_latency(m.clone());
            }
            let a: Box<dyn GpuAllocator> = match name {
                "pytorch" => Box::new(CachingAllocator::new(conf.clone(), device)),
                "nocache" => Box::new(NoCacheAllocator::new(device)),
                _ => Box::new(IdealAllocator::new(capacity)),
            };
            Ok((a, Backend::Sim, capacity))
        }
        Backend::Cuda => {
            if capacity.is_some() {
                return Err(InputError::new("--capacity", "a real GPU has the capacity it has: use per_process_memory_fraction in --conf to cap it"));
            }
            let device = CudaDevice::open(0)?;
            let capacity = device.capacity();
            let a: Box<dyn GpuAllocator> = match name {
                "pytorch" => Box::new(CachingAllocator::new(conf.clone(), device)),
                "nocache" => Box::new(NoCacheAllocator::new(device)),
                "async" => Box::new(AsyncPoolAllocator::new(device).map_err(|e| InputError::new("--device cuda", e.to_string()))?),
                _ => Box::new(IdealAllocator::new(capacity)),
            };
            Ok((a, Backend::Cuda, capacity))
        }
    }
}

pub fn unknown_allocator(name: &str) -> InputError {
    let names: Vec<&str> = GPU_ALLOCATORS.iter().map(|(n, _)| *n).collect();
    InputError::new("--allocator", format!("unknown GPU allocator '{name}' (known: {})", names.join(", ")))
}

/// Replays `source` through one allocator and returns the results record.
pub fn run_one(
    events: crate::event::EventStream<'_>,
    info: crate::results::WorkloadInfo,
    alloc: &mut dyn GpuAllocator,
    conf: &AllocatorConfig,
    capacity: u64,
    opts: &ReplayOptions,
    backend: Backend,
) -> anyhow::Result<GpuRunResult> {
    let outcome = replay(alloc, events, opts)?;
    let stats = alloc.stats();
    let conf_str = if alloc.name() == "pytorch" { conf.source.clone() } else { String::new() };
    Ok(GpuRunResult {
        schema_version: SCHEMA_VERSION,
        allocator: alloc.name(),
        conf: conf_str,
        backend,
        device: alloc.device_description(),
        capacity,
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
            peak_allocated: stats.allocated_bytes.all.peak as u64,
            allocated_at_peak_reserved: outcome.allocated_at_peak_reserved,
            fragmentation_at_peak: outcome.fragmentation_at_peak(),
            utilization: if outcome.peak_reserved > 0 { stats.allocated_bytes.all.peak as f64 / outcome.peak_reserved as f64 } else { 0.0 },
            overhead: outcome.overhead(),
            largest_free_block_end: alloc.largest_free_block(),
            device_mallocs: stats.num_device_alloc,
            device_frees: stats.num_device_free,
            ooms: outcome.ooms,
            last_step: outcome.last_step,
            interrupted: outcome.interrupted,
            elapsed_s: outcome.elapsed_s,
            events_per_s: outcome.events_per_s(),
            device_time_s: alloc.device_time_ns().map(|ns| ns as f64 / 1e9),
        },
        timeline: outcome.timeline,
        segments_at_peak: outcome.segments_at_peak,
        segments_at_oom: outcome.segments_at_oom,
        size_histogram: outcome.size_histogram,
    })
}

/// A human summary of one replay.
pub fn describe(r: &GpuRunResult) -> String {
    let mut s = String::new();
    let w = &r.work;
    let sm = &r.summary;
    let st = |k: &str| r.stats.get(k).copied().unwrap_or(0);
    s += &format!("workload    {} ({}), {} events: {} allocs, {} frees, {} steps\n", r.workload.name, r.workload.kind, w.events, w.allocs, w.frees, w.steps);
    s += &format!(
        "allocator   {}{}  on {}\n",
        r.allocator,
        if r.allocator == "pytorch" { format!(" [{}]", if r.conf.is_empty() { "default conf" } else { &r.conf }) } else { String::new() },
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
                "OOM         at event {} (step {}): {} requested ({} rounded); cause: {}; {} free in the cache (largest block {}), {} free on the device\n",
                o.event,
                o.step,
                format_bytes(o.requested),
                format_bytes(o.rounded),
                o.cause,
                format_bytes(o.cached_free),
                format_bytes(o.largest_free_block),
                format_bytes(o.device_free)
            );
        }
        None => s += &format!("no OOM      headroom at peak: {}\n", format_bytes(r.capacity.saturating_sub(sm.peak_reserved))),
    }
    if sm.interrupted {
        s += "interrupted (Ctrl-C): the numbers cover the events replayed so far\n";
    }
    if let Some(t) = sm.device_time_s {
        let how = if r.backend == Backend::Cuda { "measured on the GPU" } else { "modelled from --sim-latency" };
        s += &format!("device time {t:.3} s in allocation calls ({how})\n");
    }
    s += &format!("speed       {:.2} M events/s ({:.3} s)\n", sm.events_per_s / 1e6, sm.elapsed_s);
    s
}

/// One line per allocator × conf, for `allocbench run` and the demo.
pub fn comparison_table(rows: &[GpuRunResult]) -> String {
    let mut s = format!(
        "{:<10} {:<48} {:>12} {:>12} {:>8} {:>7} {:>9} {:>8} {:>14}\n",
        "allocator", "conf", "peak rsvd", "peak alloc", "rsvd/live", "frag%", "dev mallocs", "retries", "OOM (step)"
    );
    for r in rows {
        let conf = if r.allocator == "pytorch" && r.conf.is_empty() { "(default)".to_string() } else { r.conf.clone() };
        let conf = if conf.chars().count() > 48 { format!("{}…", conf.chars().take(47).collect::<String>()) } else { conf };
        let oom = match &r.oom {
            Some(o) => format!("{} ({})", o.cause, o.step),
            None => "-".into(),
        };
        s += &format!(
            "{:<10} {:<48} {:>12} {:>12} {:>8.3} {:>7.1} {:>11} {:>8} {:>14}\n",
            r.allocator,
            conf,
            format_bytes(r.summary.peak_reserved),
            format_bytes(r.summary.peak_allocated),
            r.summary.overhead,
            100.0 * r.summary.fragmentation_at_peak,
            r.summary.device_mallocs,
            r.stats.get("num_alloc_retries").copied().unwrap_or(0),
            oom
        );
    }
    s
}

/// Options shared by replays started from the CLI.
pub fn replay_options(on_oom: OnOom, sample_every: Option<u64>, progress: Option<indicatif::ProgressBar>) -> ReplayOptions {
    ReplayOptions { on_oom, sample_every_events: sample_every, progress, ..Default::default() }
}
