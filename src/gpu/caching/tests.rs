//! Test vectors worked out by hand from PyTorch's rules (`c10/cuda/CUDACachingAllocator.cpp`:
//! `round_size`, `get_free_block`, `should_split`, `free_block`; conf parsing in
//! `c10/core/AllocatorConfig.cpp`), and rule-level checks.

use super::*;
use crate::gpu::device::SimDevice;
use crate::units::{GIB, MIB};

fn alloc(cfg: &str, capacity: u64) -> CachingAllocator<SimDevice> {
    CachingAllocator::new(AllocatorConfig::parse(cfg).unwrap(), SimDevice::new(capacity))
}

fn default_alloc() -> CachingAllocator<SimDevice> {
    alloc("", 80 * GIB)
}

/// (allocated, reserved, segments, device allocs, inactive_split, inactive_split_bytes)
fn state(a: &CachingAllocator<SimDevice>) -> (i64, i64, i64, i64, i64, i64) {
    let s = a.stats();
    a.check_invariants().unwrap();
    (
        s.all().allocated_bytes.current,
        s.all().reserved_bytes.current,
        s.all().segment.current,
        s.num_device_alloc,
        s.all().inactive_split.current,
        s.all().inactive_split_bytes.current,
    )
}

#[test]
fn round_size_rules() {
    let d = AllocatorConfig::default();
    assert_eq!(round_size(&d, 1), 512);
    assert_eq!(round_size(&d, 1000), 1024);
    assert_eq!(round_size(&d, 1200), 1536);
    assert_eq!(round_size(&d, 1_048_577), 1_049_088);
    let four = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
    // TV-G
    assert_eq!(round_size(&four, 1200), 1536);
    assert_eq!(round_size(&four, 4500), 5120);
    assert_eq!(round_size(&four, 1_100_000), 1_310_720);
    assert_eq!(round_size(&four, 5_000_000), 5_242_880);
    let two = AllocatorConfig::parse("roundup_power2_divisions:[>:2]").unwrap();
    assert_eq!(round_size(&two, 514 * MIB), 805_306_368);
    let one = AllocatorConfig::parse("roundup_power2_divisions:[>:1]").unwrap();
    assert_eq!(round_size(&one, 514 * MIB), 538_968_064);
}

#[test]
fn allocation_size_rules() {
    let d = AllocatorConfig::default();
    for (rs, seg) in [(1024, 2 * MIB), (5 * MIB, 20 * MIB), (10_000_384, 20 * MIB), (10 * MIB, 10 * MIB), (11 * MIB, 12 * MIB), (514 * MIB, 514 * MIB)] {
        assert_eq!(allocation_size(&d, rs), seg, "rs {rs}");
    }
    assert_eq!(pool_for(1_048_576), PoolKind::Small);
    assert_eq!(pool_for(1_049_088), PoolKind::Large);
}

#[test]
fn tv_a_small_pool_split_and_merge() {
    let mut a = default_alloc();
    let h_a = a.malloc(1000, 0).unwrap();
    assert_eq!(state(&a), (1024, 2 * MIB as i64, 1, 1, 1, 2_096_128));
    let h_b = a.malloc(1000, 0).unwrap();
    assert_eq!(state(&a), (2048, 2 * MIB as i64, 1, 1, 1, 2_095_104));
    assert_eq!(a.stats().all().requested_bytes.current, 2000);
    a.free(h_a).unwrap();
    assert_eq!(state(&a), (1024, 2 * MIB as i64, 1, 1, 2, 2_096_128));
    let h_c = a.malloc(512, 0).unwrap();
    assert_eq!(state(&a), (1536, 2 * MIB as i64, 1, 1, 2, 2_095_616));
    a.free(h_b).unwrap();
    assert_eq!(state(&a), (512, 2 * MIB as i64, 1, 1, 1, 2_096_640));
    a.free(h_c).unwrap();
    assert_eq!(state(&a), (0, 2 * MIB as i64, 1, 1, 0, 0));
    a.empty_cache().unwrap();
    assert_eq!(state(&a), (0, 0, 0, 1, 0, 0));
    let s = a.stats();
    assert_eq!((s.num_device_free, s.num_sync_all_streams), (1, 1));
    assert_eq!(s.all().allocated_bytes.peak, 2048);
    assert_eq!(s.all().reserved_bytes.peak, 2 * MIB as i64);
    assert_eq!(s.pool(PoolKind::Small).allocated_bytes.peak, 2048);
    assert_eq!(s.pool(PoolKind::Large).allocated_bytes.peak, 0);
}

#[test]
fn tv_b_one_to_ten_mib_share_20_mib_segments() {
    let mut a = default_alloc();
    let five = 5 * MIB;
    a.malloc(five, 0).unwrap();
    assert_eq!(state(&a), (5_242_880, 20_971_520, 1, 1, 1, 15_728_640));
    a.malloc(five, 0).unwrap();
    assert_eq!(state(&a).5, 10_485_760);
    a.malloc(five, 0).unwrap();
    assert_eq!(state(&a).5, 5_242_880);
    a.malloc(five, 0).unwrap();
    assert_eq!(state(&a), (20_971_520, 20_971_520, 1, 1, 0, 0));
    a.malloc(five, 0).unwrap();
    assert_eq!(state(&a).1, 41_943_040);
    assert_eq!(state(&a).2, 2);
    assert_eq!(state(&a).3, 2);
    a.malloc(1000, 0).unwrap();
    assert_eq!(state(&a).1, 44_040_192);
    assert_eq!(state(&a).2, 3);
}

#[test]
fn tv_c_pool_boundary() {
    let mut a = default_alloc();
    a.malloc(MIB, 0).unwrap();
    a.malloc(MIB, 0).unwrap();
    assert_eq!(state(&a), (2 * MIB as i64, 2 * MIB as i64, 1, 1, 0, 0));
    a.malloc(MIB, 0).unwrap();
    assert_eq!(state(&a).1, 4_194_304);
    a.malloc(MIB + 1, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.pool(PoolKind::Large).reserved_bytes.current, 20 * MIB as i64);
    assert_eq!(s.pool(PoolKind::Large).inactive_split_bytes.current, 19_922_432);
}

