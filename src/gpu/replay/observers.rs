//! The standard measurements of a replay, one observer per concern.

use rustc_hash::FxHashMap;

use super::observer::{At, Call, Observer};
use crate::gpu::devprobe::LatencyModel;
use crate::gpu::stats::DeviceStats;
use crate::gpu::{GpuAllocator, Handle, OomInfo};
use crate::results::{OomRecord, SegmentSnapshot, TimelinePoint};

/// Allocated and reserved bytes.
#[inline]
fn allocated_reserved(s: &DeviceStats) -> (u64, u64) {
    (s.all().allocated_bytes.current as u64, s.all().reserved_bytes.current as u64)
}

/// Peak reserved, and the allocated bytes at it: the fullest moment of the peak plateau (the most
/// that was allocated while reserved stood at its peak), for fragmentation at peak reserved.
#[derive(Debug, Default)]
pub struct Peak {
    pub reserved: u64,
    pub allocated_at_peak: u64,
}

impl<A: GpuAllocator + ?Sized> Observer<A> for Peak {
    #[inline]
    fn allocated(&mut self, _alloc: &A, stats: &DeviceStats, _at: At, _bytes: u64) {
        let (allocated, reserved) = allocated_reserved(stats);
        if reserved > self.reserved {
            self.reserved = reserved;
            self.allocated_at_peak = allocated;
        } else if reserved == self.reserved && allocated > self.allocated_at_peak {
            self.allocated_at_peak = allocated;
        }
    }
}

/// Events between snapshots of the segment map when reserved keeps reaching new peaks.
const SNAPSHOT_GAP_EVENTS: u64 = 50_000;
/// Events between forks of the allocator, at least: a fork copies the allocator's state (about
/// 0.1 ms for the 1.3B trace's end state, with its free sets' bins), and the map at the peak costs
/// making again the calls from the last fork before it.
const FORK_EVERY_EVENTS: u64 = 1 << 16;
/// A window lasts at least this many times as long as the fork that starts it took: forks of a
/// large state (hundreds of thousands of live blocks) stay a small share of the replay.
const WINDOW_PER_FORK_TIME: u64 = 8;

/// Address → the trace id of the latest allocation placed there.
type AddressIds = FxHashMap<u64, u64>;

/// Peak reserved ([`Peak`]) and the segment map at it. Taking a map costs a walk over every
/// block and the peak moment (the allocation after which reserved stood at its peak with the
/// most allocated) moves thousands of times in a long trace, so a map is not taken at each move:
/// - [`SegmentsAtPeak::exact`], for an allocator that forks ([`GpuAllocator::fork`]): the
///   allocator is forked every `FORK_EVERY_EVENTS` events (or more, [`WINDOW_PER_FORK_TIME`])
///   and the calls made since are kept ([`Call`]); at the end, the fork before the last move
///   makes the calls up to it again and gives the map at exactly that moment. This costs a few
///   percent of the replay.
/// - otherwise (on a real GPU, which cannot fork) a map is taken at most every
///   `SNAPSHOT_GAP_EVENTS` events while the peak keeps moving, and at the next step marker or
///   the end: near the peak, not at it. [`SegmentsAtPeak::with_owners`] takes it at every move
///   instead (exact, slow).
#[derive(Default)]
pub struct SegmentsAtPeak {
    pub peak: Peak,
    pub segments: Vec<SegmentSnapshot>,
    /// With [`SegmentsAtPeak::with_owners`]: the trace id of the allocation in each block of
    /// `segments` (`owners[segment][block]`, `None` for free pieces).
    pub owners: Vec<Vec<Option<u64>>>,
    /// With owners: address → the id of the latest allocation placed there (a segment's blocks
    /// are contiguous from its address, and the latest allocation at an address is the live one).
    by_address: Option<AddressIds>,
    last_snapshot_event: Option<u64>,
    pending: bool,
    /// Events between forks (at least, when `stretch`); 0: no forks.
    fork_every: u64,
    /// Whether windows stretch with the time a fork takes ([`WINDOW_PER_FORK_TIME`]).
    stretch: bool,
    forks: Option<Forks>,
}

/// The allocator forked at the start of a window of events, the calls made since, and with
/// owners the address map then and the ids placed since (one per successful malloc, in order).
struct Window {
    alloc: Box<dyn GpuAllocator>,
    calls: Vec<Call>,
    by_address: AddressIds,
    placed: Vec<u64>,
}

