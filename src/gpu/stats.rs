//! `torch.cuda.memory_stats()` bookkeeping, with PyTorch's key names and semantics.

use std::collections::BTreeMap;

/// One `{current, peak, allocated, freed}` counter. `increase` raises the peak; `decrease` never
/// lowers it (c10 `Stat::increase/decrease`).
///
/// `freed` is not stored: every decrease would write it, and it follows from the others
/// (current = current at the last reset_accumulated + allocated − freed), so a decrease writes
/// `current` alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    /// `current` when the accumulated counts were last reset.
    current_at_reset: i64,
}

impl Stat {
    /// A counter with these four values (`current` − `allocated` + `freed` is where it stood
    /// when its accumulated counts were last reset).
    pub fn new(current: i64, peak: i64, allocated: i64, freed: i64) -> Stat {
        Stat { current, peak, allocated, current_at_reset: current - allocated + freed }
    }

    /// What decreases have taken away since the accumulated counts were last reset.
    #[inline]
    pub fn freed(&self) -> i64 {
        self.current_at_reset + self.allocated - self.current
    }

    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount as i64;
        self.peak = self.peak.max(self.current);
        self.allocated += amount as i64;
    }

    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current -= amount as i64;
    }

    /// `increase` where the caller knows the peak stays: `current` stays at or below it.
    #[inline(always)]
    fn increase_below_peak(&mut self, amount: i64) {
        self.current += amount;
        self.allocated += amount;
    }

    /// How far `current` stands below the peak.
    #[inline]
    fn headroom(&self) -> i64 {
        self.peak - self.current
    }

    /// `increase(net)` when net > 0, `decrease(−net)` when net < 0, nothing at 0 (free_block's
    /// net change of inactive_split).
    #[inline]
    pub fn apply_net(&mut self, net: i64) {
        // No branch on the sign (hot, and data-dependent): `current` never stands above the
        // peak, so after a decrease the max leaves the peak as it was.
        self.current += net;
        self.peak = self.peak.max(self.current);
        self.allocated += net.max(0);
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.current_at_reset = self.current;
    }
}

/// Which pool a counter update belongs to, besides `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    Small = 0,
    Large = 1,
}

impl PoolKind {
    pub fn key(self) -> &'static str {
        match self {
            PoolKind::Small => "small_pool",
            PoolKind::Large => "large_pool",
        }
    }
}

/// The nine counters PyTorch keeps per StatType (`all`, `small_pool`, `large_pool`): one group
/// per StatType, so an update of several counters of one pool goes through one base address.
///
/// The five counters an allocation moves up (allocation, active, allocated_bytes, active_bytes,
/// requested_bytes) move through [`StatGroup::allocate`] and the decreases beside it, which keep
/// `count_room` and `bytes_room`: lower bounds of how far the count counters and the byte
/// counters stand below their peaks (an allocator that raises them otherwise never asks the
/// rooms, which then stay 0). An allocation that fits in both rooms moves no peak, so the
/// common allocation adds to its counters without a compare per counter (two updates of five
/// counters at every malloc were a tenth of a replay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatGroup {
    pub allocation: Stat,
    pub segment: Stat,
    pub active: Stat,
    pub inactive_split: Stat,
    pub allocated_bytes: Stat,
    pub reserved_bytes: Stat,
    pub active_bytes: Stat,
    pub inactive_split_bytes: Stat,
    pub requested_bytes: Stat,
    /// ≤ the headroom (peak − current) of allocation and of active.
    count_room: i64,
    /// ≤ the headroom of allocated_bytes, active_bytes and requested_bytes.
    bytes_room: i64,
    /// ≤ the headrooms of inactive_split and inactive_split_bytes; the two pools' rooms also sum
    /// to at most `all`'s headrooms, so one room per pool keeps both peaks (the counters move at
    /// nearly every allocation and free: a compare per peak there was a twentieth of a replay).
    split_room: [i64; 2],
}

