//! Device time on a simulated device: every successful device call is charged the latency
//! measured on a real GPU at its size (`--sim-latency`/`--latency FILE`, from `allocbench
//! devprobe`; the embedded H100 table otherwise). Page maps cost a cudaMalloc of the page
//! (cuMemCreate + cuMemMap + cuMemSetAccess), unmaps a cudaFree, and a VA reserve or release
//! the smallest probed call (a driver round trip that moves no memory).

use super::{Device, DeviceResult};
use crate::gpu::devprobe::LatencyModel;

/// Wraps a device and accounts the time its calls would take on the probed GPU.
#[derive(Debug, Clone)]
pub struct WithLatency<D> {
    inner: D,
    model: LatencyModel,
    device_time_ns: u64,
}

impl<D: Device> WithLatency<D> {
    pub fn new(inner: D, model: LatencyModel) -> Self {
        WithLatency { inner, model, device_time_ns: 0 }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: Device> Device for WithLatency<D> {
    forward_to_inner!(capacity, free_memory, describe);

    fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64> {
        let ptr = self.inner.reserve_address(bytes)?;
        self.device_time_ns = self.device_time_ns.saturating_add(self.model.malloc_ns(0));
        Ok(ptr)
    }

    fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.inner.release_address(ptr, bytes)?;
        self.device_time_ns = self.device_time_ns.saturating_add(self.model.free_ns(0));
        Ok(())
    }

    fn malloc(&mut self, bytes: u64, stream: u64) -> DeviceResult<u64> {
        let ptr = self.inner.malloc(bytes, stream)?;
        self.device_time_ns = self.device_time_ns.saturating_add(self.model.malloc_ns(bytes));
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.inner.free(ptr, bytes)?;
        self.device_time_ns = self.device_time_ns.saturating_add(self.model.free_ns(bytes));
        Ok(())
    }

    fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.inner.map_page(ptr, bytes)?;
        self.device_time_ns = self.device_time_ns.saturating_add(self.model.malloc_ns(bytes));
        Ok(())
    }

    fn unmap_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        self.inner.unmap_page(ptr, bytes)?;
        self.device_time_ns = self.device_time_ns.saturating_add(self.model.free_ns(bytes));
        Ok(())
    }

    fn device_time_ns(&self) -> Option<u64> {
        Some(self.device_time_ns)
    }

    fn fork(&self) -> Option<Box<dyn Device>> {
        let inner = self.inner.fork()?;
        Some(Box::new(WithLatency { inner, model: self.model.clone(), device_time_ns: self.device_time_ns }))
    }
}
