//! Replay throughput of the GPU policies on SimDevice (target: ≥ 10 M events/s on one core
//! for the 1.3B transformer workload; the README's "Benchmarks").

use allocbench::event::Event;
use allocbench::gpu::baseline::IdealAllocator;
use allocbench::gpu::caching::CachingAllocator;
use allocbench::gpu::config::AllocatorConfig;
use allocbench::gpu::device::{SimDevice, H100_CAPACITY_BYTES};
use allocbench::gpu::replay::{replay, ReplayOptions};
use allocbench::workload::Workload;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

fn workload_events(file: &str) -> Vec<Event> {
    let path = format!("{}/workloads/{file}", env!("CARGO_MANIFEST_DIR"));
    Workload::load(std::path::Path::new(&path)).expect("shipped workload").events().collect()
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

/// `allocbench advise`: the whole search space (≥ 200 configurations) over the 1.3B workload on
/// both cores (target: under a minute on this 2-core machine).
fn advise_search(c: &mut Criterion) {
    let events = workload_events("gpt3-xl-1.3b.toml");
    let confs = allocbench::advise::search_space();
    assert!(confs.len() >= 200);
    let mut group = c.benchmark_group("advise");
    group.sample_size(10);
    group.throughput(Throughput::Elements(confs.len() as u64));
    group.bench_function(format!("gpt3-xl-1.3b/{}-configs/2-threads", confs.len()), |b| {
        b.iter(|| allocbench::advise::advise(&events, 60 << 30, &confs, 2, None).unwrap())
    });
    group.finish();
}

criterion_group!(benches, policy_replay, advise_search);
criterion_main!(benches);
