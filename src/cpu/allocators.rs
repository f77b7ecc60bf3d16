//! The in-process allocators, called through `GlobalAlloc` directly (the binary's own global
//! allocator stays `System`), so one binary compares them side by side in one run; and their
//! native statistics.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;

use crate::error::InputError;

/// Every block is 16-byte aligned, as malloc's are.
pub const ALIGN: usize = 16;

/// Registered in-process allocators: name → what it is.
pub const CPU_ALLOCATORS: &[(&str, &str)] = &[
    ("system", "the process's malloc: glibc, or whatever LD_PRELOAD put in front of it"),
    ("jemalloc", "jemalloc compiled in (tikv-jemallocator)"),
    ("mimalloc", "mimalloc compiled in (mimalloc crate)"),
];

static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Which implementation: a closed set, so the replay loop calls it without a vtable.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    System,
    Jemalloc,
    Mimalloc,
    Null,
}

/// One allocator under test.
#[derive(Clone, Copy)]
pub struct CpuAllocator {
    pub name: &'static str,
    kind: Kind,
}

impl CpuAllocator {
    pub fn by_name(name: &str) -> Result<Self, InputError> {
        let kind = match name {
            "system" => Kind::System,
            "jemalloc" => Kind::Jemalloc,
            "mimalloc" => Kind::Mimalloc,
            other => {
                let names: Vec<&str> = CPU_ALLOCATORS.iter().map(|(n, _)| *n).collect();
                return Err(InputError::new("--allocator", format!("unknown CPU allocator '{other}' (known: {}, all)", names.join(", "))));
            }
        };
        let name = CPU_ALLOCATORS.iter().find(|(n, _)| *n == name).map(|(n, _)| *n).expect("registered");
        Ok(CpuAllocator { name, kind })
    }

    /// The no-op allocator for measuring the harness's own per-operation cost: it hands out one
    /// dangling, aligned pointer and frees nothing, so only a run with page touching off may
    /// use it (the driver refuses one with it on).
    pub fn null_for_overhead_measurement() -> Self {
        CpuAllocator { name: "null", kind: Kind::Null }
    }

    /// A block of `bytes` (16-byte aligned), or null when the allocator has no memory. The null
    /// allocator's block is a dangling pointer: nothing may be read or written through it.
    ///
    /// # Safety
    /// `bytes` > 0 and at most `isize::MAX - 15`; the result must be freed with
    /// [`CpuAllocator::free`] with the same size.
    #[inline]
    pub unsafe fn malloc(&self, bytes: usize) -> *mut u8 {
        // SAFETY: ALIGN is a power of two, and the caller keeps `bytes` rounded up to it within
        // isize::MAX.
        let layout = unsafe { Layout::from_size_align_unchecked(bytes, ALIGN) };
        match self.kind {
            // SAFETY: `layout` has a non-zero size (the caller's `bytes` > 0).
            Kind::System => unsafe { System.alloc(layout) },
            // SAFETY: as for System.
            Kind::Jemalloc => unsafe { JEMALLOC.alloc(layout) },
            // SAFETY: as for System.
            Kind::Mimalloc => unsafe { MIMALLOC.alloc(layout) },
            // Not an allocation: an aligned address that the caller never dereferences.
            Kind::Null => std::ptr::without_provenance_mut(ALIGN),
        }
    }

    /// # Safety
    /// `ptr` came from `malloc(bytes)` of this allocator and is freed once.
    #[inline]
    pub unsafe fn free(&self, ptr: *mut u8, bytes: usize) {
        // SAFETY: the layout `malloc(bytes)` made, valid there.
        let layout = unsafe { Layout::from_size_align_unchecked(bytes, ALIGN) };
        match self.kind {
            // SAFETY: the caller's `ptr` is a live block that this allocator's `malloc` got from
            // System with `layout`, freed once.
            Kind::System => unsafe { System.dealloc(ptr, layout) },
            // SAFETY: as for System, from jemalloc.
            Kind::Jemalloc => unsafe { JEMALLOC.dealloc(ptr, layout) },
            // SAFETY: as for System, from mimalloc.
            Kind::Mimalloc => unsafe { MIMALLOC.dealloc(ptr, layout) },
            Kind::Null => {}
        }
    }

    /// Whether this is the no-op allocator, whose blocks may not be touched.
    pub(crate) fn is_null(&self) -> bool {
        self.kind == Kind::Null
    }

    /// Allocator-native statistics (bytes), where the allocator has them.
    pub fn native_stats(&self, live_malloc: &str) -> BTreeMap<String, u64> {
        match self.name {
            "jemalloc" => jemalloc_stats(),
            "mimalloc" => mimalloc_stats(),
            _ => super::preload::native_stats_of_live_malloc(live_malloc),
        }
    }

    /// Gives cached memory back to the OS through the allocator's own call: mimalloc's
    /// `mi_collect(true)`, jemalloc's arena purge, and for `system` the call of whatever serves
    /// malloc (glibc or a preloaded allocator). Returns what was called.
    pub fn trim(&self, live_malloc: &str) -> Option<&'static str> {
        match self.name {
            "mimalloc" => {
                // SAFETY: mi_collect takes a flag and no pointers; mimalloc is thread-safe and
                // frees only what no live block uses.
                unsafe { libmimalloc_sys::mi_collect(true) };
                Some("mi_collect(true)")
            }
            "jemalloc" => {
                // arena.<MALLCTL_ARENAS_ALL = 4096>.purge takes no value: newp NULL, newlen 0.
                // SAFETY: the name is a NUL-terminated literal; oldp/oldlenp/newp null with newlen
                // 0 is how mallctl is asked to act without reading or writing a value; mallctl is
                // thread-safe and the purge frees only unused pages.
                let rc =
                    unsafe { tikv_jemalloc_sys::mallctl(c"arena.4096.purge".as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0) };
                (rc == 0).then_some("arena.<ALL>.purge")
            }
            _ => super::preload::trim_live_malloc(live_malloc),
        }
    }
}

fn jemalloc_stats() -> BTreeMap<String, u64> {
    use tikv_jemalloc_ctl::{epoch, stats};
    let mut m = BTreeMap::new();
    if epoch::advance().is_err() {
        return m;
    }
    let reads: [(&str, Result<usize, tikv_jemalloc_ctl::Error>); 6] = [
        ("jemalloc.stats.allocated", stats::allocated::read()),
        ("jemalloc.stats.active", stats::active::read()),
        ("jemalloc.stats.resident", stats::resident::read()),
        ("jemalloc.stats.mapped", stats::mapped::read()),
        ("jemalloc.stats.retained", stats::retained::read()),
        ("jemalloc.stats.metadata", stats::metadata::read()),
    ];
    for (k, v) in reads {
        if let Ok(v) = v {
            m.insert(k.to_string(), v as u64);
        }
    }
    m
}

fn mimalloc_stats() -> BTreeMap<String, u64> {
    let mut v = [0usize; 8];
    // SAFETY: mi_process_info writes one size_t through each of its eight pointers, here eight
    // distinct, live usize of `v`; it only reads process-wide counters.
    unsafe {
        let [a, b, c, d, e, f, g, h] = &mut v;
        libmimalloc_sys::mi_process_info(a, b, c, d, e, f, g, h);
    }
    let names = ["elapsed_msecs", "user_msecs", "system_msecs", "current_rss", "peak_rss", "current_commit", "peak_commit", "page_faults"];
    names.iter().zip(v).map(|(n, x)| (format!("mimalloc.{n}"), x as u64)).collect()
}
