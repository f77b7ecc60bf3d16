//! CUDA's stream-ordered pool as a policy under test (`--allocator async`, real GPU only): the
//! driver's own caching allocator as a baseline. The driver calls are [`CudaPool`]'s; this file
//! keeps the bookkeeping, reported with the `backend:cudaMallocAsync` stats.

use std::collections::HashMap;

use super::cuda::{CudaDevice, CudaPool};
use super::device::{Device, DeviceError, DeviceResult};
use super::stats::{DeviceStats, PoolKind};
use super::{AllocError, GpuAllocator, Handle, OomInfo};
use crate::results::GpuPolicy;

/// `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on a pool whose release threshold keeps
/// everything cached.
pub struct AsyncPoolAllocator {
    // Declared before `device`: the pool is destroyed before the device releases its context.
    pool: CudaPool,
    device: CudaDevice,
    live: HashMap<Handle, (u64, u64, u64)>,
    next: Handle,
    stats: DeviceStats,
    device_time_ns: u64,
}

impl AsyncPoolAllocator {
    pub fn new(device: CudaDevice) -> DeviceResult<Self> {
        let pool = CudaPool::new(&device)?;
        Ok(AsyncPoolAllocator { pool, device, live: HashMap::new(), next: 0, stats: DeviceStats::new(-1), device_time_ns: 0 })
    }

    /// Reserved memory as the pool reports it (the backend:cudaMallocAsync stats).
    fn sync_reserved(&mut self) {
        follow_reserved(&mut self.stats, self.pool.reserved());
    }
}

// The bookkeeping, through the stats helpers the caching allocator and the baselines use
// (`DeviceStats::allocate`/`release`/`change_segments`): apart from the driver calls, so that it
// is tested without a GPU.

/// An allocation of `bytes` from the pool: allocation, active, allocated_bytes, active_bytes and
/// requested_bytes move up together (the pool is asked for the exact request). PyTorch's
/// cudaMallocAsync backend reports the driver's used memory as both allocated_bytes and
/// active_bytes: it does not tell them apart, and neither does this.
fn count_alloc(stats: &mut DeviceStats, bytes: u64) {
    stats.allocate(super::caching::pool_for(bytes), bytes, bytes);
}

/// `cuMemFreeAsync` of a `bytes` allocation: no longer allocated nor active at once (the driver
/// orders the reuse after the stream's work, so nothing is left pending here).
fn count_free(stats: &mut DeviceStats, bytes: u64) {
    stats.release(super::caching::pool_for(bytes), bytes, bytes);
}

/// reserved_bytes follows what the pool holds from the device (kept in `large_pool`: the pool's
/// memory is not split by size; its segments are the driver's, not counted).
fn follow_reserved(stats: &mut DeviceStats, reserved: u64) {
    let change = reserved as i64 - stats.all().reserved_bytes.current;
    if change != 0 {
        stats.change_segments(PoolKind::Large, 0, change);
    }
}

impl GpuAllocator for AsyncPoolAllocator {
    fn policy(&self) -> GpuPolicy {
        GpuPolicy::Async
    }

    fn malloc(&mut self, bytes: u64, stream: u64) -> Result<Handle, AllocError> {
        let ptr = match self.pool.alloc(&mut self.device, bytes, stream, &mut self.device_time_ns) {
            Ok(ptr) => ptr,
            Err(DeviceError::OutOfMemory) => {
                self.stats.num_ooms += 1;
                let reserved = self.stats.all().reserved_bytes.current as u64;
                let allocated = self.stats.all().allocated_bytes.current as u64;
                return Err(AllocError::OutOfMemory(OomInfo::unrounded(
                    bytes,
                    self.device.free_memory(),
                    reserved.saturating_sub(allocated),
                    reserved,
                    allocated,
                )));
            }
            Err(e) => return Err(AllocError::Device(e)),
        };
        let h = self.next;
        self.next = self.next.wrapping_add(1);
        self.live.insert(h, (ptr, bytes, stream));
        count_alloc(&mut self.stats, bytes);
        self.sync_reserved();
        Ok(h)
    }

    fn free(&mut self, handle: Handle) -> Result<(), DeviceError> {
        let (ptr, bytes, stream) = self.live.remove(&handle).expect("free of a live handle");
        self.pool.free(&mut self.device, ptr, stream, &mut self.device_time_ns)?;
        count_free(&mut self.stats, bytes);
        Ok(())
    }

    fn empty_cache(&mut self) -> Result<(), DeviceError> {
        self.device.synchronize()?;
        self.pool.trim()?;
        self.stats.num_sync_all_streams += 1;
        self.sync_reserved();
        Ok(())
    }

    fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    fn device_description(&self) -> String {
        self.device.describe()
    }

    fn device_time_ns(&self) -> Option<u64> {
        Some(self.device_time_ns)
    }
}

impl Drop for AsyncPoolAllocator {
    fn drop(&mut self) {
        self.pool.free_all(&self.device, self.live.values().map(|&(ptr, _, stream)| (ptr, stream)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::stats::Stat;

    const MIB: u64 = 1 << 20;

    /// requested ≤ allocated ≤ active ≤ reserved (bytes, `all`), the active count equal to the
    /// allocation count and active_bytes to allocated_bytes (nothing is left pending), and every
    /// peak at or above its current.
    fn check(stats: &DeviceStats) -> Result<(), String> {
        let all = stats.all();
        let (requested, allocated, active, reserved) =
            (all.requested_bytes.current, all.allocated_bytes.current, all.active_bytes.current, all.reserved_bytes.current);
        if !(0 <= requested && requested <= allocated && allocated <= active && active <= reserved) {
            return Err(format!("requested {requested}, allocated {allocated}, active {active}, reserved {reserved}"));
        }
        if (all.active.current, active) != (all.allocation.current, allocated) {
            return Err(format!("active {} blocks / {active} B, allocated {} blocks / {allocated} B", all.active.current, all.allocation.current));
        }
        let stats_of = |g: &crate::gpu::stats::StatGroup| -> Vec<Stat> {
            vec![g.allocation, g.active, g.allocated_bytes, g.active_bytes, g.requested_bytes, g.reserved_bytes]
        };
        if stats_of(&all).iter().any(|s| s.peak < s.current) {
            return Err(format!("a peak below its current: {all:?}"));
        }
        if !stats.rooms_hold() {
            return Err("a peak room exceeds a headroom".into());
        }
        Ok(())
    }

    /// The async pool's stats as a replay moves them (the pool's reserved memory grows in 32 MiB
    /// steps and is trimmed to the live bytes), without a GPU: active moves with allocated at
    /// every malloc and free, the invariants hold throughout, and the torch keys agree.
    #[test]
    fn active_moves_with_allocated_and_the_stats_stay_ordered() {
        let mut stats = DeviceStats::new(-1);
        let mut reserved = 0u64;
        let mut live: Vec<u64> = Vec::new();
        let sizes = [512, 3 * MIB, 1000, 40 * MIB, 2 * MIB, 7, 200 * MIB, 64 * 1024];
        for (i, &bytes) in sizes.iter().chain(sizes.iter().rev()).enumerate() {
            let before = stats.all();
            count_alloc(&mut stats, bytes);
            live.push(bytes);
            reserved = reserved.max(live.iter().sum::<u64>().div_ceil(32 * MIB) * 32 * MIB);
            follow_reserved(&mut stats, reserved);
            let after = stats.all();
            assert_eq!(
                (after.active.current - before.active.current, after.active_bytes.current - before.active_bytes.current),
                (1, bytes as i64),
                "malloc {i}"
            );
            check(&stats).unwrap_or_else(|e| panic!("after malloc {i} of {bytes} B: {e}"));
            if i % 3 == 2 {
                let bytes = live.remove(i % live.len());
                let before = stats.all();
                count_free(&mut stats, bytes);
                let after = stats.all();
                assert_eq!(
                    (before.active.current - after.active.current, before.active_bytes.current - after.active_bytes.current),
                    (1, bytes as i64),
                    "free after malloc {i}"
                );
                check(&stats).unwrap_or_else(|e| panic!("after a free of {bytes} B: {e}"));
            }
        }
        // empty_cache: the pool trims to what is live.
        reserved = live.iter().sum::<u64>().div_ceil(32 * MIB) * 32 * MIB;
        follow_reserved(&mut stats, reserved);
        check(&stats).unwrap();
        while let Some(bytes) = live.pop() {
            count_free(&mut stats, bytes);
            check(&stats).unwrap();
        }
        let m = stats.to_torch_map();
        assert_eq!((m["active.all.current"], m["active_bytes.all.current"], m["allocated_bytes.all.current"]), (0, 0, 0));
        assert_eq!(m["active.all.peak"], m["allocation.all.peak"]);
        assert_eq!(m["active_bytes.all.peak"], m["allocated_bytes.all.peak"]);
        assert_eq!(m["active.all.allocated"], sizes.len() as i64 * 2);
        assert_eq!(m["active.all.freed"], sizes.len() as i64 * 2);
        assert_eq!(m["reserved_bytes.all.current"], reserved as i64);
    }
}
