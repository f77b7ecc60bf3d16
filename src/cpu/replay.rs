//! Replays a recorded CPU trace ([`super::recorded`]) with the process's malloc (glibc, or what
//! LD_PRELOAD put in front of it): one replay thread per recorded thread (threads that never
//! overlapped share one, see [`lanes`]), each making its calls in order. A call that gives back a block another thread created waits until that thread has
//! created it, the one ordering across threads that matters (the recorded order is kept within a
//! thread; nothing else is forced, as in the program). Calls are compiled to ops on dense block
//! slots before the clock starts.
//!
//! The bytes a program touched are not recorded (only the calls are): every page of a block is
//! written once when it is handed out, as the in-process driver does (`touch`), so RSS is what
//! the allocator's placement costs when the program uses what it asked for.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::driver::{histogram, serve_jobs, touch, Clock, DriverOutcome, HeldWorkers, OpSampler, WorkerJob};
use super::recorded::{Call, RecordedTrace};
use super::rss::RunProgress;

/// What serves a replay's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayAllocator {
    /// The process's malloc family (`libc::malloc` resolves to a preloaded allocator's).
    Libc,
    /// Hands out one dangling address and frees nothing: the replay's own cost, for the benchmark
    /// (never with page touching).
    Null,
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub touch: bool,
    /// Replay the trace again and again until this much time has passed (a pass's leftover
    /// blocks freed between passes); one pass without it.
    pub duration: Option<Duration>,
    /// Make each call no earlier than it was made in the recording (since the pass's start), so
    /// the allocators' time-based purging (jemalloc's decay, mimalloc's purge delay) runs as it did
    /// in the program; otherwise as fast as the calls go.
    pub pace: bool,
}

/// No block (a realloc from NULL, a free of nothing).
const NONE: u32 = u32::MAX;
/// The slot value of a block the allocator answered with NULL for 0 bytes: nothing to free.
const EMPTY_BLOCK: usize = usize::MAX;
/// The null allocator's block: aligned, never dereferenced.
const NULL_ALLOCATOR_BLOCK: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Malloc,
    Calloc,
    Aligned,
    Realloc,
    Free,
}

/// One compiled call: `new` is the slot of the block it creates, `old` the one it gives back.
#[derive(Debug, Clone, Copy)]
struct Op {
    kind: Kind,
    align_log2: u8,
    /// `old` was created on another thread: wait until it exists.
    wait: bool,
    new: u32,
    old: u32,
    bytes: u64,
    old_bytes: u64,
    /// When the call was made, since the recording started.
    t_ns: u64,
}

/// A trace compiled for replay.
pub struct Compiled {
    threads: Vec<ThreadOps>,
    blocks: usize,
    /// The most bytes live at once over the processes (merged by time).
    pub peak_live_bytes: u64,
    /// Calls that give back a block another thread created.
    pub cross_thread_calls: u64,
}

struct ThreadOps {
    ops: Vec<Op>,
    /// The slots this thread creates: what is left of them is freed at a pass's end.
    created: Vec<u32>,
}

impl Compiled {
    /// Replay threads: as many as a process had threads making calls at once (see [`lanes`]).
    pub fn threads(&self) -> usize {
        self.threads.len()
    }
}

/// Maps a process's recorded threads onto replay threads ("lanes"): a thread whose first call
/// comes after another's last call runs on that one's lane, after it. A server that starts a
/// thread per connection (CPython's ThreadingHTTPServer: 3,010 threads for 3,000 requests) is
/// replayed with as many threads as were making calls at once, each lane's calls still in the
/// process's call order (so a wait for another lane's block always ends). Returns the lane of
/// each thread and the number of lanes.
fn lanes(calls: &[super::recorded::Recorded], threads: u32) -> (Vec<u32>, u32) {
    let mut span: Vec<(usize, usize)> = vec![(usize::MAX, 0); threads as usize];
    for (i, c) in calls.iter().enumerate() {
        let s = &mut span[c.thread as usize];
        s.0 = s.0.min(i);
        s.1 = i;
    }
    let mut order: Vec<u32> = (0..threads).collect();
    order.sort_by_key(|&t| span[t as usize].0);
    // Lanes by when they are free again (the last call index of their latest thread).
    let mut free_at: std::collections::BinaryHeap<std::cmp::Reverse<(usize, u32)>> = std::collections::BinaryHeap::new();
    let mut lane_of = vec![0u32; threads as usize];
    let mut n = 0u32;
    for t in order {
        let (first, last) = span[t as usize];
        let lane = match free_at.peek() {
            Some(&std::cmp::Reverse((end, lane))) if end < first => {
                free_at.pop();
                lane
            }
            _ => {
                n += 1;
                n - 1
            }
        };
        lane_of[t as usize] = lane;
        free_at.push(std::cmp::Reverse((last, lane)));
    }
    (lane_of, n)
}

