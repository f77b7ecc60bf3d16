//! `allocbench devprobe`: device allocation latency by size ([`probe`]), and a latency model that
//! lets the simulated device account realistic device time (`--sim-latency FILE`, applied by the
//! `device::latency::WithLatency` adaptor).

use super::async_pool::AsyncPoolAllocator;
use super::cuda::CudaDevice;
use super::device::{Device, DeviceError};
use super::GpuAllocator;
use crate::error::InputError;
use crate::results::{DevprobeResult, MachineInfo, ResultRecord, SizeLatency, SCHEMA_VERSION};

/// The probed sizes: 512 B … 8 GiB, log-spaced by 4×.
pub fn probe_sizes(capacity: u64) -> Vec<u64> {
    (9..=33).step_by(2).map(|k| 1u64 << k).filter(|&b| b <= capacity / 2).collect()
}

/// p50/p99 of a set of timings.
pub fn summarize(bytes: u64, mut ns: Vec<u64>) -> SizeLatency {
    ns.sort_unstable();
    let at = |q: f64| ns.get(((ns.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    SizeLatency { bytes, samples: ns.len() as u64, p50_ns: at(0.5), p99_ns: at(0.99) }
}

/// Measures device allocation latency by size on a real GPU (`allocbench devprobe`): raw
/// `cuMemAlloc`/`cuMemFree`, then alloc + free from a warm stream-ordered pool.
pub fn probe(device: CudaDevice, reps: usize) -> Result<DevprobeResult, DeviceError> {
    let sizes = probe_sizes(device.capacity());
    let (mut malloc, mut free) = (Vec::new(), Vec::new());
    for &bytes in &sizes {
        // Big allocations take milliseconds: fewer repetitions for them.
        let n = if bytes >= 1 << 30 { reps.div_ceil(10).max(5) } else { reps };
        let (mut m, mut f) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (alloc_ns, free_ns) = device.time_alloc_free(bytes)?;
            m.push(alloc_ns);
            f.push(free_ns);
        }
        malloc.push(summarize(bytes, m));
        free.push(summarize(bytes, f));
    }
    let capacity = device.capacity();
    let name = device.describe();
    let mut pool = AsyncPoolAllocator::new(device)?;
    let mut async_pool = Vec::new();
    for &bytes in &sizes {
        let n = if bytes >= 1 << 30 { reps.div_ceil(10).max(5) } else { reps };
        // Warm the pool at this size first, then time alloc + free from it.
        let h = pool.malloc(bytes, 0).map_err(|e| DeviceError::Other(format!("{e:?}")))?;
        pool.free(h)?;
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = std::time::Instant::now();
            let h = pool.malloc(bytes, 0).map_err(|e| DeviceError::Other(format!("{e:?}")))?;
            pool.free(h)?;
            t.push(t0.elapsed().as_nanos() as u64);
        }
        async_pool.push(summarize(bytes, t));
    }
    Ok(DevprobeResult {
        schema_version: SCHEMA_VERSION,
        device: name,
        capacity,
        machine: MachineInfo::current(),
        malloc,
        free,
        async_pool_alloc_free: async_pool,
    })
}

/// The allocator-time model (issue 15): device-call latency by size, interpolated in log(size)
/// between probed points, plus what a replay charges besides device calls: a cached-path
/// operation and a device synchronisation. [`LatencyModel::alloc_time_ns`] prices a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyModel {
    /// The probed device (`devprobe`'s `device`), for results.
    pub device: String,
    malloc: Vec<(f64, f64)>,
    free: Vec<(f64, f64)>,
    /// One malloc or free served from the cache: half the warm pool's alloc + free p50 (the
    /// median over the probed sizes), the device's own cached path.
    pub cached_op_ns: u64,
    /// The stall of one device synchronisation (a cudaFree, an unmap, synchronize_and_free_events):
    /// the queued kernels it waits for. Traces carry no kernel times, so this is an assumption
    /// ([`SYNC_STALL_NS`]), not a measurement; `syncs` is reported beside it to reprice.
    pub sync_ns: u64,
}

/// The stall charged per device synchronisation: 100 µs, a few transformer-layer kernels left in
/// the queue. An assumption (traces have no kernel timings); the sync count is reported with it.
pub const SYNC_STALL_NS: u64 = 100_000;

/// The default time table: the devprobe of an H100 80GB HBM3 (`reports/gpu-h100/data/devprobe.json`).
const H100_DEVPROBE_JSON: &str = include_str!("../../reports/gpu-h100/data/devprobe.json");

