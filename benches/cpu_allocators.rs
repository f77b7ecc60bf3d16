//! In-process allocators on fixed size mixes (1 and 2 threads), and the driver's own overhead:
//! the replay loop through a no-op allocator vs through the cheapest real one (target: ≤ 10 %);
//! and the replay of a recorded trace (target: ≥ 20 M calls/s through the no-op allocator).

use std::alloc::{GlobalAlloc, Layout, System};

use allocbench::cpu::allocators::CpuAllocator;
use allocbench::cpu::driver::{drive, DriverOptions, Tsc};
use allocbench::cpu::recorded::{Call, ProcessInfo, Recorded, RecordedTrace, RecordingInfo};
use allocbench::cpu::replay::{self, compile, ReplayAllocator, ReplayOptions};
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

/// A recorded trace of `calls` calls on `threads` threads (one process): each thread allocates
/// 16 B..4 KiB blocks and frees a random live one of its own, one free in ten a block of the
/// next thread's (a free across threads, which the replay orders).
fn synthetic_recording(threads: u32, calls: usize) -> RecordedTrace {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut live: Vec<Vec<u64>> = vec![Vec::new(); threads as usize];
    let mut out = Vec::with_capacity(calls);
    let mut next_id = 0u64;
    for i in 0..calls {
        let t = (i % threads as usize) as u32;
        let call = if live[t as usize].len() < 64 || rng.random_range(0..2) == 0 {
            live[t as usize].push(next_id);
            next_id += 1;
            Call::Malloc { bytes: 16 << rng.random_range(0..9) }
        } else {
            let from = if rng.random_range(0..10) == 0 { (t as usize + 1) % threads as usize } else { t as usize };
            let from = if live[from].is_empty() { t as usize } else { from };
            let v = &mut live[from];
            let k = rng.random_range(0..v.len());
            Call::Free { id: v.swap_remove(k) }
        };
        out.push(Recorded { thread: t, t_ns: i as u64, call });
    }
    let process = ProcessInfo {
        pid: 1,
        ppid: 0,
        cmdline: vec!["synthetic".into()],
        start_s: 0.0,
        threads,
        calls: calls as u64,
        unmatched_frees: 0,
        unseen_frees: 0,
        peak_live_bytes: 0,
        live_bytes_end: 0,
    };
    let info = RecordingInfo {
        command: vec!["synthetic".into()],
        exit_code: 0,
        incomplete: None,
        wall_s: 0.0,
        rss: Vec::new(),
        peak_rss_bytes: 0,
        recorder: "bench".into(),
        processes: vec![process],
    };
    RecordedTrace { info, calls: vec![out] }
}

/// The replay of a recorded trace: calls per second through the no-op allocator (the replay's own
/// cost; target ≥ 20 M calls/s) and through glibc, 1 and 4 threads.
fn recorded_replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_recorded_replay");
    group.sample_size(10);
    let calls = 1_000_000;
    for threads in [1u32, 4] {
        let compiled = compile(&synthetic_recording(threads, calls), 1).unwrap();
        group.throughput(Throughput::Elements(calls as u64));
        for alloc in [ReplayAllocator::Null, ReplayAllocator::Libc] {
            let opts = ReplayOptions { touch: false, duration: None, pace: false };
            let progress = RunProgress::default();
            // The wall time of the replay threads (compilation is outside it).
            group.bench_function(format!("{alloc:?}/{threads}_threads"), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            std::time::Duration::from_secs_f64(
                                replay::drive_holding(&compiled, alloc, &opts, &progress, &Tsc::calibrated(), |_, _| ()).unwrap().0.wall_s,
                            )
                        })
                        .sum()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, size_mixes, harness_overhead, recorded_replay);
criterion_main!(benches);
