//! Memory the process cannot have: on a real GPU the CUDA context and other processes hold part
//! of it. The capacity (`totalGlobalMem`, which memory fractions use) is unchanged; only the free
//! memory shrinks.

use super::{Device, DeviceError, DeviceResult};

/// Wraps a device and withholds `bytes` of its memory.
#[derive(Debug, Clone)]
pub struct Withheld<D> {
    inner: D,
    bytes: u64,
}

impl<D: Device> Withheld<D> {
    /// Withholds `bytes` (at most the capacity).
    pub fn new(inner: D, bytes: u64) -> Self {
        let bytes = bytes.min(inner.capacity());
        Withheld { inner, bytes }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: Device> Device for Withheld<D> {
    forward_to_inner!(capacity, free, reserve_address, release_address, unmap_page, describe, device_time_ns);

    fn free_memory(&self) -> u64 {
        self.inner.free_memory().saturating_sub(self.bytes)
    }

    fn malloc(&mut self, bytes: u64, stream: u64) -> DeviceResult<u64> {
        if bytes > self.free_memory() {
            return Err(DeviceError::OutOfMemory);
        }
        self.inner.malloc(bytes, stream)
    }

    fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        if bytes > self.free_memory() {
            return Err(DeviceError::OutOfMemory);
        }
        self.inner.map_page(ptr, bytes)
    }

    fn fork(&self) -> Option<Box<dyn Device>> {
        Some(Box::new(Withheld { inner: self.inner.fork()?, bytes: self.bytes }))
    }
}
