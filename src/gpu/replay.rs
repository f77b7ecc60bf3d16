//! Replays an event stream through a GPU allocator and measures it.
//!
//! Every allocator sees the identical stream: with `--on-oom continue` a failed allocation is
//! remembered and its later free skipped, so an OOM never reshapes the stream.

use std::time::Instant;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{AllocError, GpuAllocator, Handle};
use crate::error::InputError;
use crate::event::Event;
pub use crate::results::OnOom;
use crate::results::{OomRecord, SegmentSnapshot, TimelinePoint};

pub struct ReplayOptions {
    pub on_oom: OnOom,
    /// Also sample the timeline every N events (besides every step).
    pub sample_every_events: Option<u64>,
    /// The timeline is thinned (every other point dropped) whenever it reaches twice this.
    pub max_timeline_points: usize,
    pub progress: Option<indicatif::ProgressBar>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { on_oom: OnOom::Stop, sample_every_events: None, max_timeline_points: 2000, progress: None }
    }
}

/// What a replay measured.
#[derive(Debug, Clone, Default)]
pub struct ReplayOutcome {
    pub events: u64,
    pub allocs: u64,
    pub frees: u64,
    pub steps: u64,
    pub last_step: u64,
    pub bytes_requested: u64,
    pub live_bytes_end: u64,
    pub peak_live_bytes: u64,
    pub peak_reserved: u64,
    pub allocated_at_peak_reserved: u64,
    pub ooms: u64,
    pub oom: Option<OomRecord>,
    pub interrupted: bool,
    pub elapsed_s: f64,
    pub timeline: Vec<TimelinePoint>,
    pub segments_at_peak: Vec<SegmentSnapshot>,
    /// The segment map at the first OOM (empty without one).
    pub segments_at_oom: Vec<SegmentSnapshot>,
    /// (smallest size of the log2 bucket, allocations in it).
    pub size_histogram: Vec<(u64, u64)>,
}

