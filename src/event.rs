//! The event model every workload, trace and snapshot is turned into.

/// One thing a workload does to an allocator. Ids are logical names chosen by the workload,
/// never addresses; an id may be reused once its allocation has been freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Allocate `bytes` on `stream` and call the allocation `id`. 0 bytes is PyTorch's null
    /// pointer (NativeCachingAllocator::allocate calls malloc only `if (size != 0)`): the replay
    /// makes no allocator call for it and its free is a no-op.
    Alloc { id: u64, bytes: u64, stream: u64 },
    /// Free the live allocation `id`.
    Free { id: u64 },
    /// `torch.cuda.empty_cache()`: release every cached, fully free segment.
    EmptyCache,
    /// An iteration boundary: the events after it belong to step `n`.
    Step { n: u64 },
    /// `tensor.record_stream(stream)` on the live allocation `id`: work queued on `stream` uses
    /// it, so its free is deferred until that work completes (recordStream; free → insert_events
    /// records one CUDA event per using stream). A use on the allocation's own stream is no use.
    RecordStream { id: u64, stream: u64 },
    /// `stream` (or, `None`, the whole device) completes the work queued so far: the events
    /// recorded on it are done, and the deferred frees land at the allocator's next
    /// process_events (the start of the next malloc) or synchronize_and_free_events.
    Sync { stream: Option<u64> },
    /// A private-pool call (CUDA graph captures, MemPools): see [`PoolOp`].
    Pool(PoolOp),
}

/// The private-pool calls of CUDACachingAllocator, as a trace records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolOp {
    /// beginAllocateToPool: allocations on `stream` (every stream, `None`: MemPool's
    /// use_mem_pool routes the calling thread) go to private pool `pool` until its
    /// [`PoolOp::End`]. A CUDA graph capture (`torch.cuda.graph`) is one, on its capture
    /// stream; a pool made by a begin lives until a [`PoolOp::Release`] per begin.
    Begin { pool: u64, stream: Option<u64> },
    /// `stream` joined the capture allocating to `pool` (it waited on the capture stream, so
    /// CUDA captures its work too): its allocations go to the pool until the [`PoolOp::End`]
    /// (the graph's filter matches every stream of its capture).
    Join { pool: u64, stream: u64 },
    /// endAllocateToPool: allocations stop going to `pool` (capture_end).
    End { pool: u64 },
    /// releasePool: one user of `pool` is gone (the graph was reset or destroyed, the MemPool
    /// deleted); once none is left, empty_cache (or the OOM path) may free its cached segments.
    Release { pool: u64 },
    /// emptyCache(mempool_id): only `pool`'s free segments are released, and only once it has no
    /// user left (a MemPool's destructor releases its use, then empties its pool).
    EmptyCache { pool: u64 },
    /// setUseOnOOM (`torch.cuda.MemPool(use_on_oom=True)`): an allocation outside the pool that
    /// finds no cached block and no device memory takes a free block of `pool` before the
    /// allocator frees its cache and retries.
    UseOnOom { pool: u64 },
}

impl Event {
    pub fn op_name(&self) -> &'static str {
        match self {
            Event::Alloc { .. } => "alloc",
            Event::Free { .. } => "free",
            Event::EmptyCache => "empty_cache",
            Event::Step { .. } => "step",
            Event::RecordStream { .. } => "record_stream",
            Event::Sync { .. } => "sync",
            Event::Pool(PoolOp::Begin { .. }) => "pool_begin",
            Event::Pool(PoolOp::End { .. }) => "pool_end",
            Event::Pool(PoolOp::Join { .. }) => "pool_join",
            Event::Pool(PoolOp::Release { .. }) => "pool_release",
            Event::Pool(PoolOp::EmptyCache { .. }) => "empty_cache",
            Event::Pool(PoolOp::UseOnOom { .. }) => "pool_use_on_oom",
        }
    }
}

/// A stream of events that may fail part-way (a trace file with a bad line).
pub type EventStream<'a> = Box<dyn Iterator<Item = anyhow::Result<Event>> + 'a>;

/// Adapts an infallible generator into an [`EventStream`].
/// A `step` marker numbered `n` after the last one, `last`: step numbers increase (a step is the
/// events after its marker), or the message that says they must.
pub fn check_step_order(last: Option<u64>, n: u64) -> Result<(), String> {
    match last {
        Some(last) if n <= last => Err(format!("step {n} after step {last}: step numbers must increase")),
        _ => Ok(()),
    }
}

pub fn infallible<'a, I: Iterator<Item = Event> + 'a>(events: I) -> EventStream<'a> {
    Box::new(events.map(Ok))
}

/// The most bytes the events hold at once, each allocation's size mapped through `size` (the CPU
/// The `step` rows among `events`.
pub fn step_count(events: &[Event]) -> u64 {
    events.iter().filter(|e| matches!(e, Event::Step { .. })).count() as u64
}

/// driver's `--scale`); frees of ids that are not live are ignored.
pub fn peak_live_bytes(events: impl Iterator<Item = anyhow::Result<Event>>, size: impl Fn(u64) -> u64) -> anyhow::Result<u64> {
    let mut live: rustc_hash::FxHashMap<u64, u64> = rustc_hash::FxHashMap::default();
    let (mut cur, mut peak) = (0u64, 0u64);
    for ev in events {
        match ev? {
            Event::Alloc { id, bytes, .. } => {
                // Requests reach 1 EiB (units::MAX_REQUEST_BYTES): a sum of them may pass u64.
                let b = size(bytes);
                cur = cur.saturating_add(b);
                cur = cur.saturating_sub(live.insert(id, b).unwrap_or(0));
                peak = peak.max(cur);
            }
            Event::Free { id } => cur = cur.saturating_sub(live.remove(&id).unwrap_or(0)),
            _ => {}
        }
    }
    Ok(peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_live_follows_allocs_and_frees() {
        let evs = [
            Event::Alloc { id: 1, bytes: 10, stream: 0 },
            Event::Alloc { id: 2, bytes: 20, stream: 0 },
            Event::Free { id: 1 },
            Event::Alloc { id: 3, bytes: 5, stream: 0 },
        ];
        assert_eq!(peak_live_bytes(evs.iter().copied().map(Ok), |b| b).unwrap(), 30);
        assert_eq!(peak_live_bytes(evs.iter().copied().map(Ok), |b| b / 2).unwrap(), 15);
    }
}
