//! PyTorch's CUDA caching allocator policy (`c10/cuda/CUDACachingAllocator.cpp`, torch 2.x),
//! re-implemented over the [`Device`] trait. Rules cite the function they come from in
//! `c10/cuda/CUDACachingAllocator.cpp`; the conf keys and their parsing follow
//! `c10/core/AllocatorConfig.cpp`.
//!
//! Cross-stream uses are modelled deterministically: `record_stream` adds a using stream, a free
//! of a used block records one event per using stream (insert_events) and leaves the block
//! active but not allocated ("active_pending_free") until a `sync` of those streams completes the
//! events; the block then returns to its pool at the next malloc (process_events) or at
//! empty_cache/the OOM path (synchronize_and_free_events).
//!
//! Private pools (CUDA graph captures, MemPools) follow beginAllocateToPool / endAllocateToPool /
//! releasePool: each has its own BlockPool pair, the allocations on a capturing stream go there,
//! and a pool no one uses gives its free segments back at release_cached_blocks.
//!
//! Note [What is not modelled]: MemPools with a custom allocator and their use_on_oom/no_split
//! options, graph_capture_record_stream_reuse, free-memory callbacks (IPC), and event completion by the passage of time (only a `sync`
//! completes work).

mod expandable;
mod free_set;

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use super::config::AllocatorConfig;
use super::device::{Device, DeviceError};
use super::stats::{DeviceStats, PoolKind};
use super::{segment_type, AllocError, GpuAllocator, Handle, OomInfo, NULL_HANDLE};
use crate::gpu::torch_version::FreeBlockOrder;
use crate::results::{BlockSnapshot, BlockState, GpuPolicy, SegmentSnapshot};
use crate::units::MIB;
use free_set::{FreeKey, FreeSet};

/// kMinBlockSize: every request is rounded to a multiple of 512 bytes.
pub const MIN_BLOCK_SIZE_BYTES: u64 = 512;
/// kSmallSize: rounded sizes up to 1 MiB go to the small pool.
pub const SMALL_SIZE_BYTES: u64 = MIB;
/// kSmallBuffer: small-pool segments are 2 MiB.
pub const SMALL_BUFFER_BYTES: u64 = 2 * MIB;
/// kMinLargeAlloc: large requests under 10 MiB share a `large_segment_size` segment.
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 * MIB;
/// kRoundLarge: larger segments are rounded up to 2 MiB.
pub const ROUND_LARGE_BYTES: u64 = 2 * MIB;

/// No block: a link to nothing. Index 0 is a sentinel that is never free (allocated, size 0),
/// so a merge with "no neighbour" fails as one with an allocated neighbour does and a link fix
/// to nothing writes the sentinel: no branch on whether a neighbour exists (data, and hot).
const NIL: u32 = 0;
/// `Block::segment` of an ordinary (not expandable) segment's block.
const NOT_EXPANDABLE: u32 = u32::MAX;

/// round_size(n): 512-byte rounding, or the next power-2 division for sizes above 512·d.
#[inline]
pub fn round_size(cfg: &AllocatorConfig, n: u64) -> u64 {
    if n < MIN_BLOCK_SIZE_BYTES {
        return MIN_BLOCK_SIZE_BYTES;
    }
    let divisions = roundup_divisions(cfg, n);
    if divisions > 1 && n > MIN_BLOCK_SIZE_BYTES * divisions {
        roundup_power2_next_division(n, divisions)
    } else {
        n.div_ceil(MIN_BLOCK_SIZE_BYTES) * MIN_BLOCK_SIZE_BYTES
    }
}

/// The divisions of n's bucket: idx = clamp(floor(log2 n) − 20, 0, 15).
#[inline]
fn roundup_divisions(cfg: &AllocatorConfig, n: u64) -> u64 {
    let idx = (n.ilog2() as i64 - 20).clamp(0, 15) as usize;
    cfg.roundup_power2_divisions[idx]
}

/// roundup_power2_next_division: n rounded up to a multiple of (largest power of two ≤ n) / d.
fn roundup_power2_next_division(n: u64, divisions: u64) -> u64 {
    if n.is_power_of_two() {
        return n;
    }
    let floor = 1u64 << n.ilog2();
    let step = floor >> divisions.ilog2();
    if step == 0 {
        return floor << 1;
    }
    n.div_ceil(step) * step
}

/// get_allocation_size(rs): 2 MiB for the small pool, `large_segment_size` below 10 MiB, else
/// rounded up to 2 MiB.
pub fn allocation_size(cfg: &AllocatorConfig, rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE_BYTES {
        SMALL_BUFFER_BYTES
    } else if rounded < MIN_LARGE_ALLOC_BYTES {
        cfg.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
    }
}