impl ReplayOutcome {
    pub fn events_per_s(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.events as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    /// 1 − allocated/reserved at peak reserved.
    pub fn fragmentation_at_peak(&self) -> f64 {
        if self.peak_reserved == 0 {
            0.0
        } else {
            1.0 - self.allocated_at_peak_reserved as f64 / self.peak_reserved as f64
        }
    }

    /// Peak reserved ÷ peak live bytes (1.0 is the physical limit).
    pub fn overhead(&self) -> f64 {
        if self.peak_live_bytes == 0 {
            0.0
        } else {
            self.peak_reserved as f64 / self.peak_live_bytes as f64
        }
    }
}

/// Events between snapshots of the segment map when reserved keeps reaching new peaks.
const SNAPSHOT_GAP_EVENTS: u64 = 50_000;
const CHECK_EVERY_EVENTS: u64 = 1 << 16;

/// Replays `events` through `alloc`. Bad input (a free of an id that is not live) is an error
/// naming the event; an OOM is a result.
pub fn replay<A: GpuAllocator + ?Sized>(
    alloc: &mut A,
    events: impl Iterator<Item = anyhow::Result<Event>>,
    opts: &ReplayOptions,
) -> anyhow::Result<ReplayOutcome> {
    replay_with_hook(alloc, events, opts, &mut |_, _, _| {})
}

/// [`replay`], calling `at_step(n, event_index, stats)` at every `step` marker, before it takes
/// effect (the state after all earlier events), and once more at the end with `n = u64::MAX`.
pub fn replay_with_hook<A: GpuAllocator + ?Sized>(
    alloc: &mut A,
    events: impl Iterator<Item = anyhow::Result<Event>>,
    opts: &ReplayOptions,
    at_step: &mut dyn FnMut(u64, u64, &crate::gpu::stats::DeviceStats),
) -> anyhow::Result<ReplayOutcome> {
    let start = Instant::now();
    let mut out = ReplayOutcome::default();
    let mut handles: FxHashMap<u64, (Handle, u64)> = FxHashMap::default();
    let mut failed: FxHashSet<u64> = FxHashSet::default();
    let mut live: u64 = 0;
    let mut step: u64 = 0;
    let mut stride_steps: u64 = 1;
    let mut stride_events = opts.sample_every_events.unwrap_or(0);
    let mut last_snapshot_event: Option<u64> = None;
    let mut snapshot_pending = false;
    let mut index: u64 = 0;
    let mut sizes = SizeHistogram::default();

    // Peaks since the last sample, so a per-step timeline shows each step's high-water mark.
    let sample = |a: &A, index: u64, step: u64, live: u64, interval: &mut (u64, u64)| {
        let s = a.stats();
        let (allocated, reserved) = (s.allocated_bytes.all.current as u64, s.reserved_bytes.all.current as u64);
        let p = TimelinePoint {
            event: index,
            step,
            allocated,
            reserved,
            active: s.active_bytes.all.current as u64,
            live,
            allocated_max: interval.0.max(allocated),
            reserved_max: interval.1.max(reserved),
        };
        *interval = (allocated, reserved);
        p
    };
    let mut interval = (0u64, 0u64);
    out.timeline.push(sample(alloc, 0, 0, 0, &mut interval));

    for ev in events {
        let ev = ev?;
        match ev {
            Event::Alloc { id, bytes, stream } => {
                out.allocs += 1;
                out.bytes_requested += bytes;
                sizes.record(bytes);
                match alloc.malloc(bytes, stream) {
                    Ok(h) => {
                        if handles.insert(id, (h, bytes)).is_some() {
                            return Err(InputError::new(format!("event {index}"), format!("alloc of id {id}, which is still live")).into());
                        }
                        live += bytes;
                        out.peak_live_bytes = out.peak_live_bytes.max(live);
                        let s = alloc.stats();
                        let reserved = s.reserved_bytes.all.current as u64;
                        // Fragmentation at peak reserved uses the fullest moment of the peak
                        // plateau: the most that was allocated while reserved stood at its peak.
                        let allocated = s.allocated_bytes.all.current as u64;
                        interval.0 = interval.0.max(allocated);
                        interval.1 = interval.1.max(reserved);
                        if reserved > out.peak_reserved {
                            snapshot_pending = true;
                            out.peak_reserved = reserved;
                            out.allocated_at_peak_reserved = allocated;
                        } else if reserved == out.peak_reserved && allocated > out.allocated_at_peak_reserved {
                            out.allocated_at_peak_reserved = allocated;
                        }
                        if snapshot_pending && last_snapshot_event.is_none_or(|e| index - e >= SNAPSHOT_GAP_EVENTS) {
                            out.segments_at_peak = alloc.segments();
                            last_snapshot_event = Some(index);
                            snapshot_pending = false;
                        }
                    }
                    Err(AllocError::OutOfMemory(info)) => {
                        out.ooms += 1;
                        if out.oom.is_none() {
                            out.segments_at_oom = alloc.segments();
                            out.oom = Some(OomRecord {
                                event: index,
                                step,
                                requested: info.requested,
                                rounded: info.rounded,
                                alloc_size: info.alloc_size,
                                cached_free: info.cached_free,
                                device_free: info.device_free,
                                largest_free_block: info.largest_free_block,
                                reserved: info.reserved,
                                allocated: info.allocated,
                                cause: info.cause(),
                            });
                        }
                        if opts.on_oom == OnOom::Stop {
                            out.events = index + 1;
                            break;
                        }
                        failed.insert(id);
                    }
                    Err(AllocError::Device(e)) => {
                        anyhow::bail!("device error at event {index}: {e}")
                    }
                }
            }
            Event::Free { id } => {
                out.frees += 1;
                match handles.remove(&id) {
                    Some((h, bytes)) => {
                        alloc.free(h).map_err(|e| anyhow::anyhow!("device error at event {index}: {e}"))?;
                        live -= bytes;
                    }
                    None => {
                        if !failed.remove(&id) {
                            return Err(InputError::new(format!("event {index}"), format!("free of id {id}, which is not live")).into());
                        }
                    }
                }
            }
            Event::EmptyCache => alloc.empty_cache().map_err(|e| anyhow::anyhow!("device error at event {index}: {e}"))?,
            Event::Step { n } => {
                at_step(n, index, alloc.stats());
                out.steps += 1;
                if snapshot_pending {
                    out.segments_at_peak = alloc.segments();
                    last_snapshot_event = Some(index);
                    snapshot_pending = false;
                }
                if out.steps.is_multiple_of(stride_steps) {
                    out.timeline.push(sample(alloc, index, step, live, &mut interval));
                }
                step = n;
            }
        }
        index += 1;
        if stride_events > 0 && index.is_multiple_of(stride_events) {
            out.timeline.push(sample(alloc, index, step, live, &mut interval));
        }
        if out.timeline.len() >= 2 * opts.max_timeline_points.max(1) {
            // Merge neighbours, keeping each pair's later values and both pairs' peaks.
            let thinned: Vec<TimelinePoint> = out
                .timeline
                .chunks(2)
                .map(|c| {
                    let mut p = *c.last().expect("non-empty chunk");
                    p.allocated_max = c.iter().map(|q| q.allocated_max).max().unwrap_or(0);
                    p.reserved_max = c.iter().map(|q| q.reserved_max).max().unwrap_or(0);
                    p
                })
                .collect();
            out.timeline = thinned;
            stride_steps *= 2;
            stride_events *= 2;
        }
        if index.is_multiple_of(CHECK_EVERY_EVENTS) {
            if let Some(pb) = &opts.progress {
                pb.set_position(index);
            }
            if crate::interrupt::interrupted() {
                out.interrupted = true;
                break;
            }
        }
    }
    if out.events == 0 {
        out.events = index;
    }
    at_step(u64::MAX, out.events, alloc.stats());
    if snapshot_pending || out.segments_at_peak.is_empty() {
        out.segments_at_peak = alloc.segments();
    }
    out.timeline.push(sample(alloc, out.events, step, live, &mut interval));
    out.last_step = step;
    out.live_bytes_end = live;
    out.size_histogram = sizes.buckets();
    out.elapsed_s = start.elapsed().as_secs_f64();
    Ok(out)
}

/// Log2 size buckets for the histogram: bucket k holds sizes in [2^k, 2^(k+1)).
#[derive(Debug, Clone)]
pub struct SizeHistogram {
    pub counts: [u64; 64],
}

impl Default for SizeHistogram {
    fn default() -> Self {
        SizeHistogram { counts: [0; 64] }
    }
}

impl SizeHistogram {
    #[inline]
    pub fn record(&mut self, bytes: u64) {
        self.counts[bytes.max(1).ilog2() as usize] += 1;
    }

    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(k, &c)| (1u64 << k, c)).collect()
    }
}
