//! The oracle: PyTorch's own caching allocator (libc10_cuda of the torch of $ALLOCBENCH_PYTHON,
//! else python3, and of the fuzzed releases, fetched from the package index) on allocbench's
//! fake CUDA runtime, against the simulator. Skipped visibly where no torch (a CUDA build with
//! its headers) can be had or no g++ is here.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use allocbench::gpu::oracle::{self, OracleOptions};

const MIB: u64 = 1 << 20;

/// The torch/lib folder to use, found once (asking Python costs a second), or why there is none.
fn torch_lib() -> &'static Result<PathBuf, String> {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let opts = OracleOptions { capacity: 80 << 30, ..Default::default() };
        let torch = oracle::find_torch(&opts).map_err(|e| e.to_string())?;
        oracle::build(&torch).map_err(|e| e.to_string())?;
        Ok(torch.lib)
    })
}

/// Options for the oracle, or `None` after recording the skip.
fn options(conf: &str, capacity: u64) -> Option<OracleOptions> {
    match torch_lib() {
        Ok(lib) => Some(OracleOptions { libc10: Some(lib.clone()), conf: conf.into(), capacity, ..Default::default() }),
        Err(why) => {
            common::skip(
                "oracle",
                &format!("no oracle here: {why} (set ALLOCBENCH_PYTHON to a Python with a CUDA torch, install g++)"),
                "ALLOCBENCH_REQUIRE_TORCH",
            );
            None
        }
    }
}

fn write_trace(dir: &Path, name: &str, rows: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("op,id,bytes,stream\n{}\n", rows.join("\n"))).unwrap();
    path
}

/// `n` allocations of `bytes` (ids from `first`), then their frees.
fn alloc_free(first: u64, n: u64, bytes: u64) -> Vec<String> {
    let mut rows: Vec<String> = (first..first + n).map(|i| format!("alloc,{i},{bytes},0")).collect();
    rows.extend((first..first + n).map(|i| format!("free,{i},,")));
    rows
}

/// PyTorch's documented example (docs/notes/cuda: expandable segments): 8 × 16 MiB freed, then
/// 4 × 32 MiB reserves 256 MiB (the freed 16 MiB segments cannot serve 32 MiB); the reverse
/// order reserves 128 MiB (the 16 MiB blocks are split from the cached 32 MiB segments). The real
/// allocator says so, and the simulator equals it on every key and segment.
#[test]
fn the_documented_example_reserves_256_then_128_mib() {
    let Some(opts) = options("", 80 << 30) else { return };
    let dir = tempfile::tempdir().unwrap();
    for (name, rows, reserved) in [
        ("small-first.csv", [alloc_free(1, 8, 16 * MIB), alloc_free(100, 4, 32 * MIB)].concat(), 256 * MIB),
        ("large-first.csv", [alloc_free(1, 4, 32 * MIB), alloc_free(100, 8, 16 * MIB)].concat(), 128 * MIB),
    ] {
        let trace = write_trace(dir.path(), name, &rows);
        let c = oracle::compare(&trace, &opts).unwrap();
        assert_eq!(c.oracle.stats["reserved_bytes.all.peak"], reserved as i64, "{name}");
        assert_eq!(c.oracle.stats["num_alloc_retries"], 0, "{name}");
        assert!(c.identical(), "{name}: {:?}", c.mismatches);
        assert_eq!(c.keys_compared, 123);
    }
}

/// With `--address-order driver` the fake runtime places segments as the simulator's driver
/// order does (top-down for those over 2 MiB): the documented example's segment maps are equal,
/// addresses included, and lie at the top of the space.
#[test]
fn the_driver_address_order_places_segments_as_the_simulator_does() {
    let Some(mut opts) = options("", 80 << 30) else { return };
    opts.address_order = allocbench::gpu::device::AddressOrder::Driver;
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "driver.csv", &[alloc_free(1, 8, 16 * MIB), alloc_free(100, 4, 32 * MIB)].concat());
    let c = oracle::compare(&trace, &opts).unwrap();
    assert!(c.identical(), "{:?}", c.mismatches);
    assert_eq!(c.oracle.stats["reserved_bytes.all.peak"], (256 * MIB) as i64);
    assert!(c.oracle.segments.iter().all(|s| s.address > 0xfe00_0000_0000), "{:?}", c.oracle.segments.iter().map(|s| s.address).collect::<Vec<_>>());
}

