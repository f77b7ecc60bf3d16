//! The binary's own global allocator, kept apart from the allocators under test (issue 14.4):
//! once [`isolate`] is called (the `cpu` command does, first thing), every Rust allocation of
//! the harness (event generation, hash maps, channels, RSS samples) is served by `talc` from a
//! private mmap'd arena, so it never reaches malloc, which is then only the allocator under test
//! (glibc or whatever LD_PRELOAD put there, called explicitly through `System`). Other commands
//! keep malloc (`System`), and blocks are freed to whichever allocator they came from (by address:
//! the arena is one reserved range).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use talc::base::binning::Binning;
use talc::base::Talc;
use talc::source::Source;

/// Address space reserved for the arena (MAP_NORESERVE: only touched pages cost memory), tried
/// from the largest down (strict overcommit refuses large reservations).
const ARENA_SIZES: [usize; 4] = [64 << 30, 16 << 30, 4 << 30, 1 << 30];

static PRIVATE: AtomicBool = AtomicBool::new(false);
static ARENA_BASE: AtomicUsize = AtomicUsize::new(0);
static ARENA_LEN: AtomicUsize = AtomicUsize::new(0);

/// The arena's memory: one reserved range, claimed whole on the first allocation.
#[derive(Debug)]
struct ReservedRange;

// SAFETY: acquire calls mmap only, never the global allocator.
unsafe impl Source for ReservedRange {
    fn acquire<B: Binning>(talc: &mut Talc<Self, B>, _layout: Layout) -> Result<(), ()> {
        if ARENA_BASE.load(Ordering::Acquire) != 0 {
            return Err(()); // the reserved range is exhausted
        }
        for len in ARENA_SIZES {
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
            };
            if p != libc::MAP_FAILED {
                ARENA_LEN.store(len, Ordering::Release);
                ARENA_BASE.store(p as usize, Ordering::Release);
                // SAFETY: the range is ours, readable and writable, and claimed once.
                return unsafe { talc.claim(p as *mut u8, len) }.map(|_| ()).ok_or(());
            }
        }
        Err(())
    }
}

/// A spinlock that yields to the scheduler while it waits: with more workers than cores a pure
/// spinlock would burn the holder's time slice.
type YieldingLock = spin::mutex::SpinMutex<(), spin::relax::Yield>;

static ARENA: talc::TalcLock<YieldingLock, ReservedRange> = talc::TalcLock::new(ReservedRange);

/// Routes the harness's allocations to the private arena from now on.
pub fn isolate() {
    PRIVATE.store(true, Ordering::SeqCst);
}

/// Whether `p` came from the private arena.
#[inline]
pub fn in_arena(p: *const u8) -> bool {
    let base = ARENA_BASE.load(Ordering::Relaxed);
    base != 0 && (p as usize).wrapping_sub(base) < ARENA_LEN.load(Ordering::Relaxed)
}

/// The global allocator: malloc until [`isolate`], the private arena after.
pub struct HarnessAlloc;

unsafe impl GlobalAlloc for HarnessAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if PRIVATE.load(Ordering::Relaxed) {
            ARENA.alloc(layout)
        } else {
            System.alloc(layout)
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if PRIVATE.load(Ordering::Relaxed) {
            ARENA.alloc_zeroed(layout)
        } else {
            System.alloc_zeroed(layout)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_arena(ptr) {
            ARENA.dealloc(ptr, layout)
        } else {
            System.dealloc(ptr, layout)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let private = PRIVATE.load(Ordering::Relaxed);
        match (in_arena(ptr), private) {
            (true, true) => ARENA.realloc(ptr, layout, new_size),
            (false, false) => System.realloc(ptr, layout, new_size),
            // A block moves to the allocator now in use.
            _ => {
                let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}

#[global_allocator]
static GLOBAL: HarnessAlloc = HarnessAlloc;
