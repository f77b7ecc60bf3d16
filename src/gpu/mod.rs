//! The GPU side: allocator policies (PyTorch's caching allocator, no-cache, ideal, CUDA's async
//! pool) over a [`device::Device`] (simulated everywhere, CUDA where present), and the replay
//! engine.
//!
//! - the seam: [`device`] (trait + `SimDevice`), its adaptors in `device/` (latency, withheld
//!   memory, address replay), [`cuda`] (driver calls only);
//! - the policies: [`caching`] (PyTorch's; never names CUDA), [`baseline`], [`async_pool`], this
//!   file's [`GpuAllocator`] trait, [`stats`]; [`config`] parses `PYTORCH_CUDA_ALLOC_CONF`;
//! - [`build`]: the one constructor of a policy on a device;
//! - [`replay`]: the loop and its observers; [`devprobe`] and [`fidelity`]: checks against a GPU.

pub mod async_pool;
pub mod baseline;
pub mod build;
pub mod caching;
pub mod card;
pub mod config;
pub mod cuda;
pub mod device;
pub mod devprobe;
pub mod fidelity;
pub mod oracle;
pub mod replay;
pub mod stats;
pub mod torch_version;

use crate::results::{OomCause, SegmentSnapshot, SegmentType};
use crate::units::format_bytes;
use device::DeviceError;
use stats::{DeviceStats, PoolKind};

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq)]
pub enum AllocError {
    /// The policy could not find or create memory for the request: an OOM, which is data.
    OutOfMemory(OomInfo),
    /// The device failed in a way that is not out-of-memory: fatal for the run.
    Device(DeviceError),
}

impl From<DeviceError> for AllocError {
    fn from(e: DeviceError) -> Self {
        AllocError::Device(e)
    }
}

/// What the allocator knew when it gave up on a request.
#[derive(Debug, Clone, PartialEq)]
pub struct OomInfo {
    /// The user's byte count.
    pub requested: u64,
    /// The rounded size the policy searched for.
    pub rounded: u64,
    /// The device allocation it tried ("Tried to allocate X" in PyTorch's message).
    pub alloc_size: u64,
    /// Device memory free (or below the memory-fraction cap), after the caches were flushed.
    pub device_free: u64,
    /// Device memory free regardless of the memory-fraction cap.
    pub device_free_uncapped: u64,
    /// `per_process_memory_fraction`'s allowed bytes, when set.
    pub allowed: Option<u64>,
    /// Free bytes inside the allocator's segments (reserved − allocated).
    pub cached_free: u64,
    /// The largest free block inside a segment of the pools the request could use.
    pub largest_free_block: u64,
    /// Free cached bytes in pools the request cannot use: private pools (CUDA graphs, MemPools),
    /// or the allocator's own pools for a request routed to a private pool.
    pub other_pools_free: u64,
    pub reserved: u64,
    pub allocated: u64,
    /// Refused up front by `throw_on_cudamalloc_oom` (no cache flush, no retry).
    pub rejected: bool,
}

impl OomInfo {
    /// An OOM of a policy that neither rounds nor splits (the baselines, CUDA's pool): the
    /// request is the device allocation, and no memory-fraction cap applies.
    pub fn unrounded(bytes: u64, device_free: u64, cached_free: u64, reserved: u64, allocated: u64) -> Self {
        OomInfo {
            requested: bytes,
            rounded: bytes,
            alloc_size: bytes,
            device_free,
            device_free_uncapped: device_free,
            allowed: None,
            cached_free,
            largest_free_block: 0,
            other_pools_free: 0,
            reserved,
            allocated,
            rejected: false,
        }
    }

    /// Exactly one cause, tested in this order: `capacity` (live bytes + the request exceed what
    /// the device can give: reserved + its free memory), `fraction_limit` (they exceed the
    /// allowed bytes of per_process_memory_fraction), `segment_size` (the free device memory
    /// covers the request but not the segment the allocator must create for it),
    /// `fragmentation` (cached free + device free cover it, yet no block fits), `private_pools`
    /// (they cover it only with the free bytes of pools the request cannot use), and otherwise
    /// `fraction_limit` (only the cap kept the device's free memory from covering it); before all,
    /// `rejected` when `throw_on_cudamalloc_oom` refused it up front.
    pub fn cause(&self) -> OomCause {
        if self.rejected {
            return OomCause::Rejected;
        }
        let need = self.allocated.saturating_add(self.rounded);
        if need > self.reserved.saturating_add(self.device_free_uncapped) {
            OomCause::Capacity
        } else if self.allowed.is_some_and(|allowed| need > allowed) {
            OomCause::FractionLimit
        } else if self.device_free >= self.rounded && self.device_free < self.alloc_size {
            OomCause::SegmentSize
        } else if self.device_free.saturating_add(self.cached_free - self.other_pools_free.min(self.cached_free)) >= self.rounded {
            OomCause::Fragmentation
        } else if self.device_free.saturating_add(self.cached_free) >= self.rounded {
            OomCause::PrivatePools
        } else {
            OomCause::FractionLimit
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "Tried to allocate {} ({} requested); {} allocated, {} reserved, {} free in the cache (largest block {}), {}",
            format_bytes(self.alloc_size),
            format_bytes(self.requested),
            format_bytes(self.allocated),
            format_bytes(self.reserved),
            format_bytes(self.cached_free),
            format_bytes(self.largest_free_block),
            crate::results::gpu::device_free_phrase(self.device_free, self.device_free_uncapped, self.allowed)
        )
    }
}