#[test]
fn tv_d_segment_rounding_for_large_requests() {
    // (request, segment, allocated afterwards, inactive_split_bytes)
    for (req, seg, allocated, split) in [
        (11 * MIB, 12_582_912, 12_582_912, 0),
        (11_010_048, 12_582_912, 11_010_048, 1_572_864),
        (10 * MIB, 10_485_760, 10_485_760, 0),
        (10_000_000, 20_971_520, 10_000_384, 10_971_136),
    ] {
        let mut a = default_alloc();
        a.malloc(req, 0).unwrap();
        let (al, rs, _, _, _, isb) = state(&a);
        assert_eq!((al, rs, isb), (allocated, seg, split), "request {req}");
        assert_eq!(a.stats().all().requested_bytes.current, req as i64);
    }
}

#[test]
fn tv_g_power2_divisions_segments() {
    let mut a = alloc("roundup_power2_divisions:[>:2]", 80 * GIB);
    a.malloc(514 * MIB, 0).unwrap();
    assert_eq!(state(&a).1, 805_306_368);
    assert_eq!(a.stats().all().requested_bytes.current, 514 * MIB as i64);
    let mut b = alloc("roundup_power2_divisions:[>:1]", 80 * GIB);
    b.malloc(514 * MIB, 0).unwrap();
    assert_eq!(state(&b).1, 538_968_064);
}

#[test]
fn tv_h_blocks_are_per_stream() {
    let mut a = default_alloc();
    let h = a.malloc(1000, 1).unwrap();
    a.free(h).unwrap();
    a.malloc(1000, 0).unwrap();
    assert_eq!(state(&a).1, 4_194_304);
    assert_eq!(state(&a).3, 2);
}

#[test]
fn tv_j_expandable_segments() {
    let mut a = alloc("expandable_segments:True", 80 * GIB);
    let x = a.malloc(5 * MIB, 0).unwrap();
    // reserved 20 MiB, no cudaMalloc segment, one map, nothing counted as inactive_split.
    assert_eq!(state(&a), (5_242_880, 20_971_520, 0, 1, 0, 0));
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].is_expandable);
    assert_eq!(segs[0].total_size, 20 * MIB);
    assert_eq!(segs[0].blocks.iter().map(|b| (b.size, b.state.as_str())).collect::<Vec<_>>(), vec![(5 * MIB, "active_allocated"), (15 * MIB, "inactive")]);
    let y = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(state(&a).1, 41_943_040);
    assert_eq!(state(&a).3, 2);
    assert_eq!(state(&a).0, 36_700_160);
    let segs = a.segments();
    assert_eq!(segs[0].blocks.iter().map(|b| b.size).collect::<Vec<_>>(), vec![5 * MIB, 30 * MIB, 5 * MIB]);
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a).1, 0);
    assert_eq!(a.stats().num_device_free, 1);
    assert_eq!(a.stats().num_sync_all_streams, 1);
    assert_eq!(a.device().used(), 0);
    // Small pool: a 2 MiB page.
    let mut b = alloc("expandable_segments:True", 80 * GIB);
    b.malloc(1000, 0).unwrap();
    assert_eq!(state(&b).1, 2 * MIB as i64);
}

#[test]
fn non_expandable_comparison_for_tv_j() {
    let mut a = default_alloc();
    a.malloc(5 * MIB, 0).unwrap();
    a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(state(&a).1, 52_428_800);
}

#[test]
fn textbook_1_2_1_gib_then_3_gib() {
    let mut a = default_alloc();
    a.malloc(GIB, 0).unwrap();
    let two = a.malloc(2 * GIB, 0).unwrap();
    a.malloc(GIB, 0).unwrap();
    a.free(two).unwrap();
    a.malloc(3 * GIB, 0).unwrap();
    assert_eq!(state(&a).1, 7 * GIB as i64);
    assert_eq!(state(&a).0, 5 * GIB as i64);
    assert_eq!(a.stats().num_alloc_retries, 0);
    // On a 6 GiB device the cached 2 GiB segment is released and the malloc retried.
    let mut b = alloc("", 6 * GIB);
    b.malloc(GIB, 0).unwrap();
    let two = b.malloc(2 * GIB, 0).unwrap();
    b.malloc(GIB, 0).unwrap();
    b.free(two).unwrap();
    b.malloc(3 * GIB, 0).unwrap();
    assert_eq!(state(&b).1, 5 * GIB as i64);
    assert_eq!(b.stats().num_alloc_retries, 1);
    assert_eq!(b.stats().num_ooms, 0);
}

#[test]
fn oom_reports_fragmentation_or_capacity() {
    // 4 x 1 GiB live on a 5 GiB card, every other one freed: 2 GiB cached free but in 1 GiB
    // segments that can be released, so a 2 GiB request succeeds after the flush.
    let mut a = alloc("", 5 * GIB);
    let hs: Vec<_> = (0..4).map(|_| a.malloc(GIB, 0).unwrap()).collect();
    a.free(hs[0]).unwrap();
    a.free(hs[2]).unwrap();
    assert!(a.malloc(2 * GIB, 0).is_ok());
    // Pinned free space: a 20 MiB segment split by live 5 MiB blocks cannot serve 8 MiB when the
    // device is full: that is fragmentation.
    let mut b = alloc("", 20 * MIB);
    let xs: Vec<_> = (0..4).map(|_| b.malloc(5 * MIB, 0).unwrap()).collect();
    b.free(xs[0]).unwrap();
    b.free(xs[2]).unwrap();
    match b.malloc(8 * MIB, 0) {
        Err(AllocError::OutOfMemory(info)) => {
            assert_eq!(info.cause(), crate::results::OomCause::Fragmentation);
            assert_eq!(info.cached_free, 10 * MIB);
            assert_eq!(info.largest_free_block, 5 * MIB);
        }
        other => panic!("expected an OOM, got {other:?}"),
    }
    assert_eq!(b.stats().num_ooms, 1);
    assert_eq!(b.stats().num_alloc_retries, 1);
    // The largest free block is the searched pool's: a small request cannot use the 10 MiB free in
    // a large segment pinned by a live block.
    let mut c = alloc("", 21 * MIB);
    let (first, _second) = (c.malloc(5 * MIB, 0).unwrap(), c.malloc(5 * MIB, 0).unwrap());
    c.free(first).unwrap();
    match c.malloc(4096, 0) {
        Err(AllocError::OutOfMemory(info)) => assert_eq!((info.largest_free_block, info.cached_free), (0, 15 * MIB)),
        other => panic!("expected an OOM, got {other:?}"),
    }
    // Real exhaustion.
    let mut c = alloc("", GIB);
    match c.malloc(2 * GIB, 0) {
        Err(AllocError::OutOfMemory(info)) => assert_eq!(info.cause(), crate::results::OomCause::Capacity),
        other => panic!("expected an OOM, got {other:?}"),
    }
    // A 5 MiB request on an empty 15 MiB device: it fits, but a large-pool request needs a
    // kLargeBuffer (20 MiB) segment (CUDACachingAllocator.cpp get_allocation_size): segment size,
    // with nothing pinned.
    let mut d = alloc("", 15 * MIB);
    match d.malloc(5 * MIB, 0) {
        Err(AllocError::OutOfMemory(info)) => {
            assert_eq!(info.cause(), crate::results::OomCause::SegmentSize);
            assert_eq!((info.alloc_size, info.cached_free, info.device_free), (20 * MIB, 0, 15 * MIB));
        }
        other => panic!("expected an OOM, got {other:?}"),
    }
    // per_process_memory_fraction:0.5 of 1 GiB allows 512 MiB: a 600 MiB request fails while the
    // device has room (allowed = fraction x total, AllocatorConfig / setMemoryFraction).
    let mut e = alloc("per_process_memory_fraction:0.5", GIB);
    match e.malloc(600 * MIB, 0) {
        Err(AllocError::OutOfMemory(info)) => {
            assert_eq!(info.cause(), crate::results::OomCause::FractionLimit);
            assert_eq!(info.device_free_uncapped, GIB);
        }
        other => panic!("expected an OOM, got {other:?}"),
    }
}