impl StatGroup {
    /// An allocation of a `size`-byte block for a `requested`-byte request (≤ size):
    /// alloc_found_block's allocation, active, allocated_bytes, active_bytes and requested_bytes.
    #[inline(always)]
    pub fn allocate(&mut self, size: u64, requested: u64) {
        debug_assert!(requested <= size);
        let (size, requested) = (size as i64, requested as i64);
        self.allocation.increase_below_peak(1);
        self.active.increase_below_peak(1);
        self.allocated_bytes.increase_below_peak(size);
        self.active_bytes.increase_below_peak(size);
        self.requested_bytes.increase_below_peak(requested);
        // Every count headroom fell by 1, every byte headroom by at most `size`.
        self.count_room -= 1;
        self.bytes_room -= size;
        if (self.count_room | self.bytes_room) < 0 {
            self.settle_allocation_peaks();
        }
    }

    /// A room ran out: raise the peaks that `current` passed, and measure the rooms exactly.
    #[cold]
    #[inline(never)]
    fn settle_allocation_peaks(&mut self) {
        for s in [&mut self.allocation, &mut self.active, &mut self.allocated_bytes, &mut self.active_bytes, &mut self.requested_bytes] {
            s.peak = s.peak.max(s.current);
        }
        self.count_room = self.allocation.headroom().min(self.active.headroom());
        self.bytes_room = self.allocated_bytes.headroom().min(self.active_bytes.headroom()).min(self.requested_bytes.headroom());
    }

    /// An allocation freed and no longer active at once (no other stream's work to wait for):
    /// [`StatGroup::allocate`] undone, with the room it gives back.
    #[inline(always)]
    pub fn release(&mut self, size: u64, requested: u64) {
        self.deallocate(size);
        self.deactivate(size, requested);
        // Every count headroom rose by 1, every byte headroom by at least `requested`.
        self.count_room += 1;
        self.bytes_room += requested as i64;
    }

    /// The allocation is freed (allocation, allocated_bytes) but stays active until the
    /// streams that used it are done ([`StatGroup::deactivate`]). No room is given back: only
    /// some headrooms rose.
    #[inline(always)]
    pub fn deallocate(&mut self, size: u64) {
        self.allocation.decrease(1);
        self.allocated_bytes.decrease(size);
    }

    /// A freed block is no longer active (active, active_bytes, requested_bytes).
    #[inline(always)]
    pub fn deactivate(&mut self, size: u64, requested: u64) {
        self.active.decrease(1);
        self.active_bytes.decrease(size);
        self.requested_bytes.decrease(requested);
    }

    /// Whether the rooms are below the headrooms they bound (checked by the allocators'
    /// invariant checks).
    pub fn rooms_hold(&self) -> bool {
        self.count_room <= self.allocation.headroom().min(self.active.headroom())
            && self.bytes_room <= self.allocated_bytes.headroom().min(self.active_bytes.headroom()).min(self.requested_bytes.headroom())
            && self.split_room[0] <= self.inactive_split.headroom()
            && self.split_room[1] <= self.inactive_split_bytes.headroom()
    }

    /// The inactive-split counters, in `split_room` order.
    fn splits(&mut self) -> [&mut Stat; 2] {
        [&mut self.inactive_split, &mut self.inactive_split_bytes]
    }

    /// The counters with their `memory_stats()` names.
    fn named(&self) -> [(&'static str, &Stat); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    fn each_mut(&mut self) -> [&mut Stat; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

/// `all`'s own state: its peaks, and lower bounds of how far its counters stand below them.
/// Its currents and accumulated counts are the pools' sums (c10 updates `all` with the pool at
/// every change, `for_each_selected_stat_type`), so they are not kept: a pooled update writes
/// one group, and `all`'s peaks move only when a room runs out (writing `all` beside the pool
/// at every allocation and free was a twentieth of a replay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct AllPeaks {
    /// In [`StatGroup::named`] order.
    peaks: [i64; 9],
    rooms: AllRooms,
}

// Counters by their place in [`StatGroup::named`].
const ALLOCATION: usize = 0;
const SEGMENT: usize = 1;
const ACTIVE: usize = 2;
const INACTIVE_SPLIT: usize = 3;
const ALLOCATED_BYTES: usize = 4;
const RESERVED_BYTES: usize = 5;
const ACTIVE_BYTES: usize = 6;
const INACTIVE_SPLIT_BYTES: usize = 7;
const REQUESTED_BYTES: usize = 8;

/// Lower bounds of how far `all`'s counters stand below their peaks: one room for counters that
/// move together (an allocation's), one per counter otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct AllRooms {
    /// allocation and active.
    count: i64,
    /// allocated_bytes, active_bytes and requested_bytes.
    bytes: i64,
    /// segment and reserved_bytes. (inactive_split's are the pools' `split_room`s.)
    segments: [i64; 2],
}

impl AllRooms {
    /// The rooms that are exactly the headrooms they bound (`headroom(k)` of counter k).
    fn exact(headroom: impl Fn(usize) -> i64) -> AllRooms {
        AllRooms {
            count: headroom(ALLOCATION).min(headroom(ACTIVE)),
            bytes: headroom(ALLOCATED_BYTES).min(headroom(ACTIVE_BYTES)).min(headroom(REQUESTED_BYTES)),
            segments: [headroom(SEGMENT), headroom(RESERVED_BYTES)],
        }
    }

