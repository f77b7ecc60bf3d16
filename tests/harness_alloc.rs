//! The harness's own allocations are kept from malloc (issue 14.4). Its own test binary: `isolate`
//! switches the whole process to the private arena.

use allocbench::cpu::harness_alloc::{in_arena, isolate};
/// After `isolate`, a large Rust allocation is not malloc's: glibc's in-use byte counts do not
/// move, and the block lies in the arena. (Tests in this binary may run concurrently and
/// malloc a little through libc itself, hence the margin well under the 32 MiB.)
#[test]
fn isolated_allocations_never_reach_malloc() {
    isolate();
    let in_use = || {
        // SAFETY: mallinfo2 takes nothing and returns a struct by value; glibc locks each arena
        // while it sums it, so tests running alongside may allocate meanwhile.
        let mi = unsafe { libc::mallinfo2() };
        (mi.uordblks + mi.hblkhd) as i64
    };
    let before = in_use();
    let mut v: Vec<u8> = Vec::with_capacity(32 << 20);
    v.resize(32 << 20, 1);
    let after = in_use();
    assert!(in_arena(v.as_ptr()), "the block is the arena's");
    assert!(after - before < 8 << 20, "malloc in-use grew by {} bytes", after - before);
    let mut s = String::from("grows by realloc");
    s.reserve(1 << 20);
    assert!(in_arena(s.as_ptr()));
    drop(v);
}