fn interpolate(points: &[(f64, f64)], bytes: u64) -> f64 {
    let x = (bytes.max(1) as f64).ln();
    match points {
        [] => 0.0,
        [only] => only.1,
        _ => {
            let i = points.partition_point(|p| p.0 < x).clamp(1, points.len() - 1);
            let (a, b) = (points[i - 1], points[i]);
            let t = ((x - a.0) / (b.0 - a.0)).clamp(0.0, 1.0);
            a.1 + t * (b.1 - a.1)
        }
    }
}

impl LatencyModel {
    pub fn from_probe(p: &DevprobeResult) -> Result<Self, String> {
        if p.malloc.is_empty() || p.free.is_empty() {
            return Err("the devprobe results have no malloc/free timings".into());
        }
        // The cached path's price comes from the warm pool: without it every malloc and free
        // of the cache would cost nothing, most of a replay's modelled time on real traces.
        if p.async_pool_alloc_free.is_empty() {
            return Err("the devprobe results have no async_pool_alloc_free timings (the cached path's price)".into());
        }
        for (list, timings) in [("malloc", &p.malloc), ("free", &p.free), ("async_pool_alloc_free", &p.async_pool_alloc_free)] {
            check_timings(list, timings)?;
        }
        // Interpolation needs the points in size order (a hand-merged file may not be).
        let pts = |v: &[SizeLatency]| -> Vec<(f64, f64)> {
            let mut points: Vec<(f64, f64)> = v.iter().map(|s| ((s.bytes as f64).ln(), s.p50_ns as f64)).collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points
        };
        let mut pool: Vec<u64> = p.async_pool_alloc_free.iter().map(|s| s.p50_ns).collect();
        pool.sort_unstable();
        let cached_op_ns = pool.get(pool.len() / 2).map_or(0, |ns| ns / 2);
        Ok(LatencyModel { device: p.device.clone(), malloc: pts(&p.malloc), free: pts(&p.free), cached_op_ns, sync_ns: SYNC_STALL_NS })
    }

    /// The embedded default: an H100's devprobe.
    pub fn h100() -> Self {
        static H100: std::sync::OnceLock<LatencyModel> = std::sync::OnceLock::new();
        H100.get_or_init(|| {
            let rec: ResultRecord = serde_json::from_str(H100_DEVPROBE_JSON).expect("the embedded devprobe parses");
            let ResultRecord::Devprobe(p) = rec else { unreachable!("the embedded file is a devprobe record") };
            Self::from_probe(&p).expect("the embedded devprobe has timings")
        })
        .clone()
    }

    /// Modelled allocator time of a replay so far: `device_calls_ns` (what [`WithLatency`]
    /// charged for cudaMalloc/cudaFree and the expandable-segment calls), plus one stall per
    /// synchronisation and the cached path for every malloc and free.
    ///
    /// [`WithLatency`]: crate::gpu::device::latency::WithLatency
    pub fn alloc_time_ns(&self, device_calls_ns: u64, stats: &crate::gpu::stats::DeviceStats) -> u64 {
        let ops = (stats.all().allocation.allocated + stats.all().allocation.freed()) as u64;
        device_calls_ns + syncs(stats) * self.sync_ns + ops * self.cached_op_ns
    }

    /// Reads `--sim-latency FILE` (a devprobe results file).
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        // A devprobe record is a few KiB.
        let recs = crate::results::read_results_at_most(path, 64 << 20)?;
        let probe = recs.iter().find_map(|r| if let ResultRecord::Devprobe(p) = r { Some(p.as_ref()) } else { None }).ok_or_else(|| {
            InputError::new(path.display().to_string(), "no devprobe record in this file (write one with `allocbench devprobe --json FILE` on a GPU)")
        })?;
        Ok(Self::from_probe(probe).map_err(|m| InputError::new(path.display().to_string(), m))?)
    }

    pub fn malloc_ns(&self, bytes: u64) -> u64 {
        interpolate(&self.malloc, bytes) as u64
    }

    pub fn free_ns(&self, bytes: u64) -> u64 {
        interpolate(&self.free, bytes) as u64
    }
}

/// The slowest device call a devprobe file may claim: 10 s (a cudaMalloc takes microseconds to
/// milliseconds); beyond it a time is a corrupt file, and sums of it over a replay would overflow.
const MAX_CALL_NS: u64 = 10_000_000_000;