    /// Whether every room is at most its bound in `exact`.
    fn within(&self, exact: &AllRooms) -> bool {
        self.count <= exact.count && self.bytes <= exact.bytes && (0..2).all(|i| self.segments[i] <= exact.segments[i])
    }
}

/// Two counters of a pool move by `nets` (either sign, as [`Stat::apply_net`]), and `all`'s rooms
/// for them: an increase takes its amount from the room, a decrease gives it back. Answers
/// whether a room ran out.
#[inline(always)]
fn move_pair(stats: [&mut Stat; 2], rooms: &mut [i64; 2], nets: [i64; 2]) -> bool {
    for ((stat, room), net) in stats.into_iter().zip(rooms.iter_mut()).zip(nets) {
        stat.apply_net(net);
        *room -= net;
    }
    (rooms[0] | rooms[1]) < 0
}

/// The allocator's statistics, as `DeviceStats` in c10: the pools' counter groups, `all`
/// ([`DeviceStats::all`], their sums with peaks of its own), then the counters that have no pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// By [`PoolKind`]: indexed, not matched, as which pool an update goes to is data (a branch
    /// on it mispredicted on about every other update of a replay).
    pools: [StatGroup; 2],
    all: AllPeaks,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    /// Requests refused up front by `throw_on_cudamalloc_oom` (`num_oom_rejections`).
    pub num_oom_rejections: i64,
    /// `max_split_size` as captured at creation; SIZE_MAX shows as −1.
    pub max_split_size: i64,
}

impl DeviceStats {
    /// All counters at zero; `max_split_size` as the allocator reports it (−1 for none).
    pub fn new(max_split_size: i64) -> Self {
        DeviceStats { max_split_size, ..Default::default() }
    }

    /// The `small_pool` or `large_pool` counters.
    #[inline]
    pub fn pool(&self, pool: PoolKind) -> &StatGroup {
        &self.pools[pool as usize]
    }

    /// The `all` counters: the pools' sums, with `all`'s own peaks.
    #[inline]
    pub fn all(&self) -> StatGroup {
        let (small, large) = (self.pools[0].named(), self.pools[1].named());
        let mut all = StatGroup::default();
        for (k, stat) in all.each_mut().into_iter().enumerate() {
            let (a, b) = (small[k].1, large[k].1);
            *stat = Stat {
                current: a.current + b.current,
                peak: self.all.peaks[k],
                allocated: a.allocated + b.allocated,
                current_at_reset: a.current_at_reset + b.current_at_reset,
            };
        }
        all
    }

    /// `all`'s current values, in [`StatGroup::named`] order.
    fn all_currents(&self) -> [i64; 9] {
        let [small, large] = &self.pools;
        let (s, l) = (small.named(), large.named());
        std::array::from_fn(|k| s[k].1.current + l[k].1.current)
    }

    /// Raises `all`'s peaks that its currents passed and measures its rooms exactly: after any
    /// update whose increases the rooms did not cover.
    #[cold]
    #[inline(never)]
    fn settle_all_peaks(&mut self) {
        let current = self.all_currents();
        let all = &mut self.all;
        for (peak, current) in all.peaks.iter_mut().zip(current) {
            *peak = (*peak).max(current);
        }
        all.rooms = AllRooms::exact(|k| all.peaks[k] - current[k]);
        self.measure_split_rooms(&current);
    }

