//! Replay throughput of the GPU policies on SimDevice (targets, issue 15: ≥ 20 M events/s on one
//! core for the default policy on the captured 1.3B trace; `allocbench replay` of that CSV end to
//! end ≥ 10 M events/s; ≥ 1,000 advise configurations in under a minute on 2 threads). The
//! The block of `docs/benchmarks.md` is written from these results by `scripts/bench_readme.py`.

use allocbench::event::Event;
use allocbench::gpu::baseline::IdealAllocator;
use allocbench::gpu::build::{build, DeviceSpec};
use allocbench::gpu::caching::CachingAllocator;
use allocbench::gpu::config::AllocatorConfig;
use allocbench::gpu::device::{SimDevice, H100_CAPACITY_BYTES};
use allocbench::gpu::replay::{replay, ReplayOptions, StopWhen};
use allocbench::input::Source;
use allocbench::results::{GpuPolicy, Objective, ResultRecord};
use allocbench::workload::Workload;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

fn workload_events(file: &str) -> Vec<Event> {
    let path = format!("{}/workloads/{file}", env!("CARGO_MANIFEST_DIR"));
    Workload::load(std::path::Path::new(&path)).expect("shipped workload").events().collect()
}

/// The captured 1.3B training trace (`workloads/captured/gpt3-xl-1.3b.csv.gz`), decompressed once.
fn captured_csv() -> std::path::PathBuf {
    let gz = format!("{}/workloads/captured/gpt3-xl-1.3b.csv.gz", env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("allocbench-bench-gpt3-xl-1.3b-{}.csv", std::process::id()));
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(std::fs::File::open(gz).unwrap()), &mut text).unwrap();
    std::fs::write(&out, text).unwrap();
    out
}

fn captured_events(csv: &std::path::Path) -> Vec<Event> {
    Source::open(Some(csv)).unwrap().events().unwrap().collect::<anyhow::Result<_>>().unwrap()
}

/// The 1.3B captured trace through the default policy (one core), and `allocbench replay` of its
/// CSV end to end: parse, replay with the standard measurements, write the JSON.
fn captured_replay(c: &mut Criterion) {
    let csv = captured_csv();
    let events = captured_events(&csv);
    let mut group = c.benchmark_group("captured_1.3b");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events.len() as u64));
    let cfg = AllocatorConfig::default();
    group.bench_function("policy/pytorch[default]", |b| {
        b.iter_batched(
            || CachingAllocator::new(cfg.clone(), SimDevice::new(H100_CAPACITY_BYTES)),
            |mut a| replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("policy/ideal", |b| {
        b.iter_batched(
            || IdealAllocator::new(H100_CAPACITY_BYTES),
            |mut a| replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("replay_cli_end_to_end", |b| {
        b.iter(|| {
            let source = Source::open(Some(&csv)).unwrap();
            let mut built = build(GpuPolicy::Pytorch, &cfg, &DeviceSpec::sim(H100_CAPACITY_BYTES)).unwrap();
            // As `replay --json` does (the segment map at exactly the peak included).
            let r = allocbench::gpu_run::run_hashing_alongside(&mut built, &cfg, &source, &ReplayOptions::default(), &mut StopWhen(|| false)).unwrap();
            serde_json::to_vec_pretty(&ResultRecord::GpuReplay(Box::new(r))).unwrap()
        })
    });
    group.finish();
    let _ = std::fs::remove_file(csv);
}

fn policy_replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim_policy_replay");
    group.sample_size(10);
    for file in ["gpt3-xl-1.3b.toml", "serving-llama7b.toml", "model-switch.toml"] {
        let events = workload_events(file);
        group.throughput(Throughput::Elements(events.len() as u64));
        for conf in ["", "expandable_segments:True", "max_split_size_mb:512,roundup_power2_divisions:4"] {
            let cfg = AllocatorConfig::parse(conf).unwrap();
            let label = format!("{file}/pytorch[{}]", if conf.is_empty() { "default" } else { conf });
            group.bench_function(label, |b| {
                b.iter_batched(
                    || CachingAllocator::new(cfg.clone(), SimDevice::new(H100_CAPACITY_BYTES)),
                    |mut a| replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap(),
                    BatchSize::LargeInput,
                )
            });
        }
        group.bench_function(format!("{file}/ideal"), |b| {
            b.iter_batched(
                || IdealAllocator::new(H100_CAPACITY_BYTES),
                |mut a| replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

/// A small pool shredded into 50,000 free 512-byte holes (every other block of 100,000 freed),
/// then three rounds of 50,000 allocations of that size and their frees: one size class holding
/// tens of thousands of free blocks, where a best fit must stay O(log n) as PyTorch's ordered
/// set is, not a scan of the class.
fn shredded_small_pool(c: &mut Criterion) {
    let mut events = Vec::new();
    let n = 100_000u64;
    events.extend((1..=n).map(|id| Event::Alloc { id, bytes: 512, stream: 0 }));
    events.extend((1..=n).step_by(2).map(|id| Event::Free { id }));
    let mut next = n + 1;
    for _ in 0..3 {
        let ids: Vec<u64> = (next..next + n / 2).collect();
        next += n / 2;
        events.extend(ids.iter().map(|&id| Event::Alloc { id, bytes: 512, stream: 0 }));
        events.extend(ids.iter().map(|&id| Event::Free { id }));
    }
    let mut group = c.benchmark_group("sim_policy_replay");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("shredded_small_pool/pytorch[default]", |b| {
        b.iter_batched(
            || CachingAllocator::new(AllocatorConfig::default(), SimDevice::new(H100_CAPACITY_BYTES)),
            |mut a| replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// `allocbench advise`: the whole search space (≥ 1,000 configurations) over the captured 1.3B
/// trace on an 80 GiB card, both cores (target: under a minute on this 2-core machine).
fn advise_search(c: &mut Criterion) {
    let csv = captured_csv();
    let events = captured_events(&csv);
    let info = Source::open(Some(&csv)).unwrap().info().unwrap();
    let _ = std::fs::remove_file(csv);
    let confs = allocbench::advise::search_space();
    assert!(confs.len() >= 1000);
    let mut group = c.benchmark_group("advise");
    group.sample_size(10);
    group.throughput(Throughput::Elements(confs.len() as u64));
    let opts = allocbench::advise::AdviseOptions {
        capacity: 80 << 30,
        threads: 2,
        objective: Objective::Balanced,
        model: allocbench::gpu::devprobe::LatencyModel::h100(),
        addresses: Vec::new(),
        outside: allocbench::gpu::card::Outside::NONE,
        not_whole_run: None,
        step_time_s: None,
        flops: None,
    };
    group.bench_function(format!("captured_1.3b/{}-configs/2-threads", confs.len()), |b| {
        b.iter(|| allocbench::advise::advise(&events, &info, &confs, &opts, None).unwrap())
    });
    group.finish();
}

criterion_group!(benches, captured_replay, policy_replay, shredded_small_pool, advise_search);
criterion_main!(benches);