/// Compiles every process of `trace`, `copies` times side by side (each copy its own blocks and
/// threads): blocks to global slots, calls to ops per thread.
pub fn compile(trace: &RecordedTrace, copies: usize) -> Result<Compiled, crate::error::InputError> {
    let mut threads: Vec<ThreadOps> = Vec::new();
    let (mut blocks, mut cross) = (0usize, 0u64);
    let mut deltas: Vec<(u64, i64)> = Vec::new();
    for (p, calls) in (0..copies.max(1)).flat_map(|_| trace.info.processes.iter().zip(&trace.calls)) {
        let first_thread = threads.len();
        let (lane_of, n_lanes) = lanes(calls, p.threads);
        threads.extend((0..n_lanes).map(|_| ThreadOps { ops: Vec::new(), created: Vec::new() }));
        let offset = blocks;
        let created_in = calls.iter().filter(|c| c.call.creates()).count();
        if offset + created_in >= NONE as usize {
            return Err(crate::error::InputError::new("trace", "more than 4 billion blocks: too large to replay in one go"));
        }
        // The creating thread and size of every block of this process.
        let mut owner: Vec<u32> = Vec::with_capacity(created_in);
        let mut size: Vec<u64> = Vec::with_capacity(created_in);
        for c in calls {
            let t = first_thread + lane_of[c.thread as usize] as usize;
            let gives = match c.call {
                Call::Free { id } => Some(id),
                Call::Realloc { old, .. } => old,
                _ => None,
            };
            let (old, old_bytes, wait) = match gives {
                Some(id) => {
                    let wait = owner[id as usize] as usize != t;
                    cross += wait as u64;
                    deltas.push((c.t_ns, -(size[id as usize] as i64)));
                    ((offset + id as usize) as u32, size[id as usize], wait)
                }
                None => (NONE, 0, false),
            };
            let (kind, align_log2, bytes) = match c.call {
                Call::Malloc { bytes } => (Kind::Malloc, 0, bytes),
                Call::Calloc { bytes } => (Kind::Calloc, 0, bytes),
                Call::Aligned { align_log2, bytes } => (Kind::Aligned, align_log2, bytes),
                Call::Realloc { bytes, .. } => (Kind::Realloc, 0, bytes),
                Call::Free { .. } => (Kind::Free, 0, 0),
            };
            let new = if c.call.creates() {
                let slot = (offset + owner.len()) as u32;
                owner.push(t as u32);
                size.push(bytes);
                deltas.push((c.t_ns, bytes as i64));
                threads[t].created.push(slot);
                slot
            } else {
                NONE
            };
            threads[t].ops.push(Op { kind, align_log2, wait, new, old, bytes, old_bytes, t_ns: c.t_ns });
        }
        blocks += owner.len();
    }
    // Processes run side by side: the peak of their sum, by time.
    deltas.sort_by_key(|&(t, d)| (t, d));
    let (mut live, mut peak) = (0i64, 0i64);
    for (_, d) in deltas {
        live = live.saturating_add(d);
        peak = peak.max(live);
    }
    Ok(Compiled { threads, blocks, peak_live_bytes: peak as u64, cross_thread_calls: cross })
}

/// What every replay thread shares.
struct Shared<'a> {
    slots: Vec<AtomicUsize>,
    /// Set when a thread fails or Ctrl-C stops the run: waits give up.
    abort: AtomicBool,
    progress: &'a RunProgress,
}

/// One replay thread's counters.
struct Replayer<'a, C: Clock> {
    alloc: ReplayAllocator,
    touch: bool,
    clock: &'a C,
    sampler: OpSampler,
    alloc_ns: Histogram<u64>,
    free_ns: Histogram<u64>,
    allocs: u64,
    frees: u64,
    calls: u64,
    bytes_allocated: u64,
    bytes_freed: u64,
    replay_ns: u64,
    live_published: i64,
}