/// Every shipped captured trace: the real allocator and the simulator agree on every
/// memory_stats() key and on the segment map at the end.
#[test]
fn shipped_captures_agree_on_every_key_and_segment() {
    let Some(opts) = options("", 80 << 30) else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.to_string_lossy().ends_with(".csv.gz")).collect();
    traces.sort();
    assert!(traces.len() >= 8, "{traces:?}");
    for trace in &traces {
        let c = oracle::compare(trace, &opts).unwrap();
        assert!(c.identical(), "{}: {:?}, segments equal: {}", trace.display(), c.mismatches, c.segments_equal);
        assert!(c.oracle.oom.is_none());
    }
}

/// With a conf (a split limit and rounding divisions) and on a small card where the trace runs
/// out: the same keys, the OOM at the same event, and PyTorch's own message.
#[test]
fn a_conf_and_an_oom_agree() {
    let Some(opts) = options("max_split_size_mb:64,roundup_power2_divisions:4", 600 * MIB) else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for i in 0..40u64 {
        rows.push(format!("alloc,{i},{},{}", (i % 7 + 1) * 13 * MIB + i * 4097, i % 2));
        if i % 3 == 2 {
            rows.push(format!("free,{},,", i - 1));
        }
    }
    let trace = write_trace(dir.path(), "oom.csv", &rows);
    let c = oracle::compare(&trace, &opts).unwrap();
    let oom = c.oracle.oom.as_ref().expect("the trace runs out of a 600 MiB card");
    assert!(oom.message.starts_with("CUDA out of memory. Tried to allocate"), "{}", oom.message);
    assert_eq!(c.oracle.stats["num_ooms"], 1);
    assert!(c.identical(), "{:?}", c.mismatches);
}

/// Expandable segments run on the fake driver's VMM calls (and fake NVML): PyTorch's documented
/// example (8 × 16 MiB freed, then 4 × 32 MiB) grows one segment by 20 MiB pages to 140 MiB and
/// serves the 32 MiB requests from it, on both sides.
#[test]
fn expandable_segments_serve_the_documented_example_from_one_segment() {
    let Some(opts) = options("expandable_segments:True", 80 << 30) else { return };
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "expandable.csv", &[alloc_free(1, 8, 16 * MIB), alloc_free(100, 4, 32 * MIB)].concat());
    let c = oracle::compare(&trace, &opts).unwrap();
    assert_eq!(c.oracle.stats["reserved_bytes.all.peak"], 140 * MIB as i64);
    assert_eq!(c.oracle.segments.len(), 1);
    assert!(c.oracle.segments[0].is_expandable);
    assert!(c.identical(), "{:?}", c.mismatches);
}

/// A 3-stream trace with `record_stream`, `sync` and `empty_cache` (a fixed pseudo-random
/// sequence). Where the two sides end apart on it, `first_parting` names an event whose prefix
/// differs while the prefix before it agrees; where they agree, it names none.
#[test]
fn bisect_names_an_event_where_the_two_part() {
    let Some(opts) = options("", 80 << 30) else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut state = 7u64;
    let mut next = |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let (mut rows, mut live, mut id) = (Vec::new(), Vec::new(), 0u64);
    for _ in 0..1500 {
        match next(100) {
            x if x < 50 || live.is_empty() => {
                id += 1;
                let bytes = [1 + next(1 << 20), (1 << 20) + next(63 << 20), 512 + next(3584)][next(3) as usize];
                rows.push(format!("alloc,{id},{bytes},{}", next(3)));
                live.push(id);
            }
            x if x < 85 => rows.push(format!("free,{},,", live.swap_remove(next(live.len() as u64) as usize))),
            x if x < 92 => rows.push(format!("record_stream,{},,{}", live[next(live.len() as u64) as usize], next(3))),
            x if x < 98 => rows.push(if next(10) < 7 { format!("sync,,,{}", next(3)) } else { "sync,,,".into() }),
            _ => rows.push("empty_cache,,,".into()),
        }
    }
    let trace = write_trace(dir.path(), "streams.csv", &rows);
    let whole = oracle::compare(&trace, &opts).unwrap();
    let parting = oracle::first_parting(&trace, &opts, &whole).unwrap();
    assert_eq!(parting.is_some(), !whole.identical());
    if let Some(p) = parting {
        eprintln!("the two part at event {} ({})", p.event, p.what);
        let prefix = |n: u64| write_trace(dir.path(), &format!("p{n}.csv"), &rows[..n as usize]);
        assert!(!oracle::compare(&prefix(p.event + 1), &opts).unwrap().identical(), "{p:?}");
        assert!(oracle::compare(&prefix(p.event), &opts).unwrap().identical(), "{p:?}");
    }
}