    /// An inactive-split room ran out: raise the pools' and `all`'s inactive-split peaks that
    /// their currents passed, and measure the rooms again.
    #[cold]
    #[inline(never)]
    fn settle_split_peaks(&mut self) {
        for group in &mut self.pools {
            for s in group.splits() {
                s.peak = s.peak.max(s.current);
            }
        }
        let current = self.all_currents();
        for k in [INACTIVE_SPLIT, INACTIVE_SPLIT_BYTES] {
            self.all.peaks[k] = self.all.peaks[k].max(current[k]);
        }
        self.measure_split_rooms(&current);
    }

    /// The pools' inactive-split rooms, each at most its pool's headroom, the two summing to at
    /// most `all`'s (`current`: `all`'s currents; every peak stands at or above its current).
    fn measure_split_rooms(&mut self, current: &[i64; 9]) {
        for (j, k) in [INACTIVE_SPLIT, INACTIVE_SPLIT_BYTES].into_iter().enumerate() {
            let all_headroom = self.all.peaks[k] - current[k];
            let [small, large] = &mut self.pools;
            let (small_headroom, large_headroom) = (small.splits()[j].headroom(), large.splits()[j].headroom());
            let large_room = large_headroom.min(all_headroom / 2);
            let small_room = small_headroom.min(all_headroom - large_room);
            // (What the small pool leaves of its half goes to the large.)
            large.split_room[j] = large_headroom.min(all_headroom - small_room);
            small.split_room[j] = small_room;
        }
    }

    /// Applies `f` to the counters of `pool`, and `all` follows (c10's
    /// `for_each_selected_stat_type`), its peaks settled at once: for updates the methods below
    /// do not name.
    pub fn update(&mut self, pool: PoolKind, f: impl Fn(&mut StatGroup)) {
        f(&mut self.pools[pool as usize]);
        self.settle_all_peaks();
    }

    /// [`StatGroup::allocate`] in `pool`, and in `all`.
    #[inline(always)]
    pub fn allocate(&mut self, pool: PoolKind, size: u64, requested: u64) {
        self.pools[pool as usize].allocate(size, requested);
        let rooms = &mut self.all.rooms;
        rooms.count -= 1;
        rooms.bytes -= size as i64;
        if (rooms.count | rooms.bytes) < 0 {
            self.settle_all_peaks();
        }
    }

    /// [`StatGroup::release`] in `pool`, and in `all`, with the room it gives back.
    #[inline(always)]
    pub fn release(&mut self, pool: PoolKind, size: u64, requested: u64) {
        self.pools[pool as usize].release(size, requested);
        self.all.rooms.count += 1;
        self.all.rooms.bytes += requested as i64;
    }

    /// [`StatGroup::deallocate`] in `pool`, and in `all` (decreases: no room to settle).
    #[inline(always)]
    pub fn deallocate(&mut self, pool: PoolKind, size: u64) {
        self.pools[pool as usize].deallocate(size);
    }

    /// [`StatGroup::deactivate`] in `pool`, and in `all`.
    #[inline(always)]
    pub fn deactivate(&mut self, pool: PoolKind, size: u64, requested: u64) {
        self.pools[pool as usize].deactivate(size, requested);
    }

    /// inactive_split and inactive_split_bytes change by `nets` (blocks, bytes; either sign, as
    /// [`Stat::apply_net`]) in `pool`, and in `all`; `rises` are the nets' positive parts
    /// (max(net, 0), what `allocated` counts), which the callers know without a compare. The
    /// peaks move only when the pool's room runs out ([`StatGroup::split_room`]).
    #[inline(always)]
    pub fn change_inactive_split(&mut self, pool: PoolKind, nets: [i64; 2], rises: [i64; 2]) {
        debug_assert_eq!(rises, nets.map(|n| n.max(0)), "rises are the nets' positive parts");
        let g = &mut self.pools[pool as usize];
        for (j, stat) in [&mut g.inactive_split, &mut g.inactive_split_bytes].into_iter().enumerate() {
            stat.current += nets[j];
            stat.allocated += rises[j];
            g.split_room[j] -= nets[j];
        }
        if (g.split_room[0] | g.split_room[1]) < 0 {
            self.settle_split_peaks();
        }
    }