impl<'a, C: Clock> Replayer<'a, C> {
    /// The block in `slot`, taken out of it: for a block of another thread, once it exists.
    #[inline]
    fn take(&self, shared: &Shared, slot: u32, wait: bool) -> Option<usize> {
        let s = &shared.slots[slot as usize];
        if !wait {
            let p = s.load(Ordering::Relaxed);
            s.store(0, Ordering::Relaxed);
            return Some(p);
        }
        let mut spins = 0u32;
        loop {
            let p = s.swap(0, Ordering::Acquire);
            if p != 0 {
                return Some(p);
            }
            if shared.abort.load(Ordering::Relaxed) {
                return None;
            }
            if spins % 1024 == 1023 && crate::interrupt::interrupted() {
                shared.abort.store(true, Ordering::Relaxed);
                return None;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Makes the call `op` creates a block with, timing one in [`super::driver::LATENCY_SAMPLE_EVERY`].
    #[inline(always)]
    fn create(&mut self, op: &Op, old: usize) -> usize {
        let sampled = self.sampler.due();
        let t0 = if sampled { Some(self.clock.start()) } else { None };
        let p = match self.alloc {
            ReplayAllocator::Null => NULL_ALLOCATOR_BLOCK as *mut libc::c_void,
            // SAFETY: the malloc family with sizes from the trace (below 1 EiB, checked on read);
            // `old` is a live block of this allocator taken out of its slot (so given back once),
            // or null.
            ReplayAllocator::Libc => unsafe {
                let bytes = op.bytes as usize;
                match op.kind {
                    Kind::Malloc => libc::malloc(bytes),
                    Kind::Calloc => libc::calloc(1, bytes),
                    Kind::Aligned => {
                        let mut p = std::ptr::null_mut();
                        let align = (1usize << op.align_log2).max(std::mem::size_of::<usize>());
                        if libc::posix_memalign(&mut p, align, bytes) != 0 {
                            p = std::ptr::null_mut();
                        }
                        p
                    }
                    Kind::Realloc => libc::realloc(old as *mut libc::c_void, bytes),
                    Kind::Free => unreachable!("a free creates nothing"),
                }
            },
        };
        if let Some(t0) = t0 {
            let _ = self.alloc_ns.record(self.clock.elapsed_ns(t0));
        }
        self.allocs += 1;
        self.bytes_allocated += op.bytes;
        if p.is_null() {
            return EMPTY_BLOCK;
        }
        if self.touch && op.bytes > 0 {
            // SAFETY: `p` is a fresh, non-null block of `op.bytes` > 0 bytes from the malloc
            // family (the null allocator never runs with touching: `drive_holding` refuses it).
            unsafe { touch(p as *mut u8, op.bytes as usize) };
        }
        p as usize
    }

    #[inline(always)]
    fn free(&mut self, p: usize, bytes: u64) {
        self.frees += 1;
        self.bytes_freed += bytes;
        if p == EMPTY_BLOCK || self.alloc == ReplayAllocator::Null {
            return;
        }
        if self.sampler.due() {
            let t0 = self.clock.start();
            // SAFETY: `p` is a live block of this allocator, taken out of its slot (freed once).
            unsafe { libc::free(p as *mut libc::c_void) };
            let _ = self.free_ns.record(self.clock.elapsed_ns(t0));
        } else {
            // SAFETY: as above.
            unsafe { libc::free(p as *mut libc::c_void) };
        }
    }

    fn publish_live(&mut self, shared: &Shared) {
        shared.progress.publish_live(self.bytes_allocated, self.bytes_freed, &mut self.live_published);
    }

    /// One pass over this thread's ops, from `began` (paced: no call before its recorded time).
    /// Returns false if the run was aborted.
    fn pass(&mut self, ops: &[Op], shared: &Shared, pace: bool, began: Instant) -> anyhow::Result<bool> {
        let t0 = Instant::now();
        // The clock is read only when the recorded time has moved on by this much.
        const PACE_CHECK_NS: u64 = 50_000;
        let mut checked_at = 0u64;
        for (i, op) in ops.iter().enumerate() {
            if pace && op.t_ns >= checked_at + PACE_CHECK_NS {
                checked_at = op.t_ns;
                let now = began.elapsed().as_nanos() as u64;
                if op.t_ns > now {
                    self.publish_live(shared);
                    // In naps of at most 50 ms, so that Ctrl-C or another thread's failure ends
                    // the wait.
                    let until = began + Duration::from_nanos(op.t_ns);
                    loop {
                        if crate::interrupt::interrupted() {
                            shared.abort.store(true, Ordering::Relaxed);
                        }
                        if shared.abort.load(Ordering::Relaxed) {
                            self.replay_ns += t0.elapsed().as_nanos() as u64;
                            return Ok(false);
                        }
                        let now = Instant::now();
                        if now >= until {
                            break;
                        }
                        std::thread::sleep((until - now).min(Duration::from_millis(50)));
                    }
                }
            }
            let old = if op.old != NONE {
                match self.take(shared, op.old, op.wait) {
                    Some(p) => p,
                    None => return Ok(false),
                }
            } else {
                0
            };
            if op.kind == Kind::Free {
                self.free(old, op.old_bytes);
            } else {
                if op.kind == Kind::Realloc && op.old != NONE {
                    // realloc gives the old block back (its size leaves the live count).
                    self.bytes_freed += op.old_bytes;
                    self.frees += 1;
                }
                let old_ptr = if old == EMPTY_BLOCK { 0 } else { old };
                let p = self.create(op, old_ptr);
                if p == EMPTY_BLOCK && op.bytes > 0 {
                    shared.abort.store(true, Ordering::Relaxed);
                    anyhow::bail!("malloc returned NULL for {} bytes: the machine is out of memory", op.bytes);
                }
                // Release: a thread that waits for this block sees it whole.
                shared.slots[op.new as usize].store(p, Ordering::Release);
            }
            self.calls += 1;
            if i % 4096 == 4095 {
                self.publish_live(shared);
                if crate::interrupt::interrupted() {
                    shared.abort.store(true, Ordering::Relaxed);
                }
                if shared.abort.load(Ordering::Relaxed) {
                    self.replay_ns += t0.elapsed().as_nanos() as u64;
                    return Ok(false);
                }
            }
        }
        self.replay_ns += t0.elapsed().as_nanos() as u64;
        self.publish_live(shared);
        Ok(true)
    }

    /// Frees what is left of the blocks this thread created.
    fn free_leftovers(&mut self, created: &[u32], sizes: &dyn Fn(u32) -> u64, shared: &Shared) {
        let t0 = Instant::now();
        for &slot in created {
            let p = shared.slots[slot as usize].swap(0, Ordering::AcqRel);
            if p != 0 {
                self.free(p, sizes(slot));
            }
        }
        self.replay_ns += t0.elapsed().as_nanos() as u64;
        self.publish_live(shared);
    }
}

/// Replays `compiled` with `alloc`, calling `while_held(all_ok, workers)` after the last free while
/// the replay threads are still alive (as [`super::driver::drive_holding`] does).
pub fn drive_holding<C: Clock, R>(
    compiled: &Compiled,
    alloc: ReplayAllocator,
    opts: &ReplayOptions,
    progress: &RunProgress,
    clock: &C,
    while_held: impl FnOnce(bool, &HeldWorkers) -> R,
) -> anyhow::Result<(DriverOutcome, R)> {
    if opts.touch && alloc == ReplayAllocator::Null {
        anyhow::bail!("the null allocator hands out no memory: it replays only with page touching off");
    }
    // The size of every block, for leftovers freed at a pass's end.
    let mut sizes = vec![0u64; compiled.blocks];
    for t in &compiled.threads {
        for op in &t.ops {
            if op.new != NONE {
                sizes[op.new as usize] = op.bytes;
            }
        }
    }
    let size_of = |slot: u32| sizes[slot as usize];
    let shared = Shared { slots: (0..compiled.blocks).map(|_| AtomicUsize::new(0)).collect(), abort: AtomicBool::new(false), progress };
    let n = compiled.threads.len().max(1);
    let start_line = Barrier::new(n);
    let pass_end = Barrier::new(n);
    let leftovers_freed = Barrier::new(n);
    let again = AtomicBool::new(false);
    let finished = Barrier::new(n + 1);
    let failed = AtomicBool::new(false);
    let passes = std::sync::atomic::AtomicU64::new(0);
    let (job_senders, job_receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel::<WorkerJob>()).unzip();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let empty = ThreadOps { ops: Vec::new(), created: Vec::new() };
    let mut start = Instant::now();
    let (results, wall_s, held) = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (w, jobs) in job_receivers.into_iter().enumerate() {
            let thread = compiled.threads.get(w).unwrap_or(&empty);
            let (shared, start_line, pass_end, leftovers_freed, again, finished, failed, passes, done_tx, size_of) =
                (&shared, &start_line, &pass_end, &leftovers_freed, &again, &finished, &failed, &passes, done_tx.clone(), &size_of);
            let deadline_after = opts.duration;
            handles.push(scope.spawn(move || -> anyhow::Result<Replayer<C>> {
                let mut r = Replayer {
                    alloc,
                    touch: opts.touch,
                    clock,
                    sampler: OpSampler::for_worker(w),
                    alloc_ns: histogram(),
                    free_ns: histogram(),
                    allocs: 0,
                    frees: 0,
                    calls: 0,
                    bytes_allocated: 0,
                    bytes_freed: 0,
                    replay_ns: 0,
                    live_published: 0,
                };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> anyhow::Result<()> {
                    start_line.wait();
                    let began = Instant::now();
                    loop {
                        let pass_began = Instant::now();
                        let ok = r.pass(&thread.ops, shared, opts.pace, pass_began);
                        let ok = match ok {
                            Ok(ok) => ok,
                            Err(e) => {
                                shared.abort.store(true, Ordering::Relaxed);
                                // No thread goes round again (thread 0 decides at the pass's end;
                                // this may be thread 0).
                                again.store(false, Ordering::Relaxed);
                                pass_end.wait();
                                r.free_leftovers(&thread.created, size_of, shared);
                                leftovers_freed.wait();
                                return Err(e);
                            }
                        };
                        pass_end.wait();
                        // Every thread is done with the pass: what is left is freed by its creator.
                        r.free_leftovers(&thread.created, size_of, shared);
                        if w == 0 {
                            let n = passes.fetch_add(1, Ordering::Relaxed) + 1;
                            shared.progress.iteration.store(n, Ordering::Relaxed);
                            let more = ok && !shared.abort.load(Ordering::Relaxed) && deadline_after.is_some_and(|d| began.elapsed() < d);
                            again.store(more, Ordering::Relaxed);
                        }
                        leftovers_freed.wait();
                        if !again.load(Ordering::Relaxed) || shared.abort.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                    }
                }))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a replay thread panicked")));
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                finished.wait();
                serve_jobs(jobs, &done_tx);
                result.map(|()| r)
            }));
        }
        drop(done_tx);
        start = Instant::now();
        finished.wait();
        let wall_s = start.elapsed().as_secs_f64();
        let workers = HeldWorkers::new(job_senders, done_rx);
        let held = while_held(!failed.load(Ordering::Relaxed), &workers);
        drop(workers);
        let results: Vec<anyhow::Result<Replayer<C>>> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a replay thread panicked")))).collect();
        (results, wall_s, held)
    });
    let mut alloc_ns = histogram();
    let mut free_ns = histogram();
    let (mut allocs, mut frees, mut calls, mut replay_ns, mut bytes_allocated, mut bytes_freed) = (0, 0, 0, 0, 0, 0);
    for r in results {
        let r = r?;
        alloc_ns.add(&r.alloc_ns).expect("same bounds");
        free_ns.add(&r.free_ns).expect("same bounds");
        allocs += r.allocs;
        frees += r.frees;
        calls += r.calls;
        replay_ns = replay_ns.max(r.replay_ns);
        bytes_allocated += r.bytes_allocated;
        bytes_freed += r.bytes_freed;
    }
    let passes = passes.load(Ordering::Relaxed);
    Ok((
        DriverOutcome {
            allocs,
            frees,
            events: calls,
            iterations: passes,
            passes,
            bytes_allocated,
            bytes_freed,
            alloc_ns,
            free_ns,
            replay_ns,
            wall_s,
            interrupted: shared.abort.load(Ordering::Relaxed) && crate::interrupt::interrupted(),
        },
        held,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::recorded::Recorded;

    fn call(thread: u32) -> Recorded {
        Recorded { thread, t_ns: 0, call: Call::Malloc { bytes: 8 } }
    }

    #[test]
    fn threads_that_never_overlap_share_a_lane() {
        // 0 runs throughout; 1 then 2 then 3 one after another; 4 overlaps 3.
        let calls: Vec<Recorded> = [0, 1, 1, 0, 2, 2, 0, 3, 4, 3, 4, 0].into_iter().map(call).collect();
        let (lane_of, n) = lanes(&calls, 5);
        assert_eq!(n, 3);
        assert_eq!(lane_of[1], lane_of[2]);
        assert_eq!(lane_of[2], lane_of[3]);
        assert_ne!(lane_of[3], lane_of[4]);
        assert_ne!(lane_of[0], lane_of[1]);
        assert_ne!(lane_of[0], lane_of[4]);
    }
}
