//! The real GPU behind the [`Device`] seam, through cudarc's driver API loaded at run time: the
//! crate builds and its tests pass on machines without CUDA. This is the only file that names
//! CUDA. Segments are `cuMemAlloc`/`cuMemFree`; expandable segments use the virtual-memory calls
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemAddressFree`) as PyTorch does. Everything still mapped or allocated is
//! released on drop.
//!
//! Note [cudarc without a driver]: cudarc panics instead of returning an error when libcuda or one
//! of its symbols is missing. [`CudaDevice::open`] checks that the library loads, then runs the
//! first driver calls inside `catch_unwind` with a quiet panic hook, and reports "no CUDA driver
//! found: …". Error codes are printed from the enum (never via cuGetErrorString, which a stub
//! driver may lack).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::{self, CUresult};

use super::device::{Device, DeviceError, DeviceResult};
use super::stats::{DeviceStats, PoolKind};
use super::{AllocError, GpuAllocator, Handle, OomInfo};
use crate::error::InputError;

fn check(r: CUresult, what: &str) -> DeviceResult<()> {
    match r {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory),
        other => Err(DeviceError::Other(format!("{what} failed: {other:?}"))),
    }
}

/// Runs driver calls that may panic inside cudarc (missing library or symbol) as an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Err(format!("{what}: {}", msg.lines().next().unwrap_or("the driver library lacks a required symbol")))
        }
    }
}

/// One CUDA device with a current primary context.
pub struct CudaDevice {
    ordinal: i32,
    device: sys::CUdevice,
    total: u64,
    name: String,
    streams: HashMap<u64, sys::CUstream>,
    /// Live cuMemAlloc allocations: address → bytes.
    allocations: HashMap<u64, u64>,
    /// VA reservations: address → bytes.
    reservations: HashMap<u64, u64>,
    /// Mapped pages: address → (bytes, physical handle).
    pages: HashMap<u64, (u64, sys::CUmemGenericAllocationHandle)>,
    pub device_mallocs: u64,
    pub device_frees: u64,
    /// Wall time spent inside device allocation calls.
    device_time_ns: u64,
}

/// Times one driver call.
fn timed<T>(acc: &mut u64, f: impl FnOnce() -> T) -> T {
    let t0 = std::time::Instant::now();
    let r = f();
    *acc += t0.elapsed().as_nanos() as u64;
    r
}

impl CudaDevice {
    /// Opens device `ordinal`, or explains in one line why there is none.
    pub fn open(ordinal: i32) -> Result<Self, InputError> {
        let no_driver = |m: String| InputError::new("--device cuda", format!("no CUDA driver found: {m}"));
        if !unsafe { sys::is_culib_present() } {
            return Err(no_driver(
                "libcuda.so could not be loaded (install the NVIDIA driver, or run without --device cuda to use the simulated device)".into(),
            ));
        }
        let opened = guarded("loading the CUDA driver", || unsafe {
            let r = sys::cuInit(0);
            if r != CUresult::CUDA_SUCCESS {
                return Err(format!("cuInit returned {r:?}"));
            }
            let mut count = 0;
            check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount").map_err(|e| e.to_string())?;
            if ordinal >= count {
                return Err(format!("device {ordinal} requested but {count} CUDA device(s) found"));
            }
            let mut device = 0;
            check(sys::cuDeviceGet(&mut device, ordinal), "cuDeviceGet").map_err(|e| e.to_string())?;
            let mut ctx = std::ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, device), "cuDevicePrimaryCtxRetain").map_err(|e| e.to_string())?;
            check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent").map_err(|e| e.to_string())?;
            let mut total = 0usize;
            check(sys::cuDeviceTotalMem_v2(&mut total, device), "cuDeviceTotalMem").map_err(|e| e.to_string())?;
            let mut name = [0 as std::ffi::c_char; 128];
            check(sys::cuDeviceGetName(name.as_mut_ptr(), 128, device), "cuDeviceGetName").map_err(|e| e.to_string())?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            Ok((device, total as u64, name))
        })
        .map_err(no_driver)?;
        let (device, total, name) = opened;
        Ok(CudaDevice {
            ordinal,
            device,
            total,
            name,
            streams: HashMap::new(),
            allocations: HashMap::new(),
            reservations: HashMap::new(),
            pages: HashMap::new(),
            device_mallocs: 0,
            device_frees: 0,
            device_time_ns: 0,
        })
    }

    /// The real stream for a trace's stream id: 0 is the legacy default stream; others are
    /// created on first use.
    pub fn stream(&mut self, id: u64) -> DeviceResult<sys::CUstream> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        if let Some(&s) = self.streams.get(&id) {
            return Ok(s);
        }
        let mut s = std::ptr::null_mut();
        check(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")?; // CU_STREAM_NON_BLOCKING
        self.streams.insert(id, s);
        Ok(s)
    }

    fn location(&self) -> sys::CUmemLocation {
        let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
        loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        loc.id = self.ordinal;
        loc
    }

    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = self.location();
        prop
    }

    /// The physical page granularity the VMM calls need (2 MiB on current GPUs).
    pub fn granularity(&self) -> DeviceResult<u64> {
        let prop = self.allocation_prop();
        let mut g = 0usize;
        check(
            unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM) },
            "cuMemGetAllocationGranularity",
        )?;
        Ok(g as u64)
    }

    pub fn synchronize(&self) -> DeviceResult<()> {
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Device for CudaDevice {
    fn capacity(&self) -> u64 {
        self.total
    }

    fn free_memory(&self) -> u64 {
        let (mut free, mut total) = (0usize, 0usize);
        match unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) } {
            CUresult::CUDA_SUCCESS => free as u64,
            _ => 0,
        }
    }

    fn malloc(&mut self, bytes: u64, _stream: u64) -> DeviceResult<u64> {
        let mut ptr = 0;
        check(timed(&mut self.device_time_ns, || unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) }), "cuMemAlloc")?;
        self.allocations.insert(ptr, bytes);
        self.device_mallocs += 1;
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, _bytes: u64) -> DeviceResult<()> {
        check(timed(&mut self.device_time_ns, || unsafe { sys::cuMemFree_v2(ptr) }), "cuMemFree")?;
        self.allocations.remove(&ptr);
        self.device_frees += 1;
        Ok(())
    }

    fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64> {
        let mut ptr = 0;
        check(unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, 0, 0, 0) }, "cuMemAddressReserve")?;
        self.reservations.insert(ptr, bytes);
        Ok(ptr)
    }

    fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        check(unsafe { sys::cuMemAddressFree(ptr, bytes as usize) }, "cuMemAddressFree")?;
        self.reservations.remove(&ptr);
        Ok(())
    }

    fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        let prop = self.allocation_prop();
        let mut handle = 0;
        let t0 = std::time::Instant::now();
        check(unsafe { sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0) }, "cuMemCreate")?;
        let mapped = check(unsafe { sys::cuMemMap(ptr, bytes as usize, 0, handle, 0) }, "cuMemMap").and_then(|()| {
            let desc = sys::CUmemAccessDesc { location: self.location(), flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
            check(unsafe { sys::cuMemSetAccess(ptr, bytes as usize, &desc, 1) }, "cuMemSetAccess")
        });
        if let Err(e) = mapped {
            unsafe {
                sys::cuMemUnmap(ptr, bytes as usize);
                sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.pages.insert(ptr, (bytes, handle));
        self.device_time_ns += t0.elapsed().as_nanos() as u64;
        Ok(())
    }

    fn unmap_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        let t0 = std::time::Instant::now();
        check(unsafe { sys::cuMemUnmap(ptr, bytes as usize) }, "cuMemUnmap")?;
        if let Some((_, handle)) = self.pages.remove(&ptr) {
            check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease")?;
        }
        self.device_time_ns += t0.elapsed().as_nanos() as u64;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} ({}, CUDA device {})", self.name, crate::units::format_bytes(self.total), self.ordinal)
    }

    fn device_time_ns(&self) -> Option<u64> {
        Some(self.device_time_ns)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        unsafe {
            sys::cuCtxSynchronize();
            for (&ptr, &(bytes, handle)) in &self.pages {
                sys::cuMemUnmap(ptr, bytes as usize);
                sys::cuMemRelease(handle);
            }
            for (&ptr, &bytes) in &self.reservations {
                sys::cuMemAddressFree(ptr, bytes as usize);
            }
            for &ptr in self.allocations.keys() {
                sys::cuMemFree_v2(ptr);
            }
            for &s in self.streams.values() {
                sys::cuStreamDestroy_v2(s);
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}

/// CUDA's stream-ordered pool (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on a pool whose
/// release threshold keeps everything cached): the driver's own caching allocator, as a baseline.
pub struct AsyncPoolAllocator {
    device: CudaDevice,
    pool: sys::CUmemoryPool,
    live: HashMap<Handle, (u64, u64, u64)>,
    next: Handle,
    stats: DeviceStats,
    device_time_ns: u64,
}

impl AsyncPoolAllocator {
    pub fn new(device: CudaDevice) -> DeviceResult<Self> {
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location = device.location();
        let mut pool = std::ptr::null_mut();
        check(unsafe { sys::cuMemPoolCreate(&mut pool, &props) }, "cuMemPoolCreate")?;
        let mut threshold: u64 = u64::MAX;
        check(
            unsafe { sys::cuMemPoolSetAttribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut threshold as *mut u64 as *mut _) },
            "cuMemPoolSetAttribute",
        )?;
        Ok(AsyncPoolAllocator {
            device,
            pool,
            live: HashMap::new(),
            next: 0,
            stats: DeviceStats { max_split_size: -1, ..Default::default() },
            device_time_ns: 0,
        })
    }

    fn pool_attr(&self, attr: sys::CUmemPool_attribute) -> u64 {
        let mut v: u64 = 0;
        unsafe { sys::cuMemPoolGetAttribute(self.pool, attr, &mut v as *mut u64 as *mut _) };
        v
    }

    /// Reserved memory as the pool reports it (the backend:cudaMallocAsync stats).
    fn sync_reserved(&mut self) {
        let reserved = self.pool_attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) as i64;
        let cur = self.stats.reserved_bytes.all.current;
        if reserved > cur {
            self.stats.reserved_bytes.increase(PoolKind::Large, (reserved - cur) as u64);
        } else if reserved < cur {
            self.stats.reserved_bytes.decrease(PoolKind::Large, (cur - reserved) as u64);
        }
    }
}

impl GpuAllocator for AsyncPoolAllocator {
    fn name(&self) -> String {
        "async".into()
    }

    fn malloc(&mut self, bytes: u64, stream: u64) -> Result<Handle, AllocError> {
        let s = self.device.stream(stream)?;
        let mut ptr = 0;
        let pool_handle = self.pool;
        match check(
            timed(&mut self.device_time_ns, || unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes as usize, pool_handle, s) }),
            "cuMemAllocFromPoolAsync",
        ) {
            Ok(()) => {}
            Err(DeviceError::OutOfMemory) => {
                self.stats.num_ooms += 1;
                let reserved = self.stats.reserved_bytes.all.current as u64;
                let allocated = self.stats.allocated_bytes.all.current as u64;
                return Err(AllocError::OutOfMemory(OomInfo {
                    requested: bytes,
                    rounded: bytes,
                    alloc_size: bytes,
                    device_free: self.device.free_memory(),
                    cached_free: reserved.saturating_sub(allocated),
                    largest_free_block: 0,
                    reserved,
                    allocated,
                }));
            }
            Err(e) => return Err(AllocError::Device(e)),
        }
        let h = self.next;
        self.next = self.next.wrapping_add(1);
        self.live.insert(h, (ptr, bytes, stream));
        let pool = super::caching::pool_for(bytes);
        self.stats.allocation.increase(pool, 1);
        self.stats.allocated_bytes.increase(pool, bytes);
        self.stats.active_bytes.increase(pool, bytes);
        self.stats.requested_bytes.increase(pool, bytes);
        self.sync_reserved();
        Ok(h)
    }

    fn free(&mut self, handle: Handle) -> Result<(), DeviceError> {
        let (ptr, bytes, stream) = self.live.remove(&handle).expect("free of a live handle");
        let s = self.device.stream(stream)?;
        check(timed(&mut self.device_time_ns, || unsafe { sys::cuMemFreeAsync(ptr, s) }), "cuMemFreeAsync")?;
        let pool = super::caching::pool_for(bytes);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, bytes);
        self.stats.active_bytes.decrease(pool, bytes);
        self.stats.requested_bytes.decrease(pool, bytes);
        Ok(())
    }

    fn empty_cache(&mut self) -> Result<(), DeviceError> {
        self.device.synchronize()?;
        check(unsafe { sys::cuMemPoolTrimTo(self.pool, 0) }, "cuMemPoolTrimTo")?;
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

/// Measures device allocation latency by size (`allocbench devprobe`).
pub fn devprobe(device: CudaDevice, reps: usize) -> Result<crate::results::DevprobeResult, DeviceError> {
    use super::devprobe::{probe_sizes, summarize};
    let sizes = probe_sizes(device.capacity());
    let (mut malloc, mut free) = (Vec::new(), Vec::new());
    for &bytes in &sizes {
        // Big allocations take milliseconds: fewer repetitions for them.
        let n = if bytes >= 1 << 30 { reps.div_ceil(10).max(5) } else { reps };
        let (mut m, mut f) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let mut ptr = 0;
            let t0 = std::time::Instant::now();
            check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) }, "cuMemAlloc")?;
            let t1 = std::time::Instant::now();
            check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree")?;
            let t2 = std::time::Instant::now();
            m.push((t1 - t0).as_nanos() as u64);
            f.push((t2 - t1).as_nanos() as u64);
        }
        malloc.push(summarize(bytes, m));
        free.push(summarize(bytes, f));
    }
    let capacity = device.capacity();
    let name = device.describe();
    let mut pool = AsyncPoolAllocator::new(device)?;
    let mut async_pool = Vec::new();
    for &bytes in &sizes {
        let n = if bytes >= 1 << 30 { reps.div_ceil(10).max(5) } else { reps };
        // Warm the pool at this size first, then time alloc + free from it.
        let h = pool.malloc(bytes, 0).map_err(|e| DeviceError::Other(format!("{e:?}")))?;
        pool.free(h)?;
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = std::time::Instant::now();
            let h = pool.malloc(bytes, 0).map_err(|e| DeviceError::Other(format!("{e:?}")))?;
            pool.free(h)?;
            t.push(t0.elapsed().as_nanos() as u64);
        }
        async_pool.push(summarize(bytes, t));
    }
    Ok(crate::results::DevprobeResult {
        schema_version: crate::results::SCHEMA_VERSION,
        device: name,
        capacity,
        machine: crate::results::MachineInfo::current(),
        malloc,
        free,
        async_pool_alloc_free: async_pool,
    })
}

impl Drop for AsyncPoolAllocator {
    fn drop(&mut self) {
        unsafe {
            for &(ptr, _, stream) in self.live.values() {
                let s = self.device.streams.get(&stream).copied().unwrap_or(std::ptr::null_mut());
                sys::cuMemFreeAsync(ptr, s);
            }
            sys::cuCtxSynchronize();
            sys::cuMemPoolDestroy(self.pool);
        }
    }
}
