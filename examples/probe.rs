use allocbench::event::Event;
use allocbench::gpu::caching::CachingAllocator;
use allocbench::gpu::config::AllocatorConfig;
use allocbench::gpu::device::{SimDevice, H100_CAPACITY_BYTES};
use allocbench::gpu::replay::{replay, replay_observed, OnOom, ReplayOptions};
use allocbench::gpu::GpuAllocator;
use allocbench::input::Source;
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let events: Vec<Event> = Source::open(Some(std::path::Path::new(&path))).unwrap().events().unwrap().collect::<anyhow::Result<_>>().unwrap();
    let cfg = AllocatorConfig::default();
    let reps = 15;
    for _round in 0..2 {
        let mut best = [f64::MAX; 3];
        for _ in 0..reps {
            let mut a = CachingAllocator::new(cfg.clone(), SimDevice::new(H100_CAPACITY_BYTES));
            let t = Instant::now();
            replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap();
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            let mut a = CachingAllocator::new(cfg.clone(), SimDevice::new(H100_CAPACITY_BYTES));
            let t = Instant::now();
            replay_observed(&mut a, events.iter().copied().map(Ok), OnOom::Stop, &mut ()).unwrap();
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            let mut a = CachingAllocator::new(cfg.clone(), SimDevice::new(H100_CAPACITY_BYTES));
            let mut h: Vec<u32> = vec![0; 600_000];
            let t = Instant::now();
            for e in &events {
                match *e {
                    Event::Alloc { id, bytes, stream } => h[id as usize] = a.malloc(bytes, stream).unwrap(),
                    Event::Free { id } => a.free(h[id as usize]).unwrap(),
                    _ => {}
                }
            }
            best[2] = best[2].min(t.elapsed().as_secs_f64());
            std::hint::black_box(&a);
        }
        let n = events.len() as f64;
        println!("full {:.1} ms ({:.1} M/s) | no-obs {:.1} ms | direct {:.1} ms", best[0] * 1e3, n / best[0] / 1e6, best[1] * 1e3, best[2] * 1e3);
    }
}
