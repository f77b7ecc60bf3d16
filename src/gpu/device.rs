//! The one narrow seam between allocator policies and device memory, and the simulated device.
//!
//! Policies call only this trait; `SimDevice` implements it on every machine and `CudaDevice`
//! (in `cuda.rs`) on a real GPU.

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
}

/// The default capacity: an H100 80 GB card reports 81,559 MiB of total memory.
pub const H100_CAPACITY_BYTES: u64 = 81_559 * MIB;
/// Simulated addresses are 2 MiB aligned, like real large cudaMalloc results.
pub const SIM_ALIGNMENT_BYTES: u64 = 2 * MIB;
const SIM_VA_BASE: u64 = 0x7f00_0000_0000;
const SIM_VA_SPAN: u64 = 1 << 46;

/// A deterministic simulated GPU (Note [SimDevice addresses]).
///
/// Note [SimDevice addresses]: a new allocation (or VA reservation) gets the lowest free address
/// range, 2 MiB aligned, in a virtual space far larger than the capacity (first fit; freed ranges
/// are reused). Capacity is checked on bytes in use, never on contiguity: a real GPU has virtual
/// memory, so device allocations do not fail for lack of a contiguous range. Fragmentation lives
/// in the allocator's segments. Addresses decide best-fit ties between equal-size blocks, so they
/// must be deterministic for results to be comparable.
#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: u64,
    used: u64,
    /// Free VA ranges: start → length.
    free_ranges: BTreeMap<u64, u64>,
    pub device_mallocs: u64,
    pub device_frees: u64,
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
    /// Measured device-call latencies (`--sim-latency`): simulated time is accounted with them.
    latency: Option<super::devprobe::LatencyModel>,
    device_time_ns: u64,
    /// Bytes held by others (counted in `used`).
    unavailable: u64,
    /// Addresses a real GPU returned, replayed in order (see [`SimDevice::with_address_script`]).
    address_script: std::collections::VecDeque<(u64, u64)>,
    /// Live scripted allocations: they bypass the VA map.
    scripted: rustc_hash::FxHashSet<u64>,
    /// Mallocs that could not follow the script (a different size was asked for).
    pub script_misses: u64,
}

impl SimDevice {
    pub fn new(capacity: u64) -> Self {
        let mut free_ranges = BTreeMap::new();
        free_ranges.insert(SIM_VA_BASE, SIM_VA_SPAN);
        SimDevice {
            capacity,
            used: 0,
            free_ranges,
            device_mallocs: 0,
            device_frees: 0,
            pages_mapped: 0,
            pages_unmapped: 0,
            latency: None,
            device_time_ns: 0,
            unavailable: 0,
            address_script: Default::default(),
            scripted: Default::default(),
            script_misses: 0,
        }
    }

    /// Replays the `(address, size)` of each cudaMalloc a real GPU made (from PyTorch's memory
    /// history), so that best-fit ties between equal-size blocks break as they did there. Each
    /// malloc takes the next scripted address if the size matches; otherwise the device falls back
    /// to its own address choice and counts a miss.
    pub fn with_address_script(mut self, script: Vec<(u64, u64)>) -> Self {
        self.address_script = script.into();
        self
    }

    /// Accounts device time with latencies measured on a real GPU (`allocbench devprobe`).
    pub fn with_latency(mut self, model: super::devprobe::LatencyModel) -> Self {
        self.latency = Some(model);
        self
    }

    /// Withholds `bytes` of the capacity, as the CUDA context and other processes do on a real
    /// GPU; the capacity (totalGlobalMem, which memory fractions use) is unchanged.
    pub fn with_unavailable(mut self, bytes: u64) -> Self {
        self.used += bytes.min(self.capacity);
        self.unavailable = bytes.min(self.capacity);
        self
    }

    /// Bytes in use by allocations of this process.
    pub fn used(&self) -> u64 {
        self.used - self.unavailable
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
        let scripted = match self.address_script.front() {
            Some(&(addr, size)) if size == bytes && !self.scripted.contains(&addr) => {
                self.address_script.pop_front();
                self.scripted.insert(addr);
                Some(addr)
            }
            Some(_) => {
                self.script_misses += 1;
                None
            }
            None => None,
        };
        let ptr = match scripted {
            Some(p) => p,
            None => self.take_range(bytes)?,
        };
        self.used += bytes;
        self.device_mallocs += 1;
        if let Some(m) = &self.latency {
            self.device_time_ns += m.malloc_ns(bytes);
        }
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.used -= bytes;
        self.device_frees += 1;
        if let Some(m) = &self.latency {
            self.device_time_ns += m.free_ns(bytes);
        }
        if !self.scripted.remove(&ptr) {
            self.give_back_range(ptr, bytes);
        }
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
        if let Some(m) = &self.latency {
            self.device_time_ns += m.malloc_ns(bytes);
        }
        Ok(())
    }

    fn unmap_page(&mut self, _ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.used -= bytes;
        self.pages_unmapped += 1;
        if let Some(m) = &self.latency {
            self.device_time_ns += m.free_ns(bytes);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("simulated device, {} capacity", crate::units::format_bytes(self.capacity))
    }

    fn device_time_ns(&self) -> Option<u64> {
        self.latency.as_ref().map(|_| self.device_time_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn scripted_addresses_are_followed_until_the_sizes_diverge() {
        let mut d = SimDevice::new(100 * MIB).with_address_script(vec![(0x7000_0000_0000, 2 * MIB), (0x6000_0000_0000, 4 * MIB)]);
        assert_eq!(d.malloc(2 * MIB, 0).unwrap(), 0x7000_0000_0000);
        assert_eq!(d.malloc(2 * MIB, 0).unwrap(), SIM_VA_BASE, "size differs from the script: own choice");
        assert_eq!(d.script_misses, 1);
        d.free(0x7000_0000_0000, 2 * MIB).unwrap();
        assert_eq!(d.malloc(4 * MIB, 0).unwrap(), 0x6000_0000_0000);
        assert_eq!(d.used(), 6 * MIB);
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