/// The verified releases the differential fuzz runs against: the oldest, the last before and the
/// first of each versioned rule's change (2.10, 2.12, 2.13), and the newest.
const FUZZED_RELEASES: &[&str] = &["2.9.0", "2.11.0", "2.12.0", "2.15.0"];

/// Options for the oracle of torch `release` (its c10 libraries fetched once from the package
/// index and cached), or `None` after recording the skip.
fn release_options(release: &str) -> Option<OracleOptions> {
    let opts = OracleOptions { torch_version: Some(release.into()), capacity: 80 << 30, ..Default::default() };
    match oracle::find_torch(&opts).and_then(|t| oracle::build(&t).map(|_| t)) {
        Ok(torch) => Some(OracleOptions { libc10: Some(torch.lib), torch_version: None, ..opts }),
        Err(why) => {
            common::skip(
                "oracle-releases",
                &format!("torch {release}'s c10 libraries are not here and could not be fetched: {why} (needs the package index and g++)"),
                "ALLOCBENCH_REQUIRE_TORCH",
            );
            None
        }
    }
}

/// The differential fuzz: 2,000 random traces per release (streams, record_stream and syncs,
/// graph captures and MemPools, empty_cache, expandable segments, every knob the release has,
/// 1-8 GiB cards that run out) agree with PyTorch's own allocator on every key and segment, OOMs
/// included.
#[test]
fn the_differential_fuzz_agrees_with_every_fuzzed_release() {
    for release in FUZZED_RELEASES {
        let Some(opts) = release_options(release) else { return };
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let r = oracle::fuzz::run(&opts, 0, 2000, workers, None, &|| {}).unwrap();
        assert_eq!(r.cases, 2000);
        assert!(r.ooms > 100 && r.ooms < 2000, "{release}: {} OOMs: the cases should reach the card's end, and not all at once", r.ooms);
        assert!(r.differences.is_empty(), "torch {release}: {} of 2000 cases differ, first: {:?}", r.differences.len(), r.differences.first());
        use allocbench::gpu::torch_version::TorchVersion;
        if TorchVersion::parse(release).unwrap() >= TorchVersion::parse("2.12").unwrap() {
            assert!(r.rejections > 10, "torch {release}: {} cases end at a throw_on_cudamalloc_oom rejection", r.rejections);
        }
    }
}

/// Every shipped trace (the captures under workloads/captured/ and the test fixtures) agrees with
/// each fuzzed release's allocator on every key and segment.
#[test]
fn shipped_traces_agree_with_every_fuzzed_release() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut traces: Vec<PathBuf> = ["workloads/captured", "tests/fixtures"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.to_string_lossy().ends_with(".csv.gz"))
        .collect();
    traces.sort();
    for release in FUZZED_RELEASES {
        let Some(opts) = release_options(release) else { return };
        for trace in &traces {
            let c = oracle::compare(trace, &opts).unwrap();
            assert!(c.identical(), "torch {release}, {}: {:?}, segments equal: {}", trace.display(), c.mismatches, c.segments_equal);
        }
    }
}

