//! The differential fuzz: random traces run through the simulator and PyTorch's own allocator
//! (the oracle) side by side, every `memory_stats()` key and the segment map compared.
//!
//! A case is a pure function of its seed and the torch release (whose knobs the conf may use):
//! streams with `record_stream` and syncs, private pools (graph captures on a side stream, with
//! joins, and MemPools on every stream, some marked use_on_oom), `empty_cache`, every knob the release has (roundup
//! lists, `large_segment_size_mb`, a memory fraction with garbage collection), and requests
//! from 512 bytes to a third of a small card, so that retries, OOMs and oversize blocks happen.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::OracleOptions;
use crate::event::{Event, PoolOp};
use crate::gpu::torch_version::TorchVersion;
use crate::units::{GIB, MIB};

/// One random case: its conf, card and events.
#[derive(Debug, Clone)]
pub struct FuzzCase {
    pub seed: u64,
    pub conf: String,
    pub capacity: u64,
    pub events: Vec<Event>,
}

/// A conf of the knobs `torch` has, each drawn on its own, valid as PyTorch parses them.
fn random_conf(rng: &mut ChaCha8Rng, torch: TorchVersion) -> String {
    let has = |key: &str| TorchVersion::conf_key_since(key).is_none_or(|since| torch >= since);
    let mut knobs: Vec<String> = Vec::new();
    // max_split_size_mb and max_non_split_rounding_mb must be at least large_segment_size_mb.
    let mut least_mb = 20u64;
    if has("large_segment_size_mb") && rng.random_bool(0.25) {
        least_mb = rng.random_range(11..=64);
        knobs.push(format!("large_segment_size_mb:{least_mb}"));
    }
    if rng.random_bool(0.35) {
        knobs.push(format!("max_split_size_mb:{}", rng.random_range(least_mb + u64::from(!torch.mb_minimum_is_allowed())..=least_mb * 12)));
    }
    if rng.random_bool(0.2) {
        knobs.push(format!("max_non_split_rounding_mb:{}", rng.random_range(least_mb + u64::from(!torch.mb_minimum_is_allowed())..=least_mb * 8)));
    }
    match rng.random_range(0..6) {
        0 => knobs.push(format!("roundup_power2_divisions:{}", 1u64 << rng.random_range(0..5))),
        1 => {
            let first = 1u64 << rng.random_range(0..6);
            let (a, b) = (1u64 << rng.random_range(0..5), 1u64 << rng.random_range(0..4));
            knobs.push(format!("roundup_power2_divisions:[{first}:{a},{}:{b},>:1]", first * 8));
        }
        _ => {}
    }
    if rng.random_bool(0.25) {
        knobs.push("expandable_segments:True".into());
        if has("expandable_segments_reserve") && rng.random_bool(0.4) {
            // A fraction, GiB, or what torch cannot read or takes as the default.
            let reserve = match rng.random_range(0..4) {
                0 => format!("{:.3}", rng.random_range(0.001..1.3)),
                1 => format!("{}G", rng.random_range(1..12)),
                2 => format!("{:.2}G", rng.random_range(0.01..2.0)),
                _ => ["0", "1GB", "512M", "2"][rng.random_range(0..4)].to_string(),
            };
            knobs.push(format!("expandable_segments_reserve:{reserve}"));
        }
    }
    if has("throw_on_cudamalloc_oom") && rng.random_bool(0.2) {
        knobs.push("throw_on_cudamalloc_oom:True".into());
    }
    if has("per_process_memory_fraction") && rng.random_bool(0.3) {
        knobs.push(format!("per_process_memory_fraction:{:.2}", rng.random_range(0.5..0.99)));
        if rng.random_bool(0.6) {
            knobs.push(format!("garbage_collection_threshold:{:.2}", rng.random_range(0.2..0.9)));
        }
    }
    knobs.join(",")
}

