//! The real GPU behind the [`Device`] seam, through cudarc's driver API loaded at run time: the
//! crate builds and its tests pass on machines without CUDA. This is the only file that names
//! CUDA. Segments are `cuMemAlloc`/`cuMemFree`; expandable segments use the virtual-memory calls
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemAddressFree`) as PyTorch does. Everything still mapped or allocated is
//! released on drop. [`CudaPool`] holds the stream-ordered pool's calls (`async_pool.rs` is the
//! allocator over it) and [`CudaDevice::time_alloc_free`] the raw timings `devprobe.rs` collects.
//!
//! Note [cudarc without a driver]: cudarc panics instead of returning an error when libcuda or one
//! of its symbols is missing. [`CudaDevice::open`] checks that the library loads, then runs the
//! first driver calls inside `catch_unwind` with a quiet panic hook, and reports "no CUDA driver
//! found: …". Error codes are printed from the enum (never via cuGetErrorString, which a stub
//! driver may lack).
//!
//! Note [driver calls are sound]: every `unsafe` block here calls the driver through cudarc's
//! bindings, generated from CUDA 12.8's cuda.h, whose entry points are looked up by name in the
//! library loaded at run time (one that is missing panics: it is never replaced by something
//! else). The driver API is thread-safe. The host memory a call reads or writes is a live local of
//! the type the prototype names, passed as `&`/`&mut`. Device addresses and sizes are passed by
//! value and name device memory, never host memory of ours (a wrong one is the driver's to refuse
//! with an error code). Handles (the context, streams, the pool, physical pages) are ones the
//! driver gave this device or pool, each released once (on drop, or as its record is removed) and
//! not used after.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::{self, CUresult};

use super::device::{Device, DeviceError, DeviceResult};
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
        // SAFETY: it dlopens libcuda (running the driver library's initialisers, as any CUDA
        // program does) and closes it again; no symbol of it is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(no_driver(
                "libcuda.so could not be loaded (install the NVIDIA driver, or run without --device cuda to use the simulated device)".into(),
            ));
        }
        // SAFETY: see Note [driver calls are sound]: each out-parameter is a live local of the type
        // the call writes (`name`: 128 chars, into which cuDeviceGetName writes at most 128 bytes,
        // NUL-terminated, which CStr then reads); each handle passed is one an earlier call here
        // returned. A missing entry point panics, and `guarded` turns that into an error.
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
    fn stream(&mut self, id: u64) -> DeviceResult<sys::CUstream> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        if let Some(&s) = self.streams.get(&id) {
            return Ok(s);
        }
        let mut s = std::ptr::null_mut();
        // SAFETY: writes the new stream's handle to the live local `s` (see Note [driver calls are
        // sound]); the stream lives in `streams` until drop destroys it.
        check(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")?; // CU_STREAM_NON_BLOCKING
        self.streams.insert(id, s);
        Ok(s)
    }

    fn location(&self) -> sys::CUmemLocation {
        // SAFETY: CUmemLocation is a repr(C) struct of a u32 enum whose 0 is a variant
        // (CU_MEM_LOCATION_TYPE_INVALID) and an int: all zeros is a valid value.
        let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
        loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        loc.id = self.ordinal;
        loc
    }

    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a repr(C) struct of enums whose 0 is a variant
        // (CU_MEM_ALLOCATION_TYPE_INVALID, CU_MEM_HANDLE_TYPE_NONE), a CUmemLocation (see
        // `location`), a raw pointer and integer flags: all zeros is a valid value, and the zero
        // CUDA asks of the fields not set here.
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
            // SAFETY: writes a size_t to the live local `g` and reads the live `prop` (see Note
            // [driver calls are sound]).
            unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM) },
            "cuMemGetAllocationGranularity",
        )?;
        Ok(g as u64)
    }

    pub fn synchronize(&self) -> DeviceResult<()> {
        // SAFETY: takes nothing; waits for the current context's work.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// One raw `cuMemAlloc` + `cuMemFree` of `bytes`, each timed (ns), bypassing the bookkeeping.
    pub fn time_alloc_free(&self, bytes: u64) -> DeviceResult<(u64, u64)> {
        let mut ptr = 0;
        let t0 = std::time::Instant::now();
        // SAFETY: writes the new device address to the live local `ptr` (see Note [driver calls
        // are sound]).
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) }, "cuMemAlloc")?;
        let t1 = std::time::Instant::now();
        // SAFETY: frees, once, the device allocation just made.
        check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree")?;
        let t2 = std::time::Instant::now();
        Ok(((t1 - t0).as_nanos() as u64, (t2 - t1).as_nanos() as u64))
    }
}

impl Device for CudaDevice {
    fn capacity(&self) -> u64 {
        self.total
    }

    fn free_memory(&self) -> u64 {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t to the live locals `free` and `total`.
        match unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) } {
            CUresult::CUDA_SUCCESS => free as u64,
            _ => 0,
        }
    }

    fn malloc(&mut self, bytes: u64, _stream: u64) -> DeviceResult<u64> {
        let mut ptr = 0;
        // SAFETY: writes the new device address to the live local `ptr` (see Note [driver calls
        // are sound]).
        check(timed(&mut self.device_time_ns, || unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) }), "cuMemAlloc")?;
        self.allocations.insert(ptr, bytes);
        self.device_mallocs += 1;
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, _bytes: u64) -> DeviceResult<()> {
        // SAFETY: a device address by value, one `malloc` answered (see Note [driver calls are
        // sound]); it leaves `allocations`, so drop does not free it again.
        check(timed(&mut self.device_time_ns, || unsafe { sys::cuMemFree_v2(ptr) }), "cuMemFree")?;
        self.allocations.remove(&ptr);
        self.device_frees += 1;
        Ok(())
    }

    fn reserve_address(&mut self, bytes: u64) -> DeviceResult<u64> {
        let mut ptr = 0;
        // SAFETY: writes the reserved range's start to the live local `ptr`; alignment, address
        // hint and flags 0 are the defaults (see Note [driver calls are sound]).
        check(unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, 0, 0, 0) }, "cuMemAddressReserve")?;
        self.reservations.insert(ptr, bytes);
        Ok(ptr)
    }

    fn release_address(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        // SAFETY: a reserved range by value, one `reserve_address` answered; it leaves
        // `reservations`, so drop does not free it again.
        check(unsafe { sys::cuMemAddressFree(ptr, bytes as usize) }, "cuMemAddressFree")?;
        self.reservations.remove(&ptr);
        Ok(())
    }

    fn map_page(&mut self, ptr: u64, bytes: u64) -> DeviceResult<()> {
        let prop = self.allocation_prop();
        let mut handle = 0;
        let t0 = std::time::Instant::now();
        // SAFETY: writes the new physical allocation's handle to the live local `handle` and
        // reads the live `prop` (see Note [driver calls are sound]).
        check(unsafe { sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0) }, "cuMemCreate")?;
        // SAFETY: maps the handle just made into a range of a reservation, all by value.
        let mapped = check(unsafe { sys::cuMemMap(ptr, bytes as usize, 0, handle, 0) }, "cuMemMap").and_then(|()| {
            let desc = sys::CUmemAccessDesc { location: self.location(), flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
            // SAFETY: reads one CUmemAccessDesc (count 1) from the live local `desc`.
            check(unsafe { sys::cuMemSetAccess(ptr, bytes as usize, &desc, 1) }, "cuMemSetAccess")
        });
        if let Err(e) = mapped {
            // SAFETY: undoes the map (an error if it never happened) and releases the handle
            // made above, once: it was never recorded in `pages`. All by value.
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
        // SAFETY: a device range by value, one `map_page` mapped (see Note [driver calls are
        // sound]).
        check(unsafe { sys::cuMemUnmap(ptr, bytes as usize) }, "cuMemUnmap")?;
        if let Some((_, handle)) = self.pages.remove(&ptr) {
            // SAFETY: the page's handle, by value, released once: it has just left `pages`.
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
        // SAFETY: all by value (see Note [driver calls are sound]): each mapped page, reservation,
        // allocation and stream this device recorded is released once (the maps hold each once,
        // and only what is still live), then the primary context `open` retained.
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

/// A stream-ordered memory pool (`cuMemPoolCreate`) whose release threshold keeps everything
/// cached: the driver's own caching allocator. Destroyed on drop.
pub struct CudaPool {
    pool: sys::CUmemoryPool,
}

impl CudaPool {
    pub fn new(device: &CudaDevice) -> DeviceResult<Self> {
        // SAFETY: CUmemPoolProps is a repr(C) struct of enums whose 0 is a variant (see
        // `CudaDevice::allocation_prop`), a CUmemLocation, a raw pointer, integers and reserved
        // bytes: all zeros is a valid value, and the zero CUDA asks of the fields not set here.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location = device.location();
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes the new pool's handle to the live local `pool` and reads the live
        // `props` (see Note [driver calls are sound]).
        check(unsafe { sys::cuMemPoolCreate(&mut pool, &props) }, "cuMemPoolCreate")?;
        let mut threshold: u64 = u64::MAX;
        check(
            // SAFETY: CU_MEMPOOL_ATTR_RELEASE_THRESHOLD reads a cuuint64_t: `threshold`, a live u64.
            unsafe { sys::cuMemPoolSetAttribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut threshold as *mut u64 as *mut _) },
            "cuMemPoolSetAttribute",
        )?;
        Ok(CudaPool { pool })
    }

    /// Bytes the pool holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT writes a cuuint64_t: `v`, a live u64; the
        // pool is this one's, alive until drop.
        unsafe { sys::cuMemPoolGetAttribute(self.pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &mut v as *mut u64 as *mut _) };
        v
    }

    /// `cuMemAllocFromPoolAsync` on the trace's stream `stream`, its time added to `time_ns`.
    pub fn alloc(&self, device: &mut CudaDevice, bytes: u64, stream: u64, time_ns: &mut u64) -> DeviceResult<u64> {
        let s = device.stream(stream)?;
        let mut ptr = 0;
        let pool = self.pool;
        // SAFETY: writes the new device address to the live local `ptr`; the pool is this one's,
        // and `s` is null (the legacy stream) or a stream of `device`, alive until its drop.
        check(timed(time_ns, || unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes as usize, pool, s) }), "cuMemAllocFromPoolAsync")?;
        Ok(ptr)
    }

    /// `cuMemFreeAsync` on the trace's stream `stream`, its time added to `time_ns`.
    pub fn free(&self, device: &mut CudaDevice, ptr: u64, stream: u64, time_ns: &mut u64) -> DeviceResult<()> {
        let s = device.stream(stream)?;
        // SAFETY: a device address and a stream of `device` (or null), by value (see Note [driver
        // calls are sound]).
        check(timed(time_ns, || unsafe { sys::cuMemFreeAsync(ptr, s) }), "cuMemFreeAsync")
    }

    /// `cuMemPoolTrimTo(0)`: gives every unused byte back to the device.
    pub fn trim(&self) -> DeviceResult<()> {
        // SAFETY: this pool's handle, alive until drop, by value.
        check(unsafe { sys::cuMemPoolTrimTo(self.pool, 0) }, "cuMemPoolTrimTo")
    }

    /// Frees what is still live (on its stream, or the default one) and waits for the device.
    pub fn free_all(&self, device: &CudaDevice, live: impl Iterator<Item = (u64, u64)>) {
        // SAFETY: device addresses and streams of `device` (or null), by value (see Note [driver
        // calls are sound]), then a wait for the context's work.
        unsafe {
            for (ptr, stream) in live {
                let s = device.streams.get(&stream).copied().unwrap_or(std::ptr::null_mut());
                sys::cuMemFreeAsync(ptr, s);
            }
            sys::cuCtxSynchronize();
        }
    }
}

impl Drop for CudaPool {
    fn drop(&mut self) {
        // SAFETY: the pool `new` created, destroyed once. Its context is still alive:
        // AsyncPoolAllocator, the only holder, declares its pool before its device, so the pool
        // is dropped before the device releases the primary context.
        unsafe {
            sys::cuMemPoolDestroy(self.pool);
        }
    }
}
