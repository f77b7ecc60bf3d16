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

    /// `increase(net)` when net > 0, `decrease(−net)` when net < 0, nothing at 0 (free_block's
    /// net change of inactive_split).
    #[inline]
    pub fn apply_net(&mut self, net: i64) {
        // Selects, not a branch on the sign (hot in free_block, and data-dependent).
        self.current += net;
        self.peak = if net > 0 { self.peak.max(self.current) } else { self.peak };
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

/// A StatArray: `all`, `small_pool`, `large_pool`. Every update applies to `all` and the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    pub all: Stat,
    /// By [`PoolKind`]: indexed, not matched, as which pool an update goes to is data (a branch
    /// on it mispredicted on about every other update of a replay).
    pools: [Stat; 2],
}

impl StatArray {
    #[inline]
    pub fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    #[inline]
    pub fn decrease(&mut self, pool: PoolKind, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    #[inline]
    pub fn apply_net(&mut self, pool: PoolKind, net: i64) {
        self.all.apply_net(net);
        self.pool_mut(pool).apply_net(net);
    }

    /// The `small_pool` or `large_pool` counter.
    #[inline]
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        &self.pools[pool as usize]
    }

    #[inline]
    fn pool_mut(&mut self, pool: PoolKind) -> &mut Stat {
        &mut self.pools[pool as usize]
    }

    fn each_mut(&mut self) -> [&mut Stat; 3] {
        let [small, large] = &mut self.pools;
        [&mut self.all, small, large]
    }
}

/// The allocator's statistics, as `DeviceStats` in c10.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    /// `max_split_size` as captured at creation; SIZE_MAX shows as −1.
    pub max_split_size: i64,
}

impl DeviceStats {
    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
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

    /// The flat, key-sorted dict `torch.cuda.memory_stats()` returns (123 keys, as torch ≥ 2.13's).
    pub fn to_torch_map(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let mut put_stat = |prefix: &str, s: &Stat| {
            out.insert(format!("{prefix}.current"), s.current);
            out.insert(format!("{prefix}.peak"), s.peak);
            out.insert(format!("{prefix}.allocated"), s.allocated);
            out.insert(format!("{prefix}.freed"), s.freed());
        };
        for (name, arr) in self.arrays() {
            put_stat(&format!("{name}.all"), &arr.all);
            put_stat(&format!("{name}.small_pool"), arr.pool(PoolKind::Small));
            put_stat(&format!("{name}.large_pool"), arr.pool(PoolKind::Large));
        }
        put_stat("oversize_allocations", &self.oversize_allocations);
        put_stat("oversize_segments", &self.oversize_segments);
        out.insert("num_alloc_retries".into(), self.num_alloc_retries);
        out.insert("num_ooms".into(), self.num_ooms);
        out.insert("max_split_size".into(), self.max_split_size);
        out.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        out.insert("num_device_alloc".into(), self.num_device_alloc);
        out.insert("num_device_free".into(), self.num_device_free);
        // Allocations refused up front under throw_on_cudamalloc_oom (torch 2.13, DeviceStats in
        // c10/core/CachingDeviceAllocator.h): a mode the conf parser refuses, so never any.
        out.insert("num_oom_rejections".into(), 0);
        out
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for arr in self.all_arrays_mut() {
            for s in arr.each_mut() {
                s.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for arr in self.all_arrays_mut() {
            for s in arr.each_mut() {
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

    fn all_arrays_mut(&mut self) -> [&mut StatArray; 9] {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_map_has_all_123_keys() {
        let m = DeviceStats { max_split_size: -1, ..Default::default() }.to_torch_map();
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
        s.allocated_bytes.increase(PoolKind::Large, 100);
        s.allocated_bytes.decrease(PoolKind::Large, 60);
        assert_eq!(s.allocated_bytes.all, Stat::new(40, 100, 100, 60));
        assert_eq!(s.allocated_bytes.all.freed(), 60);
        assert_eq!(*s.allocated_bytes.pool(PoolKind::Small), Stat::default());
        s.reset_peak();
        assert_eq!(s.allocated_bytes.pool(PoolKind::Large).peak, 40);
        s.reset_accumulated();
        assert_eq!(s.allocated_bytes.all, Stat::new(40, 40, 0, 0));
        assert_eq!(s.allocated_bytes.all.freed(), 0);
        s.allocated_bytes.decrease(PoolKind::Large, 15);
        s.allocated_bytes.increase(PoolKind::Large, 5);
        assert_eq!((s.allocated_bytes.all.current, s.allocated_bytes.all.allocated, s.allocated_bytes.all.freed()), (30, 5, 15));
    }
}