#[test]
fn max_split_size_makes_oversize_blocks() {
    let mut a = alloc("max_split_size_mb:100", 80 * GIB);
    let big = a.malloc(200 * MIB, 0).unwrap();
    a.free(big).unwrap();
    // A small request must not take the oversize block (rule 4a): a new 20 MiB segment.
    a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(state(&a).2, 2);
    // An oversize request reuses it only if it wastes < 20 MiB (rule 4b).
    a.malloc(150 * MIB, 0).unwrap();
    assert_eq!(state(&a).2, 3);
    let s = a.stats();
    assert_eq!(s.oversize_segments.current, 2);
    assert_eq!(s.oversize_allocations.current, 1);
    assert_eq!(s.max_split_size, 100 * MIB as i64);
    let mut b = alloc("max_split_size_mb:100", 80 * GIB);
    let big = b.malloc(200 * MIB, 0).unwrap();
    b.free(big).unwrap();
    b.malloc(190 * MIB, 0).unwrap();
    assert_eq!(state(&b).2, 1, "190 MiB reuses the 200 MiB block (10 MiB < 20 MiB waste)");
    // Oversize blocks are never split.
    assert_eq!(state(&b).0, 200 * MIB as i64);
}

#[test]
fn release_available_cached_blocks_frees_oversize_first() {
    // 3 cached oversize segments of 100 MiB on a 350 MiB device; a 200 MiB request frees two
    // of them (largest first) without a full flush: no retry counted.
    let mut a = alloc("max_split_size_mb:50", 350 * MIB);
    let hs: Vec<_> = (0..3).map(|_| a.malloc(100 * MIB, 0).unwrap()).collect();
    for h in hs {
        a.free(h).unwrap();
    }
    a.malloc(200 * MIB, 0).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 0);
    assert_eq!(a.stats().num_device_free, 2);
    assert_eq!(state(&a).1, 300 * MIB as i64);
}

#[test]
fn garbage_collection_needs_a_fraction_and_frees_old_segments() {
    let run = |conf: &str| {
        let mut a = alloc(conf, GIB);
        let hs: Vec<_> = (0..6).map(|_| a.malloc(100 * MIB, 0).unwrap()).collect();
        for h in hs {
            a.free(h).unwrap();
        }
        // A different size misses the cache and triggers GC when reserved > threshold × allowed.
        a.malloc(300 * MIB, 0).unwrap();
        a.check_invariants().unwrap();
        (a.stats().all().reserved_bytes.current, a.stats().num_device_free)
    };
    let (reserved_off, frees_off) = run("garbage_collection_threshold:0.5");
    assert_eq!((reserved_off, frees_off), (900 * MIB as i64, 0));
    let (reserved_on, frees_on) = run("garbage_collection_threshold:0.5,per_process_memory_fraction:0.99");
    assert!(frees_on > 0, "GC freed nothing");
    assert!(reserved_on < reserved_off);
    // DeviceCachingAllocator::setMemoryFraction (c10/cuda/CUDACachingAllocator.cpp) leaves
    // allowed_memory_maximum empty at 1.0, and malloc collects only when it has a value.
    assert_eq!(run("garbage_collection_threshold:0.5,per_process_memory_fraction:1.0"), (reserved_off, frees_off));
}

#[test]
fn max_non_split_rounding_follows_large_segment_size() {
    // AcceleratorAllocatorConfig::parseArgs (c10/core/AllocatorConfig.cpp) sets
    // max_non_split_rounding_size_ = large_segment_size_ before the other keys; get_free_block
    // then lets an oversize request take a cached block wasting less than that.
    let run = |conf: &str| {
        let mut a = alloc(conf, 80 * GIB);
        let h = a.malloc(130 * MIB, 0).unwrap();
        a.free(h).unwrap();
        a.malloc(100 * MIB, 0).unwrap();
        a.stats().num_device_alloc
    };
    // 30 MiB of waste: too much under the 20 MiB default, fine under 64 MiB.
    assert_eq!(run("max_split_size_mb:64"), 2);
    assert_eq!(run("large_segment_size_mb:64,max_split_size_mb:64"), 1);
}

#[test]
fn memory_fraction_caps_reserved() {
    let mut a = alloc("per_process_memory_fraction:0.5", GIB);
    assert!(a.malloc(400 * MIB, 0).is_ok());
    match a.malloc(200 * MIB, 0) {
        Err(AllocError::OutOfMemory(info)) => assert_eq!(info.device_free, 112 * MIB),
        other => panic!("expected the cap to refuse, got {other:?}"),
    }
}