/// The current window, and the window of the latest peak moment, cut right after it.
struct Forks {
    /// The event count at which the next fork is due: the window's start plus its `len`.
    due: u64,
    len: u64,
    started: std::time::Instant,
    current: Window,
    /// (`calls.len()`, `placed.len()`) right after the latest peak moment, when it fell in the
    /// current window.
    peak_in_window: Option<(usize, usize)>,
    at_peak: Option<Window>,
}

impl Forks {
    /// The window ends: keep it if the peak moved in it, and start the next at `fork` (with the
    /// address map now, with owners).
    fn next_window(&mut self, fork: Box<dyn GpuAllocator>, by_address: Option<&AddressIds>) {
        let start = Window { alloc: fork, calls: Vec::new(), by_address: by_address.cloned().unwrap_or_default(), placed: Vec::new() };
        let mut ended = std::mem::replace(&mut self.current, start);
        let spare = match self.peak_in_window.take() {
            Some((calls, placed)) => {
                ended.calls.truncate(calls);
                ended.placed.truncate(placed);
                self.at_peak.replace(ended)
            }
            None => Some(ended),
        };
        // The buffers of the window dropped serve the next (new ones would be paged in afresh).
        if let Some(spare) = spare {
            (self.current.calls, self.current.placed) = (spare.calls, spare.placed);
            self.current.calls.clear();
            self.current.placed.clear();
        }
    }

    /// The segment map right after the latest peak moment and, with owners, the address map
    /// then (`None` when there was no peak moment); `Err` when the fork did not follow the calls.
    fn at_peak(mut self) -> Result<Option<(Vec<SegmentSnapshot>, AddressIds)>, ()> {
        if let Some((calls, placed)) = self.peak_in_window {
            self.current.calls.truncate(calls);
            self.current.placed.truncate(placed);
            self.at_peak = Some(self.current);
        }
        let Some(Window { mut alloc, calls, mut by_address, placed }) = self.at_peak else { return Ok(None) };
        let mut ids = placed.into_iter();
        let owners = ids.len() > 0;
        for call in calls {
            if !call.make(alloc.as_mut()) {
                return Err(());
            }
            if let (Call::Malloc { handle: Some(h), .. }, true) = (call, owners) {
                let id = ids.next().ok_or(())?;
                if let Some(address) = alloc.block_address(h) {
                    by_address.insert(address, id);
                }
            }
        }
        Ok(Some((alloc.segments(), by_address)))
    }
}

/// The trace id of each block of `segments` (`None` for free pieces), by address.
fn owners_of(segments: &[SegmentSnapshot], by_address: &AddressIds) -> Vec<Vec<Option<u64>>> {
    segments
        .iter()
        .map(|s| {
            let mut address = s.address;
            s.blocks
                .iter()
                .map(|b| {
                    let id = if b.is_allocated() { by_address.get(&address).copied() } else { None };
                    address += b.size;
                    id
                })
                .collect()
        })
        .collect()
}

impl SegmentsAtPeak {
    /// The map at exactly the peak moment, where the allocator forks.
    pub fn exact() -> Self {
        SegmentsAtPeak { stretch: true, ..Self::exact_forking_every(FORK_EVERY_EVENTS) }
    }

    /// [`SegmentsAtPeak::exact`], forking the allocator every `events` events (at least 1),
    /// however long a fork takes.
    pub fn exact_forking_every(events: u64) -> Self {
        SegmentsAtPeak { fork_every: events.max(1), ..Default::default() }
    }

    /// Also the trace id of each block of the map ([`SegmentsAtPeak::owners`]): what lets the
    /// memory view name each block's allocation site. Without forks the map is then taken at
    /// every move of the peak (exact).
    pub fn with_owners(self) -> Self {
        SegmentsAtPeak { by_address: Some(FxHashMap::default()), ..self }
    }

    fn take<A: GpuAllocator + ?Sized>(&mut self, alloc: &A, index: u64) {
        alloc.segments_into(&mut self.segments);
        if let Some(by_address) = &self.by_address {
            self.owners = owners_of(&self.segments, by_address);
        }
        self.last_snapshot_event = Some(index);
        self.pending = false;
    }
}

