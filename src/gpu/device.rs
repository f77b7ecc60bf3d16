//! The one narrow seam between allocator policies and device memory, and the simulated device.
//!
//! Policies call only this trait; `SimDevice` implements it on every machine and `CudaDevice`
//! (in `cuda.rs`) on a real GPU. Features that are not device memory itself wrap a device and
//! implement the same trait (as RMM's adaptors wrap a memory resource), one file each:
//! [`latency::WithLatency`] (device time from `--sim-latency`), [`withheld::Withheld`] (memory
//! held by others) and [`address_replay::AddressReplay`] (the addresses a real GPU returned).
//! `gpu::build` puts them together.

/// Forwards the named [`Device`] methods to `self.inner` (for adaptors, which intercept the rest).
macro_rules! forward_to_inner {
    ($($m:ident),+ $(,)?) => { $(forward_to_inner!(@ $m);)+ };
    (@ capacity) => { fn capacity(&self) -> u64 { self.inner.capacity() } };
    (@ free_memory) => { fn free_memory(&self) -> u64 { self.inner.free_memory() } };
    (@ malloc) => { fn malloc(&mut self, bytes: u64, stream: u64) -> DeviceResult<u64> { self.inner.malloc(bytes, stream) } };
    (@ free) => { fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> { self.inner.free(ptr, bytes) } };
    (@ reserve_address) => { fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64> { self.inner.reserve_address(bytes) } };
    (@ release_address) => { fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> { self.inner.release_address(ptr, bytes) } };
    (@ map_page) => { fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> { self.inner.map_page(ptr, bytes) } };
    (@ unmap_page) => { fn unmap_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> { self.inner.unmap_page(ptr, bytes) } };
    (@ describe) => { fn describe(&self) -> String { self.inner.describe() } };
    (@ device_time_ns) => { fn device_time_ns(&self) -> Option<u64> { self.inner.device_time_ns() } };
}

pub mod address_replay;
pub mod latency;
pub mod withheld;

use std::collections::BTreeMap;

use crate::units::MIB;

/// What a device call can fail with. Out-of-memory is an expected result the policy handles;
/// anything else is fatal for the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    OutOfMemory,
    Other(String),
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceError::OutOfMemory => write!(f, "out of device memory"),
            DeviceError::Other(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for DeviceError {}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Device memory as the caching allocator sees it: whole allocations (cudaMalloc/cudaFree) and
/// the virtual-memory calls expandable segments use (reserve a VA range; map and unmap physical
/// pages of a fixed granularity inside it).
pub trait Device {
    /// Total device memory in bytes (`totalGlobalMem`).
    fn capacity(&self) -> u64;
    /// Free device memory in bytes (`cudaMemGetInfo`).
    fn free_memory(&self) -> u64;
    /// `cudaMalloc(bytes)`.
    fn malloc(&mut self, bytes: u64, stream: u64) -> DeviceResult<u64>;
    /// `cudaFree(ptr)` of an allocation of `bytes`.
    fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()>;
    /// `cuMemAddressReserve`: a VA range, no physical memory.
    fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64>;
    /// `cuMemAddressFree`.
    fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()>;
    /// `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` of one page of `bytes` at `ptr`.
    fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()>;
    /// `cuMemUnmap` + `cuMemRelease` of one page.
    fn unmap_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()>;
    /// A short description for results ("simulated 80 GiB", "NVIDIA H100 80GB HBM3").
    fn describe(&self) -> String;
    /// Time spent in device calls so far, when known (measured, or modelled).
    fn device_time_ns(&self) -> Option<u64> {
        None
    }
    /// An independent copy in the same state, for a device whose state is data (a simulated
    /// one): what lets a replay pass through a past state again. `None` for a real device.
    fn fork(&self) -> Option<Box<dyn Device>> {
        None
    }
}

/// The default capacity: an H100 80 GB's `total_memory` (the default card of [`super::card`]).
pub const H100_CAPACITY_BYTES: u64 = 85_017_493_504;
/// Simulated addresses are 2 MiB aligned, like real large cudaMalloc results.
pub const SIM_ALIGNMENT_BYTES: u64 = 2 * MIB;
pub(crate) const SIM_VA_BASE: u64 = 0x7f00_0000_0000;
/// The simulated address space: 64 TiB, or for a larger device 1024 times its capacity (each
/// expandable segment reserves more than the whole card, as PyTorch's do), at most 2^60 bytes.
fn sim_va_span(capacity: u64) -> u64 {
    (1u64 << 46).max(capacity.checked_next_power_of_two().unwrap_or(1 << 63).saturating_mul(1024).min(1 << 60))
}

/// Where the simulated device places a new cudaMalloc (`--address-order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AddressOrder {
    /// The lowest free range (first fit; a freed range is reused at once).
    #[default]
    Lowest,
    /// As the CUDA driver placed them on an H100 (reports/gpu-h100/GPU-CHECKS.md): allocations
    /// over 2 MiB top-down at decreasing addresses, a freed range not reused until the space
    /// below is used up (next fit, downward, wrapping); 2 MiB and smaller carved upward from the
    /// bottom of the space. VA reservations (expandable segments) stay lowest-first.
    Driver,
}