#[test]
fn expandable_unmaps_partial_pages_only() {
    let mut a = alloc("expandable_segments:True", 80 * GIB);
    let x = a.malloc(30 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    // Pages 0..1 (30 MiB at offset 0 spans page 0 fully and half of page 1) : page 0 is unmapped,
    // the partial page 1 stays with y.
    assert_eq!(a.stats().all().reserved_bytes.current, 20 * MIB as i64);
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().all().reserved_bytes.current, 0);
    assert_eq!(a.device().used(), 0);
}

#[test]
fn empty_cache_never_frees_split_segments() {
    let mut a = default_alloc();
    let x = a.malloc(5 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a).1, 20 * MIB as i64);
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a).1, 0);
}

#[test]
fn any_number_of_streams() {
    // BlockComparatorSize (c10/cuda/CUDACachingAllocator.cpp) keys the free sets by the stream
    // itself; nothing limits how many there are (this used to stop at 8192).
    let mut a = default_alloc();
    let n = 10_000u64;
    let hs: Vec<_> = (1..=n).map(|s| a.malloc(512, s * 16).unwrap()).collect();
    assert_eq!(a.stats().all().segment.current, n as i64);
    for h in hs {
        a.free(h).unwrap();
    }
    a.check_invariants().unwrap();
    // Each stream's cached block serves only that stream.
    a.malloc(512, n * 16).unwrap();
    a.malloc(512, (n + 1) * 16).unwrap();
    assert_eq!(a.stats().all().segment.current, n as i64 + 1);
    a.check_invariants().unwrap();
}

#[test]
fn zero_bytes_is_a_null_pointer() {
    // NativeCachingAllocator::allocate (c10/cuda/CUDACachingAllocator.cpp) calls malloc only
    // `if (size != 0)` and its free returns at a null pointer: no pool, no stat, no device call.
    let mut a = default_alloc();
    let before = a.stats().clone();
    let h = a.malloc(0, 7).unwrap();
    assert_eq!(h, NULL_HANDLE);
    assert_eq!(a.stats(), &before);
    a.free(h).unwrap();
    assert_eq!(a.stats(), &before);
    assert!(a.segments().is_empty());
    // Through the replay: the 0-byte id is live (its free is accepted), the allocator sees only
    // the 512-byte request.
    use crate::event::Event;
    let evs = [
        Event::Alloc { id: 1, bytes: 0, stream: 0 },
        Event::Alloc { id: 2, bytes: 512, stream: 0 },
        Event::Free { id: 1 },
        Event::Alloc { id: 1, bytes: 0, stream: 3 },
        Event::Free { id: 2 },
        Event::Free { id: 1 },
    ];
    let out = crate::gpu::replay::replay(&mut a, evs.iter().copied().map(Ok), &Default::default()).unwrap();
    assert_eq!((out.allocs, out.frees, out.ooms), (3, 3, 0));
    let s = a.stats();
    assert_eq!((s.all().allocation.allocated, s.all().allocation.freed(), s.num_device_alloc), (1, 1, 1));
    assert_eq!(s.all().requested_bytes.allocated, 512);
    // A 0-byte id is live until freed: allocating it again is still an error.
    let again = [Event::Alloc { id: 5, bytes: 0, stream: 0 }, Event::Alloc { id: 5, bytes: 512, stream: 0 }];
    let err = crate::gpu::replay::replay(&mut default_alloc(), again.iter().copied().map(Ok), &Default::default()).unwrap_err();
    assert!(err.to_string().contains("alloc of id 5, which is still live"), "{err}");
}

#[test]
fn requests_under_one_eib_are_ooms() {
    // NativeCachingAllocator::allocate (c10/cuda/CUDACachingAllocator.cpp) refuses only
    // `size >= one_exa_bytes`; a smaller request no device holds reaches malloc and is an OOM.
    for conf in [
        "",
        "expandable_segments:True",
        "per_process_memory_fraction:0.5",
        "max_split_size_mb:64",
        "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9",
    ] {
        let mut a = alloc(conf, 80 * GIB);
        let keep = a.malloc(3 * MIB, 0).unwrap();
        for bytes in [crate::units::EIB - 1, 2 * crate::units::PIB, (1 << 51) + 1] {
            match a.malloc(bytes, 0) {
                Err(AllocError::OutOfMemory(info)) => {
                    assert_eq!(info.requested, bytes, "{conf}");
                    assert_eq!(info.cause(), crate::results::OomCause::Capacity, "{conf}");
                }
                other => panic!("{conf}: {bytes} bytes should be an OOM, got {other:?}"),
            }
        }
        a.check_invariants().unwrap();
        a.free(keep).unwrap();
        assert_eq!(a.stats().num_ooms, 3);
    }
}

#[test]
fn a_trace_asking_for_more_than_any_device_replays_to_an_oom() {
    // The CSV reader accepts everything under 1 EiB; the replay turns it into an OOM result.
    let text = format!("op,id,bytes,stream\nalloc,1,512,0\nalloc,2,{},0\nfree,2,,\nfree,1,,\n", crate::units::EIB - 1);
    let events = crate::trace::csv::TraceReader::new(text.as_bytes(), "t.csv");
    let out = crate::gpu::replay::replay(&mut default_alloc(), events, &Default::default()).unwrap();
    assert_eq!(out.ooms, 1);
    assert_eq!(out.oom.as_ref().map(|o| o.requested), Some(crate::units::EIB - 1));
}

/// recordStream / insert_events / process_events: a block another stream used is not reusable
/// after its free until that stream's event completes (a sync), and returns to the pool at the
/// next malloc; while it waits it is active but not allocated ("active_pending_free").
#[test]
fn record_stream_defers_the_free_until_the_stream_syncs() {
    let mut a = default_alloc();
    let h = a.malloc(20 * MIB, 0).unwrap();
    a.record_stream(h, 7);
    a.free(h).unwrap();
    // free: allocated_bytes drops at once, active_bytes only when the event completes.
    assert_eq!(state(&a), (0, 20 * MIB as i64, 1, 1, 0, 0));
    assert_eq!(a.stats().all().active_bytes.current, 20 * MIB as i64);
    assert_eq!(a.segments()[0].blocks[0].state, BlockState::ActivePendingFree);
    // The same request cannot reuse it: a second segment.
    let h2 = a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a), (20 * MIB as i64, 40 * MIB as i64, 2, 2, 0, 0));
    // A sync of another stream changes nothing.
    a.sync(Some(3));
    let h3 = a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a).3, 3);
    // Stream 7 completes; the block lands at the next malloc (process_events), which reuses it.
    a.sync(Some(7));
    assert_eq!(a.stats().all().active_bytes.current, 60 * MIB as i64, "lands only at the next malloc");
    let h4 = a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a), (60 * MIB as i64, 60 * MIB as i64, 3, 3, 0, 0));
    for h in [h2, h3, h4] {
        a.free(h).unwrap();
    }
    assert_eq!(a.stats().all().active_bytes.current, 0);
}

