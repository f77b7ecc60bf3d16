//! `allocbench devprobe`: device allocation latency by size, and a latency model that lets the
//! simulated device account realistic device time (`--sim-latency FILE`).

use crate::error::InputError;
#[cfg(test)]
use crate::results::MachineInfo;
use crate::results::{DevprobeResult, ResultRecord, SizeLatency};

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
