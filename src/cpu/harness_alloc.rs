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

// SAFETY: acquire touches only atomics and mmap(2), never the global allocator (the TalcLock it
// serves) nor that lock: talc reaches it only through the `talc` it was handed.
unsafe impl Source for ReservedRange {
    fn acquire<B: Binning>(talc: &mut Talc<Self, B>, _layout: Layout) -> Result<(), ()> {
        if ARENA_BASE.load(Ordering::Acquire) != 0 {
            return Err(()); // the reserved range is exhausted
        }
        for len in ARENA_SIZES {
            // SAFETY: an anonymous mapping at an address of the kernel's choosing (null hint, no
            // MAP_FIXED): it replaces nothing, and no memory of ours is read or written.
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
            };
            if p != libc::MAP_FAILED {
                ARENA_LEN.store(len, Ordering::Release);
                ARENA_BASE.store(p as usize, Ordering::Release);
                // SAFETY: the range was just mapped readable and writable for `len` bytes, nothing
                // else knows of it, it is never unmapped, and it is claimed once (ARENA_BASE,
                // set above, makes every later acquire fail).
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

// SAFETY: every block comes from `ARENA` or `System`, both sound allocators, with the caller's
// layout, and goes back to the one it came from with that layout: a block is the arena's exactly
// when it lies in the reserved range (`in_arena`; malloc cannot place a block in a mapping of
// ours), and a block that changes allocator in `realloc` is copied, not handed over.
unsafe impl GlobalAlloc for HarnessAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `alloc`'s contract (a non-zero-sized layout) is our caller's, passed on as is.
        unsafe {
            if PRIVATE.load(Ordering::Relaxed) {
                ARENA.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if PRIVATE.load(Ordering::Relaxed) {
                ARENA.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's `ptr` is a live block of this allocator with `layout`; one in the
        // reserved range came from ARENA (only its blocks lie there), any other from System.
        // (`in_arena` reads the range with Relaxed loads: the block's arena was claimed before
        // the block was handed out, which happens before this free.)
        unsafe {
            if in_arena(ptr) {
                ARENA.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let private = PRIVATE.load(Ordering::Relaxed);
        match (in_arena(ptr), private) {
            // SAFETY: `ptr` is a live block of the allocator it is passed back to (see `dealloc`),
            // and the rest of `realloc`'s contract is our caller's, passed on as is.
            (true, true) => unsafe { ARENA.realloc(ptr, layout, new_size) },
            // SAFETY: as above.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            // A block moves to the allocator now in use.
            _ => {
                // SAFETY: realloc's caller guarantees `new_size` > 0 and that it, rounded up to
                // `layout.align()` (a power of two, from a valid Layout), does not overflow isize.
                let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                // SAFETY: `new_layout` has a non-zero size.
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    // SAFETY: `ptr` is live for `layout.size()` bytes and `new` was just allocated
                    // for `new_size`, so both hold the smaller count; two live blocks never overlap.
                    // `ptr` is then freed once, with the layout it was allocated with.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                new
            }
        }
    }
}

#[global_allocator]
static GLOBAL: HarnessAlloc = HarnessAlloc;