impl<A: GpuAllocator + ?Sized> Observer<A> for SegmentsAtPeak {
    fn start(&mut self, alloc: &A) {
        if self.fork_every > 0 {
            let (len, started) = (self.fork_every, std::time::Instant::now());
            self.forks = alloc.fork().map(|fork| Forks {
                due: len,
                len,
                started,
                current: Window { alloc: fork, calls: Vec::new(), by_address: self.by_address.clone().unwrap_or_default(), placed: Vec::new() },
                peak_in_window: None,
                at_peak: None,
            });
        }
    }

    #[inline]
    fn called(&mut self, _alloc: &A, call: Call) {
        if let Some(forks) = &mut self.forks {
            forks.current.calls.push(call);
        }
    }

    #[inline]
    fn placed(&mut self, alloc: &A, id: u64, handle: Handle) {
        if let Some(by_address) = &mut self.by_address {
            if let Some(address) = alloc.block_address(handle) {
                by_address.insert(address, id);
            }
            if let Some(forks) = &mut self.forks {
                forks.current.placed.push(id);
            }
        }
    }

    #[inline]
    fn allocated(&mut self, alloc: &A, stats: &DeviceStats, at: At, bytes: u64) {
        let before = (self.peak.reserved, self.peak.allocated_at_peak);
        Observer::<A>::allocated(&mut self.peak, alloc, stats, at, bytes);
        if (self.peak.reserved, self.peak.allocated_at_peak) != before {
            if let Some(forks) = &mut self.forks {
                forks.peak_in_window = Some((forks.current.calls.len(), forks.current.placed.len()));
                return;
            }
            self.pending = true;
            if self.by_address.is_some() || self.last_snapshot_event.is_none_or(|e| at.index - e >= SNAPSHOT_GAP_EVENTS) {
                self.take(alloc, at.index);
            }
        }
    }

    #[inline]
    fn after_event(&mut self, alloc: &A, at: At) {
        if let Some(forks) = &mut self.forks {
            if at.index >= forks.due {
                let (replayed, replayed_events) = (forks.started.elapsed(), forks.len);
                let forking = std::time::Instant::now();
                // (An allocator that forked at the start forks again.)
                forks.next_window(alloc.fork().expect("the allocator forked before"), self.by_address.as_ref());
                forks.started = std::time::Instant::now();
                forks.len = self.fork_every;
                if self.stretch {
                    // The events that last WINDOW_PER_FORK_TIME forks, at the last window's pace.
                    let ns_per_event = (replayed.as_nanos() / u128::from(replayed_events)).max(1);
                    let events = WINDOW_PER_FORK_TIME as u128 * forking.elapsed().as_nanos() / ns_per_event;
                    forks.len = forks.len.max(u64::try_from(events).unwrap_or(u64::MAX));
                }
                forks.due = at.index.saturating_add(forks.len);
            }
        }
    }

    #[inline]
    fn after_event_due(&self, _events: u64) -> u64 {
        self.forks.as_ref().map_or(u64::MAX, |f| f.due)
    }

    fn step(&mut self, alloc: &A, at: At, _n: u64) {
        if self.pending {
            self.take(alloc, at.index);
        }
    }

    fn finish(&mut self, alloc: &A, at: At) {
        if let Some(forks) = self.forks.take() {
            match forks.at_peak() {
                Ok(Some((segments, by_address))) => {
                    if self.by_address.is_some() {
                        self.owners = owners_of(&segments, &by_address);
                    }
                    self.segments = segments;
                    return;
                }
                Ok(None) => {}
                // A fork that answers otherwise is a bug of the fork: the map at the end is the
                // best left.
                Err(()) => debug_assert!(false, "a fork of the allocator did not follow the replay's calls"),
            }
        }
        if self.pending || self.segments.is_empty() {
            self.take(alloc, at.index);
        }
    }
}

/// The segment maps at exactly the peak ([`SegmentsAtPeak::exact`] with owners) and at the
/// first OOM, each with the trace id of every live block: what the memory view needs to name
/// allocation sites.
pub struct BlockOwners {
    pub at_peak: SegmentsAtPeak,
    pub at_oom: Vec<SegmentSnapshot>,
    pub oom_owners: Vec<Vec<Option<u64>>>,
    oom_taken: bool,
}

impl Default for BlockOwners {
    fn default() -> Self {
        BlockOwners { at_peak: SegmentsAtPeak::exact().with_owners(), at_oom: Vec::new(), oom_owners: Vec::new(), oom_taken: false }
    }
}

