//! Replays an event stream with real malloc/free on N threads and measures it.
//!
//! Every allocated block is written to (one byte per page, and its last byte), so RSS is real.
//! Events are compiled in chunks to slot-indexed ops outside the timed region, so the replay loop
//! costs a few ns per op; one op in [`LATENCY_SAMPLE_EVERY`] on average, at random gaps (a fixed
//! stride can beat in step with an allocator's own periodic work), is timed with a [`Clock`] (the
//! TSC read behind `lfence`/`rdtscp`, [`Tsc`], calibrated against the monotonic clock) into an HDR
//! histogram. Each worker thread
//! replays the workload pass after pass (`Worker::pass`) until the run's bound. With
//! `cross_thread`, worker i hands every block it frees to worker i+1, which frees it (the larson
//! pattern: where allocators differ most).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rustc_hash::FxHashMap;

use super::allocators::CpuAllocator;
use super::rss::RunProgress;
use crate::error::InputError;
use crate::event::Event;
use crate::input::Source;

pub struct DriverOptions {
    pub threads: usize,
    pub cross_thread: bool,
    /// Multiplies every allocation size (GPU-sized workloads at e.g. 1/256).
    pub scale: f64,
    /// Stop after this many iterations on every worker, repeating the workload if needed. An
    /// iteration starts at a step event (the generators' convention), so the run stops at the
    /// N+1-th step.
    pub iterations: Option<u64>,
    /// Stop after this long, repeating the workload if needed.
    pub duration: Option<Duration>,
    /// Write every page of each block (real RSS). Off only to time the allocator alone.
    pub touch: bool,
}

/// What the workers measured.
pub struct DriverOutcome {
    pub allocs: u64,
    pub frees: u64,
    pub events: u64,
    pub iterations: u64,
    pub passes: u64,
    pub bytes_allocated: u64,
    pub bytes_freed: u64,
    pub alloc_ns: Histogram<u64>,
    pub free_ns: Histogram<u64>,
    /// Time in the replay of compiled ops (the slowest worker's): allocator calls, page
    /// touching and the loop, without event generation.
    pub replay_ns: u64,
    pub wall_s: f64,
    pub interrupted: bool,
}

/// What the driver times sampled ops with (criterion's `Measurement` is the model): `start`
/// reads the clock, `elapsed_ns` turns the time since into nanoseconds.
pub trait Clock: Sync {
    type Start: Copy;
    fn start(&self) -> Self::Start;
    /// Nanoseconds since `start` (at least 1: the histogram counts from 1 ns).
    fn elapsed_ns(&self, start: Self::Start) -> u64;
}

/// The time-stamp counter (`rdtsc`; the monotonic clock elsewhere), calibrated against the
/// monotonic clock once per process: two reads cost ~10 ns.
#[derive(Debug, Clone, Copy)]
pub struct Tsc {
    ns_per_tick: f64,
}

impl Tsc {
    pub fn calibrated() -> Self {
        Tsc { ns_per_tick: ns_per_tick() }
    }
}

impl Clock for Tsc {
    type Start = u64;

    #[inline(always)]
    fn start(&self) -> u64 {
        ticks_start()
    }

    #[inline(always)]
    fn elapsed_ns(&self, start: u64) -> u64 {
        let dt = ticks_end().wrapping_sub(start);
        ((dt as f64 * self.ns_per_tick) as u64).max(1)
    }
}

/// A start read: `lfence` before `rdtsc` so earlier instructions have finished, and after it so
/// the timed call does not start early (Intel's "How to Benchmark Code Execution Times").
#[inline(always)]
fn ticks_start() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: lfence (SSE2, in the x86-64 baseline) and rdtsc take no memory operands: they only
    // order instructions and read the time-stamp counter.
    unsafe {
        use core::arch::x86_64::{_mm_lfence, _rdtsc};
        _mm_lfence();
        let t = _rdtsc();
        _mm_lfence();
        t
    }
    #[cfg(not(target_arch = "x86_64"))]
    ticks()
}

/// An end read: `rdtscp` waits for the timed call to finish, `lfence` keeps later work out.
#[inline(always)]
fn ticks_end() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtscp writes the processor id through `&mut aux`, a live local u32, and reads the
    // time-stamp counter; lfence only orders instructions (see `ticks_start`).
    unsafe {
        use core::arch::x86_64::{__rdtscp, _mm_lfence};
        let mut aux = 0u32;
        let t = __rdtscp(&mut aux);
        _mm_lfence();
        t
    }
    #[cfg(not(target_arch = "x86_64"))]
    ticks()
}

