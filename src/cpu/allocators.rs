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
static NULL: NullAlloc = NullAlloc;

/// Hands out one dangling, aligned pointer and frees nothing: replaying through it measures the
/// harness alone (run without page touching: nothing may be written through it).
struct NullAlloc;

unsafe impl GlobalAlloc for NullAlloc {
    unsafe fn alloc(&self, _layout: Layout) -> *mut u8 {
        std::ptr::without_provenance_mut(ALIGN)
    }
    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}
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

    /// The no-op allocator for measuring the harness's own per-operation cost. Only valid with
    /// page touching off.
    pub fn null_for_overhead_measurement() -> Self {
        CpuAllocator { name: "null", kind: Kind::Null }
    }

    /// # Safety
    /// `bytes` > 0; the result must be freed with [`CpuAllocator::free`] with the same size.
    #[inline]
    pub unsafe fn malloc(&self, bytes: usize) -> *mut u8 {
        let layout = Layout::from_size_align_unchecked(bytes, ALIGN);
        match self.kind {
            Kind::System => System.alloc(layout),
            Kind::Jemalloc => JEMALLOC.alloc(layout),
            Kind::Mimalloc => MIMALLOC.alloc(layout),
            Kind::Null => NULL.alloc(layout),
        }
    }

    /// # Safety
    /// `ptr` came from `malloc(bytes)` of this allocator and is freed once.
    #[inline]
    pub unsafe fn free(&self, ptr: *mut u8, bytes: usize) {
        let layout = Layout::from_size_align_unchecked(bytes, ALIGN);
        match self.kind {
            Kind::System => System.dealloc(ptr, layout),
            Kind::Jemalloc => JEMALLOC.dealloc(ptr, layout),
            Kind::Mimalloc => MIMALLOC.dealloc(ptr, layout),
            Kind::Null => NULL.dealloc(ptr, layout),
        }
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
                unsafe { libmimalloc_sys::mi_collect(true) };
                Some("mi_collect(true)")
            }
            "jemalloc" => {
                // arena.<MALLCTL_ARENAS_ALL = 4096>.purge takes no value: newp NULL, newlen 0.
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
    unsafe {
        let [a, b, c, d, e, f, g, h] = &mut v;
        libmimalloc_sys::mi_process_info(a, b, c, d, e, f, g, h);
    }
    let names = ["elapsed_msecs", "user_msecs", "system_msecs", "current_rss", "peak_rss", "current_commit", "peak_commit", "page_faults"];
    names.iter().zip(v).map(|(n, x)| (format!("mimalloc.{n}"), x as u64)).collect()
}