/// A request size: mostly small and mid-sized, sometimes large, now and then a third of the card.
fn random_bytes(rng: &mut ChaCha8Rng, capacity: u64) -> u64 {
    match rng.random_range(0..100) {
        0..40 => rng.random_range(1..=MIB),
        40..70 => rng.random_range(MIB..=10 * MIB),
        70..97 => rng.random_range(10 * MIB..=(capacity / 16).max(11 * MIB)),
        _ => rng.random_range(capacity / 8..=capacity / 3),
    }
}

/// The case of `seed` for `torch`.
pub fn case(seed: u64, torch: TorchVersion) -> FuzzCase {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let conf = random_conf(&mut rng, torch);
    let expandable = conf.contains("expandable_segments:True");
    let capacity = rng.random_range(1..=8) * GIB;
    let n = rng.random_range(100..1500);
    let mut events = Vec::with_capacity(n);
    let mut live: Vec<(u64, u64, u64)> = Vec::new(); // (id, stream, bytes)
    let mut next_id = 1u64;
    let mut next_pool = 1u64;
    // The pool being allocated to (with its capture stream, None for a MemPool), and the
    // pools ended but not released (a release per begin).
    let mut capturing: Option<(u64, Option<u64>)> = None;
    let mut ended: Vec<u64> = Vec::new();
    let mut on_oom_pool: Option<u64> = None;
    let streams = rng.random_range(1..=4u64);
    let mut live_bytes = 0u64;
    let mut used_elsewhere = std::collections::HashSet::new();
    while events.len() < n {
        let roll = rng.random_range(0..100);
        let stream = if rng.random_bool(0.7) { 0 } else { rng.random_range(0..streams) };
        // Past half the card, frees win: runs go on longer before their OOM.
        let roll = if live_bytes > capacity / 2 && roll < 45 && !live.is_empty() { 45 + roll % 35 } else { roll };
        match roll {
            0..45 => {
                // During a capture most allocations are on its stream.
                let stream = match capturing {
                    Some((_, Some(s))) if rng.random_bool(0.7) => s,
                    _ => stream,
                };
                let bytes = random_bytes(&mut rng, capacity);
                events.push(Event::Alloc { id: next_id, bytes, stream });
                live.push((next_id, stream, bytes));
                live_bytes += bytes;
                next_id += 1;
            }
            45..80 if !live.is_empty() => {
                let at = rng.random_range(0..live.len());
                // A block another stream used is not freed during a capture (below).
                if capturing.is_some() && used_elsewhere.contains(&live[at].0) {
                    continue;
                }
                let (id, _, bytes) = live.swap_remove(at);
                live_bytes -= bytes;
                used_elsewhere.remove(&id);
                events.push(Event::Free { id });
            }
            // Uses recorded on stream 1 only: with deferred frees waiting on two streams at once,
            // PyTorch frees them in its hash map's order of streams (cuda_events), which no
            // trace carries. And not during a capture, whose handling of blocks used by other
            // streams (deferred events, graph stream uses) the oracle does not reproduce yet:
            // docs/oracle.md.
            80..85 if streams > 1 && capturing.is_none() => {
                if let Some(&(id, _, _)) = live.iter().filter(|l| l.1 != 1).nth(rng.random_range(0..live.len().max(1))) {
                    events.push(Event::RecordStream { id, stream: 1 });
                    used_elsewhere.insert(id);
                }
            }
            85..90 => events.push(Event::Sync { stream: if rng.random_bool(0.3) { None } else { Some(rng.random_range(0..streams)) } }),
            // Not during a capture: PyTorch 2.13+ frees the default pools then unless the calling
            // stream captures, and a trace does not say which stream called (docs/oracle.md).
            90..92 if capturing.is_none() => events.push(Event::EmptyCache),
            92..93 => events.push(Event::Step { n: events.len() as u64 }),
            // Not with expandable segments: PyTorch counts a private pool's maps and unmaps, which
            // need not pair up, and fails its own assert (cudaMalloc_count > 0) on such traces
            // (docs/oracle.md).
            93..100 if !expandable => match capturing {
                None if !ended.is_empty() && rng.random_bool(0.4) => {
                    let pool = ended.swap_remove(rng.random_range(0..ended.len()));
                    events.push(Event::Pool(PoolOp::Release { pool }));
                    if on_oom_pool == Some(pool) {
                        on_oom_pool = None;
                    }
                    if rng.random_bool(0.5) {
                        events.push(Event::Pool(PoolOp::EmptyCache { pool }));
                    }
                }
                None => {
                    // A graph capture on a side stream, or a MemPool on every stream.
                    let stream = if streams > 1 && rng.random_bool(0.6) { Some(rng.random_range(1..streams)) } else { None };
                    events.push(Event::Pool(PoolOp::Begin { pool: next_pool, stream }));
                    // One pool at a time used on OOM (with two, PyTorch tries them in its hash
                    // container's order), and from 2.11 (2.9 and 2.10 fail an assertion
                    // when a released one is searched): docs/oracle.md.
                    if stream.is_none() && on_oom_pool.is_none() && torch.use_on_oom_before_flush() && rng.random_bool(0.5) {
                        events.push(Event::Pool(PoolOp::UseOnOom { pool: next_pool }));
                        on_oom_pool = Some(next_pool);
                    }
                    capturing = Some((next_pool, stream));
                    next_pool += 1;
                }
                Some((pool, Some(s))) if streams > 2 && rng.random_bool(0.2) => {
                    let other = (s + rng.random_range(1..streams)) % streams;
                    if other != 0 {
                        events.push(Event::Pool(PoolOp::Join { pool, stream: other }));
                    }
                }
                Some((pool, _)) => {
                    events.push(Event::Pool(PoolOp::End { pool }));
                    ended.push(pool);
                    capturing = None;
                }
            },
            _ => {}
        }
    }
    FuzzCase { seed, conf, capacity, events }
}