impl<A: GpuAllocator + ?Sized> Observer<A> for BlockOwners {
    fn start(&mut self, alloc: &A) {
        self.at_peak.start(alloc)
    }
    fn called(&mut self, alloc: &A, call: Call) {
        self.at_peak.called(alloc, call)
    }
    fn placed(&mut self, alloc: &A, id: u64, handle: Handle) {
        self.at_peak.placed(alloc, id, handle)
    }
    fn allocated(&mut self, alloc: &A, stats: &DeviceStats, at: At, bytes: u64) {
        self.at_peak.allocated(alloc, stats, at, bytes)
    }
    fn after_event(&mut self, alloc: &A, at: At) {
        self.at_peak.after_event(alloc, at)
    }
    fn after_event_due(&self, events: u64) -> u64 {
        Observer::<A>::after_event_due(&self.at_peak, events)
    }
    fn step(&mut self, alloc: &A, at: At, n: u64) {
        self.at_peak.step(alloc, at, n)
    }
    fn finish(&mut self, alloc: &A, at: At) {
        self.at_peak.finish(alloc, at)
    }
    fn out_of_memory(&mut self, alloc: &A, _at: At, _bytes: u64, _info: &OomInfo) {
        if !self.oom_taken {
            self.oom_taken = true;
            self.at_oom = alloc.segments();
            self.oom_owners = owners_of(&self.at_oom, self.at_peak.by_address.as_ref().expect("owners are tracked"));
        }
    }
}

/// The memory timeline: a point at every step marker (and every N events with
/// `--sample-every`), each carrying the peaks since the previous point. When it reaches twice its
/// budget, neighbours are merged and the sampling strides double.
#[derive(Debug)]
pub struct Timeline {
    pub points: Vec<TimelinePoint>,
    /// Twice the point budget: the length at which neighbours are merged.
    thin_at: usize,
    stride_steps: u64,
    stride_events: u64,
    steps: u64,
    /// Allocated and reserved peaks since the last point.
    interval: (u64, u64),
    /// Prices each interval's allocator time (`modelled_alloc_time_s`); none: 0.
    time_model: Option<LatencyModel>,
    /// Modelled allocator time up to the last point.
    time_ns_at_last: u64,
}

impl Timeline {
    pub fn new(sample_every_events: Option<u64>, max_points: usize, time_model: Option<LatencyModel>) -> Self {
        Timeline {
            points: Vec::new(),
            thin_at: 2 * max_points.max(1),
            stride_steps: 1,
            stride_events: sample_every_events.unwrap_or(0),
            steps: 0,
            interval: (0, 0),
            time_model,
            time_ns_at_last: 0,
        }
    }

    fn sample<A: GpuAllocator + ?Sized>(&mut self, alloc: &A, event: u64, step: u64, live: u64) {
        let s = alloc.stats();
        let (allocated, reserved) = (s.all().allocated_bytes.current as u64, s.all().reserved_bytes.current as u64);
        let time_ns = self.time_model.as_ref().map_or(0, |m| m.alloc_time_ns(alloc.device_time_ns().unwrap_or(0), s));
        let interval_time_ns = time_ns.saturating_sub(self.time_ns_at_last);
        self.time_ns_at_last = time_ns;
        self.points.push(TimelinePoint {
            event,
            step,
            allocated,
            reserved,
            active: s.all().active_bytes.current as u64,
            live,
            allocated_max: self.interval.0.max(allocated),
            reserved_max: self.interval.1.max(reserved),
            modelled_alloc_time_s: interval_time_ns as f64 / 1e9,
        });
        self.interval = (allocated, reserved);
    }

    /// Thins the points once they reach twice the budget, after the event's last sample.
    fn thin_if_full(&mut self) {
        if self.points.len() >= self.thin_at {
            self.thin();
        }
    }

    /// Merges neighbours, keeping each pair's later values and both pairs' peaks, and doubles
    /// the sampling strides.
    fn thin(&mut self) {
        self.points = self
            .points
            .chunks(2)
            .map(|c| {
                let mut p = *c.last().expect("non-empty chunk");
                p.allocated_max = c.iter().map(|q| q.allocated_max).max().unwrap_or(0);
                p.reserved_max = c.iter().map(|q| q.reserved_max).max().unwrap_or(0);
                p.modelled_alloc_time_s = c.iter().map(|q| q.modelled_alloc_time_s).sum();
                p
            })
            .collect();
        self.stride_steps *= 2;
        self.stride_events *= 2;
    }
}