/// One list of a devprobe's timings: sizes above 0, each once, and plausible times.
fn check_timings(list: &str, timings: &[SizeLatency]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    if timings.iter().all(|t| t.p50_ns == 0) {
        return Err(format!("{list} timings: every p50 is 0 ns: not a measurement"));
    }
    for t in timings {
        if t.bytes == 0 {
            return Err(format!("{list} timings: a size of 0 bytes (sizes are what was allocated, 512 B and up)"));
        }
        if !seen.insert(t.bytes) {
            return Err(format!("{list} timings: {} bytes listed twice", t.bytes));
        }
        if t.p50_ns > MAX_CALL_NS {
            return Err(format!("{list} timings: p50 of {} ns at {} bytes is over 10 s: not a device call's latency", t.p50_ns, t.bytes));
        }
    }
    Ok(())
}

/// Device synchronisations so far: every cudaFree (release_block: a release, a GC, a retry or
/// empty_cache; cudaFree synchronises the device), every unmap_block (the stream is synchronised
/// before unmapping) and every synchronize_and_free_events (`num_sync_all_streams`).
pub fn syncs(stats: &crate::gpu::stats::DeviceStats) -> u64 {
    (stats.num_device_free + stats.num_sync_all_streams) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_in_log_size_and_clamps() {
        let p = DevprobeResult {
            schema_version: 1,
            device: "t".into(),
            capacity: 1 << 34,
            machine: MachineInfo::current(),
            malloc: vec![summarize(1 << 10, vec![1000]), summarize(1 << 20, vec![3000])],
            free: vec![summarize(1 << 10, vec![500])],
            async_pool_alloc_free: vec![summarize(1 << 20, vec![1400])],
        };
        let m = LatencyModel::from_probe(&p).unwrap();
        assert_eq!(m.cached_op_ns, 700);
        assert_eq!(m.malloc_ns(1 << 10), 1000);
        assert_eq!(m.malloc_ns(1 << 15), 2000);
        assert_eq!(m.malloc_ns(1 << 30), 3000);
        assert_eq!(m.malloc_ns(1), 1000);
        assert_eq!(m.free_ns(1 << 40), 500);
        assert_eq!(probe_sizes(80 << 30).first(), Some(&512));
        assert_eq!(probe_sizes(80 << 30).last(), Some(&(8 << 30)));
        let s = summarize(1, (1..=100).collect());
        assert_eq!((s.p50_ns, s.p99_ns), (51, 99));
    }

    /// A devprobe file whose sizes are out of order prices calls as the sorted one does; sizes
    /// of 0, sizes listed twice and absurd times (which once wrapped the replay's sum of device
    /// time around to less than the real file's) are refused.
    #[test]
    fn timings_in_any_order_price_the_same_and_bad_ones_are_refused() {
        let probe = |malloc: Vec<SizeLatency>| DevprobeResult {
            schema_version: 1,
            device: "t".into(),
            capacity: 1 << 34,
            machine: MachineInfo::current(),
            malloc,
            free: vec![summarize(1 << 10, vec![500])],
            async_pool_alloc_free: vec![summarize(1 << 20, vec![1400])],
        };
        let sorted = vec![summarize(1 << 10, vec![1000]), summarize(1 << 20, vec![3000]), summarize(1 << 30, vec![9000])];
        let reversed: Vec<SizeLatency> = sorted.iter().rev().cloned().collect();
        let a = LatencyModel::from_probe(&probe(sorted.clone())).unwrap();
        let b = LatencyModel::from_probe(&probe(reversed)).unwrap();
        for bytes in [1, 1 << 10, 1 << 15, 1 << 20, 1 << 25, 1 << 30, 1 << 40] {
            assert_eq!(a.malloc_ns(bytes), b.malloc_ns(bytes), "{bytes}");
        }
        assert_eq!(b.malloc_ns(1 << 25), 6000);
        let twice = [sorted.clone(), sorted.clone()].concat();
        assert!(LatencyModel::from_probe(&probe(twice)).unwrap_err().contains("listed twice"));
        assert!(LatencyModel::from_probe(&probe(vec![summarize(0, vec![1000])])).unwrap_err().contains("0 bytes"));
        assert!(LatencyModel::from_probe(&probe(vec![summarize(512, vec![u64::MAX])])).unwrap_err().contains("over 10 s"));
        assert!(LatencyModel::from_probe(&probe(vec![summarize(512, vec![0]), summarize(1024, vec![0])])).unwrap_err().contains("every p50 is 0 ns"));
        let no_pool = DevprobeResult { async_pool_alloc_free: vec![], ..probe(sorted) };
        assert!(LatencyModel::from_probe(&no_pool).unwrap_err().contains("no async_pool_alloc_free timings"));
    }
}
