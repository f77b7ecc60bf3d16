//! In-process allocators on fixed size mixes (1 and 2 threads), and the driver's own overhead:
//! the replay loop through a no-op allocator vs through the cheapest real one (target: ≤ 10 %).

use std::alloc::{GlobalAlloc, Layout, System};

use allocbench::cpu::allocators::CpuAllocator;
use allocbench::cpu::driver::{drive, DriverOptions};
use allocbench::cpu::rss::RunProgress;
use allocbench::input::Source;
use allocbench::workload::Workload;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{RngExt, SeedableRng};

/// A fixed op sequence: allocate a size, or free the i-th live block; ~half the live set churns.
fn ops(sizes: &[usize], n: usize) -> Vec<(usize, usize)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    (0..n).map(|_| (sizes[rng.random_range(0..sizes.len())], rng.random_range(0..256))).collect()
}

fn run_mix(alloc: &(dyn GlobalAlloc + Sync), ops: &[(usize, usize)]) {
    let mut live: Vec<(*mut u8, Layout)> = Vec::with_capacity(512);
    for &(size, victim) in ops {
        let layout = Layout::from_size_align(size, 16).unwrap();
        // SAFETY: every size of the mixes is non-zero.
        let p = unsafe { alloc.alloc(layout) };
        assert!(!p.is_null(), "out of memory for {size} bytes");
        // SAFETY: `p` is a fresh block of `size` ≥ 1 bytes: its first byte is ours to write.
        unsafe { p.write_volatile(1) };
        live.push((p, layout));
        if live.len() > 256 {
            let (q, l) = live.swap_remove(victim % live.len());
            // SAFETY: `q` came from `alloc` with layout `l` and leaves `live`, so it is freed once.
            unsafe { alloc.dealloc(q, l) };
        }
    }
    for (q, l) in live {
        // SAFETY: as above: each block still in `live` is freed once, with its layout.
        unsafe { alloc.dealloc(q, l) };
    }
}

static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn size_mixes(c: &mut Criterion) {
    let mixes: [(&str, Vec<usize>); 3] = [
        ("small_16_256B", vec![16, 32, 48, 64, 96, 128, 256]),
        ("python_100B_100KB", vec![100, 1000, 10_000, 100_000]),
        ("tensors_4KB_1MB", vec![4096, 65_536, 262_144, 1 << 20]),
    ];
    let allocators: [(&str, &(dyn GlobalAlloc + Sync)); 3] = [("system", &System), ("jemalloc", &JEMALLOC), ("mimalloc", &MIMALLOC)];
    let mut group = c.benchmark_group("cpu_size_mix");
    for (mix, sizes) in &mixes {
        let seq = ops(sizes, 20_000);
        for threads in [1usize, 2] {
            // malloc + free per op, on every thread.
            group.throughput(Throughput::Elements(2 * seq.len() as u64 * threads as u64));
            for (name, alloc) in allocators {
                group.bench_with_input(BenchmarkId::new(format!("{name}/{threads}t"), mix), &seq, |b, seq| {
                    b.iter(|| {
                        std::thread::scope(|s| {
                            for _ in 1..threads {
                                s.spawn(|| run_mix(alloc, seq));
                            }
                            run_mix(alloc, seq);
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

fn harness_overhead(c: &mut Criterion) {
    let path = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let source = Source::Workload(Box::new(Workload::load(std::path::Path::new(&path)).unwrap()));
    let opts = DriverOptions { threads: 1, cross_thread: false, scale: 1.0, iterations: Some(200), duration: None, touch: false };
    let progress = RunProgress::default();
    let mut group = c.benchmark_group("cpu_harness_overhead");
    group.sample_size(10);
    // 200 iterations x 500 allocs, and as many frees.
    group.throughput(Throughput::Elements(200 * 500 * 2));
    for alloc in [
        CpuAllocator::null_for_overhead_measurement(),
        CpuAllocator::by_name("mimalloc").unwrap(),
        CpuAllocator::by_name("jemalloc").unwrap(),
        CpuAllocator::by_name("system").unwrap(),
    ] {
        // Only the timed replay of compiled ops counts (what the driver reports as replay time);
        // event generation and compilation happen outside it.
        group.bench_function(format!("replay_loop/{}", alloc.name), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| std::time::Duration::from_nanos(drive(&source, alloc, &opts, &progress).unwrap().replay_ns)).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, size_mixes, harness_overhead);
criterion_main!(benches);
