//! Replays an event stream through a GPU allocator: a small loop that feeds events to the policy
//! and tells [`Observer`]s (`replay/observer.rs`) what happened. What a replay measures is the
//! observers' business (`replay/observers.rs`: peak, segment map at the peak, timeline, first
//! OOM, size histogram); progress bars and Ctrl-C are observers the commands add.
//!
//! Every allocator sees the identical stream: with `--on-oom continue` a failed allocation is
//! remembered and its later free skipped, so an OOM never reshapes the stream.

mod observer;
mod observers;

use std::time::Instant;

use rustc_hash::FxHashSet;

use super::devprobe::LatencyModel;
use super::stats::DeviceStats;
use super::{AllocError, GpuAllocator};
use crate::error::InputError;
use crate::event::{Event, PoolOp};
use crate::ids::Slot;
pub use crate::results::OnOom;
use crate::results::{OomRecord, SegmentSnapshot, TimelinePoint};
pub use observer::{At, Call, Coarse, Observer};
pub use observers::{AtStep, BlockOwners, FirstOom, Peak, SegmentsAtPeak, SizeHistogram, StopWhen, Timeline};

#[derive(Clone)]
pub struct ReplayOptions {
    pub on_oom: OnOom,
    /// Also sample the timeline every N events (besides every step).
    pub sample_every_events: Option<u64>,
    /// The timeline is thinned (every other point dropped) whenever it reaches twice this.
    pub max_timeline_points: usize,
    /// Prices the timeline's per-step allocator time (`run_one` sets the built device's model).
    pub time_model: Option<LatencyModel>,
    /// The segment map at exactly the peak moment where the allocator forks (what a results
    /// record holds: `run_one` sets it), not near it ([`SegmentsAtPeak`]).
    pub exact_peak_map: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { on_oom: OnOom::Stop, sample_every_events: None, max_timeline_points: 2000, time_model: None, exact_peak_map: false }
    }
}

/// Events between checkpoints (progress, Ctrl-C).
pub const CHECK_EVERY_EVENTS: u64 = 1 << 16;