/// Two 100 MiB segments, the first freed and given back, a third cudaMalloc'd into its range
/// (newer, lower), both freed, then a 50 MiB request: which of the two equal segments it splits.
fn tie_vector(dir: &Path) -> PathBuf {
    let m = 100 * MIB;
    let rows: Vec<String> = [
        format!("alloc,1,{m},0"),
        format!("alloc,2,{m},0"),
        "free,1,,".into(),
        "empty_cache,,,".into(),
        format!("alloc,3,{m},0"),
        "free,2,,".into(),
        "free,3,,".into(),
        format!("alloc,4,{},0", m / 2),
    ]
    .into();
    write_trace(dir, "tie.csv", &rows)
}

/// The test vector of the free-block order, release by release: two equal cached segments, the
/// newer one at the lower address (cudaMalloc'd into a freed range). 2.11 splits the lower one,
/// 2.12 and later the older one; the simulator, following each release, agrees.
#[test]
fn equal_size_ties_follow_each_releases_rule() {
    let dir = tempfile::tempdir().unwrap();
    let trace = tie_vector(dir.path());
    for (release, split_by_address) in [("2.11.0", [2, 1]), ("2.12.0", [1, 2]), ("2.15.0", [1, 2])] {
        let Some(opts) = release_options(release) else { return };
        let c = oracle::compare(&trace, &opts).unwrap();
        let mut segs: Vec<(u64, usize)> = c.oracle.segments.iter().map(|s| (s.address, s.blocks.len())).collect();
        segs.sort();
        assert_eq!(segs.iter().map(|s| s.1).collect::<Vec<_>>(), split_by_address, "torch {release}");
        assert!(c.identical(), "torch {release}: {:?}", c.mismatches);
    }
}

/// A key an older release does not have is refused as that release refuses it, before any run.
#[test]
fn a_key_an_older_release_lacks_is_refused_in_its_words() {
    let Some(mut opts) = release_options("2.9.0") else { return };
    opts.conf = "large_segment_size_mb:40".into();
    let e = oracle::run(std::iter::empty(), &opts).unwrap_err().to_string();
    assert!(e.contains("Unrecognized CachingAllocator option: large_segment_size_mb"), "{e}");
}

/// `throw_on_cudamalloc_oom:True` (torch 2.12+): with 5 GiB cached on an 8 GiB card, a 6 GiB
/// request is refused before any device call (no cache flush, no retry), where without it the
/// cache is flushed and the retry succeeds; both sides agree, and PyTorch says so in its words.
#[test]
fn throw_on_cudamalloc_oom_refuses_up_front_on_both_sides() {
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "throw.csv", &[format!("alloc,1,{},0", 5 * GIB), "free,1,,".into(), format!("alloc,2,{},0", 6 * GIB)]);
    for (conf, rejections, retries) in [("", 0, 1), ("throw_on_cudamalloc_oom:True", 1, 0)] {
        let Some(mut opts) = release_options("2.12.0") else { return };
        (opts.conf, opts.capacity) = (conf.into(), 8 * GIB);
        let c = oracle::compare(&trace, &opts).unwrap();
        assert_eq!((c.oracle.stats["num_oom_rejections"], c.oracle.stats["num_alloc_retries"]), (rejections, retries), "{conf}");
        assert_eq!(c.oracle.oom.is_some(), rejections == 1, "{conf}");
        if let Some(oom) = &c.oracle.oom {
            assert!(oom.message.starts_with("CUDA out of memory. Allocation was preemptively rejected"), "{}", oom.message);
        }
        assert!(c.identical(), "{conf}: {:?}", c.mismatches);
    }
}