#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc reads the time-stamp counter and nothing else (see `ticks_start`).
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Nanoseconds per tick, measured once.
pub fn ns_per_tick() -> f64 {
    static CAL: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *CAL.get_or_init(|| {
        let (t0, c0) = (Instant::now(), ticks());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, c1) = (Instant::now(), ticks());
        let ns = (t1 - t0).as_nanos() as f64;
        let c = c1.wrapping_sub(c0).max(1) as f64;
        ns / c
    })
}

/// Scales a size, never to zero.
#[inline]
pub fn scaled(bytes: u64, scale: f64) -> usize {
    if scale == 1.0 {
        bytes as usize
    } else {
        ((bytes as f64 * scale).round() as usize).max(1)
    }
}

/// Touches every page of a fresh block so it counts in RSS.
///
/// # Safety
/// `p` is valid for writes of `len` > 0 bytes (a live block of at least `len` bytes).
#[inline]
pub(super) unsafe fn touch(p: *mut u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: `off` < `len`, so `p + off` is inside the caller's block.
        unsafe { std::ptr::write_volatile(p.add(off), 1) };
        off += 4096;
    }
    // SAFETY: `len` > 0, so `len - 1` is the block's last byte.
    unsafe { std::ptr::write_volatile(p.add(len - 1), 1) };
}

/// Latency is timed on one op in this many on average: the gap to the next timed op is drawn
/// uniformly from 1 ..= 2 × this − 1. Two TSC reads cost ~10 ns, a third of mimalloc's own per-op
/// time: at 1 in 64 the replay loop's overhead stays under 10 % of the cheapest allocator's
/// (benches/cpu_allocators.rs, `cpu_harness_overhead`).
pub const LATENCY_SAMPLE_EVERY: u64 = 64;

/// The gaps between timed ops: xorshift64 (a few cycles; statistical quality is not needed, only
/// no fixed period an allocator could beat in step with).
#[derive(Debug, Clone)]
pub struct SampleGaps {
    state: u64,
}

impl SampleGaps {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed: never the all-zero state xorshift cannot leave.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        SampleGaps { state: (z ^ (z >> 31)) | 1 }
    }

    /// The gaps of worker `w`: seeded from the time-stamp counter, so no two workers (or runs)
    /// share their sequence.
    pub fn for_worker(w: usize) -> Self {
        SampleGaps::new(ticks() ^ (w as u64).wrapping_mul(0x2545_F491_4F6C_DD1D))
    }

    /// The number of ops until the next timed one, uniform in 1 ..= 2 × LATENCY_SAMPLE_EVERY − 1.
    #[inline]
    pub fn next_gap(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        1 + x % (2 * LATENCY_SAMPLE_EVERY - 1)
    }
}
/// Which ops a worker times: one in [`LATENCY_SAMPLE_EVERY`] on average, at [`SampleGaps`].
pub(super) struct OpSampler {
    gaps: SampleGaps,
    until: u64,
}

impl OpSampler {
    pub(super) fn for_worker(w: usize) -> Self {
        let mut gaps = SampleGaps::for_worker(w);
        OpSampler { until: gaps.next_gap(), gaps }
    }

    /// Whether this op is timed.
    #[inline]
    pub(super) fn due(&mut self) -> bool {
        self.until -= 1;
        if self.until == 0 {
            self.until = self.gaps.next_gap();
            true
        } else {
            false
        }
    }
}

/// Runs the jobs a parked worker is sent until their channel closes, answering each on `done`
/// (see [`HeldWorkers::run_on_each`]).
pub(super) fn serve_jobs(jobs: mpsc::Receiver<WorkerJob>, done: &mpsc::Sender<()>) {
    for job in jobs {
        // (A job that panics still answers, so that the caller does not wait for ever.)
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job()));
        let _ = done.send(());
    }
}

/// Events are compiled to slot-indexed ops in chunks of this many, outside the timed replay.
const CHUNK_EVENTS: usize = 4096;

/// One compiled event: ids are already mapped to dense slots.
#[derive(Clone, Copy)]
enum Op {
    Alloc { slot: u32, bytes: usize },
    Free { slot: u32 },
    Step,
}