/// The core loop: replays `events` through `alloc`, telling `obs` what happens. It fills the
/// work columns of the outcome (events, allocs, frees, steps, bytes, live bytes, OOM count,
/// interruption, time); the rest is the observers' (see [`replay_watched`]). Bad input (a free
/// of an id that is not live) is an error naming the event; an OOM is a result.
pub fn replay_observed<A: GpuAllocator + ?Sized, O: Observer<A>>(
    alloc: &mut A,
    events: impl Iterator<Item = anyhow::Result<Event>>,
    on_oom: OnOom,
    obs: &mut O,
) -> anyhow::Result<ReplayOutcome> {
    let start = Instant::now();
    let mut out = ReplayOutcome::default();
    let mut handles: crate::ids::IdMap<Live> = crate::ids::IdMap::default();
    let mut failed: FxHashSet<u64> = FxHashSet::default();
    // Live 0-byte allocations: null pointers that never reached the allocator.
    let mut null: FxHashSet<u64> = FxHashSet::default();
    let mut at = At::default();
    obs.start(alloc);
    // The event count after which the loop next looks: an observer's after_event is due, or a
    // checkpoint.
    let mut wake = obs.after_event_due(0).min(next_multiple_above(0, CHECK_EVERY_EVENTS));
    for ev in events {
        let ev = ev?;
        // Allocations and frees are nearly every event: tested first, each by a branch of its
        // own (a jump table over every kind of event mispredicted at most alloc/free turns).
        if let Event::Alloc { id, bytes, stream } = ev {
            out.allocs += 1;
            // Requests reach 1 EiB (units::MAX_REQUEST_BYTES): the sum may pass u64.
            out.bytes_requested = out.bytes_requested.saturating_add(bytes);
            if bytes == 0 {
                // NativeCachingAllocator::allocate (c10/cuda/CUDACachingAllocator.cpp):
                // malloc only `if (size != 0)`; the null pointer touches no stat.
                if handles.contains(id) || !null.insert(id) {
                    return Err(bad_id(at, "alloc", id, "is still live"));
                }
            } else if !null.is_empty() && null.contains(&id) {
                return Err(bad_id(at, "alloc", id, "is still live"));
            } else {
                let answer = alloc.malloc(bytes, stream);
                obs.called(alloc, Call::Malloc { bytes, stream, handle: answer.as_ref().ok().copied() });
                match answer {
                    Ok(h) => {
                        if !handles.insert(id, Live { handle: h, bytes }) {
                            return Err(bad_id(at, "alloc", id, "is still live"));
                        }
                        at.live += bytes;
                        out.peak_live_bytes = out.peak_live_bytes.max(at.live);
                        obs.placed(alloc, id, h);
                        obs.allocated(alloc, alloc.stats(), at, bytes);
                    }
                    Err(AllocError::OutOfMemory(info)) => {
                        out.ooms += 1;
                        obs.out_of_memory(alloc, at, bytes, &info);
                        if on_oom == OnOom::Stop {
                            out.events = at.index + 1;
                            break;
                        }
                        failed.insert(id);
                    }
                    Err(AllocError::Device(e)) => {
                        anyhow::bail!("device error at event {}: {e}", at.index)
                    }
                }
            }
        } else if let Event::Free { id } = ev {
            out.frees += 1;
            // Freeing a null pointer does nothing (the allocator's free returns at `!ptr`).
            // (The sets are empty in almost every trace: skip the hash then.)
            if null.is_empty() || !null.remove(&id) {
                let live = handles.take(id);
                if !live.is_empty() {
                    alloc.free(live.handle).map_err(|e| anyhow::anyhow!("device error at event {}: {e}", at.index))?;
                    obs.called(alloc, Call::Free(live.handle));
                    at.live -= live.bytes;
                } else if failed.is_empty() || !failed.remove(&id) {
                    return Err(bad_id(at, "free", id, "is not live"));
                }
            }
        } else {
            other_event(ev, alloc, obs, &handles, &null, &failed, &mut at, &mut out)?;
            // (After these events observers hear `after_event`: their dues may have moved.)
            wake = 0;
        }
        at.index += 1;
        // One test per event for the observers' after_event and the checkpoints: most events
        // need neither. (after_event also comes at checkpoints: a call before it is due is
        // allowed, and rare.)
        if at.index >= wake {
            obs.after_event(alloc, at);
            if at.index.is_multiple_of(CHECK_EVERY_EVENTS) && obs.checkpoint(at.index) {
                out.interrupted = true;
                break;
            }
            wake = obs.after_event_due(at.index).min(next_multiple_above(at.index, CHECK_EVERY_EVENTS));
        }
    }
    if out.events == 0 {
        out.events = at.index;
    }
    obs.finish(alloc, At { index: out.events, ..at });
    out.last_step = at.step;
    out.live_bytes_end = at.live;
    out.elapsed_s = start.elapsed().as_secs_f64();
    Ok(out)
}

/// The first multiple of `every` above `events` (an observer's next due count, a checkpoint's).
#[inline(always)]
pub fn next_multiple_above(events: u64, every: u64) -> u64 {
    (events / every + 1).saturating_mul(every)
}

/// The events other than allocations and frees (which the loop tests first). Inline: called out
/// of line, it made the loop copy every event to the stack to pass it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn other_event<A: GpuAllocator + ?Sized, O: Observer<A>>(
    ev: Event,
    alloc: &mut A,
    obs: &mut O,
    handles: &crate::ids::IdMap<Live>,
    null: &FxHashSet<u64>,
    failed: &FxHashSet<u64>,
    at: &mut At,
    out: &mut ReplayOutcome,
) -> anyhow::Result<()> {
    match ev {
        Event::EmptyCache => {
            alloc.empty_cache().map_err(|e| anyhow::anyhow!("device error at event {}: {e}", at.index))?;
            obs.called(alloc, Call::EmptyCache);
        }
        Event::RecordStream { id, stream } => match handles.get(id) {
            Some(Live { handle, .. }) => {
                alloc.record_stream(handle, stream);
                obs.called(alloc, Call::RecordStream { handle, stream });
            }
            // A null pointer or an allocation that failed (--on-oom continue): nothing to use.
            None if null.contains(&id) || failed.contains(&id) => {}
            None => return Err(bad_id(*at, "record_stream", id, "is not live")),
        },
        Event::Sync { stream } => {
            alloc.sync(stream);
            obs.called(alloc, Call::Sync(stream));
        }
        Event::Pool(op) => {
            pool_call(alloc, op, at.index)?;
            obs.called(alloc, Call::Pool(op));
        }
        Event::Step { n } => {
            // (Readers say so at the line or field; this guards every other source.)
            crate::event::check_step_order((out.steps > 0).then_some(at.step), n).map_err(|m| InputError::new(format!("event {}", at.index), m))?;
            obs.step(alloc, *at, n);
            out.steps += 1;
            at.step = n;
        }
        // (The replay loop's own.)
        Event::Alloc { .. } | Event::Free { .. } => {}
    }
    Ok(())
}