    /// segment and reserved_bytes change by `segments` and `bytes` (either sign) in `pool`, and
    /// in `all`: a segment made or freed, or pages of an expandable one mapped or unmapped.
    #[inline]
    pub fn change_segments(&mut self, pool: PoolKind, segments: i64, bytes: i64) {
        let g = &mut self.pools[pool as usize];
        if move_pair([&mut g.segment, &mut g.reserved_bytes], &mut self.all.rooms.segments, [segments, bytes]) {
            self.settle_all_peaks();
        }
    }

    /// Whether every group's rooms bound its headrooms ([`StatGroup::rooms_hold`]) and `all`'s
    /// peaks stand at or above its currents.
    pub fn rooms_hold(&self) -> bool {
        let (current, all) = (self.all_currents(), &self.all);
        let headroom = |k: usize| all.peaks[k] - current[k];
        let [small, large] = &self.pools;
        let splits_hold = [INACTIVE_SPLIT, INACTIVE_SPLIT_BYTES].into_iter().enumerate().all(|(j, k)| small.split_room[j] + large.split_room[j] <= headroom(k));
        (0..9).all(|k| headroom(k) >= 0) && all.rooms.within(&AllRooms::exact(headroom)) && splits_hold && self.pools.iter().all(|g| g.rooms_hold())
    }

