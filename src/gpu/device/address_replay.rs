//! Replays the `(address, size)` of each cudaMalloc a real GPU made (from PyTorch's memory
//! history), so that best-fit ties between equal-size blocks break as they did there.
//!
//! It wraps the simulated device only: placing an allocation at a chosen address is something
//! only a simulated device can do.

use std::collections::VecDeque;

use rustc_hash::FxHashSet;

use super::{Device, DeviceError, DeviceResult, SimDevice};

/// Each malloc takes the next scripted address if the size matches; otherwise the device falls
/// back to its own address choice and counts a miss.
#[derive(Debug, Clone)]
pub struct AddressReplay {
    inner: SimDevice,
    script: VecDeque<(u64, u64)>,
    /// Live scripted allocations: they bypass the address map.
    placed: FxHashSet<u64>,
    /// Mallocs that could not follow the script (a different size was asked for).
    pub script_misses: u64,
}

impl AddressReplay {
    pub fn new(inner: SimDevice, script: Vec<(u64, u64)>) -> Self {
        AddressReplay { inner, script: script.into(), placed: FxHashSet::default(), script_misses: 0 }
    }

    pub fn inner(&self) -> &SimDevice {
        &self.inner
    }

    /// Bytes in use by allocations of this process.
    pub fn used(&self) -> u64 {
        self.inner.used()
    }
}

impl Device for AddressReplay {
    forward_to_inner!(capacity, free_memory, reserve_address, release_address, map_page, unmap_page, describe, device_time_ns);

    fn malloc(&mut self, bytes: u64, stream: u64) -> DeviceResult<u64> {
        if bytes > self.inner.free_memory() {
            return Err(DeviceError::OutOfMemory);
        }
        match self.script.front() {
            Some(&(addr, size)) if size == bytes && !self.placed.contains(&addr) => {
                self.script.pop_front();
                self.placed.insert(addr);
                self.inner.place(bytes);
                Ok(addr)
            }
            Some(_) => {
                self.script_misses += 1;
                self.inner.malloc(bytes, stream)
            }
            None => self.inner.malloc(bytes, stream),
        }
    }

    fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        if self.placed.remove(&ptr) {
            self.inner.unplace(bytes);
            Ok(())
        } else {
            self.inner.free(ptr, bytes)
        }
    }

    fn fork(&self) -> Option<Box<dyn Device>> {
        Some(Box::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::SIM_VA_BASE;
    use super::*;
    use crate::units::MIB;

    #[test]
    fn scripted_addresses_are_followed_until_the_sizes_diverge() {
        let mut d = AddressReplay::new(SimDevice::new(100 * MIB), vec![(0x7000_0000_0000, 2 * MIB), (0x6000_0000_0000, 4 * MIB)]);
        assert_eq!(d.malloc(2 * MIB, 0).unwrap(), 0x7000_0000_0000);
        assert_eq!(d.malloc(2 * MIB, 0).unwrap(), SIM_VA_BASE, "size differs from the script: own choice");
        assert_eq!(d.script_misses, 1);
        d.free(0x7000_0000_0000, 2 * MIB).unwrap();
        assert_eq!(d.malloc(4 * MIB, 0).unwrap(), 0x6000_0000_0000);
        assert_eq!(d.used(), 6 * MIB);
    }
}