#[test]
fn record_stream_on_the_allocation_stream_is_no_use() {
    let mut a = default_alloc();
    let h = a.malloc(20 * MIB, 5).unwrap();
    a.record_stream(h, 5);
    a.free(h).unwrap();
    assert_eq!(a.stats().all().active_bytes.current, 0);
    a.malloc(20 * MIB, 5).unwrap();
    assert_eq!(state(&a).3, 1, "reused at once");
}

#[test]
fn a_block_used_by_two_streams_waits_for_both_events() {
    let mut a = default_alloc();
    let h = a.malloc(20 * MIB, 0).unwrap();
    a.record_stream(h, 1);
    a.record_stream(h, 2);
    a.record_stream(h, 1); // stream_uses is a set
    a.free(h).unwrap();
    a.sync(Some(1));
    let h2 = a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a).3, 2, "one event still outstanding");
    a.free(h2).unwrap();
    a.sync(Some(2));
    a.malloc(20 * MIB, 0).unwrap();
    a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a).3, 2, "both blocks reused");
    // A device sync completes every stream.
    let mut b = default_alloc();
    let h = b.malloc(20 * MIB, 0).unwrap();
    b.record_stream(h, 1);
    b.record_stream(h, 2);
    b.free(h).unwrap();
    b.sync(None);
    b.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&b).3, 1);
}

/// A pending block is not merged with its free neighbours (try_merge_blocks: event_count > 0);
/// once its event completes, free_block merges it.
#[test]
fn a_pending_block_is_not_merged_until_it_lands() {
    let mut a = default_alloc();
    let x = a.malloc(1000, 0).unwrap();
    let y = a.malloc(1000, 0).unwrap();
    a.record_stream(y, 9);
    a.free(y).unwrap();
    a.free(x).unwrap();
    // x is free and split off; y pending: the segment holds x (1 KiB inactive), y, the rest.
    let seg = &a.segments()[0];
    let states: Vec<BlockState> = seg.blocks.iter().map(|b| b.state).collect();
    assert_eq!(states, [BlockState::Inactive, BlockState::ActivePendingFree, BlockState::Inactive]);
    assert_eq!(state(&a), (0, 2 * MIB as i64, 1, 1, 2, 2 * MIB as i64 - 1024));
    a.sync(Some(9));
    // process_events lands y: the segment is one 2 MiB free block again, split for the request.
    a.malloc(1000, 0).unwrap();
    assert_eq!(state(&a), (1024, 2 * MIB as i64, 1, 1, 1, 2 * MIB as i64 - 1024));
    assert_eq!(a.segments()[0].blocks.len(), 2);
}

/// synchronize_and_free_events: empty_cache and the OOM path wait for every event, so pending
/// blocks are freed (and released) there without a sync in the trace.
#[test]
fn empty_cache_and_the_oom_path_synchronize_pending_frees() {
    let mut a = default_alloc();
    let h = a.malloc(20 * MIB, 0).unwrap();
    a.record_stream(h, 4);
    a.free(h).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a), (0, 0, 0, 1, 0, 0));
    assert_eq!(a.stats().all().active_bytes.current, 0);

    let mut b = alloc("", 40 * MIB);
    let h = b.malloc(30 * MIB, 0).unwrap();
    b.record_stream(h, 4);
    b.free(h).unwrap();
    // 30 MiB pending on a 40 MiB device: a 20 MiB request needs the retry path, which syncs.
    b.malloc(20 * MIB, 0).unwrap();
    let s = b.stats();
    assert_eq!((s.num_alloc_retries, s.num_sync_all_streams, s.num_device_free), (1, 1, 1));
    assert_eq!(state(&b), (20 * MIB as i64, 20 * MIB as i64, 1, 2, 0, 0));
}

/// beginAllocateToPool routes a capture's allocations (its stream's) into the graph's private
/// pool: blocks cached in the allocator's pools are not used, its frees return to the private
/// pool and are reused there, and after the capture its segments stay reserved until the pool
/// is released and the cache emptied (release_cached_blocks over graph_pools_freeable).
#[test]
fn a_capture_allocates_from_its_private_pool() {
    let mut a = default_alloc();
    let eager = a.malloc(4 * MIB, 7).unwrap();
    a.free(eager).unwrap();
    assert_eq!(state(&a), (0, 20 * MIB as i64, 1, 1, 0, 0));
    a.begin_allocate_to_pool(1, Some(7)).unwrap();
    // Another stream is not captured: it allocates from the allocator's pools as usual.
    let other = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!(state(&a).3, 2);
    // The capture stream's request finds nothing in the empty private pool: a new segment.
    let x = a.malloc(4 * MIB, 7).unwrap();
    assert_eq!(state(&a).3, 3);
    a.free(x).unwrap();
    // Freed during the capture, it is cached in the private pool and reused there.
    let y = a.malloc(4 * MIB, 7).unwrap();
    assert_eq!(state(&a), (8 * MIB as i64, 60 * MIB as i64, 3, 3, 2, 32 * MIB as i64));
    a.end_allocate_to_pool(1).unwrap();
    // After the capture the same request on the same stream goes to the allocator's pool again.
    let z = a.malloc(4 * MIB, 7).unwrap();
    assert_eq!(state(&a).3, 3, "the first segment's cached block serves it");
    for h in [other, y, z] {
        a.free(h).unwrap();
    }
    // empty_cache frees the allocator's free segments; the graph still owns its pool.
    a.empty_cache().unwrap();
    assert_eq!(state(&a), (0, 20 * MIB as i64, 1, 3, 0, 0));
    assert_eq!(a.segments().len(), 1);
    a.release_pool(1).unwrap();
    assert_eq!(state(&a).1, 20 * MIB as i64, "released only at the next empty_cache");
    a.empty_cache().unwrap();
    assert_eq!(state(&a), (0, 0, 0, 3, 0, 0));
    assert!(a.private_pools.is_empty(), "a pool with no segment left is erased");
    // A pool whose segments are all gone can be made again under the same id.
    a.begin_allocate_to_pool(1, Some(7)).unwrap();
    a.malloc(512, 7).unwrap();
    assert_eq!(a.stats().pool(PoolKind::Small).segment.current, 1);
}