/// A deterministic simulated GPU (Note [SimDevice addresses]).
///
/// Note [SimDevice addresses]: a new allocation (or VA reservation) gets the lowest free address
/// range, 2 MiB aligned, in a virtual space far larger than the capacity (first fit; freed ranges
/// are reused), or with [`AddressOrder::Driver`] the driver's placement. Capacity is checked on bytes in use, never on contiguity: a real GPU has virtual
/// memory, so device allocations do not fail for lack of a contiguous range. Fragmentation lives
/// in the allocator's segments. Addresses decide best-fit ties between equal-size blocks, so they
/// must be deterministic for results to be comparable.
#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: u64,
    used: u64,
    /// Free VA ranges: start → length.
    free_ranges: BTreeMap<u64, u64>,
    order: AddressOrder,
    /// AddressOrder::Driver: large allocations go below this address (the last one placed).
    cursor: u64,
    /// The end of the address space.
    va_end: u64,
    pub device_mallocs: u64,
    pub device_frees: u64,
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
}

impl SimDevice {
    pub fn new(capacity: u64) -> Self {
        Self::with_va_span(capacity, sim_va_span(capacity))
    }

    fn with_va_span(capacity: u64, span: u64) -> Self {
        let mut free_ranges = BTreeMap::new();
        free_ranges.insert(SIM_VA_BASE, span);
        SimDevice {
            capacity,
            used: 0,
            free_ranges,
            order: AddressOrder::Lowest,
            cursor: SIM_VA_BASE + span,
            va_end: SIM_VA_BASE + span,
            device_mallocs: 0,
            device_frees: 0,
            pages_mapped: 0,
            pages_unmapped: 0,
        }
    }

    pub fn with_address_order(mut self, order: AddressOrder) -> Self {
        self.order = order;
        self
    }

    /// AddressOrder::Driver for an allocation over 2 MiB: the highest fitting range below the
    /// cursor, placed at its top; when none is left below, wrap to the top of the space.
    fn take_range_downward(&mut self, bytes: u64) -> DeviceResult<u64> {
        let len = bytes.div_ceil(SIM_ALIGNMENT_BYTES) * SIM_ALIGNMENT_BYTES;
        for _pass in 0..2 {
            let found = self.free_ranges.range(..self.cursor).rev().find_map(|(&start, &have)| {
                let top = (start + have).min(self.cursor);
                (top - start >= len).then(|| (start, have, top - len))
            });
            if let Some((start, have, addr)) = found {
                self.free_ranges.remove(&start);
                if addr > start {
                    self.free_ranges.insert(start, addr - start);
                }
                if start + have > addr + len {
                    self.free_ranges.insert(addr + len, start + have - addr - len);
                }
                self.cursor = addr;
                return Ok(addr);
            }
            self.cursor = self.va_end;
        }
        Err(DeviceError::Other("simulated address space exhausted".into()))
    }

    /// Bytes in use by allocations of this process.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Accounts a cudaMalloc at an address the caller chose (`address_replay::AddressReplay`): no
    /// range of the address map is taken.
    pub(crate) fn place(&mut self, bytes: u64) {
        self.used += bytes;
        self.device_mallocs += 1;
    }

    /// Accounts the cudaFree of a [`SimDevice::place`]d allocation.
    pub(crate) fn unplace(&mut self, bytes: u64) {
        self.used -= bytes;
        self.device_frees += 1;
    }

    fn take_range(&mut self, bytes: u64) -> DeviceResult<u64> {
        let len = bytes.div_ceil(SIM_ALIGNMENT_BYTES).max(1) * SIM_ALIGNMENT_BYTES;
        let (start, have) = self
            .free_ranges
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&s, &l)| (s, l))
            .ok_or_else(|| DeviceError::Other("simulated address space exhausted".into()))?;
        self.free_ranges.remove(&start);
        if have > len {
            self.free_ranges.insert(start + len, have - len);
        }
        Ok(start)
    }

    fn give_back_range(&mut self, start: u64, bytes: u64) {
        let mut start = start;
        let mut len = bytes.div_ceil(SIM_ALIGNMENT_BYTES).max(1) * SIM_ALIGNMENT_BYTES;
        if let Some((&next_start, &next_len)) = self.free_ranges.range(start + len..).next() {
            if next_start == start + len {
                self.free_ranges.remove(&next_start);
                len += next_len;
            }
        }
        if let Some((&prev_start, &prev_len)) = self.free_ranges.range(..start).next_back() {
            if prev_start + prev_len == start {
                self.free_ranges.remove(&prev_start);
                start = prev_start;
                len += prev_len;
            }
        }
        self.free_ranges.insert(start, len);
    }
}