    /// The flat, key-sorted dict `torch.cuda.memory_stats()` returns (123 keys, as torch ≥ 2.13's).
    pub fn to_torch_map(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let mut put_stat = |prefix: &str, s: &Stat| {
            out.insert(format!("{prefix}.current"), s.current);
            out.insert(format!("{prefix}.peak"), s.peak);
            out.insert(format!("{prefix}.allocated"), s.allocated);
            out.insert(format!("{prefix}.freed"), s.freed());
        };
        let all = self.all();
        for (group, stat_type) in [(&all, "all"), (self.pool(PoolKind::Small), PoolKind::Small.key()), (self.pool(PoolKind::Large), PoolKind::Large.key())] {
            for (name, s) in group.named() {
                put_stat(&format!("{name}.{stat_type}"), s);
            }
        }
        put_stat("oversize_allocations", &self.oversize_allocations);
        put_stat("oversize_segments", &self.oversize_segments);
        out.insert("num_alloc_retries".into(), self.num_alloc_retries);
        out.insert("num_ooms".into(), self.num_ooms);
        out.insert("max_split_size".into(), self.max_split_size);
        out.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        out.insert("num_device_alloc".into(), self.num_device_alloc);
        out.insert("num_device_free".into(), self.num_device_free);
        // Allocations refused up front under throw_on_cudamalloc_oom (torch 2.12+).
        out.insert("num_oom_rejections".into(), self.num_oom_rejections);
        out
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for group in &mut self.pools {
            for s in group.each_mut() {
                s.reset_peak();
            }
            (group.count_room, group.bytes_room, group.split_room) = (0, 0, [0, 0]);
        }
        // (Rooms of 0 bound headrooms of 0.)
        self.all = AllPeaks { peaks: self.all_currents(), ..AllPeaks::default() };
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for group in &mut self.pools {
            for s in group.each_mut() {
                s.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_map_has_all_123_keys() {
        let m = DeviceStats::new(-1).to_torch_map();
        assert_eq!(m.len(), 123);
        assert_eq!(m["num_oom_rejections"], 0);
        assert!(m.contains_key("allocated_bytes.all.current"));
        assert!(m.contains_key("inactive_split_bytes.small_pool.freed"));
        assert!(m.contains_key("oversize_segments.peak"));
        assert_eq!(m["max_split_size"], -1);
    }

    #[test]
    fn peak_survives_decrease_and_resets() {
        let mut s = DeviceStats::default();
        s.update(PoolKind::Large, |g| g.allocated_bytes.increase(100));
        s.update(PoolKind::Large, |g| g.allocated_bytes.decrease(60));
        assert_eq!(s.all().allocated_bytes, Stat::new(40, 100, 100, 60));
        assert_eq!(s.all().allocated_bytes.freed(), 60);
        assert_eq!(s.pool(PoolKind::Small).allocated_bytes, Stat::default());
        s.reset_peak();
        assert_eq!(s.pool(PoolKind::Large).allocated_bytes.peak, 40);
        s.reset_accumulated();
        assert_eq!(s.all().allocated_bytes, Stat::new(40, 40, 0, 0));
        assert_eq!(s.all().allocated_bytes.freed(), 0);
        s.update(PoolKind::Large, |g| g.allocated_bytes.decrease(15));
        s.update(PoolKind::Large, |g| g.allocated_bytes.increase(5));
        assert_eq!((s.all().allocated_bytes.current, s.all().allocated_bytes.allocated, s.all().allocated_bytes.freed()), (30, 5, 15));
    }

    /// One of the moves an allocator makes on the five allocation counters (pool, bytes).
    #[derive(Debug, Clone, Copy)]
    enum Move {
        Allocate(bool, u64, u64),
        /// Frees the i-th live allocation (mod the count), at once or with its events pending.
        Release(usize, bool),
        /// Ends the wait of the i-th pending free.
        Deactivate(usize),
        /// inactive_split and inactive_split_bytes move by (blocks, bytes), never below zero.
        Split(bool, i64, i64),
        /// segment and reserved_bytes move by (segments, bytes), never below zero.
        Segments(bool, i64, i64),
        ResetPeak,
        ResetAccumulated,
    }

    fn moves() -> impl proptest::strategy::Strategy<Value = Vec<Move>> {
        use proptest::prelude::*;
        let size = prop_oneof![512u64..4096, 1u64 << 20..1 << 30];
        proptest::collection::vec(
            prop_oneof![
                6 => (any::<bool>(), size, 0u64..512).prop_map(|(small, size, slack)| Move::Allocate(small, size, size.saturating_sub(slack).max(1))),
                5 => (any::<usize>(), proptest::bool::weighted(0.8)).prop_map(|(i, now)| Move::Release(i, now)),
                2 => any::<usize>().prop_map(Move::Deactivate),
                3 => (any::<bool>(), -2i64..3, -(1i64 << 24)..1 << 24).prop_map(|(small, n, b)| Move::Split(small, n, b)),
                2 => (any::<bool>(), -1i64..2, -(1i64 << 30)..1 << 30).prop_map(|(small, n, b)| Move::Segments(small, n, b)),
                1 => Just(Move::ResetPeak),
                1 => Just(Move::ResetAccumulated),
            ],
            1..400,
        )
    }

    /// `f` on `pool` of `stats` and on `all`, as c10 applies an update to both.
    fn eager(stats: &mut DeviceStats, all: &mut StatGroup, pool: PoolKind, f: impl Fn(&mut StatGroup)) {
        stats.update(pool, &f);
        f(all);
    }

    /// c10's Stat::increase or Stat::decrease by |net|.
    fn move_by(stat: &mut Stat, net: i64) {
        if net >= 0 {
            stat.increase(net as u64);
        } else {
            stat.decrease(net.unsigned_abs());
        }
    }

    /// A change of a counter pair (`pair` picks it) by `nets`, kept at or above zero as an
    /// allocator keeps them: `change` on `fast`, c10's increase/decrease on `plain` and `all`.
    fn move_pairs(
        fast: &mut DeviceStats,
        plain: &mut DeviceStats,
        plain_all: &mut StatGroup,
        pool: PoolKind,
        nets: [i64; 2],
        pair: fn(&mut StatGroup) -> [&mut Stat; 2],
        change: fn(&mut DeviceStats, PoolKind, i64, i64),
    ) {
        let mut group = *plain.pool(pool);
        let [a, b] = pair(&mut group);
        let nets = [nets[0].max(-a.current), nets[1].max(-b.current)];
        change(fast, pool, nets[0], nets[1]);
        eager(plain, plain_all, pool, |g| {
            for (stat, net) in pair(g).into_iter().zip(nets) {
                move_by(stat, net);
            }
        });
    }

    proptest::proptest! {
        /// The rooms never let a peak fall behind: every counter of allocate/release/deallocate/
        /// deactivate, of the inactive-split and segment changes, and `all`'s (the pools' sums
        /// with peaks of its own) equals one kept with a compare at every increase (c10's
        /// Stat::increase).
        #[test]
        fn allocation_counters_match_counters_that_compare_every_increase(moves in moves()) {
            let kind = |small: bool| if small { PoolKind::Small } else { PoolKind::Large };
            let mut fast = DeviceStats::new(-1);
            let mut plain = DeviceStats::new(-1);
            // `all` kept as c10 keeps it: updated beside the pool, a compare at every increase.
            let mut plain_all = StatGroup::default();
            let mut live: Vec<(bool, u64, u64)> = Vec::new();
            let mut pending: Vec<(bool, u64, u64)> = Vec::new();
            for m in moves {
                match m {
                    Move::Allocate(small, size, requested) => {
                        fast.allocate(kind(small), size, requested);
                        eager(&mut plain, &mut plain_all, kind(small), |g| {
                            g.allocation.increase(1);
                            g.active.increase(1);
                            g.allocated_bytes.increase(size);
                            g.active_bytes.increase(size);
                            g.requested_bytes.increase(requested);
                        });
                        live.push((small, size, requested));
                    }
                    Move::Release(i, now) if !live.is_empty() => {
                        let (small, size, requested) = live.swap_remove(i % live.len());
                        eager(&mut plain, &mut plain_all, kind(small), |g| {
                            g.allocation.decrease(1);
                            g.allocated_bytes.decrease(size);
                        });
                        if now {
                            fast.release(kind(small), size, requested);
                            eager(&mut plain, &mut plain_all, kind(small), |g| {
                                g.active.decrease(1);
                                g.active_bytes.decrease(size);
                                g.requested_bytes.decrease(requested);
                            });
                        } else {
                            fast.deallocate(kind(small), size);
                            pending.push((small, size, requested));
                        }
                    }
                    Move::Deactivate(i) if !pending.is_empty() => {
                        let (small, size, requested) = pending.swap_remove(i % pending.len());
                        fast.deactivate(kind(small), size, requested);
                        eager(&mut plain, &mut plain_all, kind(small), |g| {
                            g.active.decrease(1);
                            g.active_bytes.decrease(size);
                            g.requested_bytes.decrease(requested);
                        });
                    }
                    Move::Split(small, blocks, bytes) => {
                        fn change(stats: &mut DeviceStats, pool: PoolKind, blocks: i64, bytes: i64) {
                            stats.change_inactive_split(pool, [blocks, bytes], [blocks.max(0), bytes.max(0)]);
                        }
                        move_pairs(&mut fast, &mut plain, &mut plain_all, kind(small), [blocks, bytes], StatGroup::splits, change);
                    }
                    Move::Segments(small, segments, bytes) => {
                        fn pair(g: &mut StatGroup) -> [&mut Stat; 2] {
                            [&mut g.segment, &mut g.reserved_bytes]
                        }
                        move_pairs(&mut fast, &mut plain, &mut plain_all, kind(small), [segments, bytes], pair, DeviceStats::change_segments);
                    }
                    Move::ResetPeak => {
                        fast.reset_peak();
                        plain.reset_peak();
                        plain_all.each_mut().into_iter().for_each(|s| s.reset_peak());
                    }
                    Move::ResetAccumulated => {
                        fast.reset_accumulated();
                        plain.reset_accumulated();
                        plain_all.each_mut().into_iter().for_each(|s| s.reset_accumulated());
                    }
                    Move::Release(..) | Move::Deactivate(_) => {}
                }
                proptest::prop_assert_eq!(fast.to_torch_map(), plain.to_torch_map());
                let (fast_all, plain_all) = (fast.all(), plain_all);
                proptest::prop_assert_eq!(fast_all.named().map(|(k, s)| (k, *s)), plain_all.named().map(|(k, s)| (k, *s)));
                proptest::prop_assert!(fast.rooms_hold());
            }
        }
    }
}
