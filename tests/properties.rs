//! Property tests: the trace reader never panics; the caching allocator keeps its invariants on
//! random traces under every configuration family.

use allocbench::event::Event;
use allocbench::gpu::caching::CachingAllocator;
use allocbench::gpu::config::AllocatorConfig;
use allocbench::gpu::device::SimDevice;
use allocbench::gpu::replay::{replay, OnOom, ReplayOptions};
use allocbench::gpu::{AllocError, GpuAllocator};
use allocbench::results::BlockState;
use allocbench::trace::TraceReader;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn trace_reader_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for r in TraceReader::new(&bytes[..], "fuzz.csv") {
            if let Err(e) = r {
                let msg = e.to_string();
                prop_assert!(msg.starts_with("fuzz.csv"), "{}", msg);
                prop_assert!(!msg.contains('\n'));
            }
        }
    }

    #[test]
    fn trace_reader_never_panics_on_mangled_traces(lines in proptest::collection::vec(
        (prop_oneof!["alloc", "free", "step", "empty_cache", "", "x"], "[0-9-]{0,22}", "[0-9a-z-]{0,22}", "[0-9]{0,3}"), 0..40)) {
        let mut text = String::from("op,id,bytes,stream\n");
        for (op, id, bytes, stream) in lines {
            text += &format!("{op},{id},{bytes},{stream}\n");
        }
        // The reader never panics, stops at its first error, and what it accepts is a consistent
        // stream: sizes in range, allocs of ids not live, frees of ids that are.
        let mut live = std::collections::HashSet::new();
        let results: Vec<_> = TraceReader::new(text.as_bytes(), "m.csv").collect();
        let n_lines = text.lines().count();
        prop_assert!(results.len() < n_lines.max(1), "at most one result per data line");
        for (k, r) in results.iter().enumerate() {
            match r {
                Ok(Event::Alloc { id, bytes, .. }) => {
                    // 0 bytes is legal: a null pointer, as NativeCachingAllocator::allocate makes.
                    prop_assert!(*bytes <= allocbench::units::MAX_SANE_BYTES);
                    prop_assert!(live.insert(*id), "alloc of a live id accepted");
                }
                Ok(Event::Free { id }) => prop_assert!(live.remove(id), "free of an id that is not live accepted"),
                Ok(_) => {}
                Err(e) => {
                    prop_assert_eq!(k, results.len() - 1, "nothing after an error");
                    prop_assert!(e.to_string().starts_with("m.csv:"), "the error names the file and line: {}", e);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64, u64),
    Free(usize),
    EmptyCache,
    /// record_stream on the i-th live allocation (mod the count) by stream s.
    RecordStream(usize, u64),
    /// sync of stream s (None: the device).
    Sync(Option<u64>),
    /// beginAllocateToPool(pool, stream), endAllocateToPool(pool), releasePool(pool): calls
    /// PyTorch would refuse are refused (and change nothing).
    PoolBegin(u64, Option<u64>),
    PoolEnd(u64),
    PoolRelease(u64),
    PoolEmptyCache(u64),
    PoolJoin(u64, u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![1u64..4096, 4096u64..(1 << 20), (1u64 << 20)..(12 << 20), (12u64 << 20)..(300 << 20),];
    proptest::collection::vec(
        prop_oneof![
            6 => (size, 0u64..3).prop_map(|(b, s)| Op::Alloc(b, s)),
            5 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::EmptyCache),
            2 => (any::<usize>(), 0u64..4).prop_map(|(i, s)| Op::RecordStream(i, s)),
            1 => proptest::option::of(0u64..4).prop_map(Op::Sync),
            1 => (0u64..3, proptest::option::of(1u64..3)).prop_map(|(p, s)| Op::PoolBegin(p, s)),
            1 => (0u64..3).prop_map(Op::PoolEnd),
            1 => (0u64..3).prop_map(Op::PoolRelease),
            1 => (0u64..3).prop_map(Op::PoolEmptyCache),
            1 => (0u64..3, 1u64..4).prop_map(|(p, s)| Op::PoolJoin(p, s)),
        ],
        1..120,
    )
}

const CONFS: [&str; 6] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:[64:8,256:4,>:2]",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
    "max_split_size_mb:100,expandable_segments:True,max_non_split_rounding_mb:40",
];

fn run(conf: &str, capacity: u64, ops: &[Op]) -> Result<CachingAllocator<SimDevice>, TestCaseError> {
    let mut a = CachingAllocator::new(AllocatorConfig::parse(conf).unwrap(), SimDevice::new(capacity));
    let mut live = Vec::new();
    // What the allocator was told: pools being allocated to, and begins not yet released.
    let mut recording = std::collections::BTreeSet::new();
    let mut uses = std::collections::BTreeMap::<u64, u64>::new();
    for op in ops {
        match *op {
            Op::PoolBegin(p, s) => {
                if a.begin_allocate_to_pool(p, s).is_ok() {
                    prop_assert!(recording.insert(p), "a second begin of pool {} was accepted", p);
                    *uses.entry(p).or_default() += 1;
                }
            }
            Op::PoolEnd(p) => prop_assert_eq!(a.end_allocate_to_pool(p).is_ok(), recording.remove(&p)),
            Op::PoolEmptyCache(p) => a.empty_pool_cache(p).unwrap(),
            // (Refused unless a capture on a stream is allocating to the pool.)
            Op::PoolJoin(p, s) => {
                let _ = a.join_pool(p, s);
            }
            Op::PoolRelease(p) => {
                let held = uses.get(&p).copied().unwrap_or(0);
                let allowed = held > 1 || (held == 1 && !recording.contains(&p));
                prop_assert_eq!(a.release_pool(p).is_ok(), allowed);
                if allowed {
                    uses.insert(p, held - 1);
                }
            }
            Op::Alloc(bytes, stream) => match a.malloc(bytes, stream) {
                Ok(h) => live.push(h),
                Err(AllocError::OutOfMemory(_)) => {}
                Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
            },
            Op::Free(i) if !live.is_empty() => {
                let h = live.swap_remove(i % live.len());
                a.free(h).unwrap();
            }
            Op::Free(_) => {}
            Op::RecordStream(i, s) if !live.is_empty() => a.record_stream(live[i % live.len()], s),
            Op::RecordStream(..) => {}
            Op::Sync(s) => a.sync(s),
            Op::EmptyCache => {
                a.empty_cache().unwrap();
                // After empty_cache no fully free ordinary segment of the allocator's pools
                // remains (none is released while a capture is underway).
                for s in a.segments().iter().filter(|s| !s.is_expandable && s.private_pool.is_none() && recording.is_empty()) {
                    prop_assert!(s.blocks.iter().any(|b| b.state == BlockState::ActiveAllocated), "free segment survived empty_cache");
                }
            }
        }
        a.check_invariants().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        // No two live blocks overlap and every block lies inside its segment (address order).
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for s in a.segments() {
            let mut addr = s.address;
            for b in &s.blocks {
                spans.push((addr, addr + b.size));
                addr += b.size;
            }
            prop_assert_eq!(addr, s.address + s.total_size);
        }
        spans.sort();
        for w in spans.windows(2) {
            prop_assert!(w[0].1 <= w[1].0, "overlap {:?}", w);
        }
    }
    // Ending every capture, releasing every pool, freeing everything then empty_cache returns
    // reserved to 0.
    for p in std::mem::take(&mut recording) {
        a.end_allocate_to_pool(p).unwrap();
    }
    for (p, n) in uses {
        for _ in 0..n {
            a.release_pool(p).unwrap();
        }
    }
    for h in live.drain(..) {
        a.free(h).unwrap();
    }
    a.empty_cache().unwrap();
    prop_assert_eq!(a.stats().all().reserved_bytes.current, 0);
    prop_assert_eq!(a.device().used(), 0);
    Ok(a)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn caching_allocator_invariants(ops in ops(), conf in 0usize..CONFS.len()) {
        let small_capacity = 400u64 << 20;
        let small = run(CONFS[conf], small_capacity, &ops)?;
        let big = run(CONFS[conf], 80 << 30, &ops)?;
        // The device's size matters only once a cudaMalloc fails (cached blocks released, a retry,
        // an OOM), through per_process_memory_fraction's allowed bytes, and through an expandable
        // segment's address range (1.125 × the device's memory: a smaller device may need a
        // second segment, and so more unmaps, without any failure). Both runs agree up to the
        // small device's first failure, so when the big run never reserved more than the small
        // device holds, there was none, and every stat must be the same.
        let fits = big.stats().all().reserved_bytes.peak as u64 <= small_capacity;
        if fits && !CONFS[conf].contains("per_process_memory_fraction") && !CONFS[conf].contains("expandable_segments") {
            prop_assert_eq!(small.stats().to_torch_map(), big.stats().to_torch_map());
        }
        prop_assert_eq!(big.stats().num_ooms, 0, "80 GiB holds every generated trace");
    }

    #[test]
    fn replay_on_oom_continue_never_reshapes_the_stream(ops in ops()) {
        let mut events = Vec::new();
        let mut live: Vec<u64> = Vec::new();
        for (id, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc(bytes, stream) => { events.push(Event::Alloc { id: id as u64, bytes, stream }); live.push(id as u64); }
                Op::Free(i) if !live.is_empty() => { let id = live.swap_remove(i % live.len()); events.push(Event::Free { id }); }
                Op::RecordStream(i, stream) if !live.is_empty() => events.push(Event::RecordStream { id: live[i % live.len()], stream }),
                Op::Sync(stream) => events.push(Event::Sync { stream }),
                _ => events.push(Event::EmptyCache),
            }
        }
        let mut a = CachingAllocator::new(AllocatorConfig::default(), SimDevice::new(200 << 20));
        let opts = ReplayOptions { on_oom: OnOom::Continue, ..Default::default() };
        let out = replay(&mut a, events.iter().copied().map(Ok), &opts).unwrap();
        prop_assert_eq!(out.events, events.len() as u64);
        prop_assert_eq!(out.ooms as i64, a.stats().num_ooms);
    }
}