/// Maps a pass's ids to reusable slots.
#[derive(Default)]
struct Compiler {
    id_to_slot: FxHashMap<u64, u32>,
    free_slots: Vec<u32>,
    next_slot: u32,
}

impl Compiler {
    fn compile(&mut self, ev: Event, scale: f64, ops: &mut Vec<Op>) {
        match ev {
            // A zero-byte allocation is a null pointer (as in PyTorch): no malloc, and its free
            // finds no slot and is skipped.
            Event::Alloc { bytes: 0, .. } => {}
            Event::Alloc { id, bytes, .. } => {
                let slot = self.free_slots.pop().unwrap_or_else(|| {
                    self.next_slot += 1;
                    self.next_slot - 1
                });
                if let Some(old) = self.id_to_slot.insert(id, slot) {
                    ops.push(Op::Free { slot: old });
                    self.free_slots.push(old);
                }
                ops.push(Op::Alloc { slot, bytes: scaled(bytes, scale) });
            }
            Event::Free { id } => {
                if let Some(slot) = self.id_to_slot.remove(&id) {
                    ops.push(Op::Free { slot });
                    self.free_slots.push(slot);
                }
            }
            Event::Step { .. } => ops.push(Op::Step),
            // CPU allocators have no streams or private pools: a use by another stream, or a
            // pool an allocation is routed to, changes nothing.
            Event::EmptyCache | Event::RecordStream { .. } | Event::Sync { .. } | Event::Pool(_) => {}
        }
    }
}

/// One worker thread: its allocator, clock, counters and histograms.
struct Worker<'a, C: Clock> {
    alloc: CpuAllocator,
    touch: bool,
    clock: &'a C,
    alloc_ns: Histogram<u64>,
    free_ns: Histogram<u64>,
    allocs: u64,
    frees: u64,
    sampler: OpSampler,
    replay_ns: u64,
    handoff: Option<mpsc::Sender<(usize, usize)>>,
    bytes_allocated: u64,
    bytes_freed: u64,
    /// Steps and events replayed over all passes.
    steps: u64,
    events: u64,
    /// This worker's live bytes as last added to the run's shared count.
    live_published: i64,
}

/// What every worker of a run shares.
struct Run<'a> {
    source: &'a Source,
    opts: &'a DriverOptions,
    /// Worker 0's step count and every worker's live bytes, for the RSS sampler.
    progress: &'a RunProgress,
    deadline: Option<Instant>,
    passes: AtomicU64,
    interrupted: AtomicBool,
}

impl<'a, C: Clock> Worker<'a, C> {
    fn new(w: usize, alloc: CpuAllocator, opts: &DriverOptions, clock: &'a C, handoff: Option<mpsc::Sender<(usize, usize)>>) -> Self {
        Worker {
            alloc,
            touch: opts.touch,
            clock,
            alloc_ns: histogram(),
            free_ns: histogram(),
            allocs: 0,
            frees: 0,
            sampler: OpSampler::for_worker(w),
            replay_ns: 0,
            handoff,
            bytes_allocated: 0,
            bytes_freed: 0,
            steps: 0,
            events: 0,
            live_published: 0,
        }
    }

    /// Adds what this worker's live bytes changed by since the last call to the shared count.
    fn publish_live(&mut self, progress: &RunProgress) {
        progress.publish_live(self.bytes_allocated, self.bytes_freed, &mut self.live_published);
    }

    #[inline(always)]
    fn malloc(&mut self, bytes: usize) -> anyhow::Result<*mut u8> {
        let p = if self.sampler.due() {
            let t0 = self.clock.start();
            // SAFETY: `bytes` > 0 (the compiler drops 0-byte allocations and `scaled` never gives
            // 0) and at most 1 EiB, far below isize::MAX (every event source refuses requests of
            // 1 EiB or more, units::MAX_REQUEST_BYTES, and a scale ≤ 1 does not grow them). The
            // block is freed once, with this size: its slot holds (address, bytes) until a free
            // takes it.
            let p = unsafe { self.alloc.malloc(bytes) };
            let _ = self.alloc_ns.record(self.clock.elapsed_ns(t0));
            p
        } else {
            // SAFETY: as above.
            unsafe { self.alloc.malloc(bytes) }
        };
        if p.is_null() {
            anyhow::bail!("{} returned NULL for {bytes} bytes: the machine is out of memory (use --scale)", self.alloc.name);
        }
        self.allocs += 1;
        self.bytes_allocated += bytes as u64;
        if self.touch {
            // SAFETY: `p` is a fresh, non-null block of `bytes` > 0 bytes, and a real one: a
            // run with the null allocator never touches (`drive_with` refuses it).
            unsafe { touch(p, bytes) };
        }
        Ok(p)
    }

