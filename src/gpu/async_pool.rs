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
        let reserved = self.pool.reserved() as i64;
        let cur = self.stats.all().reserved_bytes.current;
        if reserved > cur {
            self.stats.update(PoolKind::Large, |g| g.reserved_bytes.increase((reserved - cur) as u64));
        } else if reserved < cur {
            self.stats.update(PoolKind::Large, |g| g.reserved_bytes.decrease((cur - reserved) as u64));
        }
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
        let pool = super::caching::pool_for(bytes);
        self.stats.update(pool, |g| {
            g.allocation.increase(1);
            g.allocated_bytes.increase(bytes);
            g.active_bytes.increase(bytes);
            g.requested_bytes.increase(bytes);
        });
        self.sync_reserved();
        Ok(h)
    }

    fn free(&mut self, handle: Handle) -> Result<(), DeviceError> {
        let (ptr, bytes, stream) = self.live.remove(&handle).expect("free of a live handle");
        self.pool.free(&mut self.device, ptr, stream, &mut self.device_time_ns)?;
        let pool = super::caching::pool_for(bytes);
        self.stats.update(pool, |g| {
            g.allocation.decrease(1);
            g.allocated_bytes.decrease(bytes);
            g.active_bytes.decrease(bytes);
            g.requested_bytes.decrease(bytes);
        });
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