/// A live tensor allocated during the capture keeps its segment even after the pool is
/// released: only whole free segments of a freeable pool are cudaFree'd, and the pool stays
/// (cudaMalloc_count > 0) until they are.
#[test]
fn a_released_pool_keeps_segments_its_live_tensors_use() {
    let mut a = default_alloc();
    a.begin_allocate_to_pool(3, Some(2)).unwrap();
    let out = a.malloc(30 * MIB, 2).unwrap();
    let tmp = a.malloc(30 * MIB, 2).unwrap();
    a.free(tmp).unwrap();
    a.end_allocate_to_pool(3).unwrap();
    a.release_pool(3).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a), (30 * MIB as i64, 30 * MIB as i64, 1, 2, 0, 0));
    assert_eq!(a.private_pools.len(), 1, "its live segment keeps the pool");
    a.free(out).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a), (0, 0, 0, 2, 0, 0));
    assert!(a.private_pools.is_empty());
}

/// Graphs may share a pool (`torch.cuda.graph(g, pool=handle)`): create_or_incref_pool counts
/// users, and the pool is freeable only when every one has released it.
#[test]
fn a_shared_pool_is_freeable_after_its_last_user_releases_it() {
    let mut a = default_alloc();
    for _ in 0..2 {
        a.begin_allocate_to_pool(9, Some(1)).unwrap();
        let h = a.malloc(50 * MIB, 1).unwrap();
        a.free(h).unwrap();
        a.end_allocate_to_pool(9).unwrap();
    }
    // The second capture reused the first one's cached segment.
    assert_eq!(state(&a), (0, 50 * MIB as i64, 1, 1, 0, 0));
    a.release_pool(9).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a).1, 50 * MIB as i64, "one graph still uses the pool");
    a.release_pool(9).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a).1, 0);
}

/// malloc on a stream being captured: no process_events, and no release_cached_blocks on the
/// way to an OOM (it would sync): a request the cache could make room for is an OOM there. The
/// same request on a stream not captured flushes as usual (is_capture_context), and so does a
/// MemPool's routing, which is no capture.
#[test]
fn a_capture_does_not_flush_the_cache_to_avoid_an_oom() {
    let mut a = alloc("", 100 * MIB);
    let h = a.malloc(60 * MIB, 2).unwrap();
    a.free(h).unwrap();
    a.begin_allocate_to_pool(1, Some(2)).unwrap();
    assert!(matches!(a.malloc(70 * MIB, 2), Err(AllocError::OutOfMemory(_))));
    assert_eq!((a.stats().num_alloc_retries, a.stats().num_device_free), (0, 0));
    let other = a.malloc(70 * MIB, 3).unwrap();
    assert_eq!((a.stats().num_alloc_retries, a.stats().num_device_free), (1, 1));
    a.free(other).unwrap();
    a.end_allocate_to_pool(1).unwrap();
    a.empty_cache().unwrap();
    let h = a.malloc(60 * MIB, 2).unwrap();
    a.free(h).unwrap();
    a.begin_allocate_to_pool(2, None).unwrap();
    a.malloc(70 * MIB, 2).unwrap();
    assert_eq!((a.stats().num_alloc_retries, a.stats().num_device_free), (2, 3));
}

/// free during a capture of a block other streams used: its events are deferred until no
/// capture is underway (needs_events_deferred_until_no_capture); the uses recorded during the
/// capture are dropped then (remove_graph_stream_uses), so only earlier uses are waited for.
#[test]
fn frees_used_by_other_streams_during_a_capture_wait_for_its_end() {
    let mut a = default_alloc();
    let before = a.malloc(20 * MIB, 0).unwrap();
    let during = a.malloc(20 * MIB, 0).unwrap();
    a.record_stream(before, 5);
    a.begin_allocate_to_pool(1, Some(8)).unwrap();
    a.record_stream(before, 6);
    a.record_stream(during, 6);
    a.free(before).unwrap();
    a.free(during).unwrap();
    // Both wait (active, not free) while the capture runs, even at a malloc on a stream that is
    // not captured (its process_events inserts no deferred event during a capture).
    a.sync(Some(9));
    let other = a.malloc(20 * MIB, 3).unwrap();
    assert_eq!(a.stats().all().active_bytes.current, 60 * MIB as i64);
    a.free(other).unwrap();
    assert_eq!(a.segments().iter().filter(|s| s.blocks[0].state == BlockState::ActivePendingFree).count(), 2);
    a.end_allocate_to_pool(1).unwrap();
    // The next malloc inserts the events: `during` had only a graph use and lands at once;
    // `before` waits for stream 5, whose work is queued after the insertion.
    let h = a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a).3, 3, "`during` landed and was reused");
    assert_eq!(a.stats().all().active_bytes.current, 40 * MIB as i64);
    a.sync(Some(5));
    a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a), (40 * MIB as i64, 60 * MIB as i64, 3, 3, 0, 0));
    a.free(h).unwrap();
}

/// A sync after a capture ended and before the next malloc completes the work a deferred free
/// waited for: the events inserted at that malloc find the stream idle, and the block lands there.
#[test]
fn a_sync_before_the_deferred_events_are_inserted_completes_them() {
    let mut a = default_alloc();
    let h = a.malloc(20 * MIB, 0).unwrap();
    a.record_stream(h, 5);
    a.begin_allocate_to_pool(1, Some(8)).unwrap();
    a.free(h).unwrap();
    a.end_allocate_to_pool(1).unwrap();
    a.sync(Some(5));
    a.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&a), (20 * MIB as i64, 20 * MIB as i64, 1, 1, 0, 0), "the freed block was reused");
    // A MemPool's stream-less routing is no capture: frees and syncs work as usual under it.
    let mut b = default_alloc();
    let h = b.malloc(20 * MIB, 0).unwrap();
    b.record_stream(h, 5);
    b.begin_allocate_to_pool(2, None).unwrap();
    b.free(h).unwrap();
    b.sync(Some(5));
    b.end_allocate_to_pool(2).unwrap();
    b.malloc(20 * MIB, 0).unwrap();
    assert_eq!(state(&b).3, 1);
}