impl Device for SimDevice {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn free_memory(&self) -> u64 {
        self.capacity - self.used
    }

    fn malloc(&mut self, bytes: u64, _stream: u64) -> DeviceResult<u64> {
        if bytes > self.capacity - self.used {
            return Err(DeviceError::OutOfMemory);
        }
        let ptr = if self.order == AddressOrder::Driver && bytes > SIM_ALIGNMENT_BYTES { self.take_range_downward(bytes)? } else { self.take_range(bytes)? };
        self.used += bytes;
        self.device_mallocs += 1;
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.used -= bytes;
        self.device_frees += 1;
        self.give_back_range(ptr, bytes);
        Ok(())
    }

    fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64> {
        self.take_range(bytes)
    }

    fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.give_back_range(ptr, bytes);
        Ok(())
    }

    fn map_page(&mut self, _ptr: u64, bytes: u64) -> DeviceResult<()> {
        if bytes > self.capacity - self.used {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += bytes;
        self.pages_mapped += 1;
        Ok(())
    }

    fn unmap_page(&mut self, _ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.used -= bytes;
        self.pages_unmapped += 1;
        Ok(())
    }

    fn describe(&self) -> String {
        let order = if self.order == AddressOrder::Driver { ", driver address order" } else { "" };
        // The card by name when it is one of the table's (one card, one number, everywhere).
        format!("simulated {}{order}", super::card::in_sentence(self.capacity).trim_start_matches("a "))
    }

    fn fork(&self) -> Option<Box<dyn Device>> {
        Some(Box::new(self.clone()))
    }
}