/// `ops` as a CSV trace a capture could write: only the pool rows a trace may hold (each end
/// after its begin, no more releases than begins), frees and record_streams of live ids.
fn trace_text(ops: &[Op]) -> String {
    let mut text = String::from("op,id,bytes,stream\n");
    let mut live: Vec<usize> = Vec::new();
    // Only the pool rows a trace may hold (each end after its begin, no more releases than begins).
    let mut recording = std::collections::BTreeSet::new();
    let mut captured = std::collections::BTreeSet::new();
    let mut uses = std::collections::BTreeMap::<u64, u64>::new();
    for (id, op) in ops.iter().enumerate() {
        match *op {
            // (A released pool's id is not begun again: real pool ids are never reused.)
            Op::PoolBegin(p, s) if uses.get(&p) != Some(&0) && recording.insert(p) => {
                *uses.entry(p).or_default() += 1;
                if s.is_some() {
                    captured.insert(p);
                }
                text += &format!("pool_begin,{p},,{}\n", s.map_or(String::new(), |s| s.to_string()));
            }
            Op::PoolEnd(p) if recording.remove(&p) => {
                captured.remove(&p);
                text += &format!("pool_end,{p},,\n");
            }
            Op::PoolRelease(p) if uses.get(&p).is_some_and(|&n| n > 1 || (n == 1 && !recording.contains(&p))) => {
                *uses.get_mut(&p).unwrap() -= 1;
                text += &format!("pool_release,{p},,\n");
            }
            Op::PoolEmptyCache(p) => text += &format!("empty_cache,{p},,\n"),
            Op::PoolJoin(p, s) if captured.contains(&p) => text += &format!("pool_join,{p},,{s}\n"),
            Op::PoolJoin(..) => {}
            Op::PoolBegin(..) | Op::PoolEnd(_) | Op::PoolRelease(_) => {}
            Op::Alloc(bytes, stream) => {
                text += &format!("alloc,{id},{bytes},{stream}\n");
                live.push(id);
            }
            Op::Free(i) if !live.is_empty() => {
                let id = live.swap_remove(i % live.len());
                text += &format!("free,{id},,\n");
            }
            Op::RecordStream(i, s) if !live.is_empty() => text += &format!("record_stream,{},,{s}\n", live[i % live.len()]),
            Op::Free(_) | Op::RecordStream(..) => {}
            Op::Sync(Some(s)) => text += &format!("sync,,,{s}\n"),
            Op::Sync(None) => text += "sync,,,\n",
            Op::EmptyCache => text += "empty_cache,,,\n",
        }
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Issue 13.1: the diagnosis breaks the peak down exactly — allocated then, free inside segments
    /// holding live blocks, wholly free cached segments — and the parts add up to peak reserved; at
    /// an OOM the same holds for the state that failed.
    #[test]
    fn diagnosis_breakdown_reconciles(ops in ops(), conf in 0usize..CONFS.len(), small_device in any::<bool>()) {
        let text = trace_text(&ops);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, text).unwrap();
        let source = allocbench::input::Source::open(Some(&path)).unwrap();
        let capacity = if small_device { 300 << 20 } else { 80 << 30 };
        let conf = AllocatorConfig::parse(CONFS[conf]).unwrap();
        let (d, _) = allocbench::diagnose::diagnose(&source, &conf, capacity, allocbench::gpu::card::Outside::NONE).unwrap();
        match &d.oom {
            None => prop_assert_eq!(d.allocated_at_peak + d.pending_free_bytes + d.pinned_free_bytes + d.cached_free_segments_bytes, d.peak_reserved),
            Some(oom) => prop_assert_eq!(oom.allocated + d.pending_free_bytes + d.pinned_free_bytes + d.cached_free_segments_bytes, oom.reserved),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The segment map a replay keeps for its record (the allocator forked every few events and
    /// the calls since made again on the fork before the peak) is the map at exactly the peak
    /// moment, as a replay that takes the map at every move of the peak has it, and so are the
    /// trace ids of its blocks: with streams,
    /// record_stream, syncs, private pools, OOMs skipped (`--on-oom continue`), and a fork at
    /// every event, every few events, or never again after the first.
    #[test]
    fn the_forked_peak_map_is_the_map_at_the_peak(ops in ops(), conf in 0usize..CONFS.len(), small_device in any::<bool>(), fork_every in prop_oneof![Just(1u64), 2u64..9, Just(1 << 20)]) {
        use allocbench::gpu::build::{build, DeviceSpec};
        use allocbench::gpu::replay::{replay_observed, SegmentsAtPeak};
        let text = trace_text(&ops);
        let events: Vec<Event> = TraceReader::new(text.as_bytes(), "t.csv").collect::<anyhow::Result<_>>().unwrap();
        let spec = DeviceSpec::sim(if small_device { 300 << 20 } else { 80 << 30 });
        let conf = AllocatorConfig::parse(CONFS[conf]).unwrap();
        let replayed = |mut observer: SegmentsAtPeak| {
            replay_observed(build(allocbench::results::GpuPolicy::Pytorch, &conf, &spec).unwrap().alloc.as_mut(), events.iter().copied().map(Ok), OnOom::Continue, &mut observer).unwrap();
            observer
        };
        // Without forks, a map with owners is taken at every move of the peak.
        let every_move = replayed(SegmentsAtPeak::default().with_owners());
        let forked = replayed(SegmentsAtPeak::exact_forking_every(fork_every));
        prop_assert_eq!(forked.peak.reserved, every_move.peak.reserved);
        prop_assert_eq!(forked.peak.allocated_at_peak, every_move.peak.allocated_at_peak);
        prop_assert_eq!(&forked.segments, &every_move.segments);
        // The memory view's owners (each live block's trace id) from the fork are those then.
        let forked_owners = replayed(SegmentsAtPeak::exact_forking_every(fork_every).with_owners());
        prop_assert_eq!(&forked_owners.segments, &every_move.segments);
        prop_assert_eq!(&forked_owners.owners, &every_move.owners);
        prop_assert!(every_move.owners.iter().flatten().flatten().count() > 0 || every_move.segments.iter().all(|s| s.blocks.iter().all(|b| !b.is_allocated())));
    }
}