/// A live allocation's handle inside a policy.
pub type Handle = u32;

/// The handle of a 0-byte allocation: PyTorch's null pointer, which no allocator call made.
pub const NULL_HANDLE: Handle = u32::MAX;

/// A GPU allocation policy under test.
pub trait GpuAllocator {
    fn policy(&self) -> crate::results::GpuPolicy;
    fn malloc(&mut self, bytes: u64, stream: u64) -> Result<Handle, AllocError>;
    fn free(&mut self, handle: Handle) -> Result<(), DeviceError>;
    /// `torch.cuda.empty_cache()`.
    fn empty_cache(&mut self) -> Result<(), DeviceError>;
    /// `tensor.record_stream(stream)` on a live allocation: its free waits for `stream`'s work.
    /// Policies whose frees synchronise the device (cudaFree) or that keep no cache ignore it.
    fn record_stream(&mut self, _handle: Handle, _stream: u64) {}
    /// `stream` (or the whole device) completed its queued work (see [`crate::event::Event::Sync`]).
    fn sync(&mut self, _stream: Option<u64>) {}
    /// beginAllocateToPool (see [`crate::event::Event::PoolBegin`]). Policies without private
    /// pools ignore the pool events. Err: why PyTorch would refuse the call.
    fn begin_allocate_to_pool(&mut self, _pool: u64, _stream: Option<u64>) -> Result<(), String> {
        Ok(())
    }
    /// A stream joined the capture allocating to `pool` (see [`crate::event::Event::PoolJoin`]).
    fn join_pool(&mut self, _pool: u64, _stream: u64) -> Result<(), String> {
        Ok(())
    }
    /// endAllocateToPool (see [`crate::event::Event::PoolEnd`]).
    fn end_allocate_to_pool(&mut self, _pool: u64) -> Result<(), String> {
        Ok(())
    }
    /// releasePool (see [`crate::event::Event::PoolRelease`]).
    fn release_pool(&mut self, _pool: u64) -> Result<(), String> {
        Ok(())
    }
    /// emptyCache(mempool_id) (see [`crate::event::Event::PoolEmptyCache`]).
    fn empty_pool_cache(&mut self, _pool: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    /// setUseOnOOM (see [`crate::event::PoolOp::UseOnOom`]).
    fn use_pool_on_oom(&mut self, _pool: u64) -> Result<(), String> {
        Ok(())
    }
    fn stats(&self) -> &DeviceStats;
    /// Segments in address order with their blocks (none for policies that keep no segments).
    fn segments(&self) -> Vec<SegmentSnapshot> {
        Vec::new()
    }
    /// [`GpuAllocator::segments`] into `out`, whose buffers a policy may reuse (a replay takes
    /// the map again and again while the peak moves).
    fn segments_into(&self, out: &mut Vec<SegmentSnapshot>) {
        *out = self.segments();
    }
    /// The device address of a live allocation's block (policies that keep blocks), so a view
    /// can tell which allocation each block of a segment map holds.
    fn block_address(&self, _handle: Handle) -> Option<u64> {
        None
    }
    /// Bytes in the largest free block inside a segment.
    fn largest_free_block(&self) -> u64 {
        0
    }
    fn device_description(&self) -> String;
    /// Time spent in device calls: measured on a real GPU, modelled on a simulated device with
    /// `--sim-latency`; `None` when not known.
    fn device_time_ns(&self) -> Option<u64> {
        None
    }
    /// An independent copy in the same state, where the policy and its device can make one
    /// (PyTorch's policy on a simulated device): a replay forks the allocator to pass through a
    /// past state again (the segment map at the peak). `None` otherwise.
    fn fork(&self) -> Option<Box<dyn GpuAllocator>> {
        None
    }
}

/// The snapshot name of a pool's segments.
pub(crate) fn segment_type(p: PoolKind) -> SegmentType {
    match p {
        PoolKind::Small => SegmentType::Small,
        PoolKind::Large => SegmentType::Large,
    }
}