/// Writes `case` as a trace file (the conf and card in its comments).
pub fn write_case(case: &FuzzCase, path: &Path) -> std::io::Result<()> {
    let comments = [format!("allocbench oracle fuzz case {}: conf '{}', capacity {} bytes", case.seed, case.conf, case.capacity)];
    let mut w = crate::trace::csv::TraceWriter::new(std::io::BufWriter::new(std::fs::File::create(path)?), &comments)?;
    for e in &case.events {
        w.write(e)?;
    }
    w.finish()?.flush()
}

/// A case on which the two sides differ.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FuzzDifference {
    pub seed: u64,
    pub conf: String,
    pub capacity: u64,
    /// The keys that differ at the end (empty: only the segment map does).
    pub keys: Vec<String>,
    /// The case's trace, kept for `fidelity --oracle --bisect`.
    pub trace: Option<PathBuf>,
}

/// The fuzz's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FuzzReport {
    pub torch_version: String,
    pub cases: u64,
    pub events: u64,
    /// Cases that ended at an OOM on both sides (at the same event, or they would differ).
    pub ooms: u64,
    /// Of those, the OOMs that `throw_on_cudamalloc_oom` refused up front.
    pub rejections: u64,
    pub differences: Vec<FuzzDifference>,
}

/// Runs cases `first_seed .. first_seed + cases` through both sides, on `workers` threads;
/// differing cases are written to `keep` (when given). `progress` is called after each case.
pub fn run(opts: &OracleOptions, first_seed: u64, cases: u64, workers: usize, keep: Option<&Path>, progress: &(dyn Fn() + Sync)) -> anyhow::Result<FuzzReport> {
    // Find (and fetch, and build) the torch once; every case names its folder.
    let torch = super::find_torch(opts)?;
    super::build(&torch)?;
    // The release the cases are made for and the simulator follows: decided (and, for one not
    // verified, said) once, not per case.
    let version = opts.simulate.unwrap_or_else(|| super::simulated_version(&torch.version));
    let base = OracleOptions { libc10: Some(torch.lib.clone()), torch_version: None, simulate: Some(version), ..opts.clone() };
    let dir = tempfile::Builder::new().prefix("allocbench-fuzz-").tempdir()?;
    let next = std::sync::atomic::AtomicU64::new(first_seed);
    let end = first_seed + cases;
    let results = std::sync::Mutex::new((0u64, 0u64, Vec::new(), 0u64, 0u64));
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for _ in 0..workers.max(1) {
            handles.push(scope.spawn(|| -> anyhow::Result<()> {
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if seed >= end || crate::interrupt::interrupted() {
                        return Ok(());
                    }
                    let case = case(seed, version);
                    let path = dir.path().join(format!("case-{seed}.csv"));
                    write_case(&case, &path)?;
                    let opts = OracleOptions { conf: case.conf.clone(), capacity: case.capacity, ..base.clone() };
                    let c = super::compare(&path, &opts).map_err(|e| anyhow::anyhow!("fuzz case {seed} (conf '{}'): {e}", case.conf))?;
                    let mut r = results.lock().expect("no worker panics holding it");
                    r.0 += c.oracle.events;
                    r.1 += u64::from(c.oracle.oom.is_some());
                    r.3 += 1;
                    r.4 += u64::from(c.oracle.stats.get("num_oom_rejections").is_some_and(|&n| n > 0));
                    if !c.identical() {
                        let trace = match keep {
                            Some(k) => {
                                std::fs::create_dir_all(k)?;
                                let kept = k.join(format!("oracle-fuzz-{version}-{seed}.csv"));
                                std::fs::copy(&path, &kept)?;
                                Some(kept)
                            }
                            None => None,
                        };
                        let keys = c.mismatches.iter().map(|m| m.key.clone()).collect();
                        r.2.push(FuzzDifference { seed, conf: case.conf.clone(), capacity: case.capacity, keys, trace });
                    }
                    drop(r);
                    let _ = std::fs::remove_file(&path);
                    progress();
                }
            }));
        }
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("a fuzz worker panicked"))??;
        }
        Ok(())
    })?;
    let (events, ooms, mut differences, done, rejections) = results.into_inner().expect("no worker panics holding it");
    differences.sort_by_key(|d: &FuzzDifference| d.seed);
    Ok(FuzzReport { torch_version: torch.version, cases: done, events, ooms, rejections, differences })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_a_function_of_seed_and_version_and_their_confs_parse() {
        for seed in 0..300 {
            for torch in [TorchVersion::OLDEST, TorchVersion::NEWEST] {
                let c = case(seed, torch);
                assert_eq!(c.events, case(seed, torch).events);
                crate::gpu::config::AllocatorConfig::parse_for(&c.conf, torch).unwrap_or_else(|e| panic!("seed {seed}: '{}': {e}", c.conf));
            }
        }
        // The cases reach what the fuzz is for.
        let all: Vec<FuzzCase> = (0..300).map(|s| case(s, TorchVersion::NEWEST)).collect();
        let has = |f: &dyn Fn(&Event) -> bool| all.iter().any(|c| c.events.iter().any(f));
        assert!(has(&|e| matches!(e, Event::RecordStream { .. })));
        assert!(has(&|e| matches!(e, Event::Pool(PoolOp::Join { .. }))));
        assert!(has(&|e| matches!(e, Event::Pool(PoolOp::Begin { stream: None, .. }))));
        assert!(has(&|e| matches!(e, Event::Pool(PoolOp::EmptyCache { .. }))));
        assert!(has(&|e| matches!(e, Event::Pool(PoolOp::UseOnOom { .. }))));
        assert!(all.iter().any(|c| c.conf.contains("large_segment_size_mb")));
        assert!(all.iter().any(|c| c.conf.contains("garbage_collection_threshold")));
    }

    #[test]
    fn cases_read_back_from_their_trace_files() {
        let dir = tempfile::tempdir().unwrap();
        for seed in 0..50 {
            let c = case(seed, TorchVersion::NEWEST);
            let path = dir.path().join("c.csv");
            write_case(&c, &path).unwrap();
            let back: Vec<Event> = crate::input::Source::open(Some(&path)).unwrap().events().unwrap().map(|e| e.unwrap()).collect();
            assert_eq!(back, c.events, "seed {seed}");
        }
    }
}