/// `expandable_segments_reserve` (torch 2.15) sizes each expandable segment's address
/// reservation: 0.5 of an 8 GiB card puts the second segment 4 GiB above the first (9 GiB by
/// default), and a request larger than the reserve is an OOM; both sides agree.
#[test]
fn expandable_segments_reserve_sizes_each_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "reserve.csv", &["alloc,1,4096,0".into(), format!("alloc,2,{},0", 30 * MIB)]);
    for (reserve, gap) in [("", 9 << 30), ("0.5", 4 << 30), ("1G", 1 << 30), ("1GB", 9 << 30)] {
        let Some(mut opts) = release_options("2.15.0") else { return };
        let conf =
            if reserve.is_empty() { "expandable_segments:True".to_string() } else { format!("expandable_segments:True,expandable_segments_reserve:{reserve}") };
        (opts.conf, opts.capacity) = (conf.clone(), 8 << 30);
        let c = oracle::compare(&trace, &opts).unwrap();
        let mut addresses: Vec<u64> = c.oracle.segments.iter().map(|s| s.address).collect();
        addresses.sort();
        assert_eq!(addresses[1] - addresses[0], gap, "{conf}");
        assert!(c.identical(), "{conf}: {:?}", c.mismatches);
    }
    let Some(mut opts) = release_options("2.15.0") else { return };
    (opts.conf, opts.capacity) = ("expandable_segments:True,expandable_segments_reserve:0.01".into(), 8 << 30);
    let big = write_trace(dir.path(), "big.csv", &[format!("alloc,1,{},0", 200 * MIB)]);
    let c = oracle::compare(&big, &opts).unwrap();
    assert!(c.oracle.oom.as_ref().is_some_and(|o| o.message.contains("exceeds the expandable-segment reserve")), "{:?}", c.oracle.oom);
    assert!(c.identical(), "{:?}", c.mismatches);
}

/// The first event where the two part is found event by event, not bisected: following 2.15's
/// rules against 2.11's allocator on the tie vector, they part at the 50 MiB request (event 7),
/// which 2.15 places in the older segment and 2.11 in the lower one. The peak (after the second
/// 100 MiB allocation, event 1) and the map there agree.
#[test]
fn the_first_parting_is_found_event_by_event() {
    let dir = tempfile::tempdir().unwrap();
    let trace = tie_vector(dir.path());
    let Some(mut opts) = release_options("2.11.0") else { return };
    let same = oracle::compare(&trace, &opts).unwrap();
    assert!(same.identical() && same.first_parting.is_none());
    assert_eq!(same.oracle.peak_event, Some(1));
    assert_eq!((same.oracle.segments_at_peak.len(), same.sim_segments_at_peak.len()), (2, 2));
    opts.simulate = Some(allocbench::gpu::torch_version::TorchVersion::parse("2.15").unwrap());
    let apart = oracle::compare(&trace, &opts).unwrap();
    assert_eq!(apart.first_parting, Some(7));
    assert!(apart.mismatches.is_empty(), "no memory_stats() key differs: {:?}", apart.mismatches);
    assert_eq!(apart.parting_state.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["address of the allocation"]);
    let p = oracle::first_parting(&trace, &opts, &apart).unwrap().unwrap();
    assert_eq!(p.event, 7);
    assert!(!p.segments_equal);
}

/// pool_use_on_oom: a MemPool marked use_on_oom serves the default pools when the card is full,
/// before the cache flush from 2.11 and after it on 2.10, and never a request routed to another
/// MemPool; both sides agree on each release.
#[test]
fn use_on_oom_pools_agree_on_each_release() {
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let head = [
        "pool_begin,1,,".to_string(),
        format!("alloc,1,{},0", 3 * GIB),
        "free,1,,".into(),
        "pool_end,1,,".into(),
        "pool_use_on_oom,1,,".into(),
        format!("alloc,2,{},0", 5 * GIB),
    ];
    let default = write_trace(dir.path(), "default.csv", &[&head[..], &[format!("alloc,3,{},0", 2 * GIB)]].concat());
    let routed = write_trace(dir.path(), "routed.csv", &[&head[..], &["pool_begin,2,,".into(), format!("alloc,3,{},0", 2 * GIB)]].concat());
    for (release, retries) in [("2.10.0", 1), ("2.11.0", 0), ("2.15.0", 0)] {
        let Some(mut opts) = release_options(release) else { return };
        opts.capacity = 8 * GIB;
        let c = oracle::compare(&default, &opts).unwrap();
        assert!(c.oracle.oom.is_none(), "{release}");
        assert_eq!(c.oracle.stats["num_alloc_retries"], retries, "{release}");
        assert!(c.identical(), "{release}: {:?}", c.mismatches);
        let c = oracle::compare(&routed, &opts).unwrap();
        assert!(c.oracle.oom.is_some(), "{release}");
        assert!(c.identical(), "{release}: {:?}", c.mismatches);
    }
}