    #[inline(always)]
    fn free_here(&mut self, p: usize, bytes: usize) {
        if self.sampler.due() {
            let t0 = self.clock.start();
            // SAFETY: (p, bytes) is a block and its size that `malloc` of this run's allocator
            // answered (every worker holds a copy of the same one); it left its slot by
            // `mem::take`, or the hand-over channel by a receive, so it is freed exactly once.
            unsafe { self.alloc.free(p as *mut u8, bytes) };
            let _ = self.free_ns.record(self.clock.elapsed_ns(t0));
        } else {
            // SAFETY: as above.
            unsafe { self.alloc.free(p as *mut u8, bytes) };
        }
        self.frees += 1;
        self.bytes_freed += bytes as u64;
    }

    #[inline]
    fn free(&mut self, p: usize, bytes: usize) {
        match &self.handoff {
            Some(tx) => {
                if tx.send((p, bytes)).is_err() {
                    self.free_here(p, bytes);
                }
            }
            None => self.free_here(p, bytes),
        }
    }

    /// Worker `w` replays passes over the workload until the run's bound (iterations, duration,
    /// one pass, Ctrl-C), then frees what other workers hand over until they have all finished.
    fn run(&mut self, w: usize, run: &Run, rx: mpsc::Receiver<(usize, usize)>) -> anyhow::Result<()> {
        // Live blocks by slot: (address, bytes); address 0 = empty.
        let mut slots: Vec<(usize, usize)> = Vec::new();
        let mut ops: Vec<Op> = Vec::with_capacity(CHUNK_EVENTS);
        while !self.pass(w, run, &rx, &mut slots, &mut ops)? {}
        self.handoff = None;
        // Blocks other workers still hand over are freed (and timed) here.
        let t0 = Instant::now();
        for (p, b) in rx.iter() {
            self.free_here(p, b);
        }
        self.replay_ns += t0.elapsed().as_nanos() as u64;
        self.publish_live(run.progress);
        Ok(())
    }

    /// One pass over the workload: events are compiled in chunks (untimed) and replayed (timed);
    /// at its end what is still live is freed and ids start afresh. Returns whether the worker
    /// is done.
    fn pass(&mut self, w: usize, run: &Run, rx: &mpsc::Receiver<(usize, usize)>, slots: &mut Vec<(usize, usize)>, ops: &mut Vec<Op>) -> anyhow::Result<bool> {
        let opts = run.opts;
        let mut done = false;
        let mut compiler = Compiler::default();
        let mut stream = run.source.events()?;
        let mut exhausted = false;
        let mut saw_event = false;
        let steps_before = self.steps;
        while !exhausted && !done {
            ops.clear();
            while ops.len() < CHUNK_EVENTS {
                match stream.next() {
                    Some(ev) => {
                        compiler.compile(ev?, opts.scale, ops);
                        self.events += 1;
                        saw_event = true;
                    }
                    None => {
                        exhausted = true;
                        break;
                    }
                }
            }
            if slots.len() < compiler.next_slot as usize {
                slots.resize(compiler.next_slot as usize, (0, 0));
            }
            let t0 = Instant::now();
            for &op in ops.iter() {
                match op {
                    Op::Alloc { slot, bytes } => {
                        let p = self.malloc(bytes)?;
                        slots[slot as usize] = (p as usize, bytes);
                    }
                    Op::Free { slot } => {
                        let (p, b) = std::mem::take(&mut slots[slot as usize]);
                        if p != 0 {
                            self.free(p, b);
                        }
                    }
                    Op::Step => {
                        // A step starts an iteration: the N+1-th ends a run of N.
                        if opts.iterations.is_some_and(|max| self.steps >= max) {
                            done = true;
                            break;
                        }
                        self.steps += 1;
                        self.publish_live(run.progress);
                        if w == 0 {
                            run.progress.iteration.store(self.steps, Ordering::Relaxed);
                        }
                    }
                }
            }
            // Frees handed over by the previous worker are ops of this one: timed and counted here.
            while let Ok((p, b)) = rx.try_recv() {
                self.free_here(p, b);
            }
            self.replay_ns += t0.elapsed().as_nanos() as u64;
            self.publish_live(run.progress);
            if crate::interrupt::interrupted() {
                run.interrupted.store(true, Ordering::Relaxed);
                done = true;
            }
            if run.deadline.is_some_and(|d| Instant::now() >= d) {
                done = true;
            }
        }
        let t0 = Instant::now();
        for (p, b) in slots.iter_mut().map(std::mem::take) {
            if p != 0 {
                self.free(p, b);
            }
        }
        self.replay_ns += t0.elapsed().as_nanos() as u64;
        self.publish_live(run.progress);
        run.passes.fetch_add(1, Ordering::Relaxed);
        if opts.iterations.is_some() && !done && self.steps == steps_before {
            // Iterations are counted at step events: without one, passes would repeat forever.
            return Err(InputError::new("--iterations", "this input has no step events to count iterations by: use --duration SECONDS").into());
        }
        Ok(done || !saw_event || (opts.iterations.is_none() && run.deadline.is_none()))
    }
}

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Runs the workload on `opts.threads` workers, timing sampled ops with the TSC; `progress` is
/// published for the RSS sampler.
pub fn drive(source: &Source, alloc: CpuAllocator, opts: &DriverOptions, progress: &RunProgress) -> anyhow::Result<DriverOutcome> {
    drive_with(source, alloc, opts, progress, &Tsc::calibrated(), |_, _| ()).map(|(out, ())| out)
}

