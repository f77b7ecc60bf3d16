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

/// Device-call latency by size, interpolated in log(size) between probed points.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyModel {
    malloc: Vec<(f64, f64)>,
    free: Vec<(f64, f64)>,
}

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
        let pts = |v: &[SizeLatency]| -> Vec<(f64, f64)> { v.iter().map(|s| ((s.bytes as f64).ln(), s.p50_ns as f64)).collect() };
        if p.malloc.is_empty() || p.free.is_empty() {
            return Err("the devprobe results have no malloc/free timings".into());
        }
        Ok(LatencyModel { malloc: pts(&p.malloc), free: pts(&p.free) })
    }

    /// Reads `--sim-latency FILE` (a devprobe results file).
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let recs = crate::results::read_results(path)?;
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
            async_pool_alloc_free: vec![],
        };
        let m = LatencyModel::from_probe(&p).unwrap();
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
}