/// A boxed device is a device (the policies `gpu::build` makes own one).
impl<D: Device + ?Sized> Device for Box<D> {
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn free_memory(&self) -> u64 {
        (**self).free_memory()
    }
    fn malloc(&mut self, bytes: u64, stream: u64) -> DeviceResult<u64> {
        (**self).malloc(bytes, stream)
    }
    fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        (**self).free(ptr, bytes)
    }
    fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64> {
        (**self).reserve_address(bytes)
    }
    fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        (**self).release_address(ptr, bytes)
    }
    fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        (**self).map_page(ptr, bytes)
    }
    fn unmap_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        (**self).unmap_page(ptr, bytes)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn device_time_ns(&self) -> Option<u64> {
        (**self).device_time_ns()
    }
    fn fork(&self) -> Option<Box<dyn Device>> {
        (**self).fork()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H100 probe (reports/gpu-h100/GPU-CHECKS.md): three 20 MiB cuMemAllocs at decreasing
    /// addresses, the middle one freed, a fourth 20 MiB below the third rather than in the hole;
    /// 2 MiB requests upward from elsewhere.
    #[test]
    fn driver_order_places_large_allocations_downward_without_reusing_at_once() {
        let mut d = SimDevice::new(80 << 30).with_address_order(AddressOrder::Driver);
        let a = d.malloc(20 * MIB, 0).unwrap();
        let b = d.malloc(20 * MIB, 0).unwrap();
        let c = d.malloc(20 * MIB, 0).unwrap();
        assert!(a > b && b > c, "{a:#x} {b:#x} {c:#x}");
        d.free(b, 20 * MIB).unwrap();
        let e = d.malloc(20 * MIB, 0).unwrap();
        assert!(e < c, "the freed range {b:#x} is not reused at once: got {e:#x}");
        let s1 = d.malloc(2 * MIB, 0).unwrap();
        let s2 = d.malloc(2 * MIB, 0).unwrap();
        assert!(s1 < s2 && s2 < e, "small ones upward from the bottom: {s1:#x} {s2:#x}");
        assert_eq!(s1, SIM_VA_BASE);
        assert!(d.describe().contains("driver address order"));
    }

    /// A device past 64 TiB (up to the 1 PiB `--capacity` takes) can be filled: its address
    /// space grows with it, in both orders, with room for VA reservations larger than the card.
    #[test]
    fn a_petabyte_device_has_the_addresses_to_fill_it() {
        for order in [AddressOrder::Lowest, AddressOrder::Driver] {
            let mut d = SimDevice::new(1 << 50).with_address_order(order);
            let a = d.malloc(1 << 49, 0).unwrap();
            let b = d.malloc(1 << 49, 0).unwrap();
            assert_ne!(a, b);
            assert!(matches!(d.malloc(MIB, 0), Err(DeviceError::OutOfMemory)), "full by capacity, not by addresses");
            d.free(a, 1 << 49).unwrap();
            assert!(d.reserve_address(9 << 47).is_ok(), "an expandable segment's reservation of 1.125 x the card");
        }
    }

    /// Once the space below the cursor is used up, the search wraps to the top and reuses the
    /// highest freed range.
    #[test]
    fn driver_order_wraps_when_the_space_below_is_used() {
        let quarter = (1 << 46) / 4;
        let mut d = SimDevice::with_va_span(1 << 50, 1 << 46).with_address_order(AddressOrder::Driver);
        let ptrs: Vec<u64> = (0..4).map(|_| d.malloc(quarter, 0).unwrap()).collect();
        assert_eq!(ptrs, [3, 2, 1, 0].map(|k| SIM_VA_BASE + k * quarter));
        d.free(ptrs[1], quarter).unwrap();
        d.free(ptrs[0], quarter).unwrap();
        // Nothing below the cursor: wrap, and take the top of the highest free range.
        assert_eq!(d.malloc(quarter, 0).unwrap(), ptrs[0]);
        assert_eq!(d.malloc(quarter, 0).unwrap(), ptrs[1]);
        assert!(d.malloc(quarter, 0).is_err(), "the space is full");
    }

    /// Before torch 2.12 address order decides best-fit ties (BlockComparatorSize compares the
    /// address last): with two equal free segments, the lowest order reuses the older one, the
    /// driver order the newer. From 2.12 the older segment wins in either order.
    #[test]
    fn address_order_breaks_best_fit_ties_before_torch_2_12() {
        use crate::gpu::caching::CachingAllocator;
        use crate::gpu::config::AllocatorConfig;
        use crate::gpu::torch_version::TorchVersion;
        use crate::gpu::GpuAllocator;
        for (torch, order, newer) in [
            ("2.11", AddressOrder::Lowest, false),
            ("2.11", AddressOrder::Driver, true),
            ("2.12", AddressOrder::Lowest, false),
            ("2.12", AddressOrder::Driver, false),
        ] {
            let cfg = AllocatorConfig::parse_for("", TorchVersion::parse(torch).unwrap()).unwrap();
            let mut a = CachingAllocator::new(cfg, SimDevice::new(80 << 30).with_address_order(order));
            let old = a.malloc(20 * MIB, 0).unwrap();
            let new = a.malloc(20 * MIB, 0).unwrap();
            let (old_addr, new_addr) =
                (a.segments()[usize::from(order == AddressOrder::Driver)].address, a.segments()[usize::from(order != AddressOrder::Driver)].address);
            a.free(old).unwrap();
            a.free(new).unwrap();
            a.malloc(20 * MIB, 0).unwrap();
            let taken = a.segments().iter().find(|s| s.allocated() > 0).unwrap().address;
            assert_eq!(taken, if newer { new_addr } else { old_addr }, "torch {torch}, {order:?}");
        }
    }

    #[test]
    fn addresses_are_lowest_first_fit_and_reused() {
        let mut d = SimDevice::new(100 * MIB);
        let a = d.malloc(2 * MIB, 0).unwrap();
        let b = d.malloc(4 * MIB, 0).unwrap();
        let c = d.malloc(2 * MIB, 0).unwrap();
        assert_eq!(b, a + 2 * MIB);
        assert_eq!(c, b + 4 * MIB);
        d.free(b, 4 * MIB).unwrap();
        // A 2 MiB request reuses the lowest free range (b's), a 6 MiB one goes after c.
        assert_eq!(d.malloc(2 * MIB, 0).unwrap(), b);
        assert_eq!(d.malloc(6 * MIB, 0).unwrap(), c + 2 * MIB);
    }

    #[test]
    fn capacity_is_checked_on_bytes_not_contiguity() {
        let mut d = SimDevice::new(10 * MIB);
        let a = d.malloc(4 * MIB, 0).unwrap();
        let _b = d.malloc(2 * MIB, 0).unwrap();
        d.free(a, 4 * MIB).unwrap();
        assert_eq!(d.free_memory(), 8 * MIB);
        assert!(d.malloc(8 * MIB, 0).is_ok());
        assert_eq!(d.malloc(1, 0), Err(DeviceError::OutOfMemory));
    }
}