/// A job run on every parked worker thread (see [`HeldWorkers::run_on_each`]).
pub type WorkerJob = Arc<dyn Fn() + Send + Sync>;

/// The workers of a run, parked after their last free (see [`drive_holding`]).
pub struct HeldWorkers {
    jobs: Vec<mpsc::Sender<WorkerJob>>,
    done: mpsc::Receiver<()>,
}

impl HeldWorkers {
    /// Workers that take jobs from `jobs` (one channel each) and answer each on `done`.
    pub(super) fn new(jobs: Vec<mpsc::Sender<WorkerJob>>, done: mpsc::Receiver<()>) -> Self {
        HeldWorkers { jobs, done }
    }

    /// Runs `job` on every worker thread and returns when all have: what acts on a thread's own
    /// allocator state (mimalloc's `mi_collect` frees the calling thread's heap, not the
    /// others') is done by the threads that allocated, as a serving thread calling it would.
    pub fn run_on_each(&self, job: WorkerJob) {
        let sent = self.jobs.iter().filter(|tx| tx.send(job.clone()).is_ok()).count();
        for _ in 0..sent {
            if self.done.recv().is_err() {
                break;
            }
        }
    }
}

/// [`drive`], calling `while_held(all_ok, workers)` after the workers' last free but before they
/// exit (`all_ok`: no worker failed). A thread's exit hands its allocator caches back (jemalloc
/// and tcmalloc flush a dying thread's cache, and jemalloc purges its pages), which a long-lived
/// serving thread never does: what an allocator retains is read while its threads live.
pub fn drive_holding<R>(
    source: &Source,
    alloc: CpuAllocator,
    opts: &DriverOptions,
    progress: &RunProgress,
    while_held: impl FnOnce(bool, &HeldWorkers) -> R,
) -> anyhow::Result<(DriverOutcome, R)> {
    drive_with(source, alloc, opts, progress, &Tsc::calibrated(), while_held)
}