/// Which of a BlockPool pair a rounded size goes to: the small pool up to 1 MiB (kSmallSize).
pub fn pool_for(rounded: u64) -> PoolKind {
    if rounded <= SMALL_SIZE_BYTES {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// A BlockPool: the allocator's small (0) and large (1) pools, then a small and a large pool per
/// private pool (a CUDA graph's or a MemPool's: PrivatePool::small_blocks/large_blocks). Small
/// pools are the even ones, so the kind, which the stats go by (get_stat_types_for_pool), is the
/// low bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolId(u32);

impl PoolId {
    const LARGE: PoolId = PoolId(PoolKind::Large as u32);
    const SMALL: PoolId = PoolId(PoolKind::Small as u32);

    /// The pool of `kind` in the pair that starts at `pair` (an even id).
    #[inline(always)]
    fn in_pair(pair: u32, kind: PoolKind) -> PoolId {
        PoolId(pair + kind as u32)
    }

    #[inline(always)]
    fn kind(self) -> PoolKind {
        if self.0 & 1 == 0 {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    #[inline(always)]
    fn index(self) -> usize {
        self.0 as usize
    }

    fn is_private(self) -> bool {
        self.0 >= 2
    }
}

const _: () = assert!(PoolKind::Small as u32 == 0 && PoolKind::Large as u32 == 1, "a pair's small pool is its even id");

/// One cache line per block (56 bytes of fields would otherwise straddle two lines in seven
/// blocks of eight).
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Block {
    ptr: u64,
    /// 0 marks a dead slab slot.
    size: u64,
    requested: u64,
    prev: u32,
    next: u32,
    stream: u32,
    pool: PoolId,
    allocated: bool,
    mapped: bool,
    /// Index into `expandable_segments`, or NOT_EXPANDABLE for an ordinary segment.
    segment: u32,
    /// The block's place in its free-set bin while it is there.
    slot: u32,
    /// The large pool's lookup count when the block was last freed, modulo 2^32 (ages are
    /// differences, exact below 2^32 lookups).
    gc_count_base: u32,
    /// Its segment's place in the free sets' equal-size order ([`key`]), inherited by every
    /// block split from it: 0 where address alone orders them.
    tie_units: u32,
}

impl Block {
    #[inline(always)]
    fn is_split(&self) -> bool {
        // Both links NIL (0) is the one case whose OR is 0: one test, no branch on `||` (hot,
        // and data-dependent).
        self.prev | self.next != NIL
    }
    fn expandable(&self) -> bool {
        self.segment != NOT_EXPANDABLE
    }

    /// The sentinel at index [`NIL`].
    const SENTINEL: Block = Block {
        ptr: 0,
        size: 0,
        requested: 0,
        prev: NIL,
        next: NIL,
        stream: 0,
        pool: PoolId::SMALL,
        allocated: true,
        mapped: true,
        segment: NOT_EXPANDABLE,
        slot: 0,
        gc_count_base: 0,
        tie_units: 0,
    };
}

/// BlockPool: free mapped blocks ordered by (stream, size, address), unmapped expandable blocks
/// ordered by (stream, address), and the GC's lookup counter.
/// (Aligned so that a pool's place is its index shifted, not multiplied: the hot paths find a
/// pool at nearly every allocation and free.)
#[derive(Default, Clone)]
#[repr(align(256))]
struct BlockPool {
    blocks: FreeSet,
    unmapped: BTreeMap<(u32, u64), u32>,
    get_free_blocks_call_count: i64,
}

/// An expandable segment (`expandable.rs`): a reserved VA range of `pages` pages of
/// `page_size` bytes, some of them mapped.
#[derive(Clone)]
struct ExpandableSegment {
    base: u64,
    page_size: u64,
    mapped: Vec<bool>,
}

impl ExpandableSegment {
    fn va_size(&self) -> u64 {
        self.page_size * self.mapped.len() as u64
    }
}

/// The caching allocator over device `D`.
pub struct CachingAllocator<D: Device> {
    cfg: AllocatorConfig,
    device: D,
    blocks: Vec<Block>,
    dead: Vec<u32>,
    /// The BlockPools by [`PoolId`]: the allocator's pair, then one pair per private pool.
    pools: Vec<BlockPool>,
    stats: DeviceStats,
    /// floor(fraction × capacity) when a memory fraction below 1 is set.
    allowed: Option<u64>,
    /// [`AllocatorConfig::gc_enabled`].
    gc_enabled: bool,
    /// No roundup_power2_divisions above 1: every size rounds to a multiple of 512 bytes.
    plain_rounding: bool,
    /// should_split's rule for a large-pool block: (the least remainder, the request size it
    /// applies below): a remainder over 1 MiB below max_split_size, or with expandable segments
    /// any remainder of 512 bytes.
    large_split_rule: (u64, u64),
    /// Raw stream handles → dense ids in order of first use (the default stream 0 first).
    streams: FxHashMap<u64, u32>,
    raw_streams: Vec<u64>,
    expandable_segments: Vec<Option<ExpandableSegment>>,
    events: StreamEvents,
    /// graph_pools: the private pools that exist, by id; those with no user left (use_count 0)
    /// are graph_pools_freeable.
    private_pools: BTreeMap<u64, PrivatePool>,
    /// The pool that owns each private BlockPool pair (`pair / 2 - 1`), while it exists.
    pair_owner: Vec<Option<u64>>,
    /// captures_underway: the pools being allocated to, and whose allocations go there.
    captures_underway: Vec<CaptureUnderway>,
    /// BlockPool pairs of erased private pools, for the next pool to reuse.
    spare_pairs: Vec<u32>,
    /// How equal-size free blocks are ordered ([`key`]), and the next segment's (or block's)
    /// `tie_units` there.
    order: FreeBlockOrder,
    next_tie_units: u32,
    /// [`TorchVersion::captures_are_counted`](crate::gpu::torch_version::TorchVersion::captures_are_counted).
    captures_counted: bool,
    /// alloc_block refused the request under throw_on_cudamalloc_oom (read once by the caller).
    rejected: bool,
    /// [`TorchVersion::use_on_oom_before_flush`](crate::gpu::torch_version::TorchVersion::use_on_oom_before_flush).
    use_on_oom_first: bool,
}

/// PrivatePool: a CUDA graph's (or a MemPool's) own BlockPool pair. `use_count` counts the
/// captures/MemPools using it; `cuda_malloc_count` its live segments, which keep it in
/// existence after its last user is gone until empty_cache frees them. (An expandable segment
/// counts once, from its address reservation to its release: PyTorch counts its maps and
/// unmaps, which need not pair up, and would erase a pool whose pages are still mapped.)
#[derive(Clone)]
struct PrivatePool {
    pair: u32,
    use_count: u64,
    cuda_malloc_count: u64,
    /// setUseOnOOM: an allocation outside it may take its free blocks before the cache flush.
    use_on_oom: bool,
}

/// An entry of captures_underway: allocations on `stream` (every stream when `None`) go to
/// private pool `pool`, whose BlockPools start at `pair`.
#[derive(Clone)]
struct CaptureUnderway {
    pool: u64,
    pair: u32,
    stream: Option<u32>,
}

/// The cross-stream state of recordStream / insert_events / process_events: which live blocks
/// other streams use, and the freed blocks waiting for those streams' events.
#[derive(Default, Clone)]
struct StreamEvents {
    /// Block::stream_uses: live block → the raw streams (other than its own) that used it.
    stream_uses: FxHashMap<u32, Vec<u64>>,
    /// Block::event_count of each freed block still waiting.
    event_count: FxHashMap<u32, u32>,
    /// cuda_events: per raw stream, the blocks whose event on it has not completed, in order.
    queued: BTreeMap<u64, VecDeque<u32>>,
    /// Events completed by a sync, not yet seen by process_events.
    completed: Vec<u32>,
    /// needs_events_deferred_until_no_capture: blocks used by other streams and freed while a
    /// capture was underway (their `stream_uses` stay until the events are inserted).
    deferred_until_no_capture: Vec<u32>,
    /// block_to_cudagraph_stream_uses: the uses recorded while a capture was underway, which
    /// the capture's end completes (remove_graph_stream_uses).
    graph_stream_uses: FxHashMap<u32, Vec<u64>>,
}

impl StreamEvents {
    /// A free block that is not free yet: waiting for its events (event_count > 0), or freed
    /// during a capture with its stream uses not yet turned into events (try_merge_blocks and
    /// the free sets skip both).
    #[inline(always)]
    fn is_pending(&self, block: u32) -> bool {
        // (Nearly always both are empty: one test for that.)
        (self.event_count.len() | self.deferred_until_no_capture.len()) != 0 && self.is_pending_slow(block)
    }

    #[inline(never)]
    fn is_pending_slow(&self, block: u32) -> bool {
        self.event_count.contains_key(&block) || self.deferred_until_no_capture.contains(&block)
    }
}

/// Whether free_block's block is freed by the same call (free with no other stream's work to
/// wait for) or was freed earlier and waited for events: the allocation counters then moved at
/// the free.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FreedNow {
    Yes,
    Earlier,
}

/// The blocks' base address, taken once by a path that makes no block (so `blocks` does not
/// move while it is held): a block's load is then one load, not a reload of the vector's
/// address first (the compiler cannot tell that the stores of a free set or a block leave it).
#[derive(Clone, Copy)]
struct Slab(*mut Block);

impl Slab {
    /// Block `i`, an index the allocator stored itself (see [`CachingAllocator::block`]).
    #[inline(always)]
    fn at<'a>(self, i: u32) -> &'a mut Block {
        // SAFETY: a Slab lives within one call that makes no block (the vector does not move),
        // and every index the allocator stores is a slot of it. The callers use each block
        // reference before they take another of the same block, and while they hold one they
        // reach `blocks` through no other path.
        unsafe { &mut *self.0.add(i as usize) }
    }
}

/// A free block's place in its pool's set: (stream, size, tie), the tie as `order` has it
/// ([`TorchVersion::free_block_order`]). Before torch 2.12 the tie is the address. In 2.12 it
/// is the block's own creation number (unique: the address never decides). From 2.13 it is (the
/// segment's creation number, address), packed in 64 bits: each new segment is given the next
/// `tie_units` range of 2 MiB units past the last one's (its size in units, plus two for an
/// unaligned base), so `(ptr >> 21) + tie_units` orders segments by creation and blocks of a
/// segment by address, and the address's low 21 bits order within a unit.
///
/// [`TorchVersion::free_block_order`]: crate::gpu::torch_version::TorchVersion::free_block_order
#[inline(always)]
fn key(b: &Block, order: FreeBlockOrder) -> FreeKey {
    let tie = match order {
        FreeBlockOrder::Address => b.ptr,
        FreeBlockOrder::BlockAge => b.tie_units as u64,
        FreeBlockOrder::SegmentAge => {
            let units = ((b.ptr >> TIE_UNIT_BITS) as u32).wrapping_add(b.tie_units);
            (units as u64) << TIE_UNIT_BITS | (b.ptr & ((1 << TIE_UNIT_BITS) - 1))
        }
    };
    FreeKey::new(b.stream, b.size, tie)
}

/// 2 MiB: the unit of [`key`]'s segment order (every segment is a whole number of them).
const TIE_UNIT_BITS: u32 = 21;

impl<D: Device> CachingAllocator<D> {
    pub fn new(cfg: AllocatorConfig, device: D) -> Self {
        let allowed = cfg.allowed_bytes(device.capacity());
        let gc_enabled = cfg.gc_enabled();
        let plain_rounding = cfg.roundup_power2_divisions.iter().all(|&d| d <= 1);
        let large_split_rule = if cfg.expandable_segments { (MIN_BLOCK_SIZE_BYTES, u64::MAX) } else { (SMALL_SIZE_BYTES + 1, cfg.max_split_size) };
        let stats = DeviceStats::new(if cfg.max_split_size == u64::MAX { -1 } else { cfg.max_split_size as i64 });
        let order = cfg.torch.free_block_order();
        let captures_counted = cfg.torch.captures_are_counted();
        let use_on_oom_first = cfg.torch.use_on_oom_before_flush();
        let mut streams = FxHashMap::default();
        streams.insert(0, 0);
        CachingAllocator {
            cfg,
            device,
            blocks: vec![Block::SENTINEL],
            dead: Vec::new(),
            pools: vec![BlockPool::default(), BlockPool::default()],
            private_pools: BTreeMap::new(),
            pair_owner: Vec::new(),
            captures_underway: Vec::new(),
            spare_pairs: Vec::new(),
            order,
            next_tie_units: 1,
            captures_counted,
            rejected: false,
            use_on_oom_first,
            stats,
            allowed,
            gc_enabled,
            plain_rounding,
            large_split_rule,
            streams,
            raw_streams: vec![0],
            expandable_segments: Vec::new(),
            events: StreamEvents::default(),
        }
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.cfg
    }

    /// This allocator in the same state over a fork of its device ([`Device::fork`]).
    fn forked(&self) -> Option<CachingAllocator<Box<dyn Device>>> {
        Some(CachingAllocator {
            cfg: self.cfg.clone(),
            device: self.device.fork()?,
            blocks: self.blocks.clone(),
            dead: self.dead.clone(),
            pools: self.pools.clone(),
            stats: self.stats.clone(),
            allowed: self.allowed,
            gc_enabled: self.gc_enabled,
            plain_rounding: self.plain_rounding,
            large_split_rule: self.large_split_rule,
            streams: self.streams.clone(),
            raw_streams: self.raw_streams.clone(),
            expandable_segments: self.expandable_segments.clone(),
            events: self.events.clone(),
            private_pools: self.private_pools.clone(),
            pair_owner: self.pair_owner.clone(),
            captures_underway: self.captures_underway.clone(),
            spare_pairs: self.spare_pairs.clone(),
            order: self.order,
            next_tie_units: self.next_tie_units,
            captures_counted: self.captures_counted,
            rejected: self.rejected,
            use_on_oom_first: self.use_on_oom_first,
        })
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    /// The dense id of a raw stream. PyTorch keys its free sets by the stream itself and puts
    /// no limit on how many there are (BlockComparatorSize compares `stream` first); neither
    /// does this (a u32 id: more streams than that could not fit in memory anyway).
    #[inline(always)]
    fn stream_id(&mut self, raw: u64) -> u32 {
        // The default stream, inline: nearly every malloc of a trace is on it.
        if raw == 0 {
            return 0;
        }
        self.side_stream_id(raw)
    }

    #[inline(never)]
    fn side_stream_id(&mut self, raw: u64) -> u32 {
        if let Some(&s) = self.streams.get(&raw) {
            return s;
        }
        let s = u32::try_from(self.raw_streams.len()).expect("fewer than 2^32 distinct streams");
        self.streams.insert(raw, s);
        self.raw_streams.push(raw);
        s
    }

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.dead.pop() {
            *self.block_mut(i) = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    /// Starts loading the slot the next [`Self::new_block`] fills (the last dead one), so that a
    /// split's write of its new piece, after the search, finds the line in cache (it missed the
    /// cache at about 4 splits in 10: the slot died at an earlier free).
    #[inline(always)]
    fn prefetch_next_new_block(&self) {
        if let Some(&i) = self.dead.last() {
            crate::hint::prefetch(self.blocks.as_ptr().wrapping_add(i as usize));
        }
    }

    /// The block at `i`, an index the allocator stored itself (a link, a free-set entry, a
    /// block it found): unchecked on the hot paths.
    #[inline(always)]
    fn block(&self, i: u32) -> &Block {
        debug_assert!((i as usize) < self.blocks.len(), "block index {i} out of range");
        // SAFETY: `blocks` never shrinks (dead slots are reused, never removed), and every index
        // the allocator stores was a slot of it when stored; handles from callers are checked
        // where they enter (`free`).
        unsafe { self.blocks.get_unchecked(i as usize) }
    }

    /// [`Self::block`], mutable.
    #[inline(always)]
    fn block_mut(&mut self, i: u32) -> &mut Block {
        debug_assert!((i as usize) < self.blocks.len(), "block index {i} out of range");
        // SAFETY: as in `block`.
        unsafe { self.blocks.get_unchecked_mut(i as usize) }
    }

    fn kill(&mut self, i: u32) {
        self.block_mut(i).size = 0;
        self.dead.push(i);
    }

    /// BlockPool `p`: unchecked on the hot paths, as `pools` never shrinks (an erased private
    /// pool's pair stays, spare for the next) and every PoolId was made for a pair it holds.
    #[inline(always)]
    fn pool(&mut self, p: PoolId) -> &mut BlockPool {
        debug_assert!(p.index() < self.pools.len(), "pool {p:?} out of range");
        // SAFETY: as said above.
        unsafe { self.pools.get_unchecked_mut(p.index()) }
    }

    /// [`Self::pool`], shared.
    #[inline(always)]
    fn pool_ref(&self, p: PoolId) -> &BlockPool {
        debug_assert!(p.index() < self.pools.len(), "pool {p:?} out of range");
        // SAFETY: as in `pool`.
        unsafe { self.pools.get_unchecked(p.index()) }
    }

    /// insert_into_blocks: also stamps the block with the pool's GC lookup count.
    #[inline(always)]
    fn insert_free(&mut self, i: u32) {
        let slab = Slab(self.blocks.as_mut_ptr());
        self.insert_free_in(slab, i)
    }

    /// [`Self::insert_free`] with the blocks' address in hand.
    #[inline(always)]
    fn insert_free_in(&mut self, slab: Slab, i: u32) {
        let b = slab.at(i);
        let (k, p) = (key(b, self.order), b.pool);
        let slot = self.pool(p).blocks.insert(k, i);
        slab.at(i).slot = slot;
        // (Without GC the lookup count stays 0, and so does every stamp.)
        if self.gc_enabled() {
            let count = self.pool_ref(p).get_free_blocks_call_count;
            slab.at(i).gc_count_base = count as u32;
        }
    }

    #[inline(always)]
    fn remove_free(&mut self, i: u32) {
        let slab = Slab(self.blocks.as_mut_ptr());
        self.remove_free_in(slab, i)
    }

    /// [`Self::remove_free`] with the blocks' address in hand.
    #[inline(always)]
    fn remove_free_in(&mut self, slab: Slab, i: u32) {
        let b = slab.at(i);
        let (k, p, slot) = (key(b, self.order), b.pool, b.slot);
        let moved = self.pool(p).blocks.remove(k, slot);
        slab.at(moved).slot = slot;
    }

    /// The rule lives in [`AllocatorConfig::gc_enabled`] (a threshold, and a memory fraction
    /// below 1), asked once at creation.
    #[inline(always)]
    fn gc_enabled(&self) -> bool {
        self.gc_enabled
    }

    /// get_free_block: best fit on the stream, with the expandable and oversize rules.
    #[inline(always)]
    fn get_free_block(&mut self, stream: u32, rounded: u64, pool: PoolId) -> Option<u32> {
        if self.gc_enabled() {
            self.pool(pool).get_free_blocks_call_count += 1;
        }
        let found = self.pool_ref(pool).blocks.first_fit(stream, rounded)?;
        // (Without expandable segments no block is one, and the block is not read here: the
        // entry has its size and slot, so the block's load overlaps the removal.)
        if !self.expandable_segments.is_empty() && self.block(found.block).expandable() {
            return self.get_free_expandable_block(pool, rounded, found.block);
        }
        if !self.may_take_cached(found.key.size(), rounded) {
            return None;
        }
        let moved = self.pool(pool).blocks.remove(found.key, found.slot);
        self.block_mut(moved).slot = found.slot;
        Some(found.block)
    }

    /// get_free_block from an expandable `candidate`: prefer a fitting block whose expandable
    /// size (size + unmapped tail) is smaller, as a non-tail free block beats growing the tail.
    #[inline(never)]
    fn get_free_expandable_block(&mut self, pool: PoolId, rounded: u64, mut candidate: u32) -> Option<u32> {
        let expandable_size = |s: &Self, i: u32| {
            let b = s.block(i);
            b.size + if b.next != NIL && !s.blocks[b.next as usize].mapped { s.blocks[b.next as usize].size } else { 0 }
        };
        let mut at = key(self.block(candidate), self.order);
        while self.block(candidate).expandable() {
            match self.pools[pool.index()].blocks.next_after(at) {
                Some((k, next)) if expandable_size(self, next) < expandable_size(self, candidate) => {
                    candidate = next;
                    at = k;
                }
                _ => break,
            }
        }
        if !self.may_take_cached(self.block(candidate).size, rounded) {
            return None;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    /// get_free_block's oversize rules for a cached block of `size` ≥ `rounded`: not for a small
    /// request, and for an oversize request only if it wastes less than
    /// max_non_split_rounding_size. (Both concern an oversize block: one test skips them.)
    #[inline(always)]
    fn may_take_cached(&self, size: u64, rounded: u64) -> bool {
        let m = self.cfg.max_split_size;
        !(size >= m && (rounded < m || size >= rounded.saturating_add(self.cfg.max_non_split_rounding_size)))
    }

    /// alloc_block: a new segment (or mapped expandable range) for the request.
    fn alloc_block(&mut self, stream: u32, rounded: u64, alloc_size: u64, pool: PoolId, is_retry: bool) -> Result<Option<u32>, DeviceError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.allowed {
            if self.stats.all().reserved_bytes.current as u64 + alloc_size > allowed {
                return Ok(None);
            }
        }
        // throw_on_cudamalloc_oom (torch 2.12+, pytorch#179473): a segment larger than the
        // device's free memory is refused before the device call; the caller throws at once.
        // (Found with the oracle: the cap's own check comes first, and with one process on the
        // card a request within the cap always fits in free memory.)
        if self.cfg.throw_on_cudamalloc_oom && alloc_size > self.device.free_memory() {
            self.rejected = true;
            return Ok(None);
        }
        if self.cfg.expandable_segments {
            return self.try_allocate_expandable_block(stream, pool, rounded);
        }
        let raw_stream = self.raw_streams[stream as usize];
        let ptr = match self.device.malloc(alloc_size, raw_stream) {
            Ok(p) => p,
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(e),
        };
        let tie_units = self.segment_tie_units(ptr, alloc_size);
        let i = self.new_block(Block {
            ptr,
            size: alloc_size,
            requested: 0,
            prev: NIL,
            next: NIL,
            stream,
            pool,
            allocated: false,
            mapped: true,
            segment: NOT_EXPANDABLE,
            gc_count_base: 0,
            tie_units,
            slot: NIL,
        });
        self.stats.change_segments(pool.kind(), 1, alloc_size as i64);
        if alloc_size >= self.cfg.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        if pool.is_private() {
            self.owner_private_pool(pool).cuda_malloc_count += 1;
        }
        Ok(Some(i))
    }

    /// A new segment's `tie_units` ([`key`]). (Past 2^32 units, some 8 PiB of segments created
    /// in one run, or 2^32 blocks in 2.12, later ones share the last place and tie by address.)
    pub(super) fn segment_tie_units(&mut self, ptr: u64, size: u64) -> u32 {
        match self.order {
            FreeBlockOrder::Address => 0,
            FreeBlockOrder::BlockAge => self.block_tie_units(),
            FreeBlockOrder::SegmentAge => {
                let first = self.next_tie_units;
                let units = (size >> TIE_UNIT_BITS).saturating_add(2).min(u32::MAX as u64) as u32;
                self.next_tie_units = first.saturating_add(units);
                first.wrapping_sub((ptr >> TIE_UNIT_BITS) as u32)
            }
        }
    }

    /// The `tie_units` of a block split from `parent` ([`key`]): torch 2.12 numbers every new
    /// Block, later releases number segments.
    #[inline(always)]
    pub(super) fn split_tie_units(&mut self, parent_tie_units: u32) -> u32 {
        match self.order {
            FreeBlockOrder::BlockAge => self.block_tie_units(),
            _ => parent_tie_units,
        }
    }

    fn block_tie_units(&mut self) -> u32 {
        let n = self.next_tie_units;
        self.next_tie_units = n.saturating_add(1);
        n
    }

    /// release_block: cudaFree a whole free segment.
    fn release_block(&mut self, i: u32) -> Result<(), DeviceError> {
        let b = self.blocks[i as usize];
        debug_assert!(!b.is_split() && !b.allocated && !b.expandable());
        self.device.free(b.ptr, b.size)?;
        self.remove_free(i);
        self.stats.change_segments(b.pool.kind(), -1, -(b.size as i64));
        if b.size >= self.cfg.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        if b.pool.is_private() {
            self.owner_private_pool(b.pool).cuda_malloc_count -= 1;
        }
        self.kill(i);
        Ok(())
    }

    /// release_available_cached_blocks: with max_split_size set, free one big-enough oversize
    /// block, or free oversize blocks from the largest down until enough was released.
    fn release_available_cached_blocks(&mut self, stream: u32, rounded: u64, pool: PoolId) -> Result<bool, DeviceError> {
        let m = self.cfg.max_split_size;
        if m == u64::MAX {
            return Ok(false);
        }
        let key_size = rounded.max(m);
        if let Some((_, i)) = self.pools[pool.index()].blocks.first_at_least(stream, key_size) {
            let b = &self.blocks[i as usize];
            if !b.expandable() && !b.is_split() {
                self.release_block(i)?;
                return Ok(true);
            }
        }
        // No single block is large enough: free oversize blocks, largest first.
        let candidates: Vec<u32> =
            self.pools[pool.index()].blocks.below_descending(stream, key_size).into_iter().take_while(|(k, _)| k.size() >= m).map(|(_, i)| i).collect();
        let mut released = 0u64;
        for i in candidates {
            if released >= key_size {
                break;
            }
            let b = &self.blocks[i as usize];
            if !b.expandable() && !b.is_split() {
                released += b.size;
                self.release_block(i)?;
            }
        }
        Ok(released >= key_size)
    }

    /// garbage_collect_cached_blocks: free whole, non-expandable large-pool segments older than
    /// the average age until reserved drops below threshold × allowed.
    fn garbage_collect_cached_blocks(&mut self) -> Result<(), DeviceError> {
        let allowed = self.allowed.unwrap_or(u64::MAX);
        let threshold = (self.cfg.garbage_collection_threshold * allowed as f64) as u64;
        let reserved = self.stats.all().reserved_bytes.current as u64;
        if reserved <= threshold {
            return Ok(());
        }
        let target = reserved - threshold;
        let count = self.pools[PoolId::LARGE.index()].get_free_blocks_call_count;
        let age = |b: &Block| (count as u32).wrapping_sub(b.gc_count_base) as i64;
        let freeable = |b: &Block| !b.is_split() && !b.expandable();
        let mut total_age: i64 = 0;
        let mut freeable_count: i64 = 0;
        for i in self.pools[PoolId::LARGE.index()].blocks.blocks_in_order() {
            let b = &self.blocks[i as usize];
            if freeable(b) {
                total_age += age(b);
                freeable_count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && freeable_count > 0 {
            let age_threshold = total_age as f64 / freeable_count as f64;
            freed_any = false;
            let pass = self.pools[PoolId::LARGE.index()].blocks.blocks_in_order();
            for i in pass {
                let b = &self.blocks[i as usize];
                if freeable(b) && age(b) as f64 >= age_threshold {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    freeable_count -= 1;
                    self.release_block(i)?;
                }
            }
        }
        Ok(())
    }

    /// release_cached_blocks (empty_cache, and the last resort before an OOM).
    fn release_cached_blocks(&mut self, in_capture: bool) -> Result<(), DeviceError> {
        // The allocator's own pools only outside a capture (it syncs).
        if !in_capture {
            self.synchronize_and_free_events();
            self.release_blocks(PoolId::LARGE)?;
            self.release_blocks(PoolId::SMALL)?;
        }
        // graph_pools_freeable: a pool no capture or MemPool uses gives back its free segments,
        // and is erased once it has none left (cudaMalloc_count == 0).
        let freeable: Vec<u64> = self.private_pools.iter().filter(|(_, p)| p.use_count == 0).map(|(&id, _)| id).collect();
        for id in freeable {
            self.release_freeable_pool(id)?;
        }
        Ok(())
    }

    /// A freeable pool gives back its whole free segments (small pool first), and is erased
    /// with its last segment (cudaMalloc_count == 0).
    fn release_freeable_pool(&mut self, id: u64) -> Result<(), DeviceError> {
        let pair = self.private_pools[&id].pair;
        self.release_blocks(PoolId::in_pair(pair, PoolKind::Small))?;
        self.release_blocks(PoolId::in_pair(pair, PoolKind::Large))?;
        if self.private_pools[&id].cuda_malloc_count == 0 {
            // No segment and no address reservation left: the pair is empty, for reuse.
            let empty = |p: &BlockPool| p.blocks.len() == 0 && p.unmapped.is_empty();
            debug_assert!(empty(&self.pools[pair as usize]) && empty(&self.pools[pair as usize + 1]));
            self.private_pools.remove(&id);
            self.pair_owner[pair as usize / 2 - 1] = None;
            self.spare_pairs.push(pair);
        }
        Ok(())
    }

    /// synchronize_and_free_events: wait for every outstanding event, then free its block.
    fn synchronize_and_free_events(&mut self) {
        self.synchronize_and_free_events_of(None);
    }

    /// synchronize_and_free_events(context, pool): with a pool pair, only the events of that
    /// pool's blocks are waited for.
    fn synchronize_and_free_events_of(&mut self, pair: Option<usize>) {
        self.stats.num_sync_all_streams += 1;
        // "This function syncs, so capture should not be underway": the deferred events too
        // (the OOM path of a stream not captured can run while another stream is).
        if !self.capture_underway() {
            self.insert_events_deferred_until_no_capture();
        }
        let Some(pair) = pair else {
            let mut done = std::mem::take(&mut self.events.completed);
            for (_, q) in std::mem::take(&mut self.events.queued) {
                done.extend(q);
            }
            self.complete_events(done);
            return;
        };
        let in_pool = |s: &Self, b: u32| s.block(b).pool.index() & !1 == pair;
        let mut done: Vec<u32> = Vec::new();
        let completed = std::mem::take(&mut self.events.completed);
        let (mine, others): (Vec<u32>, Vec<u32>) = completed.into_iter().partition(|&b| in_pool(self, b));
        done.extend(mine);
        self.events.completed = others;
        let mut queued = std::mem::take(&mut self.events.queued);
        for q in queued.values_mut() {
            let (mine, others): (VecDeque<u32>, VecDeque<u32>) = q.drain(..).partition(|&b| in_pool(self, b));
            done.extend(mine);
            *q = others;
        }
        queued.retain(|_, q| !q.is_empty());
        self.events.queued = queued;
        self.complete_events(done);
    }

    /// process_events (the start of every malloc outside a capture): insert the events deferred
    /// by a capture, then free the blocks whose last event completed.
    #[inline(always)]
    fn process_events(&mut self) {
        if !self.events.deferred_until_no_capture.is_empty() && !self.capture_underway() {
            self.insert_events_deferred_until_no_capture();
        }
        if !self.events.completed.is_empty() {
            let done = std::mem::take(&mut self.events.completed);
            self.complete_events(done);
        }
    }

    /// insert_events_deferred_until_no_capture: the blocks freed during a capture while other
    /// streams used them get their events now, minus the uses recorded during the capture
    /// (remove_graph_stream_uses: the capture's end completed those); no event left frees them.
    #[cold]
    fn insert_events_deferred_until_no_capture(&mut self) {
        // One at a time: the blocks still waiting are not free yet, so free_block must not merge
        // them (try_merge_blocks skips a block with stream uses).
        while !self.events.deferred_until_no_capture.is_empty() {
            let block = self.events.deferred_until_no_capture.remove(0);
            let mut uses = self.events.stream_uses.remove(&block).unwrap_or_default();
            if let Some(graph_uses) = self.events.graph_stream_uses.remove(&block) {
                uses.retain(|s| !graph_uses.contains(s));
            }
            if uses.is_empty() {
                self.free_block(block, FreedNow::Earlier);
            } else {
                self.insert_events(block, uses);
            }
        }
    }

    /// insert_events: one event per using stream; the block is freed when the last completes.
    fn insert_events(&mut self, block: u32, uses: Vec<u64>) {
        self.events.event_count.insert(block, uses.len() as u32);
        for s in uses {
            self.events.queued.entry(s).or_default().push_back(block);
        }
    }

    /// Whether a CUDA graph capture is underway: from torch 2.13 the capture counter
    /// (markCaptureBegin), so a pool begun on a stream, and a MemPool's stream-less routing is no
    /// capture; before 2.13 `!captures_underway.empty()`, MemPools included
    /// ([`TorchVersion::captures_are_counted`]).
    ///
    /// [`TorchVersion::captures_are_counted`]: crate::gpu::torch_version::TorchVersion::captures_are_counted
    #[inline(always)]
    fn capture_underway(&self) -> bool {
        !self.captures_underway.is_empty() && (!self.captures_counted || self.captures_underway.iter().any(|c| c.stream.is_some()))
    }

    /// Whether `stream` is being captured: from torch 2.13 is_capture_context (the current
    /// stream captures); before, any pool being allocated to counts, as in
    /// [`Self::capture_underway`].
    #[inline(always)]
    fn stream_is_capturing(&self, stream: u32) -> bool {
        !self.captures_underway.is_empty() && (!self.captures_counted || self.captures_underway.iter().any(|c| c.stream == Some(stream)))
    }

    /// get_pool: a capture's private pool for allocations on its stream, else the allocator's.
    #[inline(always)]
    fn get_pool(&self, rounded: u64, stream: u32) -> PoolId {
        let kind = pool_for(rounded);
        if !self.captures_underway.is_empty() {
            // In LIFO order: the latest capture whose filter takes the stream.
            if let Some(c) = self.captures_underway.iter().rev().find(|c| c.stream.is_none_or(|s| s == stream)) {
                return PoolId::in_pair(c.pair, kind);
            }
        }
        PoolId(kind as u32)
    }

    /// The id of the private pool that owns BlockPool `pool` (a private one).
    fn private_pool_of(&self, pool: PoolId) -> u64 {
        self.pair_owner[pool.index() / 2 - 1].expect("a private BlockPool has its PrivatePool")
    }

    /// The private pool that owns BlockPool `pool` (a private one).
    fn owner_private_pool(&mut self, pool: PoolId) -> &mut PrivatePool {
        let id = self.private_pool_of(pool);
        self.private_pools.get_mut(&id).expect("a pair's owner exists")
    }

    /// One completed event per entry: `event_count--`, and free_block at zero.
    fn complete_events(&mut self, done: Vec<u32>) {
        for block in done {
            let count = self.events.event_count.get_mut(&block).expect("a completed event belongs to a pending block");
            *count -= 1;
            if *count == 0 {
                self.events.event_count.remove(&block);
                self.free_block(block, FreedNow::Earlier);
            }
        }
    }

    /// release_blocks: cudaFree every whole free segment; unmap the free pages of expandable ones.
    fn release_blocks(&mut self, pool: PoolId) -> Result<(), DeviceError> {
        let all = self.pools[pool.index()].blocks.blocks_in_order();
        let mut to_unmap = Vec::new();
        for i in all {
            let b = &self.blocks[i as usize];
            if b.expandable() {
                to_unmap.push(i);
            } else if !b.is_split() {
                self.release_block(i)?;
            }
        }
        for i in to_unmap {
            self.unmap_block(i)?;
            let b = &self.blocks[i as usize];
            if !b.is_split() && !b.mapped {
                self.release_expandable_segment(i)?;
            }
        }
        Ok(())
    }

    /// try_merge_blocks: absorb a free neighbour with the same mapped state; returns its size.
    #[inline(always)]
    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        let slab = Slab(self.blocks.as_mut_ptr());
        self.try_merge_in(slab, dst, src)
    }

    /// [`Self::try_merge`] with the blocks' address in hand.
    #[inline(always)]
    fn try_merge_in(&mut self, slab: Slab, dst: u32, src: u32) -> u64 {
        // (No neighbour is the sentinel: allocated.)
        let s = slab.at(src);
        // try_merge_blocks: not a block awaiting its events (event_count > 0).
        if s.allocated || s.mapped != slab.at(dst).mapped || self.events.is_pending(src) {
            return 0;
        }
        let (s_ptr, s_size, s_prev, s_next, s_stream, s_pool, s_mapped) = (s.ptr, s.size, s.prev, s.next, s.stream, s.pool, s.mapped);
        if s_mapped {
            self.remove_free_in(slab, src);
        } else {
            self.pool(s_pool).unmapped.remove(&(s_stream, s_ptr));
        }
        let d = slab.at(dst);
        d.size += s_size;
        if d.prev == src {
            d.ptr = s_ptr;
            d.prev = s_prev;
            slab.at(s_prev).next = dst;
        } else {
            d.next = s_next;
            slab.at(s_next).prev = dst;
        }
        self.kill(src);
        s_size
    }

    /// should_split: small pool or expandable: remainder ≥ 512; large pool: rounded < max_split
    /// and remainder > 1 MiB (strictly).
    #[inline(always)]
    fn should_split(&self, i: u32, rounded: u64) -> bool {
        let b = self.block(i);
        let remaining = b.size - rounded;
        // (The pool's rule selected, not branched on: which pool a block is in is data.)
        let small = b.pool.kind() == PoolKind::Small;
        let (large_least_remainder, large_split_below) = self.large_split_rule;
        let least_remainder = std::hint::select_unpredictable(small, MIN_BLOCK_SIZE_BYTES, large_least_remainder);
        let split_below = std::hint::select_unpredictable(small, u64::MAX, large_split_below);
        (remaining >= least_remainder) & (rounded < split_below)
    }

    /// alloc_found_block: split off the low part if worth it; update the stats.
    #[inline(always)]
    fn alloc_found_block(&mut self, found: u32, requested: u64, rounded: u64) -> u32 {
        let mut slab = Slab(self.blocks.as_mut_ptr());
        let f = slab.at(found);
        let (already_split, expandable, pool) = (f.is_split(), f.expandable(), f.pool.kind());
        let mut block = found;
        if self.should_split(found, rounded) {
            let r = slab.at(found);
            let (prev, mut piece) = (r.prev, Block { size: rounded, next: found, allocated: false, requested: 0, ..*r });
            piece.tie_units = self.split_tie_units(piece.tie_units);
            block = self.new_block(piece);
            // (The piece may have grown the vector.)
            slab = Slab(self.blocks.as_mut_ptr());
            slab.at(prev).next = block;
            let rem = slab.at(found);
            rem.prev = block;
            rem.ptr += rounded;
            rem.size -= rounded;
            let rem_size = rem.size;
            self.insert_free_in(slab, found);
            if !expandable {
                // Split before, the piece leaves the inactive bytes; whole before, the remainder
                // is a new inactive split block. (Selected: whether it was split is data.)
                let bytes = std::hint::select_unpredictable(already_split, -(rounded as i64), rem_size as i64);
                let bytes_rise = std::hint::select_unpredictable(already_split, 0, rem_size as i64);
                let blocks = !already_split as i64;
                self.stats.change_inactive_split(pool, [blocks, bytes], [blocks, bytes_rise]);
            }
        } else if already_split && !expandable {
            let size = slab.at(found).size;
            self.stats.change_inactive_split(pool, [-1, -(size as i64)], [0, 0]);
        }
        let b = slab.at(block);
        b.allocated = true;
        b.requested = requested;
        let size = b.size;
        self.stats.allocate(pool, size, requested);
        if size >= self.cfg.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        block
    }

    /// free_block: merge with prev then next, return to the pool, update inactive_split.
    #[inline(always)]
    fn free_block(&mut self, i: u32, freed_now: FreedNow) {
        let slab = Slab(self.blocks.as_mut_ptr());
        let (original_size, requested, pool, prev, next, expandable) = {
            let b = slab.at(i);
            (b.size, b.requested, b.pool.kind(), b.prev, b.next, b.expandable())
        };
        // (Counted without branches: whether a neighbour merged is data.)
        let (from_prev, from_next) = (self.try_merge_in(slab, i, prev), self.try_merge_in(slab, i, next));
        let merged_blocks = (from_prev > 0) as u64 + (from_next > 0) as u64;
        self.insert_free_in(slab, i);
        if !expandable {
            // free_block's net changes of inactive_split: −1 and −size per neighbour absorbed,
            // +1 and +size if the block is still split. Still split, the block brings its own
            // bytes (the merged size less what it absorbed): a gain; whole again, a loss.
            // (Selected, not branched on: whether the block is whole again is data.)
            let still_split = slab.at(i).is_split();
            let absorbed = (from_prev + from_next) as i64;
            let bytes = std::hint::select_unpredictable(still_split, original_size as i64, -absorbed);
            let bytes_rise = std::hint::select_unpredictable(still_split, original_size as i64, 0);
            // (The count rises only when the block is still split and absorbed nothing.)
            let blocks_rise = (still_split & (merged_blocks == 0)) as i64;
            self.stats.change_inactive_split(pool, [still_split as i64 - merged_blocks as i64, bytes], [blocks_rise, bytes_rise]);
        }
        match freed_now {
            FreedNow::Yes => self.stats.release(pool, original_size, requested),
            FreedNow::Earlier => self.stats.deactivate(pool, original_size, requested),
        }
    }

    /// malloc when the cache has no block: GC, a new segment, release oversize cached blocks and
    /// retry, flush the whole cache and retry (a "retry"); else OOM. Out of line: the cached path
    /// is nearly every call.
    #[inline(never)]
    fn malloc_missed(&mut self, stream: u32, bytes: u64, rounded: u64, pool: PoolId) -> Result<Handle, AllocError> {
        let alloc_size = allocation_size(&self.cfg, rounded);
        if self.gc_enabled() {
            self.garbage_collect_cached_blocks()?;
        }
        let mut found = self.alloc_block(stream, rounded, alloc_size, pool, false)?;
        if std::mem::take(&mut self.rejected) {
            self.stats.num_oom_rejections += 1;
            let mut info = self.oom_info(bytes, rounded, alloc_size, pool);
            info.rejected = true;
            return Err(AllocError::OutOfMemory(info));
        }
        // MemPools marked use_on_oom (setUseOnOOM), by id: from torch 2.11 a cached block of
        // theirs comes right after a new segment, before the oversize blocks are freed and the
        // cache is flushed; before 2.11, after the flush's retry (below).
        if found.is_none() && self.use_on_oom_first {
            if let Some(block) = self.use_on_oom_block(stream, rounded, pool) {
                return Ok(self.alloc_found_block(block, bytes, rounded));
            }
        }
        if found.is_none() && self.release_available_cached_blocks(stream, rounded, pool)? {
            found = self.alloc_block(stream, rounded, alloc_size, pool, false)?;
        }
        // Flushing the cache syncs the device: not while this stream is being captured.
        if found.is_none() && !self.stream_is_capturing(stream) {
            self.release_cached_blocks(false)?;
            found = self.alloc_block(stream, rounded, alloc_size, pool, true)?;
        }
        if found.is_none() && !self.use_on_oom_first {
            found = self.use_on_oom_block(stream, rounded, pool);
        }
        match found {
            Some(block) => Ok(self.alloc_found_block(block, bytes, rounded)),
            None => {
                self.stats.num_ooms += 1;
                Err(AllocError::OutOfMemory(self.oom_info(bytes, rounded, alloc_size, pool)))
            }
        }
    }

    /// A free block of a MemPool marked use_on_oom (by pool id) that serves a request of the
    /// allocator's own pools, as get_free_block finds one in that pool's small or large BlockPool.
    fn use_on_oom_block(&mut self, stream: u32, rounded: u64, pool: PoolId) -> Option<u32> {
        // Only for the allocator's own pools: a request routed to a private pool OOMs there.
        if pool.is_private() || !self.private_pools.values().any(|p| p.use_on_oom) {
            return None;
        }
        let pairs: Vec<u32> = self.private_pools.values().filter(|p| p.use_on_oom).map(|p| p.pair).collect();
        pairs.into_iter().find_map(|pair| self.get_free_block(stream, rounded, PoolId::in_pair(pair, pool.kind())))
    }

    /// `pool`: the BlockPool the request searched; only its pair's free blocks could serve it.
    fn oom_info(&self, requested: u64, rounded: u64, alloc_size: u64, pool: PoolId) -> OomInfo {
        let reserved = self.stats.all().reserved_bytes.current as u64;
        let allocated = self.stats.all().allocated_bytes.current as u64;
        let device_free_uncapped = self.device.free_memory();
        let mut device_free = device_free_uncapped;
        if let Some(allowed) = self.allowed {
            device_free = device_free.min(allowed.saturating_sub(reserved));
        }
        let pair = pool.index() & !1;
        OomInfo {
            requested,
            rounded,
            alloc_size,
            device_free,
            device_free_uncapped,
            allowed: self.allowed,
            cached_free: reserved - allocated,
            // Only the pool the request searched could serve it (get_pool: small or large).
            largest_free_block: self.pools[pool.index()].blocks.max_size(),
            other_pools_free: self.pools.iter().enumerate().filter(|(i, _)| i / 2 != pair / 2).flat_map(|(_, p)| p.blocks.iter().map(|(k, _)| k.size())).sum(),
            reserved,
            allocated,
            rejected: false,
        }
    }

    /// The private pools' bookkeeping: each live pair has its pool, each pool counts its segments
    /// and address reservations (cudaMalloc_count), each pool being allocated to has a user, and
    /// spare pairs hold nothing.
    fn check_private_pools(&self) -> Result<(), String> {
        let mut segments: BTreeMap<u64, u64> = BTreeMap::new();
        for b in self.blocks.iter().filter(|b| b.size > 0 && b.prev == NIL && b.pool.is_private()) {
            let owner = self
                .pair_owner
                .get(b.pool.index() / 2 - 1)
                .copied()
                .flatten()
                .ok_or_else(|| format!("block {:#x} is in a private pair no pool owns", b.ptr))?;
            *segments.entry(owner).or_default() += 1;
        }
        for (id, p) in &self.private_pools {
            if self.pair_owner[p.pair as usize / 2 - 1] != Some(*id) {
                return Err(format!("pool {id}'s pair is owned by another"));
            }
            let counted = segments.get(id).copied().unwrap_or(0);
            if p.cuda_malloc_count != counted {
                return Err(format!("pool {id} counts {} segments but holds {counted}", p.cuda_malloc_count));
            }
        }
        for c in &self.captures_underway {
            if self.private_pools.get(&c.pool).is_none_or(|p| p.use_count == 0) {
                return Err(format!("pool {} is being allocated to with no user", c.pool));
            }
        }
        for &pair in &self.spare_pairs {
            let p = &self.pools[pair as usize..pair as usize + 2];
            if self.pair_owner[pair as usize / 2 - 1].is_some() || p.iter().any(|p| p.blocks.len() > 0 || !p.unmapped.is_empty()) {
                return Err(format!("spare pair {pair} is in use"));
            }
        }
        Ok(())
    }

    /// Recounts the stats from the block lists and checks the structural invariants; returns
    /// the first violation. Used by tests (PyTorch checks its stats against its snapshot too).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut allocated = 0u64;
        let mut active = 0u64;
        let mut reserved = 0u64;
        let mut inactive_split_bytes = 0u64;
        let mut inactive_split = 0i64;
        let mut segments = 0i64;
        let mut free_in_sets = 0usize;
        for seg in self.segments() {
            allocated += seg.allocated();
            active += seg.active();
            let mapped: u64 = seg.blocks.iter().map(|b| b.size).sum();
            if mapped != seg.total_size {
                return Err(format!("segment {:#x}: blocks sum to {mapped}, total_size {}", seg.address, seg.total_size));
            }
            reserved += seg.total_size;
            if !seg.is_expandable {
                segments += 1;
                if seg.blocks.len() > 1 {
                    for b in seg.blocks.iter().filter(|b| b.state == BlockState::Inactive) {
                        inactive_split_bytes += b.size;
                        inactive_split += 1;
                    }
                }
            }
        }
        for (p, pool) in self.pools.iter().enumerate() {
            if pool.blocks.len() != pool.blocks.iter().count() {
                return Err("free set length disagrees with its entries".into());
            }
            for (k, i) in pool.blocks.iter() {
                let (s, size, tie) = (k.stream(), k.size(), k.tie());
                let b = &self.blocks[i as usize];
                if key(b, self.order) != k || b.allocated || !b.mapped || b.pool.index() != p {
                    return Err(format!("free set entry ({s}, {size}, {tie:#x}) disagrees with its block"));
                }
                free_in_sets += 1;
            }
        }
        let live_free = self.blocks.iter().enumerate().filter(|&(i, b)| b.size > 0 && !b.allocated && b.mapped && !self.events.is_pending(i as u32)).count();
        if live_free != free_in_sets {
            return Err(format!("{live_free} free mapped blocks but {free_in_sets} in the free sets"));
        }
        // Neighbours are linked both ways and contiguous; no two free mapped neighbours remain.
        for (i, b) in self.blocks.iter().enumerate().filter(|(_, b)| b.size > 0) {
            if b.next != NIL {
                let n = &self.blocks[b.next as usize];
                if n.prev != i as u32 || n.ptr != b.ptr + b.size {
                    return Err(format!("block {:#x}: broken link to next", b.ptr));
                }
                let pending = self.events.is_pending(i as u32) || self.events.is_pending(b.next);
                if !b.allocated && !n.allocated && b.mapped == n.mapped && !pending {
                    return Err(format!("blocks {:#x} and {:#x} are free neighbours that were not merged", b.ptr, n.ptr));
                }
            }
        }
        self.check_private_pools()?;
        let s = &self.stats;
        let checks = [
            ("allocated_bytes", s.all().allocated_bytes.current, allocated as i64),
            ("reserved_bytes", s.all().reserved_bytes.current, reserved as i64),
            ("inactive_split_bytes", s.all().inactive_split_bytes.current, inactive_split_bytes as i64),
            ("inactive_split", s.all().inactive_split.current, inactive_split),
            ("segment", s.all().segment.current, segments),
            ("active_bytes", s.all().active_bytes.current, active as i64),
        ];
        for (name, stat, recount) in checks {
            if stat != recount {
                return Err(format!("{name}.all.current is {stat} but the blocks add up to {recount}"));
            }
        }
        if s.all().allocated_bytes.current > s.all().reserved_bytes.current {
            return Err("allocated > reserved".into());
        }
        if !s.rooms_hold() {
            return Err("a stat group's peak room exceeds a counter's headroom".into());
        }
        if s.all().reserved_bytes.current as u64 > self.device.capacity() {
            return Err("reserved > capacity".into());
        }
        Ok(())
    }
}

impl<D: Device> GpuAllocator for CachingAllocator<D> {
    fn policy(&self) -> GpuPolicy {
        GpuPolicy::Pytorch
    }

    fn fork(&self) -> Option<Box<dyn GpuAllocator>> {
        Some(Box::new(self.forked()?))
    }

    /// malloc, in PyTorch's order: cache hit; else GC, new segment, release oversize cached
    /// blocks and retry, flush the whole cache and retry (a "retry"); else OOM.
    #[inline(always)]
    fn malloc(&mut self, bytes: u64, raw_stream: u64) -> Result<Handle, AllocError> {
        // NativeCachingAllocator::allocate calls malloc only `if (size != 0)`: 0 bytes is a
        // null pointer, made without touching a pool or a stat.
        if bytes == 0 {
            return Ok(NULL_HANDLE);
        }
        // malloc: process_events(context) before looking for a block, unless this stream is being
        // captured (cudaEventQuery is illegal during capture; torch 2.15 asks the capture counter
        // and is_capture_context()).
        let stream = self.stream_id(raw_stream);
        // (Nearly always no capture is underway and no event waits: one test for that.)
        if (self.captures_underway.len() | self.events.deferred_until_no_capture.len() | self.events.completed.len()) != 0 && !self.stream_is_capturing(stream)
        {
            self.process_events();
        }
        // (The default conf's rounding skips the divisions table.)
        let rounded = if self.plain_rounding { bytes.max(1).div_ceil(MIN_BLOCK_SIZE_BYTES) * MIN_BLOCK_SIZE_BYTES } else { round_size(&self.cfg, bytes) };
        let pool = self.get_pool(rounded, stream);
        self.prefetch_next_new_block();
        match self.get_free_block(stream, rounded, pool) {
            Some(block) => Ok(self.alloc_found_block(block, bytes, rounded)),
            None => self.malloc_missed(stream, bytes, rounded, pool),
        }
    }

    #[inline(always)]
    fn free(&mut self, handle: Handle) -> Result<(), DeviceError> {
        // NativeCachingAllocator::free returns at once for a null pointer.
        if handle == NULL_HANDLE {
            return Ok(());
        }
        let b = &mut self.blocks[handle as usize];
        // A real check, not a debug one: a second free of a handle would file its block in a
        // free set twice, and the free sets' unchecked indexing relies on their slots being
        // current (free_set.rs, Note [unchecked indexing]).
        assert!(b.allocated, "free of a block that is not allocated");
        debug_assert!(b.size > 0, "free of a dead block");
        b.allocated = false;
        let (size, pool) = (b.size, b.pool.kind());
        if size >= self.cfg.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        // free: a block other streams used waits for their events (insert_events); it stays
        // active (active_bytes) while no longer allocated.
        // (No block is used by another stream in most traces: skip the hash then.)
        if self.events.stream_uses.is_empty() || !self.events.stream_uses.contains_key(&handle) {
            return {
                self.free_block(handle, FreedNow::Yes);
                Ok(())
            };
        }
        self.stats.deallocate(pool, size);
        if self.capture_underway() {
            // cudaEventQuery is forbidden during capture: the events wait until none is underway.
            self.events.deferred_until_no_capture.push(handle);
        } else {
            let uses = self.events.stream_uses.remove(&handle).unwrap_or_default();
            self.events.graph_stream_uses.remove(&handle);
            self.insert_events(handle, uses);
        }
        Ok(())
    }

    fn record_stream(&mut self, handle: Handle, raw_stream: u64) {
        if handle == NULL_HANDLE {
            return; // recordStream: `if (!ptr.get()) return;`
        }
        let b = &self.blocks[handle as usize];
        debug_assert!(b.allocated, "record_stream on a block that is not allocated");
        // recordStream: "ignore uses on the allocation stream, since those don't require any
        // special synchronization"; stream_uses is a set.
        if self.raw_streams[b.stream as usize] == raw_stream {
            return;
        }
        let uses = self.events.stream_uses.entry(handle).or_default();
        if !uses.contains(&raw_stream) {
            uses.push(raw_stream);
        }
        // recordStream: a use recorded during a capture is also a graph use.
        if self.capture_underway() {
            let graph_uses = self.events.graph_stream_uses.entry(handle).or_default();
            if !graph_uses.contains(&raw_stream) {
                graph_uses.push(raw_stream);
            }
        }
    }

    fn begin_allocate_to_pool(&mut self, pool: u64, stream: Option<u64>) -> Result<(), String> {
        if self.captures_underway.iter().any(|c| c.pool == pool) {
            return Err(format!("pool_begin of pool {pool}, which is already being allocated to (beginAllocateToPool: \"already recording to mempool_id\")"));
        }
        if stream == Some(0) {
            // CUDAGraph::capture_begin refuses the default stream; a MemPool routes a thread.
            return Err(format!("pool_begin of pool {pool} on stream 0: no capture runs on the default stream (leave the stream empty to route every stream)"));
        }
        // create_or_incref_pool: a new pool, or one more user of an existing one.
        let pair = match self.private_pools.get_mut(&pool) {
            Some(p) if p.use_count == 0 => {
                return Err(format!("pool_begin of pool {pool}, which every user has released (PyTorch asserts use_count > 0: pool ids are not reused)"))
            }
            Some(p) => {
                p.use_count += 1;
                p.pair
            }
            None => {
                let pair = self.spare_pairs.pop().unwrap_or_else(|| {
                    self.pools.push(BlockPool::default());
                    self.pools.push(BlockPool::default());
                    self.pair_owner.push(None);
                    (self.pools.len() - 2) as u32
                });
                self.pair_owner[pair as usize / 2 - 1] = Some(pool);
                self.private_pools.insert(pool, PrivatePool { pair, use_count: 1, cuda_malloc_count: 0, use_on_oom: false });
                pair
            }
        };
        let stream = stream.map(|raw| self.stream_id(raw));
        self.captures_underway.push(CaptureUnderway { pool, pair, stream });
        Ok(())
    }

    fn join_pool(&mut self, pool: u64, stream: u64) -> Result<(), String> {
        // The graph's filter matches the capture id, which a stream joined to the capture shares:
        // one more captures_underway entry for the pool, ended with it.
        let Some(pair) = self.captures_underway.iter().find(|c| c.pool == pool && c.stream.is_some()).map(|c| c.pair) else {
            return Err(format!("pool_join of pool {pool}, which no capture is allocating to"));
        };
        if stream == 0 {
            return Err(format!("pool_join of pool {pool} on stream 0: no capture runs on the default stream"));
        }
        let stream = self.stream_id(stream);
        if !self.captures_underway.iter().any(|c| c.pool == pool && c.stream == Some(stream)) {
            self.captures_underway.push(CaptureUnderway { pool, pair, stream: Some(stream) });
        }
        Ok(())
    }

    fn end_allocate_to_pool(&mut self, pool: u64) -> Result<(), String> {
        match self.captures_underway.iter().position(|c| c.pool == pool) {
            Some(_) => {
                // (With the streams that joined the capture.)
                self.captures_underway.retain(|c| c.pool != pool);
                Ok(())
            }
            None => Err(format!("pool_end of pool {pool}, which is not being allocated to (endAllocateToPool: \"not currently recording to mempool_id\")")),
        }
    }

    fn release_pool(&mut self, pool: u64) -> Result<(), String> {
        // releasePool: one user fewer; with none left, the pool is freeable. The last use of a
        // pool being allocated to cannot go: the cache could free the pool under the capture
        // (PyTorch's get_pool then fails an internal assert).
        let recording = self.captures_underway.iter().any(|c| c.pool == pool);
        match self.private_pools.get_mut(&pool) {
            Some(p) if p.use_count == 1 && recording => {
                Err(format!("pool_release of pool {pool}, which is being allocated to and would be left with no user (pool_end it first)"))
            }
            Some(p) if p.use_count > 0 => {
                p.use_count -= 1;
                // A MemPool's destructor stops its use on OOM before releasing it (torch 2.10+,
                // where setUseOnOOM takes whether; 2.9 cannot unset it).
                if self.cfg.torch.use_on_oom_can_be_unset() {
                    p.use_on_oom = false;
                }
                Ok(())
            }
            Some(_) => Err(format!("pool_release of pool {pool}, which has no user left")),
            None => Err(format!("pool_release of pool {pool}, which no pool_begin made")),
        }
    }

    fn sync(&mut self, stream: Option<u64>) {
        // A block freed during a capture waits for its users' work as of its free: a sync after
        // it completes that work, so the events inserted later find the stream idle.
        for block in &self.events.deferred_until_no_capture {
            if let Some(uses) = self.events.stream_uses.get_mut(block) {
                uses.retain(|&s| stream.is_some_and(|synced| synced != s));
            }
        }
        match stream {
            Some(s) => {
                if let Some(q) = self.events.queued.remove(&s) {
                    self.events.completed.extend(q);
                }
            }
            None => {
                for (_, q) in std::mem::take(&mut self.events.queued) {
                    self.events.completed.extend(q);
                }
            }
        }
    }

    fn use_pool_on_oom(&mut self, pool: u64) -> Result<(), String> {
        match self.private_pools.get_mut(&pool) {
            Some(p) => {
                p.use_on_oom = true;
                Ok(())
            }
            None => Err(format!("pool_use_on_oom of pool {pool}, which does not exist")),
        }
    }

    fn empty_pool_cache(&mut self, pool: u64) -> Result<(), DeviceError> {
        // release_cached_blocks(context, mempool_id): the allocator's own pools stay; the pool,
        // if no one uses it any more, waits for its own blocks' events and gives back its free
        // segments. A pool still in use (or gone) is left as it is.
        let Some(pair) = self.private_pools.get(&pool).filter(|p| p.use_count == 0).map(|p| p.pair as usize) else {
            return Ok(());
        };
        self.synchronize_and_free_events_of(Some(pair));
        self.release_freeable_pool(pool)
    }

    fn empty_cache(&mut self) -> Result<(), DeviceError> {
        // The trace does not say which stream called it: any capture underway counts.
        self.release_cached_blocks(self.capture_underway())
    }

    fn block_address(&self, handle: Handle) -> Option<u64> {
        (handle != NULL_HANDLE).then(|| self.blocks[handle as usize].ptr)
    }

    fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    fn segments(&self) -> Vec<SegmentSnapshot> {
        let mut out = Vec::new();
        self.segments_into(&mut out);
        out
    }

    /// Refills `out` in place: each segment's block list keeps its buffer, so a replay that
    /// takes the map again and again (the peak keeps moving) does not allocate and free a vector
    /// per segment each time.
    fn segments_into(&self, out: &mut Vec<SegmentSnapshot>) {
        let mut heads: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|&i| {
                let b = &self.blocks[i as usize];
                b.size > 0 && b.prev == NIL
            })
            .collect();
        heads.sort_by_key(|&i| self.blocks[i as usize].ptr);
        let mut filled = 0;
        for h in heads {
            let head = &self.blocks[h as usize];
            // Expandable segments show one entry per contiguous mapped range.
            let mut in_range = false;
            let mut cur = h;
            loop {
                let b = &self.blocks[cur as usize];
                if b.mapped {
                    if !in_range {
                        let segment = SegmentSnapshot {
                            address: b.ptr,
                            total_size: 0,
                            stream: self.raw_streams[head.stream as usize],
                            segment_type: segment_type(head.pool.kind()),
                            is_expandable: head.expandable(),
                            blocks: Vec::new(),
                            private_pool: head.pool.is_private().then(|| self.private_pool_of(head.pool)),
                        };
                        match out.get_mut(filled) {
                            Some(reused) => {
                                let blocks = std::mem::take(&mut reused.blocks);
                                *reused = SegmentSnapshot { blocks, ..segment };
                                reused.blocks.clear();
                            }
                            None => out.push(segment),
                        }
                        filled += 1;
                        in_range = true;
                    }
                    let s = &mut out[filled - 1];
                    s.total_size += b.size;
                    s.blocks.push(BlockSnapshot {
                        size: b.size,
                        requested_size: b.requested,
                        state: if b.allocated {
                            BlockState::ActiveAllocated
                        } else if self.events.is_pending(cur) {
                            BlockState::ActivePendingFree
                        } else {
                            BlockState::Inactive
                        },
                    });
                } else {
                    in_range = false;
                }
                if b.next == NIL {
                    break;
                }
                cur = b.next;
            }
        }
        out.truncate(filled);
    }

    fn largest_free_block(&self) -> u64 {
        self.pools.iter().map(|p| p.blocks.max_size()).max().unwrap_or(0)
    }

    fn device_description(&self) -> String {
        self.device.describe()
    }

    fn device_time_ns(&self) -> Option<u64> {
        self.device.device_time_ns()
    }
}

#[cfg(test)]
mod tests;