/// A MemPool's destructor: releasePool, then emptyCache(its id): the pool's free segments go at
/// once and the pool is erased, while the allocator's own cache is left as it is; a pool still
/// in use is not touched.
#[test]
fn emptying_one_pools_cache_leaves_the_rest() {
    let mut a = default_alloc();
    let eager = a.malloc(30 * MIB, 0).unwrap();
    a.free(eager).unwrap();
    // MemPool(): one use; use_mem_pool: a begin, an allocation, an end and a release.
    a.begin_allocate_to_pool(4, None).unwrap();
    a.end_allocate_to_pool(4).unwrap();
    a.begin_allocate_to_pool(4, None).unwrap();
    let pooled = a.malloc(30 * MIB, 0).unwrap();
    a.end_allocate_to_pool(4).unwrap();
    a.release_pool(4).unwrap();
    a.free(pooled).unwrap();
    a.empty_pool_cache(4).unwrap();
    assert_eq!(state(&a).1, 60 * MIB as i64, "the MemPool still has its own use");
    a.release_pool(4).unwrap();
    a.empty_pool_cache(4).unwrap();
    assert_eq!(state(&a), (0, 30 * MIB as i64, 1, 2, 0, 0));
    assert!(a.private_pools.is_empty());
    assert_eq!(a.stats().num_sync_all_streams, 1);
    a.empty_pool_cache(4).unwrap(); // gone: nothing to do
    assert_eq!(a.stats().num_sync_all_streams, 1);
}

/// The calls PyTorch refuses: a second begin of a pool being allocated to, an end or a release
/// of a pool that is not there, more releases than begins.
#[test]
fn pool_calls_pytorch_refuses_are_errors() {
    let mut a = default_alloc();
    assert!(a.end_allocate_to_pool(1).unwrap_err().contains("not being allocated to"));
    assert!(a.release_pool(1).unwrap_err().contains("no pool_begin made"));
    a.begin_allocate_to_pool(1, None).unwrap();
    assert!(a.begin_allocate_to_pool(1, Some(3)).unwrap_err().contains("already being allocated to"));
    assert!(a.release_pool(1).unwrap_err().contains("being allocated to and would be left with no user"));
    a.end_allocate_to_pool(1).unwrap();
    a.release_pool(1).unwrap();
    assert!(a.release_pool(1).unwrap_err().contains("no user left"));
    // Released but its cached segment not freed yet: the id cannot be begun again.
    let mut b = default_alloc();
    b.begin_allocate_to_pool(2, None).unwrap();
    let h = b.malloc(512, 0).unwrap();
    b.free(h).unwrap();
    b.end_allocate_to_pool(2).unwrap();
    b.release_pool(2).unwrap();
    assert!(b.begin_allocate_to_pool(2, None).unwrap_err().contains("every user has released"));
    assert!(b.begin_allocate_to_pool(3, Some(0)).unwrap_err().contains("no capture runs on the default stream"));
    b.empty_cache().unwrap();
    b.begin_allocate_to_pool(2, None).unwrap();
}

/// Graph pools use expandable segments too (per pool and stream); an unmap counts as one of the
/// pool's cudaFrees, so a released pool is erased once its pages are unmapped.
#[test]
fn expandable_segments_in_a_private_pool() {
    let mut a = alloc("expandable_segments:True", 80 * GIB);
    let eager = a.malloc(30 * MIB, 4).unwrap();
    a.begin_allocate_to_pool(1, Some(4)).unwrap();
    let x = a.malloc(30 * MIB, 4).unwrap();
    // Two reservations on stream 4: the allocator's and the graph pool's.
    let expandable: Vec<_> = a.segments().into_iter().filter(|s| s.is_expandable).collect();
    assert_eq!(expandable.len(), 2);
    a.free(x).unwrap();
    a.end_allocate_to_pool(1).unwrap();
    a.release_pool(1).unwrap();
    a.free(eager).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(state(&a).1, 0);
    assert!(a.private_pools.is_empty());
}

/// A stream joined to a capture allocates in its pool until the capture ends; a join needs a
/// capture underway on the pool.
#[test]
fn a_stream_joined_to_a_capture_allocates_in_its_pool() {
    let mut a = default_alloc();
    assert!(a.join_pool(1, 3).unwrap_err().contains("no capture is allocating to"));
    a.begin_allocate_to_pool(1, Some(2)).unwrap();
    a.join_pool(1, 3).unwrap();
    assert!(a.join_pool(1, 0).unwrap_err().contains("default stream"));
    let joined = a.malloc(512, 3).unwrap();
    a.end_allocate_to_pool(1).unwrap();
    let after = a.malloc(512, 3).unwrap();
    let pools: Vec<Option<u64>> = a.segments().iter().map(|s| s.private_pool).collect();
    assert_eq!(pools.iter().filter(|p| **p == Some(1)).count(), 1, "{pools:?}");
    assert_eq!(pools.len(), 2, "the allocation after the capture is in the allocator's pool");
    a.free(joined).unwrap();
    a.free(after).unwrap();
}

proptest::proptest! {
    /// A map taken into the buffers of an earlier one (longer or shorter, with other block
    /// lists) equals a map taken afresh: ordinary and expandable segments, several streams,
    /// pieces released by empty_cache.
    #[test]
    fn a_map_taken_into_old_buffers_equals_a_fresh_one(
        expandable in proptest::bool::ANY,
        ops in proptest::collection::vec((0u8..8, 1u64..(40 * MIB), 0u64..3), 1..120),
    ) {
        let mut a = alloc(if expandable { "expandable_segments:True" } else { "" }, 80 * GIB);
        let mut live = Vec::new();
        let mut taken = Vec::new();
        for (op, bytes, stream) in ops {
            match op {
                0..=3 => live.push(a.malloc(bytes, stream).unwrap()),
                4..=5 if !live.is_empty() => {
                    let h = live.swap_remove(bytes as usize % live.len());
                    a.free(h).unwrap();
                }
                6 => a.empty_cache().unwrap(),
                _ => {
                    a.segments_into(&mut taken);
                    proptest::prop_assert_eq!(&taken, &a.segments());
                }
            }
        }
        a.segments_into(&mut taken);
        proptest::prop_assert_eq!(&taken, &a.segments());
    }
}