/// [`drive_holding`] with the clock sampled ops are timed with.
pub fn drive_with<C: Clock, R>(
    source: &Source,
    alloc: CpuAllocator,
    opts: &DriverOptions,
    progress: &RunProgress,
    clock: &C,
    while_held: impl FnOnce(bool, &HeldWorkers) -> R,
) -> anyhow::Result<(DriverOutcome, R)> {
    if opts.threads == 0 || opts.threads > 1024 {
        return Err(InputError::new("--threads", "must be between 1 and 1024").into());
    }
    if !(opts.scale > 0.0 && opts.scale <= 1.0) {
        return Err(InputError::new("--scale", "must be in (0, 1]").into());
    }
    if opts.touch && alloc.is_null() {
        anyhow::bail!("the null allocator hands out no memory: it runs only with page touching off");
    }
    let start = Instant::now();
    let run = Run { source, opts, progress, deadline: opts.duration.map(|d| start + d), passes: AtomicU64::new(0), interrupted: AtomicBool::new(false) };
    let n = opts.threads;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel::<(usize, usize)>()).unzip();
    let mut senders: Vec<Option<mpsc::Sender<(usize, usize)>>> = senders.into_iter().map(Some).collect();

    // Each worker, done, waits at `finished`, then runs the jobs it is sent (acknowledging each)
    // and stays alive until its job channel closes.
    let finished = Barrier::new(n + 1);
    let (job_senders, job_receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel::<WorkerJob>()).unzip();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let failed = AtomicBool::new(false);
    let (results, wall_s, held): (Vec<anyhow::Result<Worker<C>>>, f64, R) = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for ((w, rx), jobs) in receivers.into_iter().enumerate().zip(job_receivers) {
            // Worker w frees into worker w+1's channel.
            let tx = if opts.cross_thread && n > 1 { senders[(w + 1) % n].take() } else { None };
            let (run, finished, failed, done_tx) = (&run, &finished, &failed, done_tx.clone());
            handles.push(scope.spawn(move || -> anyhow::Result<Worker<C>> {
                // (A panic is caught, so that every worker reaches both barriers.)
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> anyhow::Result<Worker<C>> {
                    let mut worker = Worker::new(w, alloc, opts, clock, tx);
                    worker.run(w, run, rx)?;
                    Ok(worker)
                }))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")));
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                finished.wait();
                serve_jobs(jobs, &done_tx);
                result
            }));
        }
        drop(senders);
        drop(done_tx);
        finished.wait();
        let wall_s = start.elapsed().as_secs_f64();
        let workers = HeldWorkers::new(job_senders, done_rx);
        let held = while_held(!failed.load(Ordering::Relaxed), &workers);
        // Closing the job channels releases the workers.
        drop(workers);
        let results = handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")))).collect();
        (results, wall_s, held)
    });
    let mut alloc_ns = histogram();
    let mut free_ns = histogram();
    let (mut allocs, mut frees, mut replay_ns, mut bytes_allocated, mut bytes_freed) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut events, mut iterations) = (0u64, 0u64);
    for r in results {
        let w = r?;
        alloc_ns.add(&w.alloc_ns).expect("same bounds");
        free_ns.add(&w.free_ns).expect("same bounds");
        allocs += w.allocs;
        frees += w.frees;
        replay_ns = replay_ns.max(w.replay_ns);
        bytes_allocated += w.bytes_allocated;
        bytes_freed += w.bytes_freed;
        events += w.events;
        iterations = iterations.max(w.steps);
    }
    let outcome = DriverOutcome {
        allocs,
        frees,
        events,
        iterations,
        passes: run.passes.load(Ordering::Relaxed),
        bytes_allocated,
        bytes_freed,
        alloc_ns,
        free_ns,
        replay_ns,
        wall_s,
        interrupted: run.interrupted.load(Ordering::Relaxed),
    };
    Ok((outcome, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_gaps_are_random_with_the_stated_mean() {
        let mut g = SampleGaps::new(7);
        let gaps: Vec<u64> = (0..100_000).map(|_| g.next_gap()).collect();
        assert!(gaps.iter().all(|&x| (1..2 * LATENCY_SAMPLE_EVERY).contains(&x)));
        let mean = gaps.iter().sum::<u64>() as f64 / gaps.len() as f64;
        assert!((mean - LATENCY_SAMPLE_EVERY as f64).abs() < 1.0, "mean gap {mean}");
        let mut distinct = gaps.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len() as u64, 2 * LATENCY_SAMPLE_EVERY - 1, "every gap length occurs: no fixed stride");
        assert_ne!(SampleGaps::new(1).next_gap(), SampleGaps::new(2).next_gap(), "seeds differ per worker");
    }

    #[test]
    fn zero_byte_allocations_compile_to_nothing() {
        let mut compiler = Compiler::default();
        let mut ops = Vec::new();
        for ev in [Event::Alloc { id: 1, bytes: 0, stream: 0 }, Event::Free { id: 1 }, Event::Alloc { id: 2, bytes: 8, stream: 0 }, Event::Free { id: 2 }] {
            compiler.compile(ev, 1.0, &mut ops);
        }
        assert_eq!(ops.len(), 2, "no malloc(0), no free of it");
        assert!(matches!(ops[0], Op::Alloc { slot: 0, bytes: 8 }));
        assert!(matches!(ops[1], Op::Free { slot: 0 }));
    }
}