impl<A: GpuAllocator + ?Sized> Observer<A> for Timeline {
    fn start(&mut self, alloc: &A) {
        self.sample(alloc, 0, 0, 0);
    }

    #[inline]
    fn allocated(&mut self, _alloc: &A, stats: &DeviceStats, _at: At, _bytes: u64) {
        let (allocated, reserved) = allocated_reserved(stats);
        self.interval.0 = self.interval.0.max(allocated);
        self.interval.1 = self.interval.1.max(reserved);
    }

    fn step(&mut self, alloc: &A, at: At, _n: u64) {
        self.steps += 1;
        if self.steps.is_multiple_of(self.stride_steps) {
            self.sample(alloc, at.index, at.step, at.live);
            // (With event sampling, after_event samples this event too, then thins.)
            if self.stride_events == 0 {
                self.thin_if_full();
            }
        }
    }

    #[inline]
    fn after_event(&mut self, alloc: &A, at: At) {
        if self.stride_events > 0 {
            if at.index.is_multiple_of(self.stride_events) {
                self.sample(alloc, at.index, at.step, at.live);
            }
            self.thin_if_full();
        }
    }

    /// The next multiple of the event stride. (Step points, the other points, are made at
    /// events after which after_event comes anyway, and thins.)
    #[inline]
    fn after_event_due(&self, events: u64) -> u64 {
        match self.stride_events {
            0 => u64::MAX,
            stride => super::next_multiple_above(events, stride),
        }
    }

    fn finish(&mut self, alloc: &A, at: At) {
        self.sample(alloc, at.index, at.step, at.live);
    }
}

/// The first OOM: where it happened, what the allocator knew, and the segment map then.
#[derive(Debug, Default)]
pub struct FirstOom {
    pub record: Option<OomRecord>,
    pub segments: Vec<SegmentSnapshot>,
}

impl<A: GpuAllocator + ?Sized> Observer<A> for FirstOom {
    fn out_of_memory(&mut self, alloc: &A, at: At, _bytes: u64, info: &OomInfo) {
        if self.record.is_some() {
            return;
        }
        self.segments = alloc.segments();
        self.record = Some(OomRecord {
            event: at.index,
            step: at.step,
            requested: info.requested,
            rounded: info.rounded,
            alloc_size: info.alloc_size,
            cached_free: info.cached_free,
            device_free: info.device_free,
            device_free_uncapped: info.device_free_uncapped,
            allowed: info.allowed,
            largest_free_block: info.largest_free_block,
            other_pools_free: info.other_pools_free,
            reserved: info.reserved,
            allocated: info.allocated,
            cause: info.cause(),
        });
    }
}

/// Log2 size buckets of every allocation request (served or not): bucket k holds sizes in
/// [2^k, 2^(k+1)).
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

impl<A: GpuAllocator + ?Sized> Observer<A> for SizeHistogram {
    #[inline]
    fn allocated(&mut self, _alloc: &A, _stats: &DeviceStats, _at: At, bytes: u64) {
        self.record(bytes);
    }

    fn out_of_memory(&mut self, _alloc: &A, _at: At, bytes: u64, _info: &OomInfo) {
        self.record(bytes);
    }
}

/// Stops the replay at the next checkpoint once `stop()` says so (the commands pass their
/// Ctrl-C flag; analyses that run many replays pass theirs on).
pub struct StopWhen<F: Fn() -> bool>(pub F);

impl<A: GpuAllocator + ?Sized, F: Fn() -> bool> Observer<A> for StopWhen<F> {
    fn checkpoint(&mut self, _events: u64) -> bool {
        (self.0)()
    }
}

/// Calls `at_step(n, event_index, stats)` at every `step` marker, before it takes effect, and
/// once more at the end with `n = u64::MAX` (the fidelity check's snapshots).
pub struct AtStep<F>(pub F);

impl<A: GpuAllocator + ?Sized, F: FnMut(u64, u64, &DeviceStats)> Observer<A> for AtStep<F> {
    fn step(&mut self, alloc: &A, at: At, n: u64) {
        (self.0)(n, at.index, alloc.stats())
    }
    fn finish(&mut self, alloc: &A, at: At) {
        (self.0)(u64::MAX, at.index, alloc.stats())
    }
}