/// A second free of a handle panics in release builds too: it would file the block in a free set
/// twice, and the free sets index unchecked by the slots they answered.
#[test]
#[should_panic(expected = "free of a block that is not allocated")]
fn a_second_free_of_a_handle_panics() {
    let mut a = default_alloc();
    let h = a.malloc(4096, 0).unwrap();
    a.free(h).unwrap();
    let _ = a.free(h);
}

/// From torch 2.12 equal-size free blocks are ordered by their segment's creation number
/// before their address (`Block::registration_counter`): a segment cudaMalloc'd into a freed
/// lower range loses a tie to an older one above it. Before 2.12 the lower one wins. (The
/// oracle gives the same answers on these events: tests/oracle.rs.)
#[test]
fn equal_size_ties_go_to_the_older_segment_from_torch_2_12() {
    use crate::gpu::torch_version::TorchVersion;
    for (torch, blocks_by_address) in [("2.11", [2, 1]), ("2.12", [1, 2]), ("2.15", [1, 2])] {
        let cfg = AllocatorConfig::parse_for("", TorchVersion::parse(torch).unwrap()).unwrap();
        let mut a = CachingAllocator::new(cfg, SimDevice::new(80 << 30));
        let x = a.malloc(100 * MIB, 0).unwrap();
        let y = a.malloc(100 * MIB, 0).unwrap();
        a.free(x).unwrap();
        a.empty_cache().unwrap();
        let w = a.malloc(100 * MIB, 0).unwrap(); // a new segment in x's freed, lower range
        a.free(y).unwrap();
        a.free(w).unwrap();
        a.malloc(50 * MIB, 0).unwrap();
        let mut segs: Vec<_> = a.segments().iter().map(|s| (s.address, s.blocks.len())).collect();
        segs.sort();
        assert_eq!(segs.iter().map(|s| s.1).collect::<Vec<_>>(), blocks_by_address, "torch {torch}: {segs:x?}");
    }
}

/// Blocks stay one cache line each with the tie's field (the hot paths touch one per block).
const _: () = assert!(std::mem::size_of::<super::Block>() == 64);

/// throw_on_cudamalloc_oom (torch 2.12+): with 5 GiB cached on an 8 GiB card, a 6 GiB segment
/// is refused at once (the oracle's vector: no retry, the cache kept, a rejection counted);
/// without it the cache is flushed and the retry succeeds.
#[test]
fn throw_on_cudamalloc_oom_refuses_without_flushing_the_cache() {
    for (conf, refused) in [("", false), ("throw_on_cudamalloc_oom:True", true)] {
        let mut a = alloc(conf, 8 * GIB);
        let h = a.malloc(5 * GIB, 0).unwrap();
        a.free(h).unwrap();
        let r = a.malloc(6 * GIB, 0);
        assert_eq!(r.is_err(), refused, "{conf}");
        let s = a.stats();
        assert_eq!((s.num_oom_rejections, s.num_alloc_retries, s.num_ooms), if refused { (1, 0, 0) } else { (0, 1, 0) }, "{conf}");
        if let Err(AllocError::OutOfMemory(info)) = r {
            assert_eq!(info.cause(), crate::results::OomCause::Rejected);
            assert_eq!(s.all().reserved_bytes.current, 5 * GIB as i64);
        }
    }
}

/// expandable_segments_reserve (torch 2.15): a segment reserves that fraction of the device or
/// GiB, rounded up to pages; a request larger than the reserve finds no segment (an OOM).
#[test]
fn expandable_segments_reserve_sets_the_reservation() {
    let mut a = alloc("expandable_segments:True,expandable_segments_reserve:0.01", 8 * GIB);
    assert!(a.malloc(200 * MIB, 0).is_err());
    let mut a = alloc("expandable_segments:True,expandable_segments_reserve:0.01", 8 * GIB);
    a.malloc(4096, 0).unwrap();
    a.malloc(30 * MIB, 0).unwrap();
    let mut addrs: Vec<u64> = a.segments().iter().map(|s| s.address).collect();
    addrs.sort();
    // 0.01 × 8 GiB = 81.92 MiB, rounded up to 2 MiB pages: 82 MiB.
    assert_eq!(addrs[1] - addrs[0], 82 * MIB);
}

/// pool_use_on_oom (setUseOnOOM): with 3 GiB cached in MemPool 1 and the card full, a 2 GiB
/// request of the default pool takes the pool's block; from torch 2.11 before the cache flush
/// (no retry), on 2.10 after it (one retry). A request routed to another MemPool does not.
#[test]
fn use_on_oom_pools_serve_the_default_pools_when_the_card_is_full() {
    use crate::gpu::torch_version::TorchVersion;
    for (torch, retries) in [("2.10", 1), ("2.15", 0)] {
        let cfg = AllocatorConfig::parse_for("", TorchVersion::parse(torch).unwrap()).unwrap();
        let mut a = CachingAllocator::new(cfg, SimDevice::new(8 * GIB));
        a.begin_allocate_to_pool(1, None).unwrap();
        let h = a.malloc(3 * GIB, 0).unwrap();
        a.free(h).unwrap();
        a.end_allocate_to_pool(1).unwrap();
        a.use_pool_on_oom(1).unwrap();
        a.malloc(5 * GIB, 0).unwrap();
        a.malloc(2 * GIB, 0).unwrap();
        assert_eq!((a.stats().num_alloc_retries, a.stats().num_ooms), (retries, 0), "torch {torch}");
        let pooled = a.segments().into_iter().find(|s| s.private_pool == Some(1)).unwrap();
        assert_eq!(pooled.allocated(), 2 * GIB, "torch {torch}");
        // Routed to MemPool 2, a request finds nothing there and OOMs (pool 1 has 1 GiB left).
        a.begin_allocate_to_pool(2, None).unwrap();
        assert!(a.malloc(GIB / 2, 0).is_err(), "torch {torch}");
    }
}