/// The input error of an event at `at` whose id is in the wrong state: "alloc of id 7, which is
/// still live".
#[cold]
fn bad_id(at: At, what: &str, id: u64, state: &str) -> anyhow::Error {
    InputError::new(format!("event {}", at.index), format!("{what} of id {id}, which {state}")).into()
}

/// A live allocation of the trace: the allocator's handle and the bytes asked for (more than 0:
/// a 0-byte allocation is a null pointer that never reaches the allocator).
#[derive(Clone, Copy, PartialEq)]
struct Live {
    handle: super::Handle,
    bytes: u64,
}

impl Slot for Live {
    const EMPTY: Self = Live { handle: super::NULL_HANDLE, bytes: 0 };

    /// A live allocation has bytes.
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    #[inline(always)]
    fn clear(&mut self) {
        self.bytes = 0;
    }
}

/// The allocator call of a private-pool row at event `index`: a call PyTorch would refuse is an
/// input error naming the event, a failed cache flush a device error.
fn pool_call<A: GpuAllocator + ?Sized>(alloc: &mut A, op: PoolOp, index: u64) -> anyhow::Result<()> {
    let refused = |m: String| anyhow::Error::from(InputError::new(format!("event {index}"), m));
    match op {
        PoolOp::Begin { pool, stream } => alloc.begin_allocate_to_pool(pool, stream).map_err(refused),
        PoolOp::Join { pool, stream } => alloc.join_pool(pool, stream).map_err(refused),
        PoolOp::End { pool } => alloc.end_allocate_to_pool(pool).map_err(refused),
        PoolOp::Release { pool } => alloc.release_pool(pool).map_err(refused),
        PoolOp::EmptyCache { pool } => alloc.empty_pool_cache(pool).map_err(|e| anyhow::anyhow!("device error at event {index}: {e}")),
        PoolOp::UseOnOom { pool } => alloc.use_pool_on_oom(pool).map_err(refused),
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

/// Replays `events` through `alloc` with the standard measurements (see [`replay_watched`]).
pub fn replay<A: GpuAllocator + ?Sized>(
    alloc: &mut A,
    events: impl Iterator<Item = anyhow::Result<Event>>,
    opts: &ReplayOptions,
) -> anyhow::Result<ReplayOutcome> {
    replay_watched(alloc, events, opts, &mut ())
}

/// Replays `events` through `alloc` with the standard observers (peak, segment map at the peak,
/// timeline, first OOM, size histogram) and `watch`, the caller's (progress, Ctrl-C, ...), which
/// sees steps, OOMs, checkpoints and the ends ([`Coarse`]) but not every event.
pub fn replay_watched<A: GpuAllocator + ?Sized, W: Observer<A> + ?Sized>(
    alloc: &mut A,
    events: impl Iterator<Item = anyhow::Result<Event>>,
    opts: &ReplayOptions,
    watch: &mut W,
) -> anyhow::Result<ReplayOutcome> {
    let mut segments = if opts.exact_peak_map { SegmentsAtPeak::exact() } else { SegmentsAtPeak::default() };
    let mut timeline = Timeline::new(opts.sample_every_events, opts.max_timeline_points, opts.time_model.clone());
    let mut first_oom = FirstOom::default();
    let mut sizes = SizeHistogram::default();
    let mut out = replay_observed(alloc, events, opts.on_oom, &mut (&mut segments, &mut timeline, &mut first_oom, &mut sizes, Coarse(watch)))?;
    out.peak_reserved = segments.peak.reserved;
    out.allocated_at_peak_reserved = segments.peak.allocated_at_peak;
    out.oom = first_oom.record;
    out.timeline = timeline.points;
    out.segments_at_peak = segments.segments;
    out.segments_at_oom = first_oom.segments;
    out.size_histogram = sizes.buckets();
    Ok(out)
}

/// [`replay`], calling `at_step(n, event_index, stats)` at every `step` marker (see [`AtStep`]).
pub fn replay_with_hook<A: GpuAllocator + ?Sized>(
    alloc: &mut A,
    events: impl Iterator<Item = anyhow::Result<Event>>,
    opts: &ReplayOptions,
    at_step: &mut dyn FnMut(u64, u64, &DeviceStats),
) -> anyhow::Result<ReplayOutcome> {
    replay_watched(alloc, events, opts, &mut AtStep(at_step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::baseline::IdealAllocator;

    /// An id in the wrong state is an input error naming the event, for sized and 0-byte
    /// allocations alike.
    #[test]
    fn ids_in_the_wrong_state_are_errors_naming_the_event() {
        let alloc = |id, bytes| Event::Alloc { id, bytes, stream: 0 };
        let cases: [(Vec<Event>, &str); 6] = [
            (vec![alloc(1, 512), alloc(1, 512)], "event 1: alloc of id 1, which is still live"),
            // A second free finds the slot the first emptied (its page kept by id 2).
            (vec![alloc(1, 512), alloc(2, 512), Event::Free { id: 1 }, Event::Free { id: 1 }], "event 3: free of id 1, which is not live"),
            (vec![alloc(1, 0), alloc(1, 0)], "event 1: alloc of id 1, which is still live"),
            (vec![alloc(1, 0), alloc(1, 512)], "event 1: alloc of id 1, which is still live"),
            (vec![alloc(1, 512), Event::Free { id: 2 }], "event 1: free of id 2, which is not live"),
            (vec![Event::RecordStream { id: 9, stream: 1 }], "event 0: record_stream of id 9, which is not live"),
        ];
        for (events, want) in cases {
            let err = replay(&mut IdealAllocator::new(1 << 30), events.into_iter().map(Ok), &ReplayOptions::default()).unwrap_err();
            assert_eq!(err.to_string(), want);
        }
    }

    /// Records the event counts at which it hears after_event and checkpoint; due every `every`.
    struct Schedule {
        every: u64,
        after: Vec<u64>,
        checkpoints: Vec<u64>,
    }

    impl<A: GpuAllocator + ?Sized> Observer<A> for Schedule {
        fn after_event(&mut self, _alloc: &A, at: At) {
            self.after.push(at.index);
        }
        fn after_event_due(&self, events: u64) -> u64 {
            next_multiple_above(events, self.every)
        }
        fn checkpoint(&mut self, events: u64) -> bool {
            self.checkpoints.push(events);
            false
        }
    }

    /// The loop calls after_event when it is due and after each event other than an
    /// allocation or a free (where an observer's due may move), and nowhere else but at
    /// checkpoints; an observer that asks for none hears none.
    #[test]
    fn after_event_comes_when_due_after_other_events_and_at_checkpoints() {
        let n = CHECK_EVERY_EVENTS + 10;
        let mut events: Vec<Event> = (0..n / 2).flat_map(|id| [Event::Alloc { id, bytes: 512, stream: 0 }, Event::Free { id }]).collect();
        // (Id 2 is never freed: its free is the step.)
        events[5] = Event::Step { n: 1 };
        let replayed = |every| {
            let mut seen = Schedule { every, after: Vec::new(), checkpoints: Vec::new() };
            replay_observed(&mut IdealAllocator::new(1 << 30), events.iter().copied().map(Ok), OnOom::Stop, &mut seen).unwrap();
            seen
        };
        let seen = replayed(4);
        // (The checkpoint's count is a multiple of 4: one call there.)
        assert_eq!(seen.after, (1..=n).filter(|&i| i % 4 == 0 || i == 6).collect::<Vec<_>>());
        assert_eq!(seen.checkpoints, [CHECK_EVERY_EVENTS]);
        // Due never: only the step's event and the checkpoint.
        assert_eq!(replayed(u64::MAX).after, [6, CHECK_EVERY_EVENTS]);
    }

    /// Events that did not come through a reader (a library caller's) are checked here too.
    #[test]
    fn steps_going_back_are_an_error_naming_the_event() {
        let events = [Event::Step { n: 3 }, Event::Alloc { id: 1, bytes: 512, stream: 0 }, Event::Step { n: 3 }];
        let err = replay(&mut IdealAllocator::new(1 << 30), events.into_iter().map(Ok), &ReplayOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "event 2: step 3 after step 3: step numbers must increase");
        let increasing = [Event::Step { n: 0 }, Event::Step { n: 1 }];
        assert_eq!(replay(&mut IdealAllocator::new(1 << 30), increasing.into_iter().map(Ok), &ReplayOptions::default()).unwrap().steps, 2);
    }
}
