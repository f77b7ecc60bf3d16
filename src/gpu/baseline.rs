//! Baselines for the caching allocator: `nocache` (PYTORCH_NO_CUDA_MEMORY_CACHING: every
//! allocation a device malloc of the exact size, every free a device free) and `ideal` (reserves
//! exactly the live bytes: the physical lower bound that ratios are measured against).
//!
//! PyTorch's no-cache mode bypasses its stats (memory_stats() stays all zero); ours records
//! what the device saw, so that the modes can be compared on the same keys.

use rustc_hash::FxHashMap;

use super::device::{Device, DeviceError};
use super::stats::{DeviceStats, PoolKind};
use super::{AllocError, GpuAllocator, Handle, OomInfo};
use crate::gpu::caching::pool_for;
use crate::results::{BlockSnapshot, BlockState, GpuPolicy, SegmentSnapshot};

/// Stats for an allocation that is also its own segment.
/// `device_call` is false for the ideal bound, which makes none.
fn count_alloc(stats: &mut DeviceStats, pool: PoolKind, bytes: u64, requested: u64, device_call: bool) {
    stats.num_device_alloc += device_call as i64;
    stats.change_segments(pool, device_call as i64, bytes as i64);
    stats.allocate(pool, bytes, requested);
}

fn count_free(stats: &mut DeviceStats, pool: PoolKind, bytes: u64, requested: u64, device_call: bool) {
    stats.num_device_free += device_call as i64;
    stats.change_segments(pool, -(device_call as i64), -(bytes as i64));
    stats.release(pool, bytes, requested);
}

struct Live {
    ptr: u64,
    bytes: u64,
    stream: u64,
}

/// Every allocation is a device malloc of exactly the requested size.
pub struct NoCacheAllocator<D: Device> {
    device: D,
    live: FxHashMap<Handle, Live>,
    next: Handle,
    stats: DeviceStats,
}

impl<D: Device> NoCacheAllocator<D> {
    pub fn new(device: D) -> Self {
        NoCacheAllocator { device, live: FxHashMap::default(), next: 0, stats: DeviceStats::new(-1) }
    }
}

impl<D: Device> GpuAllocator for NoCacheAllocator<D> {
    fn policy(&self) -> GpuPolicy {
        GpuPolicy::Nocache
    }

    fn malloc(&mut self, bytes: u64, stream: u64) -> Result<Handle, AllocError> {
        match self.device.malloc(bytes, stream) {
            Ok(ptr) => {
                count_alloc(&mut self.stats, pool_for(bytes), bytes, bytes, true);
                let h = self.next;
                self.next = self.next.wrapping_add(1);
                self.live.insert(h, Live { ptr, bytes, stream });
                Ok(h)
            }
            Err(DeviceError::OutOfMemory) => {
                self.stats.num_ooms += 1;
                let reserved = self.stats.all().reserved_bytes.current as u64;
                Err(AllocError::OutOfMemory(OomInfo::unrounded(bytes, self.device.free_memory(), 0, reserved, reserved)))
            }
            Err(e) => Err(AllocError::Device(e)),
        }
    }

    fn free(&mut self, handle: Handle) -> Result<(), DeviceError> {
        let l = self.live.remove(&handle).expect("free of a live handle");
        self.device.free(l.ptr, l.bytes)?;
        count_free(&mut self.stats, pool_for(l.bytes), l.bytes, l.bytes, true);
        Ok(())
    }

    fn empty_cache(&mut self) -> Result<(), DeviceError> {
        self.stats.num_sync_all_streams += 1;
        Ok(())
    }

    fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    fn segments(&self) -> Vec<SegmentSnapshot> {
        let mut v: Vec<SegmentSnapshot> = self
            .live
            .values()
            .map(|l| SegmentSnapshot {
                address: l.ptr,
                total_size: l.bytes,
                stream: l.stream,
                segment_type: super::segment_type(pool_for(l.bytes)),
                is_expandable: false,
                blocks: vec![BlockSnapshot { size: l.bytes, requested_size: l.bytes, state: BlockState::ActiveAllocated }],
                private_pool: None,
            })
            .collect();
        v.sort_by_key(|s| s.address);
        v
    }

    /// Each live allocation is its own cudaMalloc: its block starts its segment.
    fn block_address(&self, handle: Handle) -> Option<u64> {
        self.live.get(&handle).map(|l| l.ptr)
    }

    fn device_description(&self) -> String {
        self.device.describe()
    }

    fn device_time_ns(&self) -> Option<u64> {
        self.device.device_time_ns()
    }
}

/// Reserves exactly the live bytes: the lower bound no allocator can beat.
pub struct IdealAllocator {
    capacity: u64,
    live: FxHashMap<Handle, u64>,
    next: Handle,
    stats: DeviceStats,
}

impl IdealAllocator {
    pub fn new(capacity: u64) -> Self {
        IdealAllocator { capacity, live: FxHashMap::default(), next: 0, stats: DeviceStats::new(-1) }
    }
}

impl GpuAllocator for IdealAllocator {
    fn policy(&self) -> GpuPolicy {
        GpuPolicy::Ideal
    }

    fn malloc(&mut self, bytes: u64, _stream: u64) -> Result<Handle, AllocError> {
        let reserved = self.stats.all().reserved_bytes.current as u64;
        if reserved + bytes > self.capacity {
            self.stats.num_ooms += 1;
            return Err(AllocError::OutOfMemory(OomInfo::unrounded(bytes, self.capacity - reserved, 0, reserved, reserved)));
        }
        count_alloc(&mut self.stats, pool_for(bytes), bytes, bytes, false);
        let h = self.next;
        self.next = self.next.wrapping_add(1);
        self.live.insert(h, bytes);
        Ok(h)
    }

    fn free(&mut self, handle: Handle) -> Result<(), DeviceError> {
        let bytes = self.live.remove(&handle).expect("free of a live handle");
        count_free(&mut self.stats, pool_for(bytes), bytes, bytes, false);
        Ok(())
    }

    fn empty_cache(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    fn device_description(&self) -> String {
        format!("ideal bound, {} capacity", crate::units::format_bytes(self.capacity))
    }

    /// The bound makes no device calls: none of its time is spent in them (a real 0, beside the
    /// policies' modelled or measured time, not an absent figure).
    fn device_time_ns(&self) -> Option<u64> {
        Some(0)
    }
}
